"""Hugging Face transformers BERT and ModernBERT <-> bertjax weights: the tables of rules
(`hf_rules`), applied.

The rules pair each Hugging Face tensor name with bertjax parameter paths and a transform (a
pair of functions, each the other's inverse), so one table converts both ways; the tables (one
per architecture, chosen by `BertConfig.architecture`: `hf_rules.table_of`), their task heads
and parameter groups are in `bertjax.convert.hf_rules`. What follows is said of BERT's names;
ModernBERT's (`model.` prefixed, `decoder.*`, `head.*`, `classifier.*`) go the same way, its
`decoder.bias` being the MLM bias itself and its shared head `head.*` an optional group, absent
from a bare ModernBertModel (see `hf_rules.MODERNBERT`).

What is converted (`from_hf`):
  - the encoder (`bert.` prefixed names, or prefix-less as a bare `BertModel` saves them);
  - the pooler, the masked-LM head (`cls.predictions.*`) and the next-sentence head
    (`cls.seq_relationship.*`) when the checkpoint has them. Each of these groups must be whole
    or absent; an absent group is reported `missing` and left out of the parameters, so that
    `bertjax.modeldir.saved_params.load_params` leaves it freshly initialised (BertForMaskedLM has
    no
    pooler and no NSP head; BertModel has no heads).
  - the MLM decoder is tied to the word embeddings in bertjax; a checkpoint that stores
    `cls.predictions.decoder.weight` (older ones do) must hold a copy of the word embeddings
    (checked, then ignored), and `cls.predictions.decoder.bias` a copy of
    `cls.predictions.bias`; an untied decoder is a UserError.
  - the task head of a Hugging Face fine-tuned model (hf_rules.TASK_HEADS): `classifier.*` of
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
import functools
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.modeldir import model_files
from bertjax.convert import hf_rules
from bertjax.modeldir import saved_params
from bertjax.errors import UserError
from bertjax.models import bilstm
from bertjax.models.config import BertConfig

_MAX_LISTED = 8  # problems named in one error message


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


def _listing(problems: list[str]) -> str:
  more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
  return "; ".join(problems[:_MAX_LISTED]) + more


# --- the conversion -----------------------------------------------------------------------------

def _shapes(model: nn.Module, ids: jax.ShapeDtypeStruct) -> dict[str, tuple[int, ...]]:
  tree = jax.eval_shape(
      lambda i: model.init(jax.random.PRNGKey(0), i, i, i, deterministic=True), ids)
  flat = traverse_util.flatten_dict(nn.unbox(tree)["params"], sep="/")
  return {path: tuple(x.shape) for path, x in flat.items()}


def expected_shapes(config: BertConfig, task: str | None = None,
                    num_labels: int = 2) -> dict[str, tuple[int, ...]]:
  """{path: shape} of every parameter of bertjax's BertForPreTraining (ModernBERT's without NSP),
  plus those of the head of `task` (a key of the config's table's task_heads) with `num_labels`
  when given (no arrays built). The vocabulary-axis parameters (saved_params.VOCAB_ROW_PARAMS)
  have padded_vocab_size rows. A new dict each call; the model is traced once per process for
  each (config, task, num_labels)."""
  return dict(_expected_shapes(config, task, num_labels))


@functools.lru_cache(maxsize=64)
def _expected_shapes(config: BertConfig, task: str | None,
                     num_labels: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
  table = hf_rules.table_of(config)
  shapes = _shapes(table.pretraining(config), jax.ShapeDtypeStruct((1, 2), jnp.int32))
  if task:
    head = table.task_heads[task]
    ids = jax.ShapeDtypeStruct((1, 2, 2) if head.choices else (1, 2), jnp.int32)
    shapes.update(_shapes(head.model(config, num_labels), ids))
  return tuple(shapes.items())


def _hf_shape(path: str, shape: tuple[int, ...], config: BertConfig) -> tuple[int, ...]:
  """The shape that a bertjax parameter of `shape` has in Hugging Face's layout, before the
  transpose: the vocabulary-axis parameters have vocab_size rows there, not padded_vocab_size."""
  return (config.vocab_size,) + shape[1:] if path in saved_params.VOCAB_ROW_PARAMS else shape


def from_hf(state_dict: dict[str, np.ndarray], config: BertConfig, task: str | None = None,
            num_labels: int = 2) -> tuple[dict[str, Any], ConversionReport]:
  """Converts Hugging Face BERT or ModernBERT weights to bertjax parameters.

  Args:
    state_dict: {Hugging Face name: array}, e.g. from `hf_files.load_hf_state_dict`; names of
      BertModel (prefix-less or 'bert.'), BertForPreTraining, BertForMaskedLM, or a task model;
      for a ModernBERT config, of ModernBertModel (prefix-less or 'model.'),
      ModernBertForMaskedLM or a ModernBERT task model. Old names 'LayerNorm.gamma' /
      'LayerNorm.beta' are read as 'weight' / 'bias'.
    config: the model's BertConfig (`hf_files.hf_config_to_bert_config`); its architecture
      picks the table.
    task: for a task model, its architecture (a key of the table's task_heads; `hf_files.hf_task`
      reads it from config.json), whose head is converted too; None for the others.
    num_labels: the task head's number of labels (`hf_files.hf_task`).
  Returns:
    (params: nested dict of float32 numpy arrays in the layout of BertForPreTraining's "params"
     plus the task head, without the groups the checkpoint lacks, the word embeddings and the
     MLM bias padded with zero rows to padded_vocab_size; report).
  Raises:
    UserError: naming every unmapped tensor, shape mismatch, unfilled encoder parameter, partly
      filled group, and untied decoder.
  """
  table = hf_rules.table_of(config)
  if task is not None and task not in table.task_heads:
    raise ValueError(f"task must be one of {sorted(table.task_heads)}, not {task!r}")
  expected = expected_shapes(config, task, num_labels)
  patterns = hf_rules.hf_patterns(task, table)
  problems: list[str] = []
  flat: dict[str, np.ndarray] = {}
  sources: dict[str, str] = {}
  ignored, tied = [], {}
  normals = {re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                    re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)): name
             for name in state_dict}
  decoder_bias = table.decoder_bias
  if decoder_bias in normals and "cls.predictions.bias" not in normals:
    # Some checkpoints keep only the decoder's (tied) copy of the output bias: read it as such.
    normals["cls.predictions.bias"] = normals.pop(decoder_bias)
  for normal, name in sorted(normals.items()):
    array = np.asarray(state_dict[name])
    if table.ignored is not None and table.ignored.match(normal):
      ignored.append(name)
      continue
    if normal in (table.decoder_weight, decoder_bias):
      tied[normal] = (name, array)
      ignored.append(name)
      continue
    rule = hf_rules.hf_rule(normal, patterns, table)
    if rule is None and table.task_head_tensor.match(normal):
      problems.append(f"{name} {array.shape} belongs to a task head, but config.json's "
                      "architectures does not name one of " + ", ".join(table.task_heads))
      continue
    if rule is None:
      problems.append(f"{name} {array.shape} matches no rule")
      continue
    paths, transform = rule
    unknown = [path for path in paths if path not in expected]
    if unknown:
      problems.append(f"{name} maps to {', '.join(unknown)}, which the model does not have (is "
                      f"num_layers={config.num_layers} right?)")
      continue
    taken = [path for path in paths if path in flat]
    if taken:
      problems.append(f"{name} and {sources[taken[0]]} both map to {taken[0]}")
      continue
    try:
      values = hf_rules.TRANSFORMS[transform].to_bertjax(array)
    except (ValueError, IndexError):  # a shape the transform cannot split or reshape
      values = None
    wanted = [_hf_shape(path, expected[path], config) for path in paths]  # padded below
    if values is None or [v.shape for v in values] != wanted:
      got = "" if values is None else " " + ", ".join(str(v.shape) for v in values)
      problems.append(f"{name} {array.shape} -> {', '.join(paths)}{got} ({transform}), the "
                      f"model expects {', '.join(map(str, wanted))}")
      continue
    for path, value in zip(paths, values):
      flat[path] = np.ascontiguousarray(value.astype(np.float32))
      sources[path] = name

  missing = []
  unfilled = sorted(set(expected) - set(flat))
  prefixed = any(name.startswith(table.encoder_prefix) for name in normals)
  for path in unfilled:
    group = hf_rules.group_of(path, task, table)
    if group == hf_rules.REQUIRED_GROUP:
      problems.append(f"{_hf_name(path, task, table, prefixed)} is not in the checkpoint "
                      f"(bertjax's {path} {expected[path]})")
    elif any(p.startswith(group) for p in flat):
      problems.append(f"{_hf_name(path, task, table, prefixed)} is not in the checkpoint "
                      f"(bertjax's {path} {expected[path]}), though other parameters of "
                      f"{group} are")
    else:
      missing.append(path)

  # The tied decoder: a stored copy must equal what bertjax ties it to.
  word = flat.get("bert/embeddings/word_embeddings/embedding")
  if table.decoder_weight in tied and word is not None:
    name, array = tied[table.decoder_weight]
    if array.shape != word.shape or not np.array_equal(array, word):
      problems.append(f"{name} differs from the word embeddings; bertjax ties the MLM decoder to "
                      "them, so an untied decoder cannot be converted")
  if decoder_bias is not None and decoder_bias in tied:
    name, array = tied[decoder_bias]
    bias = flat.get("masked_lm/output_bias")
    if bias is None or array.shape != bias.shape or not np.array_equal(array, bias):
      problems.append(f"{name} differs from cls.predictions.bias; they must be one tied bias")

  if problems:
    raise UserError(
        f"cannot convert the Hugging Face checkpoint ({len(problems)} problems): "
        f"{_listing(problems)}. Check that config.json belongs to these weights and that they "
        f"are {table.description}.")
  for path in saved_params.VOCAB_ROW_PARAMS:
    if path in flat:  # [vocab_size, ...] -> [padded_vocab_size, ...], zero padding rows
      flat[path] = saved_params.vocab_rows(flat[path], config.vocab_size, expected[path][0])
  report = ConversionReport(loaded=sorted(flat), missing=missing, ignored=ignored, task=task)
  return traverse_util.unflatten_dict(flat, sep="/"), report


def params_task(params: dict[str, Any],
                config: BertConfig | None = None) -> tuple[str | None, int]:
  """(the architecture among the task heads of `config`'s table (BERT's when None) whose head
  `params` holds, or None; its num_labels).

  Raises:
    UserError: the parameters hold more than one task head (a Hugging Face model has one).
  """
  task_heads = hf_rules.table_of(config).task_heads
  found = [task for task, head in task_heads.items() if head.name in params]
  if len(found) > 1:
    raise UserError(f"the parameters hold the heads of {found}; a Hugging Face model has one "
                    "task head, so convert a checkpoint with one.")
  if not found:
    return None, 2
  kernel = params[task_heads[found[0]].name].get("classifier", {}).get("kernel")
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


def _hf_name(path: str, task: str | None, table: hf_rules.Table, prefixed: bool) -> str:
  """The Hugging Face name of the tensor bertjax's `path` comes from (with the encoder prefix
  when the checkpoint's names carry it), as a message names it to the user."""
  for pattern, hf, _, _, _ in hf_rules.bj_patterns(task, table):
    match = pattern.match(path)
    if match:
      name = hf_rules.fill(hf, match)
      if prefixed and name.startswith(table.encoder_names):
        name = table.encoder_prefix + name
      return name
  return path


