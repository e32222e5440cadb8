"""ModernBERT (Warner et al. 2024, arXiv 2412.13663) as Flax linen modules: BERT's encoder
brought forward, on the same attention paths, packing, remat and heads as bertjax's BERT.

What differs from `bertjax.models.bert` (`BertConfig.architecture='modernbert'`): pre-LayerNorm
blocks (the first layer's attention reads the embeddings' norm directly) and a final LayerNorm;
no biases in any Dense or LayerNorm of the encoder (`BertConfig.use_bias`); a GeGLU feed-forward
(GELU(x W_in) * (x W_gate), then W_out); rotary position embeddings (`bertjax.models.rotary`)
instead of a position table, with base rope_theta_global in global layers and rope_theta_local
in local ones; every global_attention_every-th layer attends globally, the others within a
window of local_attention // 2 keys a side; no token types. Its head, Dense-GELU-LayerNorm
(transformers' ModernBertPredictionHead), is shared by every task: the masked LM reads it before
the tied decoder, sequence-level heads after pooling ('cls' or 'mean', `BertConfig.pooling`),
token-level heads on every token.

Parameter tree of `ModernBertEncoder` (under 'bert' in every model of `bertjax.models.heads`;
the Hugging Face converter maps it by table). V = padded_vocab_size, H = hidden_size,
F = intermediate_size; logical axes in parentheses:

  embeddings/
    word_embeddings/embedding          [V, H]     ('vocab', 'embed')
    layer_norm/scale                   [H]        ('embed',)
  encoder/
    layer_{i}/
      attention_layer_norm/scale       [H]        ('embed',)   (not in layer_0)
      attention/{query,key,value}/kernel [H, H]   ('embed', 'heads')
      attention/output/kernel          [H, H]     ('heads', 'embed')
      feed_forward_layer_norm/scale    [H]        ('embed',)
      feed_forward/intermediate        [H, 2, F]  ('embed', None, 'mlp'): [:, 0] the GELU
                                                  input, [:, 1] the gate
      feed_forward/output/kernel       [F, H]     ('mlp', 'embed')
  final_layer_norm/scale               [H]        ('embed',)
  head/dense/kernel                    [H, H]     ('embed', None)
  head/layer_norm/scale                [H]        ('embed',)

The head's parameters exist once a model calls it (every `BertFor*` model does; the bare
encoder, as transformers' ModernBertModel, has none). Initialisation as transformers'
ModernBertPreTrainedModel: truncated normal at two standard deviations, initializer_range for
the input projections and the embeddings, initializer_range / sqrt(2 L) for the kernels that
write into the residual stream (attention and feed-forward outputs, the head's Dense).

Precision: the residual stream is float32; matrix multiplies run in the compute dtype (the
layers' projections in FP8 with `fp8`, `bertjax.models.fp8`); the LayerNorms, the rotations,
the softmax and the pooling are float32.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert, fp8
from bertjax.models.attention import AttentionMask
from bertjax.models.config import BertConfig
from bertjax.models.dropout import Dropout
from bertjax.models.layers import (HIDDEN_AXES, MLP_AXES, constrain, kernel_init, make_dense,
                                   make_layer_norm)
from bertjax.models.rotary import Rotation, rotation


# ModernBERT's own checkpoints (and trainer) hold the attention's query, key and value as one
# tensor, Wqkv [3H, H]; bertjax keeps three kernels. What is computed per tensor (StableAdamW's
# update clipping) takes the three together, as the authors' optimizer saw them.
_FUSED_QKV = ("query", "key", "value")


def stored_tensor(names: list[str]) -> str:
  """The name of the tensor ModernBERT's checkpoints store a parameter in, given the parameter's
  path names ('bert', 'encoder', 'layer_0', 'attention', 'query', 'kernel'): the path itself,
  with query / key / value of one attention joined as 'qkv' (Wqkv)."""
  if len(names) >= 3 and names[-3] == "attention" and names[-2] in _FUSED_QKV:
    names = [*names[:-2], "qkv", names[-1]]
  return "/".join(names)


class Embeddings(nn.Module):
  """Word embeddings, then LayerNorm (no bias); no positions, no token types, no dropout."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(
        cfg.padded_vocab_size, cfg.hidden_size, dtype=jnp.float32,
        param_dtype=cfg.storage_dtype,
        embedding_init=kernel_init(cfg, ("vocab", "embed"), zero_rows_from=cfg.vocab_size))
    self.layer_norm = make_layer_norm(cfg, name=None)

  def gathered_table(self) -> jax.Array:
    """The word table [padded_vocab, hidden], whole on each device but for a `tensor` split of
    its rows (as `bert.Embeddings.gathered_table`: the lookup and the tied decoder read it)."""
    return constrain(self.word_embeddings.embedding, ("activation_vocab", "activation_embed"))

  def __call__(self, input_ids: jax.Array) -> jax.Array:
    """[batch, seq] int ids -> [batch, seq, hidden] float32, normalised."""
    words = jnp.take(self.gathered_table(), input_ids, axis=0).astype(jnp.float32)
    return constrain(self.layer_norm(words), HIDDEN_AXES)


