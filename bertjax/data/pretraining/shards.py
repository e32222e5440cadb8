"""Prepared pretraining data on disk: ArrayRecord shards of documents and of NSP segment pairs.

The shards of a prepared directory (layout.py lists its files) are named
`KIND/{train,heldout}-SSSSS-of-NNNNN.array_record` (`shard_name`): shard SSSSS of NNNNN holds
what text shard SSSSS of the input became. Records are flat arrays of the token dtype (uint16
for vocabularies up to 65,536 ids, else int32):

  document: [num_sentences, length_1 .. length_n, tokens of sentence 1 .. n]
  pair:     [len_a, len_b, is_random_next, num_predictions, A tokens, B tokens,
             masked_lm_positions, masked_lm_ids]           (no [CLS] / [SEP]; num_predictions
                                                            is 0 unless masks are stored)

With static masks the stored A and B tokens are the masked ones and the positions index the
padded `[CLS] A [SEP] B [SEP]` row. A contiguous span is a pair record with is_random_next = 0:
its text cut into A and B at a sentence boundary (layout.FORMAT 2), or, as data of format 1
stored every span, and as a span too short to cut is stored, a record whose B is empty
(len_b = 0): its row is `[CLS] A [SEP]`, segment ids all 0.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence

import numpy as np

from bertjax.errors import UserError

SUFFIX = ".array_record"

# 64 records a chunk: a random read decodes one chunk (~20 KB at 128 tokens), and the index a
# reader holds is one entry per chunk, so it stays small at BERT's corpus size (hundreds of
# millions of pairs). Measured here: 25 us a random record at group 64, 220 us at group 1.
WRITER_OPTIONS = "group_size:64,uncompressed"


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest record dtype that holds every id of a vocabulary of `vocab_size`."""
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def shard_name(kind: str, split: str, index: int, count: int) -> str:
  """'documents/train-00003-of-00016.array_record' and the like (relative to the data dir)."""
  return f"{kind}/{split}-{index:05d}-of-{count:05d}{SUFFIX}"


def encode_document(sentences: Sequence[Sequence[int]], dtype: np.dtype) -> bytes:
  """A document (sentences of token ids) -> one record."""
  lengths = [len(s) for s in sentences]
  parts = [np.asarray([len(sentences), *lengths], dtype)]
  parts.extend(np.asarray(s, dtype) for s in sentences)
  return np.concatenate(parts).tobytes()


def decode_document(record: bytes, dtype: np.dtype) -> list[np.ndarray]:
  """One record -> the document's sentences, each [length] int32."""
  values = np.frombuffer(record, dtype).astype(np.int32)
  count = int(values[0])
  ends = 1 + count + np.cumsum(values[1:1 + count])
  return np.split(values[1 + count:], ends[:-1] - 1 - count)


def encode_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, is_random_next: bool,
                dtype: np.dtype, positions: np.ndarray | None = None,
                masked_ids: np.ndarray | None = None) -> bytes:
  """An NSP pair (and its stored masks, if any) -> one record."""
  count = 0 if positions is None else len(positions)
  parts = [np.asarray([len(tokens_a), len(tokens_b), int(is_random_next), count], dtype),
           np.asarray(tokens_a, dtype), np.asarray(tokens_b, dtype)]
  if count:
    parts += [np.asarray(positions, dtype), np.asarray(masked_ids, dtype)]
  return np.concatenate(parts).tobytes()


