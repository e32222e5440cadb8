"""The BERT encoder (Devlin et al. 2019) as Flax linen modules, and its parameter tree.

One module per idea of the paper: `Embeddings`, `SelfAttention`, `FeedForward`, `Layer`
(post-LayerNorm transformer block), `Encoder` (the stack), `Pooler` and `BertEncoder` (all of
it). Their hyperparameters and the size table are `bertjax.models.config`; the attention itself
(masks, the choice of kernel and the call to it) is `bertjax.models.attention`; the pretraining
and fine-tuning heads live in `bertjax.models.heads`.

Parameter tree of `BertEncoder` (names are stable: the Hugging Face and Google checkpoint
converters map them by table, so a rename is a breaking change). Shapes use
V = padded_vocab_size (vocab_size rounded up to pad_vocab_to_multiple; the converters pad with
zero rows on import and strip them on export), P = max_position_embeddings, T = type_vocab_size,
H = hidden_size, F = intermediate_size; the logical axis names each parameter carries are given
in parentheses.

  embeddings/
    word_embeddings/embedding          [V, H]  ('vocab', 'embed'); rows >= vocab_size start 0
    position_embeddings/embedding      [P, H]  (None, 'embed')
    token_type_embeddings/embedding    [T, H]  (None, 'embed')
    layer_norm/{scale,bias}            [H]     ('embed',)
  encoder/
    layer_{i}/                         i = 0 .. num_layers - 1
      attention/
        {query,key,value}/kernel       [H, H]  ('embed', 'heads')
        {query,key,value}/bias         [H]     ('heads',)
        output/kernel                  [H, H]  ('heads', 'embed')
        output/bias                    [H]     ('embed',)
      attention_layer_norm/{scale,bias} [H]    ('embed',)
      feed_forward/
        intermediate/kernel            [H, F]  ('embed', 'mlp')
        intermediate/bias              [F]     ('mlp',)
        output/kernel                  [F, H]  ('mlp', 'embed')
        output/bias                    [H]     ('embed',)
      output_layer_norm/{scale,bias}   [H]     ('embed',)
  pooler/
    dense/kernel                       [H, H]  ('embed', None)
    dense/bias                         [H]     (None,)

Kernels are stored [in, out] (the transpose of a torch `nn.Linear.weight`). The q/k/v/output
projections are plain [H, H] matrices; the `heads` axis of a q/k/v kernel is the flattened
(num_heads, head_dim) output, split by a reshape at call time, so sharding it over a mesh axis
that divides num_heads keeps whole heads on a device.

Logical axis names: 'vocab' (vocabulary rows), 'embed' (the hidden width H), 'heads' (the
flattened attention heads x head_dim), 'mlp' (the feed-forward width F); None is never sharded
(position / token-type rows, the pooler's output, which would otherwise name 'embed' twice).
`bertjax.training.parallel.LOGICAL_RULES` maps these names to mesh axes. To build sharded
parameters: `jax.eval_shape(model.init, ...)` -> `nn.get_partition_spec` for the specs -> init
under jit with those shardings -> `nn.unbox` to get plain arrays, which `model.apply` takes.

Initialisation follows the original BERT: every kernel and embedding table is drawn from a
normal with stddev `initializer_range` (0.02) truncated at two standard deviations (Google's
`tf.truncated_normal_initializer`; Hugging Face draws an untruncated normal, which matters only
for training from scratch), biases are zeros, LayerNorm scales ones.

Precision: parameters are stored in `param_dtype` (float32); matrix multiplies run in `dtype`
(float32 or bfloat16), the layers' projections in FP8 with `fp8` (`bertjax.models.fp8`);
LayerNorm, the softmax and the attention scores are always float32.

Attention paths (`BertConfig.attention`, `attention.resolve_attention`): 'reference' (the
paper's einsum, with dropout on the attention probabilities), 'xla', 'cudnn' and 'splash'; they
agree at every real token and share these parameters (`bertjax.models.attention` describes
them). A causal model (`BertConfig.causal`, the paper's left-to-right ablation) hides later keys
on every path and pools each sequence's last real token (`last_token_positions`).

Packed batches (Krell et al. 2021): several sequences share a row; `BertEncoder` takes their
position_ids (restarting at each [CLS]), sequence_ids (attention is block-diagonal by them, on
every path) and cls_positions (the pooler reads each sequence's [CLS]). Each sequence's outputs
equal those it has alone in an unpacked row.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import fp8
from bertjax.models.attention import AttentionMask, attend
from bertjax.models.config import BertConfig
from bertjax.models.dropout import Dropout
from bertjax.models.rotary import Rotation, rotate
from bertjax.models.layers import (HEADS_AXES, HIDDEN_AXES, MLP_AXES, DenseParams, constrain,
                                   kernel_init, make_dense, make_layer_norm)


class BertOutput(NamedTuple):
  """What `BertEncoder` returns.

  Attributes:
    sequence_output: [batch, seq, hidden] the last layer's hidden states, in the compute dtype.
    pooled_output: tanh(Dense(...)) of each [CLS]: [batch, hidden] (the first token of each
      row), or [batch, k, hidden] for a packed batch (the token at each of cls_positions);
      of each sequence's last real token in a causal model; None for an encoder built with
      use_pooler=False.
    hidden_states: when asked for, num_layers + 1 arrays [batch, seq, hidden]: the embedding
      output, then each layer's output (the last equals sequence_output); otherwise None.
  """
  sequence_output: jax.Array
  pooled_output: jax.Array | None
  hidden_states: tuple[jax.Array, ...] | None = None


class Embeddings(nn.Module):
  """Word + learned position + token-type embeddings, then LayerNorm and dropout.

  Written with `setup` so that the MLM head can reach the word-embedding table it is tied to
  (`BertEncoder.word_embedding_table`); submodule names are the attribute names. The word table
  has padded_vocab_size rows; ids are < vocab_size, so the padded rows are never looked up.
  """
  config: BertConfig

  def setup(self):
    cfg = self.config

    def embed(rows: int, axes: tuple[str | None, str], zero_rows_from=None) -> nn.Embed:
      return nn.Embed(rows, cfg.hidden_size, dtype=jnp.float32, param_dtype=cfg.storage_dtype,
                      embedding_init=kernel_init(cfg, axes, zero_rows_from))

    self.word_embeddings = embed(cfg.padded_vocab_size, ("vocab", "embed"),
                                 zero_rows_from=cfg.vocab_size)
    self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"))
    self.layer_norm = make_layer_norm(cfg, name=None)
    self.dropout = Dropout(cfg.dropout_rate, cfg.dropout_per_hash)

  def gathered_table(self) -> jax.Array:
    """The word table [padded_vocab, hidden], constrained whole on each device but for a
    `tensor` split of its rows."""
    return constrain(self.word_embeddings.embedding, ("activation_vocab", "activation_embed"))

  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array,
               position_ids: jax.Array | None = None, *, deterministic: bool) -> jax.Array:
    """Embeds a batch.

    Args:
      input_ids, segment_ids: [batch, seq] int token ids and token types.
      position_ids: [batch, seq] int position of each token in its own sequence (a packed
        batch restarts them at each [CLS], so its rows may be longer than the position table;
        the caller keeps every id below max_position_embeddings); None = 0 .. seq - 1 in every
        row, and then seq must not exceed max_position_embeddings.
      deterministic: no dropout when True.
    Returns:
      [batch, seq, hidden] in the compute dtype.
    """
    seq = input_ids.shape[1]
    if position_ids is None:
      if seq > self.config.max_position_embeddings:
        raise ValueError(
            f"sequence length {seq} exceeds max_position_embeddings="
            f"{self.config.max_position_embeddings}; shorten the inputs or build the model with "
            "more positions.")
      position_ids = jnp.arange(seq)[None, :]  # [1, seq], broadcast over the batch
    # The word table whole on each device (but for a `tensor` split of its rows), as the tied
    # MLM head needs it too: looking rows up in a table split by hidden columns (FSDP) would
    # move the looked-up activations between devices instead, forward and backward.
    words = jnp.take(self.gathered_table(), input_ids, axis=0).astype(jnp.float32)
    x = (words + self.position_embeddings(position_ids)
         + self.token_type_embeddings(segment_ids))  # [batch, seq, hidden] float32
    x = constrain(self.layer_norm(x).astype(self.config.compute_dtype), HIDDEN_AXES)
    return self.dropout(x, deterministic=deterministic)


class SelfAttention(nn.Module):
  """Multi-head scaled dot-product self-attention with query/key/value/output projections.

  The attention itself runs on the path `attention.resolve_attention` picks (`attention.attend`):
  'reference' (the paper's einsum: float32 scores and softmax, dropout on the probabilities),
  'xla' or 'cudnn' (jax.nn.dot_product_attention: float32 scores and softmax as well, no
  dropout) or 'splash' (the TPU kernel). All of them give the same outputs at real tokens; the
  parameters are the same. With `fused_qkv` the three projections are one matmul over their
  kernels stacked at call time, [H, 3, H] (stacked, not concatenated, so a kernel split by heads
  over a mesh stays split where it is); the parameters do not change.

  ModernBERT's attention (`bertjax.models.modernbert`) is this module without biases
  (`BertConfig.use_bias`), its queries and keys rotated (`rotation`) and, in a local layer,
  its keys limited to a `window`.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, *, deterministic: bool,
               rotation: Rotation | None = None, window: int | None = None) -> jax.Array:
    """Attends each position to the keys `mask` allows (and, in a causal model, only to those
    at or before it; in a local layer, only to those at most `window` away).

    Args:
      x: [batch, seq, hidden].
      mask: the batch's AttentionMask.
      deterministic: no dropout when True.
      rotation: the positions' rotary embeddings, applied to queries and keys; None = none.
      window: a local layer's window; None = global.
    Returns:
      [batch, seq, hidden] after the output projection (no residual, no LayerNorm).
    """
    cfg = self.config
    batch, seq, _ = x.shape

    def heads(name: str) -> jax.Array:
      y = make_dense(cfg, cfg.hidden_size, ("embed", "heads"), name, fp8=True)(x)  # [b, s, H]
      # [batch, seq, hidden] -> [batch, seq, heads, head_dim]
      return constrain(y.reshape(batch, seq, cfg.num_heads, cfg.head_dim), HEADS_AXES)

    def drop_probs(probs: jax.Array) -> jax.Array:
      # The reference path's attention dropout: built here, so it is this module's child
      # (Dropout_0) and draws from its rng stream.
      return Dropout(cfg.attention_dropout_rate, cfg.dropout_per_hash)(
          probs, deterministic=deterministic)

    if cfg.fused_qkv:
      kernels, biases = zip(*(DenseParams(cfg, cfg.hidden_size, ("embed", "heads"), name=name)(
          x.shape[-1]) for name in ("query", "key", "value")))
      kernel = jnp.stack(kernels, axis=1)  # 3 x [H, H] -> [H, 3, H]
      bias = jnp.stack(biases).astype(cfg.compute_dtype)  # 3 x [H] -> [3, H]
      # [batch, seq, H] x [H, 3, H] -> [batch, seq, 3, H]
      qkv = fp8.einsum(cfg, "bsh,hjd->bsjd", x, kernel) + bias
      # -> 3 x [batch, seq, heads, head_dim]
      query, key, value = (constrain(qkv[:, :, j].reshape(batch, seq, cfg.num_heads,
                                                           cfg.head_dim), HEADS_AXES)
                           for j in range(3))
    else:
      query, key, value = heads("query"), heads("key"), heads("value")
    if rotation is not None:
      query, key = rotate(query, rotation), rotate(key, rotation)
    # q, k, v [batch, seq, heads, head_dim] -> context [batch, seq, heads, head_dim]
    context = constrain(attend(query, key, value, mask, cfg, dropout=drop_probs, window=window),
                        HEADS_AXES)
    context = context.reshape(batch, seq, cfg.hidden_size)  # -> [batch, seq, hidden]
    return make_dense(cfg, cfg.hidden_size, ("heads", "embed"), "output",
                      stddev=cfg.output_init_stddev, fp8=True)(context)


