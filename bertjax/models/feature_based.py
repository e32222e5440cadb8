"""The feature-based approach (the paper, section 5.3, Table 7): a BiLSTM tagger on frozen BERT.

"we apply the feature-based approach by extracting the activations from one or more layers
without fine-tuning any parameters of BERT. These contextual embeddings are used as input to a
randomly initialized two-layer 768-dimensional BiLSTM before the classification layer."

`BertForFeatureBasedTagging` is that model for token tagging (NER): the encoder ('bert') runs
without dropout (it is a feature extractor) and under jax.lax.stop_gradient, so the backward pass
stops at its activations; the chosen layers are combined, read by a two-layer BiLSTM ('bilstm',
`bertjax.models.bilstm`, `bilstm_units` a direction) and tagged by dropout + Dense
('token_tagging', as `heads.TokenTagging`). stop_gradient keeps gradients off the encoder; the
optimizer must also leave it alone (no weight decay, no Adam step): `train.frozen_params="bert"`
(`bertjax.training.optim`), which configs/ner.py:feature_based sets.

LAYER_COMBINATIONS, the rows of Table 7 (CoNLL-2003 dev F1 of BERT-base; fine-tuning: 96.4),
as indices into the encoder's hidden states (0 the embedding output, i the output of layer i):

  embeddings               91.0   the embedding output (word + position + segment, LayerNorm)
  second_to_last           95.6   layer L - 1
  last                     94.9   layer L
  weighted_sum_last_four   95.9   ScalarMix of layers L - 3 .. L
  concat_last_four         96.1   layers L - 3 .. L concatenated: 4 H wide
  weighted_sum_all         95.5   ScalarMix of layers 1 .. L (the paper's "all 12 layers" of
                                  BERT-base: the embedding output is not counted as a layer)

The paper does not say how its weighted sums are weighted; `ScalarMix` is ELMo's (Peters et al.
2018, eq. 1): gamma * sum_j softmax(w)_j h_j with learned scalars w (one a layer, starting at 0:
equal weights) and gamma (starting at 1). ELMo's optional LayerNorm of each layer before mixing
is not applied: BERT's layer outputs are layer-normalised already.

Parameter tree (H hidden, U bilstm_units, N labels, n mixed layers):
  bert/...                               the BertEncoder, no pooler (as pretraining saved it)
  scalar_mix/weights [n], scalar_mix/scale []           weighted sums only
  bilstm/layer_0/..., bilstm/layer_1/...                input width H (4 H concatenated), 2 U
  token_tagging/classifier/kernel [2U, N], /bias [N]
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bilstm, heads
from bertjax.models.config import BertConfig

LAYER_COMBINATIONS = ("embeddings", "second_to_last", "last", "weighted_sum_last_four",
                      "concat_last_four", "weighted_sum_all")
WEIGHTED_SUMS = ("weighted_sum_last_four", "weighted_sum_all")
BILSTM_LAYERS = 2  # the paper's "two-layer" BiLSTM


def layer_indices(combination: str, num_layers: int) -> tuple[int, ...]:
  """The hidden states a combination reads: indices into BertOutput.hidden_states (0 = the
  embedding output, i = layer i's output, num_layers = the last layer's).

  Raises:
    ValueError: an unknown combination, or one that needs more layers than the model has.
  """
  needs = {"second_to_last": 2, "weighted_sum_last_four": 4, "concat_last_four": 4}
  if combination not in LAYER_COMBINATIONS:
    raise ValueError(f"unknown layer combination {combination!r}; use one of "
                     f"{', '.join(LAYER_COMBINATIONS)}.")
  if num_layers < needs.get(combination, 1):
    raise ValueError(f"{combination} needs a model of at least {needs[combination]} layers; "
                     f"this one has {num_layers}.")
  last = num_layers
  return {"embeddings": (0,), "second_to_last": (last - 1,), "last": (last,),
          "weighted_sum_last_four": tuple(range(last - 3, last + 1)),
          "concat_last_four": tuple(range(last - 3, last + 1)),
          "weighted_sum_all": tuple(range(1, last + 1))}[combination]


def feature_width(combination: str, hidden_size: int) -> int:
  """The width of a combination's features: 4 H concatenated, else H."""
  return 4 * hidden_size if combination == "concat_last_four" else hidden_size


class ScalarMix(nn.Module):
  """ELMo's scalar mix: gamma * sum_j softmax(w)_j layer_j, with learned w and gamma."""

  @nn.compact
  def __call__(self, layers: Sequence[jax.Array]) -> jax.Array:
    """n arrays [batch, seq, H] -> their weighted sum [batch, seq, H] in float32."""
    weights = self.param("weights", nn.initializers.zeros_init(), (len(layers),), jnp.float32)
    scale = self.param("scale", nn.initializers.ones_init(), (), jnp.float32)
    stacked = jnp.stack(layers).astype(jnp.float32)  # n x [batch, seq, H] -> [n, batch, seq, H]
    # [n] x [n, batch, seq, H] -> [batch, seq, H]
    return scale * jnp.einsum("n,nbsh->bsh", jax.nn.softmax(weights), stacked)


def combine(combination: str, layers: Sequence[jax.Array]) -> jax.Array:
  """The chosen layers (as `layer_indices` lists them) -> the BiLSTM's input [batch, seq, D]:
  the one layer, the four concatenated (D = 4 H), or a ScalarMix ('scalar_mix'; call inside a
  compact __call__)."""
  if combination == "concat_last_four":
    return jnp.concatenate(layers, axis=-1)  # 4 x [batch, seq, H] -> [batch, seq, 4H]
  if combination in WEIGHTED_SUMS:
    return ScalarMix(name="scalar_mix")(layers)
  (layer,) = layers
  return layer


class BertForFeatureBasedTagging(nn.Module):
  """Frozen BertEncoder ('bert') -> layer combination -> two-layer BiLSTM ('bilstm') ->
  TokenTagging ('token_tagging'): the feature-based NER of Table 7 (module docstring).

  Attributes:
    config: the encoder's BertConfig (its dropout_rate is the tagging head's; the encoder
      itself runs without dropout).
    num_labels: tags (N).
    feature_layers: one of LAYER_COMBINATIONS.
    bilstm_units: hidden units of each BiLSTM direction (the paper: 768 for BERT-base).
  """
  batch_keys = heads.INPUT_KEYS
  config: BertConfig
  num_labels: int
  feature_layers: str = "concat_last_four"
  bilstm_units: int = 768

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
               deterministic: bool) -> jax.Array:
    """[batch, seq] int32 inputs -> float32 logits [batch, seq, num_labels]."""
    cfg = self.config
    indices = layer_indices(self.feature_layers, cfg.num_layers)
    out = heads.make_encoder(cfg, use_pooler=False)(
        input_ids, segment_ids, input_mask, deterministic=True, output_hidden_states=True)
    # No gradient flows into the encoder: its backward pass is never computed.
    layers = [jax.lax.stop_gradient(out.hidden_states[i]) for i in indices]
    features = combine(self.feature_layers, layers).astype(cfg.compute_dtype)
    tagged = bilstm.BiLSTM(self.bilstm_units, BILSTM_LAYERS, dtype=cfg.compute_dtype,
                           param_dtype=cfg.storage_dtype, name=bilstm.NAME)(features, input_mask)
    return heads.TokenTagging(cfg, self.num_labels, name="token_tagging")(
        tagged, deterministic=deterministic)
