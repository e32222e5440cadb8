"""Tests of bertjax.models.{config,bert,heads} on tiny configs (CPU, a few seconds)."""
import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from bertjax.models import attention, bert, heads
from bertjax.models.config import SIZES, BertConfig, bert_config

TINY = BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                  intermediate_size=64, max_position_embeddings=32)
BATCH, SEQ, NUM_PRED = 2, 8, 3


def _batch(seq=SEQ, pad_to=None):
  """A [2, seq] batch with ids < 40; example 0 has 5 real tokens, example 1 has 7."""
  rng = np.random.default_rng(0)
  input_ids = rng.integers(1, 40, size=(BATCH, seq)).astype(np.int32)
  segment_ids = np.zeros((BATCH, seq), np.int32)
  segment_ids[:, 3:] = 1
  input_mask = np.zeros((BATCH, seq), np.int32)
  input_mask[0, :5] = 1
  input_mask[1, :7] = 1
  input_ids *= input_mask  # [PAD] = 0
  segment_ids *= input_mask
  if pad_to is not None:  # append more padding columns
    extra = ((0, 0), (0, pad_to - seq))
    input_ids, segment_ids, input_mask = (np.pad(a, extra) for a in
                                          (input_ids, segment_ids, input_mask))
  positions = np.array([[1, 2, 4], [0, 3, 6]], np.int32)
  return input_ids, segment_ids, input_mask, positions


def _replace(config: BertConfig, **changes) -> BertConfig:
  return dataclasses.replace(config, **changes)


@functools.cache
def _params(config=TINY):
  """Unboxed BertForPreTraining variables, initialised once per config (under jit)."""
  ids, seg, mask, pos = _batch()
  init = jax.jit(lambda key: heads.BertForPreTraining(config).init(
      key, ids, seg, mask, pos, deterministic=True))
  return nn.unbox(init(jax.random.key(0)))


@functools.cache
def _jitted_pretraining(config):
  return jax.jit(heads.BertForPreTraining(config).apply, static_argnames="deterministic")


def _pretrain(params, ids, seg, mask, pos=None, *, config=TINY, deterministic=True, rngs=None):
  """(mlm_logits, nsp_logits) of BertForPreTraining(config), jitted."""
  return _jitted_pretraining(config)(params, ids, seg, mask, pos, deterministic=deterministic,
                                     rngs=rngs)


@functools.cache
def _jitted_encoder(config):
  return jax.jit(bert.BertEncoder(config).apply,
                 static_argnames=("deterministic", "output_hidden_states"))


def _encode(params, ids, seg, mask, *, config=TINY, output_hidden_states=False):
  """BertOutput of the 'bert' part of pretraining params, jitted, without dropout."""
  return _jitted_encoder(config)({"params": params["params"]["bert"]}, ids, seg, mask,
                                 deterministic=True, output_hidden_states=output_hidden_states)


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(tree)))


# The published counts (vocab 30522), then with the vocabulary padded to 30592 rows (the default
# pad_vocab_to_multiple=128): 70 more rows of 768 (base) or 1024 (large).
@pytest.mark.parametrize("size,pad,expected", [
    ("base", 1, 109_482_240), ("large", 1, 335_141_888),
    ("base", 128, 109_482_240 + 70 * 768), ("large", 128, 335_141_888 + 70 * 1024)])
def test_parameter_count_of_published_sizes(size, pad, expected):
  config = bert_config(size, pad_vocab_to_multiple=pad)  # 512 positions, 2 token types
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(
      lambda: bert.BertEncoder(config).init(jax.random.key(0), ids, ids, ids, deterministic=True))
  assert _count(abstract["params"]) == expected


def test_size_table():
  assert list(SIZES) == ["tiny", "mini", "small", "medium", "base", "large"]
  tiny = bert_config("tiny")
  assert (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.intermediate_size) == (
      2, 128, 2, 512)
  assert bert_config("medium", dtype="bfloat16").num_layers == 8
  assert bert_config("medium", dtype="bfloat16").compute_dtype == jnp.bfloat16


