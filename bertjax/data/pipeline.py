"""Batches streamed with grain, for one host of a job: the global stream, each host's rows, a
global resumable position, and the padded evaluation pass. `FeatureBatches` serves fine-tuning
features held in memory; loader.PairBatches streams pretraining pairs from shards the same way.

Training (`host_batches`) reads one global stream of example indices without end: the N
examples in a fresh global permutation every epoch (grain's index shuffle, nothing held in
memory; in order without shuffling). Global batch j is the stream's elements [j * G, (j + 1) * G)
for a global batch of G = batch_size * P on P hosts, and host p makes only its rows, elements
[j * G + p * batch_size, ...) of it, so a global batch is the same rows in the same order on any
number of hosts. A global batch may span two epochs; none is dropped.

The position is global, the number of stream elements consumed. Storing it with a checkpoint
and passing it back replays exactly the batches that would have followed, also on another
number of hosts (with the same global batch).

Evaluation (`eval_rows`) goes once through the examples in order, in the same per-host blocks,
so per-example predictions come back in the examples' order; the last global batch is padded
(`pad_batch`) with all-zero rows whose `example_weight` is 0.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from bertjax.errors import UserError

Position = dict[str, int]
_ORDER = 2  # kind of seed of the epoch orders
_ENDLESS = 2**62  # batches of a training stream


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
    order_seed = self._order_seed() if self.shuffle else None
    for batch, after in host_batches(
        self.num_examples, order_seed, examples, lambda rows, _: self._batch(rows),
        batch_size=self.batch_size, process_index=self.process_index,
        process_count=self.process_count, threads=self.threads):
      yield batch, {"examples": after}

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the examples in order; this host's block of each global batch, the last
    padded with all-zero rows whose example_weight is 0."""
    for rows in eval_rows(self.num_examples, self.batch_size, self.process_index,
                          self.process_count):
      yield pad_batch(self._batch(rows), self.batch_size)

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
  del process_count  # any host count resumes a global position
  return int(examples)


def host_batches(num_examples: int, order_seed: int | None, examples: int, make_batch, *,
                 batch_size: int, process_index: int, process_count: int, threads: int
                 ) -> Iterator[tuple[dict[str, np.ndarray], int]]:
  """This host's training batches from global stream position `examples` (module docstring).

  Args:
    num_examples: N, the examples of an epoch.
    order_seed: grain's shuffle seed of the epoch orders; None: every epoch in order.
    examples: stream elements consumed so far (0 = the start).
    make_batch: (rows [batch_size] example indices, epochs [batch_size]) -> batch dict.
    batch_size, process_index, process_count: this host's share of the global batch.
    threads: threads that make batches ahead of the training step.

  Yields:
    (batch, the global position after it).
  """
  import grain  # pylint: disable=import-outside-toplevel

  stream = grain.MapDataset.range(num_examples)  # example index per stream element
  if order_seed is not None:
    stream = stream.shuffle(seed=order_seed)
  stream = stream.repeat()
  global_batch = batch_size * process_count
  offset = examples + process_index * batch_size

  def batch(j):  # this host's rows of global batch j: elements offset + j * G + [0, b)
    elements = offset + j * global_batch + np.arange(batch_size)
    rows = np.array([stream[int(e)] for e in elements])
    return make_batch(rows, elements // num_examples)

  batches = grain.MapDataset.range(_ENDLESS).map(batch).to_iter_dataset(
      grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads))
  for j, item in enumerate(batches):
    yield item, examples + (j + 1) * global_batch


def eval_rows(num_examples: int, batch_size: int, process_index: int,
              process_count: int) -> Iterator[np.ndarray]:
  """This host's example indices of each global batch of one pass in order (the last ones may
  be fewer than batch_size, or none)."""
  global_batch = batch_size * process_count
  for j in range(-(-num_examples // global_batch)):
    first = j * global_batch + process_index * batch_size
    yield np.arange(first, min(first + batch_size, num_examples))


def pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  """A batch of fewer than batch_size rows, padded with all-zero rows (example_weight 0)."""
  pad = batch_size - len(batch["example_weight"])
  if not pad:
    return batch
  return {key: np.pad(value, [(0, pad)] + [(0, 0)] * (value.ndim - 1))
          for key, value in batch.items()}
