"""Tests of bertjax.training.optim's optimizers: the weight-decay mask, AdamW, LAMB and StableAdamW
against hand-written updates, clipping (tiny pytrees, CPU, a few seconds; the schedules:
tests/test_schedules.py)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.training import optim, schedules
from bertjax.errors import UserError


class _Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4, name="attention")(x)
    return nn.LayerNorm(name="attention_layer_norm")(x)


class _TinyModel(nn.Module):
  """Embed + a block with Dense/LayerNorm + a head with a Dense and a bare 'output_bias'."""

  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(10, 4, name="word_embeddings")(ids)
    x = _Block(name="layer_0")(x)
    x = nn.LayerNorm(name="LayerNorm")(x)
    x = nn.Dense(4, name="transform")(x)
    return x + self.param("output_bias", nn.initializers.zeros_init(), (4,))


def test_weight_decay_mask_on_flax_params():
  params = _TinyModel().init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))["params"]
  expected = {
      "word_embeddings": {"embedding": True},
      "layer_0": {
          "attention": {"kernel": True, "bias": False},
          "attention_layer_norm": {"scale": False, "bias": False},
      },
      "LayerNorm": {"scale": False, "bias": False},
      "transform": {"kernel": True, "bias": False},
      "output_bias": False,
  }
  assert optim.weight_decay_mask(params) == expected


def _tiny_params():
  return {"dense": {"kernel": jnp.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]),
                    "bias": jnp.array([0.1, -0.2, 0.3])},
          "layer_norm": {"scale": jnp.array([1.0, 2.0, 0.5]), "bias": jnp.array([0.0, 0.5, -0.5])}}


def _grads(seed, scale=1.0):
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4))
  return jax.tree.map(lambda p: scale * jax.random.normal(next(keys), p.shape), _tiny_params())


def _run(tx, grads_list, params=None):
  params = _tiny_params() if params is None else params
  state = tx.init(params)
  for grads in grads_list:
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_adamw_matches_hand_written_update():
  lr, wd, b1, b2, eps = 1e-2, 0.1, 0.9, 0.999, 1e-6
  tx, schedule = optim.make_optimizer(learning_rate=lr, num_train_steps=10, warmup_steps=2,
                                      weight_decay=wd, clip_norm=None)
  grads_list = [_grads(i) for i in range(4)]
  got = _run(tx, grads_list)

  # Hand-written AdamW in numpy: bias-corrected moments, eps outside the sqrt, decoupled decay
  # (times the learning rate) only on the kernel.
  params = jax.tree.map(np.asarray, _tiny_params())
  decay = {"dense": {"kernel": True, "bias": False},
           "layer_norm": {"scale": False, "bias": False}}
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for t, grads in enumerate(grads_list, start=1):
    rate = [0.0, 0.5 * lr, lr, lr * 7 / 8][t - 1]  # schedule at update t-1: warmup 2, end 10
    np.testing.assert_allclose(float(schedule(t - 1)), rate, rtol=1e-6)
    new = {}
    for module in params:
      new[module] = {}
      for name, p in params[module].items():
        g = np.asarray(grads[module][name], np.float64)
        m[module][name] = b1 * m[module][name] + (1 - b1) * g
        v[module][name] = b2 * v[module][name] + (1 - b2) * g * g
        m_hat = m[module][name] / (1 - b1**t)
        v_hat = v[module][name] / (1 - b2**t)
        step = m_hat / (np.sqrt(v_hat) + eps) + (wd * p if decay[module][name] else 0.0)
        new[module][name] = p - rate * step
    params = new
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, params)
  # The decay made a difference: without it the kernel ends elsewhere.
  tx_no_decay, _ = optim.make_optimizer(learning_rate=lr, num_train_steps=10, warmup_steps=2,
                                        weight_decay=0.0, clip_norm=None)
  assert not np.allclose(_run(tx_no_decay, grads_list)["dense"]["kernel"], got["dense"]["kernel"])


@pytest.mark.parametrize("optimizer", optim.OPTIMIZERS)
def test_clipping_by_global_norm(optimizer):
  """train.clip_norm clips the gradients by their global norm before any optimizer, StableAdamW
  too (ModernBERT's recipe sets clip_norm=0: it clips each tensor's update instead)."""
  # A large gradient (norm 10) then a small one (norm 0.5). Adam is nearly scale-invariant on a
  # single step, so clipping shows in how the two steps combine in the moments.
  big, small = _grads(0), _grads(1)
  big = jax.tree.map(lambda g: g * 10.0 / optax.global_norm(big), big)
  small = jax.tree.map(lambda g: g * 0.5 / optax.global_norm(small), small)
  kwargs = dict(learning_rate=1e-2, num_train_steps=10, warmup_steps=0, optimizer=optimizer)
  clipped, _ = optim.make_optimizer(clip_norm=1.0, **kwargs)
  unclipped, _ = optim.make_optimizer(clip_norm=None, **kwargs)
  got = _run(clipped, [big, small])
  by_hand = _run(unclipped, [jax.tree.map(lambda g: g / 10.0, big), small])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, by_hand)
  not_clipped = _run(unclipped, [big, small])
  assert not np.allclose(not_clipped["dense"]["kernel"], got["dense"]["kernel"], atol=1e-4)


def _fused_lamb_by_hand(grads_list, *, lr, wd, warmup, total, power, clip, b1=0.9, b2=0.999,
                        eps=1e-6):
  """apex's FusedLAMB (use_nvlamb=False, as NVIDIA's BERT runs it) in numpy, float64, on
  `_tiny_params()`: clip by global norm; bias-corrected Adam moments; u = m_hat / (sqrt(v_hat)
  + eps) + wd * p; the trust ratio ||p|| / ||u|| only where p decays (1 where a norm is 0);
  p -= rate * ratio * u, the rate warmed up over `warmup` updates then decayed with `power`."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), _tiny_params())
  decays = {"dense": {"kernel": True, "bias": False},
            "layer_norm": {"scale": False, "bias": False}}
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for t, grads in enumerate(grads_list, start=1):
    n = t - 1  # the schedule's step: updates before this one
    rate = lr * n / warmup if n < warmup else lr * (1 - (n - warmup) / (total - warmup)) ** power
    grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
    norm = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
    for module in params:
      for name, p in params[module].items():
        g = grads[module][name] / max(norm / clip, 1.0)
        m[module][name] = b1 * m[module][name] + (1 - b1) * g
        v[module][name] = b2 * v[module][name] + (1 - b2) * g * g
        u = (m[module][name] / (1 - b1**t)) / (np.sqrt(v[module][name] / (1 - b2**t)) + eps)
        ratio = 1.0
        if decays[module][name] and wd != 0:
          u = u + wd * p
          p_norm, u_norm = np.linalg.norm(p), np.linalg.norm(u)
          ratio = p_norm / u_norm if p_norm > 0 and u_norm > 0 else 1.0
        params[module][name] = p - rate * ratio * u
  return params