def test_attention_mask_exact():
  mask = attention.attention_mask(jnp.array([[1, 1, 0], [1, 0, 0]], jnp.int32))
  row0 = [True, True, False]
  row1 = [True, False, False]
  expected = np.array([[[row0, row0, row0]], [[row1, row1, row1]]])
  assert mask.dtype == jnp.bool_
  assert mask.shape == (2, 1, 3, 3)
  np.testing.assert_array_equal(np.asarray(mask), expected)


@pytest.mark.parametrize("kwargs", [
    dict(hidden_size=30, num_heads=4),
    dict(hidden_act="relu"),
    dict(dtype="float16"),
    dict(param_dtype="int8"),
    dict(num_layers=0),
    dict(dropout_rate=1.0),
])
def test_config_validation(kwargs):
  with pytest.raises(ValueError):
    BertConfig(**kwargs)


def test_bert_config_rejects_unknown_size_and_field():
  with pytest.raises(ValueError, match="unknown BERT size"):
    bert_config("huge")
  with pytest.raises(ValueError, match="hidden_dim"):
    bert_config("tiny", hidden_dim=64)


def test_sequence_longer_than_positions_raises():
  model = bert.BertEncoder(TINY)
  ids = jnp.ones((1, TINY.max_position_embeddings + 1), jnp.int32)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    model.init(jax.random.key(0), ids, deterministic=True)


