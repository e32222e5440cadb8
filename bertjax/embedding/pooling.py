"""Pooling token vectors into one vector a text, by sentence-transformers' rules (its Pooling
module), for right-padded batches.

  cls                    the first pooled token ([CLS], or the first after an excluded prompt)
  max                    the maximum over the pooled tokens, each dimension
  mean                   the mean of the pooled tokens
  mean_sqrt_len_tokens   their sum over the square root of their number
  weightedmean           the mean weighted by position (1, 2, ... from the first token)
  lasttoken              the last pooled token

The pooled tokens are the real ones (`mask`), less the first `prompt_length` of each row when a
prompt is excluded (include_prompt false: [CLS] and the prompt's tokens). Several modes are
concatenated in the order given.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import jax


def pool(tokens: jax.Array, mask: jax.Array, modes: Sequence[str],
         prompt_length: int = 0) -> jax.Array:
  """Pools token vectors.

  Args:
    tokens: [batch, seq, hidden] float, the encoder's last hidden states.
    mask: [batch, seq] 1 for real tokens, 0 for padding (right-padded).
    modes: pooling modes (module docstring), concatenated.
    prompt_length: leading tokens of each row left out (an excluded prompt with its [CLS]).
  Returns:
    [batch, hidden * len(modes)] float32.
  """
  tokens = tokens.astype(jnp.float32)
  positions = jnp.arange(tokens.shape[1])[None, :]  # [1, seq]
  pooled_mask = (mask > 0) & (positions >= prompt_length)  # [batch, seq]
  weights = pooled_mask[..., None].astype(jnp.float32)  # [batch, seq, 1]
  outputs = []
  for mode in modes:
    if mode == "cls":
      first = jnp.argmax(pooled_mask, axis=1)  # [batch]
      outputs.append(jnp.take_along_axis(tokens, first[:, None, None], axis=1)[:, 0])
    elif mode == "max":
      outputs.append(jnp.max(jnp.where(weights > 0, tokens, -jnp.inf), axis=1))
    elif mode in ("mean", "mean_sqrt_len_tokens"):
      total = jnp.sum(tokens * weights, axis=1)
      count = jnp.maximum(jnp.sum(weights, axis=1), 1e-9)
      outputs.append(total / (count if mode == "mean" else jnp.sqrt(count)))
    elif mode == "weightedmean":
      weighted = weights * (positions[..., None] + 1).astype(jnp.float32)
      outputs.append(jnp.sum(tokens * weighted, axis=1) /
                     jnp.maximum(jnp.sum(weighted, axis=1), 1e-9))
    elif mode == "lasttoken":
      seq = tokens.shape[1]
      last = seq - 1 - jnp.argmax(pooled_mask[:, ::-1], axis=1)  # [batch]
      last = jnp.where(jnp.any(pooled_mask, axis=1), last, seq - 1)
      outputs.append(jnp.take_along_axis(tokens * weights, last[:, None, None], axis=1)[:, 0])
    else:
      raise ValueError(f"unknown pooling mode {mode!r}")
  return jnp.concatenate(outputs, axis=-1)
