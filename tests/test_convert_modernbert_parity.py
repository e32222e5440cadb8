"""Converted transformers ModernBERT weights compute in bertjax what they compute in transformers.

Each class (ModernBertModel, ModernBertForMaskedLM, the four task classes, sequence
classification with 'cls' and with 'mean' pooling) on a padded batch longer than the local
window, on the reference and the xla attention paths: every output within 1e-5 (times the
output's scale when above 1) at real tokens. The gradient of a scalar loss of the MLM logits
w.r.t. every parameter equals torch's autograd, mapped through the converter. A packed bertjax
row gives each of its sequences the logits transformers gives that sequence alone (masked LM,
sequence classification with both poolings). Run with -s to see the differences measured.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import traverse_util

from bertjax.convert import hf
from bertjax.models import heads
from convert_modernbert_helpers import (CLS, NUM_LABELS, SEP, VOCAB, assert_close, convert,
                                        hf_model, max_diff, padded_batch, state_dict)

ATTENTIONS = ("reference", "xla")


def _torch(model, ids, mask, **kwargs):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask), **kwargs)


def _apply(model, params, ids, mask, **packing):
  """The model's outputs, compiled as one program (as a run computes them), not op by op."""
  return jax.jit(lambda params, ids, mask, packing: model.apply(
      {"params": params}, ids, jnp.zeros_like(ids), mask, **packing, deterministic=True))(
          params, ids, mask, packing)


@pytest.fixture(scope="module")
def batch():
  return padded_batch()


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_encoder_hidden_states(attention, batch):
  model = hf_model("ModernBertModel", seed=1)
  params, config, report = convert(model)
  assert sorted(report.missing) == ["bert/head/dense/kernel", "bert/head/layer_norm/scale",
                                    "masked_lm/output_bias"]
  ids, mask = batch
  theirs = _torch(model, ids, mask, output_hidden_states=True)
  config = dataclasses.replace(config, attention=attention)
  ours = jax.jit(lambda p, ids, mask: heads.make_encoder(config, use_pooler=False).apply(
      {"params": p}, ids, None, mask, deterministic=True, output_hidden_states=True))(
          params["bert"], ids, mask)
  real = mask.astype(bool)
  # transformers: the embeddings, each layer's output but the last, then the final norm's
  for i, (a, b) in enumerate(zip(ours.hidden_states[:-1], theirs.hidden_states[:-1])):
    assert_close(np.asarray(a)[real], b.numpy()[real], f"{attention} hidden state {i}")
  assert_close(np.asarray(ours.sequence_output)[real], theirs.last_hidden_state.numpy()[real],
               f"{attention} last_hidden_state")


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_masked_lm_logits(attention, batch):
  model = hf_model("ModernBertForMaskedLM", seed=2)
  params, config, report = convert(model)
  assert report.missing == [] and report.ignored == []
  ids, mask = batch
  theirs = _torch(model, ids, mask).logits.numpy()
  config = dataclasses.replace(config, attention=attention)
  logits, nsp = _apply(heads.BertForPreTraining(config, next_sentence=False), params, ids, mask)
  assert nsp is None
  logits, real = np.asarray(logits), mask.astype(bool)
  assert (logits[..., VOCAB:] == np.finfo(np.float32).min).all()
  assert_close(logits[..., :VOCAB][real], theirs[real], f"{attention} MLM logits")


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_logits(attention, pooling, batch):
  model = hf_model("ModernBertForSequenceClassification", seed=3, classifier_pooling=pooling)
  params, config, _ = convert(model)
  assert config.pooling == pooling
  ids, mask = batch
  theirs = _torch(model, ids, mask).logits.numpy()
  config = dataclasses.replace(config, attention=attention)
  ours = _apply(heads.BertForSequenceClassification(config, NUM_LABELS), params, ids, mask)
  assert_close(ours, theirs, f"{attention} {pooling} sequence classification")


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_token_classification_and_question_answering_logits(attention, batch):
  ids, mask = batch
  real = mask.astype(bool)
  model = hf_model("ModernBertForTokenClassification", seed=4)
  params, config, _ = convert(model)
  config = dataclasses.replace(config, attention=attention)
  ours = _apply(heads.BertForTokenClassification(config, NUM_LABELS), params, ids, mask)
  theirs = _torch(model, ids, mask).logits.numpy()
  assert_close(np.asarray(ours)[real], theirs[real], f"{attention} token classification")

  model = hf_model("ModernBertForQuestionAnswering", seed=5, num_labels=2)
  params, config, _ = convert(model)
  config = dataclasses.replace(config, attention=attention)
  start, end = _apply(heads.BertForQuestionAnswering(config), params, ids, mask)
  theirs = _torch(model, ids, mask)
  assert_close(np.asarray(start)[real], theirs.start_logits.numpy()[real], f"{attention} start")
  assert_close(np.asarray(end)[real], theirs.end_logits.numpy()[real], f"{attention} end")


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_multiple_choice_logits(attention):
  model = hf_model("ModernBertForMultipleChoice", seed=6)
  params, config, _ = convert(model)
  ids, mask = padded_batch(rows=6, seq=24, seed=1, lengths=(24, 20, 17, 12, 9, 24))
  ids, mask = ids.reshape(2, 3, 24), mask.reshape(2, 3, 24)
  theirs = _torch(model, ids, mask).logits.numpy()
  config = dataclasses.replace(config, attention=attention)
  ours = _apply(heads.BertForMultipleChoice(config), params, ids, mask)
  assert_close(ours, theirs, f"{attention} multiple choice")


