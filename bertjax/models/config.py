"""The BERT encoder's hyperparameters: `BertConfig`, the published sizes and `bert_config`.

A frozen dataclass, validated when it is built, so a model is never constructed from a
configuration it cannot run: the attention path (`ATTENTIONS`; the fused ones, `FUSED_ATTENTIONS`,
apply no attention dropout), the activation checkpointing (`REMATS`), the compute and storage
dtypes and the activation are checked by name here. `bertjax.models.attention` resolves 'auto'
to a path; `bertjax.models.bert` builds the modules from the config. bert_config.json
(`bertjax.modeldir.model_files`) holds these fields, so a field's name and meaning are a file
format.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

ARCHITECTURES = ("bert", "modernbert")
POOLINGS = ("cls", "mean")
ATTENTIONS = ("auto", "reference", "xla", "cudnn", "splash")
FUSED_ATTENTIONS = ("xla", "cudnn", "splash")  # no dropout on the attention probabilities
REMATS = ("none", "full", "dots")
LOCAL_KERNELS = ("auto", "xla", "pallas")  # a local layer's kernel on 'xla'/'cudnn'
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
      128), or 'auto' (the fastest the backend has, `attention.resolve_attention`; 'reference'
      when attention_dropout_rate > 0, which fused kernels cannot apply).
    remat: activation checkpointing of each layer (`bert.layer_class`): 'none', 'full' (recompute
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
    mlm_logits_dtype: what the MLM head's vocabulary projection writes its logits in,
      'float32' or 'bfloat16' (with bfloat16 compute: half the bytes of the [batch, predictions,
      vocab] logits and of their gradient, whose matmuls then take bfloat16 operands); the
      output bias, the softmax and the loss are float32 either way.
    fused_qkv: the query, key and value projections as one matmul, their three kernels stacked
      at call time ([H, 3, H]); the parameters are the same three.
    dropout_per_hash: dropout decisions per threefry hash, 2 or 4 (`bertjax.models.dropout`):
      the same rate, other masks, half the hashes with 4.
    architecture: 'bert' (the paper's: post-LayerNorm, learned absolute positions and token
      types, biases, GELU feed-forward, a tanh pooler) or 'modernbert' (Warner et al. 2024,
      `bertjax.models.modernbert`: pre-LayerNorm without biases, GeGLU feed-forward of width
      intermediate_size, rotary positions, local and global attention layers, a final norm, a
      Dense-GELU-LayerNorm head; no token types, no position table, so max_position_embeddings
      is only the context it was trained for).
    local_attention: modernbert: the window of a local layer, in tokens: each query attends the
      keys at most local_attention // 2 positions away (transformers' `local_attention`).
    global_attention_every: modernbert: layer i attends globally when i % this == 0, locally
      otherwise (3: layers 0, 3, 6, ... global).
    rope_theta_global, rope_theta_local: modernbert: the rotary embeddings' base in global and
      local layers (160,000 and 10,000 in ModernBERT's released models).
    pooling: modernbert: what a sequence-level head reads: 'cls' (the first token of each
      sequence) or 'mean' (the mean of its real tokens); BERT always pools [CLS] ('cls').
    local_kernel: modernbert: how a local layer attends on the 'xla' and 'cudnn' paths: 'pallas'
      (the fused banded kernel, `bertjax.models.banded_attention`; off a GPU in the Pallas
      interpreter, for tests), 'xla' (`attention.local_attention`'s blocks in XLA) or 'auto'
      (xla until a GPU has measured the kernel, `banded_attention.use_banded`); shapes the
      kernel does not take get the XLA blocks. A run choice, not in bert_config.json.
    fp8: the encoder's projections (attention q/k/v/output, feed-forward) as FP8 matmuls with
      delayed scaling (`bertjax.models.fp8`: flax's fp8 ops; the embeddings and heads stay in
      the compute dtype). A run choice, not in bert_config.json: the parameters are the same.
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
  mlm_logits_dtype: str = "float32"
  fused_qkv: bool = False
  dropout_per_hash: int = 2
  architecture: str = "bert"
  local_attention: int = 128
  global_attention_every: int = 3
  rope_theta_global: float = 160_000.0
  rope_theta_local: float = 10_000.0
  pooling: str = "cls"
  local_kernel: str = "auto"
  fp8: bool = False

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
    for field in ("dtype", "param_dtype", "mlm_logits_dtype"):
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
    if self.local_kernel not in LOCAL_KERNELS:
      raise ValueError(f"BertConfig.local_kernel={self.local_kernel!r}; use one of "
                       f"{list(LOCAL_KERNELS)}.")
    if self.remat not in REMATS:
      raise ValueError(f"BertConfig.remat={self.remat!r}; use one of {list(REMATS)}.")
    if self.dropout_per_hash not in (2, 4):
      raise ValueError(f"BertConfig.dropout_per_hash={self.dropout_per_hash!r}; use 2 or 4.")
    for field in ("causal", "fused_qkv", "fp8"):
      if not isinstance(getattr(self, field), bool):
        raise ValueError(f"BertConfig.{field}={getattr(self, field)!r}; it must be true or "
                         "false.")
    self._check_modernbert()

  def _check_modernbert(self):
    """The fields only 'modernbert' reads are valid; BERT pools [CLS] only."""
    if self.architecture not in ARCHITECTURES:
      raise ValueError(f"BertConfig.architecture={self.architecture!r}; use one of "
                       f"{list(ARCHITECTURES)}.")
    if self.pooling not in POOLINGS:
      raise ValueError(f"BertConfig.pooling={self.pooling!r}; use one of {list(POOLINGS)}.")
    if not self.is_modernbert:
      if self.pooling != "cls":
        raise ValueError(f"BertConfig.pooling={self.pooling!r}: BERT pools [CLS] through its "
                         "pooler; mean pooling is architecture='modernbert''s.")
      return
    if self.causal:
      raise ValueError("BertConfig.causal=true is the paper's left-to-right BERT ablation; "
                       "architecture='modernbert' is bidirectional only.")
    for field in ("local_attention", "global_attention_every"):
      value = getattr(self, field)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"BertConfig.{field}={value!r}; it must be a positive integer.")
    if self.local_attention % 2:
      raise ValueError(f"BertConfig.local_attention={self.local_attention} must be even (a "
                       "query attends local_attention // 2 keys on each side).")
    if self.head_dim % 2:
      raise ValueError(f"rotary embeddings need an even head_dim, and hidden_size / num_heads "
                       f"= {self.head_dim}; choose sizes with an even head_dim.")
    for field in ("rope_theta_global", "rope_theta_local"):
      if not getattr(self, field) > 1:
        raise ValueError(f"BertConfig.{field}={getattr(self, field)!r}; it must be above 1.")

  @property
  def is_modernbert(self) -> bool:
    return self.architecture == "modernbert"

  @property
  def use_bias(self) -> bool:
    """Whether Dense and LayerNorm layers of the encoder (and the MLM transform) have biases:
    BERT's do, ModernBERT's do not (its classifiers and MLM output bias still do)."""
    return not self.is_modernbert

  def window(self, layer: int) -> int | None:
    """The local window of `layer` (keys at most this far from the query), or None where it
    attends globally: every BERT layer, and ModernBERT's every global_attention_every-th."""
    if not self.is_modernbert or layer % self.global_attention_every == 0:
      return None
    return self.local_attention // 2

  def rope_theta(self, layer: int) -> float:
    """The rotary base of a ModernBERT layer: global or local."""
    return self.rope_theta_global if self.window(layer) is None else self.rope_theta_local

  @property
  def output_init_stddev(self) -> float | None:
    """The init stddev of the kernels that write into the residual stream (attention and
    feed-forward outputs, the MLM head's Dense): ModernBERT's initializer_range / sqrt(2 L)
    (transformers' ModernBertPreTrainedModel._init_weights "out"); None = initializer_range."""
    if not self.is_modernbert:
      return None
    return self.initializer_range / (2.0 * self.num_layers) ** 0.5

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
  def logits_dtype(self) -> jnp.dtype:
    """mlm_logits_dtype as a dtype."""
    return jnp.dtype(_DTYPES[self.mlm_logits_dtype])

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


