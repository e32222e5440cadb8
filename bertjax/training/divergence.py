"""The divergence guard: finds the first step whose loss or gradient norm is not finite or
spikes, with the same answer on every host, and says what to do.

The loop (`bertjax.training.train`) keeps the metrics of the steps since its last check on the
device and hands them to `Guard.check` at every log, eval and checkpoint step, always before a
checkpoint is written. The check fetches each step's loss, gradient norm and parameter norm
(one transfer, which a log step makes anyway); on several hosts, process 0's values are
broadcast, so every host takes the same decision at the same step. A step diverges when a
value is NaN or infinite, or when its loss or gradient norm spikes against the window of the
last `config.divergence.window` checked steps (`run_config.Divergence` states the tests). A
spike leaves the window as it was, so a run that rolls back past it compares with what came
before.

The window, the rollbacks taken and the learning-rate factor's end are the guard's `record`,
saved beside the data position in every checkpoint (`bertjax.training.checkpoint`): a run
resumed from a checkpoint decides as the run that wrote it would have, so a rerun takes the
same rollbacks. Checkpoints that predate the record resume with an empty window.

Under policy `stop` a divergence ends the run with `message` (a UserError); under `rollback`
the loop restores the newest checkpoint and skips `Guard.batches_to_skip` batches of the
stream, at most `max_rollbacks` times in the run.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from bertjax import run_config
from bertjax.errors import UserError

WATCHED = ("loss", "grad_norm", "param_norm")  # train_step metrics that show a divergence
SPIKING = ("loss", "grad_norm")  # those the spike tests watch (the parameters' norm drifts)
POLICIES = ("stop", "rollback")
MAD_TO_STD = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@dataclasses.dataclass(frozen=True)
class Diverged:
  """A step that diverged.

  Attributes:
    step: the train step (1-based: the number of steps done after it).
    signal: "nonfinite", "loss_spike" or "grad_norm_spike".
    values: the step's WATCHED values.
    median: a spike's: the window's median of the spiking value (None: non-finite).
    threshold: a spike's: the least value that is a spike (None: non-finite).
  """
  step: int
  signal: str
  values: Mapping[str, float]
  median: float | None = None
  threshold: float | None = None

  def describe(self) -> str:
    """One clause: what diverged, and by how much."""
    values = ", ".join(f"{k}={self.values[k]:.4g}" for k in WATCHED)
    if self.signal == "nonfinite":
      return f"the loss is NaN or infinite at step {self.step} ({values})"
    name = self.signal.removesuffix("_spike")
    return (f"the {name.replace('_', ' ')} spiked at step {self.step} ({values}; a spike is "
            f"{name} > {self.threshold:.4g}, the median of the window being {self.median:.4g})")


def check_config(config: run_config.Divergence, num_train_steps: int,
                 checkpoint_every_steps: int) -> None:
  """UserError, naming the field, for divergence settings that cannot work (the schedule's
  steps and checkpoint interval for a rollback policy)."""
  def refuse(field: str, value: Any, why: str) -> None:
    raise UserError(f"divergence.{field}={value!r} {why}; set --config.divergence.{field}.")

  if config.policy not in POLICIES:
    refuse("policy", config.policy, f"is not one of {', '.join(POLICIES)}")
  if config.window < 1:
    refuse("window", config.window, "must be at least 1 (the steps the spike tests compare with)")
  for field in ("loss_zscore", "grad_norm_zscore"):
    if getattr(config, field) < 0:
      refuse(field, getattr(config, field), "must be 0 (off) or positive")
  for field in ("loss_ratio", "grad_norm_ratio"):
    if getattr(config, field) != 0 and getattr(config, field) <= 1:
      refuse(field, getattr(config, field), "must be 0 (off) or above 1 (a ratio to the median)")
  for field in ("max_rollbacks", "skip_batches", "lr_factor_steps"):
    if getattr(config, field) < 0:
      refuse(field, getattr(config, field), "must be 0 or more")
  if config.lr_factor <= 0:
    refuse("lr_factor", config.lr_factor, "must be positive (the learning rate is multiplied by "
           "it after a rollback; 1 = unchanged)")
  if config.policy == "rollback" and checkpoint_every_steps >= num_train_steps:
    raise UserError(
        f"divergence.policy=rollback restores the newest checkpoint from before a divergence, "
        f"but train.checkpoint_every_steps={checkpoint_every_steps} saves none before the last "
        f"of the run's {num_train_steps} steps; set --config.train.checkpoint_every_steps below "
        "it, or --config.divergence.policy=stop.")


def step_values(steps: list[tuple[int, Any]]) -> np.ndarray:
  """[len(steps), len(WATCHED)] float32: each step's WATCHED averages, fetched in one transfer;
  on several hosts process 0's, broadcast, so that every host decides on the same numbers."""
  fetched = jax.device_get([[getattr(metrics, name) for name in WATCHED] for _, metrics in steps])
  values = np.asarray([[float(a.total) / max(float(a.count), 1e-9) for a in averages]
                       for averages in fetched], np.float32).reshape(len(steps), len(WATCHED))
  if jax.process_count() > 1:
    values = np.asarray(multihost_utils.broadcast_one_to_all(values), np.float32)
  return values


