"""What a run reports, from one writer: metrics.jsonl, TensorBoard, eval_results.json, curves.

The loop (`bertjax.training.train`) hands `Reports` each finished step (its clu metrics and its
batch) and each evaluation's metrics; `Reports` alone writes the run's reports in WORKDIR (names
in `bertjax.workdir`), from host 0 only:
  metrics.jsonl      every logged training step and every evaluation, one line each, {"step": N,
                     "split": "train" or "eval", name: value, ...}, and every rollback of the
                     divergence guard, {"step": N (the divergence's), "split": "rollback",
                     "signal", "loss", "grad_norm", "param_norm", "restored_step",
                     "skipped_batches", "data_position"};
  tensorboard/       the same, one scalar per name as "train/NAME" or "eval/NAME";
  eval_results.json  the last evaluation, {"step": N, name: value, ..., "main_metric": NAME};
  curves.png         drawn after an evaluation (at most once every SECONDS_BETWEEN_DRAWS of the
                     run), after a rollback and at the end of a run (`bertjax.training.curves`).

Training lines hold the task's metrics averaged over the steps since the last line (clu
`Average`s merged step by step, so a mean over masked positions stays exact), the learning rate
of the last step, and the throughput of the interval, of real work only: examples_per_second
(a packed row's examples each), tokens_per_second (real tokens: input_mask's ones, padding left
out), model_flops_per_step (`bertjax.training.flops.model_flops` of the batches' real tokens,
sequences and prediction slots), model_tflops_per_device (those per second per device) and,
where the device's peak is known (`flops.peak_flops`; not on CPU), mfu. Over several hosts each
host counts its own batch times the number of hosts (their batches are alike).

TensorBoard events go through tensorboardX: clu's metric_writers package imports TensorFlow,
which bertjax does not install.

A resumed run logs each step once: at the start, host 0 cuts metrics.jsonl back to the
restored step (rewritten whole, then renamed over the old file, so a crash leaves one or the
other), dropping what a crashed run logged after its last checkpoint, and TensorBoard is told
to purge events past that step (tensorboardX's purge_step). A rollback (`rewind`) does the same
but keeps the rollbacks' lines: the steps it abandoned are logged again as the run retrains
them, and the rollback stays where it happened.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import tqdm
from etils import epath

from bertjax.models.config import BertConfig
from bertjax.training import curves, flops
from bertjax.workdir import EVAL_RESULTS_FILE, METRICS_FILE, TENSORBOARD_DIR

Batch = Mapping[str, np.ndarray]

# curves.png is redrawn after an evaluation only if this many seconds have passed since the run
# started or last drew it (a draw takes about 0.25 s of a CPU core; a short run that evaluates
# every few seconds would spend a fifth of its time drawing); the end of a run draws what is
# left.
SECONDS_BETWEEN_DRAWS = 10.0


def summary_writer_class() -> type:
  """tensorboardX's SummaryWriter, imported without torch where torch is not imported yet.

  tensorboardX imports torch when it can (0.85 s on this project's CPU, against 0.06 s without)
  only to accept torch tensors, which bertjax never writes. Importing it in a thread at the
  start of a run, as bertjax did, raced the main thread's imports: torch's relative imports
  failed while etils' lazy-import hook was active there ("Relative import statements not
  supported (memory)")."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # import torch -> ImportError, which tensorboardX allows for
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def examples_in(batch: Batch) -> int:
  """The real examples of a host's batch: its rows, or with packing ([batch, k] example
  weights) the sequences packed into them."""
  weights = batch.get("example_weight")
  if weights is None or np.ndim(weights) < 2:
    return len(batch["input_ids"])
  return int(np.count_nonzero(weights))


def keep_steps_up_to(path: epath.Path, step: int, keep_splits: tuple[str, ...] = ()) -> None:
  """Rewrites the metrics file `path` with only its lines of steps <= `step` and those of
  `keep_splits`, atomically (a temporary file renamed over it); a line cut short by a crash is
  dropped too. No file, or nothing to drop: left as it is."""
  if not path.exists():
    return
  text = path.read_text()
  lines = text.splitlines()
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and (record.get("step", 0) <= step
                                     or record.get("split") in keep_splits):
      kept.append(line)
  if kept == lines and text.endswith("\n") or not text:
    return
  temporary = path.parent / f"{path.name}.tmp{os.getpid()}"
  temporary.write_text("".join(line + "\n" for line in kept))
  temporary.replace(path)


class Reports:
  """The reports of one run: training steps added as they finish, written every log step;
  evaluations written as they come; the curves drawn after an evaluation (at most once every
  SECONDS_BETWEEN_DRAWS), after a rollback and at the end.

  Args:
    workdir: where the reports go (host 0 only).
    bert_config: the model's config, for its FLOPs per step.
    dtype: the compute dtype, for the device's peak FLOP/s.
    devices: the devices the step runs on (all hosts).
    main_metric: the task's main metric (`Task.main_metric`), recorded in eval_results.json and
      plotted in curves.png; "" for none.
    start_step: the step the run starts from (a resumed run's restored step); what an earlier
      run logged after it is dropped.
  """

  def __init__(self, workdir: epath.Path, *, bert_config: BertConfig, dtype: str,
               devices: Sequence[jax.Device], main_metric: str = "", start_step: int = 0):
    self._workdir = workdir
    self._bert_config = bert_config
    self._main_metric = main_metric
    self._num_devices = len(devices)
    self._peak = flops.peak_flops(devices[0].device_kind, dtype)
    self._writing = jax.process_index() == 0
    self._drawn_step = start_step  # the last step curves.png shows
    self._drawn_at = time.monotonic()  # when it was drawn (the run's start, before any draw)
    self._closed = True
    self._open(start_step)

  def _open(self, step: int, keep_splits: tuple[str, ...] = ()) -> None:
    """Opens the reports at `step`: what was logged after it (but `keep_splits`' lines) dropped,
    nothing pending."""
    if self._writing:
      SummaryWriter = summary_writer_class()  # pylint: disable=invalid-name
      keep_steps_up_to(self._workdir / METRICS_FILE, step, keep_splits)
      # Events of later steps, from a run that crashed after its last checkpoint, are hidden.
      purge = step + 1 if (self._workdir / TENSORBOARD_DIR).exists() else None
      self._file = (self._workdir / METRICS_FILE).open("a")
      self._tensorboard = SummaryWriter(str(self._workdir / TENSORBOARD_DIR), purge_step=purge)
    self._closed = False
    self._pending: list[Any] = []
    self._examples = self._tokens = self._flops = 0
    self._drawn_step = min(self._drawn_step, step)
    self.restart_clock()

  def rewind(self, step: int, rollback: Mapping[str, Any]) -> None:
    """A rollback of the divergence guard to the checkpoint of `step`: the steps added since
    the last log and the lines logged after `step` go (earlier rollbacks' stay), then
    `rollback` (`divergence.Guard.rolled_back`'s entry) is written and curves.png redrawn."""
    self.close()
    self._open(step, keep_splits=("rollback",))
    if self._writing:
      self._file.write(json.dumps({"step": rollback["step"], "split": "rollback",
                                   **rollback}) + "\n")
      self._file.flush()
      self._tensorboard.add_scalar("rollback/restored_step", rollback["restored_step"],
                                   rollback["step"])
      self._tensorboard.flush()
    self._draw(step)

  def restart_clock(self) -> None:
    """Starts the throughput interval afresh (after an evaluation, which is not training)."""
    self._interval_start = time.perf_counter()

  def add(self, metrics: Any, batch: Batch) -> None:
    """One finished step: its metrics (a clu Collection, still on the device, so the step is
    not waited for) and its per-host batch, whose real examples, tokens and model FLOPs
    (times the number of hosts) count towards the throughput."""
    self._pending.append(metrics)
    work = flops.work_of(batch)
    self._examples += examples_in(batch) * jax.process_count()
    self._tokens += work.tokens * jax.process_count()
    self._flops += flops.model_flops(self._bert_config, work) * jax.process_count()

  def write_train(self, step: int) -> dict[str, str]:
    """Writes the steps added since the last call as one line; returns the progress bar's
    summary of it."""
    fetched = jax.device_get(self._pending)
    merged = fetched[0]
    for metrics in fetched[1:]:
      merged = merged.merge(metrics)
    summary = {k: float(v) for k, v in merged.compute().items()}
    seconds = time.perf_counter() - self._interval_start
    summary["examples_per_second"] = self._examples / seconds
    summary["tokens_per_second"] = self._tokens / seconds
    summary["model_flops_per_step"] = self._flops / len(fetched)
    summary["model_tflops_per_device"] = self._flops / seconds / self._num_devices / 1e12
    if self._peak:
      summary["mfu"] = self._flops / seconds / self._num_devices / self._peak
    self._write("train", step, summary)
    self._pending, self._examples, self._tokens, self._flops = [], 0, 0, 0
    self.restart_clock()
    bar = {k.replace("accuracy", "acc"): f"{v:.3f}" for k, v in summary.items()
           if k == "loss" or (k.endswith("accuracy") and "baseline" not in k)}
    bar["tok_s"] = f"{summary['tokens_per_second']:.0f}"
    if "mfu" in summary:
      bar["mfu"] = f"{summary['mfu']:.1%}"
    return bar

  def write_eval(self, step: int, metrics: Mapping[str, float]) -> None:
    """Writes an evaluation's metrics, prints them above the progress bar, records them in
    eval_results.json (with the main metric's name) and redraws curves.png (unless it was drawn
    less than SECONDS_BETWEEN_DRAWS ago: `finish` draws it then)."""
    self._write("eval", step, metrics)
    tqdm.tqdm.write(f"step {step} eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    if self._writing:
      main = {"main_metric": self._main_metric} if self._main_metric else {}
      (self._workdir / EVAL_RESULTS_FILE).write_text(
          json.dumps({"step": step, **metrics, **main}, indent=2) + "\n")
    if time.monotonic() - self._drawn_at >= SECONDS_BETWEEN_DRAWS:
      self._draw(step)

  def finish(self, step: int) -> None:
    """The end of a run that reached `step`: curves.png redrawn if it lacks the steps since it
    was last drawn; then `close`."""
    if step > self._drawn_step:
      self._draw(step)
    self.close()

  def _draw(self, step: int) -> None:
    """Redraws WORKDIR/curves.png, which then shows the run up to `step`."""
    if self._writing:
      curves.draw(self._workdir, self._main_metric)
    self._drawn_step, self._drawn_at = step, time.monotonic()

  def _write(self, split: str, step: int, scalars: Mapping[str, float]) -> None:
    """One line of metrics.jsonl and one TensorBoard scalar "SPLIT/NAME" per metric."""
    if not self._writing:
      return
    values = {k: float(v) for k, v in scalars.items()}
    self._file.write(json.dumps({"step": step, "split": split, **values}) + "\n")
    self._file.flush()
    for name, value in values.items():
      self._tensorboard.add_scalar(f"{split}/{name}", value, step)
    self._tensorboard.flush()

  def close(self) -> None:
    """Closes metrics.jsonl and the TensorBoard writer (again: nothing)."""
    if self._writing and not self._closed:
      self._file.close()
      self._tensorboard.close()
    self._closed = True
