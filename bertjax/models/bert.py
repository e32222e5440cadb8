"""The BERT encoder (Devlin et al. 2019) as Flax linen modules, and its size table.

One module per idea of the paper: `Embeddings`, `SelfAttention`, `FeedForward`, `Layer`
(post-LayerNorm transformer block), `Encoder` (the stack), `Pooler` and `BertEncoder` (all of
it). The pretraining and fine-tuning heads live in `bertjax.models.heads`.

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
`bertjax.training.parallel.LOGICAL_RULES` maps these names to mesh axes. To build sharded parameters:
`jax.eval_shape(model.init, ...)` -> `nn.get_partition_spec` for the specs -> init under jit with
those shardings -> `nn.unbox` to get plain arrays, which `model.apply` takes.

Initialisation follows the original BERT: every kernel and embedding table is drawn from a
normal with stddev `initializer_range` (0.02) truncated at two standard deviations (Google's
`tf.truncated_normal_initializer`; Hugging Face draws an untruncated normal, which matters only
for training from scratch), biases are zeros, LayerNorm scales ones.

Precision: parameters are stored in `param_dtype` (float32); matrix multiplies run in `dtype`
(float32 or bfloat16); LayerNorm, the softmax and the attention scores are always float32.

Attention paths (`BertConfig.attention`, `resolve_attention`): 'reference' is the paper's einsum
with dropout on the attention probabilities; 'xla' and 'cudnn' call jax.nn.dot_product_attention
(`dot_product_attention_kwargs` says which mask arguments each gets); 'splash' is the Pallas TPU
kernel (`splash_attention`). They agree at every real token (tests/test_attention.py).
A causal model (`BertConfig.causal`, the paper's left-to-right ablation) hides later keys on
every path: the dense mask is lower-triangular, cuDNN unpacked gets is_causal, splash its
CausalMask (tests/test_ablations.py).

Packed batches (Krell et al. 2021): several sequences share a row; `BertEncoder` takes their
position_ids (restarting at each [CLS]), sequence_ids (attention is block-diagonal by them, on
every path) and cls_positions (the pooler reads each sequence's [CLS]). Each sequence's outputs
equal those it has alone in an unpacked row.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.dropout import Dropout

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
      included), 'xla' or 'cudnn' (jax.nn.dot_product_attention; cudnn needs bfloat16 and a
      GPU), 'splash' (the Pallas splash-attention kernel; TPU, sequence lengths a multiple of
      128), or 'auto' (the fastest the backend has, `resolve_attention`; 'reference' when
      attention_dropout_rate > 0, which fused kernels cannot apply).
    remat: activation checkpointing of each layer (`layer_class`): 'none', 'full' (recompute
      the whole layer in the backward pass) or 'dots' (keep the projections' outputs, recompute
      the rest).
    pad_vocab_to_multiple: the word-embedding table and the MLM output have
      `padded_vocab_size` rows (vocab_size rounded up to this multiple), so the vocabulary axis
      splits over tensor-parallel devices and matmuls get aligned shapes; padded rows never
      receive probability mass. 1 = no padding.
    causal: each token attends only to itself and the tokens before it (a left-to-right
      model: the paper's "LTR & No NSP" ablation, section 5.1), on every attention path; the
      pooler then reads each sequence's last real token (its final [SEP], the only one that
      sees the whole sequence, as OpenAI GPT classifies from its last token) instead of [CLS].
      A property of the weights, so bert_config.json records it and fine-tuning keeps it.
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
  causal: bool = False

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
    if self.attention == "cudnn" and self.dtype != "bfloat16":
      raise ValueError(
          f"BertConfig.attention='cudnn' needs dtype='bfloat16' (cuDNN flash attention takes "
          f"half-precision inputs only), but dtype={self.dtype!r}; set dtype=bfloat16, or use "
          "attention='auto', which takes 'xla' in float32.")
    if self.remat not in REMATS:
      raise ValueError(f"BertConfig.remat={self.remat!r}; use one of {list(REMATS)}.")
    if not isinstance(self.causal, bool):
      raise ValueError(f"BertConfig.causal={self.causal!r}; it must be true or false.")

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


def packed_attention_mask(sequence_ids: jax.Array) -> jax.Array:
  """Which keys each query may attend to in a packed batch: those of its own sequence.

  Block-diagonal (Krell et al. 2021): no token attends across the sequences packed in a row.
  Padding (id 0) attends only padding, so no softmax row is empty.

  Args:
    sequence_ids: [batch, seq] int, 1..k numbering the sequences packed in a row, 0 at padding.
  Returns:
    [batch, 1, seq, seq] bool, True where sequence_ids[q] == sequence_ids[k].
  """
  # [batch, seq(q), 1] == [batch, 1, seq(k)] -> [batch, seq, seq] -> [batch, 1, seq, seq]
  return (sequence_ids[:, :, None] == sequence_ids[:, None, :])[:, None]


def causal_mask(seq: int) -> jax.Array:
  """Which keys each query may attend to in a left-to-right model: itself and those before it.

  Returns:
    [1, 1, seq, seq] bool, True where key k <= query q (lower triangular; broadcasts over the
    batch and the heads).
  """
  return jnp.tril(jnp.ones((seq, seq), bool))[None, None]


class AttentionMask(NamedTuple):
  """Who may attend to whom, kept in the forms the attention paths take (a pytree).

  Attributes:
    input_mask: [batch, seq] 1 for real tokens, 0 for padding. Right-padded (each row's real
      tokens first), as every batch bertjax builds is: the cuDNN path reads only its row sums.
    sequence_ids: [batch, seq] int, 1..k numbering the sequences packed in a row, 0 at padding;
      None for an unpacked batch (one sequence a row).
  """
  input_mask: jax.Array
  sequence_ids: jax.Array | None = None

  def dense(self, causal: bool = False) -> jax.Array:
    """[batch, 1, seq, seq] bool, True where query q may attend to key k: `attention_mask`
    unpacked, `packed_attention_mask` packed; with `causal` (BertConfig.causal) also only keys
    k <= q (`causal_mask`). A padding query still attends some key (a real one before it, or
    itself packed), so no softmax row is empty."""
    if self.sequence_ids is None:
      dense = attention_mask(self.input_mask)
    else:
      dense = packed_attention_mask(self.sequence_ids)
    return dense & causal_mask(dense.shape[-1]) if causal else dense

  def segment_ids(self) -> jax.Array:
    """[batch, seq] int32 ids such that q may attend k iff their ids are equal: sequence_ids
    packed, input_mask unpacked (so a padding query attends padding keys only; the real tokens'
    outputs are the same as under `dense`, the padding positions' are meaningless either way)."""
    ids = self.input_mask if self.sequence_ids is None else self.sequence_ids
    return ids.astype(jnp.int32)


def _cudnn_fits(config: BertConfig, seq_len: int | None) -> bool:
  """Whether cuDNN flash attention takes this model's shapes: fp16/bf16 inputs, head_dim a
  multiple of 8 and at most 128 (256 from Hopper on; 128 is safe everywhere), and an even
  sequence length (cuDNN's training kernel with a bias, which a packed batch passes)."""
  return (config.compute_dtype == jnp.bfloat16 and config.head_dim % 8 == 0
          and config.head_dim <= 128 and (seq_len is None or seq_len % 2 == 0))


def resolve_attention(config: BertConfig, backend: str | None = None,
                      seq_len: int | None = None) -> str:
  """The attention path a model runs: config.attention, or what 'auto' means here.

  'auto' is 'reference' when attention_dropout_rate > 0 (no fused kernel drops attention
  probabilities); else 'splash' on TPU (when seq_len is a multiple of 128, else 'xla'),
  'cudnn' on GPU (when cuDNN takes the shapes: bfloat16 compute, head_dim a multiple of 8 up to
  128, even seq_len; else 'xla'), and 'xla' on CPU.

  Args:
    config: the model's BertConfig.
    backend: 'cpu', 'gpu' or 'tpu'; None = `jax.default_backend()`.
    seq_len: the sequence length the model is called with (the model passes it); None = not
      known yet (taken to suit every kernel).
  Returns:
    'reference', 'xla', 'cudnn' or 'splash'.
  Raises:
    ValueError: an explicit choice the backend or the length cannot run (splash off TPU or at a
      length that is not a multiple of 128, cudnn off GPU), naming the fix.
  """
  backend = backend or jax.default_backend()
  choice = config.attention
  if choice == "auto":
    if config.attention_dropout_rate > 0:
      return "reference"
    if backend == "tpu":
      return "splash" if seq_len is None or seq_len % 128 == 0 else "xla"
    if backend == "gpu":
      return "cudnn" if _cudnn_fits(config, seq_len) else "xla"
    return "xla"
  if choice == "splash":
    if backend != "tpu":
      raise ValueError(f"splash attention needs a TPU, and this backend is {backend!r}; use "
                       "attention=auto (or xla).")
    if seq_len is not None and seq_len % 128:
      raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, "
                       f"got {seq_len}; pad the sequences to a multiple of 128 or use "
                       "attention=auto (which takes xla there).")
  if choice == "cudnn" and backend != "gpu":
    raise ValueError(f"cudnn attention needs an NVIDIA GPU, and this backend is {backend!r}; "
                     "use attention=auto (or xla).")
  return choice


