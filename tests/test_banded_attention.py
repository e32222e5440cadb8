"""bertjax.models.banded_attention, the fused Pallas kernel of a local layer, in the Pallas
interpreter on CPU: its outputs equal attention.local_attention's (the XLA blocks) and the
reference attention under the dense banded mask at every real token, packed and unpacked, in
float32 and bfloat16, and so do its gradients; a window wider than a block and a head_dim that is
not a power of two; the fit rule, and which kernel a local layer runs (BertConfig.local_kernel),
through a ModernBERT model too. The kernels lower to Triton IR here; on a GPU they run compiled
(the last test)."""
import dataclasses
import functools
import json
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.modeldir import model_files
from bertjax.models import attention, banded_attention, heads
from bertjax.models.config import bert_config
from bertjax.tools import bench_batch

from attention_helpers import _assert_trees_close, assert_close, jit

ON_GPU = jax.default_backend() == "gpu"


def _mask(batch, seq, packed):
  """An AttentionMask over [batch, seq] rows: packed, sequences that start mid-block and padding
  after them; unpacked, a row padded from 45 and a full one. Returns (mask, real [batch, seq])."""
  ids = np.zeros((batch, seq), np.int32)
  if packed:
    ids[0, :13], ids[0, 13:70], ids[0, 70:seq - 9] = 1, 2, 3
    ids[1, :7], ids[1, 7:seq] = 1, 2
  else:
    ids[0, :45], ids[1, :] = 1, 1
  mask = attention.AttentionMask(jnp.asarray(ids > 0, jnp.int32),
                                 jnp.asarray(ids) if packed else None)
  return mask, ids > 0


def _outputs_and_grads(attend, q, k, v, cotangent):
  """(out, (dq, dk, dv)) of `attend`, the gradients of <out, cotangent>."""
  out, vjp = jax.vjp(attend, q, k, v)
  return out, vjp(cotangent.astype(out.dtype))


def _compare(shape, window, block, packed, dtype, tol, xla_blocks=True):
  """The kernel (interpreter) against the dense reference (and the XLA blocks): outputs at real
  tokens, and the gradients of a cotangent that is zero at padding."""
  q, k, v = (jax.random.normal(jax.random.key(i), shape, dtype) for i in range(3))
  mask, real = _mask(shape[0], shape[1], packed)
  cotangent = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]
  config = bert_config("tiny", hidden_size=shape[2] * shape[3], num_heads=shape[2])  # float32
  kernel = lambda q, k, v: banded_attention.banded_local_attention(q, k, v, mask, window=window,
                                                                   interpret=True)
  if block != banded_attention.BLOCK:
    query_ids, key_ids = banded_attention.local_ids(mask)
    kernel = lambda q, k, v: banded_attention.banded_attention(
        q, k, v, query_ids, key_ids, window, block=block, interpret=True)
  f32 = lambda x: x.astype(jnp.float32)
  # the reference in float32 from the same (rounded) inputs
  dense = lambda q, k, v: attention.reference_attention(
      f32(q), f32(k), f32(v), mask.dense(window=window), config, dropout=lambda p: p)
  paths = {"kernel": kernel, "dense": dense}
  if xla_blocks:
    paths["blocks"] = lambda q, k, v: attention.local_attention(q, k, v, mask, window)
  with jax.default_matmul_precision("highest"):
    results = jit(lambda: {name: _outputs_and_grads(f, q, k, v, cotangent)
                           for name, f in paths.items()})()
  out, grads = results.pop("kernel")
  assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
  for name, (expected, expected_grads) in results.items():
    assert_close(np.asarray(f32(out))[real], np.asarray(f32(expected))[real], tol, name)
    _assert_trees_close(jax.tree.map(f32, grads), jax.tree.map(f32, expected_grads), tol)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_the_kernel_equals_the_xla_blocks_and_the_dense_band(packed):
  """float32, 4 blocks of 64, a window of 32 (the band meets 3 key blocks)."""
  _compare((2, 256, 2, 16), window=32, block=64, packed=packed, dtype=jnp.float32, tol=1e-5)


def test_a_window_wider_than_a_block_and_a_padded_head_dim():
  """Blocks of 32 and a window of 40 (5 key blocks, cut at both ends), head_dim 24 (padded to
  32 inside), packed: the dense band (the XLA blocks do not take a window that does not divide
  the sequence)."""
  _compare((2, 128, 2, 24), window=40, block=32, packed=True, dtype=jnp.float32, tol=1e-5,
           xla_blocks=False)


def test_bfloat16_is_the_float32_band_to_bfloat16_rounding():
  _compare((2, 128, 2, 32), window=32, block=64, packed=True, dtype=jnp.bfloat16, tol=3e-2)


def test_the_fit_rule_and_the_choice_of_kernel():
  fits = banded_attention.banded_fits
  assert fits(1024, 64, 64) and fits(64, 1, 256)
  assert not fits(1000, 64, 64) and not fits(1024, 0, 64) and not fits(1024, 64, 512)
  use = banded_attention.use_banded
  # 'auto' keeps the XLA blocks on every backend until a GPU has measured the kernel
  assert not use("auto", 1024, 64, 64, backend="gpu") and not use("auto", 1024, 64, 64, "cpu")
  assert use("pallas", 1024, 64, 64, backend="cpu") and not use("xla", 1024, 64, 64, "gpu")
  assert not use("pallas", 1000, 64, 64, backend="gpu")  # the XLA blocks take it
  ids = jnp.ones((1, 96), jnp.int32)
  x = jnp.zeros((1, 96, 1, 16))
  with pytest.raises(ValueError, match="multiple of 64"):
    banded_attention.banded_attention(x, x, x, ids, ids, 8, interpret=True)


