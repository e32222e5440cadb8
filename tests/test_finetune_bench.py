"""The fine-tuning speed script (bertjax.tools.finetune_bench), by its pieces on a tiny setting: the
setup gives both peers the same weights and the same token ids, the transformers peer fine-tunes
and scores, the bertjax command is a valid fine-tuning command, and the report reads. (The whole
script runs both peers as subprocesses; on the default setting it takes minutes.)"""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from bertjax.tools import finetune_bench, finetune_bench_torch
from bertjax.configs import glue as glue_config
from bertjax.convert import hf
from bertjax.data.finetuning import glue as glue_data
from bertjax.modeldir import model_files


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  return finetune_bench.prepare(str(tmp_path_factory.mktemp("bench")), num_train=64, num_dev=24,
                                size="tiny", num_layers=2, vocab_size=400, max_seq_length=32)


def test_both_peers_start_from_the_same_weights_and_token_ids(prepared):
  params, config = hf.load_bertjax_checkpoint(prepared.model_dir)
  assert (config.num_layers, config.hidden_size) == (2, 128)
  tensors = load_file(os.path.join(prepared.hf_dir, "model.safetensors"))
  np.testing.assert_array_equal(
      tensors["bert.embeddings.word_embeddings.weight"],
      np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])[:config.vocab_size])
  np.testing.assert_array_equal(
      tensors["bert.encoder.layer.1.attention.self.query.weight"],
      np.asarray(params["bert"]["encoder"]["layer_1"]["attention"]["query"]["kernel"]).T)
  ids = np.load(prepared.token_ids)
  tokenizer = model_files.load_tokenizer(prepared.model_dir)
  for split, n in (("train", 64), ("dev", 24)):
    examples = glue_data.read_examples("sst2", split, prepared.glue_dir)
    assert len(examples) == n
    features = glue_data.encode_examples(examples, glue_data.TASKS["sst2"], tokenizer, 32)
    for key in ("input_ids", "input_mask", "label"):
      np.testing.assert_array_equal(ids[f"{split}_{key}"], features[key], err_msg=key)


def test_the_transformers_peer_fine_tunes_and_scores(prepared):
  result = finetune_bench_torch.transformers_peer(prepared.hf_dir, prepared.token_ids,
                                                  batch_size=16, eval_batch_size=16, seed=0)
  assert set(result) == {"accuracy", "load_seconds", "train_seconds", "eval_seconds"}
  assert 0 <= result["accuracy"] <= 1 and result["train_seconds"] > 0
  assert result["accuracy"] * 24 == round(result["accuracy"] * 24)  # hits / 24 dev sentences


def test_the_bertjax_command_is_a_fine_tuning_command(prepared, tmp_path):
  command = finetune_bench.bertjax_command(prepared, str(tmp_path), batch_size=16,
                                           eval_batch_size=16, max_seq_length=32, packing="4",
                                           length_buckets="auto")
  assert command[1:4] == ["-m", "bertjax.main", "--config=configs/glue.py"]
  config = glue_config.get_config()
  for flag in command[4:]:
    name, value = flag[2:].split("=", 1)
    if name.startswith("config."):
      section = config
      *path, field = name.split(".")[1:]
      for part in path:
        section = section[part]
      assert field in section, flag
  assert "--config.task=sst2" in command and "--config.data.packing=4" in command
  # Without --packing and --length_buckets: the config's defaults, as a user runs it.
  default = finetune_bench.bertjax_command(prepared, str(tmp_path), batch_size=16,
                                           eval_batch_size=16, max_seq_length=32)
  assert not [flag for flag in default if "packing" in flag or "length_buckets" in flag]


def test_the_script_measures_the_defaults_which_pack(tmp_path):
  """The script's own command line, bertjax only, on a tiny setting: the run takes
  configs/glue.py's defaults, and data.packing="auto" packs the sentences (54.6 tokens on average
  in 128: 2 a row), which the figures report (from the run's first line)."""
  out = tmp_path / "figures.json"
  assert finetune_bench.main([
      "--num_train=64", "--num_dev=24", "--size=tiny", "--num_layers=2", "--vocab_size=400",
      "--batch_size=16", "--eval_batch_size=8", "--peers=bertjax", f"--workdir={tmp_path}",
      f"--json={out}"]) == 0
  ran = json.loads(out.read_text())["bertjax"]
  assert (ran["packing"], ran["length_buckets"]) == (2, "auto")
  assert 0 <= ran["accuracy"] <= 1 and ran["cpu_seconds"] > 0


def test_the_report(capsys):
  results = {"num_layers": 6, "size": "small", "num_train": 3200, "num_dev": 800,
             "batch_size": 32, "load_average_before": 0.5, "load_average_after": 1.0,
             "cpu_count": 2,
             "bertjax": {"seconds": 80.0, "cpu_seconds": 150.0, "accuracy": 0.75, "packing": 4,
                         "length_buckets": "auto"},
             "transformers": {"seconds": 100.0, "cpu_seconds": 190.0, "accuracy": 0.74}}
  text = finetune_bench.report(results)
  assert "  bertjax          80.0 s wall   150.0 s CPU   dev accuracy 0.7500" in text
  assert "bertjax is 1.25x as fast as transformers" in text
  assert "bertjax packed 4 sentences a row, data.length_buckets='auto'" in text
  json.dumps(results)  # what --json writes


def test_a_setup_is_reused_only_for_the_same_arguments(prepared):
  directory = os.path.dirname(prepared.model_dir)
  arguments = dict(num_train=64, num_dev=24, size="tiny", num_layers=2, vocab_size=400,
                   max_seq_length=32)
  assert finetune_bench.prepare(directory, **arguments) == prepared
  with pytest.raises(SystemExit, match="other arguments"):
    finetune_bench.prepare(directory, **dict(arguments, num_layers=3))