@pytest.mark.parametrize("wd", [0.1, 0.0])
def test_lamb_matches_nvidia_fused_lamb_by_hand(wd):
  """Three LAMB updates (warmup 1, power 0.5 decay, the first gradient clipped) against apex's
  FusedLAMB written out in numpy: the trust ratio scales the kernel only, not the bias or the
  LayerNorm parameters (and nothing at weight decay 0)."""
  lr, total = 1e-2, 4
  big = _grads(0)
  grads_list = [jax.tree.map(lambda g: g * 5.0 / optax.global_norm(big), big),  # clipped to 1
                _grads(1, scale=0.1), _grads(2, scale=0.1)]
  tx, schedule = optim.make_optimizer(learning_rate=lr, num_train_steps=total, warmup_steps=1,
                                      weight_decay=wd, optimizer="lamb", lr_decay_power=0.5)
  np.testing.assert_allclose([float(schedule(n)) for n in range(5)],
                             [0.0, lr, lr * (2 / 3)**0.5, lr * (1 / 3)**0.5, 0.0], rtol=1e-6)
  got = _run(tx, grads_list)
  by_hand = _fused_lamb_by_hand(grads_list, lr=lr, wd=wd, warmup=1, total=total, power=0.5,
                                clip=1.0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, by_hand)
  # optax.lamb (the trust ratio on every parameter) ends elsewhere on the bias and LayerNorm.
  everywhere = optax.chain(optax.clip_by_global_norm(1.0),
                           optax.lamb(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=wd,
                                      mask=optim.weight_decay_mask))
  other = _run(everywhere, grads_list)
  for module, name in (("dense", "bias"), ("layer_norm", "scale"), ("layer_norm", "bias")):
    assert not np.allclose(other[module][name], got[module][name], atol=1e-4), (module, name)