def test_self_attention_matches_numpy_reference():
  config = TINY
  x = jax.random.normal(jax.random.key(1), (BATCH, SEQ, config.hidden_size))
  input_mask = jnp.asarray(_batch()[2])
  mask = attention.AttentionMask(input_mask)
  layer = bert.SelfAttention(config)
  params = nn.unbox(layer.init(jax.random.key(2), x, mask, deterministic=True))["params"]
  got = layer.apply({"params": params}, x, mask, deterministic=True)

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  xn = np.asarray(x, np.float64)
  d = config.head_dim

  def proj(name):  # [b, s, H] -> [b, heads, s, d]
    y = xn @ p[name]["kernel"] + p[name]["bias"]
    return y.reshape(BATCH, SEQ, config.num_heads, d).transpose(0, 2, 1, 3)

  q, k, v = proj("query"), proj("key"), proj("value")
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)  # [b, heads, q, k]
  scores = np.where(np.asarray(input_mask)[:, None, None, :] == 1, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  context = (probs @ v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, config.hidden_size)
  expected = context @ p["output"]["kernel"] + p["output"]["bias"]
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def _exact_gelu(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _tanh_gelu(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("act,reference", [("gelu", _exact_gelu), ("gelu_tanh", _tanh_gelu)])
def test_feed_forward_activation_is_selectable(act, reference):
  # With intermediate_size == hidden_size, kernels 2*I and I and zero biases, FeedForward(x)
  # is exactly act(2x), so the activation is compared with its formula.
  config = _replace(TINY, hidden_act=act, intermediate_size=TINY.hidden_size)
  x = jax.random.normal(jax.random.key(3), (BATCH, SEQ, config.hidden_size))
  eye = jnp.eye(config.hidden_size)
  zeros = jnp.zeros((config.hidden_size,))
  params = {"intermediate": {"kernel": 2.0 * eye, "bias": zeros},
            "output": {"kernel": eye, "bias": zeros}}
  got = np.asarray(bert.FeedForward(config).apply({"params": params}, x), np.float64)
  expected = reference(2.0 * np.asarray(x, np.float64))
  np.testing.assert_allclose(got, expected, atol=2e-6)
  other = _tanh_gelu if act == "gelu" else _exact_gelu
  assert np.abs(other(2.0 * np.asarray(x, np.float64)) - got).max() > 1e-4


def test_padding_invariance():
  params = _params()
  short = _batch()
  long = _batch(pad_to=SEQ + 5)  # the same examples with 5 more padding columns
  real = short[2].astype(bool)  # [batch, SEQ]

  out_s, out_l = _encode(params, *short[:3]), _encode(params, *long[:3])
  np.testing.assert_allclose(out_s.sequence_output[real],
                             out_l.sequence_output[:, :SEQ][real], atol=1e-5)
  np.testing.assert_allclose(out_s.pooled_output, out_l.pooled_output, atol=1e-5)

  # MLM logits at every real position of example 0 and the first 5 of example 1.
  positions = np.tile(np.arange(5, dtype=np.int32), (BATCH, 1))  # [batch, 5]
  mlm_s, nsp_s = _pretrain(params, *short[:3], positions)
  mlm_l, nsp_l = _pretrain(params, *long[:3], positions)
  np.testing.assert_allclose(mlm_s, mlm_l, atol=1e-5)
  np.testing.assert_allclose(nsp_s, nsp_l, atol=1e-5)


def test_padding_changes_output_when_mask_is_ignored():
  """Guards the invariance test: the same padding, marked as real tokens, changes the output."""
  ids, seg, mask, _ = _batch(pad_to=SEQ + 5)
  real = mask.astype(bool)
  masked = _encode(_params(), ids, seg, mask).sequence_output
  unmasked = _encode(_params(), ids, seg, np.ones_like(mask)).sequence_output
  assert np.abs(np.asarray(masked[real] - unmasked[real])).max() > 1e-2


def test_hidden_states():
  ids, seg, mask, _ = _batch()
  out = _encode(_params(), ids, seg, mask, output_hidden_states=True)
  assert len(out.hidden_states) == TINY.num_layers + 1
  assert all(h.shape == (BATCH, SEQ, TINY.hidden_size) for h in out.hidden_states)
  np.testing.assert_array_equal(out.hidden_states[-1], out.sequence_output)
  assert out.pooled_output.shape == (BATCH, TINY.hidden_size)
  assert _encode(_params(), ids, seg, mask).hidden_states is None


def test_mlm_gather_equals_indexing_all_positions():
  ids, seg, mask, pos = _batch()
  all_logits, _ = _pretrain(_params(), ids, seg, mask)
  gathered, _ = _pretrain(_params(), ids, seg, mask, pos)
  assert all_logits.shape == (BATCH, SEQ, TINY.padded_vocab_size)
  assert gathered.shape == (BATCH, NUM_PRED, TINY.padded_vocab_size)
  expected = np.take_along_axis(np.asarray(all_logits), pos[..., None], axis=1)
  np.testing.assert_allclose(gathered, expected, atol=1e-6)


def test_decoder_is_tied_to_word_embeddings():
  flat = traverse_util.flatten_dict(_params()["params"], sep="/")
  assert sorted(k for k in flat if k.startswith("masked_lm/")) == [
      "masked_lm/layer_norm/bias", "masked_lm/layer_norm/scale", "masked_lm/output_bias",
      "masked_lm/transform/bias", "masked_lm/transform/kernel"]
  with_vocab = sorted(k for k, v in flat.items() if TINY.padded_vocab_size in v.shape)
  assert with_vocab == ["bert/embeddings/word_embeddings/embedding", "masked_lm/output_bias"]

  # Row 40 := 2 * row 41, both output biases 0. Ids are < 40, so the encoder is unchanged and
  # a tied decoder must give logit[40] == 2 * logit[41] and leave every other logit alone.
  ids, seg, mask, pos = _batch()
  before, nsp_before = _pretrain(_params(), ids, seg, mask, pos)
  table_key = "bert/embeddings/word_embeddings/embedding"
  edited = dict(flat)
  edited[table_key] = flat[table_key].at[40].set(2.0 * flat[table_key][41])
  edited["masked_lm/output_bias"] = flat["masked_lm/output_bias"].at[40].set(0.0).at[41].set(0.0)
  edited = {"params": traverse_util.unflatten_dict(edited, sep="/")}
  after, nsp_after = _pretrain(edited, ids, seg, mask, pos)

  np.testing.assert_allclose(after[..., 40], 2.0 * after[..., 41], rtol=1e-5, atol=1e-6)
  assert np.abs(np.asarray(after[..., 40] - before[..., 40])).max() > 1e-3
  others = np.arange(TINY.padded_vocab_size) != 40
  np.testing.assert_array_equal(after[..., others], before[..., others])
  np.testing.assert_array_equal(nsp_after, nsp_before)


def test_bfloat16_compute_float32_params_and_logits():
  config = _replace(TINY, dtype="bfloat16")
  params = _params(config)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  ids, seg, mask, pos = _batch()
  mlm, nsp = _pretrain(params, ids, seg, mask, pos, config=config)
  assert mlm.dtype == jnp.float32 and nsp.dtype == jnp.float32
  assert _encode(params, ids, seg, mask, config=config).sequence_output.dtype == jnp.bfloat16

  mlm32, nsp32 = _pretrain(params, ids, seg, mask, pos)  # same params, float32 compute
  np.testing.assert_allclose(mlm, mlm32, atol=0.05)
  np.testing.assert_allclose(nsp, nsp32, atol=0.05)


def test_dropout():
  ids, seg, mask, pos = _batch()

  def run(deterministic, seed=None):
    rngs = None if seed is None else {"dropout": jax.random.key(seed)}
    return _pretrain(_params(), ids, seg, mask, pos, deterministic=deterministic, rngs=rngs)[0]

  np.testing.assert_array_equal(run(True), run(True))
  np.testing.assert_array_equal(run(False, 1), run(False, 1))
  assert np.abs(np.asarray(run(False, 1) - run(False, 2))).max() > 1e-3
  assert np.abs(np.asarray(run(False, 1) - run(True))).max() > 1e-3


def test_gelu_variants_change_the_model():
  ids, seg, mask, pos = _batch()
  exact = _pretrain(_params(), ids, seg, mask, pos)[0]
  tanh_config = _replace(TINY, hidden_act="gelu_tanh")
  approx = _pretrain(_params(), ids, seg, mask, pos, config=tanh_config)[0]
  assert 0 < np.abs(np.asarray(exact - approx)).max() < 1e-2


EXPECTED_AXES = {
    "bert/embeddings/word_embeddings/embedding": ("vocab", "embed"),
    "bert/embeddings/position_embeddings/embedding": (None, "embed"),
    "bert/embeddings/token_type_embeddings/embedding": (None, "embed"),
    "bert/embeddings/layer_norm/scale": ("embed",),
    "bert/encoder/layer_1/attention/query/kernel": ("embed", "heads"),
    "bert/encoder/layer_1/attention/value/bias": ("heads",),
    "bert/encoder/layer_1/attention/output/kernel": ("heads", "embed"),
    "bert/encoder/layer_1/attention/output/bias": ("embed",),
    "bert/encoder/layer_1/attention_layer_norm/bias": ("embed",),
    "bert/encoder/layer_1/feed_forward/intermediate/kernel": ("embed", "mlp"),
    "bert/encoder/layer_1/feed_forward/intermediate/bias": ("mlp",),
    "bert/encoder/layer_1/feed_forward/output/kernel": ("mlp", "embed"),
    "bert/encoder/layer_1/output_layer_norm/scale": ("embed",),
    "bert/pooler/dense/kernel": ("embed", None),
    "masked_lm/output_bias": ("vocab",),
    "next_sentence/classifier/kernel": ("embed", None),
}


def test_every_param_has_logical_axes_and_unboxed_params_apply():
  model = heads.BertForPreTraining(TINY)
  ids, seg, mask, pos = _batch()
  abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, seg, mask, pos,
                                               deterministic=True))
  boxed = traverse_util.flatten_dict(abstract["params"], sep="/")
  assert all(isinstance(v, nn.LogicallyPartitioned) for v in boxed.values())
  for path, v in boxed.items():
    assert len(v.names) == v.value.ndim, path
    assert set(v.names) <= {"vocab", "embed", "heads", "mlp", None}, path
  for path, names in EXPECTED_AXES.items():
    assert boxed[path].names == names, path

  specs = traverse_util.flatten_dict(nn.get_partition_spec(abstract)["params"], sep="/")
  assert specs.keys() == boxed.keys()
  assert all(isinstance(s, jax.sharding.PartitionSpec) for s in specs.values())

  params = _params()  # initialised for real, then unboxed
  real = traverse_util.flatten_dict(params["params"], sep="/")
  assert {k: (v.shape, v.dtype) for k, v in real.items()} == {
      k: (v.value.shape, v.value.dtype) for k, v in boxed.items()}
  mlm, nsp = _pretrain(params, ids, seg, mask, pos)
  assert mlm.shape == (BATCH, NUM_PRED, TINY.padded_vocab_size) and nsp.shape == (BATCH, 2)


def test_init_statistics():
  flat = traverse_util.flatten_dict(_params()["params"], sep="/")
  table = np.asarray(flat["bert/embeddings/word_embeddings/embedding"])
  assert table.shape == (TINY.padded_vocab_size, TINY.hidden_size) == (128, 32)
  assert not np.any(table[TINY.vocab_size:])  # the padded rows start at 0
  table = table[:TINY.vocab_size]  # 3200 draws
  assert np.abs(table).max() <= 2 * TINY.initializer_range + 1e-6  # truncated at 2 stddev
  assert 0.015 < table.std() < 0.02  # a normal(0.02) truncated at 2 sigma has std ~0.0176
  assert not np.any(flat["bert/encoder/layer_0/attention/query/bias"])
  np.testing.assert_array_equal(flat["bert/encoder/layer_0/output_layer_norm/scale"], 1.0)


# --- fine-tuning models -------------------------------------------------------------------------

TASK_MODELS = {
    "sequence_classification": lambda: heads.BertForSequenceClassification(TINY, 3),
    "token_tagging": lambda: heads.BertForTokenClassification(TINY, 5),
    "span": lambda: heads.BertForQuestionAnswering(TINY),
    "multiple_choice": lambda: heads.BertForMultipleChoice(TINY),
}


@pytest.mark.parametrize("head", sorted(TASK_MODELS))
def test_task_models_shapes_padding_and_dropout(head):
  """Output shapes, parameter tree (pooler only where the head reads it, logical axes on the
  head), invariance to extra padding, and dropout that is on only when asked for."""
  model = TASK_MODELS[head]()
  short, long = _batch()[:3], _batch(pad_to=SEQ + 4)[:3]
  if head == "multiple_choice":  # 2 examples x 2 choices: the rows, then the rows swapped
    short, long = ([np.stack([x, x[::-1]]) for x in b] for b in (short, long))
  boxed = model.init(jax.random.key(0), *short, deterministic=True)
  spec = nn.get_partition_spec(boxed)["params"][head]["classifier"]["kernel"]
  assert tuple(spec) == ("embed", None)
  params = nn.unbox(boxed)
  assert sorted(params["params"]) == ["bert", head]
  assert ("pooler" in params["params"]["bert"]) == (head in ("sequence_classification",
                                                            "multiple_choice"))
  apply = jax.jit(model.apply, static_argnames="deterministic")
  out_s, out_l = (apply(params, *b, deterministic=True) for b in (short, long))
  out_s, out_l = (jax.tree.leaves(o) for o in (out_s, out_l))
  expected = {"sequence_classification": [(BATCH, 3)], "token_tagging": [(BATCH, SEQ, 5)],
              "span": [(BATCH, SEQ)] * 2, "multiple_choice": [(2, BATCH)]}[head]
  assert [o.shape for o in out_s] == expected and all(o.dtype == jnp.float32 for o in out_s)
  real = short[2].astype(bool)
  for s, l in zip(out_s, out_l):
    if s.ndim == 3 or head == "span":  # per token: compare the real positions
      np.testing.assert_allclose(s[real], l[:, :SEQ][real], atol=1e-5)
    else:
      np.testing.assert_allclose(s, l, atol=1e-5)
  if head == "multiple_choice":  # swapping the choices swaps their scores
    np.testing.assert_allclose(out_s[0][0], out_s[0][1][::-1], atol=1e-5)
  dropped = jax.tree.leaves(apply(params, *short, deterministic=False,
                                  rngs={"dropout": jax.random.key(1)}))
  assert max(np.abs(np.asarray(d - s)).max() for d, s in zip(dropped, out_s)) > 1e-3
