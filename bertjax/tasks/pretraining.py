"""Pretraining: masked LM + next-sentence prediction on the user's text (the paper, section 3.1).

Text (the bundled corpus, the user's files, a TFDS dataset, or example shards written by
`bertjax.data.create_pretraining_data`) -> a sentencepiece tokenizer (WORKDIR/vocab.model, trained
once and reused) -> documents split into training and held-out documents -> NSP segment pairs ->
masked batches (`bertjax.data.pipeline`) -> `BertForPreTraining` -> the trainer.

Sequence-length phases: as in the paper, a run can train the first steps at
`data.max_seq_length` (128) and the rest at `data.long_seq_length` (512), from step
`train.long_seq_from_step`. The long examples are built when the run reaches that step, and the
data position stored with each checkpoint records the phase, so a resumed run continues in it.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import model_files, tokenization, train
from bertjax.data import pretraining_examples as pe
from bertjax.data import sources
from bertjax.data.pipeline import PretrainingBatches
from bertjax.errors import UserError
from bertjax.models import bert, heads

VOCAB_FILE = "vocab.model"


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises UserError naming the first field of the pretraining config that cannot work."""
  data, tr = config.data, config.train
  chosen = [name for name in ("input_files", "tfds_name", "static_examples") if data[name]]
  if len(chosen) > 1:
    raise UserError(f"data.{' and data.'.join(chosen)} are all set; give one source of text.")
  if data.static_examples and not data.vocab_model:
    raise UserError("data.static_examples needs data.vocab_model, the sentencepiece model the "
                    "examples were made with.")
  if not 0 < data.masked_lm_prob < 1:
    raise UserError(f"data.masked_lm_prob={data.masked_lm_prob}; use a value in (0, 1), e.g. "
                    "0.15.")
  if not 0 <= data.eval_fraction < 1:
    raise UserError(f"data.eval_fraction={data.eval_fraction}; use a value in [0, 1), e.g. 0.05.")
  for name in ("max_seq_length", "max_predictions_per_seq", "dupe_factor", "vocab_size"):
    if data[name] < 1:
      raise UserError(f"data.{name}={data[name]}; use 1 or more.")
  longest = max(data.max_seq_length, data.long_seq_length)
  if longest > config.model.max_position_embeddings:
    raise UserError(f"sequences of {longest} tokens need model.max_position_embeddings >= "
                    f"{longest} (it is {config.model.max_position_embeddings}).")
  if data.long_seq_length and tr.long_seq_from_step < 1:
    raise UserError(f"data.long_seq_length={data.long_seq_length} needs "
                    f"train.long_seq_from_step >= 1 (the paper: 90% of the steps); it is "
                    f"{tr.long_seq_from_step}. Set data.long_seq_length=0 for one phase.")
  for name in ("num_train_steps", "batch_size", "eval_batch_size", "log_every_steps",
               "eval_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    if tr[name] < 1:
      raise UserError(f"train.{name}={tr[name]}; use 1 or more.")
  if not 0 <= tr.warmup_steps <= tr.num_train_steps:
    raise UserError(f"train.warmup_steps={tr.warmup_steps}; use 0 to train.num_train_steps "
                    f"({tr.num_train_steps}).")
  if tr.learning_rate <= 0:
    raise UserError(f"train.learning_rate={tr.learning_rate}; use a positive rate.")


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> bert.BertConfig:
  """The frozen BertConfig of `config.model` for a vocabulary of `vocab_size`."""
  m = config.model
  try:
    return bert.bert_config(
        m.size, vocab_size=vocab_size, hidden_act=m.hidden_act, dtype=m.dtype,
        dropout_rate=m.dropout_rate, attention_dropout_rate=m.attention_dropout_rate,
        max_position_embeddings=m.max_position_embeddings)
  except (KeyError, ValueError) as e:
    raise UserError(f"bad model config: {e}".rstrip(".") + ". Check the config.model fields.") \
        from e


# ----------------------------------------------------------------------------------------------
# Text and tokenizer.


def read_documents(config: ml_collections.ConfigDict) -> list[list[str]]:
  """Documents (lists of sentences) from the source the config names (default: bundled)."""
  data = config.data
  if data.tfds_name:
    return sources.read_tfds(data.tfds_name, data.tfds_split, data.tfds_feature,
                             data.tfds_data_dir or None)
  return sources.read_text_files(data.input_files or sources.BUNDLED_CORPUS)


def load_tokenizer(config: ml_collections.ConfigDict, workdir: str,
                   documents: list[list[str]] | None) -> tokenization.Tokenizer:
  """`data.vocab_model` if given (a sentencepiece .model or a WordPiece vocab.txt); else
  WORKDIR/vocab.model, trained on `documents` if absent."""
  if config.data.vocab_model:
    return tokenization.load_tokenizer(config.data.vocab_model)
  path = os.path.join(workdir, VOCAB_FILE)
  if os.path.exists(path):
    return tokenization.SentencePieceTokenizer(path)
  if jax.process_count() > 1:
    raise UserError("a multi-host run cannot train its vocabulary on every host; train one "
                    "first (a single-host run, or bertjax.tokenization) and pass "
                    "--config.data.vocab_model=PATH.")
  if documents is None:
    raise UserError(f"no vocabulary: set data.vocab_model or put one at {path}.")
  os.makedirs(workdir, exist_ok=True)
  return tokenization.load_or_train_sentencepiece(
      lambda: (s for doc in documents for s in doc), path, config.data.vocab_size)


def split_documents(documents: list[Any], eval_fraction: float,
                    seed: int) -> tuple[list[Any], list[Any]]:
  """(training, held-out) documents: a seeded random `eval_fraction` of them is held out."""
  if eval_fraction == 0 or len(documents) < 3:
    return documents, []
  order = np.random.default_rng([seed, 1]).permutation(len(documents))
  num_eval = max(2, round(eval_fraction * len(documents)))  # NSP needs two documents
  held_out = set(order[:num_eval].tolist())
  return ([d for i, d in enumerate(documents) if i not in held_out],
          [d for i, d in enumerate(documents) if i in held_out])


def most_common_token(examples: dict[str, np.ndarray], special: pe.SpecialTokens) -> int:
  """The most frequent non-special token of an example set: the frequency baseline's guess."""
  ids = pe.unmask(examples) if "masked_lm_positions" in examples else examples["input_ids"]
  counts = np.bincount(ids[examples["input_mask"] > 0], minlength=special.vocab_size)
  counts[sorted(special.ids_never_masked)] = 0
  return int(np.argmax(counts))


# ----------------------------------------------------------------------------------------------
# Loss and metrics.


def make_terms(baseline_token: int):
  """(outputs, batch) -> the terms of pretraining (`train.Terms`): the paper's objective is the
  sum of the MLM mean (cross-entropy over the real masked positions, masked_lm_weights) and the
  NSP mean (over the examples), with their accuracies and the MLM accuracy of always guessing
  `baseline_token` (the frequency baseline)."""

  def terms(outputs, batch):
    mlm_logits, nsp_logits = outputs  # [batch, predictions, vocab], [batch, 2]; float32
    ids, labels = batch["masked_lm_ids"], batch["next_sentence_label"]
    mlm_weight = batch["masked_lm_weights"]  # [batch, predictions]
    example_weight = batch["example_weight"]  # [batch]
    return {
        "mlm_loss": (optax.softmax_cross_entropy_with_integer_labels(mlm_logits, ids),
                     mlm_weight),
        "nsp_loss": (optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels),
                     example_weight),
        "mlm_accuracy": (jnp.argmax(mlm_logits, -1) == ids, mlm_weight),
        "nsp_accuracy": (jnp.argmax(nsp_logits, -1) == labels, example_weight),
        "frequency_baseline_mlm_accuracy": (ids == baseline_token, mlm_weight)}

  return terms


