"""Heads on the BERT encoder: pretraining (masked LM + next sentence) and the fine-tuning heads.

Each head is a module on the encoder's output, and each `BertFor*` model is the encoder under
'bert' plus its head(s) under a fixed name, so one checkpoint can hold any of them and
`bertjax.modeldir.saved_params.load_params` matches them by path.

Parameter tree of `BertForPreTraining` (logical axis names in parentheses; see
`bertjax.models.bert` for the encoder under 'bert' and the meaning of the names):

  bert/...                             the BertEncoder
  masked_lm/
    transform/kernel                   [H, H]  ('embed', None)
    transform/bias                     [H]     (None,)
    layer_norm/{scale,bias}            [H]     ('embed',)
    output_bias                        [V]     ('vocab',)  V = padded_vocab_size
  next_sentence/
    classifier/kernel                  [H, 2]  ('embed', None)
    classifier/bias                    [2]     (None,)

There is no decoder kernel: the MLM decoder is tied to bert/embeddings/word_embeddings/embedding
(logits = h @ table.T + output_bias), as in the original BERT. Both have padded_vocab_size rows
(`BertConfig.pad_vocab_to_multiple`); the logits of the padded columns are float32 min, so the
softmax gives them no probability, argmax never picks them, and the loss is that of the real
vocabulary.

Fine-tuning models (N = num_labels); each head is dropout (`dropout_rate`) then one Dense,
`{head}/classifier/kernel` [H, N] ('embed', None) and `{head}/classifier/bias` [N] (None,):

  BertForSequenceClassification  bert/ (with pooler)     sequence_classification/  on [CLS] pooled
                                                                (N = 1: regression, STS-B)
  BertForMultipleChoice          bert/ (with pooler)     multiple_choice/  N = 1, one score a choice
  BertForTokenClassification     bert/ (no pooler)       token_tagging/    on every token (NER)
  BertForQuestionAnswering       bert/ (no pooler)       span/             N = 2: start, end logits
                                                                (no dropout, as in BERT's SQuAD)

These are the architectures of Hugging Face's classes of the same names, so converted weights
give the same logits (`bertjax.convert.hf`).

With `bilstm_on_top=True` (`config.model.bilstm_on_top`; the paper's "+ BiLSTM", Table 5) a
fresh one-layer BiLSTM, `bilstm/` (`bertjax.models.bilstm`, hidden_size // 2 units a
direction), runs over the encoder's last layer and the head reads it: per-token heads its
outputs, pooled heads its two final states in place of the pooler (which is then absent), so
`bert/` stays as pretraining saved it. Such a model has no Hugging Face class, and it takes no
packed batches.

ModernBERT (`BertConfig.architecture='modernbert'`, `bertjax.models.modernbert`): every model
puts `modernbert.ModernBertEncoder` under 'bert' (`make_encoder`), with transformers'
ModernBERT heads: no NSP; the masked LM reads the encoder's shared head ('bert/head') before
the tied decoder and `masked_lm/output_bias` (no `masked_lm/transform` or `layer_norm`);
sequence-level heads read that head on each sequence's pooled summary ('cls' or 'mean',
`BertConfig.pooling`), token tagging and spans read it on every token; classifiers are
initialised with stddev hidden ** -0.5.

Every `BertFor*` model names the batch keys its `__call__` takes in `batch_keys`, so the trainer
calls any of them on a batch dict the same way (`apply_to_batch`). `BertForPreTraining` and
`BertForSequenceClassification` also take packed batches (several sequences a row; see
`bertjax.models.bert`): they list PACKING_KEYS in `packing_keys`, take them as keyword arguments,
and return one NSP / classification row per packed sequence, [batch, k, ...].
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert, bilstm, fp8, layers, modernbert
from bertjax.models.config import BertConfig
from bertjax.models.dropout import Dropout

# The inputs of every BertFor* model, in the order of its __call__'s arguments.
INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")
# The extra keys of a packed batch ([batch, seq], [batch, seq], [batch, k] int32), passed as
# keyword arguments to the models that list them in `packing_keys`.
PACKING_KEYS = ("position_ids", "sequence_ids", "cls_positions")


def _packing_kwargs(model: nn.Module, batch) -> dict:
  """The packing keys `batch` has, for `model` as keyword arguments.

  Raises:
    ValueError: a packed batch for a model that does not take packed batches (it would attend
      across the packed sequences and pool only the first).
  """
  present = {k: batch[k] for k in PACKING_KEYS if k in batch}
  if present and not getattr(model, "packing_keys", ()):
    raise ValueError(f"{type(model).__name__} does not take packed batches, but the batch has "
                     f"{sorted(present)}; turn packing off for this task.")
  return present


def apply_to_batch(model: nn.Module, params, batch, *, deterministic: bool,
                   rngs: dict | None = None, fp8_state=None):
  """`model`'s outputs on a batch dict: model(*(batch[k] for k in model.batch_keys)), with the
  packing keys the batch has (PACKING_KEYS) as keyword arguments.

  Args:
    model: a BertFor* module.
    params: its "params" collection.
    batch: {key: array}, with at least the model's batch_keys ([batch, seq] int32 inputs).
    deterministic: no dropout when True; else rngs must hold a 'dropout' key.
    fp8_state: a model built with config.fp8: its scaling state (`bertjax.models.fp8`).
  Returns:
    what the model returns (logits, or a tuple of logits).
  """
  return model.apply(fp8.variables(params, fp8_state), *(batch[k] for k in model.batch_keys),
                     **_packing_kwargs(model, batch), deterministic=deterministic, rngs=rngs)


def init_variables_from_batch(model: nn.Module, rng: jax.Array, batch) -> dict:
  """A BertFor* model's freshly initialised variables for `batch`'s shapes (and packing keys,
  as apply_to_batch): "params" (with logical axis boxes), and with config.fp8 the scaling
  state (`bertjax.models.fp8.COLLECTION`)."""
  return dict(model.init({"params": rng}, *(batch[k] for k in model.batch_keys),
                         **_packing_kwargs(model, batch), deterministic=True))


def init_from_batch(model: nn.Module, rng: jax.Array, batch):
  """A BertFor* model's freshly initialised "params" (with logical axis boxes) for `batch`'s
  shapes (and packing keys, as apply_to_batch)."""
  return init_variables_from_batch(model, rng, batch)["params"]


def make_encoder(config: BertConfig, *, use_pooler: bool, token_head: bool = False,
                 name: str = "bert") -> nn.Module:
  """The encoder of `config.architecture`: `bert.BertEncoder` or `modernbert.ModernBertEncoder`
  (whose `token_head` puts its head on every token, as transformers' token-level ModernBERT
  heads; BERT has no such head)."""
  if config.is_modernbert:
    return modernbert.ModernBertEncoder(config, use_pooler=use_pooler, token_head=token_head,
                                        name=name)
  return bert.BertEncoder(config, use_pooler=use_pooler, name=name)


def classifier(config: BertConfig, features: int) -> nn.Dense:
  """A head's output layer, Dense(features) with a bias, float32: 'classifier'. Initialised
  as the encoder's kernels for BERT, with stddev hidden ** -0.5 for ModernBERT (transformers'
  "final_out")."""
  stddev = config.hidden_size ** -0.5 if config.is_modernbert else None
  return layers.make_dense(config, features, ("embed", None), "classifier", dtype=jnp.float32,
                           use_bias=True, stddev=stddev)


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
  """Picks the hidden states at given positions of each example.

  Args:
    sequence: [batch, seq, hidden].
    positions: [batch, num_positions] int indices into seq.
  Returns:
    [batch, num_positions, hidden], out[b, p] = sequence[b, positions[b, p]].
  """
  # [batch, num_positions] -> [batch, num_positions, 1], broadcast over hidden
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLM(nn.Module):
  """Masked-LM head: Dense(H) + activation + LayerNorm, then the tied vocabulary projection.

  The hidden states at `masked_lm_positions` are gathered before the transform, so only the
  predicted positions pay for the [hidden, vocab] projection. The projection writes its logits in
  `config.mlm_logits_dtype` (bfloat16 halves their bytes and makes their gradient's matmuls
  bfloat16); the output bias is added in float32 and the head returns float32 logits, over the
  padded vocabulary, the padded columns (>= vocab_size) float32 min.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output: jax.Array, word_embeddings: jax.Array,
               masked_lm_positions: jax.Array | None = None, transform=None) -> jax.Array:
    """Scores every vocabulary entry at the chosen (or all) positions.

    Args:
      sequence_output: [batch, seq, hidden] from the encoder.
      word_embeddings: [padded_vocab, hidden] the encoder's word-embedding table (the tied
        decoder).
      masked_lm_positions: [batch, num_predictions] positions to score; None = every position.
      transform: [..., hidden] -> [..., hidden] in place of this head's own Dense, activation
        and LayerNorm (ModernBERT's: its encoder's shared head); None = BERT's, here.
    Returns:
      float32 logits [batch, num_predictions, padded_vocab] ([batch, seq, padded_vocab] without
      positions); columns >= vocab_size are float32 min.
    """
    cfg = self.config
    h = sequence_output
    if masked_lm_positions is not None:
      h = gather_positions(h, masked_lm_positions)  # -> [batch, num_predictions, hidden]
    if transform is not None:
      h = transform(h)
    else:
      h = layers.make_dense(cfg, cfg.hidden_size, ("embed", None), "transform")(h)
      h = cfg.activation(h)
      h = layers.make_layer_norm(cfg, "layer_norm")(h).astype(cfg.compute_dtype)
    # [batch, p, hidden] x [padded_vocab, hidden] -> [batch, p, padded_vocab], logits_dtype
    logits = jnp.einsum("bph,vh->bpv", h, word_embeddings.astype(cfg.compute_dtype),
                        preferred_element_type=cfg.logits_dtype)
    output_bias = self.param(
        "output_bias",
        nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
        (cfg.padded_vocab_size,), cfg.storage_dtype)
    logits = logits.astype(jnp.float32) + output_bias.astype(jnp.float32)
    if cfg.padded_vocab_size == cfg.vocab_size:
      return logits
    # The padded columns get float32 min: exp() of it is 0, so they take no probability mass
    # and no gradient, and the cross-entropy is the real vocabulary's.
    real = jnp.arange(cfg.padded_vocab_size) < cfg.vocab_size  # [padded_vocab]
    return jnp.where(real, logits, jnp.finfo(jnp.float32).min)