def to_hf(params: dict[str, Any], config: BertConfig) -> dict[str, np.ndarray]:
  """bertjax parameters -> Hugging Face tensors of BertForPreTraining (for a ModernBERT config:
  ModernBertForMaskedLM) and the task head, if any.

  Args:
    params: nested dict ('bert', and any of 'masked_lm', 'next_sentence' and one task head), as
      `from_hf` or a train state holds them; the pooler and the heads may be absent (their
      tensors are then not written).
    config: the model's BertConfig; its architecture picks the table.
  Returns:
    {name: float32 contiguous numpy array}: 'bert.*', 'cls.*' and the task head's names
    (ModernBERT: 'model.*', 'head.*', 'decoder.bias', 'classifier.*'; an encoder alone without
    the 'model.' prefix, as ModernBertModel saves it); no tied decoder. The word embeddings and
    the MLM bias keep their vocab_size real rows (the padding rows are dropped).
  Raises:
    UserError: a causal model (`refuse_causal`), a parameter no rule maps, a wrong shape, or a
      missing encoder parameter.
  """
  refuse_causal(config)
  refuse_bilstm(params)
  table = hf_rules.table_of(config)
  task, num_labels = params_task(params, config)
  expected = expected_shapes(config, task, num_labels)
  patterns = hf_rules.bj_patterns(task, table)
  prefixed = table.prefix_bare or hf_architecture(params, config) != table.bare
  flat = traverse_util.flatten_dict(params, sep="/")
  problems, out = [], {}
  parts: dict[str, tuple[str, list]] = {}  # Hugging Face name -> (transform, its rule's arrays)
  for path in sorted(flat):
    value = np.asarray(flat[path], np.float32)
    if path not in expected:
      problems.append(f"{path} {value.shape} is not a parameter of BertForPreTraining or of a "
                      "task head")
      continue
    if value.shape != expected[path]:
      problems.append(f"{path} {value.shape}, the config expects {expected[path]}")
      continue
    if path in saved_params.VOCAB_ROW_PARAMS:  # [padded_vocab_size, ...] -> [vocab_size, ...]
      value = saved_params.vocab_rows(value, config.vocab_size, config.vocab_size)
    for pattern, hf, transform, place, count in patterns:
      match = pattern.match(path)
      if match:
        name = hf_rules.fill(hf, match)
        parts.setdefault(name, (transform, [None] * count))[1][place] = value
        break
    else:  # every bertjax parameter has a rule; a test checks this
      problems.append(f"{path} matches no rule")
  for name, (transform, arrays) in parts.items():
    if all(a is not None for a in arrays):  # else a path is missing: named below
      if prefixed and name.startswith(table.encoder_names):
        name = table.encoder_prefix + name
      out[name] = np.ascontiguousarray(hf_rules.TRANSFORMS[transform].to_hf(*arrays))
  for path in sorted(set(expected) - set(flat)):
    group = hf_rules.group_of(path, task, table)
    if group == hf_rules.REQUIRED_GROUP or any(p.startswith(group) for p in flat):
      problems.append(f"{path} {expected[path]} is missing")
  if problems:
    raise UserError(f"cannot convert the bertjax parameters ({len(problems)} problems): "
                    f"{_listing(problems)}. Check that bert_config.json belongs to this "
                    "checkpoint.")
  return out


