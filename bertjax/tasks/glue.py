"""GLUE fine-tuning (a `finetuning.Spec`): a sentence (pair) classifier or regressor on a
pretrained BERT (paper 4.1).

  python -m bertjax.main --config=configs/glue.py --workdir=DIR --config.task=mrpc \
      --config.init_checkpoint=CKPT --config.data.glue_dir=GLUE_DIR

`config.task` names the GLUE task (bertjax.data.finetuning.glue.TASKS but ax, which has no
training data).
CKPT is a pretraining workdir or a converted model directory (its bert_config.json and tokenizer
are used). Examples come from GLUE_DIR (download_glue_data.py's layout) or, when
`data.glue_dir` is empty, from TFDS's glue/<task> prepared under `data.tfds_data_dir`.

The model is `heads.BertForSequenceClassification`: [CLS] A [SEP] B [SEP] -> pooled output ->
dropout -> Dense(num_labels); softmax cross-entropy, or mean squared error for STS-B (one
output). Training runs `train.num_train_epochs` epochs of the training split (the number of steps
follows from its size and the batch size as in run_classifier.py, `finetuning.schedule`)
with warmup over `train.warmup_proportion` of them.
Each evaluation scores the dev split with GLUE's metrics (bertjax.metrics.glue_metrics) and
WORKDIR/eval_results.json holds the last one; after the last step the dev predictions go to
WORKDIR/eval_predictions.tsv and each of `data.predict_splits` to the GLUE leaderboard file of
that split (e.g. WORKDIR/MRPC.tsv, `write_submission`).
"""
from __future__ import annotations

import os
from typing import Sequence

import jax.numpy as jnp
import numpy as np
import optax
from etils import epath

from bertjax import metrics, run_config, tokenization
from bertjax.data.finetuning import glue as glue_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

EVAL_PREDICTIONS_FILE = "eval_predictions.tsv"
# The metric the paper reports for each task (Table 1: "F1 scores are reported for QQP and MRPC,
# Spearman correlations are reported for STS-B"; CoLA is GLUE's Matthews correlation), a key of
# bertjax.metrics.glue_metrics; every other task: accuracy.
MAIN_METRICS = {"cola": "matthews_correlation", "stsb": "spearmanr", "mrpc": "f1", "qqp": "f1"}
# The GLUE leaderboard's file name for each test split's predictions.
SUBMISSION_FILES: dict[tuple[str, str], str] = {
    ("cola", "test"): "CoLA.tsv", ("sst2", "test"): "SST-2.tsv", ("mrpc", "test"): "MRPC.tsv",
    ("qqp", "test"): "QQP.tsv", ("stsb", "test"): "STS-B.tsv",
    ("mnli", "test_matched"): "MNLI-m.tsv", ("mnli", "test_mismatched"): "MNLI-mm.tsv",
    ("qnli", "test"): "QNLI.tsv", ("rte", "test"): "RTE.tsv", ("wnli", "test"): "WNLI.tsv",
    ("ax", "test"): "AX.tsv",
}


def glue_task(config: run_config.GlueRun) -> glue_data.GlueTask:
  """The GLUE task `config.task` names (UserError for ax or an unknown name)."""
  if config.task == "ax":
    raise UserError("ax (GLUE's diagnostic set) has no training data; it is predicted by an MNLI "
                    "model: --config.task=mnli --config.data.predict_splits=test_matched,ax")
  if config.task not in glue_data.TASKS:
    raise UserError(f"unknown GLUE task {config.task!r}; use one of "
                    f"{sorted(set(glue_data.TASKS) - {'ax'})}.")
  return glue_data.TASKS[config.task]


def main_metric(config: run_config.GlueRun) -> str:
  """The metric the paper reports for the GLUE task config.task (MAIN_METRICS)."""
  return MAIN_METRICS.get(glue_task(config).name, "accuracy")


def read_split(config: run_config.GlueRun, task: glue_data.GlueTask,
               split: str) -> list[glue_data.Example]:
  """The examples of a split: from data.glue_dir, else TFDS (which never downloads)."""
  if split == "ax":  # MNLI models also predict GLUE's diagnostic set
    task, split = glue_data.TASKS["ax"], "test"
  if config.data.glue_dir:
    return glue_data.read_examples(task.name, split, config.data.glue_dir)
  return glue_data.read_tfds_examples(task.name, split, config.data.tfds_data_dir or None)


def check_splits(task: glue_data.GlueTask, eval_split: str, predict_splits: list[str]) -> None:
  """UserError unless the splits exist; only MNLI predicts ax (its labels are MNLI's)."""
  if "ax" in predict_splits and task.name != "mnli":
    raise UserError(f"ax (GLUE's diagnostic set) is labelled with MNLI's classes, so only an "
                    f"MNLI model predicts it; drop ax from --config.data.predict_splits for "
                    f"{task.name}.")
  for split in [eval_split] + [s for s in predict_splits if s != "ax"]:
    if split not in task.splits:
      raise UserError(f"{task.name} has no split {split!r}; it has {list(task.splits)}.")


