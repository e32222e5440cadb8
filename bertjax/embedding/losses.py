"""Contrastive losses of embeddings, each anchor against every candidate of the global batch.

`in_batch_softmax` is sentence-transformers' MultipleNegativesRankingLoss (Henderson et al. 2017;
its rules: cosine similarity times `scale`, 20; each anchor's positive against every positive
and hard negative of the batch; the mean of -log softmax) and, `symmetric`, its
MultipleNegativesSymmetricRankingLoss (directions query_to_doc and doc_to_query, one softmax
each, averaged). `sigmoid` is SigLIP's pairwise loss (Zhai et al. 2023): every (anchor,
candidate) pair a binary decision, log-sigmoid of +-(similarity * t + b). `matryoshka` is
sentence-transformers' MatryoshkaLoss (Kusupati et al. 2022): a loss over the first d dimensions
of the embeddings, for each d, weighted.

Duplicates: where the batch holds the same positive (or the same anchor) twice, `duplicates`
([batch] ids, equal for equal texts) masks the copies out of each other's negatives, so that a
text is not pushed away from itself (sentence-transformers avoids them in its batch sampler
instead).

The arrays are the global batch: under jit over a mesh that splits the batch, the similarity
matrix [batch, batch * (1 + negatives)] needs every device's candidates, and XLA moves only the
embeddings ([batch, dim]) to make it.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """[n, d] x [m, d] -> [n, m] cosine similarities (sentence-transformers' cos_sim: each row
  divided by max(its norm, 1e-12))."""
  def unit(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  return unit(a) @ unit(b).T


def _excluded(duplicates: jax.Array | None, valid: jax.Array | None, batch: int,
              columns: int) -> jax.Array:
  """[batch, columns] True where column j (candidate j % batch of block j // batch) is left out
  of row i's softmax: a copy of row i's positive other than row i's own (`duplicates`: among
  the positives only), or a candidate of a padding row (`valid` False) other than row i's
  own."""
  others = ~jnp.eye(batch, dtype=bool)
  padding = (jnp.zeros((batch, batch), bool) if valid is None
             else jnp.broadcast_to(~valid[None, :], (batch, batch))) & others
  copies = padding if duplicates is None else padding | (
      (duplicates[:, None] == duplicates[None, :]) & others)
  return jnp.concatenate([copies] + [padding] * (columns // batch - 1), axis=1)


def in_batch_softmax_per_anchor(anchors: jax.Array, candidates: Sequence[jax.Array], *,
                                scale: float = 20.0, symmetric: bool = False,
                                duplicates: jax.Array | None = None,
                                valid: jax.Array | None = None) -> jax.Array:
  """MultipleNegativesRankingLoss of each anchor (module docstring): [batch] float32, whose mean
  is `in_batch_softmax`.

  Args:
    anchors: [batch, dim] embeddings of the anchors (queries).
    candidates: the positives [batch, dim], then any hard negatives, each [batch, dim] (the
      i-th of each belongs to anchor i).
    scale: the similarities' multiplier (1 / temperature).
    symmetric: also each positive against every anchor, a softmax of its own, averaged.
    duplicates: [batch] ids, equal where two rows share their positive text (module
      docstring); None: none.
    valid: [batch] bool, False at padding rows, whose texts are no one's negatives; None: all
      real.
  """
  batch = anchors.shape[0]
  positives = candidates[0]
  scores = cosine(anchors, jnp.concatenate(candidates, axis=0)) * scale  # [batch, batch * c]
  scores = jnp.where(_excluded(duplicates, valid, batch, scores.shape[1]), -jnp.inf, scores)
  positive = jnp.diagonal(scores[:, :batch])
  log_z = jax.nn.logsumexp(scores, axis=1)
  if symmetric:
    backward = cosine(positives, anchors) * scale  # [batch, batch]: doc_to_query
    backward = jnp.where(_excluded(duplicates, valid, batch, batch), -jnp.inf, backward)
    log_z = (log_z + jax.nn.logsumexp(backward, axis=1)) / 2
  return log_z - positive


def in_batch_softmax(anchors: jax.Array, candidates: Sequence[jax.Array], **options
                     ) -> jax.Array:
  """MultipleNegativesRankingLoss (module docstring): the mean over the anchors of
  `in_batch_softmax_per_anchor` (same arguments, without `valid`), a float32 scalar."""
  return jnp.mean(in_batch_softmax_per_anchor(anchors, candidates, **options))


def sigmoid_per_anchor(anchors: jax.Array, candidates: Sequence[jax.Array], *,
                       log_scale: jax.Array, bias: jax.Array,
                       duplicates: jax.Array | None = None,
                       valid: jax.Array | None = None) -> jax.Array:
  """SigLIP's loss of each anchor, [batch] float32: -sum over its pairs of log sigmoid(z *
  (cosine * exp(log_scale) + bias)), z = 1 for its own positive and -1 for every other
  candidate. `log_scale` and `bias` are trained (SigLIP starts them at log 10 and -10);
  duplicates' and padding rows' pairs are left out (`in_batch_softmax_per_anchor`'s
  arguments)."""
  batch = anchors.shape[0]
  logits = cosine(anchors, jnp.concatenate(candidates, axis=0)) * jnp.exp(log_scale) + bias
  labels = jnp.zeros(logits.shape).at[:, :batch].set(2 * jnp.eye(batch) - 1)
  labels = labels.at[:, batch:].set(-1.0)
  keep = ~_excluded(duplicates, valid, batch, logits.shape[1])
  return -jnp.sum(jnp.where(keep, jax.nn.log_sigmoid(labels * logits), 0.0), axis=1)


def sigmoid(anchors: jax.Array, candidates: Sequence[jax.Array], **options) -> jax.Array:
  """SigLIP's loss (`sigmoid_per_anchor`, same arguments): the sum over every pair over the
  anchors (SigLIP's normalisation: the batch), a float32 scalar."""
  return jnp.mean(sigmoid_per_anchor(anchors, candidates, **options))


def matryoshka(loss: Callable[..., jax.Array], dims: Sequence[int],
               weights: Sequence[float] | None = None) -> Callable[..., jax.Array]:
  """`loss` (anchors, candidates, **options; a scalar or one value an anchor) summed over the
  first d dimensions of every embedding, for each d in `dims`, times its weight (default 1
  each): MatryoshkaLoss."""
  weights = list(weights) if weights is not None else [1.0] * len(dims)

  def nested(anchors, candidates, **options):
    return sum(w * loss(anchors[:, :d], [c[:, :d] for c in candidates], **options)
               for d, w in zip(dims, weights))

  return nested
