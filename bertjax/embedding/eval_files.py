"""The files the evaluations of `bertjax.embedding.evaluation` read, checked line by line (bad
input: one UserError naming the file, the line and the fix):

  - BEIR's layout (`read_beir`): DIR/corpus.jsonl ({"_id", "title", "text"}; a document is
    `(title + " " + text).strip()`, as BEIR's and sentence-transformers' evaluations embed it),
    DIR/queries.jsonl ({"_id", "text"}), DIR/qrels/SPLIT.tsv (a header, then
    query-id<TAB>corpus-id<TAB>score, whole-number scores).
  - STS (`read_sts`): a TSV of scored pairs, its columns found by a header naming sentence1,
    sentence2 and score (GLUE's STS-B, sentence-transformers' stsbenchmark.tsv), or three
    columns without a header: text_a<TAB>text_b<TAB>score.
  - transfer (`read_transfer`): "mr", the bundled movie-review sentences
    (`bertjax.data.finetuning.movie_reviews`), or a TSV of label<TAB>text or text<TAB>label
    (a header naming a "label" column, or none).
Files are UTF-8 (`bertjax.data.sources.decode_text`); TSV fields are split at tabs, with no
quoting (GLUE's files are written so).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from bertjax.data import sources
from bertjax.data.finetuning import movie_reviews
from bertjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Retrieval:
  """A retrieval set: the queries with a relevant document (in queries.jsonl's order), the
  documents in the order of their ids (so that ties go to the lower id, as in
  sentence-transformers), and qrels {query index: {document index: relevance}}."""
  query_ids: list[str]
  queries: list[str]
  document_ids: list[str]
  documents: list[str]
  qrels: dict[int, dict[int, int]]


def _lines(path: str, what: str) -> list[str]:
  """The lines of the UTF-8 file `path` (`what` it should be, for the message if missing)."""
  if not os.path.isfile(path):
    raise UserError(f"{path} is not a file; give {what}.")
  with open(path, "rb") as f:
    lines = sources.decode_text(path, f.read()).splitlines()
  if not any(line.strip() for line in lines):
    raise UserError(f"{path} is empty; give {what}.")
  return lines


def _jsonl(path: str, what: str, fields: tuple[str, ...]) -> dict[str, dict]:
  """{_id: object} of the JSONL file `path`, each line an object with string `fields`."""
  out = {}
  for number, line in enumerate(_lines(path, what), start=1):
    if not line.strip():
      continue
    try:
      value = json.loads(line)
      ok = isinstance(value, dict) and all(isinstance(value.get(f, ""), str) for f in fields)
    except ValueError:
      ok = False
    if not ok or not isinstance(value.get("_id"), (str, int)) or "text" not in value:
      raise UserError(f"{path} line {number} is not a JSON object with an \"_id\" and a text "
                      f"field \"text\" ({', '.join(fields)}: strings); give {what}.")
    key = str(value["_id"])
    if key in out:
      raise UserError(f"{path} line {number}: _id {key!r} is there twice; give each line its "
                      "own _id.")
    out[key] = dict(value, line=number)
  return out


def read_beir(directory: str, split: str = "test") -> Retrieval:
  """The retrieval set of BEIR directory `directory`, qrels/`split`.tsv's (module docstring)."""
  layout = "a BEIR directory (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)"
  if not os.path.isdir(directory):
    raise UserError(f"--retrieval={directory} is not a directory; give {layout}.")
  qrels_path = os.path.join(directory, "qrels", f"{split}.tsv")
  if not os.path.isfile(qrels_path):
    splits = sorted(n[:-4] for n in os.listdir(os.path.join(directory, "qrels"))
                    if n.endswith(".tsv")) if os.path.isdir(
                        os.path.join(directory, "qrels")) else []
    raise UserError(f"{qrels_path} is not a file; give --split= one of the splits there "
                    f"({', '.join(splits) or 'none'}), or {layout}.")
  corpus = _jsonl(os.path.join(directory, "corpus.jsonl"), layout, ("title", "text"))
  queries = _jsonl(os.path.join(directory, "queries.jsonl"), layout, ("text",))
  relevant: dict[str, dict[str, int]] = {}
  lines = _lines(qrels_path, layout)
  for number, line in enumerate(lines, start=1):
    fields = line.split("\t")
    if not line.strip() or (number == 1 and fields[-1].strip() == "score"):
      continue
    if len(fields) != 3:
      raise UserError(f"{qrels_path} line {number} has {len(fields)} tab-separated fields, not "
                      "3 (query-id, corpus-id, score).")
    query, document, score = (f.strip() for f in fields)
    try:
      grade = int(score)
    except ValueError:
      raise UserError(f"{qrels_path} line {number}: score {score!r} is not a whole number; give "
                      "a relevance such as 0, 1 or 2.") from None
    for key, table, name in ((query, queries, "queries.jsonl"), (document, corpus,
                                                                 "corpus.jsonl")):
      if key not in table:
        raise UserError(f"{qrels_path} line {number}: {key!r} is not an _id of {name}; give "
                        f"qrels of this directory's {name[:-6]}.")
    relevant.setdefault(query, {})[document] = grade
  document_ids = sorted(corpus)
  position = {key: i for i, key in enumerate(document_ids)}
  query_ids = [key for key in queries if any(g > 0 for g in relevant.get(key, {}).values())]
  if not query_ids:
    raise UserError(f"{qrels_path} gives no query a relevant document (a score above 0); give "
                    "qrels with some.")
  for table, keys, name in ((corpus, document_ids, "corpus.jsonl"),
                            (queries, query_ids, "queries.jsonl")):
    for key in keys:
      text = (table[key].get("title", "") + " " + table[key]["text"]).strip()
      if not text:
        raise UserError(f"{os.path.join(directory, name)} line {table[key]['line']}: _id "
                        f"{key!r} has no text; give it some, or remove it and its qrels.")
      table[key] = text
  return Retrieval(query_ids, [queries[k] for k in query_ids], document_ids,
                   [corpus[k] for k in document_ids],
                   {i: {position[d]: g for d, g in relevant[k].items()}
                    for i, k in enumerate(query_ids)})


def _rows(path: str, what: str, width: int | None = None) -> list[tuple[int, list[str]]]:
  """[(line number, fields)] of the tab-separated lines of `path`, blank lines skipped, each as
  wide as the first (or `width`)."""
  lines = [(n, line.split("\t")) for n, line in enumerate(_lines(path, what), start=1)
           if line.strip()]
  width = width or len(lines[0][1])
  for number, fields in lines:
    if len(fields) != width:
      raise UserError(f"{path} line {number} has {len(fields)} tab-separated fields, not "
                      f"{width}; give {what}.")
  return lines


def _text(path: str, number: int, text: str) -> str:
  if not text.strip():
    raise UserError(f"{path} line {number} has an empty text; give every text some words.")
  return text.strip()


def read_sts(path: str) -> tuple[list[str], list[str], list[float]]:
  """(texts a, texts b, gold scores), one each a pair of the STS file `path` (module
  docstring)."""
  what = ("a TSV of scored pairs: a header naming sentence1, sentence2 and score (GLUE's "
          "STS-B), or text_a<TAB>text_b<TAB>score lines")
  lines = _rows(path, what)
  header = [f.strip().lower() for f in lines[0][1]]
  if "sentence1" in header and "sentence2" in header:
    if "score" not in header:
      raise UserError(f"{path} has no score column (GLUE's STS-B test.tsv has none); give a "
                      "file with gold scores, such as dev.tsv.")
    columns = [header.index(name) for name in ("sentence1", "sentence2", "score")]
    lines = lines[1:]
  elif len(header) == 3:
    columns = [0, 1, 2]
  else:
    raise UserError(f"{path}: the first line names no sentence1, sentence2 and score columns, "
                    f"and has {len(header)} fields, not 3; give {what}.")
  a, b, scores = [], [], []
  for number, fields in lines:
    first, second, score = (fields[i] for i in columns)
    try:
      value = float(score)
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      raise UserError(f"{path} line {number}: score {score.strip()!r} is not a number; give "
                      "each pair a gold score.")
    a.append(_text(path, number, first))
    b.append(_text(path, number, second))
    scores.append(value)
  if not scores:
    raise UserError(f"{path} has a header and no pairs; give {what}.")
  return a, b, scores


def read_transfer(spec: str) -> tuple[list[str], list[int]]:
  """(texts, integer labels) of "mr" (the bundled movie reviews: 1 positive, 0 negative) or of
  the TSV `spec` (module docstring), in SentEval's order: by number of words, then label (a
  stable sort, which decides the folds)."""
  if spec == "mr":
    pairs = movie_reviews.labelled_sentences()
  else:
    what = "a TSV of label<TAB>text or text<TAB>label lines (a header may name a label column)"
    lines = _rows(spec, what, width=2)
    header = [f.strip().lower() for f in lines[0][1]]
    if "label" in header:
      label_column, lines = header.index("label"), lines[1:]
    else:
      label_column = next((i for i in (0, 1) if all(
          fields[i].strip().lstrip("-").isdigit() for _, fields in lines)), None)
      if label_column is None:
        raise UserError(f"{spec}: neither column is whole-number labels on every line; give "
                        f"{what}.")
    pairs = []
    for number, fields in lines:
      label = fields[label_column].strip()
      if not label.lstrip("-").isdigit():
        raise UserError(f"{spec} line {number}: label {label!r} is not a whole number; give "
                        "classes as 0, 1, ...")
      pairs.append((_text(spec, number, fields[1 - label_column]), int(label)))
    if not pairs:
      raise UserError(f"{spec} has a header and no examples; give {what}.")
  pairs = sorted(pairs, key=lambda pair: (len(pair[0].split()), pair[1]))
  return [text for text, _ in pairs], [label for _, label in pairs]
