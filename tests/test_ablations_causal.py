"""The left-to-right LM's causal model (`--config.pretraining.objective=ltr`): the output at
position i does not see later tokens on any attention path, the model equals transformers'
causal BertLMHeadModel, splash attention's causal mask equals the reference, the next-token loss
equals the loss by hand, and a causal classifier pools each sequence's last token, packed or not.
"""
import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.convert import hf, hf_files
from bertjax.data.pretraining import loader, masking, pairs
from bertjax.models import attention, bert, heads
from bertjax.tasks import pretraining

from ablations_helpers import CONFIG, jit
from attention_helpers import cudnn_run_by_xla, packed_batch, unpacked_batch


def _lm_logits(config, params, ids, mask):
  """Logits at every position of BertForPreTraining without NSP (the LTR model)."""
  model = heads.BertForPreTraining(config, next_sentence=False)
  return model.apply({"params": params}, ids, jnp.zeros_like(ids), mask,
                     deterministic=True)[0][..., :config.vocab_size]


@functools.cache
def _ltr_params():
  ids = jnp.zeros((1, 8), jnp.int32)
  return nn.unbox(heads.BertForPreTraining(CONFIG, next_sentence=False).init(
      jax.random.key(0), ids, ids, ids, deterministic=True)["params"])


def test_the_output_at_i_does_not_see_later_tokens_on_every_path():
  """Changing the tokens after position i leaves the logits at 0..i unchanged, on the
  reference and xla paths and with the cudnn path's arguments (run by xla); a bidirectional
  model with the same weights sees them."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, CONFIG.vocab_size, (2, 12)).astype(np.int32)
  changed = ids.copy()
  changed[:, 7:] = rng.integers(5, CONFIG.vocab_size, (2, 5))
  mask = np.ones_like(ids)
  mask[1, 10:] = 0  # padding after 10 real tokens
  both = jnp.asarray(np.concatenate([ids, changed])), jnp.asarray(np.concatenate([mask, mask]))
  configs = {path: dataclasses.replace(CONFIG, attention=path) for path in ("reference", "xla")}
  configs["bidirectional"] = dataclasses.replace(CONFIG, causal=False, attention="xla")
  outputs = jit(lambda params, ids, mask: {name: _lm_logits(config, params, ids, mask)
                                           for name, config in configs.items()})(
      _ltr_params(), *both)
  with cudnn_run_by_xla() as seen:
    outputs["cudnn"] = jit(functools.partial(_lm_logits, configs["xla"]))(_ltr_params(), *both)
  assert seen == [["is_causal", "key_value_seq_lengths"]] * CONFIG.num_layers
  real = np.concatenate([mask, mask]).astype(bool)
  for path in ("reference", "xla", "cudnn"):
    before, after = np.split(np.asarray(outputs[path]), 2)
    np.testing.assert_allclose(after[:, :7], before[:, :7], atol=1e-6, err_msg=path)
    # The test can fail: the logits from position 7 on change.
    assert np.abs(after[:, 7:10] - before[:, 7:10]).max(axis=-1).min() > 1e-4, path
    np.testing.assert_allclose(np.asarray(outputs[path])[real],
                               np.asarray(outputs["reference"])[real], atol=2e-5, err_msg=path)
  before, after = np.split(np.asarray(outputs["bidirectional"]), 2)  # sees the later tokens
  assert np.abs(after[:, :7] - before[:, :7]).max() > 1e-3


def test_the_ltr_model_equals_transformers_causal_bert(tmp_path):
  """The LTR model's logits at every real position equal those of transformers'
  BertLMHeadModel with is_decoder=True (a causal BERT with the same tied head) on the same
  weights and a padded batch: the causal mask and the head, against code we did not write."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

  both_ways = dataclasses.replace(CONFIG, causal=False)  # to_hf refuses causal models
  save_file(hf.to_hf(jax.tree.map(np.asarray, _ltr_params()), both_ways),
            str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  hf_config = hf_files.bert_config_to_hf_config(both_ways, ["BertLMHeadModel"])
  (tmp_path / "config.json").write_text(json.dumps({**hf_config, "is_decoder": True}))
  theirs_model = transformers.BertLMHeadModel.from_pretrained(str(tmp_path)).eval()
  rng = np.random.default_rng(1)
  ids = rng.integers(5, CONFIG.vocab_size, (3, 12)).astype(np.int32)
  mask = (np.arange(12)[None, :] < np.array([[12], [9], [5]])).astype(np.int32)
  with torch.no_grad():
    theirs = theirs_model(torch.tensor(ids * mask, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  xla = dataclasses.replace(CONFIG, attention="xla")
  ours = np.asarray(jit(functools.partial(_lm_logits, xla))(
      _ltr_params(), jnp.asarray(ids * mask), jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4 * np.abs(theirs).max())


def test_splash_causal_mask_equals_the_causal_reference_in_the_interpreter():
  batch, seq, heads_, head_dim = 2, 128, 2, 16
  q, k, v = (jax.random.normal(jax.random.key(i), (batch, seq, heads_, head_dim))
             for i in range(3))
  real = np.arange(seq)[None, :] < np.array([[128], [90]])
  mask = attention.AttentionMask(jnp.asarray(real, jnp.int32))

  def reference(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    probs = jax.nn.softmax(jnp.where(mask.dense(causal=True), scores, -np.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

  splash = functools.partial(attention.splash_attention, causal=True, interpret=True)
  out, expected = jit(lambda: (splash(q, k, v, mask), reference(q, k, v)))()
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(expected)[real], atol=1e-5)
  dense = np.asarray(mask.dense(causal=True))[1, 0]
  assert dense[5, :6].all() and not dense[5, 6:].any() and dense[100, :90].all()


def test_next_token_loss_equals_the_loss_by_hand():
  """The LTR task's loss on a fixed example (loader.NextTokens targets, the task's terms) is
  the mean over real positions i < n - 1 of -log softmax(logits_i)[token_{i+1}], computed here
  in numpy from the logits at every position."""
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=CONFIG.vocab_size)
  spans = [(np.array([17, 42, 9, 63, 8]), np.zeros(0, np.int32), False),
           (np.array([77, 5, 31]), np.zeros(0, np.int32), False)]
  batch = pairs.pad_pairs(spans, 9, special)  # [CLS] span [SEP], rows of 7 and 5 tokens
  batch.update(loader.NextTokens(special, 0).apply(batch, np.arange(2), None))
  batch["example_weight"] = np.ones(2, np.float32)
  model = heads.BertForPreTraining(CONFIG, next_sentence=False)
  terms_fn = pretraining.make_terms(baseline_token=42, nsp=False, left_to_right=True)

  @jit
  def task_loss_and_logits(params, batch):
    terms = terms_fn(heads.apply_to_batch(model, params, batch, deterministic=True), batch)
    values, weights = terms["next_token_loss"]
    assert sorted(terms) == ["frequency_baseline_next_token_accuracy", "next_token_accuracy",
                             "next_token_loss"]
    every = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                        batch["input_mask"], deterministic=True)[0]
    return jnp.sum(values * weights) / jnp.sum(weights), every

  loss, logits = task_loss_and_logits(_ltr_params(), batch)
  logits = np.asarray(logits, np.float64)[..., :CONFIG.vocab_size]  # [2, 9, vocab]
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  by_hand = []
  for row, n in enumerate(batch["input_mask"].sum(axis=1)):
    tokens = batch["input_ids"][row]
    by_hand += [-log_probs[row, i, tokens[i + 1]] for i in range(n - 1)]
  assert len(by_hand) == 6 + 4
  assert float(loss) == pytest.approx(np.mean(by_hand), rel=1e-5)


def test_a_causal_model_pools_each_sequences_last_token_packed_or_not():
  ids = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(bert.last_token_positions(jnp.array([[1, 1, 1, 0], [0, 0, 0, 0]])),
                                [2, 0])
  np.testing.assert_array_equal(bert.last_token_positions(ids > 0, ids, 3), [[2, 4, 0], [5, 0, 0]])
  config = dataclasses.replace(CONFIG, attention="xla")
  model = heads.BertForSequenceClassification(config, 3)
  unpacked, (packed, where) = unpacked_batch(), packed_batch()

  @jit
  def logits(batches):
    params = heads.init_from_batch(model, jax.random.key(0), batches[0])
    return [heads.apply_to_batch(model, nn.unbox(params), b, deterministic=True)
            for b in batches]

  expected, packed_logits = logits([unpacked, packed])
  for example, (row, slot) in where.items():
    np.testing.assert_allclose(packed_logits[row, slot], expected[example], atol=1e-5)