class NextSentence(nn.Module):
  """Next-sentence head: Dense(2) on the pooled output; logit 0 = "B follows A", 1 = "random"."""
  config: BertConfig

  @nn.compact
  def __call__(self, pooled_output: jax.Array) -> jax.Array:
    """[batch, hidden] -> float32 logits [batch, 2] ([batch, k, hidden] -> [batch, k, 2])."""
    return classifier(self.config, 2)(pooled_output)


class BertForPreTraining(nn.Module):
  """BertEncoder ('bert') + MaskedLM ('masked_lm', tied) + NextSentence ('next_sentence').

  With next_sentence=False (the paper's No NSP and LTR ablations, section 5.1) there is no NSP
  head and no pooler (nothing would train it; as Hugging Face's BertForMaskedLM), and the NSP
  logits are None. A left-to-right LM is this model on a causal BertConfig, scoring every
  position's next token with the same tied head (bertjax.tasks.pretraining).
  """
  config: BertConfig
  next_sentence: bool = True
  batch_keys = INPUT_KEYS + ("masked_lm_positions",)
  packing_keys = PACKING_KEYS

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
               masked_lm_positions: jax.Array | None = None, *,
               position_ids: jax.Array | None = None, sequence_ids: jax.Array | None = None,
               cls_positions: jax.Array | None = None,
               deterministic: bool) -> tuple[jax.Array, jax.Array]:
    """MLM and NSP logits for a pretraining batch, unpacked or packed.

    Args:
      input_ids, segment_ids, input_mask: [batch, seq] int32 (input_mask 1 = real, 0 = pad).
      masked_lm_positions: [batch, num_predictions] int32 row positions to score; None = all.
      position_ids, sequence_ids, cls_positions: a packed batch's ([batch, seq], [batch, seq],
        [batch, k]; see `bert.BertEncoder`); None = unpacked.
      deterministic: no dropout when True; when False the 'dropout' rng must be given.
    Returns:
      (mlm_logits [batch, num_predictions or seq, padded_vocab], nsp_logits [batch, 2], or
      [batch, k, 2] with cls_positions, or None without next_sentence), float32.
    """
    if self.next_sentence and self.config.is_modernbert:
      raise ValueError("ModernBERT pretrains the masked LM alone; build BertForPreTraining "
                       "with next_sentence=False (pretraining.nsp=false).")
    encoder = make_encoder(self.config, use_pooler=self.next_sentence)
    out = encoder(input_ids, segment_ids, input_mask, position_ids=position_ids,
                  sequence_ids=sequence_ids, cls_positions=cls_positions,
                  deterministic=deterministic)
    transform = encoder.prediction_head if self.config.is_modernbert else None
    mlm_logits = MaskedLM(self.config, name="masked_lm")(
        out.sequence_output, encoder.word_embedding_table(), masked_lm_positions, transform)
    if not self.next_sentence:
      return mlm_logits, None
    nsp_logits = NextSentence(self.config, name="next_sentence")(out.pooled_output)
    return mlm_logits, nsp_logits


