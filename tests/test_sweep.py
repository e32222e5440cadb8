"""bertjax.tools.sweep: a grid of fine-tuning runs on a small random BERT and conftest's GLUE-format
files.

The README's command runs as written: STS-B, whose main metric is Spearman's correlation, at the
paper's four learning rates. Before it, one of its runs is interrupted (train.stop_after_steps);
the README's command then resumes that run from its checkpoint, starts the three others and
picks the best by the correlation each run recorded; run again, it skips every finished run
without touching its files.
"""
import importlib
import json
import math
import os
import re
import shlex
import sys

import numpy as np
import pytest
from conftest import GLUE_VOCAB, tree_digest
import docs_text
import warm_python

from bertjax import metrics, tasks
from bertjax.tools import sweep
from bertjax.configs import glue as glue_config
from bertjax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATES = ("5e-05", "4e-05", "3e-05", "2e-05")  # the README command's, as run directories name them


@pytest.fixture(scope="module")
def model_dir(random_bert, tmp_path_factory):
  """A random one-layer H16 BERT (save_random_bert's smallest: each of the sweep's rates
  compiles its own train step) that reads conftest's GLUE files, with the 128 positions that
  the default configs/glue.py asks for."""
  return random_bert(tmp_path_factory.mktemp("model"), GLUE_VOCAB, max_position_embeddings=128,
                     smallest=True)


def _readme_sweep_command():
  """docs/finetuning.md's `python -m bertjax.tools.sweep` command as arguments (continued lines
  joined)."""
  text = re.sub(r"\\\n\s*", " ", docs_text.all_text())
  commands = [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
              for line in block.splitlines() if line.startswith("python -m bertjax.tools.sweep")]
  assert len(commands) == 1, commands
  return shlex.split(commands[0])


