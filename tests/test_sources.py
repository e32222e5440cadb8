"""Tests of bertjax.data.sources: the bundled corpus, text files, the sentence splitter, TFDS."""
import os
import time

import pytest

from bertjax.data import sources
from bertjax.errors import UserError


def test_bundled_corpus():
  assert os.path.getsize(sources.BUNDLED_CORPUS) >= 1_000_000
  with open(sources.BUNDLED_CORPUS, "rb") as f:
    data = f.read()
  data.decode("utf-8")  # strict: every line is UTF-8
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)
  assert len(documents) >= 100
  assert all(documents) and all(s and s == s.strip() for doc in documents for s in doc)
  # The format: one sentence per line, exactly one blank line between documents.
  assert data.endswith(b"\n") and b"\n\n\n" not in data
  assert data.count(b"\n\n") == len(documents) - 1
  assert documents[0][0] == "The family of Dashwood had long been settled in Sussex."
  credits = os.path.join(os.path.dirname(sources.BUNDLED_CORPUS), "CREDITS.md")
  with open(credits, encoding="utf-8") as f:
    assert f"{len(documents)} documents" in f.read()


def _write(path, text):
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_read_text_files_exact(tmp_path):
  path = _write(tmp_path / "a.txt", "  First one.\nSecond one.  \n\n\n\nOther doc.\r\n\n  \n")
  assert sources.read_text_files(path) == [["First one.", "Second one."], ["Other doc."]]
  # A byte order mark is not text; a file with no trailing newline still ends its document.
  (tmp_path / "b.txt").write_bytes("\ufeffBOM line.\nLast".encode("utf-8"))
  assert sources.read_text_files(str(tmp_path / "b.txt")) == [["BOM line.", "Last"]]


def test_read_text_files_globs_and_lists(tmp_path):
  (tmp_path / "sub").mkdir()
  a = _write(tmp_path / "a.txt", "A1.\n\nA2.\n")
  b = _write(tmp_path / "b.txt", "B1.\nB2.\n")  # each file ends a document
  c = _write(tmp_path / "sub" / "c.txt", "C1.\n")
  expected_ab = [["A1."], ["A2."], ["B1.", "B2."]]
  assert sources.read_text_files(str(tmp_path / "*.txt")) == expected_ab
  assert sources.read_text_files(f"{b},{a}") == [["B1.", "B2."], ["A1."], ["A2."]]
  assert sources.read_text_files([b, f"{tmp_path}/sub/*.txt"]) == [["B1.", "B2."], ["C1."]]
  assert sources.read_text_files(f"{tmp_path}/*.txt, {c},") == expected_ab + [["C1."]]
  assert sources.read_text_files([tmp_path / "a.txt"]) == [["A1."], ["A2."]]  # a Path


def test_read_text_files_errors(tmp_path):
  with pytest.raises(UserError, match=r"no file matches '.*nothing\*\.txt'; check the path or "
                     r"set --config.data.input_files"):
    sources.read_text_files(str(tmp_path / "nothing*.txt"))
  _write(tmp_path / "ok.txt", "Fine.\n")
  with pytest.raises(UserError, match="no file matches 'missing.txt'"):
    sources.read_text_files(f"{tmp_path}/ok.txt,missing.txt")
  with pytest.raises(UserError, match="no text files given"):
    sources.read_text_files(" , ")
  with pytest.raises(UserError, match=r"is a directory; give the text files in it, e\.g\. "):
    sources.read_text_files(str(tmp_path))
  empty = _write(tmp_path / "empty.txt", "")
  blank = _write(tmp_path / "blank.txt", "\n  \n\n")
  with pytest.raises(UserError, match=r"empty\.txt, .*blank\.txt holds no text; give files "
                     "with one sentence per line"):
    sources.read_text_files([empty, blank])
  assert sources.read_text_files([empty, f"{tmp_path}/ok.txt"]) == [["Fine."]]
  latin = tmp_path / "latin.txt"
  latin.write_bytes("First line.\nSecond.\nCaf\u00e9 au lait.\n".encode("latin-1"))
  with pytest.raises(UserError) as e:
    sources.read_text_files([f"{tmp_path}/ok.txt", str(latin)])
  assert str(e.value) == (f"{latin} is not UTF-8: line 3, byte offset 23 (e9 20 61 75); convert "
                          f"it, e.g. iconv -f LATIN1 -t UTF-8 {latin} > {latin}.utf8")


def test_read_text_files_refuses_nul_bytes(tmp_path):
  """A NUL byte is valid UTF-8 but never text: a binary file (or UTF-16) is refused."""
  zeros = tmp_path / "zeros.bin"
  zeros.write_bytes(b"\x00" * 4096)
  with pytest.raises(UserError) as e:
    sources.read_text_files(str(zeros))
  assert str(e.value) == (
      f"{zeros} is not text (a binary file?): a NUL byte at line 1, byte offset 0; give a UTF-8 "
      f"text file instead (convert UTF-16 text, e.g. iconv -f UTF-16 -t UTF-8 {zeros} > "
      f"{zeros}.utf8).")
  one = tmp_path / "one.txt"
  one.write_bytes(b"First line.\nSecond.\nThird \x00 here.\nFourth.\n")
  with pytest.raises(UserError, match=r"one\.txt is not text \(a binary file\?\): a NUL byte at "
                     r"line 3, byte offset 26; give a UTF-8 text file instead"):
    sources.read_text_files([_write(tmp_path / "ok.txt", "Fine.\n"), str(one)])


