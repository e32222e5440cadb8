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

Length buckets (`FeatureBatches(length_buckets=...)`): a batch of short sentences need not carry
max_seq_length columns of padding. Every training and evaluation batch is cut to the smallest
bucket that holds the longest example (its last real token, input_mask's) of its whole global
batch; each host computes that from the examples' lengths, which it holds for all rows, so all
hosts agree on the shape, and the jitted steps compile once per bucket. Every array shaped like
input_mask ([N, seq] or [N, choices, seq], and any [N, seq, ...]) is cut on its seq axis; only
padding columns go, so a model that masks padding (and a loss weighted off it) gives the same
per-example outputs.

Packing (`FeatureBatches(packing=k)`, Krell et al. 2021, for sequence-level tasks): the G examples
of a global batch are laid out k to a row in G / k rows (`balanced_rows`: longest first, each
into the open row with the fewest tokens), in the packed layout of `bertjax.data.pretraining.packing`
(position_ids, sequence_ids, cls_positions; per-example keys [rows, k]). A global batch is still
the same G examples, so steps, epochs and data positions are those of unpacked batches. Rows are
cut to the smallest length bucket that holds the longest row (k * seq without buckets); each host
takes its block of rows. Evaluation batches carry `example_index` [rows, k], each example's
index, so that predictions can be put back in the examples' order.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from bertjax.data import packed_rows
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
    length_buckets: sequence lengths a batch may be cut to (module docstring), needing an
      input_mask feature; input_mask's own length is added as the last bucket (longer ones are
      dropped). Empty: every batch keeps the features' full length.
    packing: k > 0 lays out k examples a row (module docstring): features are input_ids,
      segment_ids, input_mask [N, seq] (real tokens first) and per-example keys [N]; the global
      batch (and the eval batch) must split into rows of k evenly over the hosts. The buckets
      are then row lengths, up to k * seq.
  """

  def __init__(self, features: Mapping[str, np.ndarray], *, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, shuffle: bool = True,
               threads: int = 1, length_buckets: Sequence[int] = (), packing: int = 0):
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
    self._cut_keys, self._lengths, self.buckets = (), None, ()
    self.packing = packing
    if length_buckets or packing:
      if "input_mask" not in self._features:
        raise ValueError("length buckets and packing need an input_mask feature")
      mask = self._features["input_mask"]
      self._lengths = example_lengths(mask)
      self._cut_keys = tuple(key for key, value in self._features.items()
                             if value.shape[:mask.ndim] == mask.shape)
      longest = mask.shape[-1] * max(packing, 1)  # a row's tokens at most
      self.buckets = tuple(sorted({int(b) for b in length_buckets if 0 < b < longest}
                                  | {longest}))
    if packing:
      self._check_packable(packing)

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
    mine = slice(self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size)

    def make_batch(rows, _):  # rows [G]: the global batch; this host gathers its block
      if self.packing:
        return self._packed_batch(rows)
      return self._batch(rows[mine], self._bucket(rows))

    # The global stream read as one host of batch G: global batch j is the same elements
    # [examples + j * G, ...) that host_batches gives P hosts, so every host sees all its rows.
    for batch, after in host_batches(
        self.num_examples, order_seed, examples, make_batch, batch_size=self.global_batch_size,
        process_index=0, process_count=1, threads=self.threads):
      yield batch, {"examples": after}

  def eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass over the examples in order; this host's block of each global batch, the last
    padded with all-zero rows whose example_weight is 0."""
    everyone = eval_rows(self.num_examples, self.global_batch_size, 0, 1)
    if self.packing:
      for global_rows in everyone:
        yield self._packed_batch(global_rows, with_index=True)
      return
    for rows, global_rows in zip(eval_rows(self.num_examples, self.batch_size,
                                           self.process_index, self.process_count), everyone):
      yield pad_batch(self._batch(rows, self._bucket(global_rows)), self.batch_size)

  def _bucket(self, global_rows: np.ndarray) -> int | None:
    """The length a batch of the global batch `global_rows` is cut to (None: not cut)."""
    if not self.buckets:
      return None
    longest = int(self._lengths[global_rows].max(initial=0))
    return self.buckets[int(np.searchsorted(self.buckets, longest))]

  def _check_packable(self, k: int) -> None:
    """ValueError unless the features and the batch sizes can be packed k to a row."""
    mask = self._features["input_mask"]
    others = [key for key in self._features if key not in packed_rows.TOKEN_KEYS]
    if mask.ndim != 2 or any(self._features[key].ndim != 1 for key in others):
      raise ValueError(f"packing takes [N, seq] tokens and [N] per-example keys, not "
                       f"{ {key: value.shape for key, value in self._features.items()} }")
    if self.batch_size % k:
      raise ValueError(f"{self.batch_size} examples a host do not make rows of {k}")

  def _packed_batch(self, global_rows: np.ndarray, with_index: bool = False
                    ) -> dict[str, np.ndarray]:
    """This host's block of rows of the global batch `global_rows` ([n <= G] example indices)
    packed k to a row (module docstring); `with_index` adds example_index [rows, k]."""
    k = self.packing
    num_rows = self.global_batch_size // k
    # A last, smaller eval batch fills the rows it needs, k a row as a whole batch does (so it
    # takes a width the others take), and leaves the rest empty.
    plan = np.full((num_rows, k), -1, np.int64)
    needed = -(-len(global_rows) // k)
    plan[:needed] = balanced_rows(self._lengths[global_rows], needed, k)
    row_tokens = np.where(plan >= 0, self._lengths[global_rows][plan], 0).sum(axis=1)
    width = self.buckets[int(np.searchsorted(self.buckets, row_tokens.max(initial=0)))]
    rows_per_host = self.batch_size // k
    mine = plan[self.process_index * rows_per_host:(self.process_index + 1) * rows_per_host]
    filled = mine >= 0  # [rows, k]
    examples = global_rows[mine[filled]]  # [n] in row-major slot order
    seq = self._features["input_mask"].shape[1]
    unpacked = {}
    for key, value in self._features.items():
      value = value[examples]
      if key in packed_rows.TOKEN_KEYS:  # [n, seq] -> [n, width]: cut padding or add it
        value = value[:, :width] if width <= seq else np.pad(value, [(0, 0), (0, width - seq)])
      unpacked[key] = value
    unpacked["example_weight"] = np.ones(len(examples), np.float32)
    if with_index:
      unpacked["example_index"] = examples.astype(np.int32)
    return packed_rows.pack_examples(unpacked, filled)

  def _order_seed(self) -> int:
    """grain's shuffle seed of the epoch orders, from `seed`."""
    return int(np.random.default_rng([self.seed, _ORDER]).integers(2**31))

  def _batch(self, rows: np.ndarray, length: int | None = None) -> dict[str, np.ndarray]:
    """The batch of examples `rows` ([n] indices): every key's [n, ...] rows, one gather each;
    with `length`, the arrays shaped like input_mask cut to its first `length` positions."""
    batch = {}
    for key, value in self._features.items():
      if length is not None and key in self._cut_keys:
        axis = self._features["input_mask"].ndim - 1  # input_mask [N, ..., seq]: seq's axis
        value = value[(slice(None),) * axis + (slice(0, length),)]
      batch[key] = value[rows]
    batch["example_weight"] = np.ones(len(rows), np.float32)
    return batch


def balanced_rows(lengths: np.ndarray, num_rows: int, k: int) -> np.ndarray:
  """Lays out n <= num_rows * k examples k to a row at most, keeping the rows' tokens even:
  longest first (ties in index order), each into the row with the fewest tokens among those
  with a free slot (ties: the first such row).

  Args:
    lengths: [n] each example's tokens.
    num_rows, k: the rows and the slots of a row.
  Returns:
    [num_rows, k] int: indices into `lengths`, each row's filled slots first, -1 in empty ones.
  """
  plan = np.full((num_rows, k), -1, np.int64)
  tokens, count = np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
  for i in np.argsort(-np.asarray(lengths), kind="stable"):
    open_rows = np.flatnonzero(count < k)
    row = open_rows[np.argmin(tokens[open_rows])]
    plan[row, count[row]] = i
    tokens[row] += lengths[i]
    count[row] += 1
  return plan


def example_lengths(input_mask: np.ndarray) -> np.ndarray:
  """[N] each example's length: one past its last real token (input_mask [N, ..., seq] != 0),
  the longest of its sequences for [N, choices, seq]; 0 for an example without any."""
  mask = input_mask.reshape(len(input_mask), -1, input_mask.shape[-1]) != 0
  last = mask.shape[-1] - np.argmax(mask[..., ::-1], axis=-1)  # [N, choices]
  return np.where(mask.any(-1), last, 0).max(axis=1)


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
