"""The attention paths, sequence packing, remat and the padded vocabulary against the reference
path (bertjax.models.attention, bertjax.models.bert, bertjax.models.heads), on a tiny float32
model on CPU.

The cuDNN path runs here with jax's 'xla' implementation fed the exact arguments the 'cudnn' path
builds, and the splash kernel runs in the Pallas interpreter, so both are checked without a GPU
or a TPU.
"""
import contextlib
import dataclasses
import functools
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from bertjax.models import attention, heads
from bertjax.models.config import FUSED_ATTENTIONS, bert_config

# initializer_range 0.2 (not 0.02) makes the logits O(1), so 1e-5 is a sharp tolerance; the tanh
# GELU compiles faster than erf's and is beside the point here.
CONFIG = bert_config("tiny", vocab_size=101, num_layers=2, max_position_embeddings=64,
                     dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.2,
                     hidden_act="gelu_tanh")
# XLA's CPU compile dominates this file's time and the tiny model's run time is nothing, so every
# jit here asks for the quick compile (about 2x faster).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                                   "xla_llvm_disable_expensive_passes": True})
NUM_LABELS = 3

# Three pretraining examples: length (with [CLS] and both [SEP]s), where sentence B starts, the
# masked positions (2 per example), the NSP label and a classification label.
EXAMPLES = (dict(length=6, b_start=3, masked=(1, 4), nsp=0, label=2),
            dict(length=9, b_start=5, masked=(2, 7), nsp=1, label=0),
            dict(length=5, b_start=2, masked=(1, 3), nsp=1, label=1))
UNPACKED_SEQ = 12
# Packed: row 0 holds examples 0 and 1 (6 + 9 tokens), row 1 example 2 and an empty slot.
ROWS = ((0, 1), (2,))
PACKED_SEQ, SLOTS, PREDICTIONS = 16, 2, 2


def _example_tokens():
  """Per example: (input_ids, segment_ids, masked_lm_ids), numpy int32 of its length."""
  rng = np.random.default_rng(0)
  out = []
  for e in EXAMPLES:
    ids = rng.integers(5, CONFIG.vocab_size, size=e["length"]).astype(np.int32)
    segments = (np.arange(e["length"]) >= e["b_start"]).astype(np.int32)
    out.append((ids, segments, rng.integers(5, CONFIG.vocab_size, size=2).astype(np.int32)))
  return out


def unpacked_batch():
  """One example a row, right-padded to UNPACKED_SEQ: the pretraining and classification keys."""
  n = len(EXAMPLES)
  b = {k: np.zeros((n, UNPACKED_SEQ), np.int32) for k in ("input_ids", "segment_ids",
                                                          "input_mask")}
  b.update({k: np.zeros((n, PREDICTIONS), np.int32) for k in ("masked_lm_positions",
                                                              "masked_lm_ids")})
  for i, (e, (ids, segments, labels)) in enumerate(zip(EXAMPLES, _example_tokens())):
    b["input_ids"][i, :e["length"]] = ids
    b["segment_ids"][i, :e["length"]] = segments
    b["input_mask"][i, :e["length"]] = 1
    b["masked_lm_positions"][i] = e["masked"]
    b["masked_lm_ids"][i] = labels
  b["masked_lm_weights"] = np.ones((n, PREDICTIONS), np.float32)
  b["next_sentence_label"] = np.array([e["nsp"] for e in EXAMPLES], np.int32)
  b["label"] = np.array([e["label"] for e in EXAMPLES], np.int32)
  b["example_weight"] = np.ones((n,), np.float32)
  return b


