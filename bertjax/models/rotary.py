"""Rotary position embeddings (Su et al. 2021, RoFormer), as ModernBERT and transformers apply
them: each query and key is rotated by its position before attention, so their dot product
depends on the distance between them, not on where they are.

The rotation pairs dimension i with i + head_dim / 2 (transformers' `rotate_half`, not the
interleaved pairs of the RoFormer paper), at frequencies theta ** (-2i / head_dim); converted
Hugging Face weights rely on that layout. Computed in float32, whatever the compute dtype.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Rotation(NamedTuple):
  """The cosines and sines of each position's angles: [batch or 1, seq, head_dim] float32 each
  (the half-dimension angles repeated, as transformers' ModernBertRotaryEmbedding makes them)."""
  cos: jax.Array
  sin: jax.Array


def rotation(position_ids: jax.Array, head_dim: int, theta: float) -> Rotation:
  """The rotation of each position at base `theta`.

  Args:
    position_ids: [batch or 1, seq] int position of each token in its own sequence (a packed
      row restarts them at each sequence).
    head_dim: the attention heads' width (even).
    theta: the base of the frequencies (ModernBERT: 160,000 global, 10,000 local).
  Returns:
    Rotation of [batch or 1, seq, head_dim] float32 arrays.
  """
  inverse_frequencies = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                                         / head_dim))  # [head_dim / 2]
  # [b, seq, 1] x [head_dim / 2] -> [b, seq, head_dim / 2] -> [b, seq, head_dim]
  angles = position_ids.astype(jnp.float32)[..., None] * inverse_frequencies
  angles = jnp.concatenate([angles, angles], axis=-1)
  return Rotation(jnp.cos(angles), jnp.sin(angles))


def rotate(x: jax.Array, rotation: Rotation) -> jax.Array:
  """`x` rotated by its positions' angles, in float32 and back to x's dtype.

  Args:
    x: [batch, seq, heads, head_dim] queries or keys.
    rotation: the batch's Rotation ([batch or 1, seq, head_dim]).
  Returns:
    [batch, seq, heads, head_dim] in x's dtype: x * cos + rotate_half(x) * sin, where
    rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2]).
  """
  cos, sin = (t[:, :, None, :] for t in rotation)  # broadcast over the heads
  y = x.astype(jnp.float32)
  first, second = jnp.split(y, 2, axis=-1)
  rotated_half = jnp.concatenate([-second, first], axis=-1)
  return (y * cos + rotated_half * sin).astype(x.dtype)
