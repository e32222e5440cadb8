"""Pretraining examples: documents -> NSP segment pairs -> MLM masks (Devlin et al. 2019, sec. 3.1).

Follows the rules of google-research/bert's create_pretraining_data.py:

* `create_segment_pairs` packs sentences into `[CLS] A [SEP] B [SEP]` pairs. A chunk of
  consecutive sentences is filled up to a target length (`max_seq_length - 3`, or with
  probability `short_seq_prob` a random shorter one); A is a random prefix of the chunk; B is the
  rest of the chunk (label 0, "is next") or, half of the time and always when the chunk has a
  single sentence, text from a random other document (label 1, "random next"), in which case
  the chunk's unused sentences are put back for the next chunk. The pair is then cut to fit by
  removing tokens one at a time from the longer side, at its front or its back at random.
* `mask_tokens` / `mask_batch` choose `min(max_predictions_per_seq, max(1, round(n * 0.15)))`
  positions (n = real tokens of the example, [CLS] and [SEP] included) among all but the special
  tokens, in random order; each chosen token becomes [MASK] 80% of the time, a random non-special
  token 10% and stays itself 10%. With whole-word masking the units drawn are words (a
  word-start piece with its continuation pieces) and a word that would overshoot the number to
  predict is skipped, as the original does.

For the paper's No NSP and left-to-right ablations (section 5.1), `iter_contiguous_spans` makes
single-segment examples `[CLS] span [SEP]` instead: each a contiguous span of one document's
text filling the whole length, as RoBERTa's DOC-SENTENCES (Liu et al. 2019). They are stored and
padded as pairs whose B is empty (`pad_pairs`).

Masking is vectorised over a batch (a [64, 128] batch takes well under a millisecond, plus the
draws), so the pipeline can mask afresh every step. The random numbers an example needs are
drawn by `draw_mask_randoms`, one call per example, so masks depend only on the generator an
example is given, not on which batch it lands in.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from absl import logging

from bertjax.errors import UserError

# Keys of an example set (and of a batch, see loader.py). Unmasked sets have the first four.
PAIR_KEYS = ("input_ids", "segment_ids", "input_mask", "next_sentence_label")
MASK_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")

# Share of chosen tokens that become [MASK], and (of the rest) that are replaced at random.
_MASK_FRACTION = 0.8
_RANDOM_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
  """The token ids masking needs, taken from a tokenizer once.

  Attributes:
    pad, cls, sep, mask: ids of [PAD], [CLS], [SEP] and [MASK].
    vocab_size: number of ids; random replacements are drawn from [0, vocab_size).
    ids_never_masked: ids that are never chosen for prediction and never drawn as a random
      replacement (the tokenizer's special ids: [PAD], [UNK], [CLS], [SEP], [MASK], ...).
      pad, cls, sep and mask are always added to it.
  """
  pad: int
  cls: int
  sep: int
  mask: int
  vocab_size: int
  ids_never_masked: frozenset[int] = frozenset()

  def __post_init__(self):
    never = frozenset(int(i) for i in self.ids_never_masked) | {
        self.pad, self.cls, self.sep, self.mask}
    object.__setattr__(self, "ids_never_masked", never)
    if any(not 0 <= i < self.vocab_size for i in never):
      raise ValueError(f"special ids {sorted(never)} must lie in [0, {self.vocab_size})")
    if len(never) >= self.vocab_size:
      raise ValueError(f"a vocabulary of {self.vocab_size} ids has no non-special id to draw")

  @classmethod
  def from_tokenizer(cls, tok: Any) -> SpecialTokens:
    """From a `bertjax.tokenization.Tokenizer` (its *_id attributes and special_ids)."""
    return cls(pad=tok.pad_id, cls=tok.cls_id, sep=tok.sep_id, mask=tok.mask_id,
               vocab_size=tok.vocab_size, ids_never_masked=frozenset(tok.special_ids))

  @functools.cached_property
  def never_masked_array(self) -> np.ndarray:
    """ids_never_masked as a sorted int32 array (for np.isin)."""
    return np.array(sorted(self.ids_never_masked), np.int32)

  @functools.cached_property
  def replacement_ids(self) -> np.ndarray:
    """[vocab_size - len(ids_never_masked)] int32: the ids a random replacement is drawn from."""
    return np.setdiff1d(np.arange(self.vocab_size, dtype=np.int32), self.never_masked_array)


# ----------------------------------------------------------------------------------------------
# Next sentence prediction: segment pairs.


def create_segment_pairs(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                         short_seq_prob: float, rng: np.random.Generator, special: SpecialTokens,
                         dupe_factor: int = 1) -> dict[str, np.ndarray]:
  """Turns tokenized documents into unmasked `[CLS] A [SEP] B [SEP]` pairs, padded.

  Args: as `iter_segment_pairs`, plus special: the [CLS] / [SEP] / [PAD] ids.

  Returns:
    Example set with keys `input_ids`, `segment_ids`, `input_mask` [N, max_seq_length] int32
    (0 after the real tokens) and `next_sentence_label` [N] int32 (1 = B is random, 0 = B
    follows A), in document order.
  """
  return pad_pairs(list(iter_segment_pairs(documents, max_seq_length, short_seq_prob, rng,
                                           dupe_factor)), max_seq_length, special)


def iter_segment_pairs(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                       short_seq_prob: float, rng: np.random.Generator, dupe_factor: int = 1
                       ) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
  """Yields the NSP segment pairs of tokenized documents, one at a time (module docstring).

  Args:
    documents: documents -> sentences -> token ids (no special tokens). Empty sentences and
      documents are dropped. B is taken from another document when it is random, so a corpus
      needs two documents or more; with one, random B comes from the same document (warned).
    max_seq_length: length of each row, special tokens and padding included (>= 5).
    short_seq_prob: chance that a document pass targets a random shorter length.
    rng: the generator all choices are drawn from, in document order.
    dupe_factor: passes over the corpus (each pass pairs the sentences differently).

  Yields:
    (A token ids, B token ids, is_random_next), with len(A) + len(B) <= max_seq_length - 3.
  """
  if max_seq_length < 5:
    raise UserError(f"max_seq_length={max_seq_length} leaves no room for [CLS] A [SEP] B [SEP]; "
                    "use 5 or more (128 or 512 as in the paper).")
  if dupe_factor < 1:
    raise UserError(f"dupe_factor={dupe_factor}; use 1 or more.")
  docs = [[np.asarray(s, np.int32) for s in doc if len(s)] for doc in documents]
  docs = [d for d in docs if d]
  if not docs:
    raise UserError("the corpus has no tokens; give text files with one sentence per line and "
                    "a blank line between documents.")
  if len(docs) == 1:
    logging.warning("The corpus is a single document, so 'random next' segments come from the "
                    "same document; separate documents with blank lines for a real NSP task.")
  max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
  for _ in range(dupe_factor):
    for doc_index in range(len(docs)):
      yield from _pairs_from_document(docs, doc_index, max_num_tokens, short_seq_prob, rng)


def row_length(len_a: int, len_b: int) -> int:
  """Tokens of the row of a pair: `[CLS] A [SEP] B [SEP]`, or `[CLS] A [SEP]` when B is empty
  (a contiguous span, `iter_contiguous_spans`; NSP pairs never have an empty B)."""
  return len_a + len_b + (3 if len_b else 2)


def pad_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray, bool]], max_seq_length: int,
              special: SpecialTokens) -> dict[str, np.ndarray]:
  """(A, B, is_random_next) pairs -> the padded example set of `create_segment_pairs`; a pair
  with an empty B (a contiguous span) becomes `[CLS] A [SEP]`, segment ids all 0."""
  n = len(pairs)
  input_ids = np.full((n, max_seq_length), special.pad, np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  for row, (a, b, _) in enumerate(pairs):
    la, lb = len(a), len(b)
    input_ids[row, 0] = special.cls
    input_ids[row, 1:1 + la] = a
    input_ids[row, 1 + la] = special.sep
    if lb:
      input_ids[row, 2 + la:2 + la + lb] = b
      input_ids[row, 2 + la + lb] = special.sep
      segment_ids[row, 2 + la:3 + la + lb] = 1  # B and its [SEP]
    input_mask[row, :row_length(la, lb)] = 1
  labels = np.array([int(is_random) for _, _, is_random in pairs], np.int32)
  return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask,
          "next_sentence_label": labels}


def _pairs_from_document(docs: list[list[np.ndarray]], doc_index: int, max_num_tokens: int,
                         short_seq_prob: float,
                         rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, bool]]:
  """One pass over one document: (A tokens, B tokens, is_random_next) per pair, cut to fit."""
  document = docs[doc_index]
  # Usually fill the whole sequence; sometimes aim shorter, to look more like fine-tuning inputs.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = int(rng.integers(2, max_num_tokens, endpoint=True))

  pairs = []
  chunk: list[np.ndarray] = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      # How many of the chunk's sentences go into A.
      a_end = 1
      if len(chunk) >= 2:
        a_end = int(rng.integers(1, len(chunk) - 1, endpoint=True))
      tokens_a = np.concatenate(chunk[:a_end])
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        target_b_length = target_seq_length - len(tokens_a)
        random_document = docs[_other_document(len(docs), doc_index, rng)]
        start = int(rng.integers(len(random_document)))
        pieces, b_length = [], 0
        for sentence in random_document[start:]:
          pieces.append(sentence)
          b_length += len(sentence)
          if b_length >= target_b_length:
            break
        tokens_b = np.concatenate(pieces)
        i -= len(chunk) - a_end  # put the unused sentences back
      else:
        is_random_next = False
        tokens_b = np.concatenate(chunk[a_end:])
      tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
      pairs.append((tokens_a, tokens_b, is_random_next))
      chunk, chunk_length = [], 0
    i += 1
  return pairs


def _other_document(num_docs: int, doc_index: int, rng: np.random.Generator) -> int:
  """A uniformly random document index other than doc_index (doc_index itself if it is alone)."""
  if num_docs == 1:
    return doc_index
  other = int(rng.integers(num_docs - 1))
  return other + (other >= doc_index)


def _truncate_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Removes tokens from the longer of A and B (B on a tie), at its front or back at random
  (one coin per token removed), until len(A) + len(B) <= max_num_tokens."""
  la, lb = len(tokens_a), len(tokens_b)
  excess = la + lb - max_num_tokens
  if excess <= 0:
    return tokens_a, tokens_b
  from_front = rng.random(excess) < 0.5  # [excess], one coin per removed token
  cut = {"a": [0, 0], "b": [0, 0]}  # side -> [front, back] tokens removed
  for coin in from_front:
    side = "a" if la > lb else "b"
    cut[side][0 if coin else 1] += 1
    if side == "a":
      la -= 1
    else:
      lb -= 1
  (af, ab), (bf, bb) = cut["a"], cut["b"]
  return tokens_a[af:len(tokens_a) - ab], tokens_b[bf:len(tokens_b) - bb]


# ----------------------------------------------------------------------------------------------
# No NSP and left-to-right LM: contiguous single-segment examples.


def iter_contiguous_spans(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                          dupe_factor: int = 1) -> Iterator[np.ndarray]:
  """Yields the contiguous spans of tokenized documents: the single-segment examples
  `[CLS] span [SEP]` of the paper's No NSP and LTR models (section 5.1).

  Each document's sentences are joined into one stream of tokens and cut into spans of
  max_seq_length - 2 tokens (room for [CLS] and [SEP]), the last span of a document shorter;
  no span crosses a document's end. Pass p of `dupe_factor` starts cutting at token
  p * (max_seq_length - 2) // dupe_factor (its first span is that short), so each pass cuts the
  text at other places, as each of the original's passes pairs it differently. Every token is
  in one span of each pass.

  Args:
    documents: documents -> sentences -> token ids (no special tokens); empty ones dropped.
    max_seq_length: length of each row, [CLS] and [SEP] included (>= 3).
    dupe_factor: passes over the documents.

  Yields:
    [n] int32 token ids of a span, 1 <= n <= max_seq_length - 2, in document order.
  """
  if max_seq_length < 3:
    raise UserError(f"max_seq_length={max_seq_length} leaves no room for [CLS] span [SEP]; use 3 "
                    "or more (128 or 512 as in the paper).")
  if dupe_factor < 1:
    raise UserError(f"dupe_factor={dupe_factor}; use 1 or more.")
  span = max_seq_length - 2
  streams = [np.concatenate([np.asarray(s, np.int32) for s in doc]) for doc in documents
             if any(len(s) for s in doc)]
  for dupe in range(dupe_factor):
    shift = dupe * span // dupe_factor  # where pass `dupe` first cuts
    for tokens in streams:
      cuts = [0, *range(shift or span, len(tokens), span), len(tokens)]
      for start, stop in zip(cuts, cuts[1:]):
        if stop > start:
          yield tokens[start:stop]


# ----------------------------------------------------------------------------------------------
# Masked LM: masks.


class MaskRandoms(NamedTuple):
  """The random numbers masking consumes, [batch, seq] each (or [seq] for one example).

  unit_keys: float in [0, 1); units (tokens, or words) are taken in increasing key order.
  action: float in [0, 1); < 0.8 -> [MASK], >= 0.9 -> random token, else kept.
  replacement: int index into SpecialTokens.replacement_ids, used where action >= 0.9.
  """
  unit_keys: np.ndarray
  action: np.ndarray
  replacement: np.ndarray


def draw_mask_randoms(rng: np.random.Generator, shape: tuple[int, ...],
                      special: SpecialTokens) -> MaskRandoms:
  """Draws the randoms for masking arrays of `shape`, always in the same order."""
  return MaskRandoms(unit_keys=rng.random(shape), action=rng.random(shape),
                     replacement=rng.integers(len(special.replacement_ids), size=shape))


def stack_mask_randoms(rows: Sequence[MaskRandoms], seq: int) -> MaskRandoms:
  """Stacks per-example [seq] randoms into [len(rows), seq] ones."""
  if not rows:
    return MaskRandoms(np.zeros((0, seq)), np.zeros((0, seq)), np.zeros((0, seq), np.int64))
  return MaskRandoms(*(np.stack(parts) for parts in zip(*rows)))


def num_to_predict(num_real_tokens: np.ndarray | int, masked_lm_prob: float,
                   max_predictions_per_seq: int) -> np.ndarray:
  """min(max_predictions_per_seq, max(1, round(n * masked_lm_prob))), rounding half to even
  as Python's round does. n counts the real tokens, [CLS] and [SEP] included."""
  n = np.asarray(num_real_tokens, np.float64)
  return np.minimum(max_predictions_per_seq,
                    np.maximum(1, np.rint(n * masked_lm_prob))).astype(np.int64)


def apply_masks(input_ids: np.ndarray, input_mask: np.ndarray, randoms: MaskRandoms,
                special: SpecialTokens, masked_lm_prob: float, max_predictions_per_seq: int,
                word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Masks a batch with given randoms (see mask_batch for the rules and the result).

  Args:
    input_ids, input_mask: [batch, seq] int arrays; input_mask is 1 on real tokens.
    randoms: MaskRandoms of [batch, seq] arrays.
    special, masked_lm_prob, max_predictions_per_seq: as mask_batch.
    word_starts: [batch, seq] bool (True where a token starts a word) for whole-word masking,
      or None to mask tokens independently.
  """
  input_ids = np.asarray(input_ids)
  batch, seq = input_ids.shape
  real = np.asarray(input_mask).astype(bool)  # [batch, seq]
  k = num_to_predict(real.sum(axis=1), masked_lm_prob, max_predictions_per_seq)  # [batch]
  candidate = real & ~np.isin(input_ids, special.never_masked_array)  # [batch, seq]

  # Units: each candidate token, or with whole-word masking each word. A unit starts at a word
  # start or after a non-candidate, so no unit spans [SEP] (the original would join a
  # continuation piece right after [SEP] to the last word of A).
  if word_starts is None:
    unit_start = candidate
  else:
    after_candidate = np.zeros_like(candidate)
    after_candidate[:, 1:] = candidate[:, :-1]
    unit_start = candidate & (np.asarray(word_starts, bool) | ~after_candidate)
  unit_of_token = np.maximum(np.cumsum(unit_start, axis=1) - 1, 0)  # [batch, seq] unit index
  num_units = unit_start.sum(axis=1)  # [batch]
  rows = np.broadcast_to(np.arange(batch)[:, None], (batch, seq))
  unit_length = np.bincount((rows * seq + unit_of_token)[candidate],
                            minlength=batch * seq).reshape(batch, seq)  # [batch, unit]

  # Shuffle the units: sort by random keys, units that do not exist last.
  keys = np.where(np.arange(seq)[None, :] < num_units[:, None], randoms.unit_keys, np.inf)
  order = np.argsort(keys, axis=1, kind="stable")  # [batch, rank] -> unit
  length_in_order = np.take_along_axis(unit_length, order, axis=1)  # [batch, rank]
  if word_starts is None:  # all units are one token: take the first k
    taken_in_order = (length_in_order > 0) & (np.arange(seq)[None, :] < k[:, None])
  else:  # take a word if it still fits, else skip it (greedy, as the original)
    taken_in_order = np.zeros((batch, seq), bool)
    count = np.zeros(batch, np.int64)
    for rank in range(int(num_units.max(initial=0))):
      length = length_in_order[:, rank]
      fits = (length > 0) & (count + length <= k)
      taken_in_order[:, rank] = fits
      count += np.where(fits, length, 0)
      if np.all(count >= k):
        break
  taken_unit = np.zeros((batch, seq), bool)
  np.put_along_axis(taken_unit, order, taken_in_order, axis=1)  # [batch, unit]
  chosen = candidate & np.take_along_axis(taken_unit, unit_of_token, axis=1)  # [batch, seq]

  # 80% [MASK], 10% random non-special token, 10% unchanged.
  to_mask = chosen & (randoms.action < _MASK_FRACTION)
  to_random = chosen & (randoms.action >= _MASK_FRACTION + _RANDOM_FRACTION)
  masked_ids = np.where(to_mask, special.mask, input_ids)
  masked_ids = np.where(to_random, special.replacement_ids[randoms.replacement], masked_ids)

  # Chosen positions in increasing order, padded with 0 to max_predictions_per_seq.
  width = max_predictions_per_seq
  sorted_positions = np.argsort(~chosen, axis=1, kind="stable")[:, :width]  # chosen first
  if sorted_positions.shape[1] < width:
    sorted_positions = np.pad(sorted_positions, ((0, 0), (0, width - sorted_positions.shape[1])))
  valid = np.arange(width)[None, :] < chosen.sum(axis=1)[:, None]  # [batch, max_predictions]
  positions = np.where(valid, sorted_positions, 0)
  return {
      "input_ids": masked_ids.astype(np.int32),
      "masked_lm_positions": positions.astype(np.int32),
      "masked_lm_ids": np.where(valid, np.take_along_axis(input_ids, positions, axis=1),
                                0).astype(np.int32),
      "masked_lm_weights": valid.astype(np.float32),
  }


def mask_batch(input_ids: np.ndarray, input_mask: np.ndarray, rng: np.random.Generator,
               special: SpecialTokens, masked_lm_prob: float = 0.15,
               max_predictions_per_seq: int = 20,
               word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Masks a batch for the masked LM, drawing the randoms of each row from rng in turn.

  Args:
    input_ids: [batch, seq] int, unmasked `[CLS] A [SEP] B [SEP]` + padding.
    input_mask: [batch, seq] int, 1 on real tokens.
    rng: the generator; row r gets what draw_mask_randoms(rng, (seq,)) gives after r rows, so a
      batch of one masks as mask_tokens does with the same generator.
    special: special ids (never chosen, never drawn as replacements), [MASK] id, vocab size.
    masked_lm_prob: fraction of real tokens to predict.
    max_predictions_per_seq: predictions per row at most (and the width of the outputs).
    word_starts: [batch, seq] bool for whole-word masking, or None.

  Returns:
    `input_ids` [batch, seq] int32 with the chosen tokens replaced; `masked_lm_positions` and
    `masked_lm_ids` (the original tokens) [batch, max_predictions_per_seq] int32, positions in
    increasing order, padded with 0; `masked_lm_weights` float32, 1.0 on real predictions.
  """
  input_ids = np.asarray(input_ids)
  randoms = stack_mask_randoms(
      [draw_mask_randoms(rng, (input_ids.shape[1],), special) for _ in range(len(input_ids))],
      input_ids.shape[1])
  return apply_masks(input_ids, input_mask, randoms, special, masked_lm_prob,
                     max_predictions_per_seq, word_starts)


def mask_tokens(tokens: np.ndarray, input_mask_or_length: np.ndarray | int,
                rng: np.random.Generator, special: SpecialTokens, masked_lm_prob: float = 0.15,
                max_predictions_per_seq: int = 20, word_starts: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Masks one example (see mask_batch).

  Args:
    tokens: [seq] int, `[CLS] A [SEP] B [SEP]` + padding.
    input_mask_or_length: [seq] input mask, or the number of real tokens.
    rng, special, masked_lm_prob, max_predictions_per_seq: as mask_batch.
    word_starts: [seq] bool for whole-word masking, or None.

  Returns:
    (masked tokens [seq] int32, positions [max_predictions_per_seq] int32, label ids
    [max_predictions_per_seq] int32, weights [max_predictions_per_seq] float32).
  """
  tokens = np.asarray(tokens)
  if np.ndim(input_mask_or_length) == 0:
    input_mask = (np.arange(len(tokens)) < int(input_mask_or_length)).astype(np.int32)
  else:
    input_mask = np.asarray(input_mask_or_length)
  out = mask_batch(tokens[None], input_mask[None], rng, special, masked_lm_prob,
                   max_predictions_per_seq, None if word_starts is None else word_starts[None])
  return (out["input_ids"][0], out["masked_lm_positions"][0], out["masked_lm_ids"][0],
          out["masked_lm_weights"][0])


def unmask(examples: Mapping[str, np.ndarray]) -> np.ndarray:
  """[N, seq] int32: the input_ids of a masked example set with the original tokens put back."""
  input_ids = np.array(examples["input_ids"], np.int32)
  positions = examples["masked_lm_positions"]
  real = examples["masked_lm_weights"] > 0  # [N, max_predictions]
  rows = np.broadcast_to(np.arange(len(input_ids))[:, None], positions.shape)
  input_ids[rows[real], positions[real]] = examples["masked_lm_ids"][real]
  return input_ids
