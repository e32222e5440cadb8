"""Dropout that draws half the random bits of `flax.linen.Dropout`, where they are used.

Drawing random bits is most of what dropout costs: JAX's threefry hash gives 32 bits per call,
and flax's Dropout (`jax.random.bernoulli`) spends one draw on each element. BERT drops attention
probabilities ([batch, heads, seq, seq]) and two hidden states per layer, so on a CPU the draws
took about 15% of a fine-tuning step. Here each 32-bit draw decides two elements, one with each
16-bit half: an element is kept when its half is at least round(rate * 2^16). The rate applied is
then that threshold / 2^16 (0.1 -> 0.100006), the kept elements are scaled by 1 / (1 - that
rate), so the expected output is the input exactly, as with flax's Dropout. The scale is applied
in float32 and the product rounded once: a bfloat16 scale (1 / 0.9 -> 1.109375) would shrink
every kept element by 0.16%.

The two elements of a draw are j and j + ceil(n / 2) of the same row of the last axis (n long),
which bertjax never splits over devices (`bertjax.training.parallel.LOGICAL_RULES`), and the
draws have the shape of the array but for that axis. On a mesh each device then draws the bits
of its own shard (threefry is partitionable, jax's default `jax_threefry_partitionable`): no
random bits move between devices. (Pairing i with i + size / 2 of the flattened array, as this
module did before, made a data-parallel step all-gather as many bytes of bits as its gradients.)
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

_LEVELS = 1 << 16  # values of a 16-bit half


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """[shape] bool, True where an element is kept: each False with probability
  round(rate * 2^16) / 2^16, independently, from shape[:-1] + (ceil(shape[-1] / 2),) 32-bit
  draws of `rng` (the module docstring says which two elements a draw decides)."""
  if not shape:
    return keep_mask(rng, (1,), rate)[0]
  *rows, n = shape
  bits = jax.random.bits(rng, (*rows, (n + 1) // 2), jnp.uint32)
  halves = jnp.concatenate([bits & (_LEVELS - 1), bits >> 16], axis=-1)[..., :n]
  return halves >= round(rate * _LEVELS)


class Dropout(nn.Module):
  """Zeroes each element with probability `rate` (module docstring) and scales the others so
  the expectation is unchanged; the identity when deterministic or rate is 0. Draws from the
  'dropout' rng, as flax's Dropout."""
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    threshold = round(self.rate * _LEVELS)
    if deterministic or threshold == 0:
      return x
    if threshold >= _LEVELS:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng("dropout"), x.shape, self.rate)
    scale = jnp.float32(_LEVELS / (_LEVELS - threshold))
    return jnp.where(keep, x.astype(jnp.float32) * scale, 0).astype(x.dtype)
