"""The benchmark's batch: random pretraining rows with every token real, as the trainer's batches
are keyed (`bertjax.tools.bench`, `bertjax.tools.ab`, `bertjax.tools.audit`)."""
from __future__ import annotations

import numpy as np


def make_batch(vocab_size: int, batch_size: int, seq_len: int, max_predictions: int,
               seed: int = 0, packing: int = 0) -> dict[str, np.ndarray]:
  """A random pretraining batch with the trainer's keys; every token real, all predictions used.

  Args:
    packing: 0 for one sequence a row; K >= 1 packs K sequences of seq_len // K tokens into each
      row (the last takes the remainder), as `bertjax.data.pretraining.loader` lays packed rows out.
  Returns:
    input_ids, segment_ids, input_mask [batch, seq] int32; masked_lm_positions, masked_lm_ids
    [batch, predictions] int32 and masked_lm_weights float32 (distinct sorted positions, none
    on a [CLS]); next_sentence_label and example_weight (ones) [batch] int32 / float32, or
    [batch, K] when packed, which adds position_ids, sequence_ids [batch, seq] and
    cls_positions [batch, K].
  """
  rng = np.random.default_rng(seed)
  k = max(packing, 1)
  starts = np.arange(k) * (seq_len // k)  # each sequence's [CLS]
  sequence = np.searchsorted(starts, np.arange(seq_len), side="right")  # [seq] 1..K
  position = np.arange(seq_len) - starts[sequence - 1]
  maskable = np.setdiff1d(np.arange(seq_len), starts)
  positions = np.sort(np.stack([rng.choice(maskable, max_predictions, replace=False)
                                for _ in range(batch_size)]), axis=1)
  segment_ids = np.zeros((batch_size, seq_len), np.int32)
  segment_ids[:, (position >= (seq_len // k) // 2)] = 1
  batch = dict(
      input_ids=rng.integers(5, vocab_size, (batch_size, seq_len)).astype(np.int32),
      segment_ids=segment_ids,
      input_mask=np.ones((batch_size, seq_len), np.int32),
      masked_lm_positions=positions.astype(np.int32),
      masked_lm_ids=rng.integers(5, vocab_size, (batch_size, max_predictions)).astype(np.int32),
      masked_lm_weights=np.ones((batch_size, max_predictions), np.float32),
      next_sentence_label=rng.integers(0, 2, (batch_size, k)[:1 + bool(packing)]).astype(
          np.int32),
      example_weight=np.ones((batch_size, k)[:1 + bool(packing)], np.float32))
  if packing:
    tile = lambda row: np.tile(row.astype(np.int32), (batch_size, 1))
    batch.update(position_ids=tile(position), sequence_ids=tile(sequence),
                 cls_positions=tile(starts))
  return batch