def test_lamb_state_is_that_of_optax_lamb():
  """A LAMB checkpoint of an earlier bertjax (optax.lamb) resumes: orbax restores by the state's
  tree, empty nodes included, and the tree is the same."""
  ours, _ = optim.make_optimizer(num_train_steps=10, warmup_steps=0, clip_norm=None,
                                 optimizer="lamb")
  earlier = optax.lamb(schedules.learning_rate_schedule(1e-3, 0, 10), eps=1e-6, weight_decay=0.01,
                       mask=optim.weight_decay_mask)
  assert (jax.tree.structure(ours.init(_tiny_params()))
          == jax.tree.structure(earlier.init(_tiny_params())))


@pytest.mark.parametrize("optimizer", optim.OPTIMIZERS)
def test_a_bfloat16_first_moment(optimizer):
  """train.mu_dtype=bfloat16 keeps the first moment in bfloat16 (the second in float32) and
  steps within bfloat16's rounding of the float32 first moment's parameters."""
  make = lambda mu_dtype: optim.make_optimizer(learning_rate=1e-2, num_train_steps=10,
                                               warmup_steps=0, optimizer=optimizer,
                                               clip_norm=None, mu_dtype=mu_dtype)[0]
  half = make("bfloat16")
  adam = [s for s in jax.tree.leaves(half.init(_tiny_params()),
                                     is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
          if isinstance(s, optax.ScaleByAdamState)]
  assert adam and all(x.dtype == jnp.bfloat16 for s in adam for x in jax.tree.leaves(s.mu))
  assert all(x.dtype == jnp.float32 for s in adam for x in jax.tree.leaves(s.nu))
  grads_list = [_grads(i) for i in range(4)]
  full, got = _run(make("float32"), grads_list), _run(half, grads_list)
  start = _tiny_params()
  jax.tree.map(lambda a, b, p: np.testing.assert_allclose(a - p, b - p, rtol=2e-2, atol=1e-4),
               got, full, start)
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, got, full)))  # rounded, not equal
  with pytest.raises(UserError, match="train.mu_dtype='float16'; use float32 or bfloat16"):
    make("float16")


def test_unknown_optimizer_is_refused():
  with pytest.raises(UserError,
                     match="train.optimizer='sgd'; use one of adamw, lamb, stable_adamw"):
    optim.make_optimizer(num_train_steps=10, warmup_steps=0, optimizer="sgd")


