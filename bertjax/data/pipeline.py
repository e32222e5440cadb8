"""Batches of fine-tuning features held in memory: order, per-host sharding, a resumable position.

`ExampleBatches` does the order and the slicing; `FeatureBatches` serves fixed fine-tuning
features (pretraining streams its batches from prepared shards: loader.py).

Training (`iterate`) runs over epochs without end. Epoch e visits the examples in a permutation
drawn from (seed, e), in global batches of `batch_size * process_count` examples, dropping the
remainder; process p takes rows [p * batch_size, (p + 1) * batch_size) of each global batch, so
all hosts step together and together see every example of the global batch once.

Each training batch comes with the position after it, {"epoch": e, "index": j} (j = the next
global batch of epoch e). Storing it with a checkpoint and passing it back to `iterate` replays
exactly the batches that would have followed.

Evaluation (`eval_batches`) goes once through the examples in their order, in the same per-host
slices; the last global batch is padded with all-zero rows whose `example_weight` is 0.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from bertjax.errors import UserError

Position = dict[str, int]
_EPOCH_ORDER = 2  # kind of seed of the epoch orders


class ExampleBatches:
  """Batches of an example set held in memory, for one host: the order, the per-host slices, the
  resumable position and the padded evaluation pass (module docstring). Subclasses say what a
  batch of given example rows is (`_batch`).

  Args:
    num_examples: size of the example set (> 0).
    batch_size: examples per batch on this host (the global batch is batch_size * process_count).
    seed: seeds the order of each epoch.
    process_index, process_count: this host and the number of hosts.
    shuffle: permute the examples every epoch in training (eval never shuffles).
    too_few_hint: what to tell a user whose set is smaller than one global batch.
  """

  def __init__(self, num_examples: int, *, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, shuffle: bool = True,
               too_few_hint: str = "use a smaller batch size or more data"):
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if batch_size < 1:
      raise UserError(f"batch_size={batch_size}; use 1 or more per host.")
    self.num_examples = num_examples
    self.batch_size = batch_size
    self.global_batch_size = batch_size * process_count
    self.seed = seed
    self.process_index = process_index
    self.shuffle = shuffle
    self.too_few_hint = too_few_hint

  @property
  def steps_per_epoch(self) -> int:
    """Training batches per epoch (the remainder of a global batch is dropped)."""
    return self.num_examples // self.global_batch_size

  @property
  def num_eval_batches(self) -> int:
    """Batches of one evaluation pass (the last one padded)."""
    return -(-self.num_examples // self.global_batch_size)

  def iterate(self, position: Position | None = None
              ) -> Iterator[tuple[dict[str, np.ndarray], Position]]:
    """Training batches without end, starting at `position` (None = the beginning).

    Raises UserError (at the call) if there are fewer examples than one global batch.

    Yields:
      (batch, position after it): the batch dict with [batch_size, ...] arrays, and
      {"epoch": e, "index": j} to resume right after it.
    """
    if self.num_examples < self.global_batch_size:
      raise UserError(
          f"only {self.num_examples} examples, fewer than one global batch of "
          f"{self.global_batch_size} ({self.batch_size} per host x "
          f"{self.global_batch_size // self.batch_size} hosts); {self.too_few_hint}.")
    return self._train_batches(*_check_position(position, self.steps_per_epoch))

  def _train_batches(self, epoch: int, index: int
                     ) -> Iterator[tuple[dict[str, np.ndarray], Position]]:
    while True:
      order = self._epoch_order(epoch)  # [num_examples]
      while index < self.steps_per_epoch:
        start = index * self.global_batch_size + self.process_index * self.batch_size
        rows = order[start:start + self.batch_size]  # [batch_size] example indices
        batch = self._batch(rows, epoch)
        index += 1
        if index == self.steps_per_epoch:
          yield batch, {"epoch": epoch + 1, "index": 0}
        else:
          yield batch, {"epoch": epoch, "index": index}
      epoch, index = epoch + 1, 0

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the examples in order (fixed masks, if any); the last batch is padded with
    all-zero rows, whose example_weight is 0."""
    for index in range(self.num_eval_batches):
      start = index * self.global_batch_size + self.process_index * self.batch_size
      rows = np.arange(start, min(start + self.batch_size, self.num_examples))  # may be empty
      batch = self._batch(rows, None)
      pad = self.batch_size - len(rows)
      if pad:
        batch = {key: np.pad(value, [(0, pad)] + [(0, 0)] * (value.ndim - 1))
                 for key, value in batch.items()}
      yield batch

  def _epoch_order(self, epoch: int) -> np.ndarray:
    """[num_examples]: the example indices in the order epoch `epoch` visits them."""
    if not self.shuffle:
      return np.arange(self.num_examples)
    return np.random.default_rng([self.seed, _EPOCH_ORDER, epoch]).permutation(self.num_examples)

  def _batch(self, rows: np.ndarray, epoch: int | None) -> dict[str, np.ndarray]:
    """The batch of examples `rows` in training epoch `epoch` (None: evaluation)."""
    raise NotImplementedError


class FeatureBatches(ExampleBatches):
  """Batches of fixed features (fine-tuning): each key's rows, plus `example_weight` [batch]
  float32 (1 for a real example, 0 for the padding of the last eval batch).

  Args:
    features: {key: [N, ...] array}, every key with the same N > 0 (e.g. input_ids,
      segment_ids, input_mask [N, seq] int32 and label [N]).
    batch_size, seed, process_index, process_count, shuffle: as ExampleBatches.
  """

  def __init__(self, features: Mapping[str, np.ndarray], *, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, shuffle: bool = True):
    sizes = {key: len(value) for key, value in features.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(f"features of different lengths: {sizes}")
    num_examples = next(iter(sizes.values()))
    if num_examples == 0:
      raise UserError("the example set is empty; give a data file with examples.")
    super().__init__(num_examples, batch_size=batch_size, seed=seed,
                     process_index=process_index, process_count=process_count, shuffle=shuffle,
                     too_few_hint="use a smaller train.batch_size")
    self._features = {key: np.asarray(value) for key, value in features.items()}

  def _batch(self, rows: np.ndarray, epoch: int | None) -> dict[str, np.ndarray]:
    del epoch  # features do not change between epochs
    batch = {key: value[rows] for key, value in self._features.items()}
    batch["example_weight"] = np.ones(len(rows), np.float32)
    return batch


def _check_position(position: Position | None, steps_per_epoch: int) -> tuple[int, int]:
  """(epoch, index) from a stored position, checked against this example set."""
  if position is None:
    return 0, 0
  try:
    epoch, index = int(position["epoch"]), int(position["index"])
  except (KeyError, TypeError, ValueError) as e:
    raise UserError(f"data position {position!r} is not {{'epoch': E, 'index': I}}; the "
                    "checkpoint's data state is damaged. Start from a fresh workdir.") from e
  if epoch < 0 or not 0 <= index < steps_per_epoch:
    raise UserError(f"data position {position!r} does not fit this data ({steps_per_epoch} "
                    "batches per epoch): the examples or the batch size changed since the "
                    "checkpoint. Resume with the same data and batch size, or a fresh workdir.")
  return epoch, index
