"""Contrastive sentence embeddings (`config.task="embeddings"`, configs/embeddings.py): a BERT or
ModernBERT trained so that each anchor's embedding is nearest its positive among every text of
the global batch, as sentence-transformers trains with MultipleNegativesRankingLoss.

The model (`config.init_checkpoint`) is a bertjax model directory or workdir, a Hugging Face
BERT or ModernBERT directory, or a sentence-transformers directory (its pooling, normalisation,
length and prompts; not its Dense modules), read by `bertjax.embedding.embedder`. The data
(`bertjax.data.finetuning.text_tuples`) is (anchor, positive, hard negatives ...) tuples, or with
data.simcse plain text, each sentence its own positive (unsupervised SimCSE, Gao et al. 2021:
the two copies differ by dropout alone). Each batch is [batch, texts, seq], cut to the length
buckets; the loss (`bertjax.embedding.losses`: embedding.loss, scale, Matryoshka dimensions,
duplicates masked) is computed over the whole global batch, every device's anchors against
every device's candidates, XLA exchanging only the embeddings. A batch larger than memory holds
is embedded embedding.grad_cache_chunk examples at a time (GradCache,
`bertjax.embedding.grad_cache`), its gradient the whole batch's; gradient accumulation, which
would shrink the negatives to a micro-batch, is refused.

Evaluation: held-out tuples (data.eval_file, else data.eval_fraction of the training rows)
scored as retrieval, each anchor against every held-out positive and negative (recall@k, MRR@10,
nDCG@10: `bertjax.embedding.evaluation`), beside the held-out loss; or, with data.sts_file, the
Spearman correlation of cosines on scored pairs. The workdir is a model directory and a
sentence-transformers one at once (its modules: pooling, normalisation, length, prompts), which
`python -m bertjax.embed --model=WORKDIR` embeds with and `python -m bertjax.embedding.st_export
--src=WORKDIR --dst=DIR` exports for sentence-transformers.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import run_config, tokenization
from bertjax.data.finetuning import batching, text_tuples
from bertjax.embedding import embedder as embedder_lib
from bertjax.embedding import eval_files, evaluation, grad_cache, losses, st_export, st_files
from bertjax.embedding.model import BertForEmbedding
from bertjax.errors import UserError
from bertjax.modeldir import model_files, model_options
from bertjax.models import attention, heads
from bertjax.tasks import finetuning
from bertjax.training import task as task_lib
from bertjax.training import train

LOSSES = ("mnrl", "symmetric_mnrl", "sigmoid")
RETRIEVAL_METRIC = "ndcg_at_10"  # the held-out retrieval's main metric (sentence-transformers')
RETRIEVAL_METRICS = ("recall_at_1", "recall_at_10", "mrr_at_10", RETRIEVAL_METRIC)
STS_METRIC = "spearman_cosine"


def _check(config: run_config.EmbeddingsRun, context: task_lib.RunContext) -> None:
  """UserError for settings a contrastive run cannot take."""
  emb, tr = config.embedding, config.train
  if emb.loss not in LOSSES:
    raise UserError(f"embedding.loss={emb.loss!r}; use one of {', '.join(LOSSES)}.")
  if tr.grad_accum_steps != 1:
    raise UserError("train.grad_accum_steps splits the batch, and with it each anchor's "
                    "negatives; set it to 1 and --config.embedding.grad_cache_chunk=N to embed "
                    "a large batch N examples at a time with the whole batch's gradient.")
  if str(config.data.packing).strip() not in ("0", "auto"):
    raise UserError(f"data.packing={config.data.packing}: a contrastive run embeds each text "
                    "in a row of its own; leave data.packing at 0.")
  chunk, shards = emb.grad_cache_chunk, context.row_multiple
  if chunk and (chunk < 0 or tr.batch_size % chunk or chunk % shards):
    raise UserError(f"embedding.grad_cache_chunk={chunk} must divide train.batch_size="
                    f"{tr.batch_size} and come in multiples of {shards} (the batch's shards "
                    "over the devices and hosts: each embeds its share of every chunk); e.g. "
                    f"{math.gcd(tr.batch_size, max(shards, 64 // shards * shards))}.")


def _matryoshka(config: run_config.EmbeddingsRun, dimension: int
                ) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """(dimensions, weights) of embedding.matryoshka_dims and _weights; () for none."""
  emb = config.embedding
  try:
    dims = tuple(int(d) for d in emb.matryoshka_dims.split(",") if d.strip())
    weights = tuple(float(w) for w in emb.matryoshka_weights.split(",") if w.strip())
  except ValueError:
    raise UserError(f"embedding.matryoshka_dims={emb.matryoshka_dims!r} and _weights="
                    f"{emb.matryoshka_weights!r} must be comma-separated numbers.") from None
  too_large = [d for d in dims if not 0 < d <= dimension]
  if too_large:
    raise UserError(f"embedding.matryoshka_dims has {too_large[0]}, but the model's embeddings "
                    f"have {dimension} dimensions; give dimensions from 1 to {dimension}.")
  if weights and len(weights) != len(dims):
    raise UserError(f"embedding.matryoshka_weights has {len(weights)} weights for "
                    f"{len(dims)} dimensions; give one a dimension, or none (1 each).")
  return dims, weights or (1.0,) * len(dims)


def load_embedder(config: run_config.EmbeddingsRun) -> embedder_lib.Embedder:
  """The starting model of `config.init_checkpoint` (module docstring), as an Embedder."""
  path, pooling = config.init_checkpoint, config.embedding.pooling
  if not path:
    raise UserError("a contrastive run starts from a model: set --config.init_checkpoint to a "
                    "bertjax, Hugging Face or sentence-transformers model directory.")
  modes = embedder_lib.pooling_modes(pooling)
  is_st = st_files.is_sentence_transformers_dir(path)
  if is_st and modes:
    raise UserError(f"{path} is a sentence-transformers model with its own pooling; leave "
                    "--config.embedding.pooling unset.")
  if not is_st and not modes:
    raise UserError(f"{path} says nothing of pooling (it is no sentence-transformers model); "
                    "set --config.embedding.pooling (mean, cls, max, ...).")
  model = embedder_lib.Embedder.load(path, pooling_modes=modes,
                                     normalize=config.embedding.normalize,
                                     max_seq_length=config.data.max_seq_length)
  if model.recipe.dense:
    raise UserError(f"{path} has Dense modules after its pooling; bertjax trains an encoder "
                    "with pooling and normalisation only: start from its Transformer module's "
                    "directory with --config.embedding.pooling.")
  return model


def _encode(model: embedder_lib.Embedder, tuples: list[tuple[str, ...]], prompts: list[str],
            seq: int) -> dict[str, np.ndarray]:
  """{input_ids, input_mask: [N, texts, seq] int32, duplicate_ids: [N] int32} of `tuples`,
  each text with its column's prompt (`prompts`, the last for further columns) and the model's
  special tokens, cut to `seq` tokens; equal positives share a duplicate id."""
  texts = len(tuples[0])
  ids = np.zeros((len(tuples), texts, seq), np.int32)
  mask = np.zeros_like(ids)
  for i, row in enumerate(tuples):
    for j, text in enumerate(row):
      tokens = model.tokenizer.encode(prompts[min(j, len(prompts) - 1)] + text)[:seq]
      ids[i, j, :len(tokens)] = tokens
      mask[i, j, :len(tokens)] = 1
  _, duplicates = np.unique(np.asarray([row[1] for row in tuples], dtype=object).astype(str),
                            return_inverse=True)
  return {"input_ids": ids, "input_mask": mask, "duplicate_ids": duplicates.astype(np.int32)}


def _prompt_length(model: embedder_lib.Embedder, prompt: str) -> int:
  """Tokens a prompt's text takes at a text's start, its [CLS] included (0 for none)."""
  if not prompt:
    return 0
  ids = model.tokenizer.encode(prompt)
  return len(ids) - (1 if ids and ids[-1] in model.tokenizer.special_ids else 0)


def _tokenizer_files(directory: str) -> dict[str, bytes]:
  """The tokenizer files of the starting model's `directory` for the workdir, as
  `model_files.tokenizer_file_contents`, with a WordPiece tokenizer.json's vocab.txt written
  where it lacks one (sentence-transformers 6 saves tokenizer.json alone; bertjax's own
  commands read WordPiece pieces from vocab.txt)."""
  files = model_files.tokenizer_file_contents(directory)
  if "tokenizer.json" in files and tokenization.VOCAB_FILE not in files:
    spec = json.loads(files["tokenizer.json"])
    if (spec.get("model") or {}).get("type") == "WordPiece":
      pieces = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
      files[tokenization.VOCAB_FILE] = "".join(f"{piece}\n" for piece, _ in pieces).encode()
  return files


def _split(config: run_config.EmbeddingsRun, tuples: list[tuple[str, ...]]
           ) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
  """(training, held-out) tuples: data.eval_file's as held out, else data.eval_fraction of the
  training rows (drawn with the run's seed); none held out for SimCSE or an STS evaluation."""
  data = config.data
  if data.sts_file or data.simcse:
    return tuples, []
  if data.eval_file:
    return tuples, text_tuples.read_tuples(data.eval_file, "data.eval_file")
  count = int(len(tuples) * data.eval_fraction)
  if not count:
    return tuples, []
  order = np.random.default_rng(config.seed).permutation(len(tuples))
  held = set(order[:count].tolist())
  return ([t for i, t in enumerate(tuples) if i not in held],
          [t for i, t in enumerate(tuples) if i in held])


def _retrieval_scores(held_out: list[tuple[str, ...]], embeddings: np.ndarray
                      ) -> dict[str, float]:
  """Retrieval on the held-out tuples: each anchor against every distinct positive and
  negative text, its own positive the relevant one. embeddings: [N, texts, dim]."""
  index: dict[str, int] = {}
  corpus_rows = []
  for i, row in enumerate(held_out):
    for j, text in enumerate(row[1:], start=1):
      if text not in index:
        index[text] = len(corpus_rows)
        corpus_rows.append(embeddings[i, j])
  qrels = {i: {index[row[1]]: 1} for i, row in enumerate(held_out)}
  scores = evaluation.retrieval(embeddings[:, 0], np.stack(corpus_rows), qrels, ks=(1, 10))
  return {name: scores[name] for name in RETRIEVAL_METRICS}


def prompts_of(config: run_config.EmbeddingsRun) -> list[str]:
  """The prompt of each column: the query prompt for the anchors, the document prompt for the
  rest (SimCSE: the query prompt for both copies, which must be alike)."""
  data = config.data
  return [data.query_prompt, data.query_prompt if data.simcse else data.document_prompt]


def make_network(config: run_config.EmbeddingsRun, model: embedder_lib.Embedder
                 ) -> BertForEmbedding:
  """The model a run trains: `model`'s encoder with this run's dropout, dtype and attention
  (config.model), its pooling and normalisation, the prompts' lengths where the pooling leaves
  them out, SigLIP's parameters for the sigmoid loss."""
  try:
    bert_config = dataclasses.replace(model.config, **model_options.bert_overrides(config.model))
  except ValueError as e:
    raise UserError(f"bad model config: {e}".rstrip(".") + ". Check the config.model fields.") \
        from None
  prompt_lengths = (() if model.recipe.include_prompt else
                    tuple(_prompt_length(model, p) for p in prompts_of(config)))
  return BertForEmbedding(bert_config, pooling=model.recipe.pooling,
                          normalize=model.recipe.normalize, prompt_lengths=prompt_lengths,
                          sigmoid=config.embedding.loss == "sigmoid")


def objective(config: run_config.EmbeddingsRun, network: BertForEmbedding, texts: int,
              dimension: int) -> tuple[Any, Any]:
  """(the Task's terms, its gradient or None) of a contrastive run: the loss of each anchor
  (column 0 of `texts`) against every candidate of the global batch, and the in-batch accuracy;
  with embedding.grad_cache_chunk, the gradient GradCache computes (`task.Task.gradient`).
  `dimension` is the embeddings' (for the Matryoshka dimensions' check)."""
  emb = config.embedding
  dims, weights = _matryoshka(config, dimension)

  def loss_per_anchor(outputs, batch):
    """[batch] loss of each anchor against the batch's candidates."""
    embeddings = outputs["embeddings"]
    options = dict(duplicates=batch["duplicate_ids"] if emb.mask_duplicates else None,
                   valid=batch["example_weight"] > 0)
    if emb.loss == "sigmoid":
      loss = functools.partial(losses.sigmoid_per_anchor, log_scale=outputs["log_scale"],
                               bias=outputs["bias"])
    else:
      loss = functools.partial(losses.in_batch_softmax_per_anchor, scale=emb.scale,
                               symmetric=emb.loss == "symmetric_mnrl")
    if dims:
      loss = losses.matryoshka(loss, dims, weights)
    return loss(embeddings[:, 0], [embeddings[:, k] for k in range(1, texts)], **options)

  def terms(outputs, batch):
    if "sts_score" in batch:  # scored pairs: no loss, only their embeddings
      return {}
    weight = batch["example_weight"].astype(jnp.float32)
    embeddings = outputs["embeddings"]
    scores = losses.cosine(embeddings[:, 0], embeddings[:, 1])
    scores = jnp.where(batch["example_weight"][None, :] > 0, scores, -jnp.inf)
    hits = (jnp.argmax(scores, axis=1) == jnp.arange(scores.shape[0])).astype(jnp.float32)
    return {"loss": (loss_per_anchor(outputs, batch), weight),
            "in_batch_accuracy": (hits, weight)}

  def gradient(params, batch, rng):  # GradCache: the batch embedded a chunk at a time
    inputs = {k: batch[k] for k in network.batch_keys}

    def embed(p, chunk, key):
      return heads.apply_to_batch(network, p, chunk, deterministic=False,
                                  rngs={"dropout": key})["embeddings"]

    def mean_loss(p, embeddings):
      outputs = {"embeddings": embeddings}
      if network.sigmoid:
        outputs.update(log_scale=p["sigmoid_log_scale"], bias=p["sigmoid_bias"])
      batch_terms = terms(outputs, batch)
      values, weight = batch_terms["loss"]
      return jnp.sum(values * weight) / jnp.maximum(jnp.sum(weight), 1e-5), batch_terms

    (_, batch_terms), grads = grad_cache.value_and_grad(
        embed, mean_loss, params, inputs, rng, emb.grad_cache_chunk, has_aux=True)
    return batch_terms, grads

  return terms, gradient if emb.grad_cache_chunk else None


def make_task(config: run_config.EmbeddingsRun, workdir: str,
              context: task_lib.RunContext) -> task_lib.Task:
  """Reads the model and the texts and builds the trainer's Task (module docstring)."""
  del workdir  # a contrastive run writes no task files of its own
  _check(config, context)
  model = load_embedder(config)
  emb, data = config.embedding, config.data
  network = make_network(config, model)
  seq = model.max_seq_length
  prompts = prompts_of(config)
  if data.simcse:
    sentences = text_tuples.simcse_sentences(data.train_file)
    tuples = [(s, s) for s in sentences if s.strip()]
  else:
    if not data.train_file:
      raise UserError("set --config.data.train_file to a TSV or JSONL file of (anchor, "
                      "positive[, negatives]) texts, or --config.data.simcse=true to train on "
                      "plain text.")
    tuples = text_tuples.read_tuples(data.train_file)
  training, held_out = _split(config, tuples)
  texts = len(training[0])
  if held_out and len(held_out[0]) != texts:
    raise UserError(f"data.eval_file's rows have {len(held_out[0])} texts and the training "
                    f"rows {texts}; give both the same columns.")
  multiple = attention.SPLASH_MULTIPLE if config.model.attention == "splash" else 1
  buckets = batching.length_buckets(data.length_buckets, seq, 0, multiple)

  def batches(features, training_set):
    return finetuning.feature_batches(config, context, features, training=training_set,
                                      buckets=buckets)

  train_batches = batches(_encode(model, training, prompts, seq), True)
  if data.sts_file:
    sentences_a, sentences_b, gold = eval_files.read_sts(data.sts_file)
    eval_features = _encode(model, list(zip(sentences_a, sentences_b)), [data.query_prompt],
                            seq)
    eval_features["sts_score"] = np.asarray(gold, np.float32)
  elif held_out:
    eval_features = _encode(model, held_out, prompts, seq)
  else:
    eval_features = None
  eval_batches = batches(eval_features, False) if eval_features is not None else None
  run_schedule, steps_per_epoch = finetuning.schedule(config.train, train_batches.num_examples)

  terms, gradient = objective(config, network, texts, model.dimension)

  def predict(outputs, batch):
    return {"embeddings": outputs["embeddings"]}

  def score(totals, predictions):
    metrics = task_lib.means(totals)
    vectors = predictions["embeddings"]
    if data.sts_file:
      metrics.update(evaluation.sts(vectors[:, 0], vectors[:, 1], eval_features["sts_score"]))
    else:
      metrics.update(_retrieval_scores(held_out, vectors))
    return metrics

  def init_params(fresh):  # the encoder read (its pooler, if any, unused), the rest fresh
    def place(loaded, like, path):
      if isinstance(like, dict):
        if not isinstance(loaded, dict) or set(like) - set(loaded):
          raise UserError(f"{config.init_checkpoint}'s encoder lacks {path}: it does not fit "
                          "the model its config describes; check that its files belong "
                          "together.")
        return {k: place(loaded[k], v, f"{path}/{k}") for k, v in like.items()}
      value = np.asarray(loaded, like.dtype)
      if value.shape != like.shape:
        raise UserError(f"{config.init_checkpoint}'s {path} is {value.shape}, not "
                        f"{like.shape}; check that its files belong together.")
      return jax.make_array_from_callback(like.shape, like.sharding, lambda index: value[index])
    return dict(fresh, bert=place(model.weights["encoder"], fresh["bert"], "bert"))

  def samples():  # the widths the first training steps and the evaluation meet
    training_batches = (batch for batch, _ in train_batches.iterate(None))
    steps = min(finetuning.SAMPLED_TRAIN_BATCHES, steps_per_epoch, run_schedule.num_train_steps)
    return (itertools.islice(training_batches, steps),
            itertools.islice(eval_batches.eval_batches(), finetuning.SAMPLED_EVAL_BATCHES)
            if eval_batches is not None else [])

  files = {model_files.BERT_CONFIG_FILE: model_files.bert_config_json(network.config),
           **_tokenizer_files(model.recipe.transformer_dir),
           **st_export.module_files(
               network.config.hidden_size, model.recipe.pooling, normalize=model.recipe.normalize,
               max_seq_length=seq, include_prompt=model.recipe.include_prompt,
               do_lower_case=model.recipe.do_lower_case,
               prompts={k: v for k, v in (("query", data.query_prompt),
                                          ("document", data.document_prompt)) if v})}
  what = "SimCSE sentences" if data.simcse else f"{texts}-text tuples"
  print(f"contrastive training on {len(training)} {what} ({steps_per_epoch} steps per epoch, "
        f"{run_schedule.num_train_steps} steps, batch {config.train.batch_size}"
        f"{f', GradCache chunks of {emb.grad_cache_chunk}' if emb.grad_cache_chunk else ''}); "
        f"evaluated on {len(held_out) if held_out else 'an STS file' if data.sts_file else 'none'}")
  return task_lib.Task(
      model=network, terms=terms,
      batches=task_lib.Batches(train=train_batches.iterate,
                               eval=eval_batches.eval_batches if eval_batches else None,
                               samples=samples),
      schedule=run_schedule, predict=predict, score=score, files=files,
      main_metric=(STS_METRIC if data.sts_file else RETRIEVAL_METRIC if held_out else ""),
      gradient=gradient, init_params=init_params)


def run(config: run_config.EmbeddingsRun, workdir: str) -> dict[str, Any]:
  """Trains the contrastive task the config says; returns the last evaluation's metrics."""
  context = train.run_context(config)  # the mesh, once: bad batch sizes fail before any data
  return train.train_and_evaluate(config, workdir, make_task(config, workdir, context), context)
