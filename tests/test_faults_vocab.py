"""Faults of vocabularies: continued pretraining keeps init_checkpoint's vocabulary, an empty or
corrupt vocab.model is one clear message, a corpus on one line (over sentencepiece's line limit)
is one clear message, and WordPiece's longest word follows the vocabulary's origin (Google's 200
characters, a Hugging Face tokenizer.json's own)."""
import json
import shutil

import numpy as np
import pytest

from bertjax import tokenization
from bertjax.data import sources
from test_pretraining import _assert_fails_cleanly, _flags, _prepare, _run

NUM_DOCUMENTS = 20  # chapters the runs train on
VOCAB_SIZE = 400


def _sentences(first, stop):
  """The sentences of chapters [first, stop) of the bundled corpus."""
  return [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[first:stop] for s in doc]


def _text_file(path, first, stop):
  """Chapters [first, stop) of the bundled corpus written to `path`; returns its path."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[first:stop]
  path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(text file of NUM_DOCUMENTS chapters, "": no vocabulary given, one is trained on them)."""
  return _text_file(tmp_path_factory.mktemp("corpus") / "chapters.txt", 0, NUM_DOCUMENTS), ""


def _run_flags(corpus, *overrides):
  """Flags of a 2-step tiny run at 32 tokens that trains its vocabulary (no data.vocab_model)."""
  return [f for f in _flags(corpus, "--config.train.num_train_steps=2",
                            "--config.data.dupe_factor=1", "--config.train.eval_steps=1",
                            f"--config.data.vocab_size={VOCAB_SIZE}", *overrides)
          if f != "--config.data.vocab_model="]


@pytest.fixture(scope="module")
def first(corpus, tmp_path_factory):
  """A finished first run's workdir: WORKDIR/data/vocab.model trained on the text."""
  workdir = tmp_path_factory.mktemp("first") / "run"
  out = _run(workdir, _run_flags(corpus))
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def _other_vocabulary(directory, size):
  """A sentencepiece model of `size` pieces trained on other chapters than the runs'."""
  tok = tokenization.load_or_train_sentencepiece(
      lambda: _sentences(100, 100 + NUM_DOCUMENTS), str(directory / f"other{size}.model"), size)
  assert tok.vocab_size == size
  return tok.model_file