def _run(cwd, args):
  out = warm_python.run([sys.executable, *args[1:]], cwd=cwd,
                        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"),
                        timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def _recorded(directory, name):
  """A run's eval_results.json, as the run wrote it."""
  with open(os.path.join(directory, name, "eval_results.json"), encoding="utf-8") as f:
    return json.load(f)


def _readme_config(**fields):
  """In this process, the config the README command makes (run from its directory), with
  `fields` ({"train.stop_after_steps": 12}) changed."""
  config = glue_config.get_config()
  config.update_from_flattened_dict({"task": "stsb", "init_checkpoint": "CKPT",
                                     "data.glue_dir": "GLUE_DIR", **fields})
  return config


def test_the_readme_command_resumes_picks_by_the_main_metric_and_skips_what_is_done(
    model_dir, glue_dir, tmp_path, monkeypatch, capsys):
  os.symlink(model_dir, tmp_path / "CKPT")
  os.symlink(glue_dir, tmp_path / "GLUE_DIR")
  monkeypatch.chdir(tmp_path)
  directory = tmp_path / "sweep_stsb"
  names = [f"lr_{rate}_seed_0" for rate in RATES]

  # One run interrupted at step 12 of 30, as a time-boxed sweep leaves it.
  stopped = sweep.sweep(_readme_config(**{"train.stop_after_steps": 12}), str(directory),
                        [5e-5], [0])
  assert not stopped["runs"][0]["finished"] and stopped["best"] is None
  assert os.listdir(directory / names[0] / "checkpoints") == ["12"]
  assert not os.path.lexists(directory / "best")

  out = _run(tmp_path, _readme_sweep_command())
  # It went on from its checkpoint (the trainer says so); the three others started.
  assert f"[1/4] {names[0]}: resuming from step 12" in out
  assert f"resuming from step 12 of {directory / names[0] / 'checkpoints'}" in out
  assert out.count(": starting") == 3 and out.count("resuming from step") == 2
  assert sorted(n for n in os.listdir(directory) if n.startswith("lr_")) == sorted(names)
  results = json.loads((directory / sweep.RESULTS_FILE).read_text())
  assert results["task"] == "stsb" and results["main_metric"] == "spearmanr"
  assert [r["directory"] for r in results["runs"]] == names
  recorded = {n: _recorded(directory, n) for n in names}
  spearman = {n: r["spearmanr"] for n, r in recorded.items()}
  assert all(r["main_metric"] == "spearmanr" and r["step"] == 30 for r in recorded.values())
  assert all(math.isfinite(v) for v in spearman.values()), spearman
  for run in results["runs"]:
    assert run["finished"] and run["step"] == 30 and run["score"] == spearman[run["directory"]]
    assert run["metrics"]["pearson"] == recorded[run["directory"]]["pearson"]
  for row, name in zip(results["per_learning_rate"], names):
    assert (row["runs"], row["mean"], row["std"], row["best"]) == (
        1, spearman[name], None, spearman[name])
    assert re.search(rf"^ +{row['learning_rate']:g} +1 +{row['mean']:.4f} ", out, re.M), out
  best = max(names, key=lambda n: spearman[n])  # the first of equal scores, in flag order
  assert results["best"]["directory"] == best and os.readlink(directory / "best") == best
  assert f"best: {best}, spearmanr {spearman[best]:.4f}" in out
  assert all((directory / n / "curves.png").is_file() for n in names)

  # Everything is finished: a rerun trains nothing and touches no file of a run.
  digests = {n: tree_digest(directory / n) for n in names}
  capsys.readouterr()
  again = sweep.sweep(_readme_config(), str(directory), [5e-5, 4e-5, 3e-5, 2e-5], [0])
  assert capsys.readouterr().out.count("finished (step 30), skipped") == 4
  assert {n: tree_digest(directory / n) for n in names} == digests
  assert json.loads(json.dumps(again)) == results
  assert json.loads((directory / sweep.RESULTS_FILE).read_text()) == results

  # Other settings on the same directory are refused before anything runs.
  with pytest.raises(UserError, match=rf"{names[0]} was run with other settings \("
                                      r"train.num_train_epochs: was 3.0, now 2.0\)"):
    sweep.sweep(_readme_config(**{"train.num_train_epochs": 2.0}), str(directory), [5e-5], [0])
  # A finished run whose evaluation file went missing cannot be told from a finished one: refused.
  os.rename(directory / names[1] / "eval_results.json", tmp_path / "moved.json")
  with pytest.raises(UserError, match=rf"{names[1]} holds the checkpoint of its last step but "
                                      r"no evaluation of it \(eval_results.json\); move "):
    sweep.sweep(_readme_config(), str(directory), [5e-5, 4e-5], [0])
  os.rename(tmp_path / "moved.json", directory / names[1] / "eval_results.json")
  assert {n: tree_digest(directory / n) for n in names} == digests


def test_summary_picks_the_main_metric_not_accuracy():
  """Where accuracy and F1 disagree (MRPC), the best run and the per-rate best follow F1; NaN
  never wins, and a single score has no standard deviation."""
  def run(rate, seed, f1, accuracy):
    return {"learning_rate": rate, "seed": seed, "directory": sweep.run_name(rate, seed),
            "finished": True, "main_metric": "f1", "score": sweep._score(f1),
            "metrics": {"f1": f1, "accuracy": accuracy}}

  runs = [run(5e-5, 0, 0.70, 0.90), run(5e-5, 1, 0.80, 0.60), run(2e-5, 0, math.nan, 0.95),
          run(2e-5, 1, 0.75, 0.50)]
  rows, best = sweep.summarize(runs, [5e-5, 2e-5])
  assert best["directory"] == "lr_5e-05_seed_1"
  assert rows[0] == {"learning_rate": 5e-5, "runs": 2, "mean": pytest.approx(0.75),
                     "std": pytest.approx(np.std([0.7, 0.8], ddof=1)), "best": 0.8,
                     "best_seed": 1}
  assert rows[1] == {"learning_rate": 2e-5, "runs": 2, "mean": 0.75, "std": None, "best": 0.75,
                     "best_seed": 1}


def test_each_fine_tuning_task_declares_the_metric_the_paper_reports():
  """Table 1's caption (F1 for QQP and MRPC, Spearman for STS-B, accuracy for the rest; CoLA is
  GLUE's Matthews correlation), F1 for SQuAD and NER, accuracy for SWAG: each a metric the task
  reports."""
  expected = {"cola": "matthews_correlation", "sst2": "accuracy", "mrpc": "f1", "qqp": "f1",
              "stsb": "spearmanr", "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy",
              "wnli": "accuracy", "squad": "f1", "ner": "f1", "swag": "accuracy"}
  assert set(expected) == set(tasks.FINETUNING) - {"ax"}  # ax is predicted by an MNLI model
  for task, name in expected.items():
    config = importlib.import_module(
        f"bertjax.configs.{task if task in ('squad', 'ner', 'swag') else 'glue'}").get_config()
    config.task = task
    assert tasks.FINETUNING[task].main_metric(config) == name, task
    if task in metrics.GLUE_METRICS:
      assert name in metrics.GLUE_METRICS[task]


def test_grid_flags_and_run_names():
  assert sweep.parse_learning_rates(["5e-5", "0.00004"]) == [5e-5, 4e-5]
  assert [sweep.run_name(r, 2) for r in (5e-5, 1e-3)] == ["lr_5e-05_seed_2", "lr_0.001_seed_2"]
  assert sweep.parse_seeds(["0", "1", "2"]) == [0, 1, 2]
  for bad, message in ((["x"], "'x' is not a positive number"), (["-1e-5"], "not a positive"),
                       (["5e-5", "5e-05"], "5e-05 is given twice"), ([], "is empty")):
    with pytest.raises(UserError, match=message):
      sweep.parse_learning_rates(bad)
  for bad, message in ((["1.5"], "'1.5' is not an integer >= 0"), (["-1"], "not an integer"),
                       (["1", "1"], "1 is given twice")):
    with pytest.raises(UserError, match=message):
      sweep.parse_seeds(bad)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
  """A pretraining config on the command line: one line, status 2, nothing written. The other
  refusals, in this process."""
  out = warm_python.run([sys.executable, "-m", "bertjax.tools.sweep", "--config=configs/tiny.py",
                         "--learning_rates=1e-4", f"--workdir={tmp_path / 'w'}"], cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"),
                        timeout=300)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
  [line] = out.stderr.strip().splitlines()
  assert line.startswith(
      "bertjax: error: bertjax.tools.sweep fine-tunes, and config.task='pretraining' is not a "
      "fine-tuning task; give a fine-tuning config (configs/glue.py, ner.py, squad.py, swag.py) "
      "or --config.task among ['ax', 'cola', "), line
  assert not (tmp_path / "w").exists()
  assert sweep._swept_overrides(["--config.seed=3", "--config.train.learning_rate=1e-4",
                                 "--config.train.learning_rates=1", "--seeds=1"]) == [
                                     "--config.seed", "--config.train.learning_rate"]
  (tmp_path / "w" / "best").mkdir(parents=True)
  with pytest.raises(UserError, match="best exists and is not a symbolic link"):
    sweep.sweep(glue_config.get_config(), str(tmp_path / "w"), [1e-4], [0])
