"""Hugging Face transformers BERT <-> bertjax weights, by a table of rules.

Each rule pairs one Hugging Face tensor name with one bertjax parameter path (`{i}` stands for a
layer index) and names the transform between them:

  'transpose'  a torch `nn.Linear.weight` [out, in] <-> a Flax Dense kernel [in, out]
  'copy'       the same array: embedding tables [rows, H], biases, LayerNorm weight <-> scale

Both transforms are their own inverse, so the one table converts both ways. bertjax's q/k/v
and attention-output kernels are plain [H, H] matrices whose output axis is the flattened
(num_heads, head_dim), exactly the row order of Hugging Face's Linear weights, so they need only
the transpose (no per-head reshape).

What is converted (`from_hf`):
  - the encoder (`bert.` prefixed names, or prefix-less as a bare `BertModel` saves them);
  - the pooler, the masked-LM head (`cls.predictions.*`) and the next-sentence head
    (`cls.seq_relationship.*`) when the checkpoint has them. Each of these groups must be whole
    or absent; an absent group is reported `missing` and left out of the parameters, so that
    `bertjax.training.init_params.load_params` leaves it freshly initialised (BertForMaskedLM has no
    pooler and no NSP head; BertModel has no heads).
  - the MLM decoder is tied to the word embeddings in bertjax; a checkpoint that stores
    `cls.predictions.decoder.weight` (older ones do) must hold a copy of the word embeddings
    (checked, then ignored), and `cls.predictions.decoder.bias` a copy of
    `cls.predictions.bias`; an untied decoder is a UserError.
  - the task head of a Hugging Face fine-tuned model (TASK_HEADS): `classifier.*` of
    BertForSequenceClassification, BertForTokenClassification and BertForMultipleChoice, and
    `qa_outputs.*` of BertForQuestionAnswering, to the head of bertjax's model of the same name
    (`bertjax.models.heads`). Which head `classifier.*` is comes from config.json's
    `architectures`, its number of labels from `id2label` (or `num_labels`). The pretraining
    heads such a checkpoint lacks are reported `missing`, as above.
  - the `position_ids` / `token_type_ids` buffers some checkpoints carry are ignored.
  - the vocabulary axis: Hugging Face stores vocab_size rows of the word embeddings and of the
    MLM bias; bertjax's have padded_vocab_size rows (BertConfig.pad_vocab_to_multiple), so
    `from_hf` appends zero rows and `to_hf` keeps the first vocab_size rows: a checkpoint
    round-trips exactly, and config.json keeps the real vocab_size.
Any other tensor, any encoder parameter left unfilled, a group filled only in part, and any shape
mismatch raise one UserError that names each of them.

`to_hf` writes the names of BertForPreTraining (`bert.*`, `cls.*`) and of the task head the
parameters hold, if any; the tied decoder is not written, since transformers ties it to the word
embeddings on load (`tie_word_embeddings`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax import model_files
from bertjax.training import init_params
from bertjax.errors import UserError
from bertjax.models import bilstm, heads
from bertjax.models.bert import BertConfig

_MAX_LISTED = 8  # problems named in one error message

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
_TRANSFORMS = {"copy": lambda x: x, "transpose": lambda x: x.T}
# Hugging Face names of the rules above that carry the 'bert.' prefix in a model with heads.
_ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")


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
_DECODER_WEIGHT = "cls.predictions.decoder.weight"
_DECODER_BIAS = "cls.predictions.decoder.bias"
# Buffers, not weights.
_IGNORED = re.compile(r"^(bert\.)?embeddings\.(position_ids|token_type_ids)$")
# Tensors of some task head, to name when config.json does not say which head they are.
_TASK_HEAD_TENSOR = re.compile(r"^(classifier|qa_outputs)\.")


@dataclasses.dataclass(frozen=True)
class ConversionReport:
  """What `from_hf` did.

  Attributes:
    loaded: bertjax parameter paths filled from the checkpoint.
    missing: bertjax parameter paths the checkpoint lacks (a whole pooler or head); they are left
      out of the converted parameters and come out freshly initialised when loaded.
    ignored: Hugging Face buffers and tied copies, checked where they carry weights.
    task: the Hugging Face architecture whose task head was converted, or None.
  """
  loaded: list[str]
  missing: list[str]
  ignored: list[str]
  task: str | None = None


def _template_regex(template: str) -> re.Pattern:
  return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$")


def _rules(task: str | None) -> tuple[tuple[str, str, str], ...]:
  """RULES, plus the rules of `task`'s head (an architecture in TASK_HEADS) when given."""
  return RULES + (TASK_HEADS[task].rules() if task else ())


