"""Tests of bertjax.training.optim's learning-rate schedules: BERT's warmup + linear or polynomial
decay (from warmup's end or step 0, as NVIDIA's and the original TF code), and
warmup-stable-decay (ModernBERT's), value by value, as the config's train section sets them
(the optimizers themselves: tests/test_optim.py)."""
import numpy as np
import optax
import pytest

from bertjax import run_config
from bertjax.configs import tiny
from bertjax.errors import UserError
from bertjax.training import schedules, steps


@pytest.mark.parametrize("step, expected", [
    (0, 0.0),        # warmup starts at 0
    (5, 5e-4),       # half way through warmup
    (10, 1e-3),      # the peak
    (60, 5e-4),      # half way through the decay (10 -> 110)
    (110, 0.0),      # the end
    (150, 0.0),      # stays at 0 after the end
])
def test_schedule_values(step, expected):
  schedule = schedules.learning_rate_schedule(1e-3, warmup_steps=10, total_steps=110)
  np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6, atol=1e-12)


def test_schedule_decays_with_a_power():
  """NVIDIA's LAMB recipe decays as (1 - progress) ** 0.5 after warmup; power 1 is the line."""
  schedule = schedules.learning_rate_schedule(1e-3, warmup_steps=10, total_steps=110, power=0.5)
  np.testing.assert_allclose([float(schedule(s)) for s in (5, 10, 35, 60, 85, 110, 150)],
                             [5e-4, 1e-3, 1e-3 * 0.75**0.5, 1e-3 * 0.5**0.5, 5e-4, 0.0, 0.0],
                             rtol=1e-6, atol=1e-12)
  with pytest.raises(UserError, match="--config.train.lr_decay_power"):
    schedules.learning_rate_schedule(1e-3, 10, 110, power=0.0)


def test_schedule_without_warmup_starts_at_peak():
  schedule = schedules.learning_rate_schedule(2.0, warmup_steps=0, total_steps=4)
  np.testing.assert_allclose([float(schedule(s)) for s in range(5)], [2.0, 1.5, 1.0, 0.5, 0.0])


@pytest.mark.parametrize("peak, warmup, total", [(1e-3, 20, 10), (1e-3, -1, 10), (1e-3, 0, 0),
                                                 (0.0, 1, 10)])
def test_schedule_rejects_bad_settings(peak, warmup, total):
  with pytest.raises(UserError, match="--config.train"):
    schedules.learning_rate_schedule(peak, warmup, total)


def _typed(train):
  """The typed train section (`run_config.typed`) of a ConfigDict's `train`; a field it lacks (an
  earlier bertjax's config) takes its default."""
  return run_config.typed(train, run_config.PretrainingTrain)


def test_the_config_sets_the_decay_power():
  """train.lr_decay_power reaches the schedule; a config of an earlier bertjax, without the
  field, decays linearly."""
  train = tiny.get_config().train
  train.update(learning_rate=1.0, warmup_steps=0, num_train_steps=4, lr_decay_power=0.5)
  _, schedule = steps.make_optimizer(_typed(train))
  np.testing.assert_allclose(float(schedule(2)), 0.5**0.5, rtol=1e-6)
  del train["lr_decay_power"]
  _, schedule = steps.make_optimizer(_typed(train))
  np.testing.assert_allclose(float(schedule(2)), 0.5, rtol=1e-6)


def test_decay_from_step_0_is_nvidias_and_the_original_tf_schedule():
  """train.lr_decay_from_step_0: NVIDIA's PolyWarmUpScheduler (progress = step / total; warmup
  peak * progress / warmup_fraction, then peak * (1 - progress) ** power) and, at power 1,
  google-research/bert's optimization.py (polynomial_decay from step 0, warmup overriding it),
  written out here step by step."""
  peak, total, warmup = 6e-3, 50, 14
  train = tiny.get_config().train
  train.update(learning_rate=peak, warmup_steps=warmup, num_train_steps=total,
               lr_decay_power=0.5, lr_decay_from_step_0=True)
  _, schedule = steps.make_optimizer(_typed(train))
  for step in range(total + 3):
    progress = step / total
    nvidia = (peak * progress / (warmup / total) if progress < warmup / total
              else peak * max(1.0 - progress, 0.0) ** 0.5)
    np.testing.assert_allclose(float(schedule(step)), nvidia, rtol=1e-5, atol=1e-9)
  assert float(schedule(warmup)) < 0.85 * peak  # the step down as warmup ends
  train.update(lr_decay_power=1.0)
  _, schedule = steps.make_optimizer(_typed(train))
  for step in range(total):
    decayed = peak * (1.0 - min(step, total) / total)
    tf = peak * step / warmup if step < warmup else decayed
    np.testing.assert_allclose(float(schedule(step)), tf, rtol=1e-5, atol=1e-9)
  del train["lr_decay_from_step_0"]  # an earlier config: from the end of warmup
  _, schedule = steps.make_optimizer(_typed(train))
  np.testing.assert_allclose(float(schedule(warmup)), peak, rtol=1e-6)


