"""MLM masks: which tokens of a padded batch are predicted, and what replaces them (sec. 3.1).

Follows the rules of google-research/bert's create_pretraining_data.py: `mask_tokens` /
`mask_batch` choose `min(max_predictions_per_seq, max(1, round(n * 0.15)))` positions
(n = real tokens of the example, [CLS] and [SEP] included) among all but the special tokens, in
random order; each chosen token becomes [MASK] 80% of the time, a random non-special token 10%
and stays itself 10%. With whole-word masking the units drawn are words (a word-start piece with
its continuation pieces) and a word that would overshoot the number to predict is skipped, as
the original does.

Masking is vectorised over a batch (a [64, 128] batch takes well under a millisecond, plus the
draws), so the pipeline can mask afresh every step. The random numbers an example needs are
drawn by `draw_mask_randoms`, one call per example, so masks depend only on the generator an
example is given, not on which batch it lands in. pairs.py makes the rows masked here.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

# The keys masking adds to an example set (and to a batch, see loader.py).
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
