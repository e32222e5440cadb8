"""The attention kernels' calls against softmax attention by the dense mask
(bertjax.models.attention): the cudnn path's dot_product_attention arguments, unpacked and
packed; the cuDNN kernel itself on a GPU; the packed block-diagonal mask; and the splash kernel.

The cudnn path's arguments run here with jax's 'xla' implementation, and the splash kernel runs
in the Pallas interpreter, so both are checked without a GPU or a TPU; only
test_cudnn_kernel_honours_lengths_and_the_packed_mask_on_a_gpu needs a GPU (skipped without one);
tests/test_attention_shards.py runs the kernels per shard on a mesh.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import attention

from attention_helpers import UNPACKED_SEQ, _assert_trees_close, assert_close, jit, unpacked_batch


def reference_attention(q, k, v, mask: attention.AttentionMask):
  """Softmax attention by the dense mask: [batch, seq, heads, head_dim] q, k, v -> the same."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  probs = jax.nn.softmax(jnp.where(mask.dense(), scores, -np.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


@jit
def cudnn_arguments_by_xla(q, k, v, mask: attention.AttentionMask):
  return jax.nn.dot_product_attention(q, k, v, implementation="xla",
                                      **attention.dot_product_attention_kwargs(mask, "cudnn"))


def test_dot_product_attention_kwargs_give_the_reference_attention():
  """The cudnn path's arguments (key_value_seq_lengths unpacked, the block-diagonal mask
  packed), run by the xla implementation, equal the reference attention at every position."""
  q, k, v = (jax.random.normal(jax.random.key(i), (3, UNPACKED_SEQ, 2, 64)) for i in range(3))
  input_mask = unpacked_batch()["input_mask"]  # rows of 6, 9 and 5 real tokens
  sequence_ids = np.array([[1] * 4 + [2] * 5 + [0] * 3, [1] * 9 + [2] * 3, [1] * 12], np.int32)
  masks = {"unpacked": attention.AttentionMask(jnp.asarray(input_mask)),
           "packed": attention.AttentionMask(jnp.asarray(sequence_ids > 0, jnp.int32),
                                             jnp.asarray(sequence_ids))}
  for name, mask in masks.items():
    kwargs = attention.dot_product_attention_kwargs(mask, "cudnn")
    assert sorted(kwargs) == (["mask"] if name == "packed" else ["key_value_seq_lengths"])
    if name == "unpacked":
      np.testing.assert_array_equal(kwargs["key_value_seq_lengths"], [6, 9, 5])
      assert kwargs["key_value_seq_lengths"].dtype == jnp.int32
    assert_close(cudnn_arguments_by_xla(q, k, v, mask), jit(reference_attention)(q, k, v, mask),
                 1e-5, name)
    assert sorted(attention.dot_product_attention_kwargs(mask, "xla")) == ["mask"]


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs a GPU")
def test_cudnn_kernel_honours_lengths_and_the_packed_mask_on_a_gpu():
  """On a GPU: the cuDNN kernel with the cudnn path's arguments, bfloat16, gives the reference
  attention (float32 on the same inputs) and its gradients at real tokens, padded and packed; a
  kernel that attended across packed sequences or into the padding would be off by O(1). The
  same through `attention.per_shard` (jax.shard_map) on a mesh of one GPU, as steps.build
  traces it (more GPUs are not checked here)."""
  shape = (3, 128, 2, 64)
  one_gpu = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), devices=jax.devices()[:1],
                          axis_types=(jax.sharding.AxisType.Auto,) * 3)
  q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(3))
  lengths = np.array([100, 128, 37])
  input_mask = (np.arange(128) < lengths[:, None]).astype(np.int32)
  sequence_ids = np.zeros((3, 128), np.int32)
  sequence_ids[0, :50], sequence_ids[0, 50:120], sequence_ids[1], sequence_ids[2, :9] = 1, 2, 1, 1
  masks = {"unpacked": attention.AttentionMask(jnp.asarray(input_mask)),
           "packed": attention.AttentionMask(jnp.asarray(sequence_ids > 0, jnp.int32),
                                             jnp.asarray(sequence_ids))}
  for name, mask in masks.items():
    real = np.asarray(mask.input_mask, bool)
    weights = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]

    def cudnn(q, k, v, mask=mask):
      return jax.nn.dot_product_attention(q, k, v, implementation="cudnn",
                                          **attention.dot_product_attention_kwargs(mask, "cudnn"))

    def cudnn_per_shard(q, k, v):
      with jax.sharding.use_abstract_mesh(one_gpu.abstract_mesh):
        return attention.per_shard(cudnn, q, k, v, mask)

    def reference(q, k, v):
      f32 = lambda x: x.astype(jnp.float32)
      return reference_attention(f32(q), f32(k), f32(v), mask)

    def outputs_and_grads(attend):
      out, vjp = jax.vjp(attend, q, k, v)
      return out.astype(jnp.float32), [g.astype(jnp.float32) for g in vjp(
          weights.astype(out.dtype))]

    for kernel in (cudnn, cudnn_per_shard):
      (out, grads), (expected, expected_grads) = jax.jit(
          lambda: (outputs_and_grads(kernel), outputs_and_grads(reference)))()
      assert_close(np.asarray(out)[real], np.asarray(expected)[real], 2e-2, name)
      for g, e in zip(grads, expected_grads):
        g, e = np.asarray(g), np.asarray(e)
        assert_close(g[real], e[real], 5e-2, name)


