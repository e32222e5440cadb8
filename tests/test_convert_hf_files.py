"""bertjax.convert reading Hugging Face checkpoint files: old tensor names, a stored tied
decoder and buffers; pytorch_model.bin like safetensors, a malicious pickle refused; sharded
safetensors; no weights at all."""
import json
import os

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from bertjax.convert import hf, hf_files
from bertjax.errors import UserError
from convert_hf_helpers import _assert_trees_equal, _convert
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)


def test_old_names_tied_decoder_and_buffers(pretraining):
  """LayerNorm.gamma/beta, a stored (tied) decoder and the position_ids buffer convert."""
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  expected, config, _ = _convert(directory)
  old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                   "LayerNorm.beta"): v
         for k, v in state.items()}
  old["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  old["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  old["bert.embeddings.position_ids"] = np.arange(64)[None].astype(np.float32)
  params, report = hf.from_hf(old, config)
  _assert_trees_equal(params, expected)
  assert sorted(report.ignored) == ["bert.embeddings.position_ids",
                                    "cls.predictions.decoder.bias",
                                    "cls.predictions.decoder.weight"]
  # Only the decoder's copy of the output bias: read as the output bias.
  only_decoder = dict(state)
  only_decoder["cls.predictions.decoder.bias"] = only_decoder.pop("cls.predictions.bias")
  _assert_trees_equal(hf.from_hf(only_decoder, config)[0], expected)


def test_pytorch_bin_loads_like_safetensors(tmp_path, pretraining):
  model, directory = pretraining
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  (tmp_path / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  ours = hf_files.load_hf_state_dict(str(tmp_path))
  safe = hf_files.load_hf_state_dict(directory)
  assert set(safe) <= set(ours)  # the bin also holds the tied decoder
  for name in safe:
    np.testing.assert_array_equal(ours[name], safe[name])
  _assert_trees_equal(_convert(str(tmp_path))[0], _convert(directory)[0])


class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
  marker = tmp_path / "pwned"
  (tmp_path / "hf").mkdir()
  torch.save({"bert.embeddings.word_embeddings.weight": _Payload(marker)},
             tmp_path / "hf" / "pytorch_model.bin")
  with pytest.raises(UserError, match="pytorch_model.bin could not be read as plain weights"):
    hf_files.load_hf_state_dict(str(tmp_path / "hf"))
  assert not marker.exists()
  # Control: the file is live; an unsafe load of it runs the payload.
  torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=False)
  assert marker.exists()


def test_sharded_safetensors_load_whole(tmp_path, pretraining):
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  names = sorted(state)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for shard, shard_names in shards.items():
    save_file({n: state[n] for n in shard_names}, str(tmp_path / shard))
  index = {"weight_map": {n: shard for shard, ns in shards.items() for n in ns}}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  loaded = hf_files.load_hf_state_dict(str(tmp_path))
  assert sorted(loaded) == names
  for name in names:
    np.testing.assert_array_equal(loaded[name], state[name])


def test_no_weights_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="no model.safetensors or pytorch_model.bin"):
    hf_files.load_hf_state_dict(str(tmp_path))
