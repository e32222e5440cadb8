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
  """(`inputs` as [chunks, chunk_size, ...], the number of chunks): chunk j is every chunks-th
  row from row j, so that on a mesh that splits the batch each device holds its share of every
  chunk and embeds it (`whole` puts them back in order)."""
  batch = jax.tree.leaves(inputs)[0].shape[0]
  if chunk_size < 1 or batch % chunk_size:
    raise UserError(f"a GradCache chunk of {chunk_size} rows does not divide the batch of "
                    f"{batch}; give a chunk size that divides it (e.g. {_divisor(batch)}).")
  count = batch // chunk_size
  return jax.tree.map(lambda x: x.reshape(chunk_size, count, *x.shape[1:]).swapaxes(0, 1),
                      inputs), count


def whole(chunks: Any) -> Any:
  """The inverse of `chunked`: [chunks, chunk_size, ...] arrays back to [batch, ...] in the
  batch's order."""
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), chunks)


def _divisor(batch: int) -> int:
  """The largest divisor of `batch` up to 64, for the message."""
  return max(d for d in range(1, min(batch, 64) + 1) if batch % d == 0)


def value_and_grad(embed: Callable[[Params, Inputs, jax.Array], Embeddings],
                   loss: Callable[[Params, Embeddings], Any], params: Params, inputs: Inputs,
                   rng: jax.Array, chunk_size: int, *, has_aux: bool = False
                   ) -> tuple[Any, Params]:
  """(loss, its gradient with respect to `params`) of `loss(params, embeddings of the whole
  batch)`,
  computed `chunk_size` rows at a time (module docstring); with `has_aux`, `loss` returns
  (loss, aux) and so does the first item.

  Args:
    embed: (params, inputs of some rows, dropout key) -> their embeddings, a pytree of
      [rows, dim] arrays (e.g. {"anchor": ..., "positive": ...}).
    loss: (params, the embeddings of the whole batch) -> a float32 scalar (with has_aux: and
      anything); the parameters it reads itself (e.g. SigLIP's scale) are differentiated
      directly.
    params: the parameters `embed` is differentiated with respect to.
    inputs: the batch, a pytree of [batch, ...] arrays.
    rng: the dropout key; chunk i (`chunked`) draws from jax.random.fold_in(rng, i).
    chunk_size: rows a chunk; it divides the batch.
  """
  chunks, count = chunked(inputs, chunk_size)
  keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(count))
  frozen = jax.lax.stop_gradient(params)
  embeddings = jax.lax.map(lambda xs: embed(frozen, xs[0], xs[1]), (chunks, keys))
  value, (direct, cotangents) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=has_aux)(
      params, whole(embeddings))
  cotangents, _ = chunked(cotangents, chunk_size)

  def accumulate(total, xs):
    chunk, key, cotangent = xs
    _, pull_back = jax.vjp(lambda p: embed(p, chunk, key), params)
    (grads,) = pull_back(cotangent)
    return jax.tree.map(jnp.add, total, grads), None

  grads, _ = jax.lax.scan(accumulate, direct, (chunks, keys, cotangents))
  return value, grads
