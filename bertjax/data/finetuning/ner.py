"""CoNLL-2003 named-entity data: reading the files and BERT's token features of their words.

  sentences = read_conll("conll2003/train.txt")             # [Sentence(words, tags)]
  labels = label_list(sentences)                            # sorted tags, "O" among them
  features, windows = encode_sentences(sentences, labels, tokenizer, max_seq_length=128)

Predictions back to one tag per word, and the CoNLL files of them, are task output:
`bertjax.tasks.ner.tags_of_words` and `write_conll`.

Files are CoNLL-2003's as distributed: one word a line, "word POS chunk NER" separated by
spaces or tabs (or "word tag", the 2-column variant; or only "word" for text to tag), a blank line
between sentences, and "-DOCSTART-" lines (document starts) skipped. The tag is the last column
unless `label_column` says otherwise. Both IOB1 (CoNLL's original eng.train) and IOB2 tags work:
entities are read from them as conlleval does (bertjax.tasks.ner scores with seqeval's default,
conlleval-compatible mode).

Features follow the paper (section 5.3): each word is tokenized on its own
(`Tokenizer.encode_words`: a byte-level BPE tokenizer encodes " " + word, the pieces the word has
in running text, as transformers' is_split_into_words with add_prefix_space), and the tag is
predicted from the representation of the word's first sub-token; the other sub-tokens, [CLS],
[SEP] and padding carry label weight 0. A word that yields no pieces (e.g. a lone control
character) becomes [UNK], so that every word gets a prediction; a word of more than
max_seq_length - 2 pieces keeps its first max_seq_length - 2. A sentence of more pieces than
max_seq_length - 2 is cut into consecutive windows of whole words, each as long as fits; every
window is its own row ([CLS] window [SEP]) and the windows do not overlap, so each word is
predicted exactly once (words near a cut see only their own window as context).
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

import numpy as np

from bertjax.data import sources
from bertjax.errors import UserError
from bertjax.tokenization import Tokenizer

DOCSTART = "-DOCSTART-"
OUTSIDE = "O"
_COLUMN_SEPARATOR = re.compile(r"[ \t]+")  # spaces or tabs (a word may hold other whitespace)


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One sentence of a CoNLL file.

  Attributes:
    words: the words, in order ([num_words] str).
    tags: their tags ([num_words] str), or None for a file of words only.
    line: the line number (1-based) of the first word, for messages.
  """
  words: tuple[str, ...]
  tags: tuple[str, ...] | None
  line: int


@dataclasses.dataclass(frozen=True)
class Window:
  """Which words one feature row holds: words [start, end) of sentence `sentence`."""
  sentence: int
  start: int
  end: int


