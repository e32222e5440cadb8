"""The tables of rules between Hugging Face transformers' names and bertjax's parameter paths:
BERT's and ModernBERT's, one `Table` each, chosen by the architecture (config.json's model_type,
`BertConfig.architecture`; `table_of`).

Each rule pairs one Hugging Face tensor name with one bertjax parameter path, or a tuple of paths
(`{i}` stands for a layer index), and names the transform between them (TRANSFORMS), a pair of
functions each the other's inverse, so the one table converts both ways (`bertjax.convert.hf`
applies it):

  'copy'       the same array: embedding tables [rows, H], biases, LayerNorm weight <-> scale
  'transpose'  a torch `nn.Linear.weight` [out, in] <-> a Flax Dense kernel [in, out]
  'split_qkv'  ModernBERT's fused `attn.Wqkv.weight` [3H, H] (rows: query, key, value) <-> the
               three kernels [H, H] of bertjax's query, key and value, each the transpose of
               its third
  'geglu'      ModernBERT's `mlp.Wi.weight` [2F, H] (rows: the GELU input, then the gate) <->
               bertjax's `feed_forward/intermediate` [H, 2, F]: reshape(2, F, H), axes (2, 0, 1)

All are transposes, slices and reshapes, so a round trip gives the same bytes. bertjax's q/k/v
and attention-output kernels are plain [H, H] matrices whose output axis is the flattened
(num_heads, head_dim), exactly the row order of Hugging Face's Linear weights (and of each third
of Wqkv), so no per-head reshape is needed.

Beside the rules, each table holds the task heads of Hugging Face's fine-tuned classes
(`Table.task_heads`; BERT's are TASK_HEADS), the groups of parameters a checkpoint may lack, the
encoder's name prefix, and the names that are no weights (the tied decoder, buffers).
`bertjax.convert.tf` reads Google's names with the same `{i}` templates.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

import flax.linen as nn
import numpy as np

from bertjax.models import heads
from bertjax.models.config import BertConfig

# (Hugging Face name without the 'bert.' prefix of the encoder, bertjax path, transform).
RULES: tuple[tuple[str, str, str], ...] = (
    ("embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings/embedding", "copy"),
    ("embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings/embedding",
     "copy"),
    ("embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings/embedding",
     "copy"),
    ("embeddings.LayerNorm.weight", "bert/embeddings/layer_norm/scale", "copy"),
    ("embeddings.LayerNorm.bias", "bert/embeddings/layer_norm/bias", "copy"),
    *((f"encoder.layer.{{i}}.attention.self.{p}.weight",
       f"bert/encoder/layer_{{i}}/attention/{p}/kernel", "transpose") for p in ("query", "key",
                                                                                "value")),
    *((f"encoder.layer.{{i}}.attention.self.{p}.bias",
       f"bert/encoder/layer_{{i}}/attention/{p}/bias", "copy") for p in ("query", "key", "value")),
    ("encoder.layer.{i}.attention.output.dense.weight",
     "bert/encoder/layer_{i}/attention/output/kernel", "transpose"),
    ("encoder.layer.{i}.attention.output.dense.bias",
     "bert/encoder/layer_{i}/attention/output/bias", "copy"),
    ("encoder.layer.{i}.attention.output.LayerNorm.weight",
     "bert/encoder/layer_{i}/attention_layer_norm/scale", "copy"),
    ("encoder.layer.{i}.attention.output.LayerNorm.bias",
     "bert/encoder/layer_{i}/attention_layer_norm/bias", "copy"),
    ("encoder.layer.{i}.intermediate.dense.weight",
     "bert/encoder/layer_{i}/feed_forward/intermediate/kernel", "transpose"),
    ("encoder.layer.{i}.intermediate.dense.bias",
     "bert/encoder/layer_{i}/feed_forward/intermediate/bias", "copy"),
    ("encoder.layer.{i}.output.dense.weight",
     "bert/encoder/layer_{i}/feed_forward/output/kernel", "transpose"),
    ("encoder.layer.{i}.output.dense.bias",
     "bert/encoder/layer_{i}/feed_forward/output/bias", "copy"),
    ("encoder.layer.{i}.output.LayerNorm.weight",
     "bert/encoder/layer_{i}/output_layer_norm/scale", "copy"),
    ("encoder.layer.{i}.output.LayerNorm.bias",
     "bert/encoder/layer_{i}/output_layer_norm/bias", "copy"),
    ("pooler.dense.weight", "bert/pooler/dense/kernel", "transpose"),
    ("pooler.dense.bias", "bert/pooler/dense/bias", "copy"),
    ("cls.predictions.transform.dense.weight", "masked_lm/transform/kernel", "transpose"),
    ("cls.predictions.transform.dense.bias", "masked_lm/transform/bias", "copy"),
    ("cls.predictions.transform.LayerNorm.weight", "masked_lm/layer_norm/scale", "copy"),
    ("cls.predictions.transform.LayerNorm.bias", "masked_lm/layer_norm/bias", "copy"),
    ("cls.predictions.bias", "masked_lm/output_bias", "copy"),
    ("cls.seq_relationship.weight", "next_sentence/classifier/kernel", "transpose"),
    ("cls.seq_relationship.bias", "next_sentence/classifier/bias", "copy"),
)
# Hugging Face names of the rules above that carry the 'bert.' prefix in a model with heads.
ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")

# ModernBERT (transformers' ModernBert* classes; parameter tree in `bertjax.models.modernbert`):
# no biases but the MLM decoder's and the classifiers', no attn_norm in layer 0 (the template
# matches the layers that have one), the prediction head shared by every task under bert/head.
MODERNBERT_RULES: tuple[tuple[str, str | tuple[str, ...], str], ...] = (
    ("embeddings.tok_embeddings.weight", "bert/embeddings/word_embeddings/embedding", "copy"),
    ("embeddings.norm.weight", "bert/embeddings/layer_norm/scale", "copy"),
    ("layers.{i}.attn_norm.weight", "bert/encoder/layer_{i}/attention_layer_norm/scale", "copy"),
    ("layers.{i}.attn.Wqkv.weight",
     tuple(f"bert/encoder/layer_{{i}}/attention/{p}/kernel" for p in ("query", "key", "value")),
     "split_qkv"),
    ("layers.{i}.attn.Wo.weight", "bert/encoder/layer_{i}/attention/output/kernel", "transpose"),
    ("layers.{i}.mlp_norm.weight", "bert/encoder/layer_{i}/feed_forward_layer_norm/scale",
     "copy"),
    ("layers.{i}.mlp.Wi.weight", "bert/encoder/layer_{i}/feed_forward/intermediate", "geglu"),
    ("layers.{i}.mlp.Wo.weight", "bert/encoder/layer_{i}/feed_forward/output/kernel",
     "transpose"),
    ("final_norm.weight", "bert/final_layer_norm/scale", "copy"),
    ("head.dense.weight", "bert/head/dense/kernel", "transpose"),
    ("head.norm.weight", "bert/head/layer_norm/scale", "copy"),
    ("decoder.bias", "masked_lm/output_bias", "copy"),
)


@dataclasses.dataclass(frozen=True)
class Transform:
  """Hugging Face tensor -> bertjax arrays (a tuple, one per path of the rule), and back."""
  to_bertjax: Callable[[np.ndarray], tuple[np.ndarray, ...]]
  to_hf: Callable[..., np.ndarray]


def _geglu_to_hf(x: np.ndarray) -> np.ndarray:
  hidden, _, width = x.shape  # [H, 2, F] -> [2, F, H] -> [2F, H]
  return x.transpose(1, 2, 0).reshape(2 * width, hidden)


TRANSFORMS: dict[str, Transform] = {
    "copy": Transform(lambda x: (x,), lambda x: x),
    "transpose": Transform(lambda x: (x.T,), lambda x: x.T),
    # [3H, H] -> three [H, H] row blocks, each transposed; back: stacked rows of the transposes
    "split_qkv": Transform(lambda x: tuple(part.T for part in np.split(x, 3, axis=0)),
                           lambda q, k, v: np.concatenate([q.T, k.T, v.T], axis=0)),
    # [2F, H] -> [2, F, H] -> [H, 2, F]
    "geglu": Transform(lambda x: (x.reshape(2, x.shape[0] // 2, x.shape[1]).transpose(2, 0, 1),),
                       _geglu_to_hf),
}


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """A Hugging Face task class's head and bertjax's model for the same task.

  Attributes:
    hf_prefix: the head's tensor names in Hugging Face are `{hf_prefix}.weight` / `.bias`.
    name: the head's name in bertjax's parameter tree (`{name}/classifier/kernel`, `/bias`).
    model: builds the bertjax model, given (BertConfig, num_labels).
    labelled: the head has one output per label (config.json's num_labels); the others have a
      fixed width (2 for span start/end, 1 for a choice's score).
    choices: the model takes [batch, num_choices, seq] inputs (multiple choice).
  """
  hf_prefix: str
  name: str
  model: Callable[[BertConfig, int], nn.Module]
  labelled: bool = True
  choices: bool = False

  def rules(self) -> tuple[tuple[str, str, str], ...]:
    return ((f"{self.hf_prefix}.weight", f"{self.name}/classifier/kernel", "transpose"),
            (f"{self.hf_prefix}.bias", f"{self.name}/classifier/bias", "copy"))


# Hugging Face architecture -> its head in bertjax.
TASK_HEADS: dict[str, TaskHead] = {
    "BertForSequenceClassification": TaskHead(
        "classifier", "sequence_classification", heads.BertForSequenceClassification),
    "BertForTokenClassification": TaskHead(
        "classifier", "token_tagging", heads.BertForTokenClassification),
    "BertForQuestionAnswering": TaskHead(
        "qa_outputs", "span", lambda config, _: heads.BertForQuestionAnswering(config),
        labelled=False),
    "BertForMultipleChoice": TaskHead(
        "classifier", "multiple_choice", lambda config, _: heads.BertForMultipleChoice(config),
        labelled=False, choices=True),
}

# ModernBERT's: the same heads, every one `classifier.*` (after the shared head under bert/head).
MODERNBERT_TASK_HEADS: dict[str, TaskHead] = {
    "Modern" + name: dataclasses.replace(head, hf_prefix="classifier")
    for name, head in TASK_HEADS.items()}

# Parameter groups of bertjax's BertForPreTraining, by path prefix. The encoder core is required;
# the others are converted when the checkpoint has them, whole, and reported missing otherwise.
REQUIRED_GROUP = "bert/embeddings+encoder"
OPTIONAL_GROUPS = ("bert/pooler/", "masked_lm/", "next_sentence/")
# The tied decoder (checked against its source, then ignored).
DECODER_WEIGHT = "cls.predictions.decoder.weight"
DECODER_BIAS = "cls.predictions.decoder.bias"
# Buffers, not weights.
IGNORED = re.compile(r"^(bert\.)?embeddings\.(position_ids|token_type_ids)$")
# Tensors of some task head, to name when config.json does not say which head they are.
TASK_HEAD_TENSOR = re.compile(r"^(classifier|qa_outputs)\.")


@dataclasses.dataclass(frozen=True)
class Table:
  """One architecture's conversion: its rules and what surrounds them.

  Attributes:
    architecture: `BertConfig.architecture` and config.json's model_type.
    rules: (Hugging Face name without the encoder prefix, bertjax path or paths, transform).
    task_heads: Hugging Face task architecture -> its head in bertjax.
    encoder_prefix: the encoder's names carry it in a model with heads ('bert.', 'model.').
    encoder_names: the rule names that take encoder_prefix.
    optional_groups: parameter groups a checkpoint may lack (converted whole or not at all).
    decoder_weight: the tied decoder's name (checked against the word embeddings, ignored).
    decoder_bias: a tied copy of the MLM bias (checked, ignored), or None.
    ignored: buffers, not weights, or None.
    task_head_tensor: names of some task head, to name when config.json names no task.
    pretraining: bertjax's model whose parameters, with a task head's, are all there is.
    masked_lm, bare: the Hugging Face classes written for a masked LM and for an encoder alone.
    prefix_bare: whether an encoder alone is written with encoder_prefix (ModernBertModel's own
      save_pretrained writes it without).
    description: the classes the table reads, for error messages.
  """
  architecture: str
  rules: tuple[tuple[str, str | tuple[str, ...], str], ...]
  task_heads: dict[str, TaskHead]
  encoder_prefix: str
  encoder_names: tuple[str, ...]
  optional_groups: tuple[str, ...]
  decoder_weight: str
  decoder_bias: str | None
  ignored: re.Pattern | None
  task_head_tensor: re.Pattern
  pretraining: Callable[[BertConfig], nn.Module]
  masked_lm: str
  bare: str
  prefix_bare: bool
  description: str


BERT = Table(
    "bert", RULES, TASK_HEADS, "bert.", ENCODER_PREFIXES, OPTIONAL_GROUPS, DECODER_WEIGHT,
    DECODER_BIAS, IGNORED, TASK_HEAD_TENSOR, heads.BertForPreTraining, "BertForMaskedLM",
    "BertModel", prefix_bare=True,
    description="a BERT (BertModel, BertForPreTraining, BertForMaskedLM or a BERT task model)")
MODERNBERT = Table(
    "modernbert", MODERNBERT_RULES, MODERNBERT_TASK_HEADS, "model.",
    ("embeddings.", "layers.", "final_norm."), ("bert/head/", "masked_lm/"), "decoder.weight",
    None, None, re.compile(r"^classifier\."),
    lambda config: heads.BertForPreTraining(config, next_sentence=False),
    "ModernBertForMaskedLM", "ModernBertModel", prefix_bare=False,
    description="a ModernBERT (ModernBertModel, ModernBertForMaskedLM or a ModernBERT task "
    "model)")
TABLES = {table.architecture: table for table in (BERT, MODERNBERT)}


def table_of(config: BertConfig | None) -> Table:
  """The table of `config.architecture` (BERT's for None)."""
  return BERT if config is None else TABLES[config.architecture]


def template_regex(template: str) -> re.Pattern:
  """The regex of a rule's name template: `{i}` matches a layer index (group "i")."""
  return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$")


def rules_of(task: str | None, table: Table = BERT) -> tuple[tuple[str, tuple[str, ...], str],
                                                               ...]:
  """The table's rules, plus those of `task`'s head (a key of its task_heads) when given; each
  rule's bertjax side as a tuple of paths."""
  rules = table.rules + (table.task_heads[task].rules() if task else ())
  return tuple((hf, (bj,) if isinstance(bj, str) else bj, t) for hf, bj, t in rules)


def hf_patterns(task: str | None,
                table: Table = BERT) -> list[tuple[re.Pattern, tuple[str, ...], str]]:
  """(regex of a Hugging Face name, bertjax path templates, transform) of each rule."""
  return [(template_regex(hf), bj, t) for hf, bj, t in rules_of(task, table)]


def bj_patterns(task: str | None,
                table: Table = BERT) -> list[tuple[re.Pattern, str, str, int, int]]:
  """(regex of a bertjax path, Hugging Face name template, transform, the path's place among
  the rule's paths, their number) of each path of each rule."""
  return [(template_regex(path), hf, t, j, len(bj)) for hf, bj, t in rules_of(task, table)
          for j, path in enumerate(bj)]


def fill(template: str, match: re.Match) -> str:
  """The template with `{i}` replaced by the layer index `match` found."""
  return template.replace("{i}", match.group("i")) if "{i}" in template else template


def group_of(path: str, task: str | None, table: Table = BERT) -> str:
  """The group of a bertjax parameter path: one of the table's optional groups, `task`'s head's
  name + "/", or REQUIRED_GROUP (the encoder core)."""
  groups = table.optional_groups + ((table.task_heads[task].name + "/",) if task else ())
  return next((g for g in groups if path.startswith(g)), REQUIRED_GROUP)


def hf_rule(name: str, patterns: list[tuple[re.Pattern, tuple[str, ...], str]],
            table: Table = BERT) -> tuple[tuple[str, ...], str] | None:
  """(bertjax paths, transform) for a Hugging Face name (with or without the table's encoder
  prefix), or None when no rule matches."""
  prefix = table.encoder_prefix
  short = name[len(prefix):] if name.startswith(prefix) else name
  for pattern, paths, transform in patterns:
    match = pattern.match(short)
    if match:
      return tuple(fill(path, match) for path in paths), transform
  return None