def test_continued_pretraining_keeps_the_checkpoints_vocabulary(corpus, first, tmp_path):
  """Continued on new text (the next chapters), whose own vocabulary would differ."""
  new_text = _text_file(tmp_path / "next.txt", NUM_DOCUMENTS, 2 * NUM_DOCUMENTS)
  second = tmp_path / "second"
  out = _run(second, _run_flags(corpus, f"--config.data.input_files={new_text}",
                                f"--config.init_checkpoint={first}"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "init_checkpoint: " in out.stdout
  first_vocab = (first / "data" / "vocab.model").read_bytes()
  assert (second / "data" / "vocab.model").read_bytes() == first_vocab
  assert (second / "vocab.model").read_bytes() == first_vocab

  # Another vocabulary of the same size, given on purpose: a warning naming both files.
  same_size = _other_vocabulary(tmp_path, VOCAB_SIZE)
  out = _run(tmp_path / "same_size", _run_flags(corpus, f"--config.init_checkpoint={first}",
                                                f"--config.data.vocab_model={same_size}"))
  assert out.returncode == 0, out.stderr[-3000:]
  warning = next(line for line in out.stderr.splitlines() if "another vocabulary" in line)
  assert same_size in warning and str(first / "vocab.model") in warning

  # Another size: refused, naming both files and sizes, the workdir unchanged.
  other_size = _other_vocabulary(tmp_path, VOCAB_SIZE - 100)
  _assert_fails_cleanly(tmp_path / "other_size",
                        _run_flags(corpus, f"--config.init_checkpoint={first}",
                                   f"--config.data.vocab_model={other_size}"),
                        f"{other_size} has {VOCAB_SIZE - 100} pieces",
                        f"{first / 'vocab.model'}, {VOCAB_SIZE} pieces")

  # A checkpoint without its vocabulary: refused, asking for data.vocab_model.
  bare = tmp_path / "bare"
  shutil.copytree(first, bare, ignore=shutil.ignore_patterns("vocab.model", "data"))
  _assert_fails_cleanly(tmp_path / "from_bare",
                        _run_flags(corpus, f"--config.init_checkpoint={bare}"),
                        f"init_checkpoint {bare} has no vocabulary", "--config.data.vocab_model=")


@pytest.mark.parametrize("kind", ["empty", "corrupt"])
def test_an_empty_or_corrupt_vocab_model_is_one_message(corpus, first, tmp_path, kind):
  data = b"" if kind == "empty" else np.random.default_rng(0).bytes(2000)
  problem = "is empty (0 bytes)" if kind == "empty" else "is not a sentencepiece model"
  given = tmp_path / "vocab.model"
  given.write_bytes(data)
  _assert_fails_cleanly(tmp_path / "given",
                        _run_flags(corpus, f"--config.data.vocab_model={given}"),
                        f"{given} {problem}", "give a .model file written by sentencepiece")

  # Found in WORKDIR/data of a workdir that has run: the fix is the run's copy, or preparing again.
  workdir = tmp_path / "workdir"
  shutil.copytree(first, workdir)
  (workdir / "data" / "vocab.model").write_bytes(data)
  _assert_fails_cleanly(workdir, _run_flags(corpus),
                        f"{workdir / 'data' / 'vocab.model'} {problem}",
                        f"copy {workdir / 'vocab.model'}", f"delete {workdir / 'data'} and rerun")


def test_a_corpus_on_one_line_is_one_message(tmp_path):
  """A 6 MB corpus on one line: sentencepiece reads at most 4192 bytes of a line, so the line is
  skipped; the error says so and that the format is one sentence per line (it said "give more
  text or a larger vocab_size"), with no traceback and no vocabulary left behind."""
  text = tmp_path / "book.txt"
  book = " ".join(_sentences(0, NUM_DOCUMENTS))  # ~200 kB
  text.write_text(" ".join([book] * (6_000_000 // len(book) + 1)) + "\n")
  assert text.stat().st_size > 6_000_000
  out = _prepare([f"--input={text}", f"--output_dir={tmp_path / 'data'}", "--workers=1",
                  f"--vocab_size={VOCAB_SIZE}"])
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr.splitlines() == [
      "prepare: error: no sentence to train the sentencepiece model on: each line of the text is "
      "longer than sentencepiece's limit of 4192 bytes (1 skipped); the corpus format is one "
      "sentence per line (a blank line between documents): split the text into sentences."]
  assert not (tmp_path / "data" / tokenization.MODEL_FILE).exists()


def test_a_line_over_the_limit_among_sentences_is_skipped_and_counted(tmp_path):
  """A 5 MB line among ordinary sentences (it made a 2.7-million-token "sentence" that no uint16
  record can count: an OverflowError traceback): the vocabulary and the documents skip it alike,
  the run says how many lines and why, and the data is the data of the text without it."""
  text = tmp_path / "book.txt"
  _text_file(text, 0, 4)
  documents = text.read_text().split("\n\n")
  long_line = " ".join(_sentences(4, NUM_DOCUMENTS))
  long_line = " ".join([long_line] * (5_000_000 // len(long_line) + 1))
  documents[1] = documents[1] + "\n" + long_line
  text.write_text("\n\n".join(documents))
  without = tmp_path / "without.txt"
  without.write_text("\n\n".join(d.replace("\n" + long_line, "") for d in documents))
  runs = {}
  for name, path in (("with", text), ("without", without)):
    out = _prepare([f"--input={path}", f"--output_dir={tmp_path / name}", "--workers=1",
                    f"--vocab_size={VOCAB_SIZE}", "--max_seq_length=64"])
    assert out.returncode == 0, out.stderr[-3000:]
    runs[name] = out.stderr
    with open(tmp_path / name / "info.json") as f:
      runs[name + "_counts"] = json.load(f)["counts"]
  assert "Traceback" not in runs["with"]
  sentences = runs["with_counts"]["sentences"]
  assert (f"prepare: warning: 1 of {sentences + 1} lines of the text are longer than "
          "sentencepiece's limit of 4192 bytes and were skipped; the corpus format is one "
          "sentence per line") in runs["with"]
  assert "limit" not in runs["without"]
  assert runs["with_counts"]["long_lines_skipped"] == 1
  assert {k: v for k, v in runs["with_counts"].items() if k not in ("text_bytes",
                                                                     "long_lines_skipped")} == {
      k: v for k, v in runs["without_counts"].items() if k not in ("text_bytes",
                                                                    "long_lines_skipped")}


def test_wordpiece_longest_word_follows_the_vocabularys_origin(tmp_path):
  import transformers  # pylint: disable=import-outside-toplevel
  head = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
  google = tmp_path / "google"
  google.mkdir()
  (google / "vocab.txt").write_text("".join(p + "\n" for p in head + ["ab", "##ab"]))
  word = "ab" * 75  # 150 characters, spelled by the pieces
  pieces = [104] + [105] * 74

  bare = tokenization.load_tokenizer(str(google))  # Google's release: tokenization.py's 200
  assert bare.max_input_chars_per_word == 200 and bare.encode(word) == pieces
  assert bare.encode("ab" * 101) == [bare.unk_id]

  hf_dir = tmp_path / "hf"  # Hugging Face's files, as on the Hub: tokenizer.json says 100
  transformers.BertTokenizer(str(google / "vocab.txt")).save_pretrained(str(hf_dir))
  shutil.copy(google / "vocab.txt", hf_dir / "vocab.txt")  # transformers 5 saves no vocab.txt
  for path in (hf_dir, hf_dir / "vocab.txt", hf_dir / "tokenizer.json"):
    hf = tokenization.load_tokenizer(str(path))
    assert hf.max_input_chars_per_word == 100 and hf.encode(word) == [hf.unk_id], path
    assert hf.encode("ab" * 50) == [104] + [105] * 49

  for tok, expected in ((bare, pieces), (hf, [hf.unk_id])):  # save() keeps it
    saved = tmp_path / f"saved{tok.max_input_chars_per_word}"
    tok.save(str(saved))
    assert tokenization.load_tokenizer(str(saved)).encode(word) == expected
