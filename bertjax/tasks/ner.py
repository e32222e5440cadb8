"""Named-entity recognition fine-tuning on CoNLL-2003 (the paper, section 5.3).

  python -m bertjax.main --config=configs/ner.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      --config.data.predict_file=test.txt

CKPT is a pretraining workdir or a converted model directory (its bert_config.json and
tokenizer are used; a cased model suits NER). CONLL_DIR holds CoNLL-2003's train.txt and
valid.txt (or dev.txt), read by bertjax.data.ner.

The model is `heads.BertForTokenClassification`: each word's first sub-token -> dropout ->
Dense(num_labels); the loss is softmax cross-entropy averaged over first sub-tokens. The classes
are the sorted tags of the training file (and "O"), saved as WORKDIR/labels.json; a run on a
workdir that has one keeps its order, so a resumed run and its predictions use the same ids.
Each evaluation maps the dev predictions back to one tag per word and scores them with seqeval
(entity-level precision, recall and F1 in its default, conlleval-compatible mode; token
accuracy over words); WORKDIR/eval_results.json holds the last one. After the last step the dev
predictions go to WORKDIR/eval_predictions.txt, and those of `data.predict_file` (if set) to
WORKDIR/test_predictions.txt, in CoNLL format ("word gold predicted" a line); when that file has
tags its scores go to WORKDIR/test_results.json.
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax import metrics, train
from bertjax.data import ner as ner_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

LABELS_FILE = "labels.json"
EVAL_PREDICTIONS_FILE = "eval_predictions.txt"
TEST_PREDICTIONS_FILE = "test_predictions.txt"
TEST_RESULTS_FILE = "test_results.json"
_EVAL_FILES = ("valid.txt", "dev.txt")  # data.eval_file "": the first that exists


def score_sentences(sentences: list[ner_data.Sentence],
                    predicted: list[list[str] | None]) -> dict[str, float]:
  """entity_scores of the sentences that have a prediction (None: left out); {} if none has."""
  pairs = [(list(s.tags), tags) for s, tags in zip(sentences, predicted) if tags is not None]
  if not pairs:  # an evaluation cut short (train.eval_steps) before a sentence's last row
    return {}
  return metrics.entity_scores([g for g, _ in pairs], [p for _, p in pairs])


def data_path(config: ml_collections.ConfigDict, name: str) -> str:
  """A data file: `name` under data.data_dir (an absolute `name` stands alone)."""
  return os.path.join(config.data.data_dir, name)


def eval_path(config: ml_collections.ConfigDict) -> str:
  """data.eval_file, or by default valid.txt, else dev.txt, in data.data_dir."""
  if config.data.eval_file:
    return data_path(config, config.data.eval_file)
  for name in _EVAL_FILES:
    if os.path.isfile(data_path(config, name)):
      return data_path(config, name)
  raise UserError(f"no {' or '.join(_EVAL_FILES)} in {config.data.data_dir or '.'}; set "
                  "--config.data.data_dir to CoNLL-2003's directory or --config.data.eval_file "
                  "to the dev file (e.g. eng.testa).")


def labels_for(workdir: str, train_sentences: list[ner_data.Sentence], source: str) -> list[str]:
  """The classes: WORKDIR/labels.json if a run there saved them, else the training tags."""
  tags = ner_data.label_list(train_sentences)
  saved = os.path.join(workdir, LABELS_FILE)
  if not os.path.isfile(saved):
    return tags
  with open(saved, encoding="utf-8") as f:
    labels = json.load(f)
  if not isinstance(labels, list) or not all(isinstance(t, str) for t in labels):
    raise UserError(f"{saved} is not a JSON list of tags; delete it or use a fresh workdir.")
  try:
    ner_data.check_tags(train_sentences, labels, source)
  except UserError as e:
    raise UserError(f"{e} (The tags are those {saved} saved; a different training file needs "
                    "a fresh workdir.)") from None
  return labels


def make_loss_fn(model: heads.BertForTokenClassification):
  """(params, batch, rng) -> (mean loss over first sub-tokens, {"accuracy"}), dropout on."""

  def loss_fn(params, batch, rng):
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                         batch["input_mask"], deterministic=False, rngs={"dropout": rng})
    weights = batch["label_weights"]  # [batch, seq]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label_ids"])
    count = jnp.maximum(jnp.sum(weights), 1.0)
    correct = (jnp.argmax(logits, -1) == batch["label_ids"]) * weights
    return jnp.sum(losses * weights) / count, {"accuracy": jnp.sum(correct) / count}

  return loss_fn


def make_eval_fns(model: heads.BertForTokenClassification):
  """(eval_fn: loss sums over first sub-tokens, predict_fn: per-token predicted class ids)."""

  def logits_of(params, batch):  # [batch, seq, num_labels]
    return model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                       batch["input_mask"], deterministic=True)

  def eval_fn(params, batch):
    weights = batch["label_weights"] * batch["example_weight"][:, None]  # [batch, seq]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits_of(params, batch),
                                                             batch["label_ids"])
    return {"loss_sum": jnp.sum(losses * weights), "tokens": jnp.sum(weights)}

  def predict_fn(params, batch):
    return {"prediction": jnp.argmax(logits_of(params, batch), -1).astype(jnp.int32),
            "label_weights": batch["label_weights"]}  # both [batch, seq]

  return eval_fn, predict_fn


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  return {"loss": sums["loss_sum"] / max(sums["tokens"], 1.0)}


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Reads the CoNLL files, encodes them and builds the fine-tuning Task; sets the run's
  num_train_steps, warmup_steps and (if -1) eval/checkpoint intervals in `config`."""
  finetuning.check_batch_sizes(config)
  pretrained_model = finetuning.load_pretrained(
      config, "NER fine-tuning (a cased model suits NER)")
  data, tr = config.data, config.train

  train_file, dev_file = data_path(config, data.train_file), eval_path(config)
  train_sentences = ner_data.read_conll(train_file, data.label_column)
  labels = labels_for(workdir, train_sentences, train_file)
  eval_sentences = ner_data.read_conll(dev_file, data.label_column)
  if eval_sentences[0].tags is None:
    raise UserError(f"{dev_file} has no tags; data.eval_file must be a tagged dev file.")
  predict_file = data_path(config, data.predict_file) if data.predict_file else ""
  predict_sentences = (ner_data.read_conll(predict_file, data.label_column)
                       if predict_file else [])

  def encode(sentences, source):
    return ner_data.encode_sentences(sentences, labels, pretrained_model.tokenizer,
                                     data.max_seq_length, source)

  train_features, _ = encode(train_sentences, train_file)
  eval_features, eval_windows = encode(eval_sentences, dev_file)

  train_batches = finetuning.feature_batches(config, train_features, training=True)
  eval_batches = finetuning.feature_batches(config, eval_features, training=False)
  steps_per_epoch = train_batches.steps_per_epoch
  finetuning.set_schedule(config, steps_per_epoch)

  predict_sets, predict_windows = {}, []
  if predict_sentences:
    predict_features, predict_windows = encode(predict_sentences, predict_file)
    predict_sets["test"] = finetuning.feature_batches(config, predict_features,
                                                      training=False).eval_batches
  model = heads.BertForTokenClassification(pretrained_model.bert_config, len(labels))
  eval_fn, predict_fn = make_eval_fns(model)

  def init_params(rng, batch):
    return model.init({"params": rng}, batch["input_ids"], batch["segment_ids"],
                      batch["input_mask"], deterministic=True)["params"]

  def word_tags(windows, sentences, predictions):
    return ner_data.tags_of_words(windows, sentences, predictions["prediction"],
                                  predictions["label_weights"], labels)

  def score_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
    return score_sentences(eval_sentences, word_tags(eval_windows, eval_sentences, predictions))

  def write_predictions(split: str, predictions: dict[str, np.ndarray],
                        directory: epath.Path) -> None:
    if split == "eval":
      ner_data.write_conll(eval_sentences, word_tags(eval_windows, eval_sentences, predictions),
                           str(directory / EVAL_PREDICTIONS_FILE))
      return
    predicted = word_tags(predict_windows, predict_sentences, predictions)
    ner_data.write_conll(predict_sentences, predicted, str(directory / TEST_PREDICTIONS_FILE))
    if predict_sentences[0].tags is not None:
      scores = score_sentences(predict_sentences, predicted)
      (directory / TEST_RESULTS_FILE).write_text(json.dumps(scores, indent=2) + "\n")
      print(f"{predict_file}: " + ", ".join(f"{k}={v:.4f}" for k, v in scores.items()))

  print(f"ner: {len(train_sentences)} training sentences ({len(train_features['input_ids'])} "
        f"rows, {steps_per_epoch} steps per epoch, {tr.num_train_steps} steps), "
        f"{len(eval_sentences)} dev sentences, {len(labels)} labels: {' '.join(labels)}")
  return train.Task(
      init_params=init_params, loss_fn=make_loss_fn(model), eval_fn=eval_fn,
      summarize_eval=summarize_eval, train_batches=train_batches.iterate,
      eval_batches=eval_batches.eval_batches, init_batch=next(train_batches.iterate(None))[0],
      files={**pretrained_model.files, LABELS_FILE: json.dumps(labels) + "\n"},
      predict_fn=predict_fn, score_predictions=score_predictions, predict_sets=predict_sets,
      write_predictions=write_predictions, head="token_tagging")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes a token tagger on CoNLL-format data; returns the last dev evaluation."""
  train.make_checked_mesh(config)
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