def _wsd_by_hand(step, *, peak, warmup, total, decay, shape):
  """Warmup-stable-decay written out: warmup from 0, the plateau, the decay over the last `decay`
  steps (1 - sqrt(progress) or 1 - progress), 0 from `total` on."""
  if step < warmup:
    return peak * step / warmup
  if decay == 0 or step < total - decay:
    return peak
  progress = min((step - (total - decay)) / decay, 1.0)
  return peak * (1.0 - (np.sqrt(progress) if shape == "1-sqrt" else progress))


@pytest.mark.parametrize("shape", ["1-sqrt", "linear"])
@pytest.mark.parametrize("warmup, total, decay", [(10, 100, 20),  # warmup, plateau, decay
                                                  (0, 50, 50),    # the decay alone
                                                  (7, 30, 23),    # no plateau
                                                  (5, 40, 0)])    # no decay: the plateau to the end
def test_wsd_schedule_is_warmup_plateau_decay_step_by_step(shape, warmup, total, decay):
  """train.lr_schedule=wsd through the config, against the schedule written out in numpy at
  every step; the decay ends at exactly 0 at num_train_steps."""
  peak = 8e-4
  train = tiny.get_config().train
  train.update(learning_rate=peak, warmup_steps=warmup, num_train_steps=total,
               lr_schedule="wsd", decay_steps=decay, decay_shape=shape)
  _, schedule = steps.make_optimizer(_typed(train))
  for step in range(total + 5):
    by_hand = _wsd_by_hand(step, peak=peak, warmup=warmup, total=total, decay=decay, shape=shape)
    np.testing.assert_allclose(float(schedule(step)), by_hand, rtol=1e-5, atol=1e-12, err_msg=step)
  if decay:
    assert float(schedule(total)) == 0.0 and float(schedule(total + 3)) == 0.0
    assert float(schedule(total - decay)) == pytest.approx(peak)
    assert float(schedule(total - 1)) > 0.0
  else:
    assert float(schedule(total)) == pytest.approx(peak)


def test_wsd_one_minus_sqrt_is_not_nvidias_power_half():
  """1-sqrt (Hägele et al. 2024) drops fast at first: a quarter of the way into the decay the rate
  is half the peak, where (1 - progress) ** 0.5 would still be at 87%."""
  schedule = schedules.wsd_schedule(1.0, warmup_steps=0, total_steps=8, decay_steps=8)
  np.testing.assert_allclose([float(schedule(s)) for s in (0, 2, 8)], [1.0, 0.5, 0.0], atol=1e-7)


@pytest.mark.parametrize("fields, message", [
    (dict(lr_schedule="cosine"), "train.lr_schedule='cosine'; use one of linear, wsd"),
    (dict(lr_schedule="wsd", decay_shape="cosine"),
     "train.decay_shape='cosine'; use one of 1-sqrt, linear"),
    (dict(lr_schedule="wsd", decay_steps=91), r"decay_steps=91 must lie in \[0, num_train_steps"),
    (dict(lr_schedule="wsd", decay_steps=-1), r"decay_steps=-1 must lie in \[0, num_train_steps"),
    (dict(decay_steps=20), "train.decay_steps=20 shapes the wsd schedule only"),
    (dict(lr_schedule="wsd", decay_steps=20, lr_decay_power=0.5),
     "lr_decay_from_step_0 shape the linear schedule only"),
    (dict(lr_schedule="wsd", lr_decay_from_step_0=True),
     "lr_decay_from_step_0 shape the linear schedule only"),
])
def test_bad_wsd_settings_are_refused(fields, message):
  """An unknown schedule or decay shape, a decay longer than the steps after warmup (100 - 10 here)
  or below 0, and a field of one schedule set under the other: one UserError each."""
  train = tiny.get_config().train
  train.update(warmup_steps=10, num_train_steps=100, **fields)
  with pytest.raises(UserError, match=message):
    steps.make_optimizer(_typed(train))


def test_a_config_without_the_wsd_fields_keeps_the_linear_schedule():
  train = tiny.get_config().train
  train.update(learning_rate=1.0, warmup_steps=0, num_train_steps=4)
  for name in ("lr_schedule", "decay_steps", "decay_shape"):
    del train[name]
  _, schedule = steps.make_optimizer(_typed(train))
  np.testing.assert_allclose([float(schedule(s)) for s in range(5)], [1.0, 0.75, 0.5, 0.25, 0.0])


