"""The BERT encoder (Devlin et al. 2019) as Flax linen modules, and its size table.

One module per idea of the paper: `Embeddings`, `SelfAttention`, `FeedForward`, `Layer`
(post-LayerNorm transformer block), `Encoder` (the stack), `Pooler` and `BertEncoder` (all of
it). The pretraining and fine-tuning heads live in `bertjax.models.heads`.

Parameter tree of `BertEncoder` (names are stable: the Hugging Face and Google checkpoint
converters map them by table, so a rename is a breaking change). Shapes use V = vocab_size,
P = max_position_embeddings, T = type_vocab_size, H = hidden_size, F = intermediate_size;
the logical axis names each parameter carries are given in parentheses.

  embeddings/
    word_embeddings/embedding          [V, H]  ('vocab', 'embed')
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
`bertjax.parallel.LOGICAL_RULES` maps these names to mesh axes. To build sharded parameters:
`jax.eval_shape(model.init, ...)` -> `nn.get_partition_spec` for the specs -> init under jit with
those shardings -> `nn.unbox` to get plain arrays, which `model.apply` takes.

Initialisation follows the original BERT: every kernel and embedding table is drawn from a
normal with stddev `initializer_range` (0.02) truncated at two standard deviations (Google's
`tf.truncated_normal_initializer`; Hugging Face draws an untruncated normal, which matters only
for training from scratch), biases are zeros, LayerNorm scales ones.

Precision: parameters are stored in `param_dtype` (float32); matrix multiplies run in `dtype`
(float32 or bfloat16); LayerNorm, the softmax and the attention scores are always float32.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

ATTENTIONS = ("auto", "reference", "xla", "cudnn", "splash")
FUSED_ATTENTIONS = ("xla", "cudnn", "splash")  # no dropout on the attention probabilities
REMATS = ("none", "full", "dots")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: nn.gelu(x, approximate=False),  # exact: x * Phi(x), with erf
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),  # tanh approximation
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyperparameters of a BERT encoder; defaults are BERT-base (uncased vocabulary).

  Attributes:
    vocab_size: rows of the word-embedding table (V).
    hidden_size: width of every hidden state (H); divisible by num_heads.
    num_layers: transformer layers (L).
    num_heads: attention heads (A); head_dim = H / A.
    intermediate_size: feed-forward width (F), 4 H in every published size.
    max_position_embeddings: rows of the learned position table; the longest sequence the model
      takes.
    type_vocab_size: rows of the token-type (segment) table.
    dropout_rate: dropout on the embeddings and on each residual branch.
    attention_dropout_rate: dropout on the attention probabilities.
    layer_norm_eps: LayerNorm epsilon.
    initializer_range: stddev of the (truncated normal) kernel and embedding init.
    hidden_act: 'gelu' (exact, erf; original BERT) or 'gelu_tanh' (tanh approximation).
    dtype: compute dtype of the matrix multiplies, 'float32' or 'bfloat16'.
    param_dtype: storage dtype of the parameters, 'float32' (or 'bfloat16').
    attention: how attention is computed: 'reference' (the paper's einsum, attention dropout
      included), 'xla' or 'cudnn' (jax.nn.dot_product_attention), 'splash' (the Pallas
      splash-attention kernel, TPU), or 'auto' (the fastest the backend has; 'reference' when
      attention_dropout_rate > 0, which fused kernels cannot apply).
    remat: activation checkpointing of each layer: 'none', 'full' (recompute the whole layer in
      the backward pass) or 'dots' (keep the matrix-multiply outputs, recompute the rest).
    pad_vocab_to_multiple: the word-embedding table and the MLM output have
      `padded_vocab_size` rows (vocab_size rounded up to this multiple), so the vocabulary axis
      splits over tensor-parallel devices and matmuls get aligned shapes; padded rows never
      receive probability mass. 1 = no padding.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  hidden_act: str = "gelu"
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention: str = "reference"
  remat: str = "none"
  pad_vocab_to_multiple: int = 128

  def __post_init__(self):
    for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "pad_vocab_to_multiple"):
      value = getattr(self, field)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"BertConfig.{field}={value!r}; it must be a positive integer.")
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"BertConfig.hidden_size={self.hidden_size} is not divisible by num_heads="
          f"{self.num_heads}; choose a hidden size that is a multiple of the head count.")
    for field in ("dropout_rate", "attention_dropout_rate"):
      value = getattr(self, field)
      if not 0.0 <= value < 1.0:
        raise ValueError(f"BertConfig.{field}={value!r}; it must lie in [0, 1).")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"BertConfig.hidden_act={self.hidden_act!r}; use one of "
                       f"{sorted(_ACTIVATIONS)}.")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in _DTYPES:
        raise ValueError(f"BertConfig.{field}={getattr(self, field)!r}; use one of "
                         f"{sorted(_DTYPES)}.")

    if self.attention not in ATTENTIONS:
      raise ValueError(f"BertConfig.attention={self.attention!r}; use one of {list(ATTENTIONS)}.")
    if self.attention in FUSED_ATTENTIONS and self.attention_dropout_rate > 0:
      raise ValueError(
          f"BertConfig.attention={self.attention!r} is a fused kernel, which cannot drop "
          f"attention probabilities, but attention_dropout_rate={self.attention_dropout_rate}; "
          "set attention_dropout_rate=0 (as MosaicBERT and ModernBERT train), or use "
          "attention='reference' for the paper's exact recipe.")
    if self.remat not in REMATS:
      raise ValueError(f"BertConfig.remat={self.remat!r}; use one of {list(REMATS)}.")

  @property
  def padded_vocab_size(self) -> int:
    """vocab_size rounded up to a multiple of pad_vocab_to_multiple: the rows of the
    word-embedding table and of the MLM output bias."""
    m = self.pad_vocab_to_multiple
    return -(-self.vocab_size // m) * m

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(_DTYPES[self.dtype])

  @property
  def storage_dtype(self) -> jnp.dtype:
    return jnp.dtype(_DTYPES[self.param_dtype])

  @property
  def activation(self) -> Callable[[jax.Array], jax.Array]:
    return _ACTIVATIONS[self.hidden_act]


# The published sizes (google-research/bert README); intermediate_size = 4 * hidden_size.
SIZES: dict[str, dict[str, int]] = {
    name: dict(num_layers=layers, hidden_size=hidden, num_heads=heads,
               intermediate_size=4 * hidden)
    for name, (layers, hidden, heads) in {
        "tiny": (2, 128, 2),
        "mini": (4, 256, 4),
        "small": (4, 512, 8),
        "medium": (8, 512, 8),
        "base": (12, 768, 12),
        "large": (24, 1024, 16),
    }.items()
}


def bert_config(size: str, **overrides) -> BertConfig:
  """The BertConfig of a row of SIZES, with any field replaced by `overrides`.

  Raises:
    ValueError: unknown size, unknown field, or a resulting config that fails validation.
  """
  if size not in SIZES:
    raise ValueError(f"unknown BERT size {size!r}; use one of {list(SIZES)}.")
  fields = {f.name for f in dataclasses.fields(BertConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown BertConfig field(s) {unknown}; the fields are {sorted(fields)}.")
  return BertConfig(**{**SIZES[size], **overrides})


class BertOutput(NamedTuple):
  """What `BertEncoder` returns.

  Attributes:
    sequence_output: [batch, seq, hidden] the last layer's hidden states, in the compute dtype.
    pooled_output: [batch, hidden] tanh(Dense(sequence_output[:, 0])), the [CLS] summary;
      None for an encoder built with use_pooler=False.
    hidden_states: when asked for, num_layers + 1 arrays [batch, seq, hidden]: the embedding
      output, then each layer's output (the last equals sequence_output); otherwise None.
  """
  sequence_output: jax.Array
  pooled_output: jax.Array | None
  hidden_states: tuple[jax.Array, ...] | None = None


def attention_mask(input_mask: jax.Array) -> jax.Array:
  """Which keys each query may attend to: every real (non-padding) token, as BERT does.

  Only keys are masked. A query at a padding position still attends to the real tokens, so no
  softmax row is ever empty; outputs at padding positions are meaningless and ignored.

  Args:
    input_mask: [batch, seq] 1 (or True) for real tokens, 0 for padding.
  Returns:
    [batch, 1, seq, seq] bool, True where query q may attend to key k (broadcasts over heads).
  """
  batch, seq = input_mask.shape
  keys = input_mask.astype(bool)[:, None, None, :]  # [batch, seq] -> [batch, 1, 1, seq(k)]
  return jnp.broadcast_to(keys, (batch, 1, seq, seq))


def kernel_init(config: BertConfig, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev=config.initializer_range), axes)


def make_dense(config: BertConfig, features: int, axes: tuple[str | None, str | None], name: str,
           dtype=None) -> nn.Dense:
  """A Dense [in, out] whose kernel carries `axes` and whose bias carries the output axis."""
  return nn.Dense(
      features, dtype=dtype or config.compute_dtype, param_dtype=config.storage_dtype,
      kernel_init=kernel_init(config, axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)),
      name=name)


def make_layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over the hidden axis, computed in float32 whatever the compute dtype."""
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=config.storage_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name=name)


