"""DATA's layout: the name of every file a pretraining preparation writes, and its flags.

A prepared directory (`python -m bertjax.data.prepare` writes it) holds

  info.json                                   flags, counts, vocabulary hash, shard lists
  vocab.model | vocab.txt                     the vocabulary every shard was tokenized with
  documents/{train,heldout}-SSSSS-of-NNNNN.array_record    tokenized documents
  seq{L}/{train,heldout}-SSSSS-of-NNNNN.array_record       NSP pairs of L tokens (one per phase)
  seq{L}/packs-train-SSSSS-of-NNNNN.npy       the training pairs' packing plan (packing.py)
  contiguous{L}/{train,heldout}-...           contiguous spans of L tokens (prepare
                                              --contiguous=true: No NSP and LTR pretraining)

and, while it is being prepared, plan.json (the flags and the text shards, written first: a rerun
resumes only with these), done/SSSSS.json (the counts of a finished text shard), files named
PATH.tmp-HOST-PID being written (shards.temporary_name) and the lock .lock
(bertjax.lock.LOCK_FILE) of the run preparing it. Shard SSSSS of NNNNN holds what text shard
SSSSS of the input became; shards.py has the record formats.
"""
from __future__ import annotations

import dataclasses
import json
import os

from bertjax.data.pretraining import shards
from bertjax.errors import UserError

INFO_FILE = "info.json"
PLAN_FILE = "plan.json"  # flags and text shards, written first: a rerun resumes only with these
DONE_DIR = "done"  # done/SSSSS.json: the counts of a finished text shard
DOCUMENTS = "documents"  # DATA/documents/: the tokenized documents
CONTIGUOUS = "contiguous"  # DATA/contiguous{L}/: the spans of --contiguous=true
# The version of plan.json and info.json. 2: contiguous spans are cut into two segments
# (`[CLS] A [SEP] B [SEP]`, pairs.iter_contiguous_spans); version 1's spans are `[CLS] span [SEP]`
# and still load (a pair record with an empty B).
FORMAT = 2


def pairs_dir(length: int) -> str:
  """seq{L}: the directory of the NSP pairs of `length` tokens."""
  return f"seq{length}"


def spans_dir(length: int) -> str:
  """contiguous{L}: the directory of the contiguous spans of `length` tokens."""
  return f"{CONTIGUOUS}{length}"


def done_path(output_dir: str, index: int) -> str:
  """DATA/done/SSSSS.json: the counts of finished text shard `index`."""
  return os.path.join(output_dir, DONE_DIR, f"{index:05d}.json")


def write_json(path: str, value: dict) -> None:
  """Writes JSON in one rename."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = shards.temporary_name(path)
  with open(tmp, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags that decide what DATA holds (DATA/info.json "flags")."""
  input: str  # comma-separated globs, or tfds:NAME:SPLIT
  vocab: str = ""  # a sentencepiece .model or WordPiece vocab.txt ("" = train one)
  vocab_size: int = 30522  # of the sentencepiece model trained when no vocab is given
  max_seq_length: tuple[int, ...] = (128,)  # one set of NSP pairs per length (phase)
  max_predictions_per_seq: tuple[int, ...] = (20,)  # per length; used by static masks
  dupe_factor: int = 5
  short_seq_prob: float = 0.1
  eval_fraction: float = 0.01  # documents held out for evaluation
  static_masks: bool = False  # store masks (else the loader masks afresh every epoch)
  masked_lm_prob: float = 0.15
  whole_word_masking: bool = False
  seed: int = 0
  max_sequences_per_row: int = 3  # pairs in a packed row at most (packing plans)
  contiguous: bool = False  # also contiguous spans per length (No NSP / LTR pretraining)
  shard_size_mb: float = 64.0  # text per shard (files)
  tfds_feature: str = "text"
  tfds_data_dir: str = ""
  tfds_documents_per_shard: int = 20000

  def check(self) -> None:
    """UserError naming the first flag that cannot work."""
    if len(self.max_predictions_per_seq) != len(self.max_seq_length):
      raise UserError(f"--max_predictions_per_seq={_join(self.max_predictions_per_seq)} needs "
                      f"one value per --max_seq_length ({_join(self.max_seq_length)}).")
    for length, predictions in zip(self.max_seq_length, self.max_predictions_per_seq):
      if length < 5:
        raise UserError(f"--max_seq_length={length} leaves no room for [CLS] A [SEP] B [SEP]; "
                        "use 5 or more (128 or 512 as in the paper).")
      if not 1 <= predictions <= length:
        raise UserError(f"--max_predictions_per_seq={predictions} for length {length}; use 1 "
                        f"to {length} (the paper: 20 at 128, 80 at 512).")
    if len(set(self.max_seq_length)) != len(self.max_seq_length):
      raise UserError(f"--max_seq_length={_join(self.max_seq_length)} repeats a length.")
    for name in ("dupe_factor", "vocab_size", "tfds_documents_per_shard",
                 "max_sequences_per_row"):
      if getattr(self, name) < 1:
        raise UserError(f"--{name}={getattr(self, name)}; use 1 or more.")
    if not 0 <= self.eval_fraction < 1:
      raise UserError(f"--eval_fraction={self.eval_fraction}; use a value in [0, 1).")
    if not 0 < self.masked_lm_prob < 1:
      raise UserError(f"--masked_lm_prob={self.masked_lm_prob}; use a value in (0, 1).")
    if not 0 <= self.short_seq_prob <= 1:
      raise UserError(f"--short_seq_prob={self.short_seq_prob}; use a value in [0, 1].")
    if self.shard_size_mb <= 0:
      raise UserError(f"--shard_size_mb={self.shard_size_mb}; use a positive size.")

  def to_json(self) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

  @classmethod
  def from_json(cls, flags: dict) -> Options:
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in flags.items()})


def _join(values) -> str:
  return ",".join(str(v) for v in values)
