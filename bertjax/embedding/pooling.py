"""Pooling token vectors into one vector a text, by sentence-transformers' rules (its Pooling
module), for packed rows (several texts a row, `bertjax.data.packed_rows`' layout).

  cls                    the first pooled token ([CLS], or the first after an excluded prompt)
  max                    the maximum over the pooled tokens, each dimension
  mean                   the mean of the pooled tokens
  mean_sqrt_len_tokens   their sum over the square root of their number
  weightedmean           the mean weighted by position (1, 2, ... from the text's first token)
  lasttoken              the text's last token

The pooled tokens of a text are its own (`sequence_ids`), less its first `prompt_length` (an
excluded prompt with its [CLS]: include_prompt false). Several modes are concatenated in the
order given.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def pool(tokens: jax.Array, sequence_ids: jax.Array, position_ids: jax.Array,
         modes: Sequence[str], slots: int, prompt_length: int | jax.Array = 0) -> jax.Array:
  """Pools the token vectors of each text of packed rows.

  Args:
    tokens: [rows, seq, hidden] float, the encoder's last hidden states.
    sequence_ids: [rows, seq] int, 1..k: the text a token belongs to; 0 at padding.
    position_ids: [rows, seq] int, the token's position in its text (0 at its [CLS]).
    modes: pooling modes (module docstring), concatenated.
    slots: k, the texts a row holds at most.
    prompt_length: leading tokens of each text left out (an excluded prompt with its [CLS]);
      an int, or [rows] int, one a row (each row's prompt).
  Returns:
    [rows, slots, hidden * len(modes)] float32 (zeros in empty slots).
  """
  rows, seq, hidden = tokens.shape
  tokens = tokens.astype(jnp.float32).reshape(rows * seq, hidden)
  ids = sequence_ids.reshape(-1)
  positions = position_ids.reshape(-1)
  start = jnp.repeat(jnp.broadcast_to(jnp.asarray(prompt_length), (rows,)), seq)
  count = rows * slots  # segment rows * slots is the padding, dropped
  segment = jnp.where(ids > 0, jnp.repeat(jnp.arange(rows), seq) * slots + ids - 1, count)
  pooled = ((ids > 0) & (positions >= start)).astype(jnp.float32)[:, None]

  def total(weights):  # [rows * seq, 1] -> [count, hidden]: sum of weights * tokens per text
    return jax.ops.segment_sum(tokens * weights, segment, count + 1)[:count]

  def number(weights):  # [rows * seq, 1] -> [count, 1]
    return jax.ops.segment_sum(weights, segment, count + 1)[:count]

  outputs = []
  for mode in modes:
    if mode == "cls":
      outputs.append(total(pooled * (positions == start)[:, None]))
    elif mode == "max":
      most = jax.ops.segment_max(jnp.where(pooled > 0, tokens, -jnp.inf), segment, count + 1)
      outputs.append(jnp.where(jnp.isfinite(most[:count]), most[:count], 0.0))
    elif mode in ("mean", "mean_sqrt_len_tokens"):
      n = jnp.maximum(number(pooled), 1e-9)
      outputs.append(total(pooled) / (n if mode == "mean" else jnp.sqrt(n)))
    elif mode == "weightedmean":
      weights = pooled * (positions + 1).astype(jnp.float32)[:, None]
      outputs.append(total(weights) / jnp.maximum(number(weights), 1e-9))
    elif mode == "lasttoken":
      length = number((ids > 0).astype(jnp.float32)[:, None])  # [count, 1] tokens of each text
      last = positions == jnp.append(length[:, 0], 0.0)[segment].astype(positions.dtype) - 1
      outputs.append(total((ids > 0)[:, None] * last[:, None]))
    else:
      raise ValueError(f"unknown pooling mode {mode!r}")
  return jnp.concatenate(outputs, axis=-1).reshape(rows, slots, -1)