class Embeddings(nn.Module):
  """Word + learned position + token-type embeddings, then LayerNorm and dropout.

  Written with `setup` so that the MLM head can reach the word-embedding table it is tied to
  (`BertEncoder.word_embedding_table`); submodule names are the attribute names.
  """
  config: BertConfig

  def setup(self):
    cfg = self.config

    def embed(rows: int, axes: tuple[str | None, str]) -> nn.Embed:
      return nn.Embed(rows, cfg.hidden_size, dtype=jnp.float32, param_dtype=cfg.storage_dtype,
                      embedding_init=kernel_init(cfg, axes))

    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
    self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"))
    self.layer_norm = make_layer_norm(cfg, name=None)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, *,
               deterministic: bool) -> jax.Array:
    """[batch, seq] int ids and segment ids -> [batch, seq, hidden] in the compute dtype."""
    seq = input_ids.shape[1]
    if seq > self.config.max_position_embeddings:
      raise ValueError(
          f"sequence length {seq} exceeds max_position_embeddings="
          f"{self.config.max_position_embeddings}; shorten the inputs or build the model with "
          "more positions.")
    positions = jnp.arange(seq)[None, :]  # [1, seq], broadcast over the batch
    x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
         + self.token_type_embeddings(segment_ids))  # [batch, seq, hidden] float32
    x = self.layer_norm(x).astype(self.config.compute_dtype)
    return self.dropout(x, deterministic=deterministic)


