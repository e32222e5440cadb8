"""Attention itself, after the projections: the masks, the choice of kernel and the call to it.

`BertConfig.attention` names the path, `resolve_attention` says what 'auto' means on this backend
and length, and `attend` runs it on projected heads ([batch, seq, heads, head_dim]);
`bertjax.models.bert.SelfAttention` holds the projections, this module no parameters.

The paths: 'reference' is the paper's einsum with dropout on the attention probabilities
(`reference_attention`); 'xla' and 'cudnn' call jax.nn.dot_product_attention
(`dot_product_attention_kwargs` says which mask arguments each gets; a packed batch reaches
cuDNN as segments on Hopper GPUs, `bertjax.models.packed_cudnn`); 'splash' is the Pallas TPU
kernel (`splash_attention`). They agree at every real token (tests/test_attention_*.py).
On a mesh of several devices the fused kernels ('cudnn', 'splash': custom calls, which XLA
cannot split) run per shard in `jax.shard_map` over the batch and the heads (`per_shard`).
A causal model (`BertConfig.causal`, the paper's left-to-right ablation) hides later keys on
every path: the dense mask is lower-triangular, cuDNN unpacked gets is_causal, splash its
CausalMask (tests/test_ablations_causal.py).

A local layer (ModernBERT's sliding window, `BertConfig.window`) attends only keys within the
window, on every path: 'reference' by the dense banded mask, splash by its LocalMask, and
'xla' and 'cudnn' block by block in XLA (`local_attention`: each block of queries against its
own and the two neighbouring blocks of keys, O(seq x window)), or with BertConfig.local_kernel
'pallas' by the fused banded kernel (`bertjax.models.banded_attention`); cuDNN's window is
one-sided, so where neither fits (`local_blocks`) it reads the band as a mask.

Who may attend to whom is an `AttentionMask`: the input_mask, and for a packed batch (Krell et
al. 2021: several sequences a row) its sequence_ids, by which attention is block-diagonal on
every path, in the form each honours (a dense boolean mask, lengths, segments or segment ids).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from bertjax.models import banded_attention, packed_cudnn
from bertjax.models.config import BertConfig

def attention_mask(input_mask: jax.Array) -> jax.Array:
  """Which keys each query may attend to: every real (non-padding) token, as BERT does.

  Only keys are masked. A query at a padding position still attends to the real tokens, so no
  softmax row is ever empty; outputs at padding positions are meaningless and ignored.

  Args:
    input_mask: [batch, seq] 1 (or True) for real tokens, 0 for padding.
  Returns:
    [batch, 1, seq, seq] bool, True where query q may attend to key k (broadcasts over heads).
  """
  batch, seq = input_mask.shape
  keys = input_mask.astype(bool)[:, None, None, :]  # [batch, seq] -> [batch, 1, 1, seq(k)]
  return jnp.broadcast_to(keys, (batch, 1, seq, seq))


def packed_attention_mask(sequence_ids: jax.Array) -> jax.Array:
  """Which keys each query may attend to in a packed batch: those of its own sequence.

  Block-diagonal (Krell et al. 2021): no token attends across the sequences packed in a row.
  Padding (id 0) attends only padding, so no softmax row is empty.

  Args:
    sequence_ids: [batch, seq] int, 1..k numbering the sequences packed in a row, 0 at padding.
  Returns:
    [batch, 1, seq, seq] bool, True where sequence_ids[q] == sequence_ids[k].
  """
  # [batch, seq(q), 1] == [batch, 1, seq(k)] -> [batch, seq, seq] -> [batch, 1, seq, seq]
  return (sequence_ids[:, :, None] == sequence_ids[:, None, :])[:, None]


def window_mask(seq: int, window: int) -> jax.Array:
  """Which keys each query may attend to in a local layer (ModernBERT's sliding window): those
  at most `window` positions away, on either side.

  Returns:
    [1, 1, seq, seq] bool, True where |q - k| <= window (a band; broadcasts over the batch and
    the heads).
  """
  positions = jnp.arange(seq)
  return (jnp.abs(positions[:, None] - positions[None, :]) <= window)[None, None]


def causal_mask(seq: int) -> jax.Array:
  """Which keys each query may attend to in a left-to-right model: itself and those before it.

  Returns:
    [1, 1, seq, seq] bool, True where key k <= query q (lower triangular; broadcasts over the
    batch and the heads).
  """
  return jnp.tril(jnp.ones((seq, seq), bool))[None, None]


class AttentionMask(NamedTuple):
  """Who may attend to whom, kept in the forms the attention paths take (a pytree).

  Attributes:
    input_mask: [batch, seq] 1 for real tokens, 0 for padding. Right-padded (each row's real
      tokens first), as every batch bertjax builds is: the cuDNN path reads only its row sums.
    sequence_ids: [batch, seq] int, 1..k numbering the sequences packed in a row, 0 at padding;
      None for an unpacked batch (one sequence a row).
    cls_positions: [batch, k] where each packed sequence starts; None unpacked. Its k (the most
      sequences a row holds) sizes cuDNN's segment tables (`bertjax.models.packed_cudnn`).
  """
  input_mask: jax.Array
  sequence_ids: jax.Array | None = None
  cls_positions: jax.Array | None = None

  def dense(self, causal: bool = False, window: int | None = None) -> jax.Array:
    """[batch, 1, seq, seq] bool, True where query q may attend to key k: `attention_mask`
    unpacked, `packed_attention_mask` packed; with `causal` (BertConfig.causal) also only keys
    k <= q (`causal_mask`); with a `window` (a local layer) only keys |q - k| <= window
    (`window_mask`; a packed sequence's tokens are contiguous, so row distance is distance in
    the sequence). A padding query still attends some key (a real one before it, or itself
    packed or in a window), so no softmax row is empty."""
    if self.sequence_ids is None:
      dense = attention_mask(self.input_mask)
    else:
      dense = packed_attention_mask(self.sequence_ids)
    seq = dense.shape[-1]
    if window is not None:  # itself too: a padding query far from every real key
      dense = (dense & window_mask(seq, window)) | jnp.eye(seq, dtype=bool)[None, None]
    return dense & causal_mask(seq) if causal else dense

  def segment_ids(self) -> jax.Array:
    """[batch, seq] int32 ids such that q may attend k iff their ids are equal: sequence_ids
    packed, input_mask unpacked (so a padding query attends padding keys only; the real tokens'
    outputs are the same as under `dense`, the padding positions' are meaningless either way)."""
    ids = self.input_mask if self.sequence_ids is None else self.sequence_ids
    return ids.astype(jnp.int32)


# Splash attention's sequence lengths are multiples of this: its key blocks are whole multiples
# of the TPU's 128 lanes (splash_attention_kernel.py: "bkv_compute must be a multiple of 128").
SPLASH_MULTIPLE = 128


def _cudnn_fits(config: BertConfig, seq_len: int | None) -> bool:
  """Whether cuDNN flash attention takes this model's shapes: fp16/bf16 inputs, head_dim a
  multiple of 8 and at most 128 (256 from Hopper on; 128 is safe everywhere), and an even
  sequence length (cuDNN's training kernel with a bias, which a packed batch passes)."""
  return (config.compute_dtype == jnp.bfloat16 and config.head_dim % 8 == 0
          and config.head_dim <= 128 and (seq_len is None or seq_len % 2 == 0))


def resolve_attention(config: BertConfig, backend: str | None = None,
                      seq_len: int | None = None) -> str:
  """The attention path a model runs: config.attention, or what 'auto' means here.

  'auto' is 'reference' when attention_dropout_rate > 0 (no fused kernel drops attention
  probabilities); else 'splash' on TPU (when seq_len is a multiple of 128, else 'xla'),
  'cudnn' on GPU (when cuDNN takes the shapes: bfloat16 compute, head_dim a multiple of 8 up to
  128, even seq_len; else 'xla'), and 'xla' on CPU.

  Args:
    config: the model's BertConfig.
    backend: 'cpu', 'gpu' or 'tpu'; None = the context mesh's devices' (a TPU's where the steps
      are compiled for one on a CPU: `bertjax.tools.tpu_target`), else jax.default_backend().
    seq_len: the sequence length the model is called with (the model passes it); None = not
      known yet (taken to suit every kernel).
  Returns:
    'reference', 'xla', 'cudnn' or 'splash'.
  Raises:
    ValueError: an explicit choice the backend or the length cannot run (splash off TPU or at a
      length that is not a multiple of 128, cudnn off GPU), naming the fix.
  """
  if backend is None:
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    backend = device.platform if device is not None else jax.default_backend()
  choice = config.attention
  if choice == "auto":
    if config.attention_dropout_rate > 0:
      return "reference"
    if backend == "tpu":
      return "splash" if seq_len is None or seq_len % SPLASH_MULTIPLE == 0 else "xla"
    if backend == "gpu":
      return "cudnn" if _cudnn_fits(config, seq_len) else "xla"
    return "xla"
  if choice == "splash":
    if backend != "tpu":
      raise ValueError(f"splash attention needs a TPU, and this backend is {backend!r}; use "
                       "attention=auto (or xla).")
    if seq_len is not None and seq_len % SPLASH_MULTIPLE:
      raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, "
                       f"got {seq_len}; pad the sequences to a multiple of 128 or use "
                       "attention=auto (which takes xla there).")
  if choice == "cudnn" and backend != "gpu":
    raise ValueError(f"cudnn attention needs an NVIDIA GPU, and this backend is {backend!r}; "
                     "use attention=auto (or xla).")
  return choice


def dot_product_attention_kwargs(mask: AttentionMask, implementation: str,
                                 causal: bool = False, window: int | None = None) -> dict:
  """The masking arguments of `jax.nn.dot_product_attention` for 'xla' or 'cudnn'.

  What each honours (jax 0.10's nn/functions.py, cudnn/fused_attention_stablehlo.py): 'xla'
  applies a boolean `mask` and `key_value_seq_lengths` alike to the float32 logits; 'cudnn' turns
  a `mask` into a bias [batch, 1, seq, seq] its kernel reads in full, and sequence lengths into
  its PADDING mask type, which skips the padded key blocks.

  Unpacked, the keys to hide are each row's padding tail, so cuDNN gets key_value_seq_lengths
  (the row sums of the right-padded input_mask), not query_seq_lengths: padding queries attend
  the real keys exactly as `attention_mask` says.

  Packed, lengths cannot say "attend only your own sequence", so both get the block-diagonal
  mask (which cuDNN honours as a -2^41 bias; on Hopper GPUs `attend` gives cuDNN segments
  instead, `bertjax.models.packed_cudnn`). Never lengths or ids that a kernel may ignore: the
  maxtext issue 4476 trap, where a fused kernel silently attended across packed sequences.

  Causal (BertConfig.causal): unpacked, cuDNN gets is_causal with the lengths (its
  PADDING_CAUSAL mask type, which skips the blocks above the diagonal); otherwise the dense mask
  is the causal one (`AttentionMask.dense(causal=True)`).

  Local (a ModernBERT layer's `window`): both get the dense mask with the band
  (`AttentionMask.dense(window=...)`): cuDNN's sliding window is one-sided (jax refuses a right
  window without is_causal), so it reads the band as a bias and computes every block.

  Args:
    mask: the batch's AttentionMask.
    implementation: 'xla' or 'cudnn'.
    causal: keys after the query are hidden too.
    window: keys more than this far from the query are hidden too (None: none).
  Returns:
    {'mask': [batch, 1, seq, seq] bool} or {'key_value_seq_lengths': [batch] int32} (and
    'is_causal': True when causal).
  """
  if implementation == "cudnn" and mask.sequence_ids is None and window is None:
    lengths = {"key_value_seq_lengths": mask.input_mask.sum(axis=-1, dtype=jnp.int32)}
    return {**lengths, "is_causal": True} if causal else lengths
  return {"mask": mask.dense(causal, window)}


def reference_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
                        config: BertConfig, *,
                        dropout: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """The paper's attention: float32 scores and softmax, dropout on the probabilities.

  Args:
    query, key, value: [batch, seq, heads, head_dim] in the compute dtype.
    mask: [batch, 1, seq, seq] bool, True where query q may attend to key k
      (`AttentionMask.dense`).
    config: the model's BertConfig (head_dim, compute dtype).
    dropout: applied to the [batch, heads, seq, seq] float32 probabilities (the calling
      module's Dropout, which draws from its 'dropout' rng).
  Returns:
    [batch, seq, heads, head_dim] in the compute dtype.
  """
  # [batch, q, heads, head_dim] x [batch, k, heads, head_dim] -> [batch, heads, q, k]
  scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(config.head_dim))
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)  # mask broadcasts over heads
  probs = dropout(jax.nn.softmax(scores, axis=-1))  # float32
  # [batch, heads, q, k] x [batch, k, heads, head_dim] -> [batch, q, heads, head_dim]
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(config.compute_dtype), value)


