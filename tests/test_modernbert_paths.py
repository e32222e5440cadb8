"""ModernBERT (bertjax.models.modernbert) on every attention path, with its local window and
packing at once, and under remat, on a tiny float32 model on CPU: the xla path, the cudnn path's
arguments (run by jax's 'xla' implementation) and packed batches give the reference path's
outputs per example and the same gradients; the splash kernel with a local window equals the
dense banded attention in the Pallas interpreter; and on a GPU the cuDNN kernel does.
Parity with transformers' ModernBERT is tests/test_convert_modernbert*.py's."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from bertjax.models import attention, heads, modernbert
from bertjax.models.config import bert_config

from attention_helpers import (PREDICTIONS, _assert_trees_close, assert_close,
                               cudnn_run_by_xla, jit, packed_batch, unpacked_batch)

# 4 layers: 0 and 3 global, 1 and 2 local with a window of 2 keys a side, shorter than every
# example (5, 6 and 9 tokens); initializer_range 0.2 makes the logits O(1).
CONFIG = bert_config("tiny", architecture="modernbert", vocab_size=101, num_layers=4,
                     hidden_size=32, num_heads=2, intermediate_size=48, local_attention=4,
                     initializer_range=0.2, hidden_act="gelu_tanh", pad_vocab_to_multiple=128)
NUM_LABELS = 3


def mlm_loss(outputs, batch):
  mlm, _ = outputs
  ce = optax.softmax_cross_entropy_with_integer_labels
  return (ce(mlm, batch["masked_lm_ids"]) * batch["masked_lm_weights"]).sum()


def classification_loss(logits, batch):
  ce = optax.softmax_cross_entropy_with_integer_labels
  return (ce(logits, batch["label"]) * batch["example_weight"]).sum()


MODELS = {
    "pretraining": (lambda c: heads.BertForPreTraining(c, next_sentence=False), mlm_loss),
    "cls": (lambda c: heads.BertForSequenceClassification(c, NUM_LABELS), classification_loss),
    "mean": (lambda c: heads.BertForSequenceClassification(
        dataclasses.replace(c, pooling="mean"), NUM_LABELS), classification_loss),
}


@functools.cache
def _params(model_name):
  model = MODELS[model_name][0](CONFIG)
  return nn.unbox(jit(lambda key: heads.init_from_batch(model, key, unpacked_batch()))(
      jax.random.key(0)))


@functools.cache
def _run(model_name, path, **changes):
  """(outputs, gradients of the summed loss) on the unpacked and the packed batch."""
  make_model, loss_fn = MODELS[model_name]
  model = make_model(dataclasses.replace(CONFIG, attention="xla" if path == "cudnn" else path,
                                         **changes))

  def loss(params, batch):
    outputs = heads.apply_to_batch(model, params, batch, deterministic=True)
    return loss_fn(outputs, batch), outputs

  grad = jax.grad(loss, has_aux=True)
  batches = [unpacked_batch(), packed_batch()[0]]
  step = jit(lambda params, batches: [grad(params, b)[::-1] for b in batches])
  if path != "cudnn":
    return step(_params(model_name), batches)
  with cudnn_run_by_xla() as seen:
    results = step(_params(model_name), batches)
  # the global layers only (lengths unpacked, the mask packed): the local ones run blocks in XLA
  global_layers = [i for i in range(CONFIG.num_layers) if CONFIG.window(i) is None]
  assert seen == [["key_value_seq_lengths"]] * len(global_layers) + [["mask"]] * len(
      global_layers)
  return results


def _real(outputs):
  return [x[..., :CONFIG.vocab_size] if x.shape[-1] == CONFIG.padded_vocab_size else x
          for x in jax.tree.leaves(outputs)]


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_paths_and_packing_with_the_window_equal_the_reference(model_name):
  (outputs, expected_grads), _ = _run(model_name, "reference")
  expected = _real(outputs)
  packed, where = packed_batch()
  for path in ("reference", "xla", "cudnn"):
    (outputs, grads), (packed_outputs, packed_grads) = _run(model_name, path)
    if path != "reference":
      _assert_trees_close(_real(outputs), expected, 1e-5)
      _assert_trees_close(grads, expected_grads, 1e-5)
    packed_outputs = _real(packed_outputs)
    for example, (row, slot) in where.items():
      if model_name == "pretraining":
        predictions = slice(slot * PREDICTIONS, (slot + 1) * PREDICTIONS)
        assert_close(packed_outputs[0][row, predictions], expected[0][example], 1e-5, path)
      else:
        assert_close(packed_outputs[0][row, slot], expected[0][example], 1e-5, path)
    _assert_trees_close(packed_grads, expected_grads, 1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_local_attention_by_blocks_equals_the_dense_band(packed):
  """attention.local_attention (what 'xla' and 'cudnn' run in a local layer) equals softmax
  attention under the dense banded mask at every real token, and so do its gradients: padded
  rows, and packed rows whose sequences start mid-block."""
  shape, window = (2, 64, 2, 8), 4
  q, k, v = (jax.random.normal(jax.random.key(i), shape) for i in range(3))
  ids = np.zeros(shape[:2], np.int32)
  if packed:
    ids[0, :13], ids[0, 13:50], ids[1, :7], ids[1, 7:61] = 1, 2, 1, 2
  else:
    ids[0, :45], ids[1, :64] = 1, 1
  mask = attention.AttentionMask(jnp.asarray(ids > 0, jnp.int32),
                                 jnp.asarray(ids) if packed else None)
  assert attention.local_blocks(64, window) == window
  real = ids > 0
  weights = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]

  def outputs_and_grads(attend):
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(weights)

  with jax.default_matmul_precision("highest"):  # a GPU's default, TF32, is not 1e-5
    (out, grads), (expected, expected_grads) = jit(lambda: (
        outputs_and_grads(lambda q, k, v: attention.local_attention(q, k, v, mask, window)),
        outputs_and_grads(lambda q, k, v: _banded_reference(q, k, v, mask, window))))()
  assert_close(np.asarray(out)[real], np.asarray(expected)[real], 1e-5)
  _assert_trees_close(grads, expected_grads, 1e-5)


def test_the_window_and_the_rotary_base_matter():
  """Guards the tests above: a window wider than every example, or another local base, gives
  other logits (so the local layers do attend locally, with their own rotation)."""
  (expected, _), _ = _run("pretraining", "reference")
  for changes in (dict(local_attention=64), dict(rope_theta_local=500.0)):
    (outputs, _), _ = _run("pretraining", "reference", **changes)
    assert np.abs(np.asarray(outputs[0] - expected[0]))[..., :CONFIG.vocab_size].max() > 1e-3


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat):
  batch = unpacked_batch()

  def loss_and_grads(remat):
    model = heads.BertForPreTraining(dataclasses.replace(CONFIG, remat=remat, dropout_rate=0.1),
                                     next_sentence=False)

    def loss(params):
      outputs = heads.apply_to_batch(model, params, batch, deterministic=False,
                                     rngs={"dropout": jax.random.key(7)})
      return mlm_loss(outputs, batch)
    return jit(jax.value_and_grad(loss))(_params("pretraining"))

  (loss, grads), (expected_loss, expected_grads) = loss_and_grads(remat), loss_and_grads("none")
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  _assert_trees_close(grads, expected_grads, 1e-6)


def test_parameter_tree_is_the_documented_one():
  flat = {"/".join(k): v.shape
          for k, v in traverse_util.flatten_dict(_params("cls")).items()}
  H, F = CONFIG.hidden_size, CONFIG.intermediate_size
  assert flat["bert/embeddings/word_embeddings/embedding"] == (CONFIG.padded_vocab_size, H)
  assert "bert/encoder/layer_0/attention_layer_norm/scale" not in flat
  assert flat["bert/encoder/layer_1/attention_layer_norm/scale"] == (H,)
  assert flat["bert/encoder/layer_2/feed_forward/intermediate"] == (H, 2, F)
  assert flat["bert/final_layer_norm/scale"] == (H,)
  assert flat["bert/head/dense/kernel"] == (H, H)
  assert flat["sequence_classification/classifier/bias"] == (NUM_LABELS,)
  assert not [k for k in flat if k.startswith("bert/") and k.endswith("bias")]  # no biases


def _banded_reference(q, k, v, mask, window):
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  probs = jax.nn.softmax(jnp.where(mask.dense(window=window), scores, -np.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def _banded_batch(seq):
  sequence_ids = np.zeros((2, seq), np.int32)
  sequence_ids[0, :50], sequence_ids[0, 50:90], sequence_ids[1, :100] = 1, 2, 1
  real = sequence_ids > 0
  return real, {"packed": attention.AttentionMask(jnp.asarray(real, jnp.int32),
                                                  jnp.asarray(sequence_ids)),
                "unpacked": attention.AttentionMask(jnp.asarray(real, jnp.int32))}


def test_splash_with_a_local_window_equals_banded_attention_in_the_interpreter():
  """splash_attention's LocalMask with segment ids, by the Pallas interpreter: the dense banded
  attention at real tokens, packed and unpacked, and its gradients packed."""
  shape, window = (2, 128, 2, 16), 8
  q, k, v = (jax.random.normal(jax.random.key(i), shape) for i in range(3))
  real, masks = _banded_batch(shape[1])
  weights = jax.random.normal(jax.random.key(9), shape) * real[:, :, None, None]
  for name, mask in masks.items():
    def outputs_and_grads(attend):
      out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v), q, k, v)
      return out, vjp(weights)
    splash = lambda q, k, v: attention.splash_attention(q, k, v, mask, window=window,
                                                        interpret=True)
    banded = lambda q, k, v: _banded_reference(q, k, v, mask, window)
    (out, grads), (expected, expected_grads) = jit(
        lambda: (outputs_and_grads(splash), outputs_and_grads(banded)))()
    assert_close(np.asarray(out)[real], np.asarray(expected)[real], 1e-5, name)
    _assert_trees_close(grads, expected_grads, 1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs a GPU")
def test_cudnn_with_a_local_window_equals_banded_attention_on_a_gpu():
  """On a GPU: cuDNN with the cudnn path's arguments for a local layer (the band as a mask),
  bfloat16, gives the banded attention in float32 at real tokens, packed and unpacked."""
  shape, window = (2, 128, 2, 64), 8
  q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(3))
  real, masks = _banded_batch(shape[1])
  for name, mask in masks.items():
    out = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, implementation="cudnn",
        **attention.dot_product_attention_kwargs(mask, "cudnn", window=window)))(q, k, v)
    f32 = lambda x: x.astype(jnp.float32)
    expected = _banded_reference(f32(q), f32(k), f32(v), mask, window)
    assert_close(np.asarray(f32(out))[real], np.asarray(expected)[real], 2e-2, name)


def test_mean_pooling_reads_only_each_sequences_real_tokens():
  x = jnp.arange(2 * 4 * 1, dtype=jnp.float32).reshape(2, 4, 1)
  input_mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]])
  np.testing.assert_allclose(modernbert.pool(x, input_mask, "mean")[:, 0], [0.5, 5.5])
  sequence_ids = jnp.array([[1, 1, 2, 0], [1, 2, 2, 2]])
  packed = modernbert.pool(x, input_mask, "mean", sequence_ids, jnp.array([[0, 2], [0, 1]]))
  np.testing.assert_allclose(packed[..., 0], [[0.5, 2.0], [4.0, 6.0]])


def test_the_model_on_splash_with_a_local_mask_equals_the_reference():
  """The whole ModernBERT by the splash path (its kernel in the Pallas interpreter, with a
  LocalMask in the local layers) on packed rows of 128 tokens: the reference path's MLM logits
  and gradients."""
  from unittest import mock  # pylint: disable=import-outside-toplevel
  from bertjax.tools import bench  # pylint: disable=import-outside-toplevel
  batch = bench.make_batch(CONFIG.vocab_size, batch_size=2, seq_len=128, max_predictions=6,
                           packing=2)
  batch["input_mask"][1, 100:] = 0  # and padding after the second row's sequences
  batch["sequence_ids"][1, 100:] = 0
  params = _params("pretraining")

  def outputs_and_grads(path):
    model = heads.BertForPreTraining(dataclasses.replace(CONFIG, attention=path),
                                     next_sentence=False)

    def loss(params):
      outputs = heads.apply_to_batch(model, params, batch, deterministic=True)
      return mlm_loss(outputs, batch), outputs
    return jax.grad(loss, has_aux=True)(params)[::-1]

  kernel = functools.partial(attention.splash_attention, interpret=True)
  with mock.patch.object(attention, "resolve_attention", lambda *a, **k: "splash"), \
       mock.patch.object(attention, "splash_attention", kernel):
    outputs, grads = jit(lambda: outputs_and_grads("splash"))()
  expected, expected_grads = jit(lambda: outputs_and_grads("reference"))()
  _assert_trees_close(_real(outputs), _real(expected), 1e-5)
  _assert_trees_close(grads, expected_grads, 1e-5)
