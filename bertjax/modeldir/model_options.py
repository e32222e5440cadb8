"""The run's choices for the encoder, from `config.model`: compute dtype, attention path, remat,
vocabulary padding, dropout, the MLM logits' dtype and fused QKV, resolved the same way for
pretraining and fine-tuning.

`dtype="auto"` (the configs' default) computes in bfloat16 on GPU and TPU and in float32 on CPU,
where bfloat16 matmuls are emulated and slower; parameters, LayerNorm, the softmax and the loss
stay float32 either way (`bertjax.models.bert`). `mlm_logits_dtype="auto"` (the fast configs')
is the compute dtype.
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections

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


def bert_overrides(model: ml_collections.ConfigDict) -> dict[str, Any]:
  """The BertConfig fields a run's `config.model` sets (a pretrained model's bert_config.json
  gives the rest): dtype (resolved), dropout, attention, remat, pad_vocab_to_multiple,
  mlm_logits_dtype ("auto": the compute dtype), fused_qkv, and pooling where set (ModernBERT's
  'cls' or 'mean'; "" keeps the model's). Fields a config lacks (an older config.json) keep
  BertConfig's defaults."""
  fields = ("dropout_rate", "attention_dropout_rate", "attention", "remat",
            "pad_vocab_to_multiple", "fused_qkv")
  overrides = {name: model[name] for name in fields if name in model}
  if model.get("pooling"):  # "" = the pretrained model's (bert_config.json)
    overrides["pooling"] = model.pooling
  overrides["dtype"] = resolve_dtype(model.get("dtype", "float32"))
  if "mlm_logits_dtype" in model:
    logits = model.mlm_logits_dtype
    overrides["mlm_logits_dtype"] = overrides["dtype"] if logits == AUTO else logits
  return overrides


def check_attention(config: BertConfig, seq_lens: list[int]) -> None:
  """Raises UserError where the config's attention path cannot run here at one of `seq_lens`
  (splash off a TPU or at a length not a multiple of 128, cudnn off a GPU), naming the fix."""
  for seq_len in seq_lens:
    try:
      resolve_attention(config, seq_len=seq_len)
    except ValueError as e:
      raise UserError(f"model.attention={config.attention!r}: {e}".replace(
          "attention=auto", "--config.model.attention=auto")) from None
