"""SWAG fine-tuning: choose the ending of a sentence from four, on a pretrained BERT (paper 4.4).

  python -m bertjax.main --config=configs/swag.py --workdir=DIR --config.init_checkpoint=CKPT \
      --config.data.train_file=SWAG/train.csv --config.data.eval_file=SWAG/val.csv

CKPT is a pretraining workdir or a converted model directory (its bert_config.json and tokenizer
are used); the files are swagaf's data/train.csv, val.csv and (optionally, as data.predict_file)
test.csv (bertjax.data.swag).

The model is `heads.BertForMultipleChoice`: each of the four choices is encoded as its own
[CLS] sent1 [SEP] sent2 ending<i> [SEP] sequence, a vector scores its pooled [CLS] output, and a
softmax over the four scores gives the choice; the loss is cross-entropy against the right
ending. Training runs `train.num_train_epochs` epochs (the number of steps follows from the
training file's size and the batch size) with warmup over `train.warmup_proportion` of them.
Each evaluation reports the dev loss and accuracy; WORKDIR/eval_results.json holds the last one.
After the last step WORKDIR/eval_predictions.csv holds "id,label,prediction" for every dev
question, and, with data.predict_file, WORKDIR/test_predictions.csv holds "id,prediction" (ids
as bertjax.data.swag gives them; predictions are ending indices 0 to 3). No official leaderboard
format comes with SWAG's files (swagaf's csv_predict.py writes the same rows under the header
",pred"), so these are plain CSV files.
"""
from __future__ import annotations

import csv
import io
from typing import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax import metrics, train
from bertjax.data import swag as swag_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

EVAL_PREDICTIONS_FILE = "eval_predictions.csv"
TEST_PREDICTIONS_FILE = "test_predictions.csv"


def make_loss_fn(model: heads.BertForMultipleChoice):
  """(params, batch, rng) -> (mean cross-entropy over the choices, {"accuracy"}), dropout on."""

  def loss_fn(params, batch, rng):
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                         batch["input_mask"], deterministic=False,
                         rngs={"dropout": rng})  # [batch, num_choices]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}

  return loss_fn


def make_eval_fns(model: heads.BertForMultipleChoice):
  """(eval_fn: sums of the loss over real examples, predict_fn: each example's choice)."""

  def logits_of(params, batch):
    return model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                       batch["input_mask"], deterministic=True)  # [batch, num_choices]

  def eval_fn(params, batch):
    logits, weight = logits_of(params, batch), batch["example_weight"]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return {"loss_sum": jnp.sum(losses * weight), "examples": jnp.sum(weight)}

  def predict_fn(params, batch):
    out = {"prediction": jnp.argmax(logits_of(params, batch), -1)}  # [batch]
    if "label" in batch:
      out["label"] = batch["label"]
    return out

  return eval_fn, predict_fn


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  return {"loss": sums["loss_sum"] / max(sums["examples"], 1.0)}


def score_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """{"accuracy"}: the share of questions whose predicted ending is the right one."""
  return {"accuracy": metrics.accuracy(predictions["label"], predictions["prediction"])}


def write_csv(path: epath.Path, header: Sequence[str], rows) -> None:
  """Writes a CSV file (comma-separated, quoted where needed, "\\n" line ends)."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(header)
  writer.writerows(rows)
  path.write_text(out.getvalue())


def write_eval_predictions(examples: Sequence[swag_data.Example],
                           predictions: dict[str, np.ndarray], path: epath.Path) -> None:
  """id, label and predicted ending index of each dev example."""
  write_csv(path, ("id", "label", "prediction"),
            [(e.id, e.label, int(p)) for e, p in zip(examples, predictions["prediction"])])


def write_test_predictions(examples: Sequence[swag_data.Example],
                           predictions: dict[str, np.ndarray], path: epath.Path) -> None:
  """id and predicted ending index of each example of data.predict_file."""
  write_csv(path, ("id", "prediction"),
            [(e.id, int(p)) for e, p in zip(examples, predictions["prediction"])])


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Reads the SWAG files, encodes them and builds the fine-tuning Task; sets the run's
  num_train_steps, warmup_steps and (if -1) eval/checkpoint intervals in `config`."""
  del workdir  # the trainer writes there
  finetuning.check_batch_sizes(config)
  model = finetuning.load_pretrained(config, "SWAG fine-tuning")
  data, tr = config.data, config.train
  for field, name in (("train_file", "train.csv"), ("eval_file", "val.csv")):
    if not data[field]:
      raise UserError(f"set --config.data.{field} to SWAG's {name} (data/{name} of the "
                      "rowanz/swagaf repository).")

  def encode(examples):
    return swag_data.encode_examples(examples, model.tokenizer, data.max_seq_length)

  train_examples = swag_data.read_examples(data.train_file)
  eval_examples = swag_data.read_examples(data.eval_file)
  train_features, eval_features = encode(train_examples), encode(eval_examples)
  for field, features in (("train_file", train_features), ("eval_file", eval_features)):
    if "label" not in features:
      raise UserError(f"data.{field}={data[field]} has examples without a label (test.csv has "
                      "none); give a labelled file (train.csv, val.csv).")

  train_batches = finetuning.feature_batches(config, train_features, training=True)
  eval_batches = finetuning.feature_batches(config, eval_features, training=False)
  steps_per_epoch = train_batches.steps_per_epoch
  finetuning.set_schedule(config, steps_per_epoch)

  predict_examples, predict_sets = [], {}
  if data.predict_file:
    predict_examples = swag_data.read_examples(data.predict_file)
    predict_sets["test"] = finetuning.feature_batches(
        config, encode(predict_examples), training=False).eval_batches
  chooser = heads.BertForMultipleChoice(model.bert_config)
  eval_fn, predict_fn = make_eval_fns(chooser)

  def init_params(rng, batch):
    return chooser.init({"params": rng}, batch["input_ids"], batch["segment_ids"],
                        batch["input_mask"], deterministic=True)["params"]

  def write_predictions(split: str, predictions: dict[str, np.ndarray],
                        directory: epath.Path) -> None:
    if split == "eval":
      write_eval_predictions(eval_examples, predictions, directory / EVAL_PREDICTIONS_FILE)
    else:
      write_test_predictions(predict_examples, predictions, directory / TEST_PREDICTIONS_FILE)

  print(f"swag: {len(train_examples)} training examples ({steps_per_epoch} steps per epoch, "
        f"{tr.num_train_steps} steps), {len(eval_examples)} dev examples"
        + (f", {len(predict_examples)} to predict" if predict_examples else ""))
  return train.Task(
      init_params=init_params, loss_fn=make_loss_fn(chooser), eval_fn=eval_fn,
      summarize_eval=summarize_eval, train_batches=train_batches.iterate,
      eval_batches=eval_batches.eval_batches, init_batch=next(train_batches.iterate(None))[0],
      files=model.files, predict_fn=predict_fn, score_predictions=score_predictions,
      predict_sets=predict_sets, write_predictions=write_predictions, head="multiple_choice")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes on SWAG; returns the last dev evaluation (loss, accuracy)."""
  train.make_checked_mesh(config)
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