class Guard:
  """Watches each checked step; keeps the window and the rollbacks of a run.

  Args:
    config: the run's divergence section.
    record: `Guard.record()` as saved with the checkpoint the run resumes from (None: a fresh
      run, or a checkpoint that predates it).
    step: the step the run starts from.
  """

  def __init__(self, config: run_config.Divergence, record: Mapping[str, Any] | None = None,
               step: int = 0):
    self.config = config
    self.rollbacks: list[dict[str, Any]] = []
    self._load(record, step)

  def _load(self, record: Mapping[str, Any] | None, step: int) -> None:
    """The window and the learning-rate factor's end of a checkpoint's `record` (of `step`), and
    its rollbacks where the guard has none of its own."""
    record = record or {}
    window = record.get("window", {})
    self._window = {name: collections.deque(window.get(name, ()), maxlen=self.config.window)
                    for name in SPIKING}
    self.rollbacks = self.rollbacks or list(record.get("rollbacks", ()))
    self.lr_factor_until = int(record.get("lr_factor_until", 0))
    # (the checkpoint step the stream was last restored at, batches skipped since then)
    self._restored = (step, 0)

  def record(self) -> dict[str, Any]:
    """What a checkpoint saves of the guard (JSON)."""
    return {"window": {name: list(values) for name, values in self._window.items()},
            "rollbacks": self.rollbacks, "lr_factor_until": self.lr_factor_until}

  def lr_factor(self, step: int) -> float:
    """The factor on the learning rate of the step after `step` (1 outside a rollback's)."""
    return self.config.lr_factor if step < self.lr_factor_until else 1.0

  def threshold(self, name: str) -> tuple[float, float] | None:
    """(median of the window, the least value of `name` that spikes), or None while the window
    is not full or the tests of `name` are off."""
    window = self._window[name]
    zscore = getattr(self.config, f"{name}_zscore")
    ratio = getattr(self.config, f"{name}_ratio")
    if len(window) < self.config.window or not (zscore or ratio):
      return None
    values = np.asarray(window, np.float64)
    median = float(np.median(values))
    deviation = MAD_TO_STD * float(np.median(np.abs(values - median)))
    return median, max(median + zscore * deviation if zscore else -np.inf,
                       ratio * median if ratio else -np.inf)

  def check_values(self, step: int, values: Mapping[str, float]) -> Diverged | None:
    """Whether the step `step` with `values` (WATCHED: float) diverged; if not, the window
    takes it in."""
    if not all(np.isfinite(v) for v in values.values()):
      return Diverged(step, "nonfinite", dict(values))
    for name in SPIKING:
      spike = self.threshold(name)
      if spike is not None and values[name] > spike[1]:
        return Diverged(step, f"{name}_spike", dict(values), *spike)
    for name in SPIKING:
      self._window[name].append(values[name])
    return None

  def check(self, steps: list[tuple[int, Any]]) -> Diverged | None:
    """The first of `steps` ((step, metrics Collection of `train_step`), in order) that
    diverged, or None; the window takes in the steps before it (all, if none did)."""
    if not steps:
      return None
    for (step, _), row in zip(steps, step_values(steps)):
      diverged = self.check_values(step, dict(zip(WATCHED, map(float, row))))
      if diverged is not None:
        return diverged
    return None

  def can_roll_back(self) -> bool:
    """Whether the policy is rollback and the run has rollbacks left."""
    return self.config.policy == "rollback" and len(self.rollbacks) < self.config.max_rollbacks

  def batches_to_skip(self, diverged: Diverged, restored_step: int) -> int:
    """How many batches of the stream to skip after restoring the checkpoint of
    `restored_step` for `diverged`: those the abandoned steps trained on (from the checkpoint
    through the divergence, and those skipped before in that stretch), and skip_batches more."""
    last_step, skipped = self._restored
    earlier = skipped if last_step == restored_step else 0
    return earlier + (diverged.step - restored_step) + self.config.skip_batches

  def rolled_back(self, diverged: Diverged, restored_step: int, record: Mapping[str, Any] | None,
                  skipped: int, position: Any) -> dict[str, Any]:
    """Takes the guard back to the checkpoint of `restored_step` (its `record`), notes the
    rollback, and returns its entry: {step, signal, values, restored_step, skipped_batches,
    data_position (after the skipped batches)}."""
    self._load(record, restored_step)
    self.rollbacks.append({
        "step": diverged.step, "signal": diverged.signal, **diverged.values,
        "restored_step": restored_step, "skipped_batches": skipped, "data_position": position})
    self._restored = (restored_step, skipped)
    if self.config.lr_factor != 1.0 and self.config.lr_factor_steps:
      self.lr_factor_until = restored_step + self.config.lr_factor_steps
    return self.rollbacks[-1]

  def rollback_line(self, entry: Mapping[str, Any]) -> str:
    """The log's line of a rollback `entry`."""
    name = entry["signal"].removesuffix("_spike").replace("_", " ")
    what = "a non-finite loss" if entry["signal"] == "nonfinite" else f"a {name} spike"
    factor = (f"; learning rate x{self.config.lr_factor:g} until step {self.lr_factor_until}"
              if self.lr_factor_until > entry["restored_step"] else "")
    return (f"divergence: {what} at step {entry['step']} (loss={entry['loss']:.4g}, "
            f"grad_norm={entry['grad_norm']:.4g}); rolled back to the checkpoint of step "
            f"{entry['restored_step']} and skipped {entry['skipped_batches']} batches (data "
            f"position now {entry['data_position']}){factor}; rollback {len(self.rollbacks)} of "
            f"at most {self.config.max_rollbacks}.")


