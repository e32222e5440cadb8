"""Pretraining batches streamed from prepared shards (bertjax.data.prepare) with grain.

A batch is a dict of numpy arrays with fixed keys (DESIGN.md):

  input_ids, segment_ids, input_mask     [batch, seq] int32
  masked_lm_positions, masked_lm_ids     [batch, max_predictions] int32
  masked_lm_weights                      [batch, max_predictions] float32 (0 = no prediction)
  next_sentence_label                    [batch] int32 (1 = B is a random segment, as BERT)
  example_weight                         [batch] float32: 1 for a real example, 0 for padding
                                         (only eval batches pad; training batches are all 1)

Training reads the phase's pairs as pipeline.host_batches streams examples: a fresh global
permutation every epoch, host p making only its rows of each global batch, so a global batch is
the same rows on any number of hosts, and a global position (stream elements consumed) that a
run resumed on another number of hosts continues exactly. A batch reads only its own records
(shards.Records), so memory does not grow with the corpus.

Packing (`packing=True`): the stream is the phase's packs (packing.py: plans made at
preparation) instead of its pairs, one pack a row, read and resumed exactly as pairs are. Each
pair of a pack is masked as it would be unpacked, then the pairs are laid out one after the other
in the row (`bertjax.data.packed_rows`), with position_ids, sequence_ids [batch, seq] and
cls_positions [batch, k]; masked_lm_* become [batch, W], each row's real predictions first (W =
packing.predictions_per_row: the most a row of k pairs can have, e.g. 21 at 128 tokens, k = 3,
20 a pair), next_sentence_label and example_weight [batch, k] (example_weight 0 in empty slots).
Evaluation is never packed.

Contiguous spans (`contiguous=True`, prepared with --contiguous=true): the examples are the
phase's spans of the No NSP and left-to-right ablations, `[CLS] A [SEP] B [SEP]` rows of
contiguous text cut at a sentence boundary (segment ids 0 then 1, next_sentence_label 0; data
prepared before layout.FORMAT 2: `[CLS] span [SEP]`, segment ids 0), read, masked and resumed
exactly as pairs are. For the left-to-right LM (`NextTokens` instead of `Masking`) nothing is
masked: masked_lm_positions [batch, seq - 1] are every position but the last, masked_lm_ids the
token after each and masked_lm_weights 1 where that token is real, so the MLM head and its loss
score each real position's next token.

Masks: with dynamic masking, the example of record r is masked in epoch e from a generator
seeded by (seed, e, r), so masks change every epoch and do not depend on the batch size or the
host count. With static masking a record keeps the masks stored at preparation, or gets fixed
ones from (seed, r). A record has the same masks packed or not (the epoch of a packed record is
its pack's). Evaluation goes once through the held-out pairs in order with fixed masks, in the
same per-host slices; the last batch is padded with all-zero rows of weight 0.
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator

import numpy as np

from bertjax import tokenization
from bertjax.data import packed_rows, pipeline
from bertjax.data.pretraining import layout, masking, packing, pairs, shards
from bertjax.errors import UserError

BATCH_KEYS = pairs.PAIR_KEYS + masking.MASK_KEYS + ("example_weight",)
PACKED_BATCH_KEYS = BATCH_KEYS + packed_rows.PACKED_KEYS
_STATIC_MASKS, _DYNAMIC_MASKS, _ORDER = 0, 1, 2  # kinds of seed, so no two draws share one


class PreparedData:
  """A directory written by bertjax.data.prepare: its info.json, tokenizer and pair shards.

  Raises UserError if the directory holds no finished preparation.
  """

  def __init__(self, directory: str):
    self.directory = directory
    path = os.path.join(directory, layout.INFO_FILE)
    if not os.path.isfile(path):
      hint = (" (its preparation did not finish: rerun bertjax.data.prepare with the same flags "
              "to resume it)" if os.path.exists(os.path.join(directory, layout.PLAN_FILE))
              else "")
      raise UserError(f"{directory} holds no prepared data: no {layout.INFO_FILE}{hint}. "
                      "Make it with python -m bertjax.data.prepare.")
    try:
      with open(path) as f:
        self.info = json.load(f)
      self.flags = self.info["flags"]
      self.dtype = np.dtype(self.info["vocab"]["token_dtype"])
    except (OSError, ValueError, KeyError) as e:
      raise UserError(f"{path} is damaged ({e}); prepare the data again.") from None
    self._sources = {}

  def tokenizer(self):
    """The tokenizer of the vocabulary the shards were made with."""
    return tokenization.load_tokenizer(os.path.join(self.directory, self.info["vocab"]["file"]))

  @property
  def lengths(self) -> list[int]:
    """The sequence lengths prepared (one set of pairs each)."""
    return [int(n) for n in self.info["phases"]]

  def stored_predictions(self, length: int) -> int:
    """max_predictions_per_seq of the stored masks at `length` (0: none stored)."""
    if not self.flags["static_masks"]:
      return 0
    return int(self.flags["max_predictions_per_seq"][self.flags["max_seq_length"].index(length)])

  def pairs(self, length: int, split: str) -> shards.Records:
    """The `split` pairs at `length` (their shards opened and checked on first use)."""
    key = (length, split)
    if key not in self._sources:
      listing = self.info["phases"][str(length)][split]
      self._sources[key] = shards.Records(
          [os.path.join(self.directory, name) for name, _ in listing], [n for _, n in listing])
    return self._sources[key]

  def has_contiguous(self, length: int) -> bool:
    """Whether contiguous spans were prepared at `length` (prepare --contiguous=true)."""
    return str(length) in self.info.get(layout.CONTIGUOUS, {})

  def spans(self, length: int, split: str) -> shards.Records:
    """The `split` contiguous spans at `length` (a length with has_contiguous), opened and
    checked on first use."""
    key = (length, split, layout.CONTIGUOUS)
    if key not in self._sources:
      listing = self.info[layout.CONTIGUOUS][str(length)][split]
      self._sources[key] = shards.Records(
          [os.path.join(self.directory, name) for name, _ in listing], [n for _, n in listing])
    return self._sources[key]

  def max_sequences_per_row(self) -> int:
    """k of the packing plans (the flag's default for data prepared before it existed)."""
    return int(self.flags.get("max_sequences_per_row",
                              layout.Options(input="").max_sequences_per_row))

  def has_packs(self, length: int) -> bool:
    """Whether the training pairs at `length` have packing plans."""
    return "packs" in self.info["phases"][str(length)]

  def packs(self, length: int) -> packing.PackPlans:
    """The packing plans of the training pairs at `length` (opened and checked on first use).

    Raises:
      UserError: the data has no plans (prepared before packing existed).
    """
    key = (length, "packs")
    if key not in self._sources:
      if not self.has_packs(length):
        raise UserError(f"{self.directory} has no packing plans at {length} tokens (it was "
                        "prepared by an older bertjax); prepare it again (python -m "
                        "bertjax.data.prepare, into a new directory) to train with "
                        "data.packing=true, or set data.packing=false.")
      phase = self.info["phases"][str(length)]
      self._sources[key] = packing.PackPlans(
          [os.path.join(self.directory, name) for name, _ in phase["packs"]],
          [n for _, n in phase["packs"]], [n for _, n in phase["train"]],
          self.max_sequences_per_row())
    return self._sources[key]


class Masking:
  """How a batch is masked: the rules, the special ids, and the word tables of whole-word
  masking (`Tokenizer.word_boundary_tables`, or None)."""

  def __init__(self, special: masking.SpecialTokens, masked_lm_prob: float, max_predictions: int,
               dynamic: bool, seed: int, word_tables: tuple[np.ndarray, np.ndarray] | None):
    self.special, self.masked_lm_prob = special, masked_lm_prob
    self.max_predictions, self.dynamic, self.seed = max_predictions, dynamic, seed
    self.word_tables = word_tables

  def apply(self, pairs: dict[str, np.ndarray], records: np.ndarray,
            epochs: np.ndarray | None) -> dict[str, np.ndarray]:
    """Masks padded pairs ([n, seq] arrays) of `records` ([n] indices) for `epochs` ([n], or
    None for the fixed masks)."""
    seq = pairs["input_ids"].shape[1]
    randoms = masking.stack_mask_randoms([
        masking.draw_mask_randoms(self._rng(int(r), None if epochs is None else int(e)), (seq,),
                             self.special)
        for r, e in zip(records, records if epochs is None else epochs)], seq)
    starts = (None if self.word_tables is None else
              tokenization.word_starts(pairs["input_ids"], *self.word_tables))
    return masking.apply_masks(pairs["input_ids"], pairs["input_mask"], randoms, self.special,
                          self.masked_lm_prob, self.max_predictions, starts)

  def _rng(self, record: int, epoch: int | None) -> np.random.Generator:
    if epoch is None or not self.dynamic:
      return np.random.default_rng([self.seed, _STATIC_MASKS, record])
    return np.random.default_rng([self.seed, _DYNAMIC_MASKS, epoch, record])


class NextTokens:
  """The targets of a left-to-right LM (the paper's "LTR & No NSP", section 5.1): each real
  position predicts the token after it, through the MLM keys (module docstring); nothing is
  masked. Takes a Masking's place in PairBatches."""
  dynamic = False  # the targets never change

  def __init__(self, special: masking.SpecialTokens, seed: int):
    self.special, self.seed = special, seed

  def apply(self, pairs: dict[str, np.ndarray], records: np.ndarray,
            epochs: np.ndarray | None) -> dict[str, np.ndarray]:
    """Padded rows ([n, seq] arrays) -> their next-token targets, masked_lm_* [n, seq - 1]:
    position i predicts input_ids[i + 1], weight 1 where that is a real token."""
    del records, epochs  # the same targets every time
    ids = pairs["input_ids"]
    n, seq = ids.shape
    return {"masked_lm_positions": np.broadcast_to(np.arange(seq - 1, dtype=np.int32),
                                                   (n, seq - 1)).copy(),
            "masked_lm_ids": ids[:, 1:].astype(np.int32),
            "masked_lm_weights": pairs["input_mask"][:, 1:].astype(np.float32)}


class PairBatches:
  """Batches of one phase's pairs (or contiguous spans) for one host (module docstring).

  Args:
    data: the prepared data.
    length: the phase's sequence length (a length `data` holds).
    masking: how to mask (its max_predictions must equal stored masks' width, if any), or
      NextTokens for a left-to-right LM (data without stored masks).
    batch_size: rows per batch on this host (the global batch is batch_size * hosts).
    process_index, process_count: this host and the number of hosts.
    threads: threads that read and mask batches ahead of the training step.
    packing: training rows are packs of pairs (batch_size counts rows); evaluation is not.
    contiguous: the examples are the contiguous spans at `length` (data.has_contiguous), not
      the NSP pairs; not with packing.
  """

  def __init__(self, data: PreparedData, length: int, masking: Masking | NextTokens, *,
               batch_size: int, process_index: int = 0, process_count: int = 1,
               threads: int = 2, packing: bool = False, contiguous: bool = False):
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if batch_size < 1:
      raise UserError(f"batch_size={batch_size}; use 1 or more per host.")
    self.data, self.length, self.masking = data, length, masking
    self.batch_size, self.process_index, self.process_count = batch_size, process_index, \
        process_count
    self.threads, self.packing, self.contiguous = threads, packing, contiguous
    if packing and contiguous:
      raise ValueError("contiguous spans are not packed")
    self.stored = data.stored_predictions(length)
    if self.stored and isinstance(masking, NextTokens):
      raise UserError(f"{data.directory} holds static masks (prepared with --static_masks=true), "
                      "so its tokens are [MASK]ed; a left-to-right LM reads the text itself. "
                      "Prepare it without --static_masks.")
    if self.stored and masking.dynamic:
      raise UserError(f"{data.directory} holds static masks (prepared with --static_masks=true); "
                      "train on them with --config.data.dynamic_masking=false, or prepare "
                      "without --static_masks for fresh masks every epoch.")
    if self.stored and self.stored != masking.max_predictions:
      raise UserError(f"{data.directory} stores {self.stored} predictions per sequence at "
                      f"{length} tokens but the config asks for {masking.max_predictions}; set "
                      "it to match, or prepare again.")

  @property
  def order_seed(self) -> int:
    """grain's shuffle seed of the epoch orders of this phase."""
    return int(np.random.default_rng([self.masking.seed, _ORDER, self.length]).integers(2**31))

  @functools.cached_property
  def row_predictions(self) -> int:
    """W, the prediction slots of a packed row (packing.predictions_per_row), for the masks'
    masked_lm_prob (stored masks: the data's)."""
    prob = self.data.flags["masked_lm_prob"] if self.stored else self.masking.masked_lm_prob
    return packing.predictions_per_row(self.length, self.data.max_sequences_per_row(),
                                       self.masking.max_predictions, prob)

  def records(self, split: str) -> shards.Records:
    """The examples of `split`: the phase's contiguous spans, or its pairs."""
    if self.contiguous:
      return self.data.spans(self.length, split)
    return self.data.pairs(self.length, split)

  def num_examples(self, split: str = "train") -> int:
    return len(self.records(split))

  def num_rows(self) -> int:
    """Training rows of an epoch: the packs with packing, else the pairs."""
    return len(self.data.packs(self.length)) if self.packing else self.num_examples()

  def _batch(self, split: str, records: np.ndarray, epochs: np.ndarray | None
             ) -> dict[str, np.ndarray]:
    """The masked batch of `records` ([n] record indices of `split`)."""
    try:
      pairs = shards.decode_pairs(self.records(split).read(records),
                                  self.data.dtype, self.length, self.masking.special.cls,
                                  self.masking.special.sep, self.stored)
    except ValueError as e:
      raise UserError(f"a pair record of {self.data.directory} at {self.length} tokens is "
                      f"damaged ({e}); prepare the data again.") from None
    if not self.stored:
      pairs.update(self.masking.apply(pairs, records, epochs))
    pairs["example_weight"] = np.ones(len(records), np.float32)
    return {key: pairs[key] for key in BATCH_KEYS}

  def _packed_batch(self, packs: np.ndarray, epochs: np.ndarray) -> dict[str, np.ndarray]:
    """The packed training batch of `packs` ([n] pack indices) in `epochs` ([n])."""
    records = self.data.packs(self.length).read(packs)  # [n, k], -1 in empty slots
    filled = records != packing.EMPTY  # [n, k]
    epochs = np.broadcast_to(np.asarray(epochs)[:, None], records.shape)
    examples = self._batch("train", records[filled], epochs[filled])  # [filled, ...] unpacked
    try:
      batch = packed_rows.pack_examples(examples, filled, self.row_predictions)
    except ValueError as e:
      raise UserError(f"a packing plan of {self.data.directory} at {self.length} tokens is "
                      f"damaged ({e}); prepare the data again.") from None
    return {key: batch[key] for key in PACKED_BATCH_KEYS}

  def iterate(self, examples: int = 0) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """Training batches without end from global stream position `examples` (0 = the start): a
    stream of pairs, or of packs with packing.

    Yields:
      (batch of [batch_size, ...] arrays, the global position after it).
    """
    n = self.num_rows()
    global_batch = self.batch_size * self.process_count
    if n < global_batch:
      raise UserError(f"only {n} training {'packed rows' if self.packing else 'examples'} "
                      f"at {self.length} tokens, fewer than one global batch of {global_batch}; "
                      "use a smaller batch size, a larger dupe_factor or more text.")
    make = (self._packed_batch if self.packing else
            lambda rows, epochs: self._batch("train", rows, epochs))
    yield from pipeline.host_batches(
        n, self.order_seed, examples, make,
        batch_size=self.batch_size, process_index=self.process_index,
        process_count=self.process_count, threads=self.threads)

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the held-out pairs in order, fixed masks; this host's rows of each global
    batch, the last padded with all-zero rows whose example_weight is 0."""
    for rows in pipeline.eval_rows(self.num_examples("heldout"), self.batch_size,
                                   self.process_index, self.process_count):
      yield pipeline.pad_batch(self._batch("heldout", rows, None), self.batch_size)