def _hf_patterns(task: str | None) -> list[tuple[re.Pattern, str, str]]:
  return [(_template_regex(hf), bj, t) for hf, bj, t in _rules(task)]


def _bj_patterns(task: str | None) -> list[tuple[re.Pattern, str, str]]:
  return [(_template_regex(bj), hf, t) for hf, bj, t in _rules(task)]


def _fill(template: str, match: re.Match) -> str:
  return template.replace("{i}", match.group("i")) if "{i}" in template else template


def _listing(problems: list[str]) -> str:
  more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
  return "; ".join(problems[:_MAX_LISTED]) + more


# --- the conversion -----------------------------------------------------------------------------

def _shapes(model: nn.Module, ids: jax.Array) -> dict[str, tuple[int, ...]]:
  tree = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), ids, ids, ids, deterministic=True))
  flat = traverse_util.flatten_dict(nn.unbox(tree)["params"], sep="/")
  return {path: tuple(x.shape) for path, x in flat.items()}


def expected_shapes(config: BertConfig, task: str | None = None,
                    num_labels: int = 2) -> dict[str, tuple[int, ...]]:
  """{path: shape} of every parameter of bertjax's BertForPreTraining, plus those of the head of
  `task` (an architecture in TASK_HEADS) with `num_labels` when given (no arrays built). The
  vocabulary-axis parameters (init_params.VOCAB_ROW_PARAMS) have padded_vocab_size rows."""
  shapes = _shapes(heads.BertForPreTraining(config), jnp.zeros((1, 2), jnp.int32))
  if task:
    head = TASK_HEADS[task]
    ids = jnp.zeros((1, 2, 2) if head.choices else (1, 2), jnp.int32)
    shapes.update(_shapes(head.model(config, num_labels), ids))
  return shapes


def _group(path: str, task: str | None) -> str:
  groups = OPTIONAL_GROUPS + ((TASK_HEADS[task].name + "/",) if task else ())
  return next((g for g in groups if path.startswith(g)), REQUIRED_GROUP)


def _hf_shape(path: str, shape: tuple[int, ...], config: BertConfig) -> tuple[int, ...]:
  """The shape that a bertjax parameter of `shape` has in Hugging Face's layout, before the
  transpose: the vocabulary-axis parameters have vocab_size rows there, not padded_vocab_size."""
  return (config.vocab_size,) + shape[1:] if path in init_params.VOCAB_ROW_PARAMS else shape


def _hf_rule(name: str, patterns: list[tuple[re.Pattern, str, str]]) -> tuple[str, str] | None:
  """(bertjax path, transform) for a Hugging Face name, or None when no rule matches."""
  short = name[len("bert."):] if name.startswith("bert.") else name
  for pattern, path, transform in patterns:
    match = pattern.match(short)
    if match:
      return _fill(path, match), transform
  return None