def _stable_adamw_by_hand(grads_list, *, lr, wd_full, warmup, total, b1, b2, eps):
  """optimi's StableAdamW with decouple_lr=True (ModernBERT's "decoupled_stableadamw"), as
  `_single_param_stableadamw` and Wortsman et al. 2023's Algorithm 1 write it, in numpy float64:
  the moments kept debiased (beta_hat = beta (1 - beta^(t-1)) / (1 - beta^t)), each tensor's rate
  divided by max(1, RMS), RMS = sqrt(mean(g^2 / max(v, eps^2))), then p *= 1 - (rate / peak) *
  wd_full where p decays, and p -= rate * m / (sqrt(v) + eps). No clipping, linear schedule.
  Returns (params, the RMS of each tensor at each update)."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), _tiny_params())
  decays = {"dense": {"kernel": True, "bias": False},
            "layer_norm": {"scale": False, "bias": False}}
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  rms_seen = []
  for t, grads in enumerate(grads_list, start=1):
    n = t - 1
    rate = lr * n / warmup if n < warmup else lr * (1 - (n - warmup) / (total - warmup))
    beta1_hat = b1 * (1 - b1**(t - 1)) / (1 - b1**t)
    beta2_hat = b2 * (1 - b2**(t - 1)) / (1 - b2**t)
    for module in params:
      for name, p in params[module].items():
        g = np.asarray(grads[module][name], np.float64)
        m[module][name] = beta1_hat * m[module][name] + (1 - beta1_hat) * g
        v[module][name] = beta2_hat * v[module][name] + (1 - beta2_hat) * g * g
        rms = np.sqrt(np.mean(g * g / np.maximum(v[module][name], eps * eps)))
        rms_seen.append(rms)
        step_rate = rate / max(1.0, rms)
        if decays[module][name]:
          p = p * (1 - (step_rate / lr) * wd_full)
        params[module][name] = p - step_rate * m[module][name] / (np.sqrt(v[module][name]) + eps)
  return params, rms_seen


def test_stable_adamw_matches_optimis_algorithm_by_hand():
  """Three StableAdamW updates with ModernBERT's betas and eps against optimi's StableAdamW
  written out in numpy: the gradients grow tenfold at the second update, so its RMS exceeds 1 and
  the update is clipped; ModernBERT's fully decoupled weight decay wd' is weight_decay = wd' /
  peak here. AdamW, without the clipping, ends elsewhere."""
  lr, total, wd_full = 8e-4, 10, 1e-5
  grads_list = [_grads(0, scale=0.1), _grads(1, scale=1.0), _grads(2, scale=0.5)]
  kwargs = dict(learning_rate=lr, num_train_steps=total, warmup_steps=1, b1=0.9, b2=0.98,
                eps=1e-6, weight_decay=wd_full / lr, clip_norm=None)
  tx, _ = optim.make_optimizer(optimizer="stable_adamw", **kwargs)
  got = _run(tx, grads_list)
  by_hand, rms = _stable_adamw_by_hand(grads_list, lr=lr, wd_full=wd_full, warmup=1, total=total,
                                       b1=0.9, b2=0.98, eps=1e-6)
  assert max(rms) > 1.2  # the clipping acted
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), got, by_hand)
  adamw, _ = optim.make_optimizer(optimizer="adamw", **kwargs)
  assert not np.allclose(_run(adamw, grads_list)["dense"]["kernel"], got["dense"]["kernel"],
                         rtol=0, atol=1e-6)


def test_stable_adamw_state_is_that_of_adamw_and_frozen_parameters_stay():
  """Its state is optax.adamw's (a plain optax state: orbax restores it, the shardings map over
  it); frozen parameters stay bitwise as they were."""
  stable, _ = optim.make_optimizer(num_train_steps=10, warmup_steps=0, optimizer="stable_adamw")
  adamw, _ = optim.make_optimizer(num_train_steps=10, warmup_steps=0)
  assert (jax.tree.structure(stable.init(_tiny_params()))
          == jax.tree.structure(adamw.init(_tiny_params())))
  frozen, _ = optim.make_optimizer(learning_rate=1e-2, num_train_steps=10, warmup_steps=0,
                                   optimizer="stable_adamw", frozen=("layer_norm",))
  got = _run(frozen, [_grads(i) for i in range(3)])
  jax.tree.map(np.testing.assert_array_equal, got["layer_norm"], _tiny_params()["layer_norm"])
  assert not np.allclose(got["dense"]["kernel"], _tiny_params()["dense"]["kernel"])


def test_stable_adamw_clips_modernberts_qkv_as_the_one_tensor_optimi_steps():
  """ModernBERT's trainer steps the attention's query, key and value as one Wqkv tensor, so
  optimi's StableAdamW takes one RMS over the three. bertjax keeps three kernels and, for a
  ModernBERT (`modernbert.stored_tensor`), takes that same RMS: three updates, one gradient
  large enough to clip, equal optimi's on the fused tensor; per kernel they would not be."""
  import torch  # pylint: disable=import-outside-toplevel
  import optimi  # pylint: disable=import-outside-toplevel
  from bertjax.models import modernbert  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  names = ("query", "key", "value")
  params = {"attention": {n: {"kernel": rng.normal(size=(4, 4)).astype(np.float32)}
                          for n in names}}
  grads_list = [{"attention": {n: {"kernel": rng.normal(size=(4, 4)).astype(np.float32)
                                   * (30.0 if (n, i) == ("value", 2) else 1.0)}
                               for n in names}} for i in range(3)]
  kwargs = dict(learning_rate=1e-2, num_train_steps=10, warmup_steps=0, clip_norm=None,
                optimizer="stable_adamw", b2=0.98, weight_decay=0.1)
  fused, _ = optim.make_optimizer(stored_tensor=modernbert.stored_tensor, **kwargs)
  separate, _ = optim.make_optimizer(**kwargs)

  def run(tx):
    p, state = params, tx.init(params)
    for g in grads_list:
      updates, state = tx.update(g, state, p)
      p = optax.apply_updates(p, updates)
    return np.concatenate([np.asarray(p["attention"][n]["kernel"]) for n in names])

  wqkv = torch.nn.Parameter(torch.from_numpy(
      np.concatenate([params["attention"][n]["kernel"] for n in names])))
  reference = optimi.StableAdamW([wqkv], lr=1e-2, betas=(0.9, 0.98), eps=1e-6,
                                 weight_decay=0.1, foreach=False)
  for step, g in enumerate(grads_list):
    reference.param_groups[0]["lr"] = 1e-2 * (1 - step / 10)  # the linear decay over 10 steps
    wqkv.grad = torch.from_numpy(np.concatenate([g["attention"][n]["kernel"] for n in names]))
    reference.step()
  np.testing.assert_allclose(run(fused), wqkv.detach().numpy(), rtol=0, atol=1e-6)
  assert np.abs(run(separate) - wqkv.detach().numpy()).max() > 1e-4
