"""The config a benchmark row's step (and its real rows) is read from: a recipe's config file with
the row's shapes (`bertjax.tools.bench`, `bertjax.tools.ab`, `bertjax.tools.init_compile`).

Recipes (`--recipe`):

- fast (the benchmark's default): what users train. BERT: configs/base.py:fast (configs/large.py:
  fast is it at size large): no attention-probability dropout, so the backend's fused attention;
  packed rows (up to data.max_sequences_per_row = 3 pairs a row); MLM logits in the compute dtype.
  ModernBERT: configs/modernbert.py:SIZE (base or large; its CPU demo at tiny): the masked LM
  alone on contiguous spans, StableAdamW, no gradient clipping.
- paper: BERT as the paper trained it, configs/base.py: attention dropout 0.1 (so the reference
  einsum), one pair a row, float32 MLM logits; the model the transformers peers run. ModernBERT
  has one recipe, the same as fast.

Every recipe keeps its model, objective, masking and optimizer fields; the row sets the size, the
compute dtype, the shapes (batch, seq, predictions), one phase (no long phase, restart or
context extension) and the schedule (BERT's linear decay from 1e-4, no warmup), which change no
step's cost. `--attention`: `auto` keeps the recipe's; `reference` adds the paper's attention
dropout 0.1 (BERT); a fused path (xla, cudnn, splash) runs without it, as fused kernels must.
"""
from __future__ import annotations

from typing import Any

import ml_collections

from bertjax.configs import base, modernbert

RECIPES = ("fast", "paper")


def recipe_config(recipe: str, architecture: str, size: str) -> ml_collections.ConfigDict:
  """The recipe's config file at model size `size` (module docstring); untouched otherwise."""
  if architecture == "modernbert":
    config = modernbert.get_config(size if size in modernbert.SIZES else None)
  else:
    config = base.get_config("fast" if recipe == "fast" else None)
  config.model.size = size
  return config


def row_config(recipe: str, architecture: str, size: str, *, dtype: str, batch_size: int,
               seq_len: int, max_predictions: int, steps: int, attention: str = "auto",
               remat: str = "none", optimizer: str = "", prng: str = "threefry",
               packing: int | None = None,
               overrides: tuple[tuple[str, Any], ...] = ()) -> ml_collections.ConfigDict:
  """The recipe's config with a row's shapes and bertjax's own choices (module docstring).

  Args:
    dtype: the compute dtype (model.dtype: auto, float32 or bfloat16).
    batch_size, seq_len, max_predictions: the rows, their tokens, and the masked positions of a
      sequence at most (data.max_predictions_per_seq; a packed row of real rows has
      `packing.predictions_per_row` of them).
    steps: train.num_train_steps (the steps the benchmark runs, at least).
    attention, remat, prng: model.attention, model.remat, train.prng_impl.
    optimizer: train.optimizer; "" keeps the recipe's.
    packing: for real rows: None keeps the recipe's data.packing; 0 is one pair a row; K >= 1
      packs up to K pairs a row (data.max_sequences_per_row).
    overrides: ("section.field", value) pairs set last (an A/B's variant).
  """
  config = recipe_config(recipe, architecture, size)
  m, data, tr = config.model, config.data, config.train
  m.dtype = dtype
  m.attention = attention
  if attention == "reference" and architecture == "bert":
    m.attention_dropout_rate = 0.1  # the paper's
  elif attention != "auto":
    m.attention_dropout_rate = 0.0  # fused kernels take none
  m.remat = remat
  m.max_position_embeddings = max(m.max_position_embeddings, 512, seq_len)
  m.long_rope_theta_global = 0.0
  data.max_seq_length = seq_len
  data.max_predictions_per_seq = max_predictions
  data.long_seq_length = 0
  if packing is not None:
    data.packing = bool(packing)
    data.max_sequences_per_row = packing or data.max_sequences_per_row
  tr.optimizer = optimizer or tr.optimizer
  tr.prng_impl = prng
  tr.batch_size = tr.eval_batch_size = batch_size
  tr.num_train_steps = steps
  tr.warmup_steps = 0
  tr.learning_rate = 1e-4
  tr.lr_schedule, tr.decay_steps = "linear", 0  # BERT's, from the peak (no wsd plateau or decay)
  tr.long_seq_from_step = tr.long_batch_size = tr.restart_from_step = 0
  tr.long_learning_rate = tr.restart_learning_rate = 0.0
  tr.long_weight_decay = tr.restart_weight_decay = -1.0
  for key, value in overrides:
    section, field = key.split(".")
    config[section][field] = value
  return config