def read_conll(path: str, label_column: int = -1) -> list[Sentence]:
  """Reads a CoNLL-2003-format file (module docstring).

  Args:
    path: the file, e.g. train.txt, valid.txt, test.txt (or eng.train, eng.testa, eng.testb).
    label_column: which whitespace-separated column holds the tag (-1: the last; the word is
      column 0). A file whose lines all have one column has no tags.

  Returns:
    The sentences in file order; each has tags unless the file has words only.

  Raises:
    UserError: the path is missing or a directory, the file is not UTF-8 or holds no sentence,
      a line lacks the label column, or tagged and untagged lines are mixed.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise UserError(f"CoNLL file {path} does not exist; give CoNLL-2003's train.txt / "
                    "valid.txt / test.txt (one 'word POS chunk NER' line a word) or set the "
                    "path in the config's data section.")
  if os.path.isdir(path):
    raise UserError(f"{path} is a directory; give a CoNLL-format file (e.g. {path}/train.txt).")
  with open(path, "rb") as f:
    text = sources.decode_text(path, f.read())
  sentences: list[Sentence] = []
  words, tags, first_line, tagged = [], [], 0, None

  def end_sentence():
    nonlocal words, tags
    if words:
      sentences.append(Sentence(tuple(words), tuple(tags) if tagged else None, first_line))
    words, tags = [], []

  for number, line in enumerate(text.split("\n"), start=1):
    line = line.strip(" \t\r")
    columns = _COLUMN_SEPARATOR.split(line) if line else []
    if not columns or columns[0] == DOCSTART:  # a sentence (or a document) ends
      end_sentence()
      continue
    has_tag = len(columns) > 1
    if tagged is None:
      tagged = has_tag
    elif has_tag != tagged:
      raise UserError(f"{path}:{number}: {len(columns)} column(s), but earlier lines "
                      f"{'have a tag' if tagged else 'hold only a word'}; every line must be "
                      "'word ... tag' (or every line only 'word').")
    if tagged:
      if not -len(columns) < label_column < len(columns) or label_column == 0:
        raise UserError(f"{path}:{number}: no label column {label_column} in {len(columns)} "
                        f"columns ({line!r}); set data.label_column (-1 = the last, "
                        "as in CoNLL-2003's NER column).")
      tags.append(columns[label_column])
    if not words:
      first_line = number
    words.append(columns[0])
  end_sentence()
  if not sentences:
    raise UserError(f"{path} holds no sentence; give a CoNLL-format file (one 'word ... tag' "
                    "line a word, a blank line between sentences).")
  return sentences


def label_list(sentences: Sequence[Sentence]) -> list[str]:
  """The sorted set of the sentences' tags and "O": the classes, a tag's index its id."""
  tags = {OUTSIDE}
  for sentence in sentences:
    if sentence.tags is None:
      raise UserError(f"the training file has no tags (line {sentence.line} holds only a "
                      "word); give a file with 'word ... tag' lines.")
    tags.update(sentence.tags)
  return sorted(tags)


def check_tags(sentences: Sequence[Sentence], labels: Sequence[str], source: str) -> None:
  """UserError naming the first tag of `sentences` (read from `source`) not among `labels`."""
  known = set(labels)
  for sentence in sentences:
    for i, tag in enumerate(sentence.tags or ()):
      if tag not in known:
        raise UserError(f"{source}:{sentence.line + i}: tag {tag!r} does not occur in the "
                        f"training data (its tags: {', '.join(labels)}); the model cannot "
                        "predict it. Fix the file, or train on data that has it.")


def encode_sentences(sentences: Sequence[Sentence], labels: Sequence[str], tokenizer: Tokenizer,
                     max_seq_length: int, source: str = "the data"
                     ) -> tuple[dict[str, np.ndarray], list[Window]]:
  """BERT's token-tagging features (module docstring): one row per window of whole words.

  Args:
    sentences: S sentences (with tags, or all without).
    labels: the classes; a tag's index is its id.
    tokenizer: a bertjax.tokenization.Tokenizer; each word is encoded on its own
      (`encode_words`).
    max_seq_length: length of every row, >= 3.
    source: the file the sentences are from, for messages.

  Returns:
    features: input_ids, segment_ids (all 0), input_mask [N, max_seq_length] int32;
      label_weights [N, max_seq_length] float32, 1 at the first sub-token of each word, else 0;
      and, when the sentences have tags, label_ids [N, max_seq_length] int32 (the tag's id at
      first sub-tokens, 0 elsewhere).
    windows: [N] the words each row holds, in sentence order (N >= S).

  Raises:
    UserError: max_seq_length < 3, or a tag not among `labels`.
  """
  if max_seq_length < 3:
    raise UserError(f"max_seq_length={max_seq_length} cannot hold [CLS] word [SEP]; use 128 "
                    "(BERT's CoNLL-2003 setting) or at least 3.")
  check_tags(sentences, labels, source)
  limit = max_seq_length - 2
  tagged = bool(sentences) and sentences[0].tags is not None
  label_id = {tag: i for i, tag in enumerate(labels)}
  all_words = [word for sentence in sentences for word in sentence.words]
  pieces_of_words = [p[:limit] or [tokenizer.unk_id] for p in tokenizer.encode_words(all_words)]

  windows: list[Window] = []
  rows: list[tuple[list[int], list[int], list[int]]] = []  # (ids, first positions, tag ids)
  offset = 0
  for s, sentence in enumerate(sentences):
    pieces = pieces_of_words[offset:offset + len(sentence.words)]
    offset += len(sentence.words)
    start = 0
    while start < len(pieces):
      end, length = start, 0
      while end < len(pieces) and length + len(pieces[end]) <= limit:
        length += len(pieces[end])
        end += 1
      ids, positions = [tokenizer.cls_id], []
      for word_pieces in pieces[start:end]:
        positions.append(len(ids))
        ids.extend(word_pieces)
      ids.append(tokenizer.sep_id)
      tag_ids = [label_id[tag] for tag in sentence.tags[start:end]] if tagged else []
      windows.append(Window(s, start, end))
      rows.append((ids, positions, tag_ids))
      start = end

  n = len(rows)
  input_ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  label_weights = np.zeros((n, max_seq_length), np.float32)
  label_ids = np.zeros((n, max_seq_length), np.int32)
  for r, (ids, positions, tag_ids) in enumerate(rows):
    input_ids[r, :len(ids)] = ids
    input_mask[r, :len(ids)] = 1
    label_weights[r, positions] = 1.0
    if tagged:
      label_ids[r, positions] = tag_ids
  features = {"input_ids": input_ids, "segment_ids": np.zeros_like(input_ids),
              "input_mask": input_mask, "label_weights": label_weights}
  if tagged:
    features["label_ids"] = label_ids
  return features, windows
