"""WORKDIR/curves.png: a run's training loss and its main metric against the steps.

  python -m bertjax.training.curves WORKDIR     # redraws it from WORKDIR/metrics.jsonl

The left panel is the loss: the training loss of every logged step as a line, the held-out loss
of every evaluation as marked points. The right panel is the task's main metric
(`bertjax.training.task.Task.main_metric`, recorded in eval_results.json: held-out MLM accuracy
for pretraining, the dev metric the paper reports for a fine-tuning task), each evaluation a
marked point, with the same metric on the training batches as a line where the task logs it
there too (accuracies). Each rollback of the divergence guard (a "rollback" line of
metrics.jsonl) is a red x at the step and loss that diverged, on a dotted line down the loss
panel: the run went on from an earlier checkpoint, and the steps after that checkpoint are
those it trained again.

The run's reports (`bertjax.training.reports`) redraw the file after an evaluation (at most once
every `reports.SECONDS_BETWEEN_DRAWS`), after a rollback and at the end of a run (host 0 only),
so it shows the run so far; a resumed run's metrics.jsonl holds each step once, so the curves
continue where they stopped. The file is replaced whole (written beside it, then renamed), so a
viewer never reads half of it. matplotlib is imported only when a figure is drawn, and through
its Agg canvas alone: no display, and no pyplot state changed in the process that draws.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Sequence

from etils import epath

from bertjax.errors import UserError
from bertjax.workdir import CONFIG_FILE, CURVES_FILE, EVAL_RESULTS_FILE, METRICS_FILE


@dataclasses.dataclass(frozen=True)
class Series:
  """One plotted line or set of points.

  Attributes:
    label: the legend's text.
    steps: the x values, ascending.
    values: the y values, one per step.
    held_out: evaluations, drawn as marked points (training steps: a plain line).
  """
  label: str
  steps: tuple[int, ...]
  values: tuple[float, ...]
  held_out: bool


def read_records(workdir: epath.PathLike) -> list[dict[str, Any]]:
  """The lines of WORKDIR/metrics.jsonl ({"step", "split", name: value}), in step order; a line
  cut short by a crash is left out. [] if there is no such file."""
  path = epath.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int):
      records.append(record)
  return sorted(records, key=lambda r: r["step"])


def recorded_main_metric(workdir: epath.PathLike) -> str:
  """The main metric a run recorded in WORKDIR/eval_results.json ("" if none yet)."""
  path = epath.Path(workdir) / EVAL_RESULTS_FILE
  try:
    return str(json.loads(path.read_text()).get("main_metric", ""))
  except (OSError, ValueError, AttributeError):
    return ""


def _series(records: Sequence[dict[str, Any]], split: str, name: str, label: str) -> Series:
  """The values of `name` in the `split` records that hold it."""
  points = [(r["step"], float(r[name])) for r in records
            if r.get("split") == split and isinstance(r.get(name), (int, float))]
  return Series(label, tuple(s for s, _ in points), tuple(v for _, v in points),
                held_out=split == "eval")


def panels(records: Sequence[dict[str, Any]], main_metric: str
           ) -> tuple[list[Series], list[Series]]:
  """What the two panels plot: (the loss: training, held-out; the main metric: on the training
  batches, held-out), each series only where metrics.jsonl has points of it."""
  loss = [_series(records, "train", "loss", "training loss"),
          _series(records, "eval", "loss", "held-out loss")]
  metric = [_series(records, "train", main_metric, f"{main_metric} on training batches"),
            _series(records, "eval", main_metric, f"held-out {main_metric}")] if main_metric else []
  return [s for s in loss if s.steps], [s for s in metric if s.steps]


def rollbacks(records: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
  """(step, loss) of each rollback line of metrics.jsonl, in step order (a non-finite loss as
  NaN, which no point shows)."""
  return [(r["step"], float(r.get("loss", float("nan")))) for r in records
          if r.get("split") == "rollback"]


def figure(records: Sequence[dict[str, Any]], main_metric: str, title: str = ""):
  """A matplotlib Figure of `panels` (two axes: the loss, the main metric), not yet saved."""
  # Imported here: matplotlib is heavy and needed only to draw.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  fig = Figure(figsize=(11, 4))
  fig.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.88, wspace=0.3)
  loss_series, metric_series = panels(records, main_metric)
  loss_panel, metric_panel = fig.subplots(1, 2)
  for axes, series, ylabel in ((loss_panel, loss_series, "loss"),
                               (metric_panel, metric_series, main_metric or "main metric")):
    for s in series:
      if s.held_out:
        axes.plot(s.steps, s.values, marker="o", linestyle="--", label=s.label)
      else:  # small dots too, so that a single logged step shows
        axes.plot(s.steps, s.values, marker=".", markersize=3, linewidth=1, label=s.label)
    if axes is loss_panel:
      for i, (step, loss) in enumerate(rollbacks(records)):
        label = "rollback (divergence)" if i == 0 else None
        axes.axvline(step, color="red", linestyle=":", linewidth=1)
        axes.plot([step], [loss], marker="x", color="red", linestyle="none", label=label)
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if series:
      axes.legend()
    else:
      why = "no main metric recorded" if axes is metric_panel and not main_metric else (
          "nothing logged yet")
      axes.text(0.5, 0.5, why, ha="center", va="center", transform=axes.transAxes)
  if title:
    fig.suptitle(title)
  return fig


def _title(workdir: epath.Path) -> str:
  """"TASK: WORKDIR's name", the task from WORKDIR/config.json (the name alone without it)."""
  try:
    task = json.loads((workdir / CONFIG_FILE).read_text()).get("task", "")
  except (OSError, ValueError, AttributeError):
    task = ""
  return f"{task}: {workdir.name}" if task else workdir.name


def draw(workdir: epath.PathLike, main_metric: str | None = None) -> epath.Path:
  """Writes WORKDIR/curves.png from WORKDIR/metrics.jsonl and returns its path.

  Args:
    workdir: a run's workdir.
    main_metric: the metric of the right panel; None: the one eval_results.json records.
  """
  workdir = epath.Path(workdir)
  if main_metric is None:
    main_metric = recorded_main_metric(workdir)
  fig = figure(read_records(workdir), main_metric, title=_title(workdir))
  path = workdir / CURVES_FILE
  temporary = workdir / f"{CURVES_FILE}.tmp{os.getpid()}"
  with temporary.open("wb") as f:
    fig.savefig(f, format="png", dpi=100)
  temporary.replace(path)
  return path


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.training.curves",
                                   description="Redraws WORKDIR/curves.png from its metrics.")
  parser.add_argument("workdir", help="the workdir of a run (pretraining or fine-tuning)")
  args = parser.parse_args(argv)
  try:
    if not (epath.Path(args.workdir) / METRICS_FILE).exists():
      raise UserError(f"{args.workdir} holds no {METRICS_FILE}; give the --workdir of a run that "
                      "has logged at least one step.")
    print(draw(args.workdir))
  except UserError as e:
    print(f"bertjax: error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  main()