class FeedForward(nn.Module):
  """Position-wise Dense(F) -> activation -> Dense(H)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, seq, hidden] -> [batch, seq, hidden] (no residual, no LayerNorm)."""
    cfg = self.config
    h = make_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate",
                   fp8=True)(x)  # [b, s, F]
    h = constrain(cfg.activation(h), MLP_AXES)
    return make_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output", fp8=True)(h)  # [b, s, H]


class Layer(nn.Module):
  """One post-LayerNorm transformer block (as the original BERT):

    h = LN(x + dropout(SelfAttention(x)));  out = LN(h + dropout(FeedForward(h)))
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool) -> jax.Array:
    """[batch, seq, hidden] and the batch's AttentionMask -> [batch, seq, hidden].

    `deterministic` is positional here (not keyword-only as elsewhere) because `nn.remat` can
    hold only a positional argument static (`static_argnums`), and dropout needs a Python bool.
    """
    cfg = self.config
    attn = SelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic)
    attn = Dropout(cfg.dropout_rate, cfg.dropout_per_hash)(attn, deterministic=deterministic)
    h = make_layer_norm(cfg, "attention_layer_norm")(x + attn).astype(cfg.compute_dtype)
    h = constrain(h, HIDDEN_AXES)
    ffn = FeedForward(cfg, name="feed_forward")(h)
    ffn = Dropout(cfg.dropout_rate, cfg.dropout_per_hash)(ffn, deterministic=deterministic)
    out = make_layer_norm(cfg, "output_layer_norm")(h + ffn).astype(cfg.compute_dtype)
    return constrain(out, HIDDEN_AXES)


@functools.cache
def layer_class(remat: str, layer: type[nn.Module] = Layer,
                deterministic_argnum: int = 3) -> type[nn.Module]:
  """`layer` (BERT's `Layer` by default), or it under activation checkpointing
  (`BertConfig.remat`).

  'full' keeps only each layer's input and recomputes the layer in the backward pass. 'dots'
  also keeps the outputs of the matrix multiplies without batch dimensions
  (jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims): the q/k/v/output and
  feed-forward projections, [batch, seq, H or F] each, and recomputes the rest: the attention
  einsums, whose dot_generals have batch dimensions (batch, heads), so the float32
  [batch, heads, seq, seq] scores of the reference path are not kept (dots_saveable would keep
  them, the largest activation at seq 512), nor are LayerNorm, GELU and softmax.
  prevent_cse stays True (the default): the layers are a Python loop, not a scan, so without it
  XLA could merge the recomputation back into the forward pass and keep the activations after
  all. The `deterministic` argument (3 for `Layer`: self = 0, x, mask, deterministic) is
  static. Parameter names do not change.
  """
  if remat == "none":
    return layer
  policy = {"full": None, "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}
  return nn.remat(layer, static_argnums=(deterministic_argnum,), prevent_cse=True,
                  policy=policy[remat])


class Encoder(nn.Module):
  """The stack of `num_layers` Layers, named layer_0 .. layer_{L-1} (rematerialised as
  `config.remat` says)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, *,
               deterministic: bool) -> tuple[jax.Array, ...]:
    """[batch, seq, hidden] -> the output of every layer, L arrays [batch, seq, hidden]."""
    block = layer_class(self.config.remat)
    outputs = []
    for i in range(self.config.num_layers):
      x = block(self.config, name=f"layer_{i}")(x, mask, deterministic)
      outputs.append(x)
    return tuple(outputs)