class GatedFeedForward(nn.Module):
  """GeGLU: GELU(x W[:, 0]) * (x W[:, 1]), then Dense(H); the two input projections are one
  kernel [H, 2, F] (one matmul; split by F over a mesh, each device keeps both halves of its
  columns)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, seq, hidden] -> [batch, seq, hidden] (no residual, no norm)."""
    cfg = self.config
    kernel = self.param("intermediate", kernel_init(cfg, ("embed", None, "mlp")),
                        (cfg.hidden_size, 2, cfg.intermediate_size), cfg.storage_dtype)
    # [b, s, H] x [H, 2, F] -> [b, s, 2, F]
    h = fp8.einsum(cfg, "bsh,hjf->bsjf", x, kernel)
    h = constrain(cfg.activation(h[:, :, 0]) * h[:, :, 1], MLP_AXES)  # [b, s, F]
    return make_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output",
                      stddev=cfg.output_init_stddev, fp8=True)(h)


class Layer(nn.Module):
  """One pre-LayerNorm block: x + Attention(LN(x)), then + GeGLU(LN(.)). The first layer's
  attention reads x itself (already the embeddings' norm), as ModernBERT's.

  Attributes:
    window: keys at most this far from the query (a local layer), or None (global).
    first: layer 0 (no attention LayerNorm).
  """
  config: BertConfig
  window: int | None = None
  first: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, rope: Rotation,
               deterministic: bool) -> jax.Array:
    """[batch, seq, hidden] float32, the batch's mask and rotation -> [batch, seq, hidden]
    float32. `deterministic` is positional so remat can hold it static (argument 4)."""
    cfg = self.config
    h = x if self.first else make_layer_norm(cfg, "attention_layer_norm")(x)
    attn = bert.SelfAttention(cfg, name="attention")(
        h.astype(cfg.compute_dtype), mask, deterministic=deterministic, rotation=rope,
        window=self.window)
    # The attention output's dropout: ModernBERT's "attn out" dropout (0.1 in its pretraining).
    x = x + Dropout(cfg.dropout_rate, cfg.dropout_per_hash)(
        attn, deterministic=deterministic).astype(jnp.float32)
    h = make_layer_norm(cfg, "feed_forward_layer_norm")(x).astype(cfg.compute_dtype)
    x = x + GatedFeedForward(cfg, name="feed_forward")(h).astype(jnp.float32)
    return constrain(x, HIDDEN_AXES)


class Encoder(nn.Module):
  """The stack of num_layers `Layer`s, layer_0 .. layer_{L-1}, local or global by
  `BertConfig.window`, rematerialised as `config.remat` says."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, position_ids: jax.Array, *,
               deterministic: bool) -> tuple[jax.Array, ...]:
    """[batch, seq, hidden] float32 and [batch or 1, seq] positions -> every layer's output."""
    cfg = self.config
    block = bert.layer_class(cfg.remat, Layer, 4)
    rotations = {theta: rotation(position_ids, cfg.head_dim, theta)
                 for theta in (cfg.rope_theta_global, cfg.rope_theta_local)}
    outputs = []
    for i in range(cfg.num_layers):
      x = block(cfg, window=cfg.window(i), first=i == 0, name=f"layer_{i}")(
          x, mask, rotations[cfg.rope_theta(i)], deterministic)
      outputs.append(x)
    return tuple(outputs)


class PredictionHead(nn.Module):
  """Dense(H) (no bias) -> GELU -> LayerNorm (no bias): transformers' ModernBertPredictionHead."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., hidden] -> [..., hidden] in the compute dtype."""
    cfg = self.config
    h = make_dense(cfg, cfg.hidden_size, ("embed", None), "dense",
                   stddev=cfg.output_init_stddev)(x.astype(cfg.compute_dtype))
    return make_layer_norm(cfg, "layer_norm")(cfg.activation(h)).astype(cfg.compute_dtype)