def from_hf(state_dict: dict[str, np.ndarray], config: BertConfig, task: str | None = None,
            num_labels: int = 2) -> tuple[dict[str, Any], ConversionReport]:
  """Converts Hugging Face BERT weights to bertjax parameters.

  Args:
    state_dict: {Hugging Face name: array}, e.g. from `hf_files.load_hf_state_dict`; names of
      BertModel (prefix-less or 'bert.'), BertForPreTraining, BertForMaskedLM, or a task model.
      Old names 'LayerNorm.gamma' / 'LayerNorm.beta' are read as 'weight' / 'bias'.
    config: the model's BertConfig (`hf_files.hf_config_to_bert_config`).
    task: for a task model, its architecture (a key of TASK_HEADS; `hf_files.hf_task` reads it
      from config.json), whose head is converted too; None for the others.
    num_labels: the task head's number of labels (`hf_files.hf_task`).
  Returns:
    (params: nested dict of float32 numpy arrays in the layout of BertForPreTraining's "params"
     plus the task head, without the groups the checkpoint lacks, the word embeddings and the
     MLM bias padded with zero rows to padded_vocab_size; report).
  Raises:
    UserError: naming every unmapped tensor, shape mismatch, unfilled encoder parameter, partly
      filled group, and untied decoder.
  """
  if task is not None and task not in TASK_HEADS:
    raise ValueError(f"task must be one of {sorted(TASK_HEADS)}, not {task!r}")
  expected = expected_shapes(config, task, num_labels)
  patterns = _hf_patterns(task)
  problems: list[str] = []
  flat: dict[str, np.ndarray] = {}
  sources: dict[str, str] = {}
  ignored, tied = [], {}
  normals = {re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                    re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)): name
             for name in state_dict}
  if _DECODER_BIAS in normals and "cls.predictions.bias" not in normals:
    # Some checkpoints keep only the decoder's (tied) copy of the output bias: read it as such.
    normals["cls.predictions.bias"] = normals.pop(_DECODER_BIAS)
  for normal, name in sorted(normals.items()):
    array = np.asarray(state_dict[name])
    if _IGNORED.match(normal):
      ignored.append(name)
      continue
    if normal in (_DECODER_WEIGHT, _DECODER_BIAS):
      tied[normal] = (name, array)
      ignored.append(name)
      continue
    rule = _hf_rule(normal, patterns)
    if rule is None and _TASK_HEAD_TENSOR.match(normal):
      problems.append(f"{name} {array.shape} belongs to a task head, but config.json's "
                      "architectures does not name one of " + ", ".join(TASK_HEADS))
      continue
    if rule is None:
      problems.append(f"{name} {array.shape} matches no rule")
      continue
    path, transform = rule
    if path not in expected:
      problems.append(f"{name} maps to {path}, which the model does not have (is "
                      f"num_layers={config.num_layers} right?)")
      continue
    if path in flat:
      problems.append(f"{name} and {sources[path]} both map to {path}")
      continue
    value = _TRANSFORMS[transform](array).astype(np.float32)
    wanted = _hf_shape(path, expected[path], config)  # padded below, once all is checked
    if value.shape != wanted:
      problems.append(f"{name} {array.shape} -> {path} {value.shape} ({transform}), the model "
                      f"expects {wanted}")
      continue
    flat[path], sources[path] = np.ascontiguousarray(value), name

  missing = []
  unfilled = sorted(set(expected) - set(flat))
  for path in unfilled:
    group = _group(path, task)
    if group == REQUIRED_GROUP:
      problems.append(f"{path} {expected[path]} is not in the checkpoint")
    elif any(p.startswith(group) for p in flat):
      problems.append(f"{path} {expected[path]} is not in the checkpoint, though other "
                      f"parameters of {group} are")
    else:
      missing.append(path)

  # The tied decoder: a stored copy must equal what bertjax ties it to.
  word = flat.get("bert/embeddings/word_embeddings/embedding")
  if _DECODER_WEIGHT in tied and word is not None:
    name, array = tied[_DECODER_WEIGHT]
    if array.shape != word.shape or not np.array_equal(array, word):
      problems.append(f"{name} differs from the word embeddings; bertjax ties the MLM decoder to "
                      "them, so an untied decoder cannot be converted")
  if _DECODER_BIAS in tied:
    name, array = tied[_DECODER_BIAS]
    bias = flat.get("masked_lm/output_bias")
    if bias is None or array.shape != bias.shape or not np.array_equal(array, bias):
      problems.append(f"{name} differs from cls.predictions.bias; they must be one tied bias")

  if problems:
    raise UserError(
        f"cannot convert the Hugging Face checkpoint ({len(problems)} problems): "
        f"{_listing(problems)}. Check that config.json belongs to these weights and that they "
        "are a BERT (BertModel, BertForPreTraining, BertForMaskedLM or a BERT task model).")
  for path in init_params.VOCAB_ROW_PARAMS:
    if path in flat:  # [vocab_size, ...] -> [padded_vocab_size, ...], zero padding rows
      flat[path] = init_params.vocab_rows(flat[path], config.vocab_size, expected[path][0])
  report = ConversionReport(loaded=sorted(flat), missing=missing, ignored=ignored, task=task)
  return traverse_util.unflatten_dict(flat, sep="/"), report