class Pooler(nn.Module):
  """tanh(Dense(H)) of a [CLS] token: the sequence summary used by NSP and classifiers."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output: jax.Array,
               cls_positions: jax.Array | None = None) -> jax.Array:
    """Pools the first token of each row, or the tokens at cls_positions (a packed batch).

    Args:
      sequence_output: [batch, seq, hidden].
      cls_positions: [batch, k] int row positions of the packed sequences' [CLS]; None = 0.
    Returns:
      [batch, hidden], or [batch, k, hidden] with cls_positions.
    """
    if cls_positions is None:
      first = sequence_output[:, 0]  # [batch, seq, hidden] -> [batch, hidden]
    else:  # [batch, seq, hidden] at [batch, k] -> [batch, k, hidden]
      first = jnp.take_along_axis(sequence_output, cls_positions[..., None].astype(jnp.int32),
                                  axis=1)
    axes = ("activation_batch",) + (None,) * (first.ndim - 2) + ("activation_embed",)
    dense = make_dense(self.config, self.config.hidden_size, ("embed", None), "dense")
    return constrain(jnp.tanh(dense(constrain(first, axes))), axes)


def last_token_positions(input_mask: jax.Array, sequence_ids: jax.Array | None = None,
                         num_sequences: int = 1) -> jax.Array:
  """Where each sequence's last real token is: what a causal model pools (BertConfig.causal).

  Args:
    input_mask: [batch, seq] 1 for real tokens (right-padded).
    sequence_ids: [batch, seq] 1..k numbering packed sequences, 0 at padding; None = unpacked.
    num_sequences: k, the slots of a packed row.
  Returns:
    [batch] int32 (the row's last real position), or [batch, k] int32 packed; 0 for a row or
    slot without tokens.
  """
  if sequence_ids is None:
    return jnp.maximum(input_mask.sum(axis=-1, dtype=jnp.int32) - 1, 0)
  seq = sequence_ids.shape[-1]
  slots = jnp.arange(1, num_sequences + 1, dtype=sequence_ids.dtype)  # [k]
  # [batch, 1, seq] == [1, k, 1] -> [batch, k, seq]: position where the token is of slot j, else -1
  where = jnp.where(sequence_ids[:, None, :] == slots[None, :, None],
                    jnp.arange(seq, dtype=jnp.int32), -1)
  return jnp.maximum(where.max(axis=-1), 0)  # [batch, k]


class BertEncoder(nn.Module):
  """The whole BERT encoder: Embeddings -> Encoder -> Pooler.

  Written with `setup` (submodules `embeddings`, `encoder`, `pooler`) so that heads can call
  `word_embedding_table()` to tie their decoder to the input embeddings. Models whose heads read
  only the sequence output (span extraction, token tagging) set `use_pooler=False`: they then
  have no pooler parameters, as Hugging Face's do not, and `pooled_output` is None.
  """
  config: BertConfig
  use_pooler: bool = True

  def setup(self):
    self.embeddings = Embeddings(self.config)
    self.encoder = Encoder(self.config)
    if self.use_pooler:
      self.pooler = Pooler(self.config)

  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array | None = None,
               input_mask: jax.Array | None = None, *, position_ids: jax.Array | None = None,
               sequence_ids: jax.Array | None = None, cls_positions: jax.Array | None = None,
               deterministic: bool, output_hidden_states: bool = False) -> BertOutput:
    """Encodes a batch, unpacked (one sequence a row) or packed (several a row).

    Args:
      input_ids: [batch, seq] int token ids.
      segment_ids: [batch, seq] int token types (0 for sentence A, 1 for B); None = all 0.
      input_mask: [batch, seq] 1 for real tokens, 0 for padding (right-padded); None = all real.
      position_ids: [batch, seq] int position of each token in its own sequence; None =
        0 .. seq - 1.
      sequence_ids: [batch, seq] int, 1..k numbering the sequences packed in a row, 0 at
        padding: attention is block-diagonal by it. None = unpacked.
      cls_positions: [batch, k] int row position of each packed sequence's [CLS], which the
        pooler reads; None = position 0. A causal model pools each sequence's last real token
        instead (`last_token_positions`).
      deterministic: no dropout when True; when False the 'dropout' rng must be given.
      output_hidden_states: also return the embedding output and every layer's output.
    Returns:
      BertOutput (sequence_output [batch, seq, hidden], pooled_output [batch, hidden] or
      [batch, k, hidden] with cls_positions, or None without a pooler, ...).
    """
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    x = self.embeddings(input_ids, segment_ids, position_ids,
                        deterministic=deterministic)  # [b, s, H]
    mask = AttentionMask(input_mask, sequence_ids, cls_positions)
    outputs = self.encoder(x, mask, deterministic=deterministic)
    sequence_output = outputs[-1]
    pooled_output = None
    if self.use_pooler and not self.config.causal:
      pooled_output = self.pooler(sequence_output, cls_positions)  # each [CLS]
    elif self.use_pooler:  # a causal model: each sequence's last token, which sees all of it
      if cls_positions is None:  # [batch] -> [batch, 1] -> pooled [batch, 1, hidden]
        pooled_output = self.pooler(sequence_output,
                                    last_token_positions(input_mask)[:, None])[:, 0]
      else:
        pooled_output = self.pooler(sequence_output, last_token_positions(
            input_mask, sequence_ids, cls_positions.shape[-1]))
    return BertOutput(
        sequence_output=sequence_output, pooled_output=pooled_output,
        hidden_states=(x,) + outputs if output_hidden_states else None)

  def word_embedding_table(self) -> jax.Array:
    """The [padded_vocab, hidden] word-embedding table (param_dtype), for tied output layers;
    whole on each device but for a `tensor` split of its rows, as the lookup reads it
    (`Embeddings.gathered_table`: the same value, so an FSDP step gathers it once)."""
    return self.embeddings.gathered_table()
