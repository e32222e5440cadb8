"""The table of rules between Hugging Face transformers' BERT names and bertjax's parameter paths.

Each rule pairs one Hugging Face tensor name with one bertjax parameter path (`{i}` stands for a
layer index) and names the transform between them:

  'transpose'  a torch `nn.Linear.weight` [out, in] <-> a Flax Dense kernel [in, out]
  'copy'       the same array: embedding tables [rows, H], biases, LayerNorm weight <-> scale

Both transforms are their own inverse, so the one table converts both ways
(`bertjax.convert.hf` applies it). bertjax's q/k/v and attention-output kernels are plain
[H, H] matrices whose output axis is the flattened (num_heads, head_dim), exactly the row order
of Hugging Face's Linear weights, so they need only the transpose (no per-head reshape).

Beside the rules: the task heads of Hugging Face's fine-tuned classes (TASK_HEADS), the groups
of parameters a checkpoint may lack (OPTIONAL_GROUPS), and the names that are no weights (the
tied decoder, buffers). `bertjax.convert.tf` reads Google's names with the same `{i}` templates.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

import flax.linen as nn

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
TRANSFORMS = {"copy": lambda x: x, "transpose": lambda x: x.T}
# Hugging Face names of the rules above that carry the 'bert.' prefix in a model with heads.
ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")


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


def template_regex(template: str) -> re.Pattern:
  """The regex of a rule's name template: `{i}` matches a layer index (group "i")."""
  return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$")


def rules_of(task: str | None) -> tuple[tuple[str, str, str], ...]:
  """RULES, plus the rules of `task`'s head (an architecture in TASK_HEADS) when given."""
  return RULES + (TASK_HEADS[task].rules() if task else ())


def hf_patterns(task: str | None) -> list[tuple[re.Pattern, str, str]]:
  """(regex of a Hugging Face name, bertjax path template, transform) of each rule."""
  return [(template_regex(hf), bj, t) for hf, bj, t in rules_of(task)]


def bj_patterns(task: str | None) -> list[tuple[re.Pattern, str, str]]:
  """(regex of a bertjax path, Hugging Face name template, transform) of each rule."""
  return [(template_regex(bj), hf, t) for hf, bj, t in rules_of(task)]


def fill(template: str, match: re.Match) -> str:
  """The template with `{i}` replaced by the layer index `match` found."""
  return template.replace("{i}", match.group("i")) if "{i}" in template else template


def group_of(path: str, task: str | None) -> str:
  """The group of a bertjax parameter path: one of OPTIONAL_GROUPS, `task`'s head's name + "/",
  or REQUIRED_GROUP (the encoder core)."""
  groups = OPTIONAL_GROUPS + ((TASK_HEADS[task].name + "/",) if task else ())
  return next((g for g in groups if path.startswith(g)), REQUIRED_GROUP)


def hf_rule(name: str, patterns: list[tuple[re.Pattern, str, str]]) -> tuple[str, str] | None:
  """(bertjax path, transform) for a Hugging Face name, or None when no rule matches."""
  short = name[len("bert."):] if name.startswith("bert.") else name
  for pattern, path, transform in patterns:
    match = pattern.match(short)
    if match:
      return fill(path, match), transform
  return None
