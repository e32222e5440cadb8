"""Where text comes from: local text files (the default, and the bundled corpus) or TFDS.

Every reader returns documents, each a list of sentences (`list[list[str]]`), the shape
`bertjax.data.pretraining.pairs` pairs into next-sentence examples.

  read_text_files("corpus/*.txt,more.txt")   # one sentence per line, blank line between docs
  read_tfds("wikipedia/20230601.en", "train", "text", data_dir="~/tensorflow_datasets")

`read_tfds` never downloads: a dataset must be prepared on disk first (`tfds build`).
"""
from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

from bertjax.errors import UserError

BUNDLED_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                              "austen.txt")

# Words that end with a period without ending the sentence (compared lower-case, dots removed).
_ABBREVIATIONS = frozenset(
    "mr mrs ms messrs mme mlle dr st sr jr rev col capt gen lt sgt esq prof hon mt ft vs viz cf "
    "ie eg".split())
_OPENERS = "\"'([\u2018\u201c"  # may stand before a sentence's first letter
# The end of a sentence, if a capital follows: "?", '."', "!)", ".--" (a dash, as in Austen).
_CANDIDATE = re.compile(r"[.!?]+[\"')\]\u2019\u201d]*(?:\s+|--\s*)")
_LAST_WORD = re.compile(r"[A-Za-z.]*$")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]?$|^[A-Z]$")  # "A", "i.e", "U.S"


def split_sentences(paragraph: str) -> list[str]:
  """Splits a paragraph into sentences with a few plain rules.

  A sentence ends after `.`, `!` or `?` (and any closing quotes or brackets right after it)
  when whitespace or a dash "--" and then a capital letter follow (the capital may have opening
  quotes before it); the dash stays with the sentence before it. A `.` does not end a sentence
  after a common abbreviation (Mr. Mrs. Dr. St. Col. Esq. ...) or an initial ("A. W. Smith",
  "i.e."). Whitespace runs become one space.

  Args:
    paragraph: text; line breaks inside it count as spaces.

  Returns:
    The sentences, stripped, in order; [] for blank text.
  """
  text = " ".join(paragraph.split())
  sentences, start = [], 0
  for match in _CANDIDATE.finditer(text):
    rest = text[match.end():].lstrip(_OPENERS)
    if not rest or not rest[0].isupper():
      continue
    punctuation = match.group().rstrip().removesuffix("--")
    if punctuation == ".":  # a lone period: maybe an abbreviation or an initial
      word = _LAST_WORD.search(text, start, match.start()).group()  # "--Mrs" -> "Mrs"
      if word.lower().replace(".", "") in _ABBREVIATIONS or _INITIALS.match(word):
        continue
    sentences.append(text[start:match.end()].strip())
    start = match.end()
  if text[start:].strip():
    sentences.append(text[start:].strip())
  return sentences


# ----------------------------------------------------------------------------------------------
# Local text files.


def expand_globs(patterns: str | Sequence[str]) -> list[str]:
  """Globs (a list, or one comma-separated string) -> the files, sorted within each pattern."""
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [os.fspath(patterns)]
  patterns = [p.strip() for item in patterns for p in os.fspath(item).split(",") if p.strip()]
  if not patterns:
    raise UserError("no text files given; set --config.data.input_files to one or more "
                    "comma-separated globs.")
  paths = []
  for pattern in patterns:
    matches = sorted(glob.glob(os.path.expanduser(pattern)))
    if not matches:
      raise UserError(f"no file matches {pattern!r}; check the path or set "
                      "--config.data.input_files.")
    for path in matches:
      if os.path.isdir(path):
        raise UserError(f"{path} is a directory; give the text files in it, e.g. "
                        f"'{os.path.join(path, '*.txt')}'.")
      paths.append(path)
  return paths


def decode_text(path: str, data: bytes, first_line: int = 1, first_offset: int = 0) -> str:
  """The bytes of a UTF-8 text file (or of a byte range of one) -> its text.

  A byte order mark at the start of the file is dropped. A NUL byte anywhere means the file is
  not text (a binary file, or UTF-16 text), and is refused like bytes that are not UTF-8.

  Args:
    path: the file's name, for the error messages.
    data: [num_bytes] the file's bytes, or a range of them.
    first_line: the line number (from 1) of data[0] within the file.
    first_offset: the byte offset (from 0) of data[0] within the file; a byte order mark is
      dropped only at offset 0.

  Returns:
    The text.

  Raises:
    UserError: naming the file, the line and the byte offset of the first NUL byte or the first
      byte that is not UTF-8.
  """
  nul = data.find(b"\x00")
  if nul >= 0:
    line, offset = first_line + data.count(b"\n", 0, nul), first_offset + nul
    raise UserError(f"{path} is not text (a binary file?): a NUL byte at line {line}, byte "
                    f"offset {offset}; give a UTF-8 text file instead (convert UTF-16 text, "
                    f"e.g. iconv -f UTF-16 -t UTF-8 {path} > {path}.utf8).")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line, offset = first_line + data.count(b"\n", 0, e.start), first_offset + e.start
    bad = data[e.start:e.start + 4].hex(" ")
    raise UserError(f"{path} is not UTF-8: line {line}, byte offset {offset} ({bad}); "
                    f"convert it, e.g. iconv -f LATIN1 -t UTF-8 {path} > {path}.utf8") from None
  return text.removeprefix("\ufeff") if first_offset == 0 else text


