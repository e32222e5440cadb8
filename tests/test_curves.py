"""WORKDIR/curves.png (bertjax.training.curves): what the two panels plot, from a metrics.jsonl
written by hand; that a run draws it after each evaluation (no more often than
reports.SECONDS_BETWEEN_DRAWS) and at its end; and the README's redraw command.
"""
import json
import os
import sys

import pytest
from conftest import GLUE_VOCAB
import warm_python

from bertjax import tasks
from bertjax.training import curves, reports
from bertjax.configs import glue as glue_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_log(workdir):
  """A fine-tuning run's metrics.jsonl: training lines at steps 2, 4, 6 (loss, accuracy), dev
  evaluations at 3 and 6 (loss, accuracy, f1), and a last line cut short by a crash."""
  lines = [{"step": 2, "split": "train", "loss": 0.9, "accuracy": 0.5, "learning_rate": 1e-4},
           {"step": 3, "split": "eval", "loss": 0.8, "accuracy": 0.6, "f1": 0.55},
           {"step": 4, "split": "train", "loss": 0.7, "accuracy": 0.7, "learning_rate": 1e-4},
           {"step": 6, "split": "train", "loss": 0.5, "accuracy": 0.8, "learning_rate": 1e-4},
           {"step": 6, "split": "eval", "loss": 0.6, "accuracy": 0.75, "f1": 0.7}]
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 7, "spl')
  with open(os.path.join(workdir, "eval_results.json"), "w") as f:
    json.dump({"step": 6, "loss": 0.6, "accuracy": 0.75, "f1": 0.7, "main_metric": "f1"}, f)


def test_the_panels_plot_the_logged_points(tmp_path):
  _write_log(tmp_path)
  records = curves.read_records(tmp_path)
  assert [r["step"] for r in records] == [2, 3, 4, 6, 6]  # the cut line left out
  loss, metric = curves.panels(records, "f1")
  assert loss == [curves.Series("training loss", (2, 4, 6), (0.9, 0.7, 0.5), held_out=False),
                  curves.Series("held-out loss", (3, 6), (0.8, 0.6), held_out=True)]
  # f1 is scored on dev only: no training line
  assert metric == [curves.Series("held-out f1", (3, 6), (0.55, 0.7), held_out=True)]
  assert curves.panels(records, "accuracy")[1] == [
      curves.Series("accuracy on training batches", (2, 4, 6), (0.5, 0.7, 0.8), held_out=False),
      curves.Series("held-out accuracy", (3, 6), (0.6, 0.75), held_out=True)]

  # The figure draws exactly those points, the held-out ones marked with circles.
  loss_axes, metric_axes = curves.figure(records, "f1").axes
  plotted = [[(line.get_label(), line.get_xydata().tolist(), line.get_marker())
              for line in axes.lines] for axes in (loss_axes, metric_axes)]
  assert plotted == [[("training loss", [[2, 0.9], [4, 0.7], [6, 0.5]], "."),
                      ("held-out loss", [[3, 0.8], [6, 0.6]], "o")],
                     [("held-out f1", [[3, 0.55], [6, 0.7]], "o")]]
  assert (loss_axes.get_ylabel(), metric_axes.get_ylabel()) == ("loss", "f1")
  assert curves.figure(records, "f1", title="mrpc: run").texts[0].get_text() == "mrpc: run"

  # draw: the main metric from eval_results.json, the file replaced whole.
  path = curves.draw(tmp_path)
  assert str(path) == str(tmp_path / "curves.png")
  assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)
  assert sorted(os.listdir(tmp_path)) == ["curves.png", "eval_results.json", "metrics.jsonl"]


@pytest.mark.parametrize("seconds_between_draws, drawn_steps", [
    (0.0, [3, 6, 7]),  # after each evaluation, and at the end for step 7
    (1e9, [7]),  # the evaluations came too soon after the run's start: the end draws them
], ids=["unthrottled", "throttled"])
def test_a_run_draws_after_each_evaluation_and_at_its_end(seconds_between_draws, drawn_steps,
                                                          random_bert, glue_dir, tmp_path,
                                                          monkeypatch):
  """STS-B: evaluations at steps 3 and 6 of 8, stopped at 7 by train.stop_after_steps."""
  drawn = []  # the steps in metrics.jsonl each time the trainer draws

  def draw(workdir, main_metric=None):
    drawn.append((main_metric, sorted({r["step"] for r in curves.read_records(workdir)})))
    return draw_curves(workdir, main_metric)

  draw_curves = curves.draw
  monkeypatch.setattr(curves, "draw", draw)
  monkeypatch.setattr(reports, "SECONDS_BETWEEN_DRAWS", seconds_between_draws)
  config = glue_config.get_config()
  config.update_from_flattened_dict({
      "task": "stsb", "init_checkpoint": random_bert(tmp_path / "model", GLUE_VOCAB),
      "data.glue_dir": glue_dir, "data.max_seq_length": 32, "train.batch_size": 32,
      "train.num_train_steps": 8, "train.eval_every_steps": 3, "train.log_every_steps": 1,
      "train.stop_after_steps": 7})
  workdir = tmp_path / "run"
  tasks.run(config, str(workdir))
  assert drawn == [("spearmanr", list(range(1, step + 1))) for step in drawn_steps]
  assert (workdir / "curves.png").read_bytes().startswith(PNG_SIGNATURE)
  loss, metric = curves.panels(curves.read_records(workdir), "spearmanr")
  assert [s.steps for s in loss] == [(1, 2, 3, 4, 5, 6, 7), (3, 6)]
  recorded = json.loads((workdir / "eval_results.json").read_text())
  assert recorded["main_metric"] == "spearmanr"
  assert metric == [curves.Series("held-out spearmanr", (3, 6),
                                  (metric[0].values[0], recorded["spearmanr"]), held_out=True)]


def test_the_readme_redraw_command(tmp_path):
  """`python -m bertjax.training.curves DIR` as the README writes it, run where DIR is a workdir."""
  _write_log(tmp_path / "DIR")
  out = warm_python.run([sys.executable, "-m", "bertjax.training.curves", "DIR"], cwd=tmp_path,
                        env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / "DIR" / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_directory_without_metrics_is_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    curves.main([str(tmp_path)])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == (
      f"bertjax: error: {tmp_path} holds no metrics.jsonl; give the --workdir of a run that has "
      "logged at least one step.\n")
  assert not os.listdir(tmp_path)
