"""Sequence packing (Krell et al. 2021, "Efficient sequence packing without cross-contamination"):
several NSP examples in one row instead of one padded example a row.

Packing is planned offline: `bertjax.data.prepare` writes, next to each text shard's training
pairs at a length L, that shard's plan (`plan_packs`): groups of its record indices whose
lengths (len_a + len_b + 3) sum to at most L, at most k a group, stored as an int32 array
[packs, k] (-1 in empty slots) in seq{L}/packs-train-SSSSS-of-NNNNN.npy. The loader reads plans
by random access (`PackPlans`, memory-mapped), masks each example as it would unpacked, and lays
the examples of a pack out in one row (`pack_examples`):

  input_ids, segment_ids, input_mask  [rows, seq]  the examples one after the other, then padding
  position_ids   [rows, seq]  position within the token's own example (0 at its [CLS]; 0 padding)
  sequence_ids   [rows, seq]  1..k: the example a token belongs to (0 at padding)
  cls_positions  [rows, k]    where each example's [CLS] is (0 for an empty slot)
  per-example keys ([n] unpacked, e.g. next_sentence_label, example_weight) -> [rows, k], 0 in
    empty slots
  masked_lm_positions, masked_lm_ids, masked_lm_weights ([n, P] unpacked) -> [rows, W]: the
    row's real predictions, example by example, positions shifted to the row, then zeros (weight
    0); W = `predictions_per_row`, the most a row of k examples can hold

Prediction slots: an example of n tokens has masking.num_to_predict(n) = min(P, max(1,
round(0.15 n))) predictions, so a row of at most L tokens needs far fewer than k * P slots: W is
that count maximised over every way of filling the row (1 to k examples of any lengths), 21 for
L = 128, k = 3, P = 20 (not 60) and 78 for 512, 3, 80 (not 240). Every prediction of every
example keeps its slot, so the masks, the loss and the metrics are those of k * P slots; the MLM
head gathers and scores W positions a row instead of k * P.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from bertjax.data.pretraining import masking, shards
from bertjax.errors import UserError

TOKEN_KEYS = ("input_ids", "segment_ids", "input_mask")
MLM_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
PACKED_KEYS = ("position_ids", "sequence_ids", "cls_positions")  # what packing adds to a batch
EMPTY = -1  # the record index of an empty slot


# ----------------------------------------------------------------------------------------------
# The plan.


def plan_packs(lengths: np.ndarray, max_seq_length: int, max_sequences_per_row: int
               ) -> np.ndarray:
  """Groups examples into packs: best-fit decreasing on a histogram of lengths.

  The examples are taken longest first, each into the open pack it leaves the least room in
  (among packs with room for it and fewer than k examples; on a tie, the pack with more
  examples), else into a new pack. Examples of one length are placed together: the histogram
  gives how many of each length there are, and the open packs are counted by (room left, examples
  held) and by their lengths, so the work is O(L * open pack kinds), not O(n * L), and the result
  is exactly that of placing them one at a time. Records of one length are assigned to its
  slots in increasing index order, so the plan depends on the lengths alone.

  Args:
    lengths: [n] int, each example's length (len_a + len_b + 3), 1 to max_seq_length.
    max_seq_length: L, the tokens of a row.
    max_sequences_per_row: k >= 1, examples in a pack at most.

  Returns:
    [packs, k] int32: the indices into `lengths` of each pack's examples (longest first), -1 in
    empty slots; every index appears exactly once.
  """
  lengths = np.asarray(lengths, np.int64)
  k, big = max_sequences_per_row, max_seq_length
  if k < 1:
    raise ValueError(f"max_sequences_per_row={k}; use 1 or more")
  if len(lengths) and (lengths.min() < 1 or lengths.max() > big):
    raise ValueError(f"lengths from {lengths.min()} to {lengths.max()} do not all lie in "
                     f"[1, {big}]")
  histogram = np.bincount(lengths, minlength=big + 1)  # [L + 1] examples of each length
  open_bins: dict[tuple[int, int], dict[tuple[int, ...], int]] = {}  # (room, held) -> kinds
  room_count = np.zeros(big + 1, np.int64)  # [L + 1] open packs by the room they have left
  closed: dict[tuple[int, ...], int] = {}  # packs of k examples: kind -> count

  def add(kind: tuple[int, ...], count: int) -> None:
    room = big - sum(kind)
    if len(kind) == k or room == 0:
      closed[kind] = closed.get(kind, 0) + count
      return
    kinds = open_bins.setdefault((room, len(kind)), {})
    kinds[kind] = kinds.get(kind, 0) + count
    room_count[room] += count

  for length in range(big, 0, -1):
    left = int(histogram[length])
    while left:
      fitting = np.flatnonzero(room_count[length:])
      if not len(fitting):  # new packs, each filled with as many as fit
        each = min(big // length, k)
        if left >= each:
          add((length,) * each, left // each)
        if left % each:
          add((length,) * (left % each), 1)
        break
      room = length + int(fitting[0])
      held = max(h for (r, h) in open_bins if r == room and open_bins[(r, h)])
      kinds = open_bins[(room, held)]
      each = min(room // length, k - held)  # a pack takes this many before another is the best
      for kind in list(kinds):
        if not left:
          break
        take = min(kinds[kind], -(-left // each))  # packs of this kind taken
        kinds[kind] -= take
        room_count[room] -= take
        if not kinds[kind]:
          del kinds[kind]
        full = min(take, left // each)
        if full:
          add(kind + (length,) * each, full)
        if take > full:
          add(kind + (length,) * (left - full * each), 1)
        left -= min(left, take * each)
      if not kinds:
        del open_bins[(room, held)]

  groups = dict(closed)
  for kinds in open_bins.values():
    for kind, count in kinds.items():
      groups[kind] = groups.get(kind, 0) + count
  order = np.argsort(lengths, kind="stable")  # record indices by length, then index
  starts = np.concatenate([[0], np.cumsum(histogram)])  # [L + 2] first of each length in order
  taken = starts[:-1].copy()  # [L + 1] next record of each length
  packs = np.full((sum(groups.values()), k), EMPTY, np.int32)
  row = 0
  for kind in sorted(groups, reverse=True):
    count = groups[kind]
    for slot, length in enumerate(kind):
      packs[row:row + count, slot] = order[taken[length]:taken[length] + count]
      taken[length] += count
    row += count
  return packs


def predictions_per_row(max_seq_length: int, max_sequences_per_row: int,
                        max_predictions_per_seq: int, masked_lm_prob: float) -> int:
  """W: the most masked predictions a packed row can hold (module docstring).

  The maximum, over 1 to k examples of n_j >= 1 tokens with sum(n_j) <= L, of
  sum(masking.num_to_predict(n_j)); whole-word masking predicts at most as many. A knapsack over
  the row's tokens, k rounds of O(L^2).

  Args:
    max_seq_length: L, the tokens of a row.
    max_sequences_per_row: k, examples in a row at most.
    max_predictions_per_seq: P, an example's predictions at most.
    masked_lm_prob: the share of an example's tokens predicted.
  """
  lengths = np.arange(1, max_seq_length + 1)  # [L] an example's tokens
  gain = masking.num_to_predict(lengths, masked_lm_prob, max_predictions_per_seq)  # [L]
  best = np.zeros(max_seq_length + 1, np.int64)  # [L + 1] most predictions in <= t tokens
  for _ in range(max_sequences_per_row):  # one more example each round
    best = np.array([max(best[t], (best[t - lengths[:t]] + gain[:t]).max(initial=0))
                     for t in range(max_seq_length + 1)])
  return int(best[-1])


def efficiency(real_tokens: int, rows: int, max_seq_length: int) -> float:
  """Real tokens / slots: real_tokens / (rows * max_seq_length)."""
  return float(real_tokens) / max(1, rows * max_seq_length)


def pair_length(record: bytes, dtype: np.dtype) -> int:
  """The padded-row length (len_a + len_b + 3) of a pair record (shards.py)."""
  return int(np.frombuffer(record, dtype, count=2).astype(np.int64).sum()) + 3


def plan_name(pairs_shard: str) -> str:
  """seq{L}/train-SSSSS-of-NNNNN.array_record -> seq{L}/packs-train-SSSSS-of-NNNNN.npy."""
  directory, name = os.path.split(pairs_shard)
  return os.path.join(directory, "packs-" + name[:-len(shards.SUFFIX)] + ".npy")


def write_plan(path: str, packs: np.ndarray) -> None:
  """Writes a plan ([packs, k] int32) as .npy in one rename."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = shards.temporary_name(path)
  with open(tmp, "wb") as f:
    np.save(f, np.ascontiguousarray(packs, np.int32))
  os.replace(tmp, path)