def test_packed_attention_mask_exact():
  ids = jnp.array([[1, 1, 2, 0]], jnp.int32)
  expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], bool)
  mask = attention.AttentionMask(jnp.array([[1, 1, 1, 0]]), ids)
  np.testing.assert_array_equal(mask.dense(), expected[None, None])
  np.testing.assert_array_equal(mask.segment_ids(), ids)
  unpacked = attention.AttentionMask(jnp.array([[1, 1, 1, 0]]))
  np.testing.assert_array_equal(unpacked.dense(), attention.attention_mask(unpacked.input_mask))
  np.testing.assert_array_equal(unpacked.segment_ids(), [[1, 1, 1, 0]])


def test_splash_kernel_equals_reference_attention_in_the_interpreter():
  """The splash path's call (layout, 1/sqrt(d) scaling, segment ids, vmap over the batch), run
  by the Pallas interpreter: outputs and gradients equal the reference at real tokens, packed;
  outputs unpacked."""
  batch, seq, heads_, head_dim = 2, 128, 2, 16
  q, k, v = (jax.random.normal(jax.random.key(i), (batch, seq, heads_, head_dim))
             for i in range(3))
  sequence_ids = np.zeros((batch, seq), np.int32)
  sequence_ids[0, :50], sequence_ids[0, 50:90], sequence_ids[1, :100] = 1, 2, 1
  real = sequence_ids > 0
  packed = attention.AttentionMask(jnp.asarray(real, jnp.int32), jnp.asarray(sequence_ids))
  unpacked = attention.AttentionMask(jnp.asarray(real, jnp.int32))
  weights = jax.random.normal(jax.random.key(9), q.shape) * real[:, :, None, None]

  def splash(q, k, v, mask):
    return attention.splash_attention(q, k, v, mask, interpret=True)

  def outputs_and_grads(attend):  # packed: outputs and the gradients of sum(out * weights)
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, packed), q, k, v)
    return out, vjp(weights)

  (out, grads), (expected, expected_grads) = jit(
      lambda: (outputs_and_grads(splash), outputs_and_grads(reference_attention)))()
  assert_close(np.asarray(out)[real], np.asarray(expected)[real], 1e-5)
  _assert_trees_close(grads, expected_grads, 1e-5)
  out, expected = jit(lambda: (splash(q, k, v, unpacked), reference_attention(q, k, v, unpacked)))()
  assert_close(np.asarray(out)[real], np.asarray(expected)[real], 1e-5)