class SelfAttention(nn.Module):
  """Multi-head scaled dot-product self-attention with query/key/value/output projections.

  Scores and the softmax are float32; dropout is applied to the attention probabilities.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
    """Attends each position to the unmasked keys.

    Args:
      x: [batch, seq, hidden].
      mask: [batch, 1, seq, seq] bool from `attention_mask`, True where attending is allowed.
      deterministic: no dropout when True.
    Returns:
      [batch, seq, hidden] after the output projection (no residual, no LayerNorm).
    """
    cfg = self.config
    batch, seq, _ = x.shape

    def heads(name: str) -> jax.Array:
      y = make_dense(cfg, cfg.hidden_size, ("embed", "heads"), name)(x)  # [batch, seq, hidden]
      # [batch, seq, hidden] -> [batch, seq, heads, head_dim]
      return y.reshape(batch, seq, cfg.num_heads, cfg.head_dim)

    query, key, value = heads("query"), heads("key"), heads("value")
    # [batch, q, heads, head_dim] x [batch, k, heads, head_dim] -> [batch, heads, q, k]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(cfg.head_dim))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)  # mask broadcasts over heads
    probs = jax.nn.softmax(scores, axis=-1)  # float32
    probs = nn.Dropout(cfg.attention_dropout_rate)(probs, deterministic=deterministic)
    # [batch, heads, q, k] x [batch, k, heads, head_dim] -> [batch, q, heads, head_dim]
    context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(cfg.compute_dtype), value)
    context = context.reshape(batch, seq, cfg.hidden_size)  # -> [batch, seq, hidden]
    return make_dense(cfg, cfg.hidden_size, ("heads", "embed"), "output")(context)


class FeedForward(nn.Module):
  """Position-wise Dense(F) -> activation -> Dense(H)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[batch, seq, hidden] -> [batch, seq, hidden] (no residual, no LayerNorm)."""
    cfg = self.config
    h = make_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)  # [b, s, F]
    h = cfg.activation(h)
    return make_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)  # [b, s, H]


class Layer(nn.Module):
  """One post-LayerNorm transformer block (as the original BERT):

    h = LN(x + dropout(SelfAttention(x)));  out = LN(h + dropout(FeedForward(h)))
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
    """[batch, seq, hidden] and a [batch, 1, seq, seq] mask -> [batch, seq, hidden]."""
    cfg = self.config
    attn = SelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic)
    attn = nn.Dropout(cfg.dropout_rate)(attn, deterministic=deterministic)
    h = make_layer_norm(cfg, "attention_layer_norm")(x + attn).astype(cfg.compute_dtype)
    ffn = FeedForward(cfg, name="feed_forward")(h)
    ffn = nn.Dropout(cfg.dropout_rate)(ffn, deterministic=deterministic)
    return make_layer_norm(cfg, "output_layer_norm")(h + ffn).astype(cfg.compute_dtype)


