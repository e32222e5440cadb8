"""Batches of fine-tuning features held in memory, streamed with grain as loader.PairBatches
streams pretraining pairs.

`FeatureBatches` serves fixed features {key: [N, ...] array}; each batch is every key's rows
plus `example_weight` [batch] float32 (1 for a real example, 0 for the padding of the last eval
batch).

Training (`iterate`) reads one global stream of example indices without end: the N examples in
a fresh global permutation every epoch (grain's index shuffle; in order with shuffle=False).
Host p of P takes stream elements p, p + P, p + 2P, ..., `batch_size` at a time, so the hosts'
batches together are the stream's next `batch_size * P` elements, and one numpy gather a batch
reads a host's rows from memory. A global batch may span two epochs; none is dropped.

The position is global, {"examples": stream elements consumed by all hosts}. Storing it with a
checkpoint and passing it back to `iterate` replays exactly the batches that would have
followed, on any host count that divides it.

Evaluation (`eval_batches`) goes once through the examples in order. Host p takes rows
[p * batch_size, (p + 1) * batch_size) of each global batch, so the global batch (the hosts'
rows in host order) is the next `batch_size * P` examples in order and per-example predictions
come back in the examples' order. The last global batch is padded with all-zero rows whose
`example_weight` is 0.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from bertjax.errors import UserError

Position = dict[str, int]
_ORDER = 2  # kind of seed of the epoch orders


class FeatureBatches:
  """Batches of fixed features for one host (module docstring).

  Args:
    features: {key: [N, ...] array}, every key with the same N > 0 (e.g. input_ids,
      segment_ids, input_mask [N, seq] int32 and label [N]).
    batch_size: examples per batch on this host (the global batch is batch_size * process_count).
    seed: seeds the order of each epoch.
    process_index, process_count: this host and the number of hosts.
    shuffle: a fresh order every training epoch; False: in order (eval never shuffles).
    threads: threads that gather training batches ahead of the training step.
  """

  def __init__(self, features: Mapping[str, np.ndarray], *, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, shuffle: bool = True,
               threads: int = 1):
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if batch_size < 1:
      raise UserError(f"batch_size={batch_size}; use 1 or more per host.")
    sizes = {key: len(value) for key, value in features.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(f"features of different lengths: {sizes}")
    self.num_examples = next(iter(sizes.values()))
    if self.num_examples == 0:
      raise UserError("the example set is empty; give a data file with examples.")
    self._features = {key: np.asarray(value) for key, value in features.items()}
    self.batch_size = batch_size
    self.global_batch_size = batch_size * process_count
    self.seed, self.shuffle, self.threads = seed, shuffle, threads
    self.process_index, self.process_count = process_index, process_count

  @property
  def steps_per_epoch(self) -> int:
    """Global batches in N examples (the epoch's remainder starts the next global batch)."""
    return self.num_examples // self.global_batch_size

  @property
  def num_eval_batches(self) -> int:
    """Batches of one evaluation pass (the last one padded)."""
    return -(-self.num_examples // self.global_batch_size)

  def iterate(self, position: Position | None = None
              ) -> Iterator[tuple[dict[str, np.ndarray], Position]]:
    """Training batches without end, from `position` (None = the start).

    Raises UserError (at the call) if there are fewer examples than one global batch, or if
    the position is malformed, from an older bertjax, or does not divide by the host count.

    Yields:
      (batch of [batch_size, ...] arrays, {"examples": the global position after it}).
    """
    if self.num_examples < self.global_batch_size:
      raise UserError(
          f"only {self.num_examples} examples, fewer than one global batch of "
          f"{self.global_batch_size} ({self.batch_size} per host x {self.process_count} "
          "hosts); use a smaller train.batch_size.")
    examples = _check_position(position, self.process_count)
    return self._train_batches(examples)

  def _train_batches(self, examples: int) -> Iterator[tuple[dict[str, np.ndarray], Position]]:
    import grain  # pylint: disable=import-outside-toplevel

    stream = grain.MapDataset.range(self.num_examples)  # example index per stream element
    if self.shuffle:
      stream = stream.shuffle(seed=self._order_seed())
    start = examples + self.process_index
    host = stream.repeat()[start::self.process_count].batch(self.batch_size)
    batches = host.map(self._batch).to_iter_dataset(
        grain.ReadOptions(num_threads=self.threads, prefetch_buffer_size=2 * self.threads))
    for j, batch in enumerate(batches):
      yield batch, {"examples": examples + (j + 1) * self.global_batch_size}

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the examples in order; this host's block of each global batch, the last
    padded with all-zero rows whose example_weight is 0."""
    for j in range(self.num_eval_batches):
      first = j * self.global_batch_size + self.process_index * self.batch_size
      rows = np.arange(first, min(first + self.batch_size, self.num_examples))  # may be empty
      batch = self._batch(rows)
      pad = self.batch_size - len(rows)
      if pad:
        batch = {key: np.pad(value, [(0, pad)] + [(0, 0)] * (value.ndim - 1))
                 for key, value in batch.items()}
      yield batch

  def _order_seed(self) -> int:
    """grain's shuffle seed of the epoch orders, from `seed`."""
    return int(np.random.default_rng([self.seed, _ORDER]).integers(2**31))

  def _batch(self, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of examples `rows` ([n] indices): every key's [n, ...] rows, one gather each."""
    batch = {key: value[rows] for key, value in self._features.items()}
    batch["example_weight"] = np.ones(len(rows), np.float32)
    return batch


def _check_position(position: Position | None, process_count: int) -> int:
  """The global stream position of a stored data position (None: 0), checked for this job."""
  if position is None:
    return 0
  if isinstance(position, Mapping) and ("epoch" in position or "index" in position):
    raise UserError(f"the checkpoint's data position {dict(position)!r} is from an older bertjax "
                    "(epoch and index, not a stream position); it cannot be resumed. Start "
                    "from a fresh workdir.")
  try:
    examples = position["examples"]
    if isinstance(examples, bool) or int(examples) != examples or examples < 0:
      raise ValueError(examples)
  except (KeyError, TypeError, ValueError):
    raise UserError(f"data position {position!r} is not {{'examples': N}} with N >= 0; the "
                    "checkpoint's data state is damaged. Start from a fresh workdir.") from None
  if examples % process_count:
    raise UserError(f"the data position ({examples} examples) does not divide among "
                    f"{process_count} hosts; resume on a host count that divides it.")
  return int(examples)