def packed_batch():
  """The same examples packed as ROWS (the brief's packed keys), and where each example went:
  {example: (row, slot)}."""
  rows = len(ROWS)
  seq_keys = ("input_ids", "segment_ids", "input_mask", "position_ids", "sequence_ids")
  b = {k: np.zeros((rows, PACKED_SEQ), np.int32) for k in seq_keys}
  b.update({k: np.zeros((rows, SLOTS * PREDICTIONS), np.int32) for k in ("masked_lm_positions",
                                                                        "masked_lm_ids")})
  b["masked_lm_weights"] = np.zeros((rows, SLOTS * PREDICTIONS), np.float32)
  b.update({k: np.zeros((rows, SLOTS), np.int32) for k in ("cls_positions",
                                                           "next_sentence_label", "label")})
  b["example_weight"] = np.zeros((rows, SLOTS), np.float32)
  tokens = _example_tokens()
  where = {}
  for r, members in enumerate(ROWS):
    start = 0
    for slot, i in enumerate(members):
      e, (ids, segments, labels) = EXAMPLES[i], tokens[i]
      span = slice(start, start + e["length"])
      b["input_ids"][r, span] = ids
      b["segment_ids"][r, span] = segments
      b["input_mask"][r, span] = 1
      b["position_ids"][r, span] = np.arange(e["length"])
      b["sequence_ids"][r, span] = slot + 1
      predictions = slice(slot * PREDICTIONS, (slot + 1) * PREDICTIONS)
      b["masked_lm_positions"][r, predictions] = np.array(e["masked"]) + start
      b["masked_lm_ids"][r, predictions] = labels
      b["masked_lm_weights"][r, predictions] = 1
      b["cls_positions"][r, slot] = start
      b["next_sentence_label"][r, slot] = e["nsp"]
      b["label"][r, slot] = e["label"]
      b["example_weight"][r, slot] = 1
      where[i] = (r, slot)
      start += e["length"]
  return b, where


def pretraining_loss(outputs, batch):
  """Sum over examples of the MLM cross-entropy at the masked tokens and the NSP cross-entropy
  (packed or not: the sums are the same)."""
  mlm, nsp = outputs
  ce = optax.softmax_cross_entropy_with_integer_labels
  return ((ce(mlm, batch["masked_lm_ids"]) * batch["masked_lm_weights"]).sum()
          + (ce(nsp, batch["next_sentence_label"]) * batch["example_weight"]).sum())


def classification_loss(logits, batch):
  ce = optax.softmax_cross_entropy_with_integer_labels
  return (ce(logits, batch["label"]) * batch["example_weight"]).sum()


MODELS = {
    "pretraining": (lambda config: heads.BertForPreTraining(config), pretraining_loss),
    "classification": (lambda config: heads.BertForSequenceClassification(config, NUM_LABELS),
                       classification_loss),
}


@functools.cache
def _params(model_name):
  model = MODELS[model_name][0](CONFIG)
  init = jit(lambda key: heads.init_from_batch(model, key, unpacked_batch()))
  return nn.unbox(init(jax.random.key(0)))


def _with(config=CONFIG, **changes):
  return dataclasses.replace(config, **changes)


@contextlib.contextmanager
def cudnn_run_by_xla():
  """Runs the 'cudnn' path with the arguments it builds, by jax's 'xla' implementation (which
  honours `mask` and `key_value_seq_lengths` the same way), and records those arguments."""
  seen = []
  original = jax.nn.dot_product_attention

  def run_by_xla(query, key, value, *, implementation, **kwargs):
    assert implementation == "cudnn"
    seen.append(sorted(kwargs))
    return original(query, key, value, implementation="xla", **kwargs)

  with mock.patch.object(attention, "resolve_attention", lambda *a, **k: "cudnn"), \
       mock.patch.object(jax.nn, "dot_product_attention", run_by_xla):
    yield seen


@functools.cache
def _run(model_name, path, batch_names=("unpacked", "packed")):
  """Per batch: (outputs, gradients of the summed per-example loss) of `model_name` by `path`,
  one jit for the batches; cached, so the reference run serves every test that compares."""
  make_model, loss_fn = MODELS[model_name]
  model = make_model(_with(attention="xla" if path == "cudnn" else path))
  batches = [unpacked_batch() if name == "unpacked" else packed_batch()[0]
             for name in batch_names]

  def loss(params, batch):
    outputs = heads.apply_to_batch(model, params, batch, deterministic=True)
    return loss_fn(outputs, batch), outputs

  grad = jax.grad(loss, has_aux=True)
  step = jit(lambda params, batches: [grad(params, b)[::-1] for b in batches])
  if path != "cudnn":
    return step(_params(model_name), batches)
  with cudnn_run_by_xla() as seen:
    results = step(_params(model_name), batches)
  # lengths for an unpacked batch, the block-diagonal mask for a packed one, in every layer
  assert seen == [["mask"] if "sequence_ids" in b else ["key_value_seq_lengths"]
                  for b in batches for _ in range(CONFIG.num_layers)]
  return results