# ModernBERT's sizes (transformers' ModernBertConfig of answerdotai/ModernBERT-base and -large;
# intermediate_size is each half of the GeGLU input projection), and a tiny one for CPU.
MODERNBERT_SIZES: dict[str, dict[str, int]] = {
    name: dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ffn)
    for name, (layers, hidden, heads, ffn) in {
        "tiny": (6, 128, 2, 192),
        "base": (22, 768, 12, 1152),
        "large": (28, 1024, 16, 2624),
    }.items()
}
# What ModernBERT's released models share beyond their sizes (transformers' ModernBertConfig
# defaults): the padded OLMo vocabulary, 8,192 tokens of context, LayerNorm eps 1e-5, exact GELU,
# and no dropout.
MODERNBERT_DEFAULTS = dict(
    architecture="modernbert", vocab_size=50368, max_position_embeddings=8192,
    layer_norm_eps=1e-5, hidden_act="gelu", dropout_rate=0.0, attention_dropout_rate=0.0)


def bert_config(size: str, architecture: str = "bert", **overrides) -> BertConfig:
  """The BertConfig of a row of SIZES (MODERNBERT_SIZES and MODERNBERT_DEFAULTS for
  architecture='modernbert'), with any field replaced by `overrides`.

  Raises:
    ValueError: unknown architecture, size or field, or a resulting config that fails
      validation.
  """
  if architecture not in ARCHITECTURES:
    raise ValueError(f"unknown architecture {architecture!r}; use one of {list(ARCHITECTURES)}.")
  sizes = MODERNBERT_SIZES if architecture == "modernbert" else SIZES
  if size not in sizes:
    raise ValueError(f"unknown {'BERT' if architecture == 'bert' else 'ModernBERT'} size "
                     f"{size!r}; use one of {list(sizes)}.")
  fields = {f.name for f in dataclasses.fields(BertConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown BertConfig field(s) {unknown}; the fields are {sorted(fields)}.")
  defaults = MODERNBERT_DEFAULTS if architecture == "modernbert" else {}
  return BertConfig(**{**defaults, **sizes[size], **overrides})
