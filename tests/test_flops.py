"""Tests of bertjax.training.flops: the real work of padded, packed and multiple-choice batches,
the FLOP formula by hand, the accelerators' peaks."""
import numpy as np

from bertjax.models.config import BertConfig
from bertjax.tools import bench
from bertjax.training import flops

# L=2, H=4, F=8, V=10
CONFIG = BertConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=2, intermediate_size=8)


def test_model_flops_by_hand():
  # 3 sequences of 5 real tokens, 2 real predictions each (T=15, N=3, sum n^2=75, P=6):
  work = flops.Work(tokens=15, sequences=3, squared_lengths=75, predictions=6)
  layers = 6 * 15 * 2 * (4 * 16 + 2 * 4 * 8)  # 6 T L (4H^2 + 2HF) = 23040
  attention = 12 * 2 * 4 * 75  # 12 L H sum n^2 = 7200
  mlm = 6 * 6 * (16 + 40)  # 6 P (H^2 + HV) = 2016
  pooler_nsp = 6 * 3 * (16 + 8)  # 6 N (H^2 + 2H) = 432
  assert layers + attention + mlm + pooler_nsp == 32688
  assert flops.model_flops(CONFIG, work) == 32688
  # Every slot real, the formula it was: 12 B L S^2 H for the attention.
  assert flops.work_of(bench.make_batch(10, batch_size=3, seq_len=5, max_predictions=2)) == work


def test_padding_and_empty_prediction_slots_are_not_work():
  batch = dict(input_mask=np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]),
               masked_lm_weights=np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
  # Row 3 is a padding row: no sequence.
  assert flops.work_of(batch) == flops.Work(tokens=5, sequences=2, squared_lengths=9 + 4,
                                            predictions=3)


def test_packed_rows_count_each_sequences_own_attention():
  # Row 1: sequences of 3 and 2 tokens, then padding; row 2: one of 4, an empty slot.
  batch = dict(input_mask=np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]),
               sequence_ids=np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]]),
               masked_lm_weights=np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
  work = flops.work_of(batch)
  assert work == flops.Work(tokens=9, sequences=3, squared_lengths=9 + 4 + 16, predictions=3)
  # Against the same tokens unpacked into 3 rows: only the padding differs, not the work.
  unpacked = dict(input_mask=np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]),
                  masked_lm_weights=np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]))
  assert flops.work_of(unpacked) == work
  # bench's packed rows: K sequences of seq / K tokens, one attention block each.
  packed = flops.work_of(bench.make_batch(128, batch_size=2, seq_len=16, max_predictions=3,
                                          packing=2))
  assert packed == flops.Work(tokens=32, sequences=4, squared_lengths=4 * 8**2, predictions=6)


def test_multiple_choice_counts_each_choice_as_a_sequence():
  mask = np.zeros((2, 4, 8), np.int32)  # [batch, choices, seq]
  mask[..., :5] = 1
  assert flops.work_of(dict(input_mask=mask)) == flops.Work(
      tokens=40, sequences=8, squared_lengths=8 * 25, predictions=0)


def test_peak_flops_table():
  assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
  assert flops.peak_flops("NVIDIA H200", "float32") == 494e12
  assert flops.peak_flops("TPU v5 lite", "bfloat16") == 197e12
  assert flops.peak_flops("TPU v5p", "bfloat16") == 459e12
  assert flops.peak_flops("cpu", "float32") is None