def params_task(params: dict[str, Any]) -> tuple[str | None, int]:
  """(the architecture in TASK_HEADS whose head `params` holds, or None; its num_labels).

  Raises:
    UserError: the parameters hold more than one task head (a Hugging Face model has one).
  """
  found = [task for task, head in TASK_HEADS.items() if head.name in params]
  if len(found) > 1:
    raise UserError(f"the parameters hold the heads of {found}; a Hugging Face model has one "
                    "task head, so convert a checkpoint with one.")
  if not found:
    return None, 2
  kernel = params[TASK_HEADS[found[0]].name].get("classifier", {}).get("kernel")
  return found[0], (2 if kernel is None else int(np.shape(kernel)[-1]))


def refuse_causal(config: BertConfig) -> None:
  """UserError for a causal model (BertConfig.causal, pretraining.objective=ltr): the classes
  this converter writes attend in both directions and pool [CLS], and Google's BERT has no
  causal mask either, so its weights would compute another function there."""
  if config.causal:
    raise UserError(
        "this model is causal (a left-to-right LM, pretrained with "
        "--config.pretraining.objective=ltr): each token attends only to those before it and "
        "the pooler reads the last token, while the Hugging Face BERT classes written here "
        "(BertForPreTraining, BertForMaskedLM, the task classes) and Google's BERT attend in "
        "both directions and pool [CLS], so the converted weights would compute another "
        "function. It cannot be converted; fine-tune it in bertjax "
        "(--config.init_checkpoint=DIR), which keeps the causal mask.")


def refuse_bilstm(groups) -> None:
  """UserError for parameters with a BiLSTM between the encoder and the head (a top-level
  'bilstm' group: model.bilstm_on_top, or the feature-based tagger of configs/ner.py:
  feature_based): no Hugging Face BERT class has one, and its head alone on the encoder would
  compute another function."""
  if bilstm.NAME in groups:
    raise UserError(
        "this model has a BiLSTM between the encoder and its head (fine-tuned with "
        "--config.model.bilstm_on_top=true, or feature-based NER), which no Hugging Face BERT "
        "class has; without it the head would compute another function, so it cannot be "
        "converted. Convert the pretrained model it started from (its init_checkpoint) instead.")