def assert_close(actual, expected, tol, name=""):
  """|actual - expected| <= tol * max(1, max |expected|): float32 rounding grows with the
  largest term of a sum, so a leaf of gradients up to 4 gets 4 tol."""
  expected = np.asarray(expected)
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(actual, expected, atol=tol * scale, rtol=0, err_msg=name)


def real_leaves(outputs):
  """The output arrays, MLM logits cut to the real vocabulary (the padded columns are float32
  min on every path: test_padded_vocabulary_... checks them)."""
  return [x[..., :CONFIG.vocab_size] if x.shape[-1] == CONFIG.padded_vocab_size else x
          for x in jax.tree.leaves(outputs)]


def _assert_trees_close(a, b, tol):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    assert_close(x, y, tol, jax.tree_util.keystr(path))


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_attention_paths_and_packing_equal_the_reference(model_name):
  """The xla path on the padded batch, and the reference and xla paths on the same examples
  packed, give the reference path's padded outputs per example and the same gradients."""
  packed, where = packed_batch()
  (outputs, expected_grads), _ = _run(model_name, "reference")
  expected = real_leaves(outputs)  # pretraining: mlm [3, P, V], nsp [3, 2]
  for path in ("reference", "xla"):
    (outputs, grads), (packed_outputs, packed_grads) = _run(model_name, path)
    if path != "reference":
      _assert_trees_close(real_leaves(outputs), expected, 1e-5)
      _assert_trees_close(grads, expected_grads, 1e-5)

    packed_outputs = real_leaves(packed_outputs)  # mlm [2, k P, V], nsp [2, k, 2]
    for example, (row, slot) in where.items():
      if model_name == "pretraining":
        predictions = slice(slot * PREDICTIONS, (slot + 1) * PREDICTIONS)
        assert_close(packed_outputs[0][row, predictions], expected[0][example], 1e-5, path)
      assert_close(packed_outputs[-1][row, slot], expected[-1][example], 1e-5, path)
    _assert_trees_close(packed_grads, expected_grads, 1e-5)


def test_cudnn_path_arguments_equal_the_reference():
  """BertForPreTraining by the cudnn path (key_value_seq_lengths on the padded batch), its
  arguments run by the xla implementation: the reference outputs and gradients. (Packed, the
  cudnn path passes the mask the xla path passes: test_dot_product_attention_kwargs_...)"""
  (outputs, grads), = _run("pretraining", "cudnn", ("unpacked",))
  (expected, expected_grads), _ = _run("pretraining", "reference")
  _assert_trees_close(real_leaves(outputs), real_leaves(expected), 1e-5)
  _assert_trees_close(grads, expected_grads, 1e-5)


