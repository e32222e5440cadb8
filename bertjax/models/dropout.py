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

With `per_hash=4` (the run choice model.dropout_per_hash) a threefry hash decides four elements:
jax's partitionable threefry folds the two 32-bit words of each hash into one draw, so here the
hash is taken of each element's counter directly (`threefry2x32_p`, elementwise, so still drawn
where the shard is) and both words are used, 16 bits an element: elements j, j + m, j + 2m and
j + 3m of a row, m = ceil(n / 4). Half the hashes of `per_hash=2`, other masks at the same rate.
Keys of another PRNG (rbg, unsafe_rbg) draw as `per_hash=2`.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.extend.random as jax_random
import jax.numpy as jnp
import numpy as np
from jax import lax

_LEVELS = 1 << 16  # values of a 16-bit half


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float, per_hash: int = 2
              ) -> jax.Array:
  """[shape] bool, True where an element is kept: each False with probability
  round(rate * 2^16) / 2^16, independently, from shape[:-1] + (ceil(shape[-1] / 2),) 32-bit
  draws of `rng`, or with `per_hash=4` and a threefry key from shape[:-1] + (ceil(shape[-1] /
  4),) hashes (the module docstring says which elements a draw decides)."""
  if not shape:
    return keep_mask(rng, (1,), rate, per_hash)[0]
  *rows, n = shape
  if per_hash == 4 and "threefry" in str(jax.random.key_impl(rng)):
    words = _hash_words(rng, (*rows, (n + 3) // 4))
  else:
    words = [jax.random.bits(rng, (*rows, (n + 1) // 2), jnp.uint32)]
  halves = jnp.concatenate([half for word in words for half in (word & (_LEVELS - 1),
                                                                word >> 16)], axis=-1)[..., :n]
  return halves >= round(rate * _LEVELS)


def _hash_words(rng: jax.Array, shape: tuple[int, ...]) -> list[jax.Array]:
  """Both 32-bit words of the threefry hashes of `rng` and each position's row-major index in
  `shape` (two [shape] uint32; from iotas, so each device hashes its own shard's indices)."""
  strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
  index = sum(lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
              for axis, stride in enumerate(strides))
  key = jax.random.key_data(rng) if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
  return list(jax_random.threefry2x32_p.bind(key[0], key[1], jnp.zeros_like(index), index))


class Dropout(nn.Module):
  """Zeroes each element with probability `rate` (module docstring) and scales the others so
  the expectation is unchanged; the identity when deterministic or rate is 0. Draws from the
  'dropout' rng, as flax's Dropout; `per_hash`: 2 or 4 elements a threefry hash decides."""
  rate: float
  per_hash: int = 2

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    threshold = round(self.rate * _LEVELS)
    if deterministic or threshold == 0:
      return x
    if threshold >= _LEVELS:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng("dropout"), x.shape, self.rate, self.per_hash)
    scale = jnp.float32(_LEVELS / (_LEVELS - threshold))
    return jnp.where(keep, x.astype(jnp.float32) * scale, 0).astype(x.dtype)
