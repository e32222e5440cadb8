"""The model a contrastive run trains: the encoder, then sentence-transformers' pooling (and
normalisation), on every text of a batch of (anchor, positive, negatives ...) tuples.

Its parameters are the encoder's ('bert', the tree of `bertjax.models.bert` or
`bertjax.models.modernbert`), so a trained workdir is a model directory like any other, plus,
for SigLIP's loss, the trained log-scale and bias ('sigmoid_log_scale', 'sigmoid_bias').
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.embedding import pooling
from bertjax.models import heads
from bertjax.models.config import BertConfig


class BertForEmbedding(nn.Module):
  """Encoder ('bert') + pooling (+ Normalize): one embedding a text.

  Attributes:
    config: the encoder's config.
    pooling: sentence-transformers pooling modes, concatenated (`bertjax.embedding.pooling`).
    normalize: embeddings made unit length.
    prompt_lengths: leading tokens each column's texts leave out of the pooling (an excluded
      prompt with its [CLS]; sentence-transformers' include_prompt false), one a column, the
      last for every further column; () = none.
    sigmoid: SigLIP's loss is trained: its log-scale and bias are parameters (SigLIP's start:
      log 10 and -10).
  """
  batch_keys = ("input_ids", "input_mask")
  config: BertConfig
  pooling: tuple[str, ...] = ("mean",)
  normalize: bool = False
  prompt_lengths: tuple[int, ...] = ()
  sigmoid: bool = False

  @nn.compact
  def __call__(self, input_ids: jax.Array, input_mask: jax.Array, *,
               deterministic: bool) -> dict[str, jax.Array]:
    """[batch, texts, seq] int32 inputs -> {"embeddings": [batch, texts, dim] float32} (and,
    with `sigmoid`, "log_scale" and "bias", float32 scalars)."""
    batch, texts, seq = input_ids.shape
    flat = lambda x: x.reshape(batch * texts, seq)  # one row a text
    encoder = heads.make_encoder(self.config, use_pooler=False, name="bert")
    out = encoder(flat(input_ids), None, flat(input_mask), deterministic=deterministic)
    positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch * texts, seq))
    lengths = list(self.prompt_lengths[:texts]) or [0]
    lengths += [lengths[-1]] * (texts - len(lengths))
    start = jnp.tile(jnp.asarray(lengths, jnp.int32), batch)  # [batch * texts]
    embeddings = pooling.pool(out.sequence_output, flat(input_mask), positions, self.pooling, 1,
                              start).reshape(batch, texts, -1)
    if self.normalize:
      embeddings /= jnp.maximum(jnp.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
    outputs = {"embeddings": embeddings}
    if self.sigmoid:
      outputs["log_scale"] = self.param("sigmoid_log_scale",
                                        nn.initializers.constant(math.log(10.0)), (), jnp.float32)
      outputs["bias"] = self.param("sigmoid_bias", nn.initializers.constant(-10.0), (),
                                   jnp.float32)
    return outputs
