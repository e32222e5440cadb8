"""A local layer's attention as one fused Pallas kernel (GPU, Triton): banded attention with
segment ids, forward and backward, and the rule of when `attention.attend` runs it.

ModernBERT's local layers attend keys at most `window` positions away on either side, within the
query's own sequence. `attention.local_attention` computes that block by block in plain XLA
(float32 scores of three key blocks per query block, written out, softmax, then the values);
`banded_attention` here is a flash-attention kernel (the pattern of jax's own
jax/experimental/pallas/ops/gpu/attention.py, restricted to a band): a grid over (batch, heads,
query blocks), each program streaming only the key blocks that meet its queries' band through an
online softmax in float32, so no score leaves the chip. It saves each query's logsumexp, and the
backward pass (a `jax.custom_vjp`) recomputes the probabilities from it in two kernels: dq by
query blocks over their band of key blocks, dk and dv by key blocks over their band of query
blocks.

Who may attend to whom is exactly `local_attention`'s: query q attends key k iff
(|q - k| <= window and query_ids[q] == key_ids[k]) or q == k, where (`local_ids`) the ids are
the sequence ids packed, and ones for the queries against the input_mask for the keys unpacked
(real keys only). Every query attends at least itself, so no softmax row is empty.

Where it runs (`use_banded`, BertConfig.local_kernel): 'auto' on a GPU where the kernel fits
(`banded_fits`: a sequence of whole BLOCKs, head_dim up to 256), 'pallas' wherever it fits (off a
GPU in the Pallas interpreter: slow, for tests), 'xla' never; elsewhere the XLA blocks.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Query and key blocks of this many positions: a power of two that Triton's dot takes (>= 16),
# and for ModernBERT's window of 64 a side three key blocks per query block (192 keys scored for
# the 129 attended; 128-blocks would score 384).
BLOCK = 64
# The longest head_dim the kernel takes (rounded up to a power of two): a [BLOCK, 256] tile of
# each operand still fits a GPU's shared memory.
MAX_HEAD_DIM = 256
# A blocked score: finite (so a row whose first key block is all blocked has a finite maximum)
# and far below any real one; its probability is set to 0 besides.
_BLOCKED = -0.7 * float(np.finfo(np.float32).max)
_LOG2_E = math.log2(math.e)  # scores in base 2: e^x = 2^(x log2 e)


def banded_fits(seq: int, window: int, head_dim: int, block: int = BLOCK) -> bool:
  """Whether the kernel takes these shapes: seq a multiple of `block`, a window of at least one
  key a side, head_dim at most MAX_HEAD_DIM (padded to a power of two, at least 16)."""
  return seq % block == 0 and window >= 1 and 1 <= head_dim <= MAX_HEAD_DIM


def use_banded(choice: str, seq: int, window: int, head_dim: int,
               backend: str | None = None) -> bool:
  """Whether a local layer runs `banded_attention` (else the XLA blocks): BertConfig.local_kernel
  `choice` 'pallas' wherever it fits (off a GPU in the interpreter); 'xla' never; 'auto' not
  yet, on any backend: the kernel has not run on a GPU, so 'auto' keeps the XLA blocks until a
  GPU's test and A/B (`bertjax.tools.ab`'s pallas_local) show it right and faster; then 'auto'
  is to take it on a GPU where it fits. `backend`: None = `jax.default_backend()`."""
  if choice == "xla" or not banded_fits(seq, window, head_dim):
    return False
  del backend  # 'auto' will read it once a GPU has decided
  return choice == "pallas"


def local_ids(mask: Any) -> tuple[jax.Array, jax.Array]:
  """(query_ids, key_ids), [batch, seq] int32, such that equal ids may attend, of the batch's
  `attention.AttentionMask` `mask` (a module that imports this one): the sequence ids for both
  packed; unpacked ones for every query and the input_mask for the keys, so each query (padding
  too) attends the real keys, as `attention.local_attention` does."""
  if mask.sequence_ids is not None:
    ids = mask.sequence_ids.astype(jnp.int32)
    return ids, ids
  keys = (mask.input_mask != 0).astype(jnp.int32)
  return jnp.ones_like(keys), keys


def banded_local_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: Any, *,
                           window: int, interpret: bool | None = None) -> jax.Array:
  """A local layer's attention by the kernel, in the form `attention.per_shard` calls:
  `banded_attention` with the mask's `local_ids`. interpret: None = off a GPU."""
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  query_ids, key_ids = local_ids(mask)
  return banded_attention(query, key, value, query_ids, key_ids, window, interpret=interpret)