class SequenceClassification(nn.Module):
  """Classifier (or regressor, num_labels=1) on the pooled [CLS] output: dropout, Dense(N)."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, pooled_output: jax.Array, *, deterministic: bool) -> jax.Array:
    """[batch, hidden] -> float32 logits [batch, num_labels] ([batch, k, hidden] ->
    [batch, k, num_labels])."""
    h = Dropout(self.config.dropout_rate, self.config.dropout_per_hash)(
        pooled_output, deterministic=deterministic)
    return classifier(self.config, self.num_labels)(h)


class TokenTagging(nn.Module):
  """Per-token classifier (NER): dropout, Dense(N) on every position of the sequence output."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, sequence_output: jax.Array, *, deterministic: bool) -> jax.Array:
    """[batch, seq, hidden] -> float32 logits [batch, seq, num_labels]."""
    h = Dropout(self.config.dropout_rate, self.config.dropout_per_hash)(
        sequence_output, deterministic=deterministic)
    return classifier(self.config, self.num_labels)(h)


class Span(nn.Module):
  """Answer-span head (SQuAD): Dense(2) on every position gives start and end logits."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[batch, seq, hidden] -> (start_logits, end_logits), each float32 [batch, seq]."""
    logits = classifier(self.config, 2)(sequence_output)  # [batch, seq, 2]
    return logits[..., 0], logits[..., 1]


