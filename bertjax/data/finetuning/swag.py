"""SWAG: its CSV files and BERT's multiple-choice features (the paper, section 4.4).

  examples = read_examples("swagaf/data/train.csv")            # train.csv, val.csv, test.csv
  features = encode_examples(examples, tokenizer, max_seq_length=128)

The files are SWAG's "regular" CSVs as rowanz/swagaf distributes them (data/train.csv, val.csv,
test.csv): a header row, then one question a row, with the columns

  (unnamed index), video-id, fold-ind, startphrase, sent1, sent2, gold-source,
  ending0, ending1, ending2, ending3, label

where startphrase = sent1 + " " + sent2, sent2 is the start of the next sentence that each of the
four endings completes, and label (absent in test.csv) is the index of the right ending. Columns
are found by their header names, so their order (and the extra columns) do not matter; only
sent1, sent2, ending0..ending3 and, for training and evaluation, label are read.

An example's id is its value in the leading unnamed column (the row number swagaf's files carry;
0, 1, ... in file order), or, in a file without that column, the number of its data row from 0.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Sequence

import numpy as np

from bertjax.data import sources
from bertjax.data.finetuning.glue import truncated_lengths
from bertjax.errors import UserError
from bertjax.tokenization import Tokenizer

NUM_CHOICES = 4
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
TEXT_COLUMNS = ("sent1", "sent2") + ENDINGS
LABEL_COLUMN = "label"
_HOW_TO_GET = ("SWAG's files are data/train.csv, data/val.csv and data/test.csv of the "
               "rowanz/swagaf repository on GitHub")


@dataclasses.dataclass(frozen=True)
class Example:
  """One SWAG question.

  Attributes:
    id: the file's row id (module docstring), e.g. "17".
    context: sent1, the first sentence (BERT's segment A).
    start: sent2, the start of the next sentence (the common beginning of every ending).
    endings: the NUM_CHOICES endings that complete `start`.
    label: index of the right ending; None when the file has no labels (test.csv).
  """
  id: str
  context: str
  start: str
  endings: tuple[str, ...]
  label: int | None

  def choices(self) -> list[str]:
    """Segment B of each choice: `start` and the ending, joined by a space (as transformers'
    run_swag.py and swagaf's baselines join sent2 and ending<i>)."""
    return [" ".join(part for part in (self.start, ending) if part) for ending in self.endings]


def read_examples(path: str) -> list[Example]:
  """Reads a SWAG CSV file (train.csv, val.csv or test.csv of swagaf's data/).

  Args:
    path: the CSV file.

  Returns:
    The examples in file order; labels are None when the file has no label column (test.csv)
    or a row's label is empty.

  Raises:
    UserError: the file is missing, a directory, not UTF-8, empty, lacks a column of
      TEXT_COLUMNS, or has a row with a different number of fields than the header or a label
      that is not 0 to 3.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise UserError(f"SWAG file {path} does not exist; {_HOW_TO_GET}: give the path of one.")
  if os.path.isdir(path):
    raise UserError(f"{path} is a directory; give a SWAG .csv file in it (train.csv, val.csv or "
                    "test.csv).")
  with open(path, "rb") as f:
    text = sources.decode_text(path, f.read())
  reader = csv.reader(io.StringIO(text, newline=""))
  header = next(reader, None)
  if not header:
    raise UserError(f"{path} is empty; a SWAG file starts with the header row "
                    f"(,video-id,fold-ind,startphrase,sent1,sent2,...); {_HOW_TO_GET}.")
  missing = [c for c in TEXT_COLUMNS if c not in header]
  if missing:
    raise UserError(f"{path} has no column {', '.join(missing)} (its header: "
                    f"{','.join(header)}); give a SWAG file in swagaf's regular format, "
                    f"{_HOW_TO_GET}.")
  column = {name: header.index(name) for name in TEXT_COLUMNS}
  label_column = header.index(LABEL_COLUMN) if LABEL_COLUMN in header else None
  id_column = 0 if header[0] == "" else None
  examples = []
  for row in reader:
    if not row:
      continue
    where = f"{path}:{reader.line_num}"
    if len(row) != len(header):
      raise UserError(f"{where}: {len(row)} fields, but the header has {len(header)}; the file "
                      f"is damaged (a field with a comma must be quoted), {_HOW_TO_GET}.")
    label = None
    if label_column is not None and row[label_column].strip():
      label = row[label_column].strip()
      if label not in [str(i) for i in range(NUM_CHOICES)]:
        raise UserError(f"{where}: label {label!r} is not an ending's index (0 to "
                        f"{NUM_CHOICES - 1}); the file is damaged or not SWAG's.")
      label = int(label)
    examples.append(Example(
        id=row[id_column] if id_column is not None else str(len(examples)),
        context=row[column["sent1"]], start=row[column["sent2"]],
        endings=tuple(row[column[name]] for name in ENDINGS), label=label))
  return examples


def encode_examples(examples: Sequence[Example], tokenizer: Tokenizer,
                    max_seq_length: int) -> dict[str, np.ndarray]:
  """BERT's features of SWAG examples, as transformers' run_swag.py builds them.

  Each choice is [CLS] context [SEP] start ending [SEP], segment 0 for [CLS] context [SEP] and
  1 for the rest, the pair truncated longest-first to max_seq_length - 3 pieces; the rest is
  padding (pad_id, mask 0, segment 0). Truncation is google-research/bert's _truncate_seq_pair
  (`glue.truncated_lengths`), as the first run_swag.py had it; today's run_swag.py (the
  tokenizers library) differs only when both parts are cut to an odd total and the second was
  at least as long: it keeps the odd piece in the second part, Google in the context.

  Args:
    examples: N examples.
    tokenizer: a bertjax.tokenization.Tokenizer.
    max_seq_length: length of every sequence, >= 3.

  Returns:
    input_ids, segment_ids, input_mask: [N, NUM_CHOICES, max_seq_length] int32; and, when
    every example has a label, label: [N] int32.

  Raises:
    UserError: max_seq_length < 3.
  """
  if max_seq_length < 3:
    raise UserError(f"max_seq_length={max_seq_length} cannot hold [CLS] A [SEP] B [SEP]; use "
                    "128 (the default for SWAG) or at least 3.")
  n = len(examples)
  contexts = tokenizer.encode_batch([e.context for e in examples])  # [N][pieces]
  choices = tokenizer.encode_batch([c for e in examples for c in e.choices()])  # [N * 4][pieces]
  shape = (n, NUM_CHOICES, max_seq_length)
  input_ids = np.full(shape, tokenizer.pad_id, np.int32)
  segment_ids = np.zeros(shape, np.int32)
  input_mask = np.zeros(shape, np.int32)
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
  for i, a in enumerate(contexts):
    for j in range(NUM_CHOICES):
      b = choices[i * NUM_CHOICES + j]
      len_a, len_b = truncated_lengths(len(a), len(b), max_seq_length - 3)
      row = [cls_id, *a[:len_a], sep_id, *b[:len_b], sep_id]
      input_ids[i, j, :len(row)] = row
      input_mask[i, j, :len(row)] = 1
      segment_ids[i, j, len_a + 2:len(row)] = 1
  features = {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}
  if all(e.label is not None for e in examples):
    features["label"] = np.array([e.label for e in examples], np.int32).reshape(n)
  return features
