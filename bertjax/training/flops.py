"""Model FLOPs of a BERT train step and the peak FLOP/s of accelerators: what MFU is made of.

Model FLOPs per step (`model_flops`) count the real work of the step's batch (`Work`, from
`work_of`): real tokens (input_mask's ones; a packed row's tokens of all its sequences), each
real sequence's own length, and real prediction slots (masked_lm_weights > 0). Padding tokens,
padding rows, empty packing slots and empty prediction slots are computed by the step but are
not work. Matmul weights only (biases, LayerNorm, softmax, GELU, embedding lookups and the
optimizer are left out), 2 FLOPs per multiply-add, x3 for forward + backward:
  6 * T * L * (4 H^2 + 2 H F)                q, k, v, output and feed-forward matmuls
  + 12 * L * H * sum_i n_i^2                 attention scores QK^T and probs x V
  + 6 * P * (H^2 + H V)                      MLM transform and vocabulary projection at the
                                             gathered real prediction slots
  + 6 * N * (H^2 + 2 H)                      pooler and NSP classifier on each [CLS]
with T real tokens, N real sequences of n_i real tokens each (T = sum_i n_i), P real prediction
slots, L layers, H hidden, F intermediate, V vocab. The attention term is the one that changes
meaning: 12 * B * L * S^2 * H for B rows of S tokens every one real, but for a padded row only
its n real tokens' n x n scores, and for a packed row (block-diagonal attention) only each
sequence's own n_i x n_i block, not the cross-sequence scores the mask throws away. A causal
(left-to-right) model is counted as a bidirectional one. A fine-tuning head is counted as the
last line (pooler and a 2-way classifier); a head on every token (tagging, spans) adds
6 * T * H * labels more, under 0.1% of BERT-base's step.

ModernBERT (`BertConfig.architecture='modernbert'`) differs in two terms. Its GeGLU feed-forward
has two input projections of width F and one output: 6 * T * L * (4 H^2 + 3 H F). Its L_g global
layers (every global_attention_every-th, the first included) attend as BERT's, and its L - L_g
local ones only the keys within w = local_attention // 2 of each query, in its own sequence:
  12 * H * (L_g * sum_i n_i^2 + (L - L_g) * sum_i pairs(n_i, w)),
  pairs(n, w) = n + 2 * sum_{d=1..min(w, n-1)} (n - d)   (the (q, k) with |q - k| <= w)
so at 8,192 tokens a local layer's attention is 257 / 8,192 of a global one's. The shared head
counts as BERT's MLM transform and pooler.

MFU = model FLOPs / step time / (devices x the device's dense peak for the compute dtype).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

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


@dataclasses.dataclass(frozen=True)
class Work:
  """The real work of a batch, as `model_flops` counts it (module docstring)."""
  tokens: int  # T: real tokens
  sequences: int  # N: real sequences (a packed row's each)
  squared_lengths: int  # sum_i n_i^2 over the real sequences
  predictions: int  # P: real prediction slots (0 without an MLM head)
  # n_i of each real sequence, sorted: for windowed (local) attention; not compared, as the
  # counts above determine BERT's FLOPs.
  lengths: tuple[int, ...] = dataclasses.field(default=(), compare=False)


def work_of(batch: Mapping[str, np.ndarray]) -> Work:
  """The real work of a (numpy) batch.

  Reads input_mask [..., seq] ([batch, seq], or [batch, choices, seq] for multiple choice: each
  choice a sequence), sequence_ids [batch, seq] where packed (1..k, 0 at padding) and
  masked_lm_weights [batch, predictions] where present.
  """
  mask = np.asarray(batch["input_mask"])
  seq = mask.shape[-1]
  mask = mask.reshape(-1, seq) > 0  # [rows, seq]
  if "sequence_ids" in batch:
    ids = np.where(mask, np.asarray(batch["sequence_ids"]).reshape(-1, seq), 0)  # [rows, seq]
    k = int(ids.max(initial=0)) + 1
    # [rows * k]: tokens of sequence j in row r at r * k + j (j = 0: padding, dropped)
    lengths = np.bincount((ids + k * np.arange(len(ids))[:, None]).ravel(),
                          minlength=len(ids) * k).reshape(-1, k)[:, 1:]
  else:
    lengths = mask.sum(axis=-1)  # [rows]
  lengths = lengths[lengths > 0].astype(np.int64)
  weights = batch.get("masked_lm_weights")
  return Work(tokens=int(mask.sum()), sequences=int(lengths.size),
              squared_lengths=int(np.sum(lengths * lengths)),
              predictions=0 if weights is None else int(np.count_nonzero(np.asarray(weights) > 0)),
              lengths=tuple(sorted(int(n) for n in lengths)))


def windowed_pairs(n: int, window: int) -> int:
  """The (query, key) pairs of a sequence of n tokens with |q - k| <= window."""
  m = min(window, n - 1)
  return n + 2 * (m * n - m * (m + 1) // 2)


def model_flops(config: BertConfig, work: Work) -> int:
  """Training FLOPs of one step doing `work`, by the formula in the module docstring (exact
  integer; linear in the counts, so a step over several hosts' batches is the sum)."""
  h, f, l, v = config.hidden_size, config.intermediate_size, config.num_layers, config.vocab_size
  heads = 6 * work.predictions * (h * h + h * v) + 6 * work.sequences * (h * h + 2 * h)
  if not config.is_modernbert:
    return (6 * work.tokens * l * (4 * h * h + 2 * h * f) + 12 * l * h * work.squared_lengths
            + heads)
  global_layers = sum(config.window(i) is None for i in range(l))
  pairs = sum(windowed_pairs(n, config.local_attention // 2) for n in work.lengths)
  return (6 * work.tokens * l * (4 * h * h + 3 * h * f)
          + 12 * h * (global_layers * work.squared_lengths + (l - global_layers) * pairs)
          + heads)
