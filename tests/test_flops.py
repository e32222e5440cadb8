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


def _dot_flops(jaxpr) -> int:
  """2 x the multiply-adds of every dot_general in a jaxpr, its sub-jaxprs (remat, pjit,
  custom_vjp) included."""
  import jax  # pylint: disable=import-outside-toplevel
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      out = eqn.outvars[0].aval.shape
      total += 2 * int(np.prod(out)) * int(np.prod([lhs[d] for d in contract]))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += _dot_flops(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += _dot_flops(sub)
  return total


def test_bert_and_modernbert_steps_compute_what_the_formula_says():
  """The matmul FLOPs of the forward and backward pass, read from the traced program, on a batch
  without padding: BERT's (with NSP) are the formula's exactly, ModernBERT's (GeGLU, no pooler)
  the formula's less its pooled head; ModernBERT's window is computed densely by the reference
  path, so its real work (the formula with the window) is less by the local layers' masked
  pairs."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from bertjax.models import heads  # pylint: disable=import-outside-toplevel
  from bertjax.models.config import bert_config  # pylint: disable=import-outside-toplevel

  batch = bench.make_batch(50, batch_size=2, seq_len=24, max_predictions=4)
  work = flops.work_of(batch)
  bert = bert_config("tiny", vocab_size=50, num_layers=2, pad_vocab_to_multiple=1)
  modern = bert_config("tiny", architecture="modernbert", vocab_size=50, num_layers=4,
                       hidden_size=32, num_heads=2, intermediate_size=48, local_attention=8,
                       pad_vocab_to_multiple=1)
  for config, nsp in ((bert, True), (modern, False)):
    model = heads.BertForPreTraining(config, next_sentence=nsp)
    params = heads.init_from_batch(model, jax.random.key(0), batch)

    def loss(params, model=model):
      mlm, nsp_logits = heads.apply_to_batch(model, params, batch, deterministic=True)
      return mlm.sum() + (0 if nsp_logits is None else nsp_logits.sum())

    traced = _dot_flops(jax.make_jaxpr(jax.value_and_grad(loss))(params).jaxpr)
    h = config.hidden_size
    pooled_head = 0 if nsp else 6 * work.sequences * (h * h + 2 * h)
    dense = dataclasses.replace(config, local_attention=2 * 24)  # every layer sees all
    assert traced == flops.model_flops(dense, work) - pooled_head, config.architecture
  assert flops.model_flops(modern, work) < flops.model_flops(
      dataclasses.replace(modern, local_attention=48), work)


def test_windowed_pairs_count_the_band():
  for n in (1, 2, 5, 9, 30):
    for window in (1, 2, 4, 64):
      q = np.arange(n)
      assert flops.windowed_pairs(n, window) == int(
          (np.abs(q[:, None] - q[None, :]) <= window).sum()), (n, window)
  # ModernBERT-base at 8,192 tokens: 2 x 64 + 1 keys a local query
  assert flops.windowed_pairs(8192, 64) == 8192 * 129 - 64 * 65