def banded_attention(query: jax.Array, key: jax.Array, value: jax.Array, query_ids: jax.Array,
                     key_ids: jax.Array, window: int, *, block: int = BLOCK,
                     interpret: bool = False) -> jax.Array:
  """Softmax attention within a band: q attends k iff (|q - k| <= window and
  query_ids[q] == key_ids[k]) or q == k; scores scaled by 1/sqrt(head_dim), softmax in float32.
  Differentiable in query, key and value (custom_vjp: the backward kernels).

  Args:
    query, key, value: [batch, seq, heads, head_dim], bfloat16 or float32; seq a multiple of
      `block` (`banded_fits`).
    query_ids, key_ids: [batch, seq] int, which keys each query's sequence holds (`local_ids`).
    window: the keys' distance at most.
    block: the query and key block length, a power of two >= 16.
    interpret: run the kernels in the Pallas interpreter (any backend, slow: for tests).
  Returns:
    [batch, seq, heads, head_dim] in the query's dtype.
  Raises:
    ValueError: shapes the kernel does not take.
  """
  seq, head_dim = query.shape[1], query.shape[3]
  if not banded_fits(seq, window, head_dim, block) or block < 16 or block & (block - 1):
    raise ValueError(f"banded attention needs a sequence length that is a multiple of {block} "
                     f"(a power of two >= 16), window >= 1 and head_dim <= {MAX_HEAD_DIM}; got "
                     f"seq {seq}, window {window}, head_dim {head_dim}.")
  padded = max(16, pl.next_power_of_2(head_dim))  # Triton's tiles: powers of two
  pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, padded - head_dim)))
  out = _banded(pad(query), pad(key), pad(value), query_ids.astype(jnp.int32),
                key_ids.astype(jnp.int32), window, block, 1.0 / math.sqrt(head_dim), interpret)
  return out[..., :head_dim]  # zero columns of value give zero columns out


def _allowed(query_block: jax.Array, key_block: jax.Array, query_ids: jax.Array,
             key_ids: jax.Array, window: int, block: int) -> jax.Array:
  """[block, block] bool: which keys of key block `key_block` the queries of `query_block` may
  attend; query_ids, key_ids: the blocks' [block] ids."""
  query_positions = (query_block * block + jnp.arange(block))[:, None]  # [block, 1]
  key_positions = (key_block * block + jnp.arange(block))[None, :]  # [1, block]
  near = jnp.logical_and(key_positions - query_positions <= window,
                         query_positions - key_positions <= window)
  same = query_ids[:, None] == key_ids[None, :]
  return jnp.logical_or(jnp.logical_and(near, same), query_positions == key_positions)