class MultipleChoice(nn.Module):
  """Choice scorer (SWAG): dropout, Dense(1) on each choice's pooled output."""
  config: BertConfig

  @nn.compact
  def __call__(self, pooled_output: jax.Array, *, deterministic: bool) -> jax.Array:
    """[batch, num_choices, hidden] -> float32 logits [batch, num_choices]."""
    h = Dropout(self.config.dropout_rate, self.config.dropout_per_hash)(
        pooled_output, deterministic=deterministic)
    return classifier(self.config, 1)(h)[..., 0]


def encode(model: nn.Module, input_ids: jax.Array, segment_ids: jax.Array,
           input_mask: jax.Array, *, use_pooler: bool = True, token_head: bool = False,
           deterministic: bool, **packing: jax.Array | None) -> bert.BertOutput:
  """A fine-tuning model's encoder ('bert') on its inputs, then, with `model.bilstm_on_top`,
  the BiLSTM ('bilstm', `bilstm.on_top`: its outputs and final states in place of the last
  layer and the pooler). Called in the model's compact __call__, which owns both.

  Args:
    model: a BertFor* fine-tuning model (its config and bilstm_on_top).
    input_ids, segment_ids, input_mask: [batch, seq] int32.
    use_pooler: the head reads pooled_output.
    token_head: a per-token head reads sequence_output (ModernBERT's shared head then runs on
      every token, as transformers' token-level ModernBERT models).
    deterministic: no dropout when True.
    packing: position_ids, sequence_ids, cls_positions of a packed batch (None: unpacked).
  Raises:
    ValueError: a packed batch with bilstm_on_top (one LSTM would run across its sequences).
  """
  packed = {k: v for k, v in packing.items() if v is not None}
  if model.bilstm_on_top and packed:
    raise ValueError("bilstm_on_top runs one LSTM over each row, across packed sequences; "
                     "give it unpacked batches.")
  if model.bilstm_on_top and model.config.is_modernbert:
    raise ValueError("bilstm_on_top is the paper's BERT ablation (Table 5); ModernBERT has no "
                     "such model. Set model.bilstm_on_top=false.")
  out = make_encoder(model.config, use_pooler=use_pooler and not model.bilstm_on_top,
                     token_head=token_head)(input_ids, segment_ids, input_mask, **packed,
                                            deterministic=deterministic)
  return bilstm.on_top(model.config, out, input_mask) if model.bilstm_on_top else out