def read_text_files(patterns: str | Sequence[str]) -> list[list[str]]:
  """Reads documents from text files in google-research/bert's pretraining format.

  The format: one sentence per line, a blank line between documents; each file also ends a
  document. Lines are stripped, and empty documents are skipped.

  Args:
    patterns: a glob, a comma-separated string of globs, or a list of globs (e.g.
      `sources.BUNDLED_CORPUS`, "data/*.txt,extra.txt").

  Returns:
    documents: [num_documents][num_sentences] str, in file order.

  Raises:
    UserError: a pattern matches no file, a match is a directory, a file is not UTF-8 text, or
      no file holds any text.
  """
  paths = expand_globs(patterns)
  documents = []
  for path in paths:
    with open(path, "rb") as f:
      documents += text_documents(decode_text(path, f.read()))
  if not documents:
    names = ", ".join(paths) if len(paths) <= 3 else f"{paths[0]} and {len(paths) - 1} more"
    raise UserError(f"{names} holds no text; give files with one sentence per line and a "
                    "blank line between documents.")
  return documents


def text_documents(text: str) -> list[list[str]]:
  """Text in google-research/bert's format -> its documents (lists of stripped lines); a blank
  line ends a document, and so does the end of the text."""
  documents, document = [], []
  for line in text.split("\n"):
    line = line.strip()
    if line:
      document.append(line)
    elif document:
      documents.append(document)
      document = []
  if document:
    documents.append(document)
  return documents


# ----------------------------------------------------------------------------------------------
# TFDS.


def document_sentences(text: str) -> list[str]:
  """A document's text -> its sentences: each non-blank line, split by `split_sentences`."""
  return [s for line in text.split("\n") for s in split_sentences(line)]


def read_tfds(name: str, split: str, feature: str,
              data_dir: str | None = None) -> list[list[str]]:
  """Reads documents from a TFDS dataset already prepared on local disk; never downloads.

  Each example's `feature` (a string) is one document. The array_record data source is read
  without TensorFlow; a dataset stored as tfrecord needs TensorFlow (`tfds.load`).

  Args:
    name: the dataset name, e.g. "wikipedia/20230601.en" or "my_text:1.0.0".
    split: e.g. "train" or "train[:10%]".
    feature: the text feature that holds a document, e.g. "text".
    data_dir: where the dataset was prepared; None for TFDS's default (~/tensorflow_datasets).

  Returns:
    documents: [num_documents][num_sentences] str; documents with no text are skipped.

  Raises:
    UserError: unknown dataset, dataset not prepared in data_dir, unknown split or feature,
      or no text at all.
  """
  builder = open_tfds_builder(name, data_dir)
  check_tfds_text(builder, name, split, feature)
  documents = []
  for value in (example[feature] for example in tfds_examples(builder, split)):
    if isinstance(value, bytes):
      value = value.decode("utf-8", errors="replace")
    sentences = document_sentences(str(value))
    if sentences:
      documents.append(sentences)
  if not documents:
    raise UserError(f"TFDS dataset {name!r} split {split!r} feature {feature!r} holds no text; "
                    "choose a text feature.")
  return documents


def check_tfds_text(builder, name: str, split: str, feature: str) -> None:
  """UserError if a TFDS dataset lacks the split or the (text) feature asked for."""
  splits = list(builder.info.splits)
  try:
    builder.info.splits[split]
  except (KeyError, ValueError, TypeError):
    raise UserError(f"TFDS dataset {name!r} has no split {split!r}; use one of "
                    f"{', '.join(splits)} (slices like 'train[:10%]' work too).") from None
  features = builder.info.features
  if feature not in features:
    raise UserError(f"TFDS dataset {name!r} has no feature {feature!r}; its features are "
                    f"{', '.join(sorted(features))}.")


def open_tfds_builder(name: str, data_dir: str | None, alternative: str = ""):
  """The TFDS builder of a dataset prepared on local disk; never downloads.

  Args:
    name: the dataset name, e.g. "wikipedia/20230601.en", "glue/mrpc" or "my_text:1.0.0".
    data_dir: where it was prepared; None for TFDS's default (~/tensorflow_datasets).
    alternative: another way to get the data, added to the errors (e.g. "or read GLUE's .tsv").
  Raises:
    UserError: unknown dataset, or not prepared in data_dir (with the `tfds build` command).
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  try:  # registers the text datasets (wikipedia, glue, ...), which TFDS does not load eagerly
    import tensorflow_datasets.text  # noqa: F401  pylint: disable=import-outside-toplevel
  except Exception:  # pylint: disable=broad-except
    pass
  where = data_dir or "~/tensorflow_datasets"
  build = (f"prepare it first where the network can be reached: tfds build {name.split(':')[0]} "
           f"--data_dir={where} --file_format=array_record{alternative}")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(f"TFDS dataset {name!r} is not known and not prepared locally in {where}; "
                    f"check the name, or {build}.") from None
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().split("\n")[0]
    raise UserError(f"TFDS dataset {name!r} cannot be opened in {where} ({first}); "
                    f"check the name and the TFDS data_dir setting, or {build}.") from None
  if not builder.is_prepared():
    raise UserError(f"TFDS dataset {name!r} is not prepared locally in {where} (no download is "
                    f"attempted); {build}.")
  return builder


def tfds_examples(builder, split: str):
  """Yields each example of a split (a dict of numpy values), in stored order: from the
  array_record data source, else through tf.data if TensorFlow is installed."""
  try:
    source = builder.as_data_source(split=split)
  except NotImplementedError:  # stored as tfrecord: no random access without TensorFlow
    source = None
  if source is not None:
    for begin in range(0, len(source), 1024):
      yield from source.__getitems__(list(range(begin, min(begin + 1024, len(source)))))
    return
  try:
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise UserError(f"TFDS dataset {builder.name!r} is stored as tfrecord, which needs "
                    "TensorFlow; pip install tensorflow, or rebuild it with "
                    "--file_format=array_record.") from None
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  yield from tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
