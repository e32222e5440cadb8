"""Pretraining's packing plans (Krell et al. 2021, "Efficient sequence packing without
cross-contamination"): several NSP examples in one row instead of one padded example a row.

Packing is planned offline: `bertjax.data.prepare` writes, next to each text shard's training
pairs at a length L, that shard's plan (`plan_packs`): groups of its record indices whose
lengths (len_a + len_b + 3) sum to at most L, at most k a group, stored as an int32 array
[packs, k] (-1 in empty slots) in seq{L}/packs-train-SSSSS-of-NNNNN.npy. The loader reads plans
by random access (`PackPlans`, memory-mapped), masks each example as it would unpacked, and lays
the examples of a pack out in one row (`bertjax.data.packed_rows`, which fine-tuning's batches
share), with W = `predictions_per_row` prediction slots a row.

Prediction slots: an example of n tokens has masking.num_to_predict(n) = min(P, max(1,
round(0.15 n))) predictions, so a row of at most L tokens needs far fewer than k * P slots: W is
that count maximised over every way of filling the row (1 to k examples of any lengths), 21 for
L = 128, k = 3, P = 20 (not 60) and 78 for 512, 3, 80 (not 240). Every prediction of every
example keeps its slot, so the masks, the loss and the metrics are those of k * P slots; the MLM
head gathers and scores W positions a row instead of k * P.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from bertjax.data.pretraining import masking, shards
from bertjax.errors import UserError

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