class PackPlans:
  """Random access to the packs of a phase's training pairs, the plans memory-mapped.

  Args:
    paths: the plan of each training shard, in shard order.
    counts: the packs info.json lists for each.
    record_counts: the pair records of each shard (its plan's indices are the shard's own).
    max_sequences_per_row: k, the plans' width.

  Raises:
    UserError: a plan is missing, unreadable or of another shape than info.json says.
  """

  def __init__(self, paths: Sequence[str], counts: Sequence[int], record_counts: Sequence[int],
               max_sequences_per_row: int):
    self.paths = list(paths)
    self._plans = []
    for path, count in zip(paths, counts):
      try:
        plan = np.load(path, mmap_mode="r")
      except (OSError, ValueError) as e:
        raise UserError(f"{path} is missing or damaged ({e}); delete it with its shard "
                        f"{os.path.basename(path)[6:-4]}{shards.SUFFIX} and rerun "
                        "bertjax.data.prepare, which rewrites only what is missing.") from None
      if plan.shape != (count, max_sequences_per_row) or plan.dtype != np.int32:
        raise UserError(f"{path} holds {plan.dtype} {plan.shape}, not the int32 ({count}, "
                        f"{max_sequences_per_row}) info.json lists; it was changed after "
                        "preparation. Prepare the data again.")
      self._plans.append(plan)
    self._ends = np.cumsum(np.asarray(counts, np.int64))  # [shards] one past each's last pack
    self._first_pack = self._ends - np.asarray(counts, np.int64)  # [shards]
    self._records = np.asarray(record_counts, np.int64)  # [shards]
    self._first_record = np.cumsum(self._records) - self._records  # [shards]
    self.max_sequences_per_row = max_sequences_per_row

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def read(self, indices: np.ndarray) -> np.ndarray:
    """[n, k] int64: the global record indices of packs `indices` ([n], any order), -1 in empty
    slots."""
    indices = np.asarray(indices, np.int64)
    shard = np.searchsorted(self._ends, indices, side="right")  # [n]
    local = indices - self._first_pack[shard]  # [n] index in its shard's plan
    out = np.empty((len(indices), self.max_sequences_per_row), np.int64)
    for s in np.unique(shard):
      rows = np.flatnonzero(shard == s)
      records = np.asarray(self._plans[s][local[rows]], np.int64)  # [rows, k] shard-local
      if (records >= self._records[s]).any() or (records < EMPTY).any():
        raise UserError(f"{self.paths[s]} names records its shard does not hold; it is "
                        "damaged. Prepare the data again.")
      out[rows] = np.where(records == EMPTY, EMPTY, records + self._first_record[s])
    return out


