"""Sentence embeddings (bertjax.embedding, python -m bertjax.embed) against sentence-transformers'
`encode` on the same directories: tiny random BERT and ModernBERT encoders saved by
sentence-transformers with each pooling mode, Dense layers, normalisation, prompts in and out of
the pooling, texts longer than max_seq_length; a directory in the format of sentence-transformers
before version 6; the command as the docs give it; 8 devices against one; every refused input.

The rule for "equal" is the issue's: cosine >= 0.99999 and max |difference| <= 1e-4, row by row.
"""
import json
import os
import sys
import warnings

import numpy as np
import pytest

from bertjax import embed
from bertjax.embedding import embedder

from conftest import ROOT, cpu_env
import warm_python
from embedding_helpers import (TEXTS, WORDS, hf_bert_dir, modernbert_dir,
                               sentence_transformer_dir)



def _assert_equal_embeddings(ours, theirs):
  assert ours.shape == theirs.shape and ours.dtype == np.float32
  cosine = np.sum(ours * theirs, -1) / (np.linalg.norm(ours, axis=-1) *
                                         np.linalg.norm(theirs, axis=-1))
  assert cosine.min() >= 0.99999, cosine
  assert np.abs(ours - theirs).max() <= 1e-4


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
  root = tmp_path_factory.mktemp("encoders")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return {"bert": hf_bert_dir(str(root / "bert")),
            "modernbert": modernbert_dir(str(root / "modernbert"))}


@pytest.mark.parametrize("architecture, modes, options", [
    ("bert", ("mean",), dict(dense=True, normalize=True)),
    ("bert", ("cls",), {}),
    ("bert", ("max",), {}),
    ("bert", ("mean_sqrt_len_tokens",), {}),
    ("bert", ("weightedmean",), {}),
    ("bert", ("lasttoken",), {}),
    ("bert", ("cls", "mean"), dict(include_prompt=False)),
    ("modernbert", ("mean",), dict(normalize=True, max_seq_length=24)),
    ("modernbert", ("cls",), dict(include_prompt=False, dense=True)),
])
def test_embeddings_equal_sentence_transformers(encoders, tmp_path, architecture, modes,
                                                options):
  """Each pooling mode (and two at once), Dense, Normalize, a prompt pooled or left out, texts
  cut at max_seq_length: bertjax's embeddings are sentence-transformers' on the same directory,
  without a prompt, with a named one and with one given."""
  st_dir = str(tmp_path / "st")
  theirs = sentence_transformer_dir(st_dir, encoders[architecture], list(modes), **options)
  ours = embedder.Embedder.load(st_dir)
  assert ours.max_seq_length == theirs.max_seq_length
  for prompt in ({}, dict(prompt_name="query"), dict(prompt="w5 w6 ")):
    _assert_equal_embeddings(ours.encode(TEXTS, batch_size=4, **prompt),
                             theirs.encode(TEXTS, **prompt))


