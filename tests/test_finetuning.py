"""The fine-tuning layer (bertjax.tasks.finetuning): a new task is one spec, and the schedule
the config derives from epochs never overrides what the user set.

The spec below is the only code its task writes: a sentence classifier for "which animal does
the sentence name", read from a two-column TSV file, scored by accuracy, its predictions written
to a file of its own. It trains through `finetuning.run` with configs/finetuning.py plus a few
fields, as a new task's config would.
"""
import csv
import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import metrics
from bertjax.configs import finetuning as finetuning_config
from bertjax.models import heads
from bertjax.tasks import finetuning

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ANIMALS = ["cat", "dog", "bird"]
FILLER = [f"word{i}" for i in range(30)]


# ---- the throwaway task: everything a new task writes ----------------------------------------


def _read_tsv(path):
  with open(path, encoding="utf-8", newline="") as f:
    return [(int(label), text) for label, text in csv.reader(f, delimiter="\t")]


def _encode(rows, tokenizer, max_seq_length):
  ids = np.zeros((len(rows), max_seq_length), np.int32)
  for i, (_, text) in enumerate(rows):
    tokens = [tokenizer.cls_id, *tokenizer.encode(text)[:max_seq_length - 2], tokenizer.sep_id]
    ids[i, :len(tokens)] = tokens
  return {"input_ids": ids, "segment_ids": np.zeros_like(ids),
          "input_mask": (ids > 0).astype(np.int32),
          "label": np.array([label for label, _ in rows], np.int32)}


def read(config, tokenizer, workdir):
  del workdir
  rows = {split: _read_tsv(os.path.join(config.data.data_dir, f"{split}.tsv"))
          for split in ("train", "dev")}
  return finetuning.Data(
      train=_encode(rows["train"], tokenizer, config.data.max_seq_length),
      eval=_encode(rows["dev"], tokenizer, config.data.max_seq_length),
      num_labels=len(ANIMALS), context=rows["dev"], summary=f"animals: {len(rows['train'])}")


def terms(logits, batch):
  weight = batch["example_weight"]
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]), weight),
          "accuracy": (jnp.argmax(logits, -1) == batch["label"], weight)}


def predict(logits, batch):
  return {"prediction": jnp.argmax(logits, -1), "label": batch["label"]}


def score(data, predictions):
  del data
  return {"accuracy": metrics.accuracy(predictions["label"], predictions["prediction"])}


def write(data, name, predictions, directory):
  lines = [f"{text}\t{ANIMALS[p]}" for (_, text), p in zip(data.context, predictions["prediction"])]
  (directory / f"{name}_animals.tsv").write_text("\n".join(lines) + "\n")


ANIMAL_SPEC = finetuning.Spec(
    name="animal fine-tuning", read=read,
    model=lambda bert_config, data: heads.BertForSequenceClassification(bert_config,
                                                                        data.num_labels),
    terms=terms, predict=predict, score=score, write=write)

# ---- the test ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def animal_data(tmp_path_factory):
  directory = tmp_path_factory.mktemp("animals")
  rng = np.random.default_rng(0)
  for split, n in (("train", 384), ("dev", 64)):
    with open(directory / f"{split}.tsv", "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f, delimiter="\t", lineterminator="\n")
      for _ in range(n):
        label = int(rng.integers(len(ANIMALS)))
        words = list(rng.choice(FILLER, size=rng.integers(3, 8)))
        words.insert(int(rng.integers(len(words) + 1)), ANIMALS[label])
        writer.writerow([label, " ".join(words)])
  return directory


def _config(model_dir, data_dir):
  """configs/finetuning.py plus what this task's config would say."""
  config = finetuning_config.get_config()
  config.init_checkpoint = model_dir
  config.data.data_dir = str(data_dir)
  config.data.max_seq_length = 16
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=2e-3, num_train_epochs=6.0)
  return config


def test_a_task_from_a_spec_trains(random_bert, animal_data, tmp_path):
  model_dir = random_bert(tmp_path / "model", SPECIALS + ANIMALS + FILLER)
  workdir = tmp_path / "run"
  config = _config(model_dir, animal_data)
  result = finetuning.run(ANIMAL_SPEC, config, str(workdir))
  assert set(result) == {"loss", "accuracy"}
  assert result["accuracy"] > 0.9, result  # chance is 1/3
  assert config.train.num_train_steps == 6 * (384 // 16)
  assert config.train.warmup_steps == int(0.1 * 144)
  rows = (workdir / "eval_animals.tsv").read_text().splitlines()
  assert len(rows) == 64
  assert np.mean([row.split("\t")[1] in row.split("\t")[0].split() for row in rows]) > 0.9
  # The workdir is a model directory: bert_config.json and the tokenizer came along.
  assert {"bert_config.json", "vocab.txt", "eval_results.json"} <= set(os.listdir(workdir))


def test_user_set_steps_and_warmup_are_kept():
  config = finetuning_config.get_config()
  finetuning.set_schedule(config, steps_per_epoch=10)
  assert (config.train.num_train_steps, config.train.warmup_steps) == (30, 3)
  assert config.train.eval_every_steps == config.train.checkpoint_every_steps == 10
  config = finetuning_config.get_config()
  config.train.num_train_steps, config.train.warmup_steps = 7, 0
  config.train.eval_every_steps = 5
  finetuning.set_schedule(config, steps_per_epoch=10)
  assert (config.train.num_train_steps, config.train.warmup_steps) == (7, 0)
  assert config.train.eval_every_steps == 5
  config = finetuning_config.get_config()
  config.train.num_train_steps = 50  # warmup left at -1: 10% of the steps the user set
  finetuning.set_schedule(config, steps_per_epoch=10)
  assert (config.train.num_train_steps, config.train.warmup_steps) == (50, 5)