def _band(index: jax.Array, blocks: int, window: int, block: int) -> tuple[jax.Array, jax.Array]:
  """[first, end) of the blocks whose positions lie within `window` of block `index`'s (the
  same either way, the band being symmetric)."""
  reach = -(-window // block)
  return jnp.maximum(index - reach, 0), jnp.minimum(index + reach + 1, blocks)


def _scores(q: jax.Array, k: jax.Array, allowed: jax.Array, scale: float) -> jax.Array:
  """[block, block] float32 scores q k^T * scale in base 2, `_BLOCKED` where not allowed."""
  scores = plgpu.dot(q, k.T) * (scale * _LOG2_E)
  return jnp.where(allowed, scores, _BLOCKED)


def _forward_kernel(q_ref, k_ref, v_ref, query_ids_ref, key_ids_ref, o_ref, lse_ref, *,
                    window: int, block: int, scale: float):
  """One (batch, head, query block): the online softmax over the band's key blocks.
  Refs: q [block, d], k and v [seq, d], query ids [block], key ids [seq]; out o [block, d] and
  lse [block] (the base-2 logsumexp of each query's scores)."""
  i = pl.program_id(2)
  q, query_ids = q_ref[...], query_ids_ref[...]

  def step(j, carry):  # key block j
    acc, top, total = carry  # [block, d], [block], [block] float32
    keys = pl.ds(j * block, block)
    allowed = _allowed(i, j, query_ids, key_ids_ref[keys], window, block)
    scores = _scores(q, k_ref[keys, :], allowed, scale)
    new_top = jnp.maximum(top, jnp.max(scores, axis=-1))
    probs = jnp.where(allowed, jnp.exp2(scores - new_top[:, None]), 0.0)
    correction = jnp.exp2(top - new_top)
    v = v_ref[keys, :]
    acc = correction[:, None] * acc + plgpu.dot(probs.astype(v.dtype), v)
    return acc, new_top, correction * total + jnp.sum(probs, axis=-1)

  acc = jnp.zeros((block, q.shape[-1]), jnp.float32)
  top = jnp.full((block,), -jnp.inf, jnp.float32)
  first, end = _band(i, k_ref.shape[0] // block, window, block)
  acc, top, total = jax.lax.fori_loop(first, end, step, (acc, top, jnp.zeros_like(top)))
  o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)
  lse_ref[...] = top + jnp.log2(total)  # the query itself is allowed, so total >= its own term


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, query_ids_ref, key_ids_ref,
               dq_ref, *, window: int, block: int, scale: float):
  """One (batch, head, query block): dq over the band's key blocks. Refs: q, do [block, d];
  k, v [seq, d]; lse, delta, query ids [block]; key ids [seq]; out dq [block, d]."""
  i = pl.program_id(2)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  query_ids = query_ids_ref[...]

  def step(j, dq):  # key block j
    keys = pl.ds(j * block, block)
    allowed = _allowed(i, j, query_ids, key_ids_ref[keys], window, block)
    k = k_ref[keys, :]
    probs = jnp.where(allowed, jnp.exp2(_scores(q, k, allowed, scale) - lse[:, None]), 0.0)
    d_scores = probs * (plgpu.dot(do, v_ref[keys, :].T) - delta[:, None])  # [block, block]
    return dq + plgpu.dot(d_scores.astype(k.dtype), k)

  first, end = _band(i, k_ref.shape[0] // block, window, block)
  dq = jax.lax.fori_loop(first, end, step, jnp.zeros((block, q.shape[-1]), jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, query_ids_ref, key_ids_ref,
                dk_ref, dv_ref, *, window: int, block: int, scale: float):
  """One (batch, head, key block): dk and dv over the band's query blocks. Refs: q, do
  [seq, d]; k, v [block, d]; lse, delta, query ids [seq]; key ids [block]; out dk, dv
  [block, d]."""
  j = pl.program_id(2)
  k, v, key_ids = k_ref[...], v_ref[...], key_ids_ref[...]

  def step(i, carry):  # query block i
    dk, dv = carry
    rows = pl.ds(i * block, block)
    allowed = _allowed(i, j, query_ids_ref[rows], key_ids, window, block)
    q, do = q_ref[rows, :], do_ref[rows, :]
    probs = jnp.where(allowed, jnp.exp2(_scores(q, k, allowed, scale) - lse_ref[rows][:, None]),
                      0.0)  # [block(q), block(k)]
    dv = dv + plgpu.dot(probs.astype(do.dtype).T, do)
    d_scores = probs * (plgpu.dot(do, v.T) - delta_ref[rows][:, None])
    return dk + plgpu.dot(d_scores.astype(q.dtype).T, q), dv

  zeros = jnp.zeros((block, k.shape[-1]), jnp.float32)
  first, end = _band(j, q_ref.shape[0] // block, window, block)
  dk, dv = jax.lax.fori_loop(first, end, step, (zeros, zeros))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _specs(seq: int, head_dim: int, block: int) -> dict[str, pl.BlockSpec]:
  """The BlockSpecs of the grid (batch b, head h, block n): a block of n or the whole sequence,
  of [batch, seq, heads, head_dim] heads, [batch, heads, seq] statistics or [batch, seq] ids."""
  return {
      "heads_block": pl.BlockSpec((None, block, None, head_dim), lambda b, h, n: (b, n, h, 0)),
      "heads_all": pl.BlockSpec((None, seq, None, head_dim), lambda b, h, n: (b, 0, h, 0)),
      "stats_block": pl.BlockSpec((None, None, block), lambda b, h, n: (b, h, n)),
      "stats_all": pl.BlockSpec((None, None, seq), lambda b, h, n: (b, h, 0)),
      "ids_block": pl.BlockSpec((None, block), lambda b, h, n: (b, n)),
      "ids_all": pl.BlockSpec((None, seq), lambda b, h, n: (b, 0)),
  }


def _call(kernel, inputs: list[str], outputs: list[str], out_shape, q: jax.Array, block: int,
          interpret: bool, name: str, **params):
  """pl.pallas_call of `kernel` over the grid (batch, heads, seq / block), with the `_specs`
  named by `inputs` and `outputs`."""
  batch, seq, heads, head_dim = q.shape
  specs = _specs(seq, head_dim, block)
  return pl.pallas_call(
      functools.partial(kernel, block=block, **params), out_shape=out_shape,
      grid=(batch, heads, seq // block), in_specs=[specs[s] for s in inputs],
      out_specs=[specs[s] for s in outputs], interpret=interpret, name=name,
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2))


def _forward(q, k, v, query_ids, key_ids, window, block, scale, interpret):
  """(out [batch, seq, heads, d], lse [batch, heads, seq] float32) by the forward kernel."""
  batch, seq, heads, _ = q.shape
  call = _call(_forward_kernel, ["heads_block", "heads_all", "heads_all", "ids_block", "ids_all"],
               ["heads_block", "stats_block"],
               [jax.ShapeDtypeStruct(q.shape, q.dtype),
                jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)],
               q, block, interpret, "banded_attention_forward", window=window, scale=scale)
  out, lse = call(q, k, v, query_ids, key_ids)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _banded(q, k, v, query_ids, key_ids, window, block, scale, interpret):
  """`banded_attention` on head_dim-padded heads; `scale` is 1/sqrt(the real head_dim)."""
  return _forward(q, k, v, query_ids, key_ids, window, block, scale, interpret)[0]


def _banded_forward(q, k, v, query_ids, key_ids, window, block, scale, interpret):
  out, lse = _forward(q, k, v, query_ids, key_ids, window, block, scale, interpret)
  return out, (q, k, v, query_ids, key_ids, out, lse)


def _banded_backward(window, block, scale, interpret, residuals, d_out):
  """dq, dk, dv by the two backward kernels (no gradient for the ids)."""
  q, k, v, query_ids, key_ids, out, lse = residuals
  # delta = rowsum(dO * O), each query's <dP, P>: [b, s, h, d] x [b, s, h, d] -> [b, h, s]
  delta = jnp.einsum("bshd,bshd->bhs", d_out.astype(jnp.float32), out.astype(jnp.float32))
  d_out = d_out.astype(q.dtype)
  params = dict(window=window, scale=scale)
  inputs = [q, k, v, d_out, lse, delta, query_ids, key_ids]
  [dq] = _call(_dq_kernel, ["heads_block", "heads_all", "heads_all", "heads_block",
                            "stats_block", "stats_block", "ids_block", "ids_all"],
               ["heads_block"], [jax.ShapeDtypeStruct(q.shape, q.dtype)], q, block, interpret,
               "banded_attention_dq", **params)(*inputs)
  dk, dv = _call(_dkv_kernel, ["heads_all", "heads_block", "heads_block", "heads_all",
                               "stats_all", "stats_all", "ids_all", "ids_block"],
                 ["heads_block", "heads_block"],
                 [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
                 q, block, interpret, "banded_attention_dkv", **params)(*inputs)
  return dq, dk, dv, None, None


_banded.defvjp(_banded_forward, _banded_backward)