class BertForSequenceClassification(nn.Module):
  """BertEncoder ('bert') + SequenceClassification ('sequence_classification'): GLUE."""
  batch_keys = INPUT_KEYS
  packing_keys = PACKING_KEYS
  config: BertConfig
  num_labels: int
  bilstm_on_top: bool = False  # the paper's "+ BiLSTM" (module docstring)

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
               position_ids: jax.Array | None = None, sequence_ids: jax.Array | None = None,
               cls_positions: jax.Array | None = None, deterministic: bool) -> jax.Array:
    """[batch, seq] int32 inputs (as BertForPreTraining, packed or not) -> float32 logits
    [batch, num_labels], or [batch, k, num_labels] with cls_positions (one row per sequence)."""
    out = encode(self, input_ids, segment_ids, input_mask, position_ids=position_ids,
                 sequence_ids=sequence_ids, cls_positions=cls_positions,
                 deterministic=deterministic)
    return SequenceClassification(self.config, self.num_labels, name="sequence_classification")(
        out.pooled_output, deterministic=deterministic)


class BertForTokenClassification(nn.Module):
  """BertEncoder without pooler ('bert') + TokenTagging ('token_tagging'): NER."""
  batch_keys = INPUT_KEYS
  config: BertConfig
  num_labels: int
  bilstm_on_top: bool = False  # the paper's "+ BiLSTM" (module docstring)

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
               deterministic: bool) -> jax.Array:
    """[batch, seq] int32 inputs -> float32 logits [batch, seq, num_labels]."""
    out = encode(self, input_ids, segment_ids, input_mask, use_pooler=False, token_head=True,
                 deterministic=deterministic)
    return TokenTagging(self.config, self.num_labels, name="token_tagging")(
        out.sequence_output, deterministic=deterministic)


class BertForQuestionAnswering(nn.Module):
  """BertEncoder without pooler ('bert') + Span ('span'): SQuAD."""
  batch_keys = INPUT_KEYS
  config: BertConfig
  bilstm_on_top: bool = False  # the paper's "+ BiLSTM" (module docstring)

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
               deterministic: bool) -> tuple[jax.Array, jax.Array]:
    """[batch, seq] int32 inputs -> (start_logits, end_logits), each float32 [batch, seq]."""
    out = encode(self, input_ids, segment_ids, input_mask, use_pooler=False, token_head=True,
                 deterministic=deterministic)
    return Span(self.config, name="span")(out.sequence_output)


class BertForMultipleChoice(nn.Module):
  """BertEncoder ('bert') + MultipleChoice ('multiple_choice'): SWAG.

  Each choice is one [CLS] context [SEP] ending [SEP] sequence; the choices of an example are
  encoded as separate sequences and scored against each other.
  """
  batch_keys = INPUT_KEYS
  config: BertConfig
  bilstm_on_top: bool = False  # the paper's "+ BiLSTM" (module docstring)

  @nn.compact
  def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
               deterministic: bool) -> jax.Array:
    """[batch, num_choices, seq] int32 inputs -> float32 logits [batch, num_choices]."""
    batch, num_choices, seq = input_ids.shape
    flat = lambda x: x.reshape(batch * num_choices, seq)  # one row per choice
    out = encode(self, flat(input_ids), flat(segment_ids), flat(input_mask),
                 deterministic=deterministic)
    pooled = out.pooled_output.reshape(batch, num_choices, -1)
    return MultipleChoice(self.config, name="multiple_choice")(
        pooled, deterministic=deterministic)
