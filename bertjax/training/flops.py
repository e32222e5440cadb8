"""Model FLOPs of a BERT train step and the peak FLOP/s of accelerators: what MFU is made of.

Model FLOPs per step (`model_flops`), counting matmul weights only (biases, LayerNorm, softmax,
GELU, embedding lookups and the optimizer are left out), 2 FLOPs per multiply-add, x3 for
forward + backward:
  6 * tokens * L * (4 H^2 + 2 H F)           q, k, v, output and feed-forward matmuls
  + 12 * B * L * S^2 * H                     attention scores QK^T and probs x V
  + 6 * B * P * (H^2 + H V)                  MLM transform and vocabulary projection at the
                                             P = max_predictions gathered positions
  + 6 * B * (H^2 + 2 H)                      pooler and NSP classifier on [CLS]
with B = sequences per step, S = seq_len, tokens = B * S, L layers, H hidden, F intermediate,
V vocab. A fine-tuning head is counted as the last line (pooler and a 2-way classifier); a head
on every token (tagging, spans) adds 6 * tokens * H * labels more, under 0.1% of BERT-base's step.

MFU = model FLOPs / step time / (devices x the device's dense peak for the compute dtype).
"""
from __future__ import annotations

from bertjax.models.config import BertConfig

# Dense peak FLOP/s per device by (device-kind substring, compute dtype); the first match wins,
# so a longer name comes before its prefix ("TPU v5 lite" before "TPU v5"). float32 on GPUs is
# the TF32 tensor-core peak (JAX's default matmul precision there); on TPUs JAX's default
# precision runs float32 matmuls in bfloat16 passes, so the bfloat16 peak stands for both.
PEAK_FLOPS: tuple[tuple[str, str, float], ...] = (
    ("H100 PCIe", "bfloat16", 756e12), ("H100 PCIe", "float32", 378e12),
    ("H100", "bfloat16", 989e12), ("H100", "float32", 494e12),
    ("H200", "bfloat16", 989e12), ("H200", "float32", 494e12),
    ("B200", "bfloat16", 2250e12), ("B200", "float32", 1100e12),
    ("A100", "bfloat16", 312e12), ("A100", "float32", 156e12),
    ("TPU v4", "bfloat16", 275e12), ("TPU v4", "float32", 275e12),
    ("TPU v5 lite", "bfloat16", 197e12), ("TPU v5 lite", "float32", 197e12),
    ("TPU v5e", "bfloat16", 197e12), ("TPU v5e", "float32", 197e12),
    ("TPU v5p", "bfloat16", 459e12), ("TPU v5p", "float32", 459e12),
    ("TPU v5", "bfloat16", 459e12), ("TPU v5", "float32", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12), ("TPU v6 lite", "float32", 918e12),
    ("TPU v6e", "bfloat16", 918e12), ("TPU v6e", "float32", 918e12),
)


def peak_flops(device_kind: str, dtype: str) -> float | None:
  """The device's dense peak FLOP/s for `dtype` (jax's `device.device_kind`, e.g. "NVIDIA H100
  80GB HBM3" or "TPU v5 lite"), or None where unknown (CPUs, other chips)."""
  for name, kind, peak in PEAK_FLOPS:
    if name.lower() in device_kind.lower() and kind == dtype:
      return peak
  return None


def model_flops(config: BertConfig, batch_size: int, seq_len: int,
                max_predictions: int) -> int:
  """Training FLOPs of one step by the formula in the module docstring (exact integer).

  Args:
    config: the encoder's sizes.
    batch_size: sequences in the step (all devices, all micro-batches; for multiple choice,
      questions x choices).
    seq_len: tokens per sequence, padding included.
    max_predictions: masked positions scored per sequence (0 for fine-tuning).
  """
  b, s, p = batch_size, seq_len, max_predictions
  h, f, l, v = config.hidden_size, config.intermediate_size, config.num_layers, config.vocab_size
  return (6 * b * s * l * (4 * h * h + 2 * h * f) + 12 * b * l * s * s * h
          + 6 * b * p * (h * h + h * v) + 6 * b * (h * h + 2 * h))