def score(totals: dict[str, Any], predictions: None) -> dict[str, float]:
  """Evaluation totals -> the means (loss = MLM + NSP), the MLM perplexity and the number of
  held-out examples."""
  del predictions  # pretraining is scored by its sums alone
  metrics = train.means(totals)
  metrics["mlm_perplexity"] = float(np.exp(min(metrics["mlm_loss"], 50.0)))
  metrics["examples"] = float(totals["nsp_loss"].count)
  return metrics


# ----------------------------------------------------------------------------------------------
# The task.


class _Phases:
  """Training batches over the sequence-length phases, with a position that records the phase.

  Position: {"phase": 0 or 1, "batches": batches served so far, "epoch", "index"} (the last two
  from PretrainingBatches, for the current phase).
  """

  def __init__(self, make_batches, switch_step: int):
    self._make_batches = make_batches  # phase -> PretrainingBatches (built on first use)
    self._switch_step = switch_step  # 0 = one phase
    self._built: dict[int, PretrainingBatches] = {}

  def batches(self, phase: int) -> PretrainingBatches:
    if phase not in self._built:
      self._built[phase] = self._make_batches(phase)
    return self._built[phase]

  def iterate(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
    position = dict(position or {"phase": 0, "batches": 0})
    phase, served = int(position.pop("phase")), int(position.pop("batches"))
    inner = self.batches(phase).iterate(position or None)
    while True:
      if phase == 0 and self._switch_step and served == self._switch_step:
        phase, inner = 1, self.batches(1).iterate(None)
      batch, inner_position = next(inner)
      served += 1
      yield batch, {"phase": phase, "batches": served, **inner_position}


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Reads the text, tokenizes it and builds the pretraining Task (no workdir file but the
  vocabulary, WORKDIR/vocab.model, is written)."""
  check_config(config)
  data, tr = config.data, config.train
  process_count = jax.process_count()

  documents = None if data.static_examples else read_documents(config)
  tok = load_tokenizer(config, workdir, documents)
  special = pe.SpecialTokens.from_tokenizer(tok)
  rng = np.random.default_rng(config.seed)
  if data.static_examples:
    examples = pe.load_static_examples(data.static_examples)
    if examples["input_ids"].shape[1] != data.max_seq_length:
      raise UserError(f"the static examples have {examples['input_ids'].shape[1]} tokens per "
                      f"sequence but data.max_seq_length={data.max_seq_length}; set it to match.")
    if int(examples["input_ids"].max()) >= tok.vocab_size:
      raise UserError(f"the static examples hold token ids >= {tok.vocab_size}, the size of "
                      f"data.vocab_model; give the vocabulary they were made with.")
    num_eval = int(len(examples["input_ids"]) * data.eval_fraction)
    eval_examples = {k: v[len(v) - num_eval:] for k, v in examples.items()} if num_eval else None
    examples = {k: v[:len(v) - num_eval] for k, v in examples.items()}
    train_documents = None
  else:
    tokenized = [tok.encode_batch(doc) for doc in documents]
    train_documents, eval_documents = split_documents(tokenized, data.eval_fraction, config.seed)
    examples = pe.create_segment_pairs(train_documents, data.max_seq_length,
                                       data.short_seq_prob, rng, special, data.dupe_factor)
    eval_examples = (pe.create_segment_pairs(eval_documents, data.max_seq_length,
                                             data.short_seq_prob, rng, special, 1)
                     if eval_documents else None)
  baseline_token = most_common_token(examples, special)
  word_start_table = (np.asarray(tok.is_word_start(np.arange(tok.vocab_size)), bool)
                      if data.whole_word_masking else None)

  def pipeline(example_set, *, batch_size, max_predictions, dynamic, shuffle):
    return PretrainingBatches(
        example_set, batch_size=batch_size // process_count, seed=config.seed, special=special,
        masked_lm_prob=data.masked_lm_prob, max_predictions_per_seq=max_predictions,
        dynamic_masking=dynamic, whole_word_masking=data.whole_word_masking,
        word_start_table=word_start_table, process_index=jax.process_index(),
        process_count=process_count, shuffle=shuffle)

  def phase_batches(phase: int) -> PretrainingBatches:
    if phase == 0:
      return pipeline(examples, batch_size=tr.batch_size,
                      max_predictions=data.max_predictions_per_seq,
                      dynamic=data.dynamic_masking, shuffle=True)
    if train_documents is None:
      raise UserError("data.long_seq_length needs text, not data.static_examples; write long "
                      "examples with create_pretraining_data and train them in a second run.")
    long_examples = pe.create_segment_pairs(
        train_documents, data.long_seq_length, data.short_seq_prob,
        np.random.default_rng([config.seed, 2]), special, data.dupe_factor)
    return pipeline(long_examples, batch_size=tr.batch_size,
                    max_predictions=data.long_max_predictions_per_seq,
                    dynamic=data.dynamic_masking, shuffle=True)

  phases = _Phases(phase_batches, tr.long_seq_from_step if data.long_seq_length else 0)
  eval_pipeline = None
  if eval_examples is not None and len(eval_examples["input_ids"]):
    eval_pipeline = pipeline(eval_examples, batch_size=tr.eval_batch_size,
                             max_predictions=data.max_predictions_per_seq, dynamic=False,
                             shuffle=False)
  bert_config = model_config(config, tok.vocab_size)
  print(f"pretraining: {len(examples['input_ids'])} training examples "
        f"({phases.batches(0).steps_per_epoch} steps per epoch), "
        f"{0 if eval_pipeline is None else eval_pipeline.num_examples} held-out examples, "
        f"vocabulary {tok.vocab_size}, "
        f"frequency baseline token {tok.id_to_token(baseline_token)!r}")
  return train.Task(
      model=heads.BertForPreTraining(bert_config), terms=make_terms(baseline_token),
      batches=train.Batches(
          train=phases.iterate, eval=None if eval_pipeline is None else eval_pipeline.eval_batches),
      score=score,
      files={model_files.BERT_CONFIG_FILE: model_files.bert_config_json(bert_config)})


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Pretrains as the config says; returns the last held-out evaluation."""
  train.make_checked_mesh(config)  # fail on batch sizes before writing the vocabulary
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
