"""Tests of bertjax.data.prepare: shards equal whatever the workers or a crash, documents held
out whole, the vocabulary from training documents only, TFDS input, and every bad input."""
import glob
import json
import os
import socket
import sys

import numpy as np
import pytest

from bertjax import lock, tokenization
from bertjax.data import sources
from bertjax.data.pretraining import layout, masking, pairs, preparation, shards, text_shards
from bertjax.errors import UserError

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = dict(vocab_size=600, max_seq_length=(32, 64), max_predictions_per_seq=(5, 10),
             dupe_factor=2, eval_fraction=0.1, shard_size_mb=0.05)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
  """40 chapters of the bundled corpus in google-research/bert's format (about 6 text shards
  of 0.05 MB)."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:40]
  path = tmp_path_factory.mktemp("text") / "chapters.txt"
  path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def prepared(text_file, tmp_path_factory):
  """DATA prepared in this process, one worker."""
  data = str(tmp_path_factory.mktemp("prepared") / "data")
  preparation.prepare(layout.Options(input=text_file, **FLAGS), data, workers=1, progress=False)
  return data


def _files(directory):
  """{relative path: bytes} of every shard, packing plan and of info.json."""
  paths = glob.glob(os.path.join(directory, "*", "*.array_record")) + glob.glob(
      os.path.join(directory, "*", "*.npy"))
  out = {os.path.relpath(p, directory): open(p, "rb").read() for p in paths}
  out["info.json"] = open(os.path.join(directory, "info.json"), "rb").read()
  return out


def _cli(*args, timeout=300):
  return warm_python.run([sys.executable, "-m", "bertjax.data.prepare", *args],
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=timeout)


def _read(directory, kind, split):
  """All records of DATA/kind/split-*, in shard order."""
  with open(os.path.join(directory, "info.json")) as f:
    info = json.load(f)
  listing = (info["documents"] if kind == "documents" else info["phases"][kind[3:]])[split]
  source = shards.Records([os.path.join(directory, name) for name, _ in listing],
                          [n for _, n in listing])
  return source.read(np.arange(len(source)))


def test_layout_and_info(prepared):
  with open(os.path.join(prepared, "info.json")) as f:
    info = json.load(f)
  shard_count = len(json.load(open(os.path.join(prepared, "plan.json")))["text_shards"])
  assert shard_count >= 4
  assert info["flags"]["max_seq_length"] == [32, 64]
  assert info["vocab"]["file"] == "vocab.model" and info["vocab"]["token_dtype"] == "uint16"
  counts = info["counts"]
  assert counts["documents"] + counts["heldout_documents"] == 40
  for length in ("32", "64"):
    phase = info["phases"][length]
    assert phase["examples"] == sum(n for _, n in phase["train"]) > 0
    for name, _ in phase["train"] + phase["heldout"]:
      assert name.startswith(f"seq{length}/") and f"-of-{shard_count:05d}" in name
    assert len(_read(prepared, f"seq{length}", "train")) == phase["examples"]
  tok = tokenization.load_tokenizer(os.path.join(prepared, "vocab.model"))
  assert info["vocab"]["sha256"] == preparation.vocab_sha256(tok)
  assert info["most_common_token"] not in tok.special_ids


def test_pairs_follow_the_segment_pair_rules(prepared):
  """Shard 0's stored pairs are exactly iter_segment_pairs over its stored training documents
  (shuffled as the original does), with the seeded generator of that shard and phase."""
  with open(os.path.join(prepared, "info.json")) as f:
    info = json.load(f)
  count = len(json.load(open(os.path.join(prepared, "plan.json")))["text_shards"])
  tok = tokenization.load_tokenizer(os.path.join(prepared, "vocab.model"))
  special = masking.SpecialTokens.from_tokenizer(tok)
  dtype = np.dtype(info["vocab"]["token_dtype"])
  def shard_0(kind):
    path = os.path.join(prepared, shards.shard_name(kind, "train", 0, count))
    source = shards.Records([path], [dict(info["documents"]["train"] + [
        item for phase in info["phases"].values() for item in phase["train"]])[
            os.path.relpath(path, prepared)]])
    return source.read(np.arange(len(source)))

  documents = [shards.decode_document(r, dtype) for r in shard_0("documents")]
  stored = shards.decode_pairs(shard_0("seq32"), dtype, 32, special.cls, special.sep)
  rng = np.random.default_rng([0, 2, 0, 0, False])  # seed, _PAIRS, shard, phase, held out
  expected = pairs.pad_pairs(list(pairs.iter_segment_pairs(documents, 32, 0.1, rng, 2)), 32,
                             special)
  for key in expected:
    np.testing.assert_array_equal(stored[key], expected[key], err_msg=key)


def test_held_out_documents_and_the_vocabulary(prepared, text_file):
  """No held-out document is among the training documents, and the vocabulary's sentences come
  from training documents only."""
  with open(os.path.join(prepared, "plan.json")) as f:
    plan = json.load(f)
  options = layout.Options.from_json(plan["flags"])
  held_out, training = set(), set()
  for index, shard in enumerate(plan["text_shards"]):
    train_docs, heldout_docs = text_shards.split_heldout(
        text_shards.read_text_shard(shard, options), options.eval_fraction, options.seed, index)
    training |= {tuple(d) for d in train_docs}
    held_out |= {tuple(d) for d in heldout_docs}
  assert held_out and not held_out & training
  assert len(held_out) + len(training) == 40
  sentences = set(text_shards.training_sentences(options, plan["text_shards"]))
  assert sentences == {s for d in training for s in d}
  dtype = np.dtype("uint16")
  stored = {tuple(map(tuple, shards.decode_document(r, dtype)))
            for r in _read(prepared, "documents", "heldout")}
  assert len(stored) == len(held_out)
  trained = {tuple(map(tuple, shards.decode_document(r, dtype)))
             for r in _read(prepared, "documents", "train")}
  assert not stored & trained


def test_same_shards_with_two_workers_and_after_a_crash(prepared, text_file, tmp_path):
  """The output depends on the flags only: 2 worker processes give the same bytes, and a rerun
  after a crash (a shard unfinished, half-written files left) finishes without duplicates."""
  two = str(tmp_path / "two")
  out = _cli(f"--input={text_file}", f"--output_dir={two}", "--vocab_size=600",
             "--max_seq_length=32,64", "--max_predictions_per_seq=5,10", "--dupe_factor=2",
             "--eval_fraction=0.1", "--shard_size_mb=0.05", "--workers=2")
  assert out.returncode == 0, out.stderr[-3000:]
  assert _files(two) == _files(prepared)

  os.remove(os.path.join(two, "info.json"))  # as if killed while shard 1 was being written
  os.remove(os.path.join(two, "done", "00001.json"))
  for path in glob.glob(os.path.join(two, "*", "*-00001-of-*")):
    os.rename(path, path + ".tmp-host-123")
  out = _cli(f"--input={text_file}", f"--output_dir={two}", "--vocab_size=600",
             "--max_seq_length=32,64", "--max_predictions_per_seq=5,10", "--dupe_factor=2",
             "--eval_fraction=0.1", "--shard_size_mb=0.05", "--workers=2")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "preparing 1 shards" in out.stderr
  assert not glob.glob(os.path.join(two, "**", "*.tmp-*"), recursive=True)
  assert _files(two) == _files(prepared)


def test_tfds_input(tiny_tfds, tmp_path):
  data = str(tmp_path / "data")
  info = preparation.prepare(
      layout.Options(input="tfds:bertjax_tiny_text:train", tfds_data_dir=tiny_tfds,
                     vocab_size=64, max_seq_length=(16,), max_predictions_per_seq=(2,),
                     eval_fraction=0.0, tfds_documents_per_shard=2), data, progress=False)
  assert info["counts"]["documents"] == 2  # the third document is blank
  assert info["counts"]["sentences"] == 5
  with open(os.path.join(data, "plan.json")) as f:
    assert len(json.load(f)["text_shards"]) == 2  # 3 examples, 2 a shard
  with pytest.raises(UserError, match="has no feature 'body'"):
    preparation.prepare(layout.Options(input="tfds:bertjax_tiny_text:train", tfds_feature="body",
                                       tfds_data_dir=tiny_tfds), str(tmp_path / "x"))
  with pytest.raises(UserError, match="not tfds:NAME:SPLIT"):
    preparation.prepare(layout.Options(input="tfds:wikipedia"), str(tmp_path / "y"))


def _refused(args, *expected, output_dir):
  """Runs the CLI; asserts exit 2, one message holding `expected`, no traceback, and that the
  output directory is as it was."""
  before = _files_or_none(output_dir)
  out = _cli(*args, f"--output_dir={output_dir}")
  assert out.returncode == 2, out.stderr[-3000:]
  lines = [line for line in out.stderr.splitlines() if line.startswith("prepare: error:")]
  assert len(lines) == 1, out.stderr[-3000:]
  for text in expected:
    assert text in lines[0], lines[0]
  assert "Traceback" not in out.stderr
  assert _files_or_none(output_dir) == before


def _files_or_none(directory):
  if not os.path.exists(directory):
    return None
  return {os.path.relpath(os.path.join(root, name), directory):
          open(os.path.join(root, name), "rb").read()
          for root, _, names in os.walk(directory) for name in names}


def test_bad_input(text_file, prepared, tmp_path):
  nul = tmp_path / "nul.txt"
  nul.write_bytes(b"\x00" * 5000)
  latin = tmp_path / "latin1.txt"
  latin.write_bytes("First line.\nSecond line, caf\u00e9.\n".encode("latin-1"))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n\n")
  new = str(tmp_path / "new")
  _refused([f"--input={nul}"], "nul.txt", "not text", output_dir=new)
  _refused([f"--input={latin}"], "latin1.txt", "UTF-8", "line 2", output_dir=new)
  _refused([f"--input={empty}", "--vocab_size=600"], "empty.txt", "no text", output_dir=new)
  _refused(["--input=/no/such/*.txt"], "/no/such/*.txt", output_dir=new)
  _refused([f"--input={text_file}", "--max_seq_length=32", "--max_predictions_per_seq=40"],
           "--max_predictions_per_seq=40", output_dir=new)
  _refused([f"--input={text_file}", "--direct_num_workers=2"], "--runner", output_dir=new)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  _refused([f"--input={text_file}"], "holds other files", "notes.txt", output_dir=str(other))
  _refused([f"--input={text_file}", "--vocab_size=600", "--max_seq_length=32,64",
            "--max_predictions_per_seq=5,10", "--dupe_factor=3", "--eval_fraction=0.1",
            "--shard_size_mb=0.05"], "other flags", "dupe_factor=2", output_dir=prepared)


def test_a_second_run_on_a_directory_being_prepared_is_refused(text_file, tmp_path):
  """While a run prepares DATA (it holds DATA/.lock, here taken by this process), a second run
  on DATA is refused with one message naming the first (host and pid), and nothing the first
  wrote is touched: not its plan, not its half-written files (once deleted as leftovers)."""
  data = tmp_path / "data"
  first = lock.Lock.take(str(data), flag="--output_dir")
  try:
    (data / "plan.json").write_text("{}")
    (data / "seq32").mkdir()
    (data / "seq32" / "train-00000-of-00006.array_record.tmp-host-1").write_bytes(b"half")
    _refused([f"--input={text_file}"], "in use by another run",
             f"pid {os.getpid()} on host {socket.gethostname()}", "another --output_dir",
             output_dir=str(data))
  finally:
    first.release()
  assert not (data / lock.LOCK_FILE).exists()


def test_a_finished_directory_is_reused(prepared, text_file):
  before = _files(prepared)
  info = preparation.prepare(layout.Options(input=text_file, **FLAGS), prepared, progress=False)
  assert info == json.loads(before["info.json"])
  assert _files(prepared) == before