def test_the_format_before_sentence_transformers_6_reads_as_it_does(encoders, tmp_path):
  """modules.json naming sentence_transformers.models.*, Pooling's pooling_mode_* flags, and
  sentence_bert_config.json's max_seq_length and do_lower_case, as models on the hub were saved
  by sentence-transformers 2 to 5: read as sentence-transformers 6 reads them."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
  st_dir = tmp_path / "old"
  st_dir.mkdir()
  for name in os.listdir(encoders["bert"]):
    os.link(os.path.join(encoders["bert"], name), st_dir / name)
  (st_dir / "modules.json").write_text(json.dumps([
      {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Normalize",
       "type": "sentence_transformers.models.Normalize"}]))
  (st_dir / "1_Pooling").mkdir()
  (st_dir / "1_Pooling" / "config.json").write_text(json.dumps(
      {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
       "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True,
       "pooling_mode_mean_sqrt_len_tokens": False}))
  (st_dir / "2_Normalize").mkdir()
  (st_dir / "sentence_bert_config.json").write_text(
      json.dumps({"max_seq_length": 12, "do_lower_case": True}))
  ours = embedder.Embedder.load(str(st_dir))
  assert (ours.recipe.pooling, ours.max_seq_length, ours.recipe.normalize) == (("max",), 12, True)
  theirs = SentenceTransformer(str(st_dir), device="cpu")
  _assert_equal_embeddings(ours.encode(TEXTS), theirs.encode(TEXTS))


def test_a_plain_model_directory_embeds_with_the_pooling_given(encoders, tmp_path):
  """A Hugging Face directory (no modules.json) with --pooling=mean --normalize is
  sentence-transformers' Transformer + mean Pooling + Normalize over it."""
  theirs = sentence_transformer_dir(str(tmp_path / "st"), encoders["bert"], ["mean"],
                                 normalize=True, max_seq_length=64)
  ours = embedder.Embedder.load(encoders["bert"], pooling_modes=("mean",), normalize=True)
  # sentence-transformers lower-cases through the do_lower_case it was given; the plain
  # directory's own tokenizer (BertTokenizerFast) lower-cases already.
  _assert_equal_embeddings(ours.encode(TEXTS), theirs.encode(TEXTS))