def read(config: run_config.GlueRun, tokenizer: tokenization.Tokenizer,
         workdir: str) -> finetuning.Data:
  """Reads and encodes the training, eval and predict splits of the GLUE task config.task."""
  del workdir  # nothing of GLUE is kept there
  task = glue_task(config)
  data = config.data
  eval_split = data.eval_split or ("dev_matched" if task.name == "mnli" else "dev")
  predict_splits = [s.strip() for s in data.predict_splits.split(",") if s.strip()]
  check_splits(task, eval_split, predict_splits)

  def encode(examples):
    return glue_data.encode_examples(examples, task, tokenizer, data.max_seq_length)

  examples = {split: read_split(config, task, split)
              for split in dict.fromkeys(["train", eval_split] + predict_splits)}
  eval_features = encode(examples[eval_split])
  if "label" not in eval_features:
    raise UserError(f"the {eval_split} split of {task.name} has no labels; set "
                    "--config.data.eval_split to a labelled split (e.g. dev).")
  return finetuning.Data(
      train=encode(examples["train"]), eval=eval_features,
      predict={split: encode(examples[split]) for split in predict_splits},
      num_labels=task.num_labels, context=(task, examples, eval_split),
      summary=f"glue/{task.name}: {len(examples['train'])} training examples, "
              f"{len(examples[eval_split])} {eval_split} examples, {task.num_labels} "
              f"{'output' if task.is_regression else 'labels'}")


def terms(logits, batch):
  """Mean squared error for a regression (one output, STS-B), else cross-entropy and accuracy;
  logits [batch, num_labels], or [batch, k, num_labels] packed (labels and weights [batch, k])."""
  label, weight = batch["label"], batch["example_weight"]
  if logits.shape[-1] == 1:
    return {"loss": (jnp.square(logits[..., 0] - label), weight)}
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, label), weight),
          "accuracy": (jnp.argmax(logits, -1) == label, weight)}


def predict(logits, batch):
  """The predicted score (regression) or class id of each example, with its label if any."""
  out = {"prediction": logits[..., 0] if logits.shape[-1] == 1 else jnp.argmax(logits, -1)}
  if "label" in batch:
    out["label"] = batch["label"]
  return out


def score(data: finetuning.Data, predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """GLUE's metrics of the task (bertjax.metrics.glue_metrics)."""
  task = data.context[0]
  return metrics.glue_metrics(task.name, predictions["label"], predictions["prediction"])


def write_eval_predictions(task: glue_data.GlueTask, examples: Sequence[glue_data.Example],
                           predictions: dict[str, np.ndarray], path: epath.Path) -> None:
  """guid, label and prediction of each dev example (label strings; scores for STS-B)."""
  def name(x):
    return f"{float(x):.3f}" if task.is_regression else task.labels[int(x)]
  rows = ["guid\tlabel\tprediction"] + [
      f"{ex.guid}\t{ex.label}\t{name(p)}" for ex, p in zip(examples, predictions["prediction"])]
  path.write_text("\n".join(rows) + "\n")


def write_submission(task: glue_data.GlueTask, split: str,
                     examples: Sequence[glue_data.Example],
                     predictions: np.ndarray, path: str) -> None:
  """Writes predictions as a GLUE leaderboard file: "index<TAB>prediction", one row an example.

  Args:
    task: the task.
    split: the split the examples are from (their guids are "<split>-<index>").
    examples: N examples.
    predictions: [N] class indices, or [N, num_labels] scores (the best is taken); for STS-B
      [N] (or [N, 1]) scores, written clipped to [0, 5] with 3 decimals.
    path: the file to write (SUBMISSION_FILES names the leaderboard's); written atomically.

  Raises:
    ValueError: predictions of the wrong shape, or an example not of `split`.
  """
  glue_data.check_split(task, split)
  predictions = np.asarray(predictions)
  n = len(examples)
  if predictions.ndim == 2 and predictions.shape[1] == task.num_labels:
    predictions = predictions[:, 0] if task.is_regression else predictions.argmax(axis=1)
  if predictions.shape != (n,):
    raise ValueError(f"predictions have shape {predictions.shape}; want ({n},) or "
                     f"({n}, {task.num_labels}) for {n} {task.name} examples.")
  lines = ["index\tprediction\n"]
  for example, prediction in zip(examples, predictions):
    if not example.guid.startswith(f"{split}-"):
      raise ValueError(f"example {example.guid} is not of split {split!r}.")
    if task.is_regression:
      value = f"{float(np.clip(prediction, 0.0, 5.0)):.3f}"
    elif 0 <= int(prediction) < task.num_labels:
      value = task.labels[int(prediction)]
    else:
      raise ValueError(f"prediction {prediction} for {example.guid} is not a class of "
                       f"{task.name} (0 to {task.num_labels - 1}).")
    lines.append(f"{example.guid[len(split) + 1:]}\t{value}\n")
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(f"{path}.tmp", "w", encoding="utf-8") as f:
    f.writelines(lines)
  os.replace(f"{path}.tmp", path)


def write(data: finetuning.Data, split: str, predictions: dict[str, np.ndarray],
          directory: epath.Path) -> None:
  """The dev predictions (eval_predictions.tsv) or a GLUE leaderboard file (e.g. MRPC.tsv)."""
  task, examples, eval_split = data.context
  if split == "eval":
    write_eval_predictions(task, examples[eval_split], predictions,
                           directory / EVAL_PREDICTIONS_FILE)
    return
  submission_task = glue_data.TASKS["ax"] if split == "ax" else task
  submission_split = "test" if split == "ax" else split
  name = SUBMISSION_FILES[(submission_task.name, submission_split)]
  write_submission(submission_task, submission_split, examples[split],
                   predictions["prediction"], str(directory / name))


SPEC = finetuning.Spec(
    name="GLUE fine-tuning", read=read,
    model=lambda bert_config, data: heads.BertForSequenceClassification(bert_config,
                                                                        data.num_labels),
    terms=terms, predict=predict, score=score, write=write, main_metric=main_metric,
    padding_invariant=True, packable=True, schema=run_config.GlueRun)
