"""FP8 matmuls of the encoder (`BertConfig.fp8`): flax's fp8 dot_general with delayed scaling,
which of the model's matmuls take it, and where its scaling state lives.

The op is flax's (`flax.linen.fp8_ops`, what maxtext's quantization=fp8 runs): each matmul
quantizes its input and kernel to float8_e4m3fn and its output's gradient to float8_e5m2, each
divided by a scale made from the largest magnitude (amax) of that tensor over the last
AMAX_HISTORY_LENGTH steps, this one's excluded (delayed scaling, as Transformer Engine's
DelayedScaling recipe: history 1024, the history's max, no margin): scale = amax / the format's
largest value (448 for e4m3, 57,344 for e5m2); 1 while the history is empty (the first step).
Flax's op is chosen over Transformer Engine's JAX layers because it runs here, emulated on the
CPU, with no CUDA wheels, and is nn.Dense's own `dot_general_cls`, needing no other module
around it; a GPU A/B (`bertjax.tools.ab`'s fp8 variant) must confirm that XLA gives it the GPU's
FP8 GEMMs at a speed worth having.

Which matmuls (as NVIDIA's recipes keep the first and last layers in higher precision): the
attention's query, key, value and output projections and the feed-forward's (BERT's two Dense,
ModernBERT's GeGLU input and its output) of every layer. The embeddings, the pooler, the MLM
head (transform and tied decoder), the classifiers and the attention's own score and context
einsums stay in the compute dtype.

The scaling state: each fp8 matmul holds its amax histories [1024] and scales [1] (input, kernel,
output gradient; float32) in the variable collection COLLECTION, not in "params": the parameter
tree is the same with or without fp8, so a model trained with fp8 exports as ordinary weights.
Flax gives a step the state's next value as its "gradient" (`jax.grad` with respect to the
collection); the trainer keeps it beside the parameters, in the train state's "fp8" entry
(`bertjax.training.steps`), where no optimizer sees it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

from bertjax.models.config import BertConfig

COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT  # flax's name: "_overwrite_with_gradient"
# Steps of amax history each scale is taken from: flax's default, Transformer Engine's too.
AMAX_HISTORY_LENGTH = fp8_ops.Fp8DotGeneralBase.amax_history_length


def dot_general_cls(config: BertConfig, fp8: bool) -> type[nn.Module] | None:
  """What an encoder Dense computes its matmul with (nn.Dense's `dot_general_cls`): flax's
  fp8 op where `fp8` (one of the encoder's projections) and config.fp8, else None (jax's
  dot_general in the compute dtype)."""
  return fp8_ops.Fp8DirectDotGeneralOp if fp8 and config.fp8 else None


def einsum(config: BertConfig, equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`jnp.einsum(equation, x, kernel)` in the compute dtype, in fp8 (flax's Fp8Einsum, its
  state in COLLECTION) with config.fp8: the encoder's projections that are einsums over a
  stacked kernel (fused QKV [H, 3, H], ModernBERT's GeGLU input [H, 2, F]). Call it inside a
  compact method: the fp8 op is that module's child."""
  x, kernel = x.astype(config.compute_dtype), kernel.astype(config.compute_dtype)
  if not config.fp8:
    return jnp.einsum(equation, x, kernel)
  return fp8_ops.Fp8Einsum()(equation, x, kernel)


def variables(params: Any, fp8_state: Any = None) -> dict[str, Any]:
  """The variables `Module.apply` takes: {"params": params}, with the fp8 scaling state (a
  tree of COLLECTION, as the train state's "fp8" holds it) where there is one."""
  return {"params": params, COLLECTION: fp8_state} if fp8_state else {"params": params}


def without_fp8(model: nn.Module) -> nn.Module:
  """`model` (a BertFor* module) computing in its compute dtype alone, where it was built with
  config.fp8: the same parameters, no scaling state. What evaluation runs (as an exported
  model does: the fp8 state is training's)."""
  config = getattr(model, "config", None)
  if config is None or not config.fp8:
    return model
  return model.clone(config=dataclasses.replace(config, fp8=False))