def test_packing_without_sequence_ids_attends_across():
  """Guards the packing test: the same packed rows without their sequence ids (attention across
  the packed sequences) give the second sequence other logits."""
  packed, where = packed_batch()
  del packed["sequence_ids"]
  model = heads.BertForPreTraining(CONFIG)
  _, nsp = jit(functools.partial(heads.apply_to_batch, model, deterministic=True))(
      _params("pretraining"), packed)
  (_, expected_nsp), _ = _run("pretraining", "reference")[0]
  row, slot = where[1]
  assert np.abs(np.asarray(nsp[row, slot] - expected_nsp[1])).max() > 1e-2


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
  kernel that attended across packed sequences or into the padding would be off by O(1)."""
  shape = (3, 128, 2, 64)
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

    def cudnn(q, k, v):
      return jax.nn.dot_product_attention(q, k, v, implementation="cudnn",
                                          **attention.dot_product_attention_kwargs(mask, "cudnn"))

    def reference(q, k, v):
      f32 = lambda x: x.astype(jnp.float32)
      return reference_attention(f32(q), f32(k), f32(v), mask)

    def outputs_and_grads(attend):
      out, vjp = jax.vjp(attend, q, k, v)
      return out.astype(jnp.float32), [g.astype(jnp.float32) for g in vjp(
          weights.astype(out.dtype))]

    (out, grads), (expected, expected_grads) = jax.jit(
        lambda: (outputs_and_grads(cudnn), outputs_and_grads(reference)))()
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


def test_splash_refuses_lengths_and_backends_it_cannot_run():
  with pytest.raises(ValueError, match="needs a TPU.*use attention=auto"):
    model = heads.BertForPreTraining(_with(attention="splash", max_position_embeddings=128))
    ids = jnp.ones((1, 128), jnp.int32)
    jax.eval_shape(functools.partial(model.init, deterministic=True), jax.random.key(0),
                   ids, ids, ids)
  with pytest.raises(ValueError, match="multiple of 128, got 100"):
    attention.resolve_attention(_with(attention="splash"), "tpu", seq_len=100)
  x = jnp.zeros((1, 100, 2, 64))
  with pytest.raises(ValueError, match="multiple of 128, got 100"):
    attention.splash_attention(x, x, x, attention.AttentionMask(jnp.ones((1, 100), jnp.int32)))
  with pytest.raises(ValueError, match="cudnn attention needs an NVIDIA GPU"):
    attention.resolve_attention(_with(attention="cudnn", dtype="bfloat16"), "cpu")


BF16 = _with(dtype="bfloat16")


@pytest.mark.parametrize("config,backend,seq_len,expected", [
    (CONFIG, "cpu", 128, "xla"),
    (BF16, "cpu", 128, "xla"),
    (BF16, "gpu", 128, "cudnn"),
    (CONFIG, "gpu", 128, "xla"),  # cuDNN flash attention takes no float32
    (BF16, "gpu", 127, "xla"),  # nor an odd length (its biased training kernel, packed)
    (_with(BF16, hidden_size=2 * 160, num_heads=2), "gpu", 128, "xla"),  # head_dim 160 > 128
    (_with(BF16, hidden_size=2 * 60, num_heads=2), "gpu", 128, "xla"),  # 60: not a multiple of 8
    (BF16, "tpu", 512, "splash"),
    (BF16, "tpu", 100, "xla"),
    (BF16, "tpu", None, "splash"),
    (_with(BF16, attention_dropout_rate=0.1), "gpu", 128, "reference"),
    (_with(BF16, attention_dropout_rate=0.1), "tpu", 128, "reference"),
    (_with(attention_dropout_rate=0.1), "cpu", 128, "reference"),
])
def test_auto_resolution(config, backend, seq_len, expected):
  assert attention.resolve_attention(_with(config, attention="auto"), backend, seq_len) == expected


@pytest.mark.parametrize("path", ["reference", "xla", "cudnn", "splash"])
def test_explicit_paths_resolve_to_themselves(path):
  config = _with(attention=path, dtype="bfloat16")
  backend = {"cudnn": "gpu", "splash": "tpu"}.get(path, "cpu")
  assert attention.resolve_attention(config, backend, 128) == path


def test_fused_attention_with_dropout_and_cudnn_in_float32_are_refused():
  for path in FUSED_ATTENTIONS:
    with pytest.raises(ValueError, match="cannot drop attention probabilities"):
      bert_config("tiny", attention=path, attention_dropout_rate=0.1, dtype="bfloat16")
  with pytest.raises(ValueError, match="'cudnn' needs dtype='bfloat16'"):
    bert_config("tiny", attention="cudnn", attention_dropout_rate=0.0)


def test_packed_batch_for_a_model_without_packing_is_refused():
  packed, _ = packed_batch()
  model = heads.BertForTokenClassification(CONFIG, 5)
  with pytest.raises(ValueError, match="does not take packed batches"):
    heads.apply_to_batch(model, {}, packed, deterministic=True)


# --- remat -------------------------------------------------------------------------------------

DROPOUT = _with(dropout_rate=0.1, attention_dropout_rate=0.1)  # remat must replay the masks


@functools.cache
def _loss_and_grads(remat):
  """Loss and gradients of BertForPreTraining(DROPOUT, remat) with dropout on, same rng."""
  model = heads.BertForPreTraining(_with(DROPOUT, remat=remat))
  batch = unpacked_batch()

  def loss(params):
    outputs = heads.apply_to_batch(model, params, batch, deterministic=False,
                                   rngs={"dropout": jax.random.key(7)})
    return pretraining_loss(outputs, batch)

  return jit(jax.value_and_grad(loss))(_params("pretraining"))


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat):
  loss, grads = _loss_and_grads(remat)
  expected_loss, expected_grads = _loss_and_grads("none")
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  _assert_trees_close(grads, expected_grads, 1e-6)
  assert jax.tree.structure(grads) == jax.tree.structure(expected_grads)  # same names

  # Each layer is one checkpointed call, with the policy remat names.
  model = heads.BertForPreTraining(_with(DROPOUT, remat=remat))
  batch = unpacked_batch()
  jaxpr = jax.make_jaxpr(lambda p: heads.apply_to_batch(model, p, batch, deterministic=True))(
      _params("pretraining"))
  policies = [e.params["policy"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "remat2"]
  expected_policy = {"full": None,
                     "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}[remat]
  assert policies == [expected_policy] * CONFIG.num_layers


# --- padded vocabulary --------------------------------------------------------------------------

def test_padded_vocabulary_columns_get_no_mass_and_leave_the_loss_unchanged():
  """101 real rows padded to 128 vs the same real rows unpadded: equal real logits, loss and
  real-row gradients; padded logits float32 min, softmax 0, gradients 0."""
  vocab, padded = CONFIG.vocab_size, CONFIG.padded_vocab_size
  assert (vocab, padded) == (101, 128)
  params = _params("pretraining")
  flat = traverse_util.flatten_dict(params, sep="/")
  rows = ("bert/embeddings/word_embeddings/embedding", "masked_lm/output_bias")
  assert all(flat[name].shape[0] == padded for name in rows)
  unpadded = traverse_util.unflatten_dict(
      {k: v[:vocab] if k in rows else v for k, v in flat.items()}, sep="/")
  batch = unpacked_batch()

  def loss(params):
    outputs = heads.apply_to_batch(heads.BertForPreTraining(_with(pad_vocab_to_multiple=1)),
                                   params, batch, deterministic=True)
    return pretraining_loss(outputs, batch), outputs

  (loss_u, (mlm_u, nsp_u)), grads_u = jit(jax.value_and_grad(loss, has_aux=True))(unpadded)
  ((mlm_p, nsp_p), grads_p), _ = _run("pretraining", "reference")  # the padded model
  loss_p = pretraining_loss((mlm_p, nsp_p), batch)
  assert mlm_p.shape[-1] == padded and mlm_u.shape[-1] == vocab
  assert_close(mlm_p[..., :vocab], mlm_u, 1e-5)
  np.testing.assert_array_equal(mlm_p[..., vocab:], np.finfo(np.float32).min)
  np.testing.assert_array_equal(jax.nn.softmax(mlm_p)[..., vocab:], 0.0)
  assert int(np.asarray(mlm_p).argmax(-1).max()) < vocab
  assert_close(nsp_p, nsp_u, 1e-5)
  np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)

  flat_p = traverse_util.flatten_dict(grads_p, sep="/")
  flat_u = traverse_util.flatten_dict(grads_u, sep="/")
  for name, g in flat_p.items():
    if name in rows:
      np.testing.assert_array_equal(g[vocab:], 0.0)
      g = g[:vocab]
    assert_close(g, flat_u[name], 1e-5, name)
