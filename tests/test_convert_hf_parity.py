"""bertjax.convert against transformers on the same weights: every hidden state, the pooler, the
MLM and NSP logits agree within ATOL (BertModel, BertForPreTraining, BertForMaskedLM)."""
import os

import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util
from safetensors.numpy import load_file

from bertjax.models import heads
from convert_hf_helpers import (MASK_ID, _assert_encoder_parity, _batch, _close, _close_mlm,
                                _convert, _flat, _fresh_params, _save_hf, _torch_out)
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_bert_model_parity(tmp_path, act):
  """BertModel saves prefix-less names; no heads; exact and tanh GELU. Weights 10x the usual
  init (0.2) put the feed-forward inputs where erf and tanh GELU differ by more than ATOL."""
  model, directory = _save_hf(transformers.BertModel, tmp_path, hidden_act=act,
                              initializer_range=0.2)
  assert "embeddings.word_embeddings.weight" in load_file(
      os.path.join(directory, "model.safetensors"))
  params, config, report = _convert(directory)
  assert set(params) == {"bert"}
  assert report.missing and all(p.startswith(("masked_lm/", "next_sentence/"))
                                for p in report.missing)
  assert report.task is None
  batch = _batch()
  _assert_encoder_parity(params, config, _torch_out(model, *batch), batch)


def test_pretraining_parity(pretraining):
  model, directory = pretraining
  params, config, report = _convert(directory)
  assert report.missing == [] and report.task is None
  batch = _batch()
  theirs = _torch_out(model, *batch)
  _assert_encoder_parity(params, config, _torch_out(model.bert, *batch), batch)
  mlm, nsp = heads.BertForPreTraining(config).apply({"params": params}, *batch,
                                                    deterministic=True)
  _close_mlm(mlm, theirs.prediction_logits, config)
  _close(nsp, theirs.seq_relationship_logits)


def test_pretraining_top5_at_masked_positions(pretraining):
  """The gathered (masked_lm_positions) path predicts the same top-5 tokens as transformers."""
  model, directory = pretraining
  params, config, _ = _convert(directory)
  ids, segments, mask = _batch()
  positions = np.array([[2, 7], [2, 2], [2, 2]])  # the MASK_ID positions (row 1, 2 repeat)
  assert (np.take_along_axis(ids, positions, 1) == MASK_ID).all()
  mlm, _ = heads.BertForPreTraining(config).apply({"params": params}, ids, segments, mask,
                                                  positions, deterministic=True)
  theirs = np.take_along_axis(_torch_out(model, ids, segments, mask).prediction_logits.numpy(),
                              positions[..., None], 1)  # [batch, positions, vocab]
  _close_mlm(mlm, torch.tensor(theirs), config)  # [batch, positions, padded vocab]
  top5 = lambda x: np.argsort(-np.asarray(x), axis=-1, kind="stable")[..., :5]
  np.testing.assert_array_equal(top5(mlm), top5(theirs))


def test_masked_lm_parity_reports_nsp_and_pooler_missing(tmp_path):
  model, directory = _save_hf(transformers.BertForMaskedLM, tmp_path, seed=3)
  params, config, report = _convert(directory)
  assert set(params) == {"bert", "masked_lm"} and "pooler" not in params["bert"]
  assert report.missing == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel",
                            "next_sentence/classifier/bias", "next_sentence/classifier/kernel"]
  full = _fresh_params(config)  # what load_params gives: fresh pooler and NSP head
  full = traverse_util.unflatten_dict({**_flat(full), **_flat(params)}, sep="/")
  batch = _batch()
  theirs = _torch_out(model, *batch)
  _assert_encoder_parity(full, config, theirs, batch, pooler=False)
  mlm, _ = heads.BertForPreTraining(config).apply({"params": full}, *batch, deterministic=True)
  _close_mlm(mlm, theirs.logits, config)