def local_blocks(seq: int, window: int) -> int:
  """The block length `local_attention` splits a sequence into (the window itself, so a
  query's keys lie in its own block and the two beside it), or 0 where it does not pay or fit:
  a sequence of at most 4 blocks, or one the blocks do not divide."""
  return window if window >= 1 and seq % window == 0 and seq > 4 * window else 0


def local_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: AttentionMask,
                    window: int) -> jax.Array:
  """Attention within a window of `window` keys a side, computed block by block: each block
  of `window` queries scores only its own block of keys and the two beside it ([3 window]
  keys, not seq), so a local layer costs O(seq window), not O(seq^2). The same outputs as
  dense attention under `AttentionMask.dense(window=window)` (float32 scores and softmax,
  in plain XLA, which partitions it itself): keys of the query's own sequence (packed) or
  real keys (unpacked), and itself.

  Args:
    query, key, value: [batch, seq, heads, head_dim]; seq a multiple of window
      (`local_blocks`).
    mask: the batch's AttentionMask.
    window: the keys' distance at most.
  Returns:
    [batch, seq, heads, head_dim] in the query's dtype.
  """
  batch, seq, heads, head_dim = query.shape
  n = seq // window

  def neighbours(x: jax.Array) -> jax.Array:
    """[batch, seq, ...] -> [batch, n, 3 window, ...]: each block's previous, own and next
    block of keys (zeros beyond the ends)."""
    blocks = x.reshape(x.shape[0], n, window, *x.shape[2:])
    edge = jnp.zeros_like(blocks[:, :1])
    return jnp.concatenate([jnp.concatenate([edge, blocks[:, :-1]], 1), blocks,
                            jnp.concatenate([blocks[:, 1:], edge], 1)], 2)

  positions = jnp.arange(seq, dtype=jnp.int32)[None]  # [1, seq]
  query_positions = positions.reshape(1, n, window)  # [1, n, window]
  # Keys beyond the ends get position -2 seq, out of every window.
  key_positions = neighbours(positions + 2 * seq) - 2 * seq  # [1, n, 3 window]
  ids = mask.segment_ids()  # [batch, seq]: sequence ids packed, input_mask unpacked
  key_ids = neighbours(ids)  # [batch, n, 3 window]
  query_ids = ids.reshape(batch, n, window)
  near = jnp.abs(query_positions[..., :, None] - key_positions[..., None, :]) <= window
  if mask.sequence_ids is not None:
    same = query_ids[..., :, None] == key_ids[..., None, :]  # packed: own sequence
  else:
    same = key_ids[..., None, :] > 0  # unpacked: real keys
  itself = query_positions[..., :, None] == key_positions[..., None, :]
  allowed = (near & same) | itself  # [batch, n, window, 3 window]
  # [b, n, q, h, d] x [b, n, k, h, d] -> [b, n, h, q, k], float32
  scores = jnp.einsum("bnqhd,bnkhd->bnhqk", query.reshape(batch, n, window, heads, head_dim),
                      neighbours(key), preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(head_dim))
  scores = jnp.where(allowed[:, :, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(query.dtype)
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", probs, neighbours(value))
  return out.reshape(batch, seq, heads, head_dim)


def attend(query: jax.Array, key: jax.Array, value: jax.Array, mask: AttentionMask,
           config: BertConfig, *, dropout: Callable[[jax.Array], jax.Array],
           window: int | None = None) -> jax.Array:
  """Multi-head attention on the path `resolve_attention` picks for this backend and length.

  Every path attends each query to the keys `mask` allows (and, in a causal model, only to
  those at or before it; in a local layer, only to those at most `window` away) and gives the
  same outputs at real tokens.

  Args:
    query, key, value: [batch, seq, heads, head_dim] in the compute dtype.
    mask: the batch's AttentionMask.
    config: the model's BertConfig (attention, causal, head_dim, compute dtype).
    dropout: the attention-probability dropout, which only the 'reference' path applies (a
      fused path is chosen only when attention_dropout_rate is 0).
    window: a local layer's window (`BertConfig.window`); None attends globally.
  Returns:
    [batch, seq, heads, head_dim], the heads' contexts before the output projection.
  """
  implementation = resolve_attention(config, seq_len=query.shape[1])
  if implementation == "reference":
    return reference_attention(query, key, value, mask.dense(config.causal, window), config,
                               dropout=dropout)
  if implementation == "splash":
    return per_shard(functools.partial(splash_attention, causal=config.causal, window=window),
                     query, key, value, mask)
  if window is not None and not config.causal:
    # A local layer on 'xla' or 'cudnn': the fused banded kernel or block by block in XLA
    # (cuDNN's window is one-sided, and a dense band would cost every global layer's work).
    if banded_attention.use_banded(config.local_kernel, query.shape[1], window, query.shape[-1]):
      return per_shard(functools.partial(banded_attention.banded_local_attention, window=window),
                       query, key, value, mask)  # a custom call, which XLA cannot split
    if local_blocks(query.shape[1], window):
      return local_attention(query, key, value, mask, window)

  if implementation == "cudnn" and packed_cudnn.takes(mask, config.causal, window):
    return per_shard(packed_cudnn.attention, query, key, value, mask)  # a custom call

  def dot_product_attention(query, key, value, mask):  # [batch, seq, heads, head_dim] in and out
    return jax.nn.dot_product_attention(
        query, key, value, implementation=implementation,
        **dot_product_attention_kwargs(mask, implementation, config.causal, window))

  if implementation == "cudnn":  # a custom call, which XLA cannot split
    return per_shard(dot_product_attention, query, key, value, mask)
  return dot_product_attention(query, key, value, mask)  # plain HLO, which XLA splits itself


# The mesh axes the batch and the heads are split over (bertjax.training.parallel's
# LOGICAL_RULES: 'batch' over data x fsdp, 'heads' over tensor).
BATCH_AXES, HEADS_AXES = ("data", "fsdp"), ("tensor",)


def per_shard(kernel: Callable[..., jax.Array], query: jax.Array, key: jax.Array,
              value: jax.Array, mask: AttentionMask) -> jax.Array:
  """`kernel(query, key, value, mask)` run by each device on its own rows and heads.

  A fused kernel is a custom call XLA's partitioner cannot split (on a mesh it would gather the
  whole query, key and value onto every device, or fail). Under a context mesh (set by
  `bertjax.training.steps` while tracing) it runs in `jax.shard_map` on each device's block:
  the batch and the mask's rows over BATCH_AXES, the heads over HEADS_AXES; an axis the mesh
  lacks or that does not divide its dimension is not split. Without one it is called as it is.

  Args:
    kernel: (query, key, value, mask) -> the attention output, for any batch and head count.
    query, key, value: [batch, seq, heads, head_dim].
    mask: the batch's AttentionMask ([batch, ...] arrays).
  Returns:
    [batch, seq, heads, head_dim], the kernel's output.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(query, key, value, mask)

  def split(size: int, axes: tuple[str, ...]) -> tuple[str, ...] | None:
    axes = tuple(a for a in axes if a in mesh.axis_names)
    return axes if axes and size % math.prod(mesh.shape[a] for a in axes) == 0 else None

  batch, heads = split(query.shape[0], BATCH_AXES), split(query.shape[2], HEADS_AXES)
  spec = P(batch, None, heads, None)  # [batch, seq, heads, head_dim]
  # check_vma=False: a Pallas kernel's outputs do not say how they vary over the mesh.
  return jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec, P(batch, None)),
                       out_specs=spec, check_vma=False)(query, key, value, mask)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: AttentionMask, *,
                     causal: bool = False, window: int | None = None,
                     interpret: bool = False) -> jax.Array:
  """Multi-head attention by the Pallas splash-attention kernel (TPU), block-diagonal by segment.

  The kernel takes one example's [heads, seq, head_dim] and does not scale the logits, so the
  query is scaled by 1/sqrt(head_dim) here and the kernel is vmapped over the batch. It is made
  for the arrays it is given: `attend` calls this per shard (`per_shard`), so on a mesh it is
  made for one device's rows and heads. Its mask is
  full (or, causal, the kernel's CausalMask, which also skips the blocks above the diagonal;
  in a local layer its LocalMask of `window` keys a side, which skips the blocks outside the band);
  which sequence a query may attend comes from SegmentIds (`AttentionMask.segment_ids`), which
  the kernel applies in every block.

  Args:
    query, key, value: [batch, seq, heads, head_dim] in the compute dtype; seq a multiple of 128.
    mask: the batch's AttentionMask.
    causal: keys after the query are hidden too (BertConfig.causal).
    window: keys more than this far from the query are hidden too (a local layer).
    interpret: run the kernel in the Pallas interpreter (any backend, slow: for tests).
  Returns:
    [batch, seq, heads, head_dim].
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only kernel

  batch, seq, heads, head_dim = query.shape
  if seq % SPLASH_MULTIPLE:
    raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, got "
                     f"{seq}; pad the sequences to a multiple of 128 or use attention=auto.")
  block = next(b for b in (512, 256, 128) if seq % b == 0)  # the largest tile that divides seq
  if window is not None:
    head_mask = splash.LocalMask((seq, seq), window_size=(window, 0 if causal else window),
                                 offset=0)
  else:
    head_mask = (splash.CausalMask if causal else splash.FullMask)((seq, seq))
  kernel = splash.make_splash_mha(
      splash.MultiHeadMask([head_mask] * heads),
      block_sizes=splash.BlockSizes(
          block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block),
      head_shards=1, q_seq_shards=1, interpret=interpret)
  # [batch, seq, heads, head_dim] -> [batch, heads, seq, head_dim]
  to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)
  query = to_heads_first(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype))
  ids = mask.segment_ids()  # [batch, seq]
  out = jax.vmap(lambda q, k, v, i: kernel(q, k, v, segment_ids=splash.SegmentIds(q=i, kv=i)))(
      query, to_heads_first(key), to_heads_first(value), ids)
  return to_heads_first(out)  # [batch, heads, seq, head_dim] -> [batch, seq, heads, head_dim]
