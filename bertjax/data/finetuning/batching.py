"""Fine-tuning's batching policy: the length buckets a batch is cut to (data.length_buckets) and
how many examples a row packs (data.packing). `bertjax.data.pipeline` lays the batches out as
chosen here; `bertjax.tasks.finetuning` reads the choices from the config (its docstring says why
both are exact).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from bertjax.data.pipeline import example_lengths
from bertjax.errors import UserError


def auto_buckets(longest: int) -> tuple[int, ...]:
  """data.length_buckets="auto": every multiple of 32 below `longest` (max_seq_length, or a
  packed row's k * max_seq_length), then `longest` (128: 32, 64, 96, 128)."""
  return tuple(range(32, longest, 32)) + (longest,)


def length_buckets(value: str, max_seq_length: int, examples_a_row: int = 0,
                   multiple: int = 1) -> tuple[int, ...]:
  """The bucket lengths data.length_buckets=`value` asks for, ascending and ending in the
  longest row: max_seq_length, or max_seq_length * examples_a_row packed; () for "" (every batch
  at that longest length). Each is rounded up to a multiple of `multiple` (splash attention's
  128: 32, 64, 96, 128 -> 128).

  Raises:
    UserError: a value that is not "auto", "" or comma-separated lengths from 1 to the longest.
  """
  value = str(value).strip()
  longest = max_seq_length * max(examples_a_row, 1)
  if not value:
    return ()
  if value == "auto":
    lengths = set(auto_buckets(longest))
  else:
    try:
      lengths = {int(part) for part in value.split(",") if part.strip()}
    except ValueError:
      lengths = set()
    if not lengths or not all(1 <= n <= longest for n in lengths):
      row = (f"data.max_seq_length={max_seq_length} x data.packing={examples_a_row}"
             if examples_a_row else f"data.max_seq_length={longest}")
      raise UserError(f"data.length_buckets={value!r}; give comma-separated sequence lengths "
                      f"from 1 to {row} (e.g. {longest // 4},{longest // 2},{longest}), "
                      "\"auto\" or \"\" (no buckets: every batch padded to the longest).")
  if multiple > 1:
    lengths = {min(math.ceil(n / multiple) * multiple, longest) for n in lengths}
  return tuple(sorted(lengths | {longest}))


@dataclasses.dataclass(frozen=True)
class Packable:
  """What decides whether a task's rows may pack, and how many examples a row.

  Attributes:
    task: the task in words, for messages.
    packable: its model gives one output per packed example (`finetuning.Spec.packable`).
    exact: packing changes no loss or prediction (a padding-invariant spec with length buckets
      and no BiLSTM on top): "auto" packs only then (a number packs as asked).
    bilstm_on_top: model.bilstm_on_top (a BiLSTM would run across a row's examples).
    max_seq_length: data.max_seq_length, the room of one example.
    batch_sizes: {"batch_size": n, "eval_batch_size": m}, in examples.
    row_multiple: what a batch's rows must come in multiples of (batch shards, hosts).
  """
  task: str
  packable: bool
  exact: bool
  bilstm_on_top: bool
  max_seq_length: int
  batch_sizes: dict[str, int]
  row_multiple: int

  def whole_rows(self, size: int, k: int) -> bool:
    """Whether `size` examples, k a row, make whole rows that spread evenly (row_multiple)."""
    return size % k == 0 and (size // k) % self.row_multiple == 0

  def fits(self, k: int) -> bool:
    """Whether k examples a row make whole rows of both batch sizes, spread evenly."""
    return all(self.whole_rows(size, k) for size in self.batch_sizes.values())


def packing(value: str, rows: Packable, input_mask: np.ndarray | None = None) -> int:
  """data.packing=`value`, the examples a row (0: one, unpacked), checked against the task and
  the batch sizes; "auto" is `auto_packing`'s choice for the training features' `input_mask`.

  Raises:
    UserError: not "auto" or a whole number from 0, packing asked of a task that cannot pack, or
      batch sizes that do not make whole rows spread evenly over the hosts and the mesh's batch
      shards.
  """
  text = str(value).strip().lower()
  if text == "auto":
    return auto_packing(rows, input_mask)
  try:
    k = int(text)
  except ValueError:
    k = -1
  if not k:
    return 0
  if k < 0:
    raise UserError(f"data.packing={value}; give the examples a row (e.g. 4), 0 for none, or "
                    "auto.")
  if rows.bilstm_on_top:
    raise UserError(f"data.packing={k} with model.bilstm_on_top: the BiLSTM would run across "
                    "the sequences packed in a row; set --config.data.packing=0 "
                    "(data.length_buckets cuts the padding instead).")
  if not rows.packable:
    raise UserError(f"data.packing={k}: {rows.task} cannot pack (its model gives one output "
                    "per row, or per token); set --config.data.packing=0. data.length_buckets "
                    "cuts its padding instead.")
  shards = rows.row_multiple
  bad = {name: size for name, size in rows.batch_sizes.items() if not rows.whole_rows(size, k)}
  if bad:  # every batch size at once, so one fix answers them all
    made = " and ".join(f"train.{name}={size} makes {size / k:g} rows"
                        for name, size in bad.items())
    raise UserError(
        f"with data.packing={k}, {made}; rows must be whole and split over {shards} batch "
        f"shards (devices, hosts and grad_accum_steps): make "
        f"{' and '.join(f'train.{name}' for name in bad)} multiples of {k * shards}.")
  return k


def auto_packing(rows: Packable, input_mask: np.ndarray | None) -> int:
  """data.packing="auto": as many examples a row as fit in max_seq_length on average (the mean
  length of the training features, `input_mask` [N, seq]), lowered to the largest k that makes
  whole rows of both batch sizes spread evenly over the batch shards; 0 (unpacked) where packing
  is not exact or the task cannot pack (`Packable`), or where no k >= 2 fits."""
  if not rows.packable or not rows.exact or input_mask is None or not len(input_mask):
    return 0
  mean = float(np.mean(example_lengths(input_mask)))
  fit = int(rows.max_seq_length // max(mean, 1.0))
  return next((k for k in range(fit, 1, -1) if rows.fits(k)), 0)