def hf_architecture(params: dict[str, Any], config: BertConfig | None = None) -> str:
  """The transformers class whose names `to_hf(params, config)` writes, by the heads present
  (BERT's classes when `config` is None).

  With a task head, that task's class (pretraining heads, if also present, are written too and
  transformers ignores them when it loads the task class).
  """
  table = hf_rules.table_of(config)
  task, _ = params_task(params, config)
  if task:
    return task
  has_mlm, has_nsp = "masked_lm" in params, "next_sentence" in params
  if has_mlm and has_nsp:
    return "BertForPreTraining"
  if has_mlm:
    return table.masked_lm
  if has_nsp:
    return "BertForNextSentencePrediction"
  return table.bare


# --- bertjax checkpoints on disk ----------------------------------------------------------------

def load_bertjax_checkpoint(directory: str) -> tuple[dict[str, Any], BertConfig]:
  """The parameters and BertConfig of a bertjax checkpoint directory with bert_config.json.

  Groups the checkpoint lacks (pooler, heads) are absent from the returned params; a task head
  it holds (hf_rules.TASK_HEADS) is read with the number of labels it was saved with. A
  checkpoint saved with other padding of the vocabulary axis (an unpadded one from before
  BertConfig had pad_vocab_to_multiple) is read with bert_config.json's padding
  (`saved_params.load_params`).
  """
  config = model_files.load_bert_config(directory)
  saved = saved_params.saved_param_shapes(directory)
  refuse_bilstm({path.split("/")[0] for path in saved})
  task, num_labels = None, 2
  for name, head in hf_rules.table_of(config).task_heads.items():
    kernel = saved.get(f"{head.name}/classifier/kernel")
    if kernel is not None:
      if task is not None:
        raise UserError(f"{directory} holds the heads of both {task} and {name}; a Hugging Face "
                        "model has one task head.")
      task, num_labels = name, kernel[-1]
  shapes = expected_shapes(config, task, num_labels)
  target = traverse_util.unflatten_dict(
      {p: jax.ShapeDtypeStruct(s, config.storage_dtype) for p, s in shapes.items()}, sep="/")
  params, report = saved_params.load_params(directory, target, vocab_size=config.vocab_size)
  flat = traverse_util.flatten_dict(params, sep="/")
  missing = set(report.missing)
  kept = {p: np.asarray(x, np.float32) for p, x in flat.items() if p not in missing}
  return traverse_util.unflatten_dict(kept, sep="/"), config
