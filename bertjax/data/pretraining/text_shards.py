"""Text shards: the input of bertjax.data.prepare cut into pieces prepared independently.

A text shard is a byte range of a text file that starts at a document ({"path", "start",
"stop"}; found by seeking, never reading a file whole) or a range of a TFDS split's examples
({"tfds", "split", "start", "stop"}). This module plans them, reads one into documents (lists
of sentences), splits a shard's documents into training and held-out ones, and gives the
training sentences a vocabulary is trained on. `options` is a layout.Options.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from bertjax.data import sources
from bertjax.errors import UserError

HELDOUT_SEED = 1  # kind of seeded generator of the held-out split (shard_work.py has the others)


def plan_text_shards(options) -> list[dict]:
  """The input cut into text shards: {"path", "start", "stop"} byte ranges of a file, each
  starting at a document, or {"tfds", "split", "start", "stop"} ranges of a dataset's examples."""
  if options.input.startswith("tfds:"):
    name, split = _tfds_name_split(options.input)
    count = len(_tfds_source(name, split, options))
    step = options.tfds_documents_per_shard
    return [{"tfds": name, "split": split, "start": s, "stop": min(s + step, count)}
            for s in range(0, count, step)]
  target = max(1, int(options.shard_size_mb * 2**20))
  shards = []
  for path in sources.expand_globs(options.input):
    size = os.path.getsize(path)
    cuts = [0] + [_document_start(path, c) for c in range(target, size, target)] + [size]
    cuts = sorted(set(cuts))
    shards += [{"path": os.path.abspath(path), "start": a, "stop": b}
               for a, b in zip(cuts, cuts[1:])]
  return shards


def _document_start(path: str, offset: int) -> int:
  """The offset of the first line after the first blank line at or after `offset` (the end of
  the file if none): a document starts there."""
  with open(path, "rb") as f:
    f.seek(offset)
    f.readline()  # the rest of the line `offset` falls in
    while True:
      line = f.readline()
      if not line:
        return f.tell()
      if not line.strip():
        return f.tell()


def read_text_shard(shard: dict, options) -> list[list[str]]:
  """The documents (lists of sentences) of one text shard."""
  if "tfds" in shard:
    source = _tfds_source(shard["tfds"], shard["split"], options)
    examples = source.__getitems__(list(range(shard["start"], shard["stop"])))
    documents = []
    for example in examples:
      value = example[options.tfds_feature]
      text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
      sentences = sources.document_sentences(text)
      if sentences:
        documents.append(sentences)
    return documents
  path, start = shard["path"], shard["start"]
  with open(path, "rb") as f:
    f.seek(start)
    data = f.read(shard["stop"] - start)
  try:
    text = sources.decode_text(path, data, 1, start)
  except UserError:  # name the line in the whole file
    with open(path, "rb") as f:
      line = f.read(start).count(b"\n") + 1
    text = sources.decode_text(path, data, line, start)
  return sources.text_documents(text)


def _tfds_name_split(spec: str) -> tuple[str, str]:
  name, _, split = spec.removeprefix("tfds:").rpartition(":")
  if not name or not split:
    raise UserError(f"--input={spec} is not tfds:NAME:SPLIT, e.g. "
                    "tfds:wikipedia/20230601.en:train.")
  return name, split


def _tfds_source(name: str, split: str, options):
  """The array_record data source of a TFDS split (random access, no TensorFlow)."""
  builder = sources.open_tfds_builder(name, options.tfds_data_dir or None)
  sources.check_tfds_text(builder, name, split, options.tfds_feature)
  try:
    return builder.as_data_source(split=split)
  except NotImplementedError:
    raise UserError(f"TFDS dataset {name!r} is stored as tfrecord, which has no random access; "
                    f"rebuild it with tfds build {name} --file_format=array_record.") from None


def split_heldout(documents: list, eval_fraction: float, seed: int,
                  shard: int) -> tuple[list, list]:
  """(training, held-out) documents of a text shard: a seeded `eval_fraction` of them, at least
  2 (NSP draws a random next segment from another document) when there are 3 or more."""
  if eval_fraction == 0 or len(documents) < 3:
    return documents, []
  order = np.random.default_rng([seed, HELDOUT_SEED, shard]).permutation(len(documents))
  held_out = set(order[:max(2, round(eval_fraction * len(documents)))].tolist())
  return ([d for i, d in enumerate(documents) if i not in held_out],
          [d for i, d in enumerate(documents) if i in held_out])


def training_sentences(options, specs: list[dict],
                       limit: int = 1_000_000) -> Iterator[str]:
  """Sentences of training documents (never held-out ones) for the vocabulary: whole text
  shards in a seeded order, until `limit` sentences or the end of the input."""
  count = 0
  for index in np.random.default_rng([options.seed, HELDOUT_SEED]).permutation(len(specs)):
    documents = read_text_shard(specs[index], options)
    for document in split_heldout(documents, options.eval_fraction, options.seed, index)[0]:
      yield from document
      count += len(document)
    if count >= limit:
      return
  if not count:
    raise no_text(options.input)


def no_text(source: str) -> UserError:
  """The error of an input that holds no document."""
  return UserError(f"{source} holds no text; give files with one sentence per line and a "
                   "blank line between documents.")