def pool(sequence_output: jax.Array, input_mask: jax.Array, pooling: str,
         sequence_ids: jax.Array | None = None,
         cls_positions: jax.Array | None = None) -> jax.Array:
  """Each sequence's summary: its first token ('cls') or the mean of its real tokens ('mean').

  Args:
    sequence_output: [batch, seq, hidden].
    input_mask: [batch, seq] 1 for real tokens.
    pooling: 'cls' or 'mean' (`BertConfig.pooling`).
    sequence_ids: [batch, seq] 1..k numbering packed sequences, 0 at padding; None = unpacked.
    cls_positions: [batch, k] each packed sequence's first position; None = unpacked.
  Returns:
    [batch, hidden] float32, or [batch, k, hidden] packed.
  """
  x = sequence_output.astype(jnp.float32)
  if pooling == "cls":
    if cls_positions is None:
      return x[:, 0]
    # [batch, seq, hidden] at [batch, k] -> [batch, k, hidden]
    return jnp.take_along_axis(x, cls_positions[..., None].astype(jnp.int32), axis=1)
  if sequence_ids is None:
    weights = input_mask.astype(jnp.float32)[:, None, :]  # [batch, 1, seq]
  else:  # [batch, 1, seq] == [1, k, 1] -> [batch, k, seq]: token t belongs to slot j
    slots = jnp.arange(1, cls_positions.shape[-1] + 1, dtype=sequence_ids.dtype)
    weights = (sequence_ids[:, None, :] == slots[None, :, None]).astype(jnp.float32)
  sums = jnp.einsum("bks,bsh->bkh", weights, x)  # [batch, k, hidden]
  means = sums / jnp.maximum(weights.sum(-1, keepdims=True), 1.0)
  return means[:, 0] if sequence_ids is None else means


class ModernBertEncoder(nn.Module):
  """The whole ModernBERT encoder: Embeddings -> Encoder -> final LayerNorm (-> head).

  Called as `bert.BertEncoder` is (the same arguments; segment_ids are ignored: ModernBERT has
  no token types) and returning a `bert.BertOutput`. With `use_pooler`, pooled_output is the
  head on each sequence's pooled summary (`pool`); with `token_head`, sequence_output is the
  head on every token (transformers' token classification and question answering);
  `prediction_head` is the head itself, for the masked LM.
  """
  config: BertConfig
  use_pooler: bool = True
  token_head: bool = False

  def setup(self):
    self.embeddings = Embeddings(self.config)
    self.encoder = Encoder(self.config)
    self.final_layer_norm = make_layer_norm(self.config, name=None)
    self.head = PredictionHead(self.config)

  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array | None = None,
               input_mask: jax.Array | None = None, *, position_ids: jax.Array | None = None,
               sequence_ids: jax.Array | None = None, cls_positions: jax.Array | None = None,
               deterministic: bool, output_hidden_states: bool = False) -> bert.BertOutput:
    """Encodes a batch, unpacked or packed (arguments as `bert.BertEncoder`; position_ids
    place the rotations, restarting at each packed sequence).

    Returns:
      BertOutput: sequence_output [batch, seq, hidden] (final-normed, or the head's with
      token_head), pooled_output ([batch, hidden], [batch, k, hidden] packed, or None),
      hidden_states (the embeddings' output, then each layer's; the last one final-normed, as
      transformers' ModernBertModel gives them).
    """
    del segment_ids  # no token types
    cfg = self.config
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = jnp.arange(input_ids.shape[1])[None, :]  # [1, seq]
    x = self.embeddings(input_ids)  # no embedding dropout: ModernBERT pretrains without it
    outputs = self.encoder(x, AttentionMask(input_mask, sequence_ids, cls_positions),
                           position_ids, deterministic=deterministic)
    sequence_output = self.final_layer_norm(outputs[-1]).astype(cfg.compute_dtype)
    sequence_output = constrain(sequence_output, HIDDEN_AXES)
    hidden_states = (x,) + outputs[:-1] + (sequence_output,)  # the last normed, as transformers
    pooled_output = None
    if self.use_pooler:
      pooled_output = self.head(pool(sequence_output, input_mask, cfg.pooling, sequence_ids,
                                     cls_positions))
    if self.token_head:
      sequence_output = self.head(sequence_output)
    return bert.BertOutput(
        sequence_output=sequence_output, pooled_output=pooled_output,
        hidden_states=hidden_states if output_hidden_states else None)

  def prediction_head(self, x: jax.Array) -> jax.Array:
    """The head (`PredictionHead`, 'head') on [..., hidden]: the masked LM's transform."""
    return self.head(x)

  def word_embedding_table(self) -> jax.Array:
    """The [padded_vocab, hidden] word table, for the tied MLM decoder."""
    return self.embeddings.gathered_table()
