"""SWAG fine-tuning: choose the ending of a sentence from four, on a pretrained BERT (paper 4.4),
a `finetuning.Spec`.

  python -m bertjax.main --config=configs/swag.py --workdir=DIR --config.init_checkpoint=CKPT \
      --config.data.train_file=SWAG/train.csv --config.data.eval_file=SWAG/val.csv

CKPT is a pretraining workdir or a converted model directory (its bert_config.json and tokenizer
are used); the files are swagaf's data/train.csv, val.csv and (optionally, as data.predict_file)
test.csv (bertjax.data.finetuning.swag).

The model is `heads.BertForMultipleChoice`: each of the four choices is encoded as its own
[CLS] sent1 [SEP] sent2 ending<i> [SEP] sequence, a vector scores its pooled [CLS] output, and a
softmax over the four scores gives the choice; the loss is cross-entropy against the right
ending. Training runs `train.num_train_epochs` epochs (the number of steps follows from the
training file's size and the batch size) with warmup over `train.warmup_proportion` of them.
Each evaluation reports the dev loss and accuracy; WORKDIR/eval_results.json holds the last one.
After the last step WORKDIR/eval_predictions.csv holds "id,label,prediction" for every dev
question, and, with data.predict_file, WORKDIR/test_predictions.csv holds "id,prediction" (ids
as bertjax.data.finetuning.swag gives them; predictions are ending indices 0 to 3). No official
leaderboard format comes with SWAG's files (swagaf's csv_predict.py writes the same rows under
the header ",pred"), so these are plain CSV files.
"""
from __future__ import annotations

import csv
import io
from typing import Sequence

import jax.numpy as jnp
import numpy as np
import optax
from etils import epath

from bertjax import metrics, run_config, tokenization
from bertjax.data.finetuning import swag as swag_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

EVAL_PREDICTIONS_FILE = "eval_predictions.csv"
TEST_PREDICTIONS_FILE = "test_predictions.csv"


def read(config: run_config.SwagRun, tokenizer: tokenization.Tokenizer,
         workdir: str) -> finetuning.Data:
  """Reads swagaf's CSV files and encodes each question's four choices."""
  del workdir  # nothing of SWAG is kept there
  data = config.data
  for field, name in (("train_file", "train.csv"), ("eval_file", "val.csv")):
    if not getattr(data, field):
      raise UserError(f"set --config.data.{field} to SWAG's {name} (data/{name} of the "
                      "rowanz/swagaf repository).")

  def encode(examples):
    return swag_data.encode_examples(examples, tokenizer, data.max_seq_length)

  examples = {"train": swag_data.read_examples(data.train_file),
              "eval": swag_data.read_examples(data.eval_file)}
  if data.predict_file:
    examples["test"] = swag_data.read_examples(data.predict_file)
  features = {name: encode(split) for name, split in examples.items()}
  for field, name in (("train_file", "train"), ("eval_file", "eval")):
    if "label" not in features[name]:
      raise UserError(f"data.{field}={getattr(data, field)} has examples without a label "
                      "(test.csv has none); give a labelled file (train.csv, val.csv).")
  return finetuning.Data(
      train=features["train"], eval=features["eval"],
      predict={"test": features["test"]} if "test" in features else {}, context=examples,
      summary=f"swag: {len(examples['train'])} training examples, {len(examples['eval'])} dev "
              "examples" + (f", {len(examples['test'])} to predict" if "test" in examples else ""))


def terms(logits, batch):
  """Cross-entropy over the choices and accuracy; logits [batch, num_choices]."""
  label, weight = batch["label"], batch["example_weight"]
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, label), weight),
          "accuracy": (jnp.argmax(logits, -1) == label, weight)}


def predict(logits, batch):
  """Each question's chosen ending (and its label, if any), [batch]."""
  out = {"prediction": jnp.argmax(logits, -1)}
  if "label" in batch:
    out["label"] = batch["label"]
  return out


def score(data: finetuning.Data, predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """{"accuracy"}: the share of questions whose predicted ending is the right one."""
  del data
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


def write(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray],
          directory: epath.Path) -> None:
  """eval_predictions.csv (id,label,prediction) or test_predictions.csv (id,prediction)."""
  if name == "eval":
    write_eval_predictions(data.context["eval"], predictions, directory / EVAL_PREDICTIONS_FILE)
  else:
    write_test_predictions(data.context["test"], predictions, directory / TEST_PREDICTIONS_FILE)


SPEC = finetuning.Spec(
    name="SWAG fine-tuning", read=read,
    model=lambda bert_config, data: heads.BertForMultipleChoice(bert_config),
    terms=terms, predict=predict, score=score, write=write, padding_invariant=True,
    main_metric=lambda config: "accuracy",  # the paper's Table 4
    schema=run_config.SwagRun)