# ----------------------------------------------------------------------------------------------
# The layout of a packed batch.


def pack_examples(examples: Mapping[str, np.ndarray], slots: np.ndarray,
                  predictions: int | None = None) -> dict[str, np.ndarray]:
  """Lays out unpacked examples in packed rows (module docstring).

  Args:
    examples: n padded examples: input_ids, segment_ids, input_mask [n, seq] (each example's
      real tokens first, input_mask 1 on them), optionally masked_lm_* [n, P], and per-example
      keys [n] (any other key).
    slots: [rows, k] bool, True at the n filled slots; the examples fill them in row-major
      order (row 0's slots first).
    predictions: W, the prediction slots of a row (`predictions_per_row`); None = k * P.

  Returns:
    The packed batch: every key of `examples` in its packed shape, and position_ids,
    sequence_ids [rows, seq], cls_positions [rows, k] int32.

  Raises:
    ValueError: a row's examples are longer than seq, or its predictions more than W, together.
  """
  slots = np.asarray(slots, bool)
  rows, k = slots.shape
  seq = examples["input_ids"].shape[1]
  lengths = np.asarray(examples["input_mask"]).sum(axis=1).astype(np.int64)  # [n]
  row_of, slot_of = np.nonzero(slots)  # [n] each, row-major as the examples
  if len(row_of) != len(lengths):
    raise ValueError(f"{len(lengths)} examples for {len(row_of)} filled slots")
  grid = np.zeros((rows, k), np.int64)
  grid[slots] = lengths
  if (grid.sum(axis=1) > seq).any():
    raise ValueError(f"a row's examples total {grid.sum(axis=1).max()} tokens, more than {seq}")
  offset = (np.cumsum(grid, axis=1) - grid)[slots]  # [n] where each example starts in its row

  # Token t of example i goes to (row_of[i], offset[i] + t).
  example = np.repeat(np.arange(len(lengths)), lengths)  # [tokens]
  within = np.arange(len(example)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  dest_row, dest_col = row_of[example], offset[example] + within
  out = {}
  for key in TOKEN_KEYS:
    out[key] = np.zeros((rows, seq), np.int32)
    out[key][dest_row, dest_col] = examples[key][example, within]
  out["position_ids"] = np.zeros((rows, seq), np.int32)
  out["position_ids"][dest_row, dest_col] = within
  out["sequence_ids"] = np.zeros((rows, seq), np.int32)
  out["sequence_ids"][dest_row, dest_col] = slot_of[example] + 1
  out["cls_positions"] = np.zeros((rows, k), np.int32)
  out["cls_positions"][slots] = offset

  for key, value in examples.items():
    if key in TOKEN_KEYS or key in MLM_KEYS:
      continue
    out[key] = np.zeros((rows, k), value.dtype)  # [rows, k]
    out[key][slots] = value
  if "masked_lm_positions" in examples:
    real = examples["masked_lm_weights"] > 0  # [n, P]
    width = k * real.shape[1] if predictions is None else predictions
    counts = np.zeros((rows, k), np.int64)
    counts[slots] = real.sum(axis=1)  # [rows, k] each example's predictions
    if (counts.sum(axis=1) > width).any():
      raise ValueError(f"a row's examples have {counts.sum(axis=1).max()} predictions, more "
                       f"than its {width} slots")
    first = (np.cumsum(counts, axis=1) - counts)[slots]  # [n] each example's first slot
    # Prediction j of example i (its rank among i's real ones: r) goes to
    # (row_of[i], first[i] + r).
    i, j = np.nonzero(real)  # [predictions] row-major: example by example, in order
    rank = np.cumsum(real, axis=1)[i, j] - 1
    shifted = {"masked_lm_positions": examples["masked_lm_positions"] + offset[:, None],
               "masked_lm_ids": examples["masked_lm_ids"],
               "masked_lm_weights": examples["masked_lm_weights"]}
    for key, value in shifted.items():
      out[key] = np.zeros((rows, width), examples[key].dtype)  # [rows, W]
      out[key][row_of[i], first[i] + rank] = value[i, j]
  return out
