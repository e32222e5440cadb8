"""SQuAD fine-tuning end to end: SQuAD JSON whose answer is the word after "key" in contexts
longer than one window, a small random BERT fine-tuned on it (v1.1, and v2.0 with unanswerable
questions), the official-format output files and their official scores, and the configs that
cannot run, named before any step.
"""
import json

import numpy as np
import pytest

from bertjax import metrics, tasks
from bertjax.data.finetuning import squad as squad_data
from bertjax.errors import UserError
from bertjax.tasks import squad_answers

from squad_helpers import VOCAB, _write_squad
from squad_helpers import tok, vocab_file  # noqa: F401  (the fixtures)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random (untrained) small BERT saved as a bertjax checkpoint with its vocab.txt."""
  return random_bert(tmp_path_factory.mktemp("model"), VOCAB)


def _config(model_dir, train_file, predict_file, version="v1.1"):
  from bertjax.configs import squad as squad_config  # pylint: disable=import-outside-toplevel
  config = squad_config.get_config(version)
  config.init_checkpoint = model_dir
  config.data.update(train_file=train_file, predict_file=predict_file, max_seq_length=48,
                     doc_stride=16, max_query_length=8)
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=1e-3,
                      num_train_epochs=3.0, log_every_steps=1000,
                      eval_every_steps=10**6)  # evaluate at the end only
  return config


def test_squad_v1_learns_and_writes_run_squad_files(model_dir, tok, tmp_path):
  rng = np.random.default_rng(0)
  train_file = _write_squad(tmp_path / "train.json", rng, 320, 0.0)
  dev_file = _write_squad(tmp_path / "dev.json", rng, 48, 0.0)
  config = _config(model_dir, train_file, dev_file)
  workdir = tmp_path / "run"
  result = tasks.run(config, str(workdir))
  run = json.loads((workdir / "config.json").read_text())["train"]  # the schedule as run
  assert run["num_train_steps"] == 3 * (320 // 16)  # epochs of questions, as run_squad
  dev = json.loads(open(dev_file).read())
  features = squad_data.convert_examples_to_features(
      squad_data.read_examples(dev, is_training=False, version_2_with_negative=False),
      tok, max_seq_length=48, doc_stride=16, max_query_length=8, is_training=False)
  assert len(features) > 1.5 * 48  # most contexts span several windows
  assert set(result) == {"exact_match", "f1"}
  assert result["exact_match"] > 90, result  # chance: about 0

  predictions = json.loads((workdir / squad_answers.PREDICTIONS_FILE).read_text())
  qids = [qa["id"] for qa in metrics.squad_questions(dev["data"])]
  assert list(predictions) == qids and all(isinstance(v, str) for v in predictions.values())
  # The official scoring of predictions.json gives the reported result.
  assert metrics.squad_metrics(dev["data"], predictions) == pytest.approx(result)
  golds = {qa["id"]: qa["answers"][0]["text"] for qa in metrics.squad_questions(dev["data"])}
  exact = [q for q in qids if predictions[q] == golds[q]]  # original casing, "(", ")," trimmed
  assert len(exact) > 0.9 * len(qids)
  nbest = json.loads((workdir / squad_answers.NBEST_FILE).read_text())
  assert list(nbest) == qids
  assert all(set(e) == {"text", "probability", "start_logit", "end_logit"}
             for entries in nbest.values() for e in entries)
  assert not (workdir / squad_answers.NULL_ODDS_FILE).exists()
  assert json.loads((workdir / "eval_results.json").read_text())["f1"] == result["f1"]


def test_squad_v2_learns_no_answer(model_dir, tmp_path):
  rng = np.random.default_rng(1)
  train_file = _write_squad(tmp_path / "train.json", rng, 320, 0.3)
  dev_file = _write_squad(tmp_path / "dev.json", rng, 48, 0.3)
  workdir = tmp_path / "run"
  config = _config(model_dir, train_file, dev_file, "v2.0")
  config.train.num_train_epochs = 6.0  # most windows point at [CLS]: spans come later
  result = tasks.run(config, str(workdir))
  assert result["HasAns_total"] + result["NoAns_total"] == result["total"] == 48
  assert result["HasAns_total"] > 20 and result["NoAns_total"] > 5
  assert result["HasAns_exact"] > 85 and result["NoAns_exact"] > 85, result
  assert {"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} <= set(result)
  predictions = json.loads((workdir / squad_answers.PREDICTIONS_FILE).read_text())
  null_odds = json.loads((workdir / squad_answers.NULL_ODDS_FILE).read_text())
  assert list(null_odds) == list(predictions)
  # predictions.json answers "" exactly where null_odds exceeds the threshold (0.0).
  assert all((predictions[q] == "") == (null_odds[q] > 0.0) for q in predictions)
  dev = json.loads(open(dev_file).read())
  assert metrics.squad_metrics(dev["data"], predictions, null_odds,
                               version_2=True) == pytest.approx(result)


def test_bad_configs_are_named(model_dir, tmp_path):
  rng = np.random.default_rng(2)
  v1_file = _write_squad(tmp_path / "v1.json", rng, 20, 0.0)
  v2_file = _write_squad(tmp_path / "v2.json", rng, 20, 0.5)
  with pytest.raises(UserError, match="set --config.init_checkpoint"):
    tasks.run(_config("", v1_file, v1_file), str(tmp_path / "a"))
  with pytest.raises(UserError, match="does not exist"):
    tasks.run(_config(model_dir, str(tmp_path / "nope.json"), v1_file), str(tmp_path / "b"))
  with pytest.raises(UserError, match="version_2_with_negative=True"):
    tasks.run(_config(model_dir, v1_file, v2_file), str(tmp_path / "c"))
  with pytest.raises(UserError, match="version_2_with_negative=True"):
    tasks.run(_config(model_dir, v2_file, v1_file), str(tmp_path / "d"))
  short = _config(model_dir, v1_file, v1_file)
  short.data.max_query_length = 45
  with pytest.raises(UserError, match="must exceed data.max_query_length"):
    tasks.run(short, str(tmp_path / "e"))
  assert not any((tmp_path / d).exists() for d in "abcde")
  from bertjax.configs import squad as squad_config  # pylint: disable=import-outside-toplevel
  assert squad_config.get_config("v2.0").train.learning_rate == 5e-5
  assert squad_config.get_config("v2.0").data.version_2_with_negative
  assert squad_config.get_config().train.learning_rate == 3e-5
  with pytest.raises(UserError, match="v1.1 or v2.0"):
    squad_config.get_config("v3")