def test_the_command_writes_the_rows_in_input_order(encoders, tmp_path):
  """`python -m bertjax.embed` on a sentence-transformers directory, a text file and a JSONL
  file: OUT.npy holds encode's rows in the file's order; float16 on request."""
  st_dir = str(tmp_path / "st")
  sentence_transformer_dir(st_dir, encoders["bert"], ["mean"], normalize=True)
  (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
  (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
  expected = embedder.Embedder.load(st_dir).encode(TEXTS)
  assert embed.main([f"--model={st_dir}", f"--input={tmp_path}/texts.txt",
                     f"--output={tmp_path}/a.npy", "--batch_size=3"]) == 0
  np.testing.assert_allclose(np.load(tmp_path / "a.npy"), expected, atol=1e-6)
  assert embed.main([f"--model={st_dir}", f"--input={tmp_path}/texts.jsonl", "--field=body",
                     f"--output={tmp_path}/b.npy", "--dtype=float16"]) == 0
  written = np.load(tmp_path / "b.npy")
  assert written.dtype == np.float16
  np.testing.assert_allclose(written, expected, atol=2e-3)


def test_eight_devices_give_one_devices_embeddings(encoders, tmp_path):
  """Batches split over 8 simulated devices (a batch of 5 padded to 8 rows) give the
  embeddings one device gives."""
  st_dir = str(tmp_path / "st")
  sentence_transformer_dir(st_dir, encoders["modernbert"], ["mean"], normalize=True)
  (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
  out = warm_python.run([sys.executable, "-m", "bertjax.embed", f"--model={st_dir}",
                         f"--input={tmp_path}/texts.txt", f"--output={tmp_path}/eight.npy",
                         "--batch_size=5"], env=cpu_env(8), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  one = embedder.Embedder.load(st_dir)
  assert one.mesh.devices.size == 1
  np.testing.assert_allclose(np.load(tmp_path / "eight.npy"), one.encode(TEXTS, batch_size=5),
                             atol=1e-5)


def test_bad_input_is_one_line(encoders, tmp_path, capsys):
  """Each refused input: one line naming the problem and the fix, exit 2, nothing written."""
  st_dir = str(tmp_path / "st")
  sentence_transformer_dir(st_dir, encoders["bert"], ["mean"])
  (tmp_path / "texts.txt").write_text("w1 w2\n\nw3\n")
  (tmp_path / "ok.txt").write_text("w1 w2\n")
  (tmp_path / "bad.jsonl").write_text('{"text": "w1"}\n{"body": "w2"}\n')
  (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
  (tmp_path / "kept.npy").write_bytes(b"mine")
  odd = tmp_path / "odd"
  odd.mkdir()
  for name in os.listdir(st_dir):
    if os.path.isfile(os.path.join(st_dir, name)) and name != "modules.json":
      os.link(os.path.join(st_dir, name), odd / name)
  (odd / "modules.json").write_text(json.dumps(
      [{"path": "", "type": "sentence_transformers.models.Transformer"},
       {"path": "x", "type": "sentence_transformers.models.LSTM"}]))
  ok = f"--input={tmp_path}/ok.txt"
  capsys.readouterr()
  cases = [
      ([f"--model={st_dir}", f"--input={tmp_path}/texts.txt"], "text 2 (of 3) is empty"),
      ([f"--model={st_dir}", f"--input={tmp_path}/none.txt"], "is not a file"),
      ([f"--model={st_dir}", f"--input={tmp_path}/bad.jsonl"],
       "line 2 is not a JSON object with a 'text' field"),
      ([f"--model={encoders['bert']}", ok], "says nothing of pooling; give --pooling"),
      ([f"--model={st_dir}", ok, "--pooling=mean"], "with its own pooling; leave --pooling out"),
      ([f"--model={encoders['bert']}", ok, "--pooling=average"], "--pooling=average; use cls"),
      ([f"--model={st_dir}", ok, "--prompt_name=passage"],
       "--prompt_name=passage: the model's prompts are doc, document, query"),
      ([f"--model={odd}", ok], "module 'sentence_transformers.models.LSTM' is not one"),
      ([f"--model={tmp_path}/nowhere", ok], "is not a directory"),
      ([f"--model={st_dir}", f"--input={tmp_path}/latin1.txt"], "latin1.txt is not UTF-8: line 1"),
  ]
  for args, message in cases:
    assert embed.main([*args, f"--output={tmp_path}/out.npy"]) == 2, args
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, (args, err)
  assert not (tmp_path / "out.npy").exists()
  assert embed.main([f"--model={st_dir}", ok, f"--output={tmp_path}/kept.npy"]) == 2
  assert "exists; name a new file" in capsys.readouterr().err
  assert (tmp_path / "kept.npy").read_bytes() == b"mine"


def test_the_docs_commands_run_as_written(encoders, tmp_path, monkeypatch, capsys):
  """docs/embeddings.md's commands and its Python example, as written, in a directory holding
  ST_DIR (a sentence-transformers model with a "query" prompt), MODEL_DIR (a Hugging Face
  BERT), texts.txt and queries.jsonl: each writes its array, the rows in the file's order."""
  import re  # pylint: disable=import-outside-toplevel
  import shlex  # pylint: disable=import-outside-toplevel
  import docs_text  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  sentence_transformer_dir("ST_DIR", encoders["bert"], ["mean"], normalize=True)
  os.symlink(encoders["bert"], "MODEL_DIR")
  (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
  (tmp_path / "queries.jsonl").write_text(
      "".join(json.dumps({"question": t, "id": i}) + "\n" for i, t in enumerate(TEXTS[:3])))
  page = docs_text.read("docs/embeddings.md")
  # (The section "Evaluate" is test_embedding_evaluation.py's.)
  commands = docs_text.bash_commands(page.split("\n## Evaluate\n")[0])
  assert len(commands) == 4
  for command in commands[:3]:
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "bertjax.embed"], command
    assert embed.main(args[3:]) == 0, (command, capsys.readouterr().err)
  model = embedder.Embedder.load("ST_DIR")
  np.testing.assert_allclose(np.load("vectors.npy"), model.encode(TEXTS), atol=1e-6)
  np.testing.assert_allclose(np.load("queries.npy"),
                             model.encode(TEXTS[:3], prompt_name="query"), atol=1e-6)
  assert np.load("mean.npy").shape == (len(TEXTS), 32)
  # The export, from a bertjax model directory (MODEL_DIR converted from Hugging Face, with
  # the WordPiece vocab.txt bertjax reads).
  from bertjax.convert import __main__ as convert  # pylint: disable=import-outside-toplevel
  from bertjax.embedding import st_export  # pylint: disable=import-outside-toplevel
  os.remove("MODEL_DIR")
  os.mkdir("hf")
  for name in ("config.json", "model.safetensors"):
    os.link(os.path.join(encoders["bert"], name), os.path.join("hf", name))
  (tmp_path / "hf" / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
  convert.from_hf_dir("hf", "MODEL_DIR")
  args = shlex.split(commands[3])
  assert args[:3] == ["python", "-m", "bertjax.embedding.st_export"]
  assert st_export.main(args[3:]) == 0, capsys.readouterr().err
  assert os.path.isfile("ST_EXPORT/modules.json")
  [example] = re.findall(r"```python\n(.*?)```", page, re.S)
  exec(compile(example, "docs/embeddings.md", "exec"), {})  # pylint: disable=exec-used
  assert "(2, 32)" in capsys.readouterr().out


def test_the_speed_benchmark_compares_the_same_embeddings(tmp_path, capsys):
  """bertjax.tools.embed_bench on a tiny model and 40 sentences of the bundled corpus: both
  engines embed every sentence, the same vectors, and print their rate."""
  from bertjax.tools import embed_bench  # pylint: disable=import-outside-toplevel
  assert embed_bench.main(["prepare", f"--dir={tmp_path}", "--sentences=40", "--size=tiny"]) == 0
  _, ours = embed_bench.run(str(tmp_path), "bertjax")
  _, theirs = embed_bench.run(str(tmp_path), "sentence-transformers")
  assert ours.shape == (40, 32)
  _assert_equal_embeddings(ours, theirs)
  assert "sentences/s" in capsys.readouterr().out


@pytest.mark.parametrize("architecture", ["bert", "modernbert"])
def test_a_bertjax_model_exports_as_a_sentence_transformers_directory(encoders, tmp_path,
                                                                      architecture, capsys):
  """A bertjax model directory (here converted from Hugging Face) written by
  `python -m bertjax.embedding.st_export` loads in sentence-transformers, whose encode gives
  bertjax's embeddings of the model directory with the same pooling; bertjax reads the export
  back to the same embeddings."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
  from bertjax.convert import __main__ as convert  # pylint: disable=import-outside-toplevel
  from bertjax.embedding import st_export  # pylint: disable=import-outside-toplevel
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  for name in os.listdir(encoders[architecture]):
    os.link(os.path.join(encoders[architecture], name), hf_dir / name)
  if architecture == "bert":  # bertjax reads a WordPiece vocabulary from vocab.txt
    (hf_dir / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    (hf_dir / "tokenizer.json").unlink()
  convert.from_hf_dir(str(hf_dir), str(tmp_path / "model"))
  assert st_export.main([f"--src={tmp_path}/model", f"--dst={tmp_path}/st", "--pooling=mean",
                         "--normalize", "--max_seq_length=32"]) == 0
  ours = embedder.Embedder.load(str(tmp_path / "model"), pooling_modes=("mean",),
                                normalize=True, max_seq_length=32).encode(TEXTS)
  theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu")
  assert theirs.max_seq_length == 32
  _assert_equal_embeddings(ours, theirs.encode(TEXTS))
  _assert_equal_embeddings(embedder.Embedder.load(str(tmp_path / "st")).encode(TEXTS),
                           theirs.encode(TEXTS))
  # Refused, one line each: an unknown mode; a destination that holds files (left as it was).
  before = sorted(os.listdir(tmp_path / "st"))
  for dst, pooling, message in ((tmp_path / "other", "avg", "--pooling=avg; use cls"),
                                (tmp_path / "st", "mean", "is not an empty directory")):
    capsys.readouterr()
    assert st_export.main([f"--src={tmp_path}/model", f"--dst={dst}",
                           f"--pooling={pooling}"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / "other").exists() and sorted(os.listdir(tmp_path / "st")) == before
