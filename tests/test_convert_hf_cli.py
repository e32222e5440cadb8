"""python -m bertjax.convert --from=hf / --to=hf: the converted directory loads with load_params
and its export loads in transformers with the same logits; a masked-LM checkpoint loads with a
fresh NSP head and pooler; a non-empty --dst, a missing --src and a bad choice are refused."""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import transformers

from bertjax.modeldir import model_files
from bertjax.modeldir import saved_params
from bertjax.convert import __main__ as cli
from bertjax.convert import hf, hf_files
from convert_hf_helpers import (VOCAB, _assert_trees_equal, _batch, _fresh_params, _save_hf,
                                _torch_out)
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)

import warm_python


def test_cli_from_hf_then_load_params_then_to_hf(tmp_path, pretraining, capsys):
  model, directory = pretraining
  (tmp_path / "hf").mkdir()
  for name in os.listdir(directory):
    (tmp_path / "hf" / name).write_bytes(open(os.path.join(directory, name), "rb").read())
  vocab = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                    + [f"w{i}" for i in range(VOCAB - 5)]) + "\n"
  (tmp_path / "hf" / "vocab.txt").write_text(vocab)
  out, back = tmp_path / "out", tmp_path / "back"

  assert cli.main(["--from=hf", f"--src={tmp_path / 'hf'}", f"--dst={out}"]) == 0
  assert "converted 46 parameters" in capsys.readouterr().out
  assert (out / "vocab.txt").read_text() == vocab
  config = model_files.load_bert_config(str(out))
  assert config == hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  converted, _ = hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  loaded, report = saved_params.load_params(str(out), jax.tree.map(jnp.asarray,
                                                                 _fresh_params(config)))
  assert report.missing == [] and report.unused == []
  _assert_trees_equal(loaded, converted)

  assert cli.main(["--to=hf", f"--src={out}", f"--dst={back}"]) == 0
  assert (back / "vocab.txt").read_text() == vocab
  reloaded, info = transformers.BertForPreTraining.from_pretrained(str(back),
                                                                   output_loading_info=True)
  assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set())
  assert info["mismatched_keys"] in ([], set())
  batch = _batch()
  ours, theirs = _torch_out(reloaded.eval(), *batch), _torch_out(model, *batch)
  np.testing.assert_array_equal(ours.prediction_logits.numpy(), theirs.prediction_logits.numpy())
  np.testing.assert_array_equal(ours.seq_relationship_logits.numpy(),
                                theirs.seq_relationship_logits.numpy())
  assert json.loads((back / "config.json").read_text())["architectures"] == ["BertForPreTraining"]


def test_masked_lm_checkpoint_loads_with_fresh_nsp_and_pooler(tmp_path):
  _, directory = _save_hf(transformers.BertForMaskedLM, tmp_path / "hf", seed=5)
  cli.from_hf_dir(directory, str(tmp_path / "out"))
  config = model_files.load_bert_config(str(tmp_path / "out"))
  fresh = jax.tree.map(jnp.asarray, _fresh_params(config))
  loaded, report = saved_params.load_params(str(tmp_path / "out"), fresh)
  assert report.missing == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel",
                            "next_sentence/classifier/bias", "next_sentence/classifier/kernel"]
  np.testing.assert_array_equal(loaded["next_sentence"]["classifier"]["kernel"],
                                fresh["next_sentence"]["classifier"]["kernel"])
  assert cli.to_hf_dir(str(tmp_path / "out"), str(tmp_path / "back")) == "BertForMaskedLM"
  _, info = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "back"),
                                                         output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_cli_refuses_non_empty_dst(tmp_path, pretraining, capsys):
  _, directory = pretraining
  (tmp_path / "dst").mkdir()
  (tmp_path / "dst" / "keep.txt").write_text("mine")
  assert cli.main(["--from=hf", f"--src={directory}", f"--dst={tmp_path / 'dst'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("convert: error: --dst=") and "not an empty directory" in err
  assert os.listdir(tmp_path / "dst") == ["keep.txt"]
  assert (tmp_path / "dst" / "keep.txt").read_text() == "mine"


def test_cli_as_module_errors_and_choices(tmp_path):
  run = lambda *args: warm_python.run([sys.executable, "-m", "bertjax.convert", *args],
                                      timeout=120)
  result = run("--to=hf", f"--src={tmp_path / 'absent'}", f"--dst={tmp_path / 'out'}")
  assert result.returncode == 2 and "is not a directory" in result.stderr
  assert result.stderr.startswith("convert: error: --src=")
  assert not (tmp_path / "out").exists()
  result = run("--from=onnx", f"--src={tmp_path}", f"--dst={tmp_path / 'out'}")
  assert result.returncode == 2 and "invalid choice: 'onnx'" in result.stderr