def test_the_local_kernel_is_a_run_choice_not_in_bert_config_json():
  config = bert_config("tiny", architecture="modernbert", local_kernel="pallas")
  assert "local_kernel" not in json.loads(model_files.bert_config_json(config))
  with pytest.raises(ValueError, match="local_kernel='triton'; use one of"):
    bert_config("tiny", architecture="modernbert", local_kernel="triton")


# The tiny ModernBERT of tests/test_modernbert_paths.py: layers 1 and 2 local, window 2 a side.
MODERNBERT = bert_config("tiny", architecture="modernbert", vocab_size=101, num_layers=4,
                         hidden_size=32, num_heads=2, intermediate_size=48, local_attention=4,
                         initializer_range=0.2, hidden_act="gelu_tanh", attention="xla")


@pytest.mark.parametrize("choice, pallas_calls", [("auto", 0), ("pallas", 3)])
def test_a_local_layer_runs_the_kernel_it_is_given(choice, pallas_calls):
  """What attention.attend traces for a local layer of 128 tokens: on this CPU 'auto' keeps
  the XLA blocks, 'pallas' the kernel's three pallas_calls (forward; dq; dk and dv)."""
  config = dataclasses.replace(MODERNBERT, local_kernel=choice)
  x = jnp.zeros((1, 128, 2, 16))
  mask = attention.AttentionMask(jnp.ones((1, 128), jnp.int32))
  attend = lambda q: attention.attend(q, x, x, mask, config, dropout=None, window=2).sum()
  text = str(jax.make_jaxpr(jax.grad(attend))(x))
  assert text.count("pallas_call") == pallas_calls


def test_modernbert_with_the_kernel_equals_the_xla_blocks():
  """The whole tiny ModernBERT on packed rows of 128 tokens, its local layers by the kernel
  (interpreter): the MLM logits of the XLA blocks."""
  batch = bench_batch.make_batch(MODERNBERT.vocab_size, batch_size=2, seq_len=128, max_predictions=6,
                           packing=2)
  batch["input_mask"][1, 100:], batch["sequence_ids"][1, 100:] = 0, 0
  models = {kernel: heads.BertForPreTraining(
      dataclasses.replace(MODERNBERT, local_kernel=kernel), next_sentence=False)
      for kernel in ("xla", "pallas")}
  params = nn.unbox(jit(lambda key: heads.init_from_batch(models["xla"], key, batch))(
      jax.random.key(0)))
  calls = mock.Mock(wraps=banded_attention.banded_local_attention)
  with mock.patch.object(banded_attention, "banded_local_attention", calls):
    logits = jit(lambda: {k: heads.apply_to_batch(m, params, batch, deterministic=True)[0]
                          for k, m in models.items()})()
  assert calls.call_count == 2  # the two local layers
  real = slice(0, MODERNBERT.vocab_size)
  assert_close(logits["pallas"][..., real], logits["xla"][..., real], 1e-5)


def test_the_kernels_lower_to_triton_here():
  """The forward and both backward kernels lower for a GPU on this CPU (jax lowers a
  pallas_call to Triton IR without one, for compute capability 9.0): ModernBERT-base's local
  layer, bfloat16. Triton compiles that IR to PTX only on a GPU (the test below)."""
  shape = jax.ShapeDtypeStruct((2, 1024, 12, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((2, 1024), jnp.int32)
  loss = lambda q, k, v, i: banded_attention.banded_attention(q, k, v, i, i, 64).sum()
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  text = step.trace(shape, shape, shape, ids).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 3


@pytest.mark.skipif(not ON_GPU, reason="the Triton kernel needs a GPU")
def test_on_a_gpu_the_compiled_kernel_equals_the_xla_blocks():
  """ModernBERT-base's local layer (window 64 a side, head_dim 64) in bfloat16 at 1,024 tokens,
  packed, compiled by Triton: the XLA blocks' outputs and gradients."""
  shape, window = (2, 1024, 4, 64), 64
  q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(3))
  ids = np.zeros(shape[:2], np.int32)
  ids[0, :300], ids[0, 300:1000], ids[1, :] = 1, 2, 1
  mask = attention.AttentionMask(jnp.asarray(ids > 0, jnp.int32), jnp.asarray(ids))
  real = ids > 0
  cotangent = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]
  f32 = lambda x: np.asarray(x.astype(jnp.float32))
  kernel = functools.partial(banded_attention.banded_local_attention, mask=mask, window=window,
                             interpret=False)
  blocks = lambda q, k, v: attention.local_attention(q, k, v, mask, window)
  (out, grads), (expected, expected_grads) = jax.jit(lambda: (
      _outputs_and_grads(kernel, q, k, v, cotangent),
      _outputs_and_grads(blocks, q, k, v, cotangent)))()
  assert_close(f32(out)[real], f32(expected)[real], 3e-2)
  for grad, expected_grad in zip(grads, expected_grads):
    assert_close(f32(grad), f32(expected_grad), 3e-2)
