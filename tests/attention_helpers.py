"""Shared by the attention tests (test_attention_paths.py, test_attention_kernels.py,
test_attention_resolution.py, test_attention_remat.py, test_attention_padded_vocab.py): a tiny
float32 config, the quick-compile jit, three pretraining examples as an unpadded and a packed
batch, the pretraining and classification losses, running a model by an attention path (the
'cudnn' path's arguments run by jax's 'xla' implementation, so it needs no GPU), and comparing
outputs and gradients."""
import contextlib
import dataclasses
import functools
from unittest import mock

import flax.linen as nn
import jax
import numpy as np
import optax

from bertjax.models import attention, heads
from bertjax.models.config import bert_config

# initializer_range 0.2 (not 0.02) makes the logits O(1), so 1e-5 is a sharp tolerance; the tanh
# GELU compiles faster than erf's and is beside the point here.
CONFIG = bert_config("tiny", vocab_size=101, num_layers=2, max_position_embeddings=64,
                     dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.2,
                     hidden_act="gelu_tanh")
# XLA's CPU compile dominates these tests' time and the tiny model's run time is nothing, so every
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
