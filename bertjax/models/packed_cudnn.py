"""cuDNN flash attention over a packed batch, its sequences given to the kernel as segments.

A packed row holds several sequences, each attending only to itself (`bertjax.data.packed_rows`).
`jax.nn.dot_product_attention` takes one length a row, so a packed batch reaches its cuDNN
kernel as a boolean mask, which jax turns into a dense [batch, 1, seq, seq] bias that the kernel
reads at every layer and head and gives a gradient nothing uses. cuDNN's packed layout (ragged
offsets; Hopper GPUs and later) takes each sequence's start and length instead; jax 0.10 reaches
it only through its private `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`
(q_seqlen / kv_seqlen [batch, k], q_offsets / kv_offsets [batch, k + 1], -1 for an empty slot).
`attention.attend` takes this path for a packed batch on a Hopper GPU (`takes`) and the dense
mask elsewhere. tests/test_attention_packed_cudnn.py checks the segment tables against the
block-diagonal mask and what a packed step hands the kernel (lowered for a GPU on a CPU), and, on
a GPU, the outputs and gradients against the reference.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _fused_attention():
  """jax's cuDNN attention module: the one API that takes packed segments (jax.nn's does not)."""
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=import-outside-toplevel
  return fused_attention_stablehlo


def takes(mask, causal: bool, window: int | None) -> bool:
  """Whether cuDNN takes the batch as segments: `mask` (an `attention.AttentionMask`) a packed
  batch of up to k > 1 sequences a row (cls_positions [batch, k]), global bidirectional
  attention, on a Hopper or later GPU (jax refuses the packed layout before it)."""
  return (mask.sequence_ids is not None and mask.cls_positions is not None
          and mask.cls_positions.shape[-1] > 1 and not causal and window is None
          and _fused_attention().check_compute_capability("9.0"))


def segments(sequence_ids: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
  """A packed batch's sequences as cuDNN's packed layout takes them. A row's sequences are
  contiguous and in the order of their ids, so sequence j is the tokens from its first one on,
  as many as carry id j.

  Args:
    sequence_ids: [batch, seq] int, 1..k numbering each row's sequences, 0 at padding.
    slots: k, the most sequences a row holds.
  Returns:
    (lengths [batch, k] int32: each row's sequence 1..k's tokens, -1 for an empty slot;
     offsets [batch, k + 1] int32: the row position of each sequence's first token, -1 for an
     empty slot and in the last column, as jax asks). Padding tokens (id 0) are in no sequence:
    cuDNN computes nothing for them.
  """
  ids = sequence_ids.astype(jnp.int32)  # [batch, seq]
  member = ids[:, None, :] == jnp.arange(1, slots + 1, dtype=jnp.int32)[None, :, None]
  lengths = member.sum(axis=-1, dtype=jnp.int32)  # [batch, k, seq] -> [batch, k]
  starts = jnp.argmax(member, axis=-1).astype(jnp.int32)  # [batch, k]: the first member
  present = lengths > 0
  offsets = jnp.pad(jnp.where(present, starts, -1), ((0, 0), (0, 1)), constant_values=-1)
  return jnp.where(present, lengths, -1), offsets


def attention(query: jax.Array, key: jax.Array, value: jax.Array, mask) -> jax.Array:
  """Each query attends the keys of its own packed sequence (as `attention.packed_attention_mask`
  says), by cuDNN with the sequences as segments: no dense bias.

  Args:
    query, key, value: [batch, seq, heads, head_dim], bfloat16 or float16.
    mask: a packed batch's `attention.AttentionMask`: sequence_ids [batch, seq], 1..k numbering
      each row's sequences, 0 at padding; cls_positions [batch, k].
  Returns:
    [batch, seq, heads, head_dim]: the real tokens' contexts, zeros at padding (which cuDNN
    leaves unwritten: whatever is there must not reach a sum over the row, e.g. mean pooling).
  """
  fused = _fused_attention()
  lengths, offsets = segments(mask.sequence_ids, mask.cls_positions.shape[-1])
  out = fused.dot_product_attention(
      query, key, value, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
      kv_offsets=offsets, scale=1.0 / math.sqrt(query.shape[-1]),
      mask_type=fused.MaskType.PADDING, qkv_layout="BTNH")
  real = (mask.sequence_ids > 0)[:, :, None, None]  # [batch, seq, 1, 1]
  return jnp.where(real, out, jnp.zeros((), out.dtype))
