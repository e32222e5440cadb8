"""GLUE fine-tuning: a sentence (pair) classifier or regressor on a pretrained BERT (paper 4.1).

  python -m bertjax.main --config=configs/glue.py --workdir=DIR --config.task=mrpc \
      --config.init_checkpoint=CKPT --config.data.glue_dir=GLUE_DIR

`config.task` names the GLUE task (bertjax.data.glue.TASKS but ax, which has no training data).
CKPT is a pretraining workdir or a converted model directory (its bert_config.json and tokenizer
are used). Examples come from GLUE_DIR (download_glue_data.py's layout) or, when
`data.glue_dir` is empty, from TFDS's glue/<task> prepared under `data.tfds_data_dir`.

The model is `heads.BertForSequenceClassification`: [CLS] A [SEP] B [SEP] -> pooled output ->
dropout -> Dense(num_labels); softmax cross-entropy, or mean squared error for STS-B (one
output). Training runs `train.num_train_epochs` epochs of the training split (the number of steps
follows from its size and the batch size) with warmup over `train.warmup_proportion` of them.
Each evaluation scores the dev split with GLUE's metrics (bertjax.metrics.glue_metrics) and
WORKDIR/eval_results.json holds the last one; after the last step the dev predictions go to
WORKDIR/eval_predictions.tsv and each of `data.predict_splits` to the GLUE leaderboard file of
that split (e.g. WORKDIR/MRPC.tsv).
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax import metrics, train
from bertjax.data import glue as glue_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

EVAL_PREDICTIONS_FILE = "eval_predictions.tsv"


def glue_task(config: ml_collections.ConfigDict) -> glue_data.GlueTask:
  """The GLUE task `config.task` names (UserError for ax or an unknown name)."""
  if config.task == "ax":
    raise UserError("ax (GLUE's diagnostic set) has no training data; it is predicted by an MNLI "
                    "model: --config.task=mnli --config.data.predict_splits=test_matched,ax")
  if config.task not in glue_data.TASKS:
    raise UserError(f"unknown GLUE task {config.task!r}; use one of "
                    f"{sorted(set(glue_data.TASKS) - {'ax'})}.")
  return glue_data.TASKS[config.task]


def read_split(config: ml_collections.ConfigDict, task: glue_data.GlueTask,
               split: str) -> list[glue_data.Example]:
  """The examples of a split: from data.glue_dir, else TFDS (which never downloads)."""
  if split == "ax":  # MNLI models also predict GLUE's diagnostic set
    task, split = glue_data.TASKS["ax"], "test"
  if config.data.glue_dir:
    return glue_data.read_examples(task.name, split, config.data.glue_dir)
  return glue_data.read_tfds_examples(task.name, split, config.data.tfds_data_dir or None)


def make_loss_fn(model: heads.BertForSequenceClassification, regression: bool):
  """(params, batch, rng) -> (mean loss, {"accuracy"} or {}), dropout on."""

  def loss_fn(params, batch, rng):
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                         batch["input_mask"], deterministic=False, rngs={"dropout": rng})
    if regression:  # [batch, 1] -> [batch]
      return jnp.mean(jnp.square(logits[:, 0] - batch["label"])), {}
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}

  return loss_fn


def make_eval_fns(model: heads.BertForSequenceClassification, regression: bool):
  """(eval_fn: sums of the loss over real examples, predict_fn: per-example predictions)."""

  def logits_of(params, batch):
    return model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                       batch["input_mask"], deterministic=True)  # [batch, num_labels]

  def eval_fn(params, batch):
    logits, weight = logits_of(params, batch), batch["example_weight"]
    if regression:
      losses = jnp.square(logits[:, 0] - batch["label"])
    else:
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return {"loss_sum": jnp.sum(losses * weight), "examples": jnp.sum(weight)}

  def predict_fn(params, batch):
    logits = logits_of(params, batch)
    out = {"prediction": logits[:, 0] if regression else jnp.argmax(logits, -1)}
    if "label" in batch:
      out["label"] = batch["label"]
    return out

  return eval_fn, predict_fn


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  return {"loss": sums["loss_sum"] / max(sums["examples"], 1.0)}


def write_eval_predictions(task: glue_data.GlueTask, examples: Sequence[glue_data.Example],
                           predictions: dict[str, np.ndarray], path: epath.Path) -> None:
  """guid, label and prediction of each dev example (label strings; scores for STS-B)."""
  def name(x):
    return f"{float(x):.3f}" if task.is_regression else task.labels[int(x)]
  rows = ["guid\tlabel\tprediction"] + [
      f"{ex.guid}\t{ex.label}\t{name(p)}" for ex, p in zip(examples, predictions["prediction"])]
  path.write_text("\n".join(rows) + "\n")


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Reads the GLUE splits, encodes them and builds the fine-tuning Task; sets the run's
  num_train_steps, warmup_steps and (if -1) eval/checkpoint intervals in `config`."""
  task = glue_task(config)
  finetuning.check_batch_sizes(config)
  model = finetuning.load_pretrained(config, "GLUE fine-tuning")
  data, tr = config.data, config.train
  eval_split = data.eval_split or ("dev_matched" if task.name == "mnli" else "dev")
  predict_splits = [s.strip() for s in data.predict_splits.split(",") if s.strip()]
  for split in [eval_split] + [s for s in predict_splits if s != "ax"]:
    if split not in task.splits:
      raise UserError(f"{task.name} has no split {split!r}; it has {list(task.splits)}.")

  def encode(examples):
    return glue_data.encode_examples(examples, task, model.tokenizer, data.max_seq_length)

  train_examples = read_split(config, task, "train")
  eval_examples = read_split(config, task, eval_split)
  train_features, eval_features = encode(train_examples), encode(eval_examples)
  if "label" not in eval_features:
    raise UserError(f"the {eval_split} split of {task.name} has no labels; set "
                    "--config.data.eval_split to a labelled split (e.g. dev).")

  train_batches = finetuning.feature_batches(config, train_features, training=True)
  eval_batches = finetuning.feature_batches(config, eval_features, training=False)
  steps_per_epoch = train_batches.steps_per_epoch
  finetuning.set_schedule(config, steps_per_epoch)

  predict_examples = {split: read_split(config, task, split) for split in predict_splits}
  predict_sets = {
      split: finetuning.feature_batches(config, encode(examples), training=False).eval_batches
      for split, examples in predict_examples.items()}
  classifier = heads.BertForSequenceClassification(model.bert_config, task.num_labels)
  eval_fn, predict_fn = make_eval_fns(classifier, task.is_regression)

  def init_params(rng, batch):
    return classifier.init({"params": rng}, batch["input_ids"], batch["segment_ids"],
                      batch["input_mask"], deterministic=True)["params"]

  def score_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
    return metrics.glue_metrics(task.name, predictions["label"], predictions["prediction"])

  def write_predictions(split: str, predictions: dict[str, np.ndarray],
                        directory: epath.Path) -> None:
    if split == "eval":
      write_eval_predictions(task, eval_examples, predictions,
                             directory / EVAL_PREDICTIONS_FILE)
      return
    submission_task = glue_data.TASKS["ax"] if split == "ax" else task
    submission_split = "test" if split == "ax" else split
    name = glue_data.SUBMISSION_FILES[(submission_task.name, submission_split)]
    glue_data.write_submission(submission_task, submission_split, predict_examples[split],
                               predictions["prediction"], str(directory / name))

  print(f"glue/{task.name}: {len(train_examples)} training examples ({steps_per_epoch} steps "
        f"per epoch, {tr.num_train_steps} steps), {len(eval_examples)} {eval_split} examples, "
        f"{task.num_labels} {'output' if task.is_regression else 'labels'}")
  return train.Task(
      init_params=init_params, loss_fn=make_loss_fn(classifier, task.is_regression),
      eval_fn=eval_fn, summarize_eval=summarize_eval,
      train_batches=train_batches.iterate, eval_batches=eval_batches.eval_batches,
      init_batch=next(train_batches.iterate(None))[0],
      files=model.files,
      predict_fn=predict_fn, score_predictions=score_predictions, predict_sets=predict_sets,
      write_predictions=write_predictions, head="sequence_classification")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes on the GLUE task `config.task`; returns the last dev evaluation."""
  train.make_checked_mesh(config)
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
