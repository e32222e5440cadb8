"""Packed rows (Krell et al. 2021, "Efficient sequence packing without cross-contamination"):
several examples laid out in one row, each attending only to itself. Pretraining's loader
(`bertjax.data.pretraining.loader`, by the plans of `bertjax.data.pretraining.packing`) and
fine-tuning's batches (`bertjax.data.pipeline`) both lay rows out here:

  input_ids, segment_ids, input_mask  [rows, seq]  the examples one after the other, then padding
  position_ids   [rows, seq]  position within the token's own example (0 at its [CLS]; 0 padding)
  sequence_ids   [rows, seq]  1..k: the example a token belongs to (0 at padding)
  cls_positions  [rows, k]    where each example's [CLS] is (0 for an empty slot)
  per-example keys ([n] unpacked, e.g. next_sentence_label, example_weight) -> [rows, k], 0 in
    empty slots
  masked_lm_positions, masked_lm_ids, masked_lm_weights ([n, P] unpacked) -> [rows, W]: the
    row's real predictions, example by example, positions shifted to the row, then zeros (weight
    0); W the prediction slots of a row (pretraining: `packing.predictions_per_row`, the most a
    row of k examples can hold)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

TOKEN_KEYS = ("input_ids", "segment_ids", "input_mask")
MLM_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
PACKED_KEYS = ("position_ids", "sequence_ids", "cls_positions")  # what packing adds to a batch


def pack_examples(examples: Mapping[str, np.ndarray], slots: np.ndarray,
                  predictions: int | None = None) -> dict[str, np.ndarray]:
  """Lays out unpacked examples in packed rows (the module docstring's layout).

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
