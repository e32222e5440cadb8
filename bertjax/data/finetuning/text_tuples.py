"""The texts of a contrastive run: (anchor, positive, hard negatives ...) tuples from a TSV or
JSONL file, and the sentences of plain text for unsupervised SimCSE.

TSV: one tuple a line, its texts tab-separated; a first line that names the columns (anchor,
positive, negative ...; or sentence-transformers' other names, query / question, answer /
document / pos, neg ...) is a header. JSONL: one object a line, its "anchor" (or "query") and
"positive" (or "pos", "document"), and any hard negatives as "negative" (a text or a list),
"negatives" (a list) or "negative_1", "negative_2", ...; or a JSON list of texts. Every tuple of
a file has the same number of texts (the batch's [batch, texts, seq] shape).
"""
from __future__ import annotations

import json
import os
import re

from bertjax.data import sources
from bertjax.errors import UserError

ANCHOR_NAMES = ("anchor", "query", "question", "sentence1", "text1")
POSITIVE_NAMES = ("positive", "pos", "answer", "document", "sentence2", "text2")
_NEGATIVE = re.compile(r"^(neg|negative|negatives|hard_negative)(_?\d+)?$")


def _lines(path: str, what: str) -> list[str]:
  """The lines of text file `path` (UTF-8, `sources.decode_text`'s checks), blank ones
  dropped."""
  if not os.path.isfile(path):
    raise UserError(f"{what}={path} is not a file; give a TSV or JSONL file of "
                    "(anchor, positive[, negatives]) texts.")
  with open(path, "rb") as f:
    lines = [line for line in sources.decode_text(path, f.read()).splitlines() if line.strip()]
  if not lines:
    raise UserError(f"{path} holds no text; give one (anchor, positive) tuple a line.")
  return lines


def _json_texts(row, path: str, number: int) -> list:
  """The texts of one JSONL row: a list, or an object's anchor, positive and negatives."""
  if isinstance(row, list):
    return row
  if not isinstance(row, dict):
    raise UserError(f"{path} line {number} is not a JSON object or list; give one "
                    '{"anchor": ..., "positive": ...} a line.')
  anchor = next((row[k] for k in ANCHOR_NAMES if k in row), None)
  positive = next((row[k] for k in POSITIVE_NAMES if k in row), None)
  if anchor is None or positive is None:
    raise UserError(f"{path} line {number} lacks an \"anchor\" or a \"positive\" (its keys: "
                    f"{', '.join(row) or 'none'}); give both.")
  negatives = []
  for key in sorted((k for k in row if _NEGATIVE.match(k)),
                    key=lambda k: int(re.sub(r"\D", "", k) or 0)):
    value = row[key]
    negatives += value if isinstance(value, list) else [value]
  return [anchor, positive, *negatives]


def read_tuples(path: str, what: str = "data.train_file") -> list[tuple[str, ...]]:
  """The (anchor, positive, hard negatives ...) tuples of a TSV or JSONL file (module
  docstring), in file order.

  Raises:
    UserError: no such file, no text, a row of one text, a row with another number of texts
      than the first, an empty text, a JSONL row that is not one.
  """
  lines = _lines(path, what)
  is_json = path.endswith((".jsonl", ".json")) or lines[0].lstrip().startswith(("{", "["))
  rows: list[tuple[int, list]] = []
  for number, line in enumerate(lines, start=1):
    if is_json:
      try:
        row = json.loads(line)
      except ValueError:
        raise UserError(f"{path} line {number} is not JSON; give one JSON object a line (or a "
                        "TSV file, its texts tab-separated).") from None
      rows.append((number, _json_texts(row, path, number)))
    else:
      fields = line.split("\t")
      header = [f.strip().lower() for f in fields]
      if number == 1 and len(fields) > 1 and header[0] in ANCHOR_NAMES and (
          header[1] in POSITIVE_NAMES):
        continue
      rows.append((number, fields))
  if not rows:
    raise UserError(f"{path} has a header and no rows; give one tuple a line under it.")
  width = len(rows[0][1])
  tuples = []
  for number, texts in rows:
    if len(texts) < 2:
      raise UserError(f"{path} line {number} has one text; a contrastive row needs an anchor "
                      "and its positive (tab-separated in a TSV), or set --config.data.simcse="
                      "true for plain text.")
    if len(texts) != width:
      raise UserError(f"{path} line {number} has {len(texts)} texts but line {rows[0][0]} has "
                      f"{width}; give every row the same number of hard negatives.")
    for text in texts:
      if not isinstance(text, str) or not text.strip():
        raise UserError(f"{path} line {number} has an empty text (or one that is not text); "
                        "give every anchor, positive and negative some words.")
    tuples.append(tuple(texts))
  return tuples


def simcse_sentences(path: str) -> list[str]:
  """The sentences unsupervised SimCSE trains on: the lines of text file `path` (blank lines
  dropped), or the bundled corpus's sentences for ""."""
  if not path:
    return [s for document in sources.read_text_files(sources.BUNDLED_CORPUS) for s in document]
  return [line.strip() for line in _lines(path, "data.train_file")]