def message(diverged: Diverged, train_config: Any, guard: Guard, kept: list[int],
            directory: epath.Path) -> str:
  """The UserError of a run that diverged (`diverged`) and stops: policy stop, or no rollback
  left (`guard`'s, named); `kept`: the steps saved in `directory`, all from before it."""
  tr = train_config
  saved = (f"the checkpoints in {directory} (steps {', '.join(map(str, kept))}) are all from "
           "before it" if kept else "no checkpoint was saved before it")
  clipping_off = not tr.clip_norm or tr.clip_norm <= 0
  clipping = ("no gradient clipping (train.clip_norm=0), " if clipping_off
              else f"(gradients are clipped at train.clip_norm={tr.clip_norm:g}) ")
  tried = ""
  if guard.rollbacks:
    times = f"{len(guard.rollbacks)} time{'s' if len(guard.rollbacks) != 1 else ''}"
    tried = (f" It had already rolled back {times}, as many as divergence.max_rollbacks="
             f"{guard.config.max_rollbacks} allows: " + "; ".join(
                 f"{r['signal']} at step {r['step']} -> step {r['restored_step']}, "
                 f"{r['skipped_batches']} batches skipped" for r in guard.rollbacks) + ".")
  elif guard.config.policy == "stop":
    tried = (" --config.divergence.policy=rollback would restore the newest checkpoint and "
             "skip the batches that led here instead of stopping.")
  return (
      f"{diverged.describe()}: training diverged and stopped there without saving; {saved}."
      f"{tried} Likely causes: a learning rate too high "
      f"(train.learning_rate={tr.learning_rate:g}), too short a warmup (train.warmup_steps="
      f"{tr.warmup_steps}), {clipping}or bad input data. Lower --config.train.learning_rate or "
      "raise --config.train.warmup_steps"
      f"{' or set --config.train.clip_norm=1.0' if clipping_off else ''}, then rerun ("
      f"{f'it resumes from step {kept[-1]}' if kept else 'it starts over'}) or start over with a "
      "new --workdir.")