class Encoder(nn.Module):
  """The stack of `num_layers` Layers, named layer_0 .. layer_{L-1}."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, *,
               deterministic: bool) -> tuple[jax.Array, ...]:
    """[batch, seq, hidden] -> the output of every layer, L arrays [batch, seq, hidden]."""
    outputs = []
    for i in range(self.config.num_layers):
      x = Layer(self.config, name=f"layer_{i}")(x, mask, deterministic=deterministic)
      outputs.append(x)
    return tuple(outputs)


class Pooler(nn.Module):
  """tanh(Dense(H)) of the first ([CLS]) token: the sequence summary used by NSP and classifiers."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output: jax.Array) -> jax.Array:
    """[batch, seq, hidden] -> [batch, hidden]."""
    first = sequence_output[:, 0]  # [batch, seq, hidden] -> [batch, hidden]
    dense = make_dense(self.config, self.config.hidden_size, ("embed", None), "dense")
    return jnp.tanh(dense(first))


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
               input_mask: jax.Array | None = None, *, deterministic: bool,
               output_hidden_states: bool = False) -> BertOutput:
    """Encodes a batch.

    Args:
      input_ids: [batch, seq] int token ids.
      segment_ids: [batch, seq] int token types (0 for sentence A, 1 for B); None = all 0.
      input_mask: [batch, seq] 1 for real tokens, 0 for padding; None = all real.
      deterministic: no dropout when True; when False the 'dropout' rng must be given.
      output_hidden_states: also return the embedding output and every layer's output.
    Returns:
      BertOutput (sequence_output [batch, seq, hidden], pooled_output [batch, hidden] or None
      without a pooler, ...).
    """
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic)  # [b, s, H]
    outputs = self.encoder(x, attention_mask(input_mask), deterministic=deterministic)
    sequence_output = outputs[-1]
    return BertOutput(
        sequence_output=sequence_output,
        pooled_output=self.pooler(sequence_output) if self.use_pooler else None,
        hidden_states=(x,) + outputs if output_hidden_states else None)

  def word_embedding_table(self) -> jax.Array:
    """The [vocab, hidden] word-embedding table (param_dtype), for tied output layers."""
    return self.embeddings.word_embeddings.embedding
