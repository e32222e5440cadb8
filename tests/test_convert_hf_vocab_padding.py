"""The vocabulary padding across conversion: an odd vocabulary (1001 tokens) gains zero rows up
to padded_vocab_size on import and loses them on export, through hf and the command line; an
unpadded older bertjax checkpoint exports; bert_config.json records the pad multiple (the
model) but not attention or remat (the run)."""
import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers

from bertjax.modeldir import model_files
from bertjax.modeldir import saved_params
from bertjax.convert import __main__ as cli
from bertjax.convert import hf, hf_files
from bertjax.models.config import BertConfig
from convert_hf_helpers import _flat, _hf_config


ODD_VOCAB = 1001  # odd like BERT's 30522: no pad multiple divides it


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory):
  """A BertForPreTraining with 1001 tokens whose MLM bias is random (transformers starts it at
  zero), saved; and its tensors."""
  torch.manual_seed(8)
  model = transformers.BertForPreTraining(_hf_config(vocab_size=ODD_VOCAB)).eval()
  with torch.no_grad():
    model.cls.predictions.bias.normal_()
  directory = str(tmp_path_factory.mktemp("odd_vocab"))
  model.save_pretrained(directory)
  return directory, hf_files.load_hf_state_dict(directory)


@pytest.mark.parametrize("multiple,rows", [(128, 1024), (8, 1008), (1, 1001)])
def test_odd_vocab_pads_on_import_and_strips_on_export(odd_vocab, multiple, rows):
  """The word embeddings and the MLM bias gain zero rows up to padded_vocab_size on import and
  lose them on export: the round trip gives back every tensor bitwise."""
  directory, state = odd_vocab
  config = dataclasses.replace(
      hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)),
      pad_vocab_to_multiple=multiple)
  assert (config.vocab_size, config.padded_vocab_size) == (ODD_VOCAB, rows)
  params, _ = hf.from_hf(state, config)
  for path, name in (("bert/embeddings/word_embeddings/embedding",
                      "bert.embeddings.word_embeddings.weight"),
                     ("masked_lm/output_bias", "cls.predictions.bias")):
    padded = _flat(params)[path]
    assert padded.shape[0] == rows
    np.testing.assert_array_equal(padded[:ODD_VOCAB], state[name])
    assert not padded[ODD_VOCAB:].any()
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(state)
  for name in state:
    assert back[name].dtype == state[name].dtype
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)


def test_odd_vocab_round_trips_through_the_cli(tmp_path, odd_vocab):
  """--from=hf writes padded weights and a bert_config.json with the real vocab_size and the
  pad multiple; --to=hf writes config.json with the real vocab_size and the tensors bitwise."""
  directory, state = odd_vocab
  out, back = tmp_path / "out", tmp_path / "back"
  cli.from_hf_dir(directory, str(out))
  saved = json.loads((out / "bert_config.json").read_text())
  assert (saved["vocab_size"], saved["pad_vocab_to_multiple"]) == (ODD_VOCAB, 128)
  shapes = saved_params.saved_param_shapes(str(out))
  assert shapes["bert/embeddings/word_embeddings/embedding"] == (1024, 32)
  assert shapes["masked_lm/output_bias"] == (1024,)
  assert cli.to_hf_dir(str(out), str(back)) == "BertForPreTraining"
  assert json.loads((back / "config.json").read_text())["vocab_size"] == ODD_VOCAB
  exported = hf_files.load_hf_state_dict(str(back))
  assert sorted(exported) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(exported[name], state[name], err_msg=name)


def test_unpadded_bertjax_checkpoint_exports(tmp_path, odd_vocab):
  """A model directory saved before bertjax padded the vocabulary (1001 rows, no
  pad_vocab_to_multiple in bert_config.json) reads padded to 1024 rows and exports bitwise."""
  directory, state = odd_vocab
  unpadded = dataclasses.replace(
      hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)),
      pad_vocab_to_multiple=1)
  params, _ = hf.from_hf(state, unpadded)
  model_files.save_model_dir(str(tmp_path / "old"), params, unpadded)
  old_json = json.loads((tmp_path / "old" / "bert_config.json").read_text())
  del old_json["pad_vocab_to_multiple"]
  (tmp_path / "old" / "bert_config.json").write_text(json.dumps(old_json))

  loaded, config = hf.load_bertjax_checkpoint(str(tmp_path / "old"))
  assert config.pad_vocab_to_multiple == 128 and config.vocab_size == ODD_VOCAB
  embedding = loaded["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert embedding.shape == (1024, 32) and not embedding[ODD_VOCAB:].any()
  cli.to_hf_dir(str(tmp_path / "old"), str(tmp_path / "back"))
  exported = hf_files.load_hf_state_dict(str(tmp_path / "back"))
  for name in state:
    np.testing.assert_array_equal(exported[name], state[name], err_msg=name)


def test_bert_config_json_keeps_the_model_not_the_run(tmp_path):
  """bert_config.json records pad_vocab_to_multiple (it shapes the weights) but not attention
  or remat (how a run computes); reading ignores those, and a file without the pad multiple
  (Google's fields, an older bertjax) gets BertConfig's default."""
  config = BertConfig(vocab_size=ODD_VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=37, attention="xla", attention_dropout_rate=0.0,
                      remat="full", pad_vocab_to_multiple=64)
  written = json.loads(model_files.bert_config_json(config))
  assert "attention" not in written and "remat" not in written
  assert (written["vocab_size"], written["pad_vocab_to_multiple"]) == (ODD_VOCAB, 64)
  (tmp_path / "bert_config.json").write_text(json.dumps(
      {**written, "attention": "splash", "remat": "dots"}))  # as a run's own choices were once
  assert model_files.load_bert_config(str(tmp_path)) == dataclasses.replace(
      config, attention="reference", remat="none")
  del written["pad_vocab_to_multiple"]
  (tmp_path / "bert_config.json").write_text(json.dumps(written))
  assert model_files.load_bert_config(str(tmp_path)).pad_vocab_to_multiple == 128
