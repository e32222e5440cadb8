"""GLUE fine-tuning end to end (configs/glue.py) on data in GLUE's own file layout.

A small random BERT with a WordPiece vocabulary is saved as a bertjax checkpoint; SST-2- and
STS-B-format files (conftest's glue_dir) have labels that follow from the words (so a model can
learn them);
fine-tuning then has to learn the dev split, and writes eval_results.json, eval_predictions.tsv
and the leaderboard file of the test split.
"""
import json
import os
import sys

import numpy as np
import pytest

import torch
import transformers
from conftest import GLUE_VOCAB
import warm_python

from bertjax import metrics
from bertjax.modeldir import model_files
from bertjax.convert import __main__ as convert_cli
from bertjax.data.finetuning import glue as glue_data
from bertjax.errors import UserError
from bertjax import tasks
from bertjax.tasks import glue

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random (untrained) small BERT saved as a bertjax checkpoint with its vocab.txt."""
  return random_bert(tmp_path_factory.mktemp("model"), GLUE_VOCAB)


def _config(task, model_dir, glue_dir, **train):
  from bertjax.configs import glue as glue_config  # pylint: disable=import-outside-toplevel
  config = glue_config.get_config()
  config.task = task
  config.init_checkpoint = model_dir
  config.data.glue_dir = glue_dir
  config.data.max_seq_length = 32
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update({**dict(batch_size=16, eval_batch_size=32, learning_rate=1e-3,
                              num_train_epochs=4.0, log_every_steps=1000), **train})
  return config


@pytest.fixture(scope="module")
def sst2_run(model_dir, glue_dir, tmp_path_factory):
  """(workdir, config, dev metrics) of SST-2 fine-tuning with test predictions."""
  workdir = tmp_path_factory.mktemp("runs") / "sst2"
  config = _config("sst2", model_dir, glue_dir)
  config.data.predict_splits = "test"
  return workdir, config, tasks.run(config, str(workdir))


def test_sst2_learns_and_writes_glue_files(sst2_run, glue_dir, tmp_path):
  workdir, config, result = sst2_run
  assert result["accuracy"] > 0.9, result  # chance is about 0.5
  saved = json.loads((workdir / "eval_results.json").read_text())
  run = json.loads((workdir / "config.json").read_text())["train"]  # the schedule as run
  assert saved["accuracy"] == result["accuracy"] and saved["step"] == run["num_train_steps"]
  num_train = sum(1 for _ in open(os.path.join(glue_dir, "SST-2", "train.tsv"))) - 1
  # 4 epochs as run_classifier.py counts them: int(N / B * epochs), the partial batches too.
  assert run["num_train_steps"] == int(num_train / 16 * 4)

  rows = (workdir / glue.EVAL_PREDICTIONS_FILE).read_text().splitlines()
  dev_rows = open(os.path.join(glue_dir, "SST-2", "dev.tsv")).read().splitlines()[1:]
  assert rows[0] == "guid\tlabel\tprediction" and len(rows) == len(dev_rows) + 1
  labels = [r.split("\t")[1] for r in rows[1:]]
  predictions = [r.split("\t")[2] for r in rows[1:]]
  assert labels == [r.split("\t")[1] for r in dev_rows]
  assert metrics.accuracy(np.array(labels), np.array(predictions)) == result["accuracy"]

  submission = (workdir / "SST-2.tsv").read_text().splitlines()
  test_rows = open(os.path.join(glue_dir, "SST-2", "test.tsv")).read().splitlines()[1:]
  assert submission[0] == "index\tprediction" and len(submission) == 1 + len(test_rows)
  assert [r.split("\t")[0] for r in submission[1:]] == [r.split("\t")[0] for r in test_rows]
  test_sentences = [r.split("\t")[1] for r in test_rows]
  truth = [str(int(sum(s.split().count(w) for w in ("good", "great"))
                   > sum(s.split().count(w) for w in ("bad", "awful"))))
           for s in test_sentences]
  assert np.mean([p.split("\t")[1] == t for p, t in zip(submission[1:], truth)]) > 0.85

  # The workdir is a model directory: it converts to a transformers classifier that predicts
  # what bertjax predicted on the dev split.
  assert convert_cli.to_hf_dir(str(workdir), str(tmp_path / "hf")) == (
      "BertForSequenceClassification")
  model = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
  tok = model_files.load_tokenizer(str(workdir))
  examples = glue_data.read_examples("sst2", "dev", glue_dir)
  features = glue_data.encode_examples(examples, glue_data.TASKS["sst2"], tok, 32)
  with torch.no_grad():
    logits = model(torch.tensor(features["input_ids"]),
                   attention_mask=torch.tensor(features["input_mask"]),
                   token_type_ids=torch.tensor(features["segment_ids"])).logits.numpy()
  assert [str(p) for p in logits.argmax(-1)] == predictions


def test_stsb_regression_correlates(model_dir, glue_dir, tmp_path):
  config = _config("stsb", model_dir, glue_dir, num_train_epochs=5.0)
  result = tasks.run(config, str(tmp_path / "stsb"))
  assert set(result) == {"loss", "pearson", "spearmanr"}
  assert result["pearson"] > 0.8, result


def test_a_fine_tuned_model_starts_another_task(sst2_run, glue_dir, tmp_path, capsys):
  """STS-B from the SST-2 workdir: the encoder is loaded, the 2-label classifier does not fit
  the 1-output regressor and starts fresh (said so), and training goes on."""
  workdir, _, _ = sst2_run
  config = _config("stsb", str(workdir), glue_dir, num_train_epochs=1.0)
  result = tasks.run(config, str(tmp_path / "stsb"))
  printed = capsys.readouterr().out
  assert "its sequence_classification has other shapes" in printed
  assert ("freshly initialised sequence_classification/classifier/bias, "
          "sequence_classification/classifier/kernel") in printed
  assert np.isfinite(result["pearson"])


def test_bad_configs_are_named(model_dir, glue_dir, tmp_path):
  with pytest.raises(UserError, match="set --config.init_checkpoint"):
    tasks.run(_config("sst2", "", glue_dir), str(tmp_path / "a"))
  with pytest.raises(UserError, match="ax .* has no training data"):
    tasks.run(_config("ax", model_dir, glue_dir), str(tmp_path / "b"))
  bad_split = _config("sst2", model_dir, glue_dir)
  bad_split.data.predict_splits = "test_matched"
  with pytest.raises(UserError, match="sst2 has no split 'test_matched'"):
    tasks.run(bad_split, str(tmp_path / "c"))
  with pytest.raises(UserError, match="MRPC"):  # no MRPC files in this GLUE directory
    tasks.run(_config("mrpc", model_dir, glue_dir), str(tmp_path / "d"))
  not_mnli = _config("sst2", model_dir, glue_dir)
  not_mnli.data.predict_splits = "test,ax"  # AX.tsv holds MNLI's label names
  with pytest.raises(UserError, match="only an MNLI model predicts it"):
    tasks.run(not_mnli, str(tmp_path / "e"))
  assert not any((tmp_path / d).exists() for d in "abcde")


def test_command_line_unknown_task_and_missing_checkpoint(tmp_path):
  run = lambda *flags: warm_python.run(
      [sys.executable, "-m", "bertjax.main", f"--config={ROOT}/bertjax/configs/glue.py",
       f"--workdir={tmp_path / 'w'}", *flags], env=dict(os.environ, PYTHONPATH=ROOT),
      cwd=ROOT, timeout=300)
  result = run("--config.task=mrpcc")
  assert result.returncode != 0 and "unknown task 'mrpcc'" in result.stderr
  result = run("--config.task=rte")
  assert result.returncode != 0 and "init_checkpoint" in result.stderr
  assert not (tmp_path / "w").exists()