def test_decode_text():
  assert sources.decode_text("a.txt", "\ufeffCaf\u00e9.\n".encode("utf-8")) == "Caf\u00e9.\n"
  assert sources.decode_text("a.txt", b"") == ""
  # A range from inside a file: messages give the file's line and byte offset.
  with pytest.raises(UserError, match=r"^big\.txt is not UTF-8: line 12, byte offset 1005 "
                     r"\(e9 0a\); convert it"):
    sources.decode_text("big.txt", b"ab\ncd\xe9\n", first_line=11, first_offset=1000)
  with pytest.raises(UserError, match=r"^big\.txt is not text \(a binary file\?\): a NUL byte "
                     r"at line 13, byte offset 1007;"):
    sources.decode_text("big.txt", b"ab\ncd\nx\x00", first_line=11, first_offset=1000)
  # The first NUL is named; a BOM is dropped only at the start of the file.
  with pytest.raises(UserError, match="line 1, byte offset 0"):
    sources.decode_text("a.txt", b"\x00\x00")
  bom = "\ufeffx".encode("utf-8")
  assert sources.decode_text("a.txt", bom, first_line=5, first_offset=40) == "\ufeffx"


@pytest.mark.parametrize("text, expected", [
    ('"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield '
     'Park is let at last?" Mr. Bennet replied that he had not.',
     ['"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield '
      'Park is let at last?"', "Mr. Bennet replied that he had not."]),
    ('What! Is it so? "Yes," said she. "It is." Then she left.',
     ["What!", "Is it so?", '"Yes," said she.', '"It is."', "Then she left."]),
    ('"Do you not want to know?" cried his wife. \'Tis true (she said.) Next.',
     ['"Do you not want to know?" cried his wife.', "'Tis true (she said.)", "Next."]),
    ("Mrs. Long and Dr. Grant met at St. James's on the 3rd. They talked.",
     ["Mrs. Long and Dr. Grant met at St. James's on the 3rd.", "They talked."]),
    ("It was signed F. C. Weston Churchill. He wrote, i.e. he scribbled. Wait... Then? no.",
     ["It was signed F. C. Weston Churchill.", "He wrote, i.e. he scribbled.", "Wait...",
      "Then? no."]),
    ("I understand you.--You do not. He came--Mr. Knightley--and went.-- It was over!!",
     ["I understand you.--", "You do not.", "He came--Mr. Knightley--and went.--",
      "It was over!!"]),
    ("  spaced \t  out.   Lines\nwrapped  here.  ", ["spaced out.", "Lines wrapped here."]),
    ("\u201cCurly quotes.\u201d \u201cAnother.\u201d", ["\u201cCurly quotes.\u201d",
                                                         "\u201cAnother.\u201d"]),
    ("   \n ", []),
])
def test_split_sentences(text, expected):
  assert sources.split_sentences(text) == expected


def test_document_sentences():
  assert sources.document_sentences("One. Two.\n\n  Three\nFour? Five.\n") == [
      "One.", "Two.", "Three", "Four?", "Five."]


# ----------------------------------------------------------------------------------------------
# TFDS: a dataset built by conftest.py (tiny_tfds), with no network.


def test_read_tfds(tiny_tfds):
  documents = sources.read_tfds("bertjax_tiny_text", "train", "text", data_dir=tiny_tfds)
  assert sorted(documents) == [["First line.", "Second line.", "Third one."],
                               ["Mr. Darcy bowed.", "She smiled!"]]
  assert sources.read_tfds("bertjax_tiny_text:1.0.0", "test", "title",
                           data_dir=tiny_tfds) == [["doc 0"]]
  assert len(sources.read_tfds("bertjax_tiny_text", "train[:2]", "title",
                               data_dir=tiny_tfds)) == 2


def test_read_tfds_errors(tiny_tfds, tmp_path):
  with pytest.raises(UserError, match=r"has no feature 'body'; its features are text, title"):
    sources.read_tfds("bertjax_tiny_text", "train", "body", data_dir=tiny_tfds)
  with pytest.raises(UserError, match=r"has no split 'validation'; use one of"):
    sources.read_tfds("bertjax_tiny_text", "validation", "text", data_dir=tiny_tfds)
  with pytest.raises(UserError, match="holds no text"):
    sources.read_tfds("bertjax_tiny_text", "train[2:]", "text", data_dir=tiny_tfds)
  # Known to this process but not prepared in data_dir: no download is attempted.
  start = time.perf_counter()
  with pytest.raises(UserError, match=r"is not prepared locally in .*; prepare it first .*"
                     r"tfds build bertjax_tiny_text --data_dir="):
    sources.read_tfds("bertjax_tiny_text", "train", "text", data_dir=str(tmp_path))
  with pytest.raises(UserError, match=r"'glue/mrpc' is not prepared locally .*tfds build glue"):
    sources.read_tfds("glue/mrpc", "train", "sentence1", data_dir=str(tmp_path))
  with pytest.raises(UserError, match=r"'no_such_dataset_xyz' is not known and not prepared "
                     r"locally in .*; check the name, or prepare it first"):
    sources.read_tfds("no_such_dataset_xyz", "train", "text", data_dir=str(tmp_path))
  assert time.perf_counter() - start < 10  # no network retries
