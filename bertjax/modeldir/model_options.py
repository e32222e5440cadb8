"""The run's choices for the encoder, from `config.model` (compute dtype, attention path, remat,
vocabulary padding, dropout, the MLM logits' dtype, fused QKV, the local layers' kernel, fp8,
resolved the same way for pretraining and fine-tuning), and whether a model fits the run
(`check_fits`).

`dtype="auto"` (the configs' default) computes in bfloat16 on GPU and TPU and in float32 on CPU,
where bfloat16 matmuls are emulated and slower; parameters, LayerNorm, the softmax and the loss
stay float32 either way (`bertjax.models.bert`). `mlm_logits_dtype="auto"` (the fast configs')
is the compute dtype.
"""
from __future__ import annotations

from typing import Any

import jax

from bertjax.errors import UserError
from bertjax.models.attention import resolve_attention
from bertjax.models.config import BertConfig

AUTO = "auto"


def resolve_dtype(dtype: str, platform: str | None = None) -> str:
  """The compute dtype a config's `model.dtype` means on `platform` (default: jax's backend).

  Args:
    dtype: "auto", "float32" or "bfloat16".
    platform: "cpu", "gpu" or "tpu"; None = `jax.default_backend()`.
  Returns:
    "float32" or "bfloat16" ("auto": bfloat16 on accelerators, float32 on CPU).
  """
  if dtype != AUTO:
    return dtype
  platform = platform or jax.default_backend()
  return "float32" if platform == "cpu" else "bfloat16"


def bert_overrides(model: Any) -> dict[str, Any]:
  """The BertConfig fields a run's `config.model` (`bertjax.run_config.PretrainingModel` or
  `FinetuningModel`) sets over a model's: dtype (resolved), dropout, attention, remat, and
  pooling where set (ModernBERT's 'cls' or 'mean'; "" keeps the model's). A pretraining model's
  pad_vocab_to_multiple, fused_qkv and mlm_logits_dtype ("auto": the compute dtype) are
  `pretraining_overrides`'; fine-tuning keeps the pretrained model's."""
  overrides = dict(dropout_rate=model.dropout_rate,
                   attention_dropout_rate=model.attention_dropout_rate,
                   attention=model.attention, remat=model.remat,
                   dtype=resolve_dtype(model.dtype))
  if model.pooling:  # "" = the pretrained model's (bert_config.json)
    overrides["pooling"] = model.pooling
  return overrides


def pretraining_overrides(model: Any) -> dict[str, Any]:
  """`bert_overrides` and the fields only a pretraining run sets: pad_vocab_to_multiple,
  fused_qkv, dropout_per_hash, local_kernel, fp8 and mlm_logits_dtype."""
  overrides = bert_overrides(model)
  logits = model.mlm_logits_dtype
  return dict(overrides, pad_vocab_to_multiple=model.pad_vocab_to_multiple,
              fused_qkv=model.fused_qkv, dropout_per_hash=model.dropout_per_hash,
              local_kernel=model.local_kernel, fp8=model.fp8,
              mlm_logits_dtype=overrides["dtype"] if logits == AUTO else logits)


def check_attention(config: BertConfig, seq_lens: list[int]) -> None:
  """Raises UserError where the config's attention path cannot run here at one of `seq_lens`
  (splash off a TPU or at a length not a multiple of 128, cudnn off a GPU), naming the fix."""
  for seq_len in seq_lens:
    try:
      resolve_attention(config, seq_len=seq_len)
    except ValueError as e:
      raise UserError(f"model.attention={config.attention!r}: {e}".replace(
          "attention=auto", "--config.model.attention=auto")) from None


def check_fits(bert_config: BertConfig, vocab_size: int, seq_lens: list[int], where: str,
               length_field: str = "data.max_seq_length") -> None:
  """Raises UserError where the model of `where` (a model directory) does not fit the run: its
  attention path cannot run at one of `seq_lens`, the longest is beyond its positions
  (`length_field` names the config field to lower), or its tokenizer (`vocab_size` ids) has ids
  the model has no rows for."""
  check_attention(bert_config, seq_lens)
  longest = max(seq_lens)
  if longest > bert_config.max_position_embeddings:
    raise UserError(f"{length_field}={longest} exceeds the model's "
                    f"{bert_config.max_position_embeddings} positions; lower it.")
  check_vocabulary(bert_config, vocab_size, where)


# How many more word-embedding rows than tokenizer ids a model may have: padding of its table to
# a multiple (ModernBERT's 50,368 rows for its tokenizer's 50,285 ids). More is a model trained
# with another, larger vocabulary, whose rows the ids would read at random.
MAX_SPARE_ROWS = 128


def check_vocabulary(bert_config: BertConfig, vocab_size: int, where: str) -> None:
  """Raises UserError where the tokenizer of `where` (`vocab_size` ids) and the model's
  bert_config.vocab_size rows do not belong together: ids the model has no row for, or more
  than MAX_SPARE_ROWS rows no id reads."""
  rows = bert_config.vocab_size
  if vocab_size > rows:
    raise UserError(f"the tokenizer in {where} has {vocab_size} ids but the model {rows} rows; "
                    "they do not belong together: give the tokenizer the model was trained "
                    "with.")
  if rows - vocab_size > MAX_SPARE_ROWS:
    raise UserError(f"the tokenizer in {where} has {vocab_size} ids but the model {rows} rows "
                    f"(more than {MAX_SPARE_ROWS} of padding): the model was trained with "
                    "another vocabulary; give the tokenizer it was trained with.")