def to_hf(params: dict[str, Any], config: BertConfig) -> dict[str, np.ndarray]:
  """bertjax parameters -> Hugging Face tensors of BertForPreTraining and the task head, if any.

  Args:
    params: nested dict ('bert', and any of 'masked_lm', 'next_sentence' and one task head), as
      `from_hf` or a train state holds them; the pooler and the heads may be absent (their
      tensors are then not written).
    config: the model's BertConfig.
  Returns:
    {name: float32 contiguous numpy array}: 'bert.*', 'cls.*' and the task head's names; no tied
    decoder. The word embeddings and the MLM bias keep their vocab_size real rows (the padding
    rows are dropped).
  Raises:
    UserError: a causal model (`refuse_causal`), a parameter no rule maps, a wrong shape, or a
      missing encoder parameter.
  """
  refuse_causal(config)
  refuse_bilstm(params)
  task, num_labels = params_task(params)
  expected = expected_shapes(config, task, num_labels)
  patterns = _bj_patterns(task)
  flat = traverse_util.flatten_dict(params, sep="/")
  problems, out = [], {}
  for path in sorted(flat):
    value = np.asarray(flat[path], np.float32)
    if path not in expected:
      problems.append(f"{path} {value.shape} is not a parameter of BertForPreTraining or of a "
                      "task head")
      continue
    if value.shape != expected[path]:
      problems.append(f"{path} {value.shape}, the config expects {expected[path]}")
      continue
    if path in init_params.VOCAB_ROW_PARAMS:  # [padded_vocab_size, ...] -> [vocab_size, ...]
      value = init_params.vocab_rows(value, config.vocab_size, config.vocab_size)
    for pattern, hf, transform in patterns:
      match = pattern.match(path)
      if match:
        name = _fill(hf, match)
        out["bert." + name if name.startswith(_ENCODER_PREFIXES) else name] = (
            np.ascontiguousarray(_TRANSFORMS[transform](value)))
        break
    else:  # every bertjax parameter has a rule; a test checks this
      problems.append(f"{path} matches no rule")
  for path in sorted(set(expected) - set(flat)):
    group = _group(path, task)
    if group == REQUIRED_GROUP or any(p.startswith(group) for p in flat):
      problems.append(f"{path} {expected[path]} is missing")
  if problems:
    raise UserError(f"cannot convert the bertjax parameters ({len(problems)} problems): "
                    f"{_listing(problems)}. Check that bert_config.json belongs to this "
                    "checkpoint.")
  return out


def hf_architecture(params: dict[str, Any]) -> str:
  """The transformers class whose names `to_hf(params)` writes, by the heads present.

  With a task head, that task's class (pretraining heads, if also present, are written too and
  transformers ignores them when it loads the task class).
  """
  task, _ = params_task(params)
  if task:
    return task
  has_mlm, has_nsp = "masked_lm" in params, "next_sentence" in params
  if has_mlm and has_nsp:
    return "BertForPreTraining"
  if has_mlm:
    return "BertForMaskedLM"
  if has_nsp:
    return "BertForNextSentencePrediction"
  return "BertModel"


# --- bertjax checkpoints on disk ----------------------------------------------------------------

def load_bertjax_checkpoint(directory: str) -> tuple[dict[str, Any], BertConfig]:
  """The parameters and BertConfig of a bertjax checkpoint directory with bert_config.json.

  Groups the checkpoint lacks (pooler, heads) are absent from the returned params; a task head
  it holds (TASK_HEADS) is read with the number of labels it was saved with. A checkpoint saved
  with other padding of the vocabulary axis (an unpadded one from before BertConfig had
  pad_vocab_to_multiple) is read with bert_config.json's padding (`init_params.load_params`).
  """
  config = model_files.load_bert_config(directory)
  saved = init_params.saved_param_shapes(directory)
  refuse_bilstm({path.split("/")[0] for path in saved})
  task, num_labels = None, 2
  for name, head in TASK_HEADS.items():
    kernel = saved.get(f"{head.name}/classifier/kernel")
    if kernel is not None:
      if task is not None:
        raise UserError(f"{directory} holds the heads of both {task} and {name}; a Hugging Face "
                        "model has one task head.")
      task, num_labels = name, kernel[-1]
  shapes = expected_shapes(config, task, num_labels)
  target = traverse_util.unflatten_dict(
      {p: jnp.zeros(s, config.storage_dtype) for p, s in shapes.items()}, sep="/")
  params, report = init_params.load_params(directory, target, vocab_size=config.vocab_size)
  flat = traverse_util.flatten_dict(params, sep="/")
  missing = set(report.missing)
  kept = {p: np.asarray(x, np.float32) for p, x in flat.items() if p not in missing}
  return traverse_util.unflatten_dict(kept, sep="/"), config
