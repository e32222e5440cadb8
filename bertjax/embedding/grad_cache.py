"""GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"): the loss of a batch too large to embed at once, and its exact gradient, chunk by
chunk.

A contrastive loss couples every text of the batch, so gradient accumulation (a loss per
micro-batch) would shrink each anchor's negatives to its micro-batch. GradCache keeps the whole
batch in the loss and only the encoder's activations in chunks:
  1. embed every chunk without keeping activations (the embeddings alone: [batch, dim]);
  2. the loss of all the embeddings, and its gradient with respect to each embedding;
  3. embed each chunk again, now differentiating, and pull that chunk's embedding gradient back
     to the parameters (a vector-Jacobian product), summing over the chunks.
The parameters' gradient is the full batch's; the memory of activations is one chunk's. Each
chunk's dropout draws from its own key, the same in steps 1 and 3 (sentence-transformers'
CachedMultipleNegativesRankingLoss replays torch's random state the same way).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bertjax.errors import UserError

Params = Any
Inputs = Any  # a pytree of arrays, each [batch, ...]
Embeddings = Any  # a pytree of arrays, each [rows, dim]


def chunked(inputs: Inputs, chunk_size: int) -> tuple[Inputs, int]:
  """(`inputs` reshaped to [chunks, chunk_size, ...], the number of chunks)."""
  batch = jax.tree.leaves(inputs)[0].shape[0]
  if chunk_size < 1 or batch % chunk_size:
    raise UserError(f"a GradCache chunk of {chunk_size} rows does not divide the batch of "
                    f"{batch}; give a chunk size that divides it (e.g. {_divisor(batch)}).")
  count = batch // chunk_size
  return jax.tree.map(lambda x: x.reshape(count, chunk_size, *x.shape[1:]), inputs), count


def _divisor(batch: int) -> int:
  """The largest divisor of `batch` up to 64, for the message."""
  return max(d for d in range(1, min(batch, 64) + 1) if batch % d == 0)


def value_and_grad(embed: Callable[[Params, Inputs, jax.Array], Embeddings],
                   loss: Callable[[Embeddings], jax.Array], params: Params, inputs: Inputs,
                   rng: jax.Array, chunk_size: int) -> tuple[jax.Array, Params]:
  """(loss, its gradient with respect to `params`) of `loss(embeddings of the whole batch)`,
  computed `chunk_size` rows at a time (module docstring).

  Args:
    embed: (params, inputs of some rows, dropout key) -> their embeddings, a pytree of
      [rows, dim] arrays (e.g. {"anchor": ..., "positive": ...}).
    loss: the embeddings of the whole batch -> a float32 scalar.
    params: the parameters `embed` is differentiated with respect to.
    inputs: the batch, a pytree of [batch, ...] arrays.
    rng: the dropout key; chunk i draws from jax.random.fold_in(rng, i).
    chunk_size: rows a chunk; it divides the batch.
  """
  chunks, count = chunked(inputs, chunk_size)
  keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(count))
  frozen = jax.lax.stop_gradient(params)
  embeddings = jax.lax.map(lambda xs: embed(frozen, xs[0], xs[1]), (chunks, keys))
  whole = jax.tree.map(lambda e: e.reshape(-1, *e.shape[2:]), embeddings)
  value, cotangents = jax.value_and_grad(loss)(whole)
  cotangents = jax.tree.map(lambda d: d.reshape(count, chunk_size, *d.shape[1:]), cotangents)

  def accumulate(total, xs):
    chunk, key, cotangent = xs
    _, pull_back = jax.vjp(lambda p: embed(p, chunk, key), params)
    (grads,) = pull_back(cotangent)
    return jax.tree.map(jnp.add, total, grads), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, _ = jax.lax.scan(accumulate, zeros, (chunks, keys, cotangents))
  return value, grads
