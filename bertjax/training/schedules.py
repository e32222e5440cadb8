"""The learning-rate schedules of a training run, and its weight decay over them, as optax
schedules of the update count.

- BERT's (`learning_rate_schedule`; Devlin et al. 2019, google-research/bert `optimization.py`):
  linear warmup, then a linear decay to zero at the last step (or NVIDIA's LAMB recipe's power
  0.5). The decay runs from the peak at the end of warmup (a continuous line, the common modern
  reading); the TF code decayed from step 0, so its rate just after warmup was
  `peak * (1 - warmup / total)`: `decay_from_step_0=True` (train.lr_decay_from_step_0) is that
  shape, and NVIDIA's.
- Warmup-stable-decay ("trapezoidal"; `wsd_schedule`; ModernBERT's): linear warmup, the peak
  held, then a decay to a floor (0, or ModernBERT's 0.001 of the rate) over the last
  `decay_steps`, as 1 - sqrt(progress) (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
  Training Beyond Fixed Training Durations"; ModernBERT's decay) or linearly. The rate of a step
  before the decay does not depend on the run's length, so a run can be extended, or decayed
  from a checkpoint of its plateau. Later plateaus (`RateChange`) hold another rate and weight
  decay from a step on: ModernBERT-large's restart at a tenth of its rate, and a long phase's
  own rate (ModernBERT's context extension).

The optimizers that follow them: `bertjax.training.optim`.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from bertjax.errors import UserError

LR_SCHEDULES = ("linear", "wsd")  # train.lr_schedule: BERT's warmup + decay; warmup-stable-decay
DECAY_SHAPES = ("1-sqrt", "linear")  # train.decay_shape: the decay under wsd


def _check_steps(peak: float, warmup_steps: int, total_steps: int) -> None:
  """Raises UserError for a rate, warmup or run length that no schedule can take."""
  if total_steps < 1:
    raise UserError(f"num_train_steps={total_steps} must be at least 1; set "
                    "--config.train.num_train_steps to a positive number.")
  if not 0 <= warmup_steps <= total_steps:
    raise UserError(f"warmup_steps={warmup_steps} must lie in [0, num_train_steps="
                    f"{total_steps}]; set --config.train.warmup_steps (BERT used 1% of the run).")
  if peak <= 0:
    raise UserError(f"learning_rate={peak} must be positive; set --config.train.learning_rate.")


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int,
                           power: float = 1.0, decay_from_step_0: bool = False) -> optax.Schedule:
  """BERT's schedule: 0 -> `peak` linearly over `warmup_steps`, then `peak` -> 0 at `total_steps`,
  as `peak * (1 - (step - warmup_steps) / (total_steps - warmup_steps)) ** power`; with
  `decay_from_step_0`, as `peak * (1 - step / total_steps) ** power` after warmup (the TF code's
  and NVIDIA's PolyWarmUpScheduler's shape: the rate steps down when warmup ends).

  Args:
    peak: the learning rate reached at step `warmup_steps`.
    warmup_steps: steps of linear warmup (0: start at the peak).
    total_steps: the step at which the rate reaches 0 (and stays there).
    power: of the decay; 1.0 is BERT's linear decay, 0.5 NVIDIA's LAMB recipe.
    decay_from_step_0: count the decay's progress from step 0 rather than from warmup's end.
  Returns:
    step (int scalar, counted in optimizer updates) -> learning rate (float32 scalar).
  """
  _check_steps(peak, warmup_steps, total_steps)
  if not power > 0:
    raise UserError(f"lr_decay_power={power} must be positive; set --config.train.lr_decay_power "
                    "(1.0: BERT's linear decay, 0.5: NVIDIA's LAMB recipe).")
  # A schedule with 0 transition steps is a constant; join only the pieces that exist. At power 1
  # polynomial_schedule is optax's linear_schedule.
  if decay_from_step_0:
    from_0 = optax.polynomial_schedule(peak, 0.0, power, total_steps)
    return lambda step: jnp.where(step < warmup_steps, peak * step / max(warmup_steps, 1),
                                  from_0(step))
  decay = optax.polynomial_schedule(peak, 0.0, power, max(total_steps - warmup_steps, 1))
  if warmup_steps == 0:
    return decay
  warmup = optax.linear_schedule(0.0, peak, warmup_steps)
  return optax.join_schedules([warmup, decay], boundaries=[warmup_steps])


class RateChange(NamedTuple):
  """A step from which a warmup-stable-decay run holds another peak and weight decay: a restart
  at a lower rate (ModernBERT-large after 900B tokens) or a long phase's own rate (ModernBERT's
  context extension).

  Attributes:
    step: the first update (0-based) at the new rate.
    learning_rate: the new plateau; the final decay starts from the last one.
    weight_decay: the decay from this step on, as train.weight_decay is (under decouple_lr:
      per step at this plateau).
    fields: the config fields that set it, for messages.
  """
  step: int
  learning_rate: float
  weight_decay: float
  fields: str


def wsd_schedule(peak: float, warmup_steps: int, total_steps: int, decay_steps: int,
                 shape: str = "1-sqrt", floor: float = 0.0,
                 changes: Sequence[RateChange] = ()) -> optax.Schedule:
  """Warmup-stable-decay: 0 -> `peak` linearly over `warmup_steps`, `peak` held (or, from each
  of `changes`, its rate) until `total_steps - decay_steps`, then down to `floor` times the last
  plateau at `total_steps` (and held after) as `last * (floor + (1 - floor) * (1 - sqrt(p)))`
  ("1-sqrt") or with `(1 - p)` ("linear"), p = (step - (total_steps - decay_steps)) /
  decay_steps. The floor is ModernBERT's alpha_f (its OneMinusSqrtScheduler) and transformers'
  min_lr_ratio (get_wsd_schedule).

  Args:
    peak: the learning rate of the first plateau.
    warmup_steps: steps of linear warmup (0: start at the peak).
    total_steps: the step at which the decay ends.
    decay_steps: steps of the final decay; 0: no decay, the plateau held to the end (ModernBERT's
      first phase, its `t_decay: 0tok`; decay later from a checkpoint, in a run of its own).
    shape: "1-sqrt" (Hägele et al. 2024; ModernBERT) or "linear".
    floor: where the decay ends, a fraction of the last plateau in [0, 1) (ModernBERT: 0.001).
    changes: later plateaus, by ascending step, each after warmup and before the decay.
  Returns:
    step (int scalar, counted in optimizer updates) -> learning rate (float32 scalar).
  """
  _check_steps(peak, warmup_steps, total_steps)
  if shape not in DECAY_SHAPES:
    raise UserError(f"train.decay_shape={shape!r}; use one of {', '.join(DECAY_SHAPES)}.")
  if not 0 <= decay_steps <= total_steps - warmup_steps:
    raise UserError(
        f"decay_steps={decay_steps} must lie in [0, num_train_steps - warmup_steps = "
        f"{total_steps} - {warmup_steps}]: the decay follows warmup; set "
        "--config.train.decay_steps (0: no decay), or fewer --config.train.warmup_steps.")
  if not 0 <= floor < 1:
    raise UserError(f"train.decay_floor={floor} must lie in [0, 1): the fraction of the rate "
                    "the decay ends at (ModernBERT: 0.001); set --config.train.decay_floor.")
  _check_changes(changes, warmup_steps, total_steps - decay_steps)
  # Each piece starts at its boundary (join_schedules counts its steps from there); a piece of
  # 0 steps is left out.
  pieces = []
  if warmup_steps:
    pieces.append((0, optax.linear_schedule(0.0, peak, warmup_steps)))
  for start, rate in [(warmup_steps, peak)] + [(c.step, c.learning_rate) for c in changes]:
    pieces.append((start, optax.constant_schedule(rate)))
  last = changes[-1].learning_rate if changes else peak
  if decay_steps:
    pieces.append((total_steps - decay_steps, lambda step: last * (floor + (1.0 - floor) * (
        1.0 - _decay_progress(jnp.clip(step / decay_steps, 0.0, 1.0), shape)))))
  pieces = [p for p, after in zip(pieces, pieces[1:] + [(None, None)]) if p[0] != after[0]]
  if len(pieces) == 1:
    return pieces[0][1]
  return optax.join_schedules([f for _, f in pieces], boundaries=[b for b, _ in pieces[1:]])


def _decay_progress(progress: jax.Array, shape: str) -> jax.Array:
  """How far down the decay is at `progress` in [0, 1]: sqrt (1-sqrt) or the progress (linear)."""
  return jnp.sqrt(progress) if shape == "1-sqrt" else progress


def _check_changes(changes: Sequence[RateChange], warmup_steps: int, decay_from: int) -> None:
  """Raises UserError unless every change comes after warmup, before the decay and after the
  one before it, at a positive rate and a decay of at least 0."""
  after = warmup_steps
  for change in changes:
    if not after <= change.step <= decay_from:
      raise UserError(
          f"{change.fields}: a plateau from step {change.step} must start between step {after} "
          f"(the end of warmup or the plateau before) and step {decay_from} (the start of the "
          "final decay, num_train_steps - decay_steps); set them so.")
    if change.learning_rate <= 0 or change.weight_decay < 0:
      raise UserError(f"{change.fields}: the plateau from step {change.step} has learning rate "
                      f"{change.learning_rate} and weight decay {change.weight_decay}; the rate "
                      "must be positive and the decay at least 0.")
    after = change.step


def weight_decay_schedule(learning_rate: float, weight_decay: float, decouple_lr: bool,
                          changes: Sequence[RateChange] = ()) -> float | optax.Schedule:
  """optax's decay coefficient (the update adds coefficient * p, then is multiplied by the rate):
  `weight_decay`, or under `decouple_lr` weight_decay / learning_rate (the decay a step at the
  peak); from each change on, its own (its decay over its rate). One float when it never
  changes (optax's state then has no count of its own), else a schedule of the update count."""
  plateaus = [(0, learning_rate, weight_decay)] + [
      (c.step, c.learning_rate, c.weight_decay) for c in changes]
  values = [wd / rate if decouple_lr else wd for _, rate, wd in plateaus]
  if all(v == values[0] for v in values):
    return values[0]
  starts = jnp.asarray([start for start, _, _ in plateaus[1:]], jnp.int32)
  coefficients = jnp.asarray(values, jnp.float32)
  return lambda step: coefficients[jnp.searchsorted(starts, step, side="right")]


def make_schedule(*, learning_rate: float, num_train_steps: int, warmup_steps: int,
                  lr_schedule: str = "linear", lr_decay_power: float = 1.0,
                  lr_decay_from_step_0: bool = False, decay_steps: int = 0,
                  decay_shape: str = "1-sqrt", decay_floor: float = 0.0,
                  changes: Sequence[RateChange] = ()) -> optax.Schedule:
  """The schedule train.lr_schedule names: "linear" (`learning_rate_schedule`, shaped by
  lr_decay_power and lr_decay_from_step_0) or "wsd" (`wsd_schedule`, shaped by decay_steps,
  decay_shape, decay_floor and the plateaus `changes`).

  Raises:
    UserError: an unknown name, or a field of one schedule set under the other (it would be
      ignored).
  """
  if lr_schedule not in LR_SCHEDULES:
    raise UserError(f"train.lr_schedule={lr_schedule!r}; use one of {', '.join(LR_SCHEDULES)}.")
  if decay_shape not in DECAY_SHAPES:
    raise UserError(f"train.decay_shape={decay_shape!r}; use one of {', '.join(DECAY_SHAPES)}.")
  if lr_schedule == "linear":
    if decay_steps:
      raise UserError(f"train.decay_steps={decay_steps} shapes the wsd schedule only; add "
                      "--config.train.lr_schedule=wsd, or set decay_steps=0.")
    if decay_floor:
      raise UserError(f"train.decay_floor={decay_floor} shapes the wsd schedule only; add "
                      "--config.train.lr_schedule=wsd, or set decay_floor=0.")
    if changes:
      raise UserError(f"{changes[0].fields} set a new plateau, which only the wsd schedule has; "
                      "add --config.train.lr_schedule=wsd, or unset them.")
    return learning_rate_schedule(learning_rate, warmup_steps, num_train_steps, lr_decay_power,
                                  lr_decay_from_step_0)
  if lr_decay_power != 1.0 or lr_decay_from_step_0:
    raise UserError("train.lr_decay_power and lr_decay_from_step_0 shape the linear schedule "
                    "only; under --config.train.lr_schedule=wsd set train.decay_shape and "
                    "decay_steps (and lr_decay_power=1.0, lr_decay_from_step_0=false).")
  return wsd_schedule(learning_rate, warmup_steps, num_train_steps, decay_steps, decay_shape,
                      decay_floor, changes)