def decode_pairs(records: Sequence[bytes], dtype: np.dtype, max_seq_length: int, cls: int,
                 sep: int, max_predictions: int = 0) -> dict[str, np.ndarray]:
  """Pair records -> a padded example set.

  Returns:
    input_ids, segment_ids, input_mask [n, max_seq_length] int32 (0 = [PAD] after the real
    tokens), next_sentence_label [n] int32 and, when max_predictions > 0, the stored masks:
    masked_lm_positions, masked_lm_ids [n, max_predictions] int32, masked_lm_weights
    [n, max_predictions] float32.
  """
  n = len(records)
  out = {"input_ids": np.zeros((n, max_seq_length), np.int32),
         "segment_ids": np.zeros((n, max_seq_length), np.int32),
         "input_mask": np.zeros((n, max_seq_length), np.int32),
         "next_sentence_label": np.zeros(n, np.int32)}
  if max_predictions:
    out.update(masked_lm_positions=np.zeros((n, max_predictions), np.int32),
               masked_lm_ids=np.zeros((n, max_predictions), np.int32),
               masked_lm_weights=np.zeros((n, max_predictions), np.float32))
  for row, record in enumerate(records):
    values = np.frombuffer(record, dtype).astype(np.int32)
    la, lb, is_random, count = (int(v) for v in values[:4])
    length = la + lb + (3 if lb else 2)  # [CLS] A [SEP] B [SEP], or [CLS] A [SEP] (a span)
    if length > max_seq_length or count > max_predictions:
      raise ValueError(f"a pair of {la} + {lb} tokens and {count} predictions does not fit "
                       f"{max_seq_length} tokens and {max_predictions} predictions")
    ids = out["input_ids"][row]
    ids[0], ids[1:1 + la], ids[1 + la] = cls, values[4:4 + la], sep
    if lb:
      ids[2 + la:2 + la + lb], ids[2 + la + lb] = values[4 + la:4 + la + lb], sep
      out["segment_ids"][row, 2 + la:3 + la + lb] = 1
    out["input_mask"][row, :length] = 1
    out["next_sentence_label"][row] = is_random
    if count:
      start = 4 + la + lb
      out["masked_lm_positions"][row, :count] = values[start:start + count]
      out["masked_lm_ids"][row, :count] = values[start + count:start + 2 * count]
      out["masked_lm_weights"][row, :count] = 1
  return out


def write_shard(path: str, records: Iterable[bytes]) -> int:
  """Writes records to an ArrayRecord file in one rename (a killed writer leaves no shard, only
  PATH.tmp-HOST-PID, which a rerun removes). Returns the number of records."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = temporary_name(path)
  writer = array_record_module.ArrayRecordWriter(tmp, WRITER_OPTIONS)
  count = 0
  try:
    for record in records:
      writer.write(record)
      count += 1
  finally:
    writer.close()
  os.replace(tmp, path)
  return count


def temporary_name(path: str) -> str:
  """Where to write PATH before renaming it: PATH.tmp-HOST-PID, unique across the machines of
  a Beam job writing to one shared directory."""
  return f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"


class Records:
  """Random access to the records of ArrayRecord shards, in shard order, for the loader.

  One array_record reader a shard, read in the calling thread (the loader's grain threads read
  batches in parallel). grain's ArrayRecordDataSource is not used: it starts a thread pool for
  every read, and its resident memory grew with the corpus (the loader alone, after 50 batches:
  338 MB at 100 MB of text, 479 MB at 1 GB; 202 and 203 MB here); it also logs an error for
  chunks of more than one record.

  Args:
    paths: the shards, in order.
    counts: the number of records info.json lists for each.

  Raises:
    UserError: a shard is missing, truncated or corrupt, or holds another number of records.
  """

  def __init__(self, paths: Sequence[str], counts: Sequence[int]):
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

    self.paths = list(paths)
    self._readers = []
    for path, count in zip(paths, counts):
      try:
        reader = array_record_module.ArrayRecordReader(path, "readahead_buffer_size:0")
        found = reader.num_records()
      except Exception as e:  # pylint: disable=broad-except  (array_record raises plain errors)
        first = str(e).strip().split("\n")[0]
        raise UserError(f"{path} is missing, truncated or corrupt ({first}); delete it and "
                        "rerun bertjax.data.prepare, which rewrites only what is missing.") \
            from None
      if found != count:
        raise UserError(f"{path} holds {found} records, not the {count} info.json lists; it "
                        "was changed after preparation. Delete it and rerun "
                        "bertjax.data.prepare.")
      self._readers.append(reader)
    self._ends = np.cumsum(np.asarray(counts, np.int64))  # [shards] one past each's last

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def read(self, indices: np.ndarray) -> list[bytes]:
    """The records at global `indices` ([n] ints, any order), in that order."""
    indices = np.asarray(indices, np.int64)
    shard = np.searchsorted(self._ends, indices, side="right")  # [n]
    starts = np.concatenate([[0], self._ends[:-1]])
    out: list[bytes] = [b""] * len(indices)
    for s in np.unique(shard):
      rows = np.flatnonzero(shard == s)
      try:
        records = self._readers[s].read((indices[rows] - starts[s]).tolist())
      except Exception as e:  # pylint: disable=broad-except
        raise UserError(f"cannot read {self.paths[s]} ({str(e).strip().splitlines()[0]}); the "
                        "shard is damaged. Delete it and rerun bertjax.data.prepare.") from None
      for row, record in zip(rows, records):
        out[row] = record
    return out
