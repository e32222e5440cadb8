"""SWAG: reading swagaf's CSV files, the multiple-choice features, and fine-tuning end to end.

A small random BERT with a WordPiece vocabulary is saved as a bertjax checkpoint; SWAG-format
files are written whose right ending is the one that repeats the colour word of sent1 (the wrong
endings hold filler words only), so a model can learn it from the words; fine-tuning has to get
the dev questions right far above chance (0.25) and writes eval_results.json,
eval_predictions.csv and test_predictions.csv. (Telling the right ending by matching sent1's
colour against endings that all hold one takes a random tiny BERT hundreds of steps, too slow
and seed-dependent for this suite; that the context reaches each choice is checked exactly by
the feature tests.)
"""
import csv
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from bertjax import tokenization
from bertjax.data.finetuning import swag as swag_data
from bertjax.errors import UserError
from bertjax import tasks
from bertjax.tasks import swag

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
COLOURS = ["red", "blue", "green", "pink", "gray", "brown"]
FILLER = [f"word{i}" for i in range(30)]
VOCAB = SPECIALS + COLOURS + FILLER
HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random (untrained) small BERT saved as a bertjax checkpoint with its vocab.txt."""
  return random_bert(tmp_path_factory.mktemp("model"), VOCAB)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
  return tokenization.load_tokenizer(model_dir)


def _words(rng, low, high):
  return [str(w) for w in rng.choice(FILLER, size=rng.integers(low, high))]


def _questions(rng, n):
  """Rows (in swagaf's column order) whose right ending repeats the colour word of sent1; the
  wrong endings hold filler words only."""
  rows = []
  for i in range(n):
    label = int(rng.integers(4))
    colour = str(rng.choice(COLOURS))
    context = _words(rng, 2, 6)
    context.insert(int(rng.integers(len(context) + 1)), colour)
    sent1, sent2 = " ".join(context), " ".join(_words(rng, 1, 3))
    endings = [_words(rng, 1, 5) for _ in range(4)]
    endings[label].insert(int(rng.integers(len(endings[label]) + 1)), colour)
    rows.append([str(i), f"video{i}", str(1000 + i), f"{sent1} {sent2}", sent1, sent2, "gold",
                 *[" ".join(e) for e in endings], str(label)])
  return rows


def _write_csv(path, header, rows):
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return str(path)


@pytest.fixture(scope="module")
def swag_dir(tmp_path_factory):
  """train.csv, val.csv and test.csv (no label column) in swagaf's regular format."""
  directory = tmp_path_factory.mktemp("swag")
  rng = np.random.default_rng(0)
  for name, n in (("train", 256), ("val", 96)):
    _write_csv(directory / f"{name}.csv", HEADER, _questions(rng, n))
  _write_csv(directory / "test.csv", HEADER[:-1], [r[:-1] for r in _questions(rng, 40)])
  return directory


def _config(model_dir, swag_dir, **train):
  from bertjax.configs import swag as swag_config  # pylint: disable=import-outside-toplevel
  config = swag_config.get_config()
  config.init_checkpoint = model_dir
  config.data.train_file = str(swag_dir / "train.csv")
  config.data.eval_file = str(swag_dir / "val.csv")
  config.data.max_seq_length = 24
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update({**dict(batch_size=16, eval_batch_size=32, learning_rate=1e-3,
                              num_train_epochs=3.0, log_every_steps=1000), **train})
  return config


# ----------------------------------------------------------------------------------------------
# Reading.


def test_reads_swagaf_columns_by_name(tmp_path):
  path = _write_csv(tmp_path / "val.csv", HEADER, [
      ["7", "anetv_x", "18419", "He rides. He", "He rides.", "He", "gold",
       "stops, then goes.", "falls", "sings", "sits", "2"],
      ["8", "lsmdc_y", "5", "A b", "A", "", "gold", "x", "y", "z", "w", "0"]])
  examples = swag_data.read_examples(path)
  assert examples[0] == swag_data.Example(
      id="7", context="He rides.", start="He",
      endings=("stops, then goes.", "falls", "sings", "sits"), label=2)
  assert examples[0].choices() == ["He stops, then goes.", "He falls", "He sings", "He sits"]
  assert examples[1].choices() == ["x", "y", "z", "w"]  # no sent2: no leading space
  # Another column order and no index column: ids count the rows; no label column: None.
  reordered = ["ending3", "ending2", "ending1", "ending0", "sent2", "sent1"]
  path = _write_csv(tmp_path / "test.csv", reordered, [["d", "c", "b", "a", "s2", "s1"]] * 2)
  assert swag_data.read_examples(path) == [
      swag_data.Example(id=str(i), context="s1", start="s2", endings=("a", "b", "c", "d"),
                        label=None) for i in range(2)]


def test_reading_errors_name_file_and_fix(tmp_path):
  with pytest.raises(UserError, match=r"nope\.csv does not exist.*rowanz/swagaf"):
    swag_data.read_examples(str(tmp_path / "nope.csv"))
  with pytest.raises(UserError, match="is a directory"):
    swag_data.read_examples(str(tmp_path))
  path = _write_csv(tmp_path / "a.csv", [h for h in HEADER if h != "ending2"],
                    [["0"] * (len(HEADER) - 1)])
  with pytest.raises(UserError, match=r"a\.csv has no column ending2"):
    swag_data.read_examples(path)
  row = ["0", "v", "1", "s", "s1", "s2", "gold", "a", "b", "c", "d"]
  path = _write_csv(tmp_path / "b.csv", HEADER, [row + ["4"]])
  with pytest.raises(UserError, match=r"b\.csv:2: label '4' is not an ending's index"):
    swag_data.read_examples(path)
  path = _write_csv(tmp_path / "c.csv", HEADER, [row + ["1"], row])
  with pytest.raises(UserError, match=r"c\.csv:3: 11 fields, but the header has 12"):
    swag_data.read_examples(path)
  (tmp_path / "d.csv").write_bytes(",sent1\n0,caf\xe9\n".encode("latin-1"))
  with pytest.raises(UserError, match=r"d\.csv is not UTF-8: line 2"):
    swag_data.read_examples(str(tmp_path / "d.csv"))
  (tmp_path / "e.csv").write_text("")
  with pytest.raises(UserError, match=r"e\.csv is empty"):
    swag_data.read_examples(str(tmp_path / "e.csv"))


# ----------------------------------------------------------------------------------------------
# Features.


def test_features_are_cls_context_sep_start_ending_sep(tokenizer):
  ids = {t: i for i, t in enumerate(VOCAB)}
  example = swag_data.Example(id="0", context="red word1", start="word2",
                              endings=("blue", "green word3", "pink", "gray"), label=1)
  features = swag_data.encode_examples([example, example], tokenizer, max_seq_length=10)
  assert {k: v.shape for k, v in features.items()} == {
      "input_ids": (2, 4, 10), "segment_ids": (2, 4, 10), "input_mask": (2, 4, 10),
      "label": (2,)}
  assert all(v.dtype == np.int32 for v in features.values())
  cls, sep = ids["[CLS]"], ids["[SEP]"]
  np.testing.assert_array_equal(features["input_ids"][0, 1], [
      cls, ids["red"], ids["word1"], sep, ids["word2"], ids["green"], ids["word3"], sep, 0, 0])
  np.testing.assert_array_equal(features["segment_ids"][0, 1], [0, 0, 0, 0, 1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(features["input_mask"][0, 1], [1] * 8 + [0] * 2)
  np.testing.assert_array_equal(features["input_ids"][0, 0], [
      cls, ids["red"], ids["word1"], sep, ids["word2"], ids["blue"], sep, 0, 0, 0])
  np.testing.assert_array_equal(features["label"], [1, 1])
  unlabelled = dataclasses.replace(example, label=None)
  assert "label" not in swag_data.encode_examples([example, unlabelled], tokenizer, 10)


def test_features_truncate_longest_first(tokenizer):
  ids = {t: i for i, t in enumerate(VOCAB)}
  context = " ".join(f"word{i}" for i in range(10))  # 10 pieces
  example = swag_data.Example(id="0", context=context, start="red",
                              endings=("word20 word21", "blue", "", "green"), label=0)
  features = swag_data.encode_examples([example], tokenizer, max_seq_length=9)  # 6 pieces
  row = features["input_ids"][0, 0]  # 10 + 3 pieces -> 3 + 3 (A keeps the odd one: 3, B 3)
  np.testing.assert_array_equal(row, [
      ids["[CLS]"], ids["word0"], ids["word1"], ids["word2"], ids["[SEP]"],
      ids["red"], ids["word20"], ids["word21"], ids["[SEP]"]])
  np.testing.assert_array_equal(features["segment_ids"][0, 0], [0] * 5 + [1] * 4)
  row = features["input_ids"][0, 2]  # B is "red" alone: A keeps 5
  np.testing.assert_array_equal(row, [ids["[CLS]"]] + [ids[f"word{i}"] for i in range(5)]
                                + [ids["[SEP]"], ids["red"], ids["[SEP]"]])
  np.testing.assert_array_equal(features["segment_ids"][0, 2], [0] * 7 + [1] * 2)
  assert features["input_mask"][0].sum(-1).tolist() == [9, 9, 9, 9]
  with pytest.raises(UserError, match="max_seq_length=2"):
    swag_data.encode_examples([example], tokenizer, max_seq_length=2)


def test_features_match_transformers_run_swag(model_dir, tokenizer):
  """Untruncated, each choice is what transformers' run_swag.py gives: its tokenizer on
  (sent1, f"{sent2} {ending}"). (Truncation is Google's, checked in test_glue_data_encoding.py.)"""
  import transformers  # pylint: disable=import-outside-toplevel
  hf = transformers.BertTokenizerFast(os.path.join(model_dir, "vocab.txt"), do_lower_case=True)
  rows = _questions(np.random.default_rng(1), 20)
  examples = [swag_data.Example(r[0], r[4], r[5], tuple(r[7:11]), int(r[11])) for r in rows]
  ours = swag_data.encode_examples(examples, tokenizer, max_seq_length=24)
  theirs = hf([e.context for e in examples for _ in range(4)],
              [f"{e.start} {ending}" for e in examples for ending in e.endings],
              padding="max_length", max_length=24, return_tensors="np")
  for key, hf_key in (("input_ids", "input_ids"), ("segment_ids", "token_type_ids"),
                      ("input_mask", "attention_mask")):
    np.testing.assert_array_equal(ours[key].reshape(-1, 24), theirs[hf_key])


# ----------------------------------------------------------------------------------------------
# Fine-tuning.


def test_swag_learns_and_writes_predictions(model_dir, swag_dir, tmp_path):
  workdir = tmp_path / "swag"
  config = _config(model_dir, swag_dir)
  config.data.predict_file = str(swag_dir / "test.csv")
  result = tasks.run(config, str(workdir))
  assert set(result) == {"loss", "accuracy"}
  assert result["accuracy"] > 0.9, result  # chance is 0.25
  saved = json.loads((workdir / "eval_results.json").read_text())
  run = json.loads((workdir / "config.json").read_text())["train"]  # the schedule as run
  assert saved["accuracy"] == result["accuracy"] and saved["step"] == run["num_train_steps"]
  assert run["num_train_steps"] == 3 * (256 // 16) and config.train.num_train_steps == -1

  with open(workdir / swag.EVAL_PREDICTIONS_FILE, newline="") as f:
    rows = list(csv.reader(f))
  val = swag_data.read_examples(str(swag_dir / "val.csv"))
  assert rows[0] == ["id", "label", "prediction"] and len(rows) == 1 + len(val)
  assert [r[:2] for r in rows[1:]] == [[e.id, str(e.label)] for e in val]
  assert np.mean([r[1] == r[2] for r in rows[1:]]) == pytest.approx(result["accuracy"])

  with open(workdir / swag.TEST_PREDICTIONS_FILE, newline="") as f:
    rows = list(csv.reader(f))
  test = swag_data.read_examples(str(swag_dir / "test.csv"))
  assert rows[0] == ["id", "prediction"] and [r[0] for r in rows[1:]] == [e.id for e in test]
  truth = [next(j for j, ending in enumerate(e.endings) if set(ending.split()) & set(COLOURS))
           for e in test]
  assert np.mean([int(r[1]) == t for r, t in zip(rows[1:], truth)]) > 0.9


def test_bad_configs_are_named(model_dir, swag_dir, tmp_path):
  with pytest.raises(UserError, match="set --config.init_checkpoint"):
    tasks.run(_config("", swag_dir), str(tmp_path / "a"))
  no_train = _config(model_dir, swag_dir)
  no_train.data.train_file = ""
  with pytest.raises(UserError, match="set --config.data.train_file to SWAG's train.csv"):
    tasks.run(no_train, str(tmp_path / "b"))
  unlabelled = _config(model_dir, swag_dir)
  unlabelled.data.eval_file = str(swag_dir / "test.csv")
  with pytest.raises(UserError, match="data.eval_file=.*test.csv has examples without a label"):
    tasks.run(unlabelled, str(tmp_path / "c"))
  too_long = _config(model_dir, swag_dir)
  too_long.data.max_seq_length = 128
  with pytest.raises(UserError, match="exceeds the model's 64 positions"):
    tasks.run(too_long, str(tmp_path / "d"))
  assert not any((tmp_path / d).exists() for d in "abcd")


def test_command_line_names_missing_checkpoint(tmp_path):
  result = warm_python.run(
      [sys.executable, "-m", "bertjax.main", f"--config={ROOT}/bertjax/configs/swag.py",
       f"--workdir={tmp_path / 'w'}"], env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT,
      timeout=300)
  assert result.returncode == 2 and "set --config.init_checkpoint" in result.stderr, result.stderr
  assert not (tmp_path / "w").exists()