@pytest.mark.parametrize("shape", ["1-sqrt", "linear"])
@pytest.mark.parametrize("warmup", [0, 10])
def test_wsd_decay_to_a_floor_is_transformers_min_lr_ratio(shape, warmup):
  """train.decay_floor (ModernBERT's alpha_f, 0.001 in its decay yamls) against transformers'
  get_wsd_schedule with min_lr_ratio, step by step from the end of warmup (transformers also
  starts its warmup at the floor; ModernBERT's and bertjax's start at 0)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  peak, total, decay, floor = 3e-4, 100, 30, 0.1
  train = tiny.get_config().train
  train.update(learning_rate=peak, warmup_steps=warmup, num_train_steps=total, lr_schedule="wsd",
               decay_steps=decay, decay_shape=shape, decay_floor=floor)
  _, schedule = steps.make_optimizer(_typed(train))
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
  theirs = transformers.get_wsd_schedule(optimizer, num_warmup_steps=warmup,
                                         num_decay_steps=decay, num_training_steps=total,
                                         decay_type=shape, min_lr_ratio=floor).lr_lambdas[0]
  for step in range(warmup, total + 5):
    np.testing.assert_allclose(float(schedule(step)), peak * theirs(step), rtol=1e-5,
                               err_msg=step)
  assert float(schedule(total)) == pytest.approx(floor * peak)


def _plateaus(**fields):
  """(schedule, tx) of a wsd run with a restart at step 20 and a long phase from step 40, from
  the pretraining train section: warmup 10, 80 steps, decay 20, floor 0.001, StableAdamW with
  ModernBERT's decoupled weight decay."""
  train = tiny.get_config().train
  train.update({**dict(
      learning_rate=8e-4, warmup_steps=10, num_train_steps=80, lr_schedule="wsd",
      decay_steps=20, decay_floor=0.001, optimizer="stable_adamw", decouple_lr=True,
      weight_decay=1e-2, clip_norm=0.0, restart_from_step=20, restart_learning_rate=4e-4,
      long_seq_from_step=40, long_learning_rate=2e-4), **fields})
  tx, schedule = steps.make_optimizer(_typed(train))
  return schedule, tx


def test_restart_and_long_phase_hold_their_own_rate_and_weight_decay():
  """The rate step by step (warmup, the peak, the restart's, the long phase's, then 1-sqrt to
  0.001 of the last) and, with zero gradients, the decay each step applies: weight_decay a step
  at each plateau (decouple_lr), each plateau's own (a long_weight_decay of -1 keeps the
  restart's)."""
  schedule, tx = _plateaus(restart_weight_decay=1e-3)

  def by_hand(step):
    if step < 10:
      return 8e-4 * step / 10
    if step >= 60:
      progress = min((step - 60) / 20, 1.0)
      return 2e-4 * (0.001 + 0.999 * (1 - np.sqrt(progress)))
    return 8e-4 if step < 20 else 4e-4 if step < 40 else 2e-4

  for step in range(85):
    np.testing.assert_allclose(float(schedule(step)), by_hand(step), rtol=1e-5, err_msg=step)
  # The decay per step: weight_decay * rate / plateau, where the plateau's weight decay is 1e-2
  # before step 20 and 1e-3 after (the long phase keeps the restart's).
  params = {"dense": {"kernel": np.ones((2, 2), np.float32)}}
  state = tx.init(params)
  zeros = {"dense": {"kernel": np.zeros((2, 2), np.float32)}}
  expected = 1.0
  for step in range(70):
    updates, state = tx.update(zeros, state, params)
    params = optax.apply_updates(params, updates)
    rate, plateau, decay = by_hand(step), *(
        (8e-4, 1e-2) if step < 20 else (4e-4, 1e-3) if step < 40 else (2e-4, 1e-3))
    expected *= 1 - decay * rate / plateau
    np.testing.assert_allclose(params["dense"]["kernel"][0, 0], expected, rtol=1e-5,
                               err_msg=step)


@pytest.mark.parametrize("fields, message", [
    (dict(restart_from_step=5), r"restart_from_step.*from step 5 must start between step 10"),
    (dict(long_seq_from_step=70),
     r"long_seq_from_step.*from step 70 must start between step 20 .* and step 60"),
    (dict(restart_learning_rate=0.0), r"restart_learning_rate.*learning rate 0.0"),
    (dict(long_weight_decay=-2.0), r"long_weight_decay.*weight decay -2.0"),
    (dict(decay_floor=1.0), r"train.decay_floor=1.0 must lie in \[0, 1\)"),
    (dict(lr_schedule="linear", decay_steps=0, decay_floor=0.0),
     r"train.restart_from_step.*set a new plateau, which only the wsd schedule has"),
])
def test_bad_plateaus_are_refused(fields, message):
  """A plateau before warmup ends or after the decay starts (or before the one it follows), at
  a rate of 0 or a negative decay; a floor of 1; plateaus under BERT's linear schedule: one
  UserError each, naming the fields."""
  with pytest.raises(UserError, match=message):
    _plateaus(**fields)