def test_masked_lm_gradients_equal_torch_autograd(batch):
  """d/dparams of sum(logits * R) over real tokens (R fixed random), bertjax's against torch's
  mapped by the converter: the word embeddings' gradient includes the tied decoder's."""
  model = hf_model("ModernBertForMaskedLM", seed=7)
  params, config, _ = convert(model)
  ids, mask = batch
  weights = np.random.RandomState(3).randn(*ids.shape, VOCAB).astype(np.float32)
  weights *= mask[..., None]  # real tokens only

  model.zero_grad()
  logits = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  (logits * torch.tensor(weights)).sum().backward()
  torch_grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
  assert set(torch_grads) == set(state_dict(model))
  expected, _ = hf.from_hf(torch_grads, config)

  bj = heads.BertForPreTraining(config, next_sentence=False)

  def loss(p):
    out, _ = bj.apply({"params": p}, ids, np.zeros_like(ids), mask, deterministic=True)
    return (out[..., :VOCAB] * weights).sum()

  grads = jax.jit(jax.grad(loss))(params)
  ours, theirs = (traverse_util.flatten_dict(t, sep="/") for t in (grads, expected))
  assert sorted(ours) == sorted(theirs)
  worst = 0.0
  for path in sorted(ours):
    diff, scale = max_diff(ours[path], theirs[path])
    assert diff <= 1e-5 * scale, (path, diff, scale)
    worst = max(worst, diff / scale)
  print(f"MLM gradients: max |diff| / max |grad| over {len(ours)} parameters {worst:.2e}")


def _packed(lengths, seq, seed):
  """One packed row of sequences of `lengths` ([CLS] ... [SEP] each, then padding) and each
  sequence alone: (row ids, mask, position_ids, sequence_ids, cls_positions, [ids alone])."""
  rng = np.random.RandomState(seed)
  alone = []
  for n in lengths:
    ids = rng.randint(5, VOCAB, n)
    ids[0], ids[-1] = CLS, SEP
    alone.append(ids)
  used = sum(lengths)
  row = np.concatenate(alone + [np.full(seq - used, 3)])[None]  # [1, seq], [PAD] after
  mask = (np.arange(seq) < used).astype(np.int64)[None]
  positions = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(seq - used, int)])
  sequence_ids = np.concatenate([np.full(n, k + 1) for k, n in enumerate(lengths)]
                                + [np.zeros(seq - used, int)])
  starts = np.cumsum([0] + list(lengths[:-1]))
  return (row, mask, positions[None].astype(np.int32), sequence_ids[None].astype(np.int32),
          starts[None].astype(np.int32), alone)


LENGTHS = (14, 11, 9)  # two longer than the window; 34 tokens, 6 padding


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_packed_masked_lm_gives_each_sequence_its_own_logits(attention):
  model = hf_model("ModernBertForMaskedLM", seed=8)
  params, config, _ = convert(model)
  row, mask, positions, sequence_ids, cls_positions, alone = _packed(LENGTHS, 40, seed=4)
  config = dataclasses.replace(config, attention=attention)
  logits, _ = _apply(heads.BertForPreTraining(config, next_sentence=False), params, row, mask,
                     position_ids=positions, sequence_ids=sequence_ids,
                     cls_positions=cls_positions)
  logits = np.asarray(logits)[0, :, :VOCAB]
  for k, (ids, start) in enumerate(zip(alone, cls_positions[0])):
    theirs = _torch(model, ids[None], np.ones_like(ids)[None]).logits.numpy()[0]
    assert_close(logits[start:start + len(ids)], theirs, f"{attention} packed MLM sequence {k}")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_sequence_classification_gives_each_sequence_its_own_logits(pooling):
  model = hf_model("ModernBertForSequenceClassification", seed=9, classifier_pooling=pooling)
  params, config, _ = convert(model)
  row, mask, positions, sequence_ids, cls_positions, alone = _packed(LENGTHS, 40, seed=5)
  ours = _apply(heads.BertForSequenceClassification(config, NUM_LABELS), params, row, mask,
                position_ids=positions, sequence_ids=sequence_ids, cls_positions=cls_positions)
  assert np.shape(ours) == (1, len(LENGTHS), NUM_LABELS)
  for k, ids in enumerate(alone):
    theirs = _torch(model, ids[None], np.ones_like(ids)[None]).logits.numpy()[0]
    assert_close(np.asarray(ours)[0, k], theirs, f"{pooling} packed sequence {k}")