def dot_product_attention_kwargs(mask: AttentionMask, implementation: str,
                                 causal: bool = False) -> dict:
  """The masking arguments of `jax.nn.dot_product_attention` for 'xla' or 'cudnn'.

  What each implementation honours (jax/_src/nn/functions.py and
  jax/_src/cudnn/fused_attention_stablehlo.py, jax 0.10): 'xla' applies a boolean `mask` and
  `key_value_seq_lengths` alike, to the float32 logits. 'cudnn' turns a boolean `mask` into an
  additive bias [batch, 1, seq, seq] that its kernel reads in full, while sequence lengths become
  its PADDING mask type, which skips the padded key blocks.

  Unpacked, the keys to hide are each row's padding tail, so cuDNN gets key_value_seq_lengths
  (the row sums of the right-padded input_mask); query_seq_lengths stays unset (jax then uses
  the full length), so padding queries attend the real keys exactly as `attention_mask` says.

  Packed, lengths cannot say "attend only your own sequence", so both get the block-diagonal
  mask. Do not replace it by lengths or segment ids that a kernel may ignore: the maxtext
  issue 4476 trap, where a fused kernel silently attended across packed sequences. cuDNN honours
  the mask as a bias of -2^41 (bf16) on the blocked logits, so no probability crosses sequences.

  Causal (BertConfig.causal): unpacked, cuDNN gets is_causal with the lengths (its
  PADDING_CAUSAL mask type, which skips the blocks above the diagonal); otherwise the dense mask
  is the causal one (`AttentionMask.dense(causal=True)`).

  Args:
    mask: the batch's AttentionMask.
    implementation: 'xla' or 'cudnn'.
    causal: keys after the query are hidden too.
  Returns:
    {'mask': [batch, 1, seq, seq] bool} or {'key_value_seq_lengths': [batch] int32} (and
    'is_causal': True when causal).
  """
  if implementation == "cudnn" and mask.sequence_ids is None:
    lengths = {"key_value_seq_lengths": mask.input_mask.sum(axis=-1, dtype=jnp.int32)}
    return {**lengths, "is_causal": True} if causal else lengths
  return {"mask": mask.dense(causal)}


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: AttentionMask, *,
                     causal: bool = False, interpret: bool = False) -> jax.Array:
  """Multi-head attention by the Pallas splash-attention kernel (TPU), block-diagonal by segment.

  The kernel takes one example's [heads, seq, head_dim] and does not scale the logits, so the
  query is scaled by 1/sqrt(head_dim) here and the kernel is vmapped over the batch. Its mask is
  full (or, causal, the kernel's CausalMask, which also skips the blocks above the diagonal);
  which sequence a query may attend comes from SegmentIds (`AttentionMask.segment_ids`), which
  the kernel applies in every block.

  Args:
    query, key, value: [batch, seq, heads, head_dim] in the compute dtype; seq a multiple of 128.
    mask: the batch's AttentionMask.
    causal: keys after the query are hidden too (BertConfig.causal).
    interpret: run the kernel in the Pallas interpreter (any backend, slow: for tests).
  Returns:
    [batch, seq, heads, head_dim].
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only kernel

  batch, seq, heads, head_dim = query.shape
  if seq % 128:
    raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, got "
                     f"{seq}; pad the sequences to a multiple of 128 or use attention=auto.")
  block = next(b for b in (512, 256, 128) if seq % b == 0)  # the largest tile that divides seq
  kernel = splash.make_splash_mha(
      splash.MultiHeadMask([(splash.CausalMask if causal else splash.FullMask)((seq, seq))]
                           * heads),
      block_sizes=splash.BlockSizes(
          block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block),
      head_shards=1, q_seq_shards=1, interpret=interpret)
  # [batch, seq, heads, head_dim] -> [batch, heads, seq, head_dim]
  to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)
  query = to_heads_first(query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype))
  ids = mask.segment_ids()  # [batch, seq]
  out = jax.vmap(lambda q, k, v, i: kernel(q, k, v, segment_ids=splash.SegmentIds(q=i, kv=i)))(
      query, to_heads_first(key), to_heads_first(value), ids)
  return to_heads_first(out)  # [batch, heads, seq, head_dim] -> [batch, seq, heads, head_dim]


def kernel_init(config: BertConfig, axes: tuple[str | None, ...],
                zero_rows_from: int | None = None):
  """The truncated-normal init of kernels and embedding tables, with logical axes; rows from
  `zero_rows_from` on (the padded vocabulary rows, never read) start at 0."""
  init = nn.initializers.truncated_normal(stddev=config.initializer_range)
  if zero_rows_from is None:
    return nn.with_logical_partitioning(init, axes)

  def zero_padding_rows(key, shape, dtype=jnp.float32):
    return init(key, shape, dtype).at[zero_rows_from:].set(0)
  return nn.with_logical_partitioning(zero_padding_rows, axes)


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
    self.dropout = Dropout(cfg.dropout_rate)

  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array,
               position_ids: jax.Array | None = None, *, deterministic: bool) -> jax.Array:
    """Embeds a batch.

    Args:
      input_ids, segment_ids: [batch, seq] int token ids and token types.
      position_ids: [batch, seq] int position of each token in its own sequence (a packed
        batch restarts them at each [CLS]); None = 0 .. seq - 1 in every row.
      deterministic: no dropout when True.
    Returns:
      [batch, seq, hidden] in the compute dtype.
    """
    seq = input_ids.shape[1]
    if seq > self.config.max_position_embeddings:
      raise ValueError(
          f"sequence length {seq} exceeds max_position_embeddings="
          f"{self.config.max_position_embeddings}; shorten the inputs or build the model with "
          "more positions.")
    if position_ids is None:
      position_ids = jnp.arange(seq)[None, :]  # [1, seq], broadcast over the batch
    x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
         + self.token_type_embeddings(segment_ids))  # [batch, seq, hidden] float32
    x = self.layer_norm(x).astype(self.config.compute_dtype)
    return self.dropout(x, deterministic=deterministic)


class SelfAttention(nn.Module):
  """Multi-head scaled dot-product self-attention with query/key/value/output projections.

  The attention itself runs on the path `resolve_attention` picks: 'reference' (the einsum
  below: float32 scores and softmax, dropout on the probabilities), 'xla' or 'cudnn'
  (jax.nn.dot_product_attention: float32 scores and softmax as well, no dropout) or 'splash'
  (the TPU kernel). All of them give the same outputs at real tokens; the parameters are the same.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: AttentionMask, *, deterministic: bool) -> jax.Array:
    """Attends each position to the keys `mask` allows (and, in a causal model, only to those
    at or before it).

    Args:
      x: [batch, seq, hidden].
      mask: the batch's AttentionMask.
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
    implementation = resolve_attention(cfg, seq_len=seq)
    if implementation == "reference":
      context = self.reference_attention(query, key, value, mask.dense(cfg.causal),
                                         deterministic=deterministic)
    elif implementation == "splash":
      context = splash_attention(query, key, value, mask, causal=cfg.causal)
    else:  # [batch, seq, heads, head_dim] in and out
      context = jax.nn.dot_product_attention(
          query, key, value, implementation=implementation,
          **dot_product_attention_kwargs(mask, implementation, cfg.causal))
    context = context.reshape(batch, seq, cfg.hidden_size)  # -> [batch, seq, hidden]
    return make_dense(cfg, cfg.hidden_size, ("heads", "embed"), "output")(context)

  def reference_attention(self, query: jax.Array, key: jax.Array, value: jax.Array,
                          mask: jax.Array, *, deterministic: bool) -> jax.Array:
    """The paper's attention: [batch, seq, heads, head_dim] q, k, v and a [batch, 1, seq, seq]
    bool mask -> [batch, seq, heads, head_dim], with dropout on the probabilities."""
    cfg = self.config
    # [batch, q, heads, head_dim] x [batch, k, heads, head_dim] -> [batch, heads, q, k]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(cfg.head_dim))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)  # mask broadcasts over heads
    probs = jax.nn.softmax(scores, axis=-1)  # float32
    probs = Dropout(cfg.attention_dropout_rate)(probs, deterministic=deterministic)
    # [batch, heads, q, k] x [batch, k, heads, head_dim] -> [batch, q, heads, head_dim]
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(cfg.compute_dtype), value)


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
  def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool) -> jax.Array:
    """[batch, seq, hidden] and the batch's AttentionMask -> [batch, seq, hidden].

    `deterministic` is positional here (not keyword-only as elsewhere) because `nn.remat` can
    hold only a positional argument static (`static_argnums`), and dropout needs a Python bool.
    """
    cfg = self.config
    attn = SelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic)
    attn = Dropout(cfg.dropout_rate)(attn, deterministic=deterministic)
    h = make_layer_norm(cfg, "attention_layer_norm")(x + attn).astype(cfg.compute_dtype)
    ffn = FeedForward(cfg, name="feed_forward")(h)
    ffn = Dropout(cfg.dropout_rate)(ffn, deterministic=deterministic)
    return make_layer_norm(cfg, "output_layer_norm")(h + ffn).astype(cfg.compute_dtype)


@functools.cache
def layer_class(remat: str) -> type[nn.Module]:
  """`Layer`, or `Layer` under activation checkpointing (`BertConfig.remat`).

  'full' keeps only each layer's input and recomputes the layer in the backward pass. 'dots'
  also keeps the outputs of the matrix multiplies without batch dimensions
  (jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims): the q/k/v/output and
  feed-forward projections, [batch, seq, H or F] each, and recomputes the rest: the attention
  einsums, whose dot_generals have batch dimensions (batch, heads), so the float32
  [batch, heads, seq, seq] scores of the reference path are not kept (dots_saveable would keep
  them, the largest activation at seq 512), nor are LayerNorm, GELU and softmax.
  prevent_cse stays True (the default): the layers are a Python loop, not a scan, so without it
  XLA could merge the recomputation back into the forward pass and keep the activations after
  all. Argument 3 (self = 0, x, mask, deterministic) is static. Parameter names do not change.
  """
  if remat == "none":
    return Layer
  policy = {"full": None, "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}
  return nn.remat(Layer, static_argnums=(3,), prevent_cse=True, policy=policy[remat])


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
    dense = make_dense(self.config, self.config.hidden_size, ("embed", None), "dense")
    return jnp.tanh(dense(first))


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
    mask = AttentionMask(input_mask, sequence_ids)
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
    """The [padded_vocab, hidden] word-embedding table (param_dtype), for tied output layers."""
    return self.embeddings.word_embeddings.embedding
