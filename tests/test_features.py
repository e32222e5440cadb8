"""Feature extraction (configs/features.py) on a converted Hugging Face model: the written
vectors equal transformers' hidden states, in extract_features.py's format."""
import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import transformers

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.convert import __main__ as convert_cli
from bertjax.data import sources
from bertjax.tasks import features

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = [
    "It is a truth universally acknowledged.",
    "Emma Woodhouse, handsome, clever, and rich. ||| She had lived nearly twenty-one years.",
    " ".join(["Elinor and Marianne walked to the cottage"] * 6),  # cut to max_seq_length
    "Short. ||| " + " ".join(["a much longer second segment of the pair"] * 4),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """A random transformers BertModel with a sentencepiece vocabulary, converted to bertjax."""
  directory = tmp_path_factory.mktemp("features")
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:20]
  vocab = str(directory / "vocab.model")
  tok = tokenization.load_or_train_sentencepiece(
      lambda: (s for doc in documents for s in doc), vocab, 300)
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=64, initializer_range=0.2)
  model = transformers.BertModel(hf_config).eval()
  hf_dir = directory / "hf"
  model.save_pretrained(str(hf_dir))
  shutil.copy(vocab, hf_dir / "vocab.model")
  out = directory / "bertjax"
  convert_cli.from_hf_dir(str(hf_dir), str(out))
  return model, str(out)


def _run(workdir, *flags):
  return warm_python.run(
      [sys.executable, "-m", "bertjax.main", f"--config={ROOT}/bertjax/configs/features.py",
       f"--workdir={workdir}", *flags],
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), cwd=ROOT,
      timeout=300)


def test_features_equal_transformers_hidden_states(model_dir, tmp_path):
  model, checkpoint_dir = model_dir
  input_file = tmp_path / "input.txt"
  input_file.write_text("\n".join(LINES) + "\n")
  layers = [-1, -3, 1]
  out = _run(tmp_path / "run", f"--config.init_checkpoint={checkpoint_dir}",
             f"--config.input_file={input_file}", "--config.layers=-1,-3,1",
             "--config.max_seq_length=20", "--config.batch_size=3")
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "run" / features.OUTPUT_FILE) as f:
    records = [json.loads(line) for line in f]
  assert [r["linex_index"] for r in records] == [0, 1, 2, 3]

  tok = model_files.load_tokenizer(checkpoint_dir)
  for line, record in zip(LINES, records):
    a, _, b = line.partition(" ||| ")
    ids, segments = features.encode(tok, a, b or None, 20)
    assert len(ids) <= 20
    assert [t["token"] for t in record["features"]] == [tok.id_to_token(i) for i in ids]
    assert record["features"][0]["token"] == "[CLS]"
    assert record["features"][-1]["token"] == "[SEP]"
    with torch.no_grad():
      hidden = model(torch.tensor([ids]), token_type_ids=torch.tensor([segments]),
                     output_hidden_states=True).hidden_states[1:]  # the layers, not embeddings
    for position, feature in enumerate(record["features"]):
      assert [layer["index"] for layer in feature["layers"]] == layers
      for layer in feature["layers"]:
        expected = hidden[layer["index"]][0, position].numpy()
        np.testing.assert_allclose(layer["values"], expected, atol=1e-5)
  # The pair's segments: the longer segment (B) was cut first.
  pair_ids, pair_segments = features.encode(tok, "Short.", LINES[3].split(" ||| ")[1], 20)
  assert len(pair_ids) == 20 and pair_segments.count(0) == len(tok.encode("Short.")) + 2


def test_existing_output_and_bad_layers_are_refused(model_dir, tmp_path):
  _, checkpoint_dir = model_dir
  input_file = tmp_path / "input.txt"
  input_file.write_text("One line.\n")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / features.OUTPUT_FILE).write_text("earlier results\n")
  out = _run(workdir, f"--config.init_checkpoint={checkpoint_dir}",
             f"--config.input_file={input_file}")
  assert out.returncode == 2 and "features.jsonl exists" in out.stderr
  assert (workdir / features.OUTPUT_FILE).read_text() == "earlier results\n"
  out = _run(tmp_path / "other", f"--config.init_checkpoint={checkpoint_dir}",
             f"--config.input_file={input_file}", "--config.layers=-4")
  assert out.returncode == 2 and "has 3 layers" in out.stderr


def test_encode_single_and_pair_exact():
  class Tok:
    cls_id, sep_id = 2, 3

    def encode(self, text):
      return [10 + len(w) for w in text.split()]

  ids, segments = features.encode(Tok(), "a bb ccc", None, 4)
  assert ids == [2, 11, 12, 3] and segments == [0, 0, 0, 0]
  ids, segments = features.encode(Tok(), "a bb", "ccc dddd eeeee", 7)
  assert ids == [2, 11, 12, 3, 13, 14, 3] and segments == [0, 0, 0, 0, 1, 1, 1]


def test_modernbert_features_equal_transformers_hidden_states(tmp_path):
  """A random transformers ModernBertModel (4 layers, two of them local with a window of 4
  tokens a side), converted: its layers' outputs (the last after the final norm, as
  transformers gives it) at every token."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:20]
  vocab = str(tmp_path / "vocab.model")
  tok = tokenization.load_or_train_sentencepiece(
      lambda: (s for doc in documents for s in doc), vocab, 300)
  torch.manual_seed(0)
  hf_config = transformers.ModernBertConfig(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
      intermediate_size=48, local_attention=8, max_position_embeddings=64,
      initializer_range=0.2, pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
      sep_token_id=tok.sep_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id,
      attn_implementation="eager")
  model = transformers.ModernBertModel(hf_config).eval()
  model.save_pretrained(str(tmp_path / "hf"))
  shutil.copy(vocab, tmp_path / "hf" / "vocab.model")
  convert_cli.from_hf_dir(str(tmp_path / "hf"), str(tmp_path / "bertjax"))
  input_file = tmp_path / "input.txt"
  input_file.write_text("\n".join(LINES) + "\n")
  out = _run(tmp_path / "run", f"--config.init_checkpoint={tmp_path / 'bertjax'}",
             f"--config.input_file={input_file}", "--config.layers=-1,-2,1",
             "--config.max_seq_length=20", "--config.batch_size=3")
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "run" / features.OUTPUT_FILE) as f:
    records = [json.loads(line) for line in f]
  for line, record in zip(LINES, records):
    a, _, b = line.partition(" ||| ")
    ids, _ = features.encode(tok, a, b or None, 20)
    with torch.no_grad():
      hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1:]
    for position, feature in enumerate(record["features"]):
      for layer in feature["layers"]:
        np.testing.assert_allclose(layer["values"], hidden[layer["index"]][0, position].numpy(),
                                   atol=1e-5)
