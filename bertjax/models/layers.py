"""The building blocks of bertjax's encoders and heads: initialisers, Dense and LayerNorm whose
parameters carry logical axis names, and the logical axes of the activations.

Parameters name their axes ('vocab', 'embed', 'heads', 'mlp'; see `bertjax.models.bert`'s
parameter tree) and activations theirs (`HIDDEN_AXES`, `HEADS_AXES`, `MLP_AXES`, applied with
`constrain`); `bertjax.training.parallel.LOGICAL_RULES` maps both onto a mesh. Off a mesh, the
names change nothing.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import fp8 as fp8_matmuls
from bertjax.models.config import BertConfig


def kernel_init(config: BertConfig, axes: tuple[str | None, ...],
                zero_rows_from: int | None = None, stddev: float | None = None):
  """The truncated-normal init (at two standard deviations) of kernels and embedding tables,
  with logical axes: stddev `initializer_range` unless given; rows from `zero_rows_from` on (the
  padded vocabulary rows, never read) start at 0."""
  init = nn.initializers.truncated_normal(stddev=stddev or config.initializer_range)
  if zero_rows_from is None:
    return nn.with_logical_partitioning(init, axes)

  def zero_padding_rows(key, shape, dtype=jnp.float32):
    return init(key, shape, dtype).at[zero_rows_from:].set(0)
  return nn.with_logical_partitioning(zero_padding_rows, axes)


def make_dense(config: BertConfig, features: int, axes: tuple[str | None, str | None], name: str,
               dtype=None, use_bias: bool | None = None, stddev: float | None = None,
               fp8: bool = False) -> nn.Dense:
  """A Dense [in, out] whose kernel carries `axes` and whose bias carries the output axis; with
  a bias as `config.use_bias` says unless `use_bias` is given (a classifier always has one).
  `fp8`: one of the encoder's projections, an FP8 matmul where config.fp8 says
  (`bertjax.models.fp8`; its scaling state a child module's, the parameters the same)."""
  return nn.Dense(
      features, dtype=dtype or config.compute_dtype, param_dtype=config.storage_dtype,
      use_bias=config.use_bias if use_bias is None else use_bias,
      kernel_init=kernel_init(config, axes, stddev=stddev),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)),
      dot_general_cls=fp8_matmuls.dot_general_cls(config, fp8), name=name)


class DenseParams(nn.Module):
  """The kernel [in, features] and bias [features] that `make_dense` with the same name would
  make (same paths, init, order and axes), not applied: for projections that are fused at call
  time (`SelfAttention` with fused_qkv). The bias is zeros, not a parameter, where the config
  has no biases."""
  config: BertConfig
  features: int
  axes: tuple[str | None, str | None]

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array]:
    kernel = self.param("kernel", kernel_init(self.config, self.axes),
                        (in_features, self.features), self.config.storage_dtype)
    if not self.config.use_bias:
      return kernel, jnp.zeros((self.features,), self.config.storage_dtype)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           (self.axes[1],)),
                      (self.features,), self.config.storage_dtype)
    return kernel, bias


def make_layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over the hidden axis, computed in float32 whatever the compute dtype; with a
  bias as `config.use_bias` says."""
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=config.storage_dtype,
      use_bias=config.use_bias,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name=name)


# Logical axes of the activations: [batch, seq, hidden], [batch, seq, heads, head_dim] and
# [batch, seq, F]. `bertjax.training.parallel.LOGICAL_RULES` maps them onto the mesh.
HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")
HEADS_AXES = ("activation_batch", "activation_length", "activation_heads", None)
MLP_AXES = ("activation_batch", "activation_length", "activation_mlp")


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """`x` with the sharding its logical `axes` map to, where a step is traced under a mesh and
  logical axis rules (`bertjax.training.steps.under_mesh`); `x` itself elsewhere."""
  return nn.with_logical_constraint(x, axes)
