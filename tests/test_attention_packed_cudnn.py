"""cuDNN over a packed batch with its sequences as segments (`bertjax.models.packed_cudnn`):
the segment tables made from rows that `bertjax.data.packed_rows` lays out, what a packed
train step hands the kernel (lowered for a GPU on this CPU: segments, no dense bias), and, on a
GPU, the kernel's outputs and gradients against the reference at every real token."""
import dataclasses
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import packed_rows
from bertjax.models import attention, heads, packed_cudnn

from attention_helpers import CONFIG, packed_batch, pretraining_loss

ON_GPU = jax.default_backend() == "gpu"
CUDNN = dataclasses.replace(CONFIG, attention="cudnn", dtype="bfloat16")


def _packed(lengths_per_row, seq=24, k=3):
  """A packed batch of examples of these lengths (None: an empty slot), by the data's packer."""
  slots = np.array([[n is not None for n in row] + [False] * (k - len(row))
                    for row in lengths_per_row])
  lengths = [n for row in lengths_per_row for n in row if n is not None]
  mask = np.zeros((len(lengths), seq), np.int32)
  for i, n in enumerate(lengths):
    mask[i, :n] = 1
  examples = {"input_ids": mask * 7, "segment_ids": np.zeros_like(mask), "input_mask": mask}
  return packed_rows.pack_examples(examples, slots)


def test_segments_are_the_packed_rows_sequences_and_mean_the_block_diagonal_mask():
  rows = [[5, 9, 4], [11, None, 6], [24], [3, 3]]
  batch = _packed(rows)
  mask = attention.AttentionMask(*(jnp.asarray(batch[k]) for k in (
      "input_mask", "sequence_ids", "cls_positions")))
  lengths, offsets = map(np.asarray, jax.jit(packed_cudnn.segments, static_argnums=1)(
      mask.sequence_ids, 3))
  expected_lengths = [[-1 if n is None else n for n in row] + [-1] * (3 - len(row))
                      for row in rows]
  np.testing.assert_array_equal(lengths, expected_lengths)
  assert offsets.shape == (4, 4) and (offsets[:, -1] == -1).all()
  present = lengths > 0
  np.testing.assert_array_equal(offsets[:, :3][present], batch["cls_positions"][present])
  np.testing.assert_array_equal(offsets[:, :3][~present], -1)
  # What jax's packed layout means (q attends k iff both lie in one [offset, offset + length)
  # span) is the block-diagonal mask at every real query.
  seq = batch["input_ids"].shape[1]
  spans = np.zeros((4, 3, seq), bool)
  for r, j in zip(*np.nonzero(present)):
    spans[r, j, offsets[r, j]:offsets[r, j] + lengths[r, j]] = True
  from_segments = np.einsum("bjq,bjk->bqk", spans, spans)
  dense = np.asarray(mask.dense())[:, 0]
  real = batch["input_mask"].astype(bool)
  np.testing.assert_array_equal(from_segments[real], dense[real])


def _hopper():
  """jax's cuDNN checks answered as on an H100/H200 with cuDNN 9.10, to lower for one here."""
  fused = packed_cudnn._fused_attention()  # pylint: disable=protected-access
  return mock.patch.multiple(fused, check_compute_capability=lambda capability: True,
                             check_cudnn_version=lambda: 91000)


def _lowered_step(config, batch):
  """The pretraining loss's gradient on `batch`, lowered for a GPU (text)."""
  model = heads.BertForPreTraining(config)

  def loss(params):
    return pretraining_loss(heads.apply_to_batch(model, params, batch, deterministic=True),
                            batch)

  with mock.patch.object(attention, "resolve_attention", lambda *a, **kw: config.attention):
    params = jax.eval_shape(lambda: nn.unbox(heads.init_from_batch(
        model, jax.random.key(0), batch)))
    return jax.jit(jax.grad(loss)).trace(params).lower(lowering_platforms=("cuda",)).as_text()


def test_a_packed_step_hands_cudnn_segments_and_no_dense_mask():
  """Each layer's forward and backward custom calls get the segment tables; no [rows, 1, seq,
  seq] bias is built, nor its gradient. Before: the block-diagonal mask as a bias."""
  batch, _ = packed_batch()
  rows, seq = batch["input_ids"].shape
  with _hopper():
    text = _lowered_step(CUDNN, batch)
    calls = [line for line in text.splitlines() if "__cudnn$fmha" in line]
    assert len(calls) == 2 * CONFIG.num_layers, calls  # forward and backward, each layer
    assert f"tensor<{rows}x1x{seq}x{seq}x" not in text
    assert all(f"tensor<{rows}x{2 + 1}xi32>" in line for line in calls)  # offsets [rows, k+1]
    with mock.patch.object(packed_cudnn, "takes", lambda *a: False):
      before = _lowered_step(CUDNN, batch)
  assert f"tensor<{rows}x1x{seq}x{seq}xbf16>" in before  # the dense bias


@pytest.mark.skipif(not ON_GPU, reason="cuDNN runs only on an NVIDIA GPU")
def test_on_a_gpu_packed_cudnn_equals_the_reference():
  """BERT-base's heads (12 x 64) in bfloat16 on 2 rows of 512 tokens holding 3 and 2 sequences
  and padding: outputs and gradients at the real tokens as the dense-mask reference's, zeros at
  the padding."""
  shape = (2, 512, 12, 64)
  q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(3))
  batch = _packed([[200, 150, 100], [300, 212]], seq=512)
  mask = attention.AttentionMask(*(jnp.asarray(batch[key]) for key in (
      "input_mask", "sequence_ids", "cls_positions")))
  real = batch["input_mask"].astype(bool)
  cotangent = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]
  f32 = lambda x: np.asarray(x.astype(jnp.float32))

  def outputs_and_grads(f):
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(cotangent.astype(out.dtype))

  kernel = lambda q, k, v: packed_cudnn.attention(q, k, v, mask)
  reference = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask.dense(),
                                                           implementation="xla")
  (out, grads), (expected, expected_grads) = jax.jit(
      lambda: (outputs_and_grads(kernel), outputs_and_grads(reference)))()
  np.testing.assert_allclose(f32(out)[real], f32(expected)[real], atol=3e-2)
  assert (f32(out)[~real] == 0).all()  # padding: zeros, nothing cuDNN left there
  for grad, want in zip(grads, expected_grads):
    np.testing.assert_allclose(f32(grad)[real], f32(want)[real], atol=3e-2)
