"""Fine-tuning ModernBERT with bertjax's tasks, unchanged: GLUE (SST-2 with the head reading
the [CLS] or the mean of the tokens, `model.pooling`), NER, SQuAD and SWAG, each from a random
small ModernBERT model directory (as its pretraining saves one) on the tests' synthetic data,
scored as each task's official script scores it."""
import json

import numpy as np
import pytest

from bertjax import tasks

import test_glue
import test_ner
import test_squad_finetuning
import test_swag
from conftest import GLUE_VOCAB
from squad_helpers import VOCAB as SQUAD_VOCAB, _write_squad
from test_ner import conll_dir  # noqa: F401  (the fixture)
from test_swag import swag_dir  # noqa: F401  (the fixture)


def _modernbert(random_bert, tmp_path_factory, vocab):
  return random_bert(tmp_path_factory.mktemp("modernbert"), vocab, architecture="modernbert")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_glue_learns_with_either_pooling(pooling, random_bert, tmp_path_factory, glue_dir):
  model_dir = _modernbert(random_bert, tmp_path_factory, GLUE_VOCAB)
  config = test_glue._config("sst2", model_dir, glue_dir)
  config.model.pooling = pooling
  workdir = tmp_path_factory.mktemp("runs") / f"sst2_{pooling}"
  result = tasks.run(config, str(workdir))
  assert result["accuracy"] > 0.85, result  # chance is about 0.5
  saved = json.loads((workdir / "bert_config.json").read_text())
  assert (saved["architecture"], saved["pooling"]) == ("modernbert", pooling)


def test_ner_squad_and_swag_run_and_learn(random_bert, tmp_path_factory, conll_dir, swag_dir):
  runs = tmp_path_factory.mktemp("runs")
  ner = tasks.run(test_ner._config(_modernbert(random_bert, tmp_path_factory, test_ner.VOCAB),
                                   conll_dir), str(runs / "ner"))
  assert ner["f1"] > 0.5, ner  # seqeval's entity F1; chance is near 0

  rng = np.random.default_rng(0)
  train_file = _write_squad(runs / "train.json", rng, 320, 0.0)
  dev_file = _write_squad(runs / "dev.json", rng, 48, 0.0)
  squad = tasks.run(test_squad_finetuning._config(
      _modernbert(random_bert, tmp_path_factory, SQUAD_VOCAB), train_file, dev_file),
      str(runs / "squad"))
  assert squad["exact_match"] > 50, squad  # the official script's; chance is about 0

  swag = tasks.run(test_swag._config(_modernbert(random_bert, tmp_path_factory, test_swag.VOCAB),
                                     swag_dir), str(runs / "swag"))
  assert swag["accuracy"] > 0.5, swag  # 4 endings: chance is 0.25


def test_mean_pooling_of_a_bert_model_is_refused(random_bert, tmp_path_factory, glue_dir):
  from bertjax.errors import UserError  # pylint: disable=import-outside-toplevel
  from bertjax.tasks import finetuning  # pylint: disable=import-outside-toplevel
  config = test_glue._config("sst2", random_bert(tmp_path_factory.mktemp("bert"), GLUE_VOCAB),
                             glue_dir)
  config.model.pooling = "mean"
  with pytest.raises(UserError, match="mean pooling is architecture='modernbert''s"):
    finetuning.load_pretrained(tasks.typed(config), "GLUE fine-tuning")


def test_the_sweep_runs_on_modernbert(random_bert, tmp_path_factory, glue_dir):
  """The paper's learning-rate selection (bertjax.tools.sweep) on a ModernBERT model: each
  rate's run finishes and the best is picked by the task's main metric."""
  from bertjax.tools import sweep  # pylint: disable=import-outside-toplevel
  config = test_glue._config("sst2", _modernbert(random_bert, tmp_path_factory, GLUE_VOCAB),
                             glue_dir, num_train_epochs=1.0)
  results = sweep.sweep(config, str(tmp_path_factory.mktemp("sweep")), [1e-3, 3e-4], [0])
  assert [run["finished"] for run in results["runs"]] == [True, True]
  assert results["main_metric"] == "accuracy"
  assert results["best"]["score"] == max(run["score"] for run in results["runs"])
