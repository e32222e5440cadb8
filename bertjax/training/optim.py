"""The optimizer of BERT: AdamW (or LAMB, or ModernBERT's StableAdamW) over the run's schedule
(`bertjax.training.schedules`), with a weight-decay mask and gradient clipping by global norm,
all from optax.

The recipe (Devlin et al. 2019, section A.2; google-research/bert `optimization.py`): Adam with
b1=0.9, b2=0.999, eps=1e-6, decoupled L2 weight decay 0.01 on everything but biases and LayerNorm
parameters, the learning rate warmed up linearly over the first steps and then decayed linearly to
zero, gradients clipped to global norm 1.0. One deliberate difference from the original TF code,
the common modern reading: Adam's moments are bias-corrected (`optax.adamw`); the TF
`AdamWeightDecayOptimizer` skipped the correction.

LAMB (You et al. 2020) is the large-batch alternative NVIDIA's and the MLPerf BERT entries
pretrain with, here as NVIDIA's BERT recipe runs it (apex FusedLAMB with use_nvlamb=False): Adam's
bias-corrected step plus the decoupled decay, rescaled per parameter by the trust ratio
||w|| / ||update|| only where weight decay applies (1 for biases and LayerNorm parameters, and
everywhere when weight_decay is 0; 1 also where either norm is 0); the gradients clipped by global
norm first, as FusedLAMB does. `optax.lamb` would scale every parameter. NVIDIA decays the rate
as (1 - progress)^0.5 after warmup (its PolyWarmUpScheduler), progress counted from step 0:
`lr_decay_power=0.5` and `decay_from_step_0=True` here. Its settings are in the README.

ModernBERT (Warner et al. 2024) pretrains with StableAdamW (Wortsman et al. 2023, "Stable and
low-precision training for large-scale vision-language models", Algorithm 1): AdamW whose whole
step on each tensor, weight decay included, is divided by max(1, RMS), RMS = sqrt(mean(g^2 /
max(v_hat, eps^2))) over the tensor: Adafactor's update clipping, which makes gradient clipping
unnecessary. The eps^2 floor is optimi's StableAdamW, which ModernBERT trained with
(`stable_adamw`).

Frozen parameters (`frozen`, from train.frozen_params; the feature-based approach freezes 'bert'):
their gradients are set to zero first (`optax.masked(optax.set_to_zero(), ...)`), so the clipping
norm is the trained parameters' alone, Adam's moments for them stay 0 and so does its update
(0 / (sqrt(0) + eps); LAMB's trust ratio of a zero update is 1), and weight decay skips them (the
decay mask): they stay bitwise as loaded. Their moments are kept (zeros), so the optimizer state
has the parameters' structure, which `parallel.optimizer_state_shardings` maps over
(optax.multi_transform's state would hold partial trees that optax.tree_map_params cannot map).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from bertjax.errors import UserError
from bertjax.training import schedules
from bertjax.training.schedules import RateChange

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")

# A leaf whose name contains one of these gets no weight decay (google-research/bert excludes
# parameters whose name matches "bias" or "LayerNorm"; in Flax a LayerNorm's parameters are
# called 'scale' and 'bias', so 'scale' stands for the LayerNorm gamma).
_NO_DECAY_LEAF_SUBSTRINGS = ("bias",)
_NO_DECAY_LEAF_NAMES = ("scale",)
# A leaf inside a module whose name contains one of these (lower-cased) gets no weight decay.
_NO_DECAY_MODULE_SUBSTRINGS = ("layer_norm", "layernorm")


def _dict_keys(path: tuple[Any, ...]) -> list[str]:
  """The names in a key path: dict keys only (skips indices and boxes such as nn.Partitioned)."""
  return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def decays(path: tuple[Any, ...]) -> bool:
  """Whether the parameter at this key path gets weight decay (see `weight_decay_mask`)."""
  names = _dict_keys(path)
  if not names:
    return True
  leaf, modules = names[-1], names[:-1]
  if leaf in _NO_DECAY_LEAF_NAMES or any(s in leaf for s in _NO_DECAY_LEAF_SUBSTRINGS):
    return False
  return not any(s in m.lower() for m in modules for s in _NO_DECAY_MODULE_SUBSTRINGS)


def weight_decay_mask(params: Any) -> Any:
  """True for the parameters that get weight decay, False for biases and LayerNorm parameters.

  The rule, on the parameter's path in the Flax params dict (as google-research/bert, which
  excludes any variable whose name contains "bias" or "LayerNorm"):
  - no decay if the leaf's name contains "bias" ('bias' of Dense / LayerNorm, MaskedLM's
    'output_bias');
  - no decay if the leaf is a 'scale' (the gamma of Flax's LayerNorm, the only 'scale' here);
  - no decay for anything inside a module whose name contains "layer_norm" or "LayerNorm";
  - decay for everything else: Dense 'kernel's and Embed 'embedding's.

  Args:
    params: nested dict of arrays (or ShapeDtypeStructs), e.g. a linen model's "params".
  Returns:
    the same tree structure with a Python bool at every leaf.
  """
  return jax.tree_util.tree_map_with_path(lambda path, _: decays(path), params)


def frozen_mask(frozen: Sequence[str]):
  """params -> the same tree with True on every leaf of the top-level groups in `frozen`.

  The mask is also called on optax's stand-in for the parameters (not a dict, when
  `optax.tree_map_params` maps the state); a leaf without a name is not frozen.

  Raises:
    UserError: a frozen name the parameters do not have (a misspelling would freeze nothing).
  """
  def mask(params):
    if isinstance(params, Mapping):
      unknown = [name for name in frozen if name not in params]
      if unknown:
        raise UserError(f"train.frozen_params names {', '.join(unknown)}, which the model does "
                        f"not have; its parameter groups are {', '.join(sorted(params))}.")
    return jax.tree_util.tree_map_with_path(
        lambda path, _: _dict_keys(path)[:1] in [[name] for name in frozen], params)
  return mask


def scale_by_trust_ratio_where(mask: Any) -> optax.GradientTransformation:
  """`optax.scale_by_trust_ratio` (u * ||p|| / ||u||, 1 where a norm is 0) on the leaves that
  `mask(updates)` marks True; the others pass unchanged.

  Its state is optax's EmptyState, as `optax.lamb`'s trust ratio has (`optax.masked` would save
  a MaskedState, which orbax does not restore from a checkpoint of the unmasked one).
  """
  trust = optax.scale_by_trust_ratio()

  def update(updates, state, params=None):
    scaled, state = trust.update(updates, state, params)
    return jax.tree.map(lambda m, s, u: s if m else u, mask(updates), scaled, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update)


def lamb(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float, eps: float,
         weight_decay: float | optax.Schedule, mask: Any, mu_dtype: Any = None
         ) -> optax.GradientTransformation:
  """LAMB as apex's FusedLAMB (use_nvlamb=False) runs it for NVIDIA's BERT (module docstring),
  without the clipping (`make_optimizer` adds it).

  Per parameter p (a whole array) with gradient g at update t (1-based):
    m, v = Adam's moments of g;  u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p
    p -= lr * r * u,  r = ||p|| / ||u|| if p decays (`mask`), weight_decay != 0 and both norms
    are > 0; else r = 1 (u then lacks the wd * p term where p does not decay).

  Args:
    learning_rate: a rate or a schedule of the update count.
    b1, b2, eps: Adam's (eps outside the square root).
    weight_decay: decoupled weight decay wd, or a schedule of the update count.
    mask: params -> tree of bools, True where p decays.
    mu_dtype: the first moment's dtype (None: the gradients').
  Returns:
    the transformation; its state (with a constant weight_decay) is optax.lamb's, so checkpoints
    of either resume with the other.
  """
  trusted = mask if weight_decay else (lambda params: jax.tree.map(lambda _: False, params))
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
      optax.add_decayed_weights(weight_decay, mask),
      scale_by_trust_ratio_where(trusted),
      optax.scale_by_learning_rate(learning_rate))


def stable_adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float, eps: float,
                 weight_decay: float | optax.Schedule, mask: Any,
                 stored_tensor: Callable[[list[str]], str] | None = None, mu_dtype: Any = None
                 ) -> optax.GradientTransformation:
  """StableAdamW: `optax.adamw` with Adafactor's update clipping on each tensor (module docstring),
  without the global clipping (`make_optimizer` adds it where clip_norm is set).

  Per parameter p (a whole array) with gradient g at update t (1-based), as Wortsman et al. 2023
  (Algorithm 1) and optimi's StableAdamW (`_single_param_stableadamw`) compute it:
    m_hat, v_hat = Adam's bias-corrected moments after this update's g
    RMS = sqrt(mean(g^2 / max(v_hat, eps^2)))
    p -= lr / max(1, RMS) * (m_hat / (sqrt(v_hat) + eps) + wd * p)   (wd * p only where `mask`)
  ModernBERT's "decoupled" weight decay (optimi's decouple_lr=True: p *= 1 - lr / peak * wd') is
  this with wd = wd' / peak: the same update at every step.

  Args:
    learning_rate: a rate or a schedule of the update count.
    b1, b2, eps: Adam's (eps outside the square root; eps^2 also floors v_hat in RMS).
    weight_decay: decoupled weight decay wd, times the learning rate (as adamw); or a schedule
      of the update count.
    mask: params -> tree of bools, True where p decays.
    stored_tensor: a parameter's path names -> the name of the tensor the model's own
      checkpoints store it in; parameters of one stored tensor share one RMS (its mean is over
      all of them), as the model's own trainer computes it (ModernBERT's Wqkv:
      `bertjax.models.modernbert.stored_tensor`). None: each parameter is its own tensor.
    mu_dtype: the first moment's dtype (None: the gradients').
  Returns:
    the transformation; its state is optax.adamw's (moments, count), so a checkpoint of either
    resumes with the other.
  """
  adamw = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask,
                      mu_dtype=mu_dtype)

  def update(grads, state, params=None):
    updates, state = adamw.update(grads, state, params)
    adam = state[0]  # ScaleByAdamState after this update: nu includes g, count is t
    correction = 1.0 - jnp.asarray(b2, jnp.float32) ** adam.count
    ratios, treedef = jax.tree_util.tree_flatten_with_path(jax.tree.map(
        lambda g, nu: jnp.square(g) / jnp.maximum(nu / correction, eps * eps), grads, adam.nu))
    names = [stored_tensor(_dict_keys(path)) if stored_tensor else i
             for i, (path, _) in enumerate(ratios)]
    sums: dict[Any, tuple[jax.Array, int]] = {}  # stored tensor -> (sum of ratios, size)
    for name, (_, ratio) in zip(names, ratios):
      total, size = sums.get(name, (0.0, 0))
      sums[name] = (total + jnp.sum(ratio), size + ratio.size)
    rms = treedef.unflatten([jnp.sqrt(sums[name][0] / sums[name][1]) for name in names])
    return jax.tree.map(lambda u, r: u / jnp.maximum(1.0, r).astype(u.dtype), updates,
                        rms), state

  return optax.GradientTransformation(adamw.init, update)


def make_optimizer(*, learning_rate: float = 1e-4, num_train_steps: int, warmup_steps: int,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                   weight_decay: float = 0.01, decouple_lr: bool = False,
                   clip_norm: float | None = 1.0,
                   optimizer: str = "adamw", frozen: Sequence[str] = (),
                   lr_decay_power: float = 1.0, lr_decay_from_step_0: bool = False,
                   lr_schedule: str = "linear", decay_steps: int = 0,
                   decay_shape: str = "1-sqrt", decay_floor: float = 0.0,
                   changes: Sequence[RateChange] = (),
                   stored_tensor: Callable[[list[str]], str] | None = None,
                   mu_dtype: str = "float32", rate: optax.Schedule | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """BERT's optimizer: clip by global norm, then AdamW (or LAMB, or StableAdamW) with the warmup
  + decay (or warmup-stable-decay) schedule.

  Gradient accumulation is not here: the train step (`bertjax.training.steps.make_train_step`)
  sums the micro-batches' gradients before the one `tx.update` of a step.

  Args:
    learning_rate: the peak learning rate.
    num_train_steps: calls of `tx.update` in the whole run (the training loop's steps).
    warmup_steps: calls of `tx.update` over which the rate warms up.
    b1, b2, eps: Adam's decay rates and epsilon (added outside the square root).
    weight_decay: decoupled weight decay (times the learning rate), on `weight_decay_mask`.
    decouple_lr: the decay times the schedule's fraction of the peak instead of the rate
      (optimi's decouple_lr, ModernBERT's): optax's decay is weight_decay / learning_rate.
    clip_norm: clip gradients to this global norm; None or 0 turns clipping off.
    optimizer: "adamw", "lamb" or "stable_adamw" (the same arguments; LAMB adds the layer-wise
      trust ratio on the decayed parameters, `lamb`; StableAdamW the update clipping of each
      tensor, `stable_adamw`, which ModernBERT runs without clip_norm).
    frozen: top-level parameter groups (e.g. "bert") that never change (module docstring).
      A name the parameters lack raises UserError at tx.init.
    lr_decay_power: the power of the decay after warmup (`learning_rate_schedule`).
    lr_decay_from_step_0: the decay's progress counted from step 0 (`learning_rate_schedule`).
    lr_schedule: "linear" (BERT's, the two fields above) or "wsd" (`wsd_schedule`).
    decay_steps, decay_shape, decay_floor: the final decay under "wsd" (`wsd_schedule`).
    changes: later plateaus under "wsd", each with its own weight decay (`RateChange`).
    stored_tensor: which parameters StableAdamW clips as one tensor (`stable_adamw`).
    mu_dtype: the first moment's dtype, "float32" or "bfloat16" (half its memory and its reads;
      the second moment stays float32, as its range needs).
    rate: what tx takes its learning rate from instead of `schedule` (a schedule of the update
      count; the train step's `lambda _: learning_rate`, its argument, so that its program does
      not hold the schedule's numbers). The state is the same either way.
  Returns:
    (tx, schedule): `schedule(n)` is the learning rate of the n-th update (0-based), the n-th
    training step.
  """
  if optimizer not in OPTIMIZERS:
    raise UserError(f"train.optimizer={optimizer!r}; use one of {', '.join(OPTIMIZERS)}.")
  if mu_dtype not in ("float32", "bfloat16"):
    raise UserError(f"train.mu_dtype={mu_dtype!r}; use float32 or bfloat16.")
  schedule = schedules.make_schedule(learning_rate=learning_rate, num_train_steps=num_train_steps,
                           warmup_steps=warmup_steps, lr_schedule=lr_schedule,
                           lr_decay_power=lr_decay_power, lr_decay_from_step_0=lr_decay_from_step_0,
                           decay_steps=decay_steps, decay_shape=decay_shape,
                           decay_floor=decay_floor, changes=changes)
  make = {"adamw": optax.adamw, "lamb": lamb, "stable_adamw": stable_adamw}[optimizer]
  decay_mask = weight_decay_mask
  if frozen:
    is_frozen = frozen_mask(tuple(frozen))

    def decay_mask(params):  # pylint: disable=function-redefined
      return jax.tree.map(lambda d, f: d and not f, weight_decay_mask(params), is_frozen(params))

  grouped = dict(stored_tensor=stored_tensor) if optimizer == "stable_adamw" else {}
  decay = schedules.weight_decay_schedule(learning_rate, weight_decay, decouple_lr, changes)
  update = make(schedule if rate is None else rate, b1=b1, b2=b2, eps=eps, weight_decay=decay, mask=decay_mask,
                mu_dtype=None if mu_dtype == "float32" else jnp.bfloat16, **grouped)
  tx = optax.chain(optax.clip_by_global_norm(clip_norm), update) if clip_norm else update
  if frozen:
    tx = optax.chain(optax.masked(optax.set_to_zero(), is_frozen), tx)
  return tx, schedule
