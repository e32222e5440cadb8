"""The NaN guard: finds the first step whose loss or norms are not finite, and says what to do.

The loop (`bertjax.training.train`) keeps the metrics of the steps since its last check on the
device and checks them at every log, eval and checkpoint step (`first_nonfinite`), always before
a checkpoint is written; a divergence stops the run with `divergence_message`, which names the
step, the values, the checkpoints kept from before it and the settings to change.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

_WATCHED = ("loss", "grad_norm", "param_norm")  # train_step metrics that show a divergence


def first_nonfinite(steps: list[tuple[int, Any]]) -> tuple[int, dict[str, float]] | None:
  """The first of `steps`, (step, metrics Collection of `train_step`), whose loss, gradient norm
  or parameter norm (after the step's update) is NaN or infinite, as (step, {name: value}); None
  if all are finite. One transfer of the three averages of each step, which a log step fetches
  anyway."""
  fetched = jax.device_get([{name: getattr(metrics, name) for name in _WATCHED}
                            for _, metrics in steps])
  for (step, _), averages in zip(steps, fetched):
    if not all(np.isfinite(average.total) for average in averages.values()):
      return step, {name: float(average.total / max(float(average.count), 1e-9))
                    for name, average in averages.items()}
  return None


def divergence_message(step: int, values: Mapping[str, float],
                       train_config: Any, kept: list[int],
                       directory: epath.Path) -> str:
  """The UserError of a run whose loss became NaN or infinite at `step` (`values`: the watched
  metrics then; `kept`: the steps saved in `directory`, all from before `step`)."""
  tr = train_config
  saved = (f"the checkpoints in {directory} (steps {', '.join(map(str, kept))}) are all from "
           "before it" if kept else "no checkpoint was saved before it")
  clipping_off = not tr.clip_norm or tr.clip_norm <= 0
  clipping = ("no gradient clipping (train.clip_norm=0), " if clipping_off
              else f"(gradients are clipped at train.clip_norm={tr.clip_norm:g}) ")
  return (
      f"the loss is NaN or infinite at step {step} "
      f"({', '.join(f'{k}={values[k]:.4g}' for k in _WATCHED)}): training diverged and stopped "
      f"there without saving; {saved}. Likely causes: a learning rate too high "
      f"(train.learning_rate={tr.learning_rate:g}), too short a warmup (train.warmup_steps="
      f"{tr.warmup_steps}), {clipping}or bad input data. Lower --config.train.learning_rate or "
      "raise --config.train.warmup_steps"
      f"{' or set --config.train.clip_norm=1.0' if clipping_off else ''}, then rerun ("
      f"{f'it resumes from step {kept[-1]}' if kept else 'it starts over'}) or start over with a "
      "new --workdir.")
