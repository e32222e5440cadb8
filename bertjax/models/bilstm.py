"""A bidirectional LSTM over BERT's hidden states, respecting padding.

Two uses in the paper (Devlin et al., 2019): Table 5's "LTR & No NSP + BiLSTM", a randomly
initialised BiLSTM added on top of the encoder while fine-tuning (`on_top`, switched on by
`config.model.bilstm_on_top` for every fine-tuning head, `bertjax.models.heads`), and section
5.3's feature-based approach, a two-layer BiLSTM tagger on frozen activations
(`bertjax.models.feature_based`).

Built from flax's own parts: `nn.OptimizedLSTMCell` (the LSTM equations of `nn.LSTMCell`, its
four gates in one matmul; the same parameters), `nn.RNN` (a scan over time) and
`nn.Bidirectional` (a forward and a backward RNN, outputs concatenated). Each row's length is
the count of its input_mask (BERT's batches are right-padded): the forward direction ignores
everything after it, and the backward direction starts at the row's last real token (nn.RNN
flips each row within its length), so the outputs at real tokens are those of the unpadded
sequence. Outputs at padding positions are zero.

Parameter tree of `BiLSTM(units=U, num_layers=2)` named 'bilstm' (D = the input width; each
direction has its own cell; no logical axis names, so they are replicated on every device):

  bilstm/layer_0/forward/{ii,if,ig,io}/kernel     [D, U]   input -> gate
  bilstm/layer_0/forward/{hi,hf,hg,ho}/kernel     [U, U]   previous output -> gate
  bilstm/layer_0/forward/{hi,hf,hg,ho}/bias       [U]
  bilstm/layer_0/backward/...                              as forward
  bilstm/layer_1/{forward,backward}/...                    as layer_0, with D = 2U

(i, f, g, o: input, forget, candidate and output gate; flax's initialisers: LeCun normal for
input kernels, orthogonal for recurrent ones, zero biases.)
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.bert import BertOutput
from bertjax.models.config import BertConfig

NAME = "bilstm"  # the top-level parameter group of a BiLSTM on a BERT model


def sequence_lengths(input_mask: jax.Array) -> jax.Array:
  """[..., seq] input_mask (1 real, 0 padding; right-padded) -> [...] int32 real tokens a row."""
  return jnp.sum(input_mask.astype(jnp.int32), axis=-1)


class BiLSTMLayer(nn.Module):
  """One bidirectional LSTM layer: cells 'forward' and 'backward', outputs concatenated.

  Attributes:
    units: hidden units of each direction (U).
    dtype: compute dtype of the matmuls; the cell state stays in param_dtype.
    param_dtype: storage dtype of the parameters.
  """
  units: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
    """[batch, seq, D] and [batch] int lengths -> [batch, seq, 2U] (forward | backward)."""
    def cell(name: str) -> nn.OptimizedLSTMCell:
      return nn.OptimizedLSTMCell(self.units, dtype=self.dtype, param_dtype=self.param_dtype,
                                  name=name)

    return nn.Bidirectional(nn.RNN(cell("forward")), nn.RNN(cell("backward")))(
        x, seq_lengths=lengths)


class BiLSTM(nn.Module):
  """`num_layers` BiLSTMLayers (layer_0, layer_1, ...), each reading the one before.

  Attributes:
    units: hidden units of each direction; the output width is 2 * units.
    num_layers: stacked bidirectional layers.
    dtype, param_dtype: as BiLSTMLayer.
  """
  units: int
  num_layers: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, input_mask: jax.Array) -> jax.Array:
    """Runs the layers over each row's real tokens.

    Args:
      x: [batch, seq, D] inputs (e.g. hidden states).
      input_mask: [batch, seq] 1 for real tokens, 0 for padding (right-padded).
    Returns:
      [batch, seq, 2 * units] in `dtype`: at each real token the forward output (tokens up to
      it) then the backward output (tokens from the row's last real one down to it); 0 at
      padding.
    """
    lengths = sequence_lengths(input_mask)  # [batch]
    real = input_mask.astype(bool)[..., None]  # [batch, seq, 1]
    for i in range(self.num_layers):
      x = BiLSTMLayer(self.units, self.dtype, self.param_dtype, name=f"layer_{i}")(x, lengths)
      x = jnp.where(real, x, 0).astype(self.dtype)  # no value at padding
    return x


def on_top(config: BertConfig, encoder_output: BertOutput, input_mask: jax.Array) -> BertOutput:
  """The paper's "+ BiLSTM": a fresh one-layer BiLSTM ('bilstm') over the encoder's last layer.

  Each direction has hidden_size // 2 units, so the output is as wide as the encoder's and
  every head reads it unchanged. The pooled output (the paper does not say how a classifier
  reads the BiLSTM) is the usual BiLSTM summary of a sequence: the final state of each
  direction, each having read every real token: the forward output at the row's last real
  token, then the backward output at its first ([CLS]). It needs no pooler (an LSTM's outputs
  are tanh-bounded already), and it does not lean on the encoder's [CLS] state, which a
  left-to-right encoder (BertConfig.causal) computes from [CLS] alone. Called inside a model's
  compact __call__, which then owns the 'bilstm' parameters.

  Args:
    config: the encoder's BertConfig (its hidden_size and dtypes).
    encoder_output: BertOutput of an unpacked batch ([batch, seq, hidden] sequence_output).
    input_mask: [batch, seq] 1 real, 0 padding (right-padded; at least one real token a row).
  Returns:
    BertOutput(sequence_output [batch, seq, hidden], pooled_output [batch, hidden]).
  Raises:
    ValueError: an odd hidden_size (two halves make the width).
  """
  if config.hidden_size % 2:
    raise ValueError(f"a BiLSTM on top needs an even hidden_size (hidden_size // 2 units a "
                     f"direction), not {config.hidden_size}.")
  units = config.hidden_size // 2
  sequence = BiLSTM(units, dtype=config.compute_dtype, param_dtype=config.storage_dtype,
                    name=NAME)(encoder_output.sequence_output, input_mask)
  last = jnp.maximum(sequence_lengths(input_mask) - 1, 0)  # [batch] the last real token
  # [batch, seq, 2U] at [batch, 1, 1] -> [batch, 2U] -> its forward half [batch, U]
  forward_final = jnp.take_along_axis(sequence, last[:, None, None], axis=1)[:, 0, :units]
  backward_final = sequence[:, 0, units:]  # [batch, U]
  pooled = jnp.concatenate([forward_final, backward_final], axis=-1)  # [batch, hidden]
  return BertOutput(sequence_output=sequence, pooled_output=pooled)
