"""What a run reports: WORKDIR/metrics.jsonl and TensorBoard, from clu metrics.

Every logged training step and every evaluation is one line of metrics.jsonl, {"step": N,
"split": "train" or "eval", name: value, ...}, and one scalar per name under
WORKDIR/tensorboard as "train/NAME" or "eval/NAME". Only host 0 writes.

Training lines hold the task's metrics averaged over the steps since the last line (clu
`Average`s merged step by step, so a mean over masked positions stays exact), the learning rate
of the last step, and the throughput of the interval: examples_per_second, tokens_per_second
(padding included), model_flops_per_step (`bertjax.training.flops.model_flops` of the global batch),
model_tflops_per_device (those per second per device) and, where the device's peak is known
(`flops.peak_flops`; not on CPU), mfu.

TensorBoard events go through tensorboardX: clu's metric_writers package imports TensorFlow,
which bertjax does not install.

A resumed run logs each step once: at the start, host 0 cuts metrics.jsonl back to the
restored step (rewritten whole, then renamed over the old file, so a crash leaves one or the
other), dropping what a crashed run logged after its last checkpoint, and TensorBoard is told
to purge events past that step (tensorboardX's purge_step).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping, Sequence

import jax
import tqdm
from etils import epath

from bertjax.training import flops

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def keep_steps_up_to(path: epath.Path, step: int) -> None:
  """Rewrites the metrics file `path` with only its lines of steps <= `step`, atomically (a
  temporary file renamed over it); a line cut short by a crash is dropped too. No file, or
  nothing to drop: left as it is."""
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
    if isinstance(record, dict) and record.get("step", 0) <= step:
      kept.append(line)
  if kept == lines and text.endswith("\n") or not text:
    return
  temporary = path.parent / f"{path.name}.tmp{os.getpid()}"
  temporary.write_text("".join(line + "\n" for line in kept))
  temporary.replace(path)


class MetricLog:
  """The metrics of one run: training steps added as they finish, written every log step;
  evaluations written as they come.

  Args:
    workdir: where metrics.jsonl and tensorboard/ go (host 0 only).
    dtype: the compute dtype, for the device's peak FLOP/s.
    devices: the devices the step runs on (all hosts).
    start_step: the step the run starts from (a resumed run's restored step); what an earlier
      run logged after it is dropped.
  """

  def __init__(self, workdir: epath.Path, *, dtype: str, devices: Sequence[jax.Device],
               start_step: int = 0):
    self._num_devices = len(devices)
    self._peak = flops.peak_flops(devices[0].device_kind, dtype)
    self._writing = jax.process_index() == 0
    if self._writing:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      keep_steps_up_to(workdir / METRICS_FILE, start_step)
      # Events of later steps, from a run that crashed after its last checkpoint, are hidden.
      purge = start_step + 1 if (workdir / TENSORBOARD_DIR).exists() else None
      self._file = (workdir / METRICS_FILE).open("a")
      self._tensorboard = SummaryWriter(str(workdir / TENSORBOARD_DIR), purge_step=purge)
    self._pending: list[Any] = []
    self._examples = self._tokens = self._flops = 0
    self.restart_clock()

  def restart_clock(self) -> None:
    """Starts the throughput interval afresh (after an evaluation, which is not training)."""
    self._interval_start = time.perf_counter()

  def add(self, metrics: Any, *, examples: int, tokens: int, flops: int) -> None:
    """One finished step: its metrics (a clu Collection, still on the device, so the step is
    not waited for), the examples and tokens of its global batch and its model FLOPs."""
    self._pending.append(metrics)
    self._examples += examples
    self._tokens += tokens
    self._flops += flops

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
    """Writes an evaluation's metrics and prints them above the progress bar."""
    self._write("eval", step, metrics)
    tqdm.tqdm.write(f"step {step} eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))

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
    if self._writing:
      self._file.close()
      self._tensorboard.close()
