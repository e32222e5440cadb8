"""Google's original BERT TensorFlow checkpoints -> bertjax, by a table of rules.

  python -m bertjax.convert --from=tf --src=GOOGLE_DIR --dst=OUT [--do_lower_case=true|false]

GOOGLE_DIR is laid out as Google's releases are (e.g. uncased_L-12_H-768_A-12/):
bert_config.json, vocab.txt and bert_model.ckpt.{index,data-00000-of-00001} (or the one
model.ckpt-STEP a fine-tuning run leaves). The variable names are those of google-research/bert's
modeling.py (`bert/...`) and run_pretraining.py (`cls/...`); a checkpoint fine-tuned by its
run_classifier.py (`output_weights`, `output_bias`) or run_squad.py (`cls/squad/...`) converts
with that head, to bertjax's sequence classification or span head.

Each rule pairs a Google variable with the Hugging Face BertForPreTraining tensor that holds the
same weights, so the checked, renamed tensors go through `hf.from_hf`, which maps them onto
bertjax's parameters. Transforms:

  'transpose'  a TF Dense kernel [in, out] -> a torch Linear weight [out, in] (from_hf transposes
               it back to bertjax's [in, out] kernel: the Google kernel is stored as it is)
  'copy'       embedding tables, biases, LayerNorm gamma/beta, and the NSP `output_weights`,
               which run_pretraining.py already stores as [2, hidden] ([out, in])

There is no MLM decoder variable: Google's MLM head multiplies by the word embeddings (tied), as
bertjax's does. `global_step` and optimizer slots (`.../adam_m`, `.../adam_v` of BERT's
AdamWeightDecayOptimizer; TF Adam's `.../Adam`, `.../Adam_1`, `beta1_power`, `beta2_power`) are
reported as ignored and never read. Any other variable, a shape that does not fit
bert_config.json, a layer beyond its num_hidden_layers, a missing encoder variable, or a head
present only in part raise one UserError that names each Google variable at fault.

Activation: Google's bert_config.json says hidden_act="gelu"; modeling.py first computed it
exactly (erf), and later versions use the tanh approximation. It is converted to bertjax's exact
'gelu', as transformers reads these configs (the two differ by at most 5e-4).

Reading needs TensorFlow (`pip install 'bertjax[tf]'`), imported only when a checkpoint is read.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Any

import numpy as np

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.convert import hf, hf_rules
from bertjax.errors import UserError
from bertjax.models.config import BertConfig

CONFIG_FILE = "bert_config.json"
_MAX_LISTED = 8  # problems other than unmapped variables named in one error message
CHECKPOINT = "bert_model.ckpt"  # the prefix of Google's released checkpoints

# (Google variable, Hugging Face BertForPreTraining tensor, transform, shape). `{i}` is a layer
# index; a shape's letters are bert_config.json fields (_DIMS).
RULES: tuple[tuple[str, str, str, tuple[Any, ...]], ...] = (
    ("bert/embeddings/word_embeddings", "bert.embeddings.word_embeddings.weight", "copy",
     ("V", "H")),
    ("bert/embeddings/token_type_embeddings", "bert.embeddings.token_type_embeddings.weight",
     "copy", ("T", "H")),
    ("bert/embeddings/position_embeddings", "bert.embeddings.position_embeddings.weight",
     "copy", ("P", "H")),
    ("bert/embeddings/LayerNorm/gamma", "bert.embeddings.LayerNorm.weight", "copy", ("H",)),
    ("bert/embeddings/LayerNorm/beta", "bert.embeddings.LayerNorm.bias", "copy", ("H",)),
    *((f"bert/encoder/layer_{{i}}/attention/self/{p}/kernel",
       f"bert.encoder.layer.{{i}}.attention.self.{p}.weight", "transpose", ("H", "H"))
      for p in ("query", "key", "value")),
    *((f"bert/encoder/layer_{{i}}/attention/self/{p}/bias",
       f"bert.encoder.layer.{{i}}.attention.self.{p}.bias", "copy", ("H",))
      for p in ("query", "key", "value")),
    ("bert/encoder/layer_{i}/attention/output/dense/kernel",
     "bert.encoder.layer.{i}.attention.output.dense.weight", "transpose", ("H", "H")),
    ("bert/encoder/layer_{i}/attention/output/dense/bias",
     "bert.encoder.layer.{i}.attention.output.dense.bias", "copy", ("H",)),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/gamma",
     "bert.encoder.layer.{i}.attention.output.LayerNorm.weight", "copy", ("H",)),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/beta",
     "bert.encoder.layer.{i}.attention.output.LayerNorm.bias", "copy", ("H",)),
    ("bert/encoder/layer_{i}/intermediate/dense/kernel",
     "bert.encoder.layer.{i}.intermediate.dense.weight", "transpose", ("H", "F")),
    ("bert/encoder/layer_{i}/intermediate/dense/bias",
     "bert.encoder.layer.{i}.intermediate.dense.bias", "copy", ("F",)),
    ("bert/encoder/layer_{i}/output/dense/kernel",
     "bert.encoder.layer.{i}.output.dense.weight", "transpose", ("F", "H")),
    ("bert/encoder/layer_{i}/output/dense/bias",
     "bert.encoder.layer.{i}.output.dense.bias", "copy", ("H",)),
    ("bert/encoder/layer_{i}/output/LayerNorm/gamma",
     "bert.encoder.layer.{i}.output.LayerNorm.weight", "copy", ("H",)),
    ("bert/encoder/layer_{i}/output/LayerNorm/beta",
     "bert.encoder.layer.{i}.output.LayerNorm.bias", "copy", ("H",)),
    ("bert/pooler/dense/kernel", "bert.pooler.dense.weight", "transpose", ("H", "H")),
    ("bert/pooler/dense/bias", "bert.pooler.dense.bias", "copy", ("H",)),
    ("cls/predictions/transform/dense/kernel", "cls.predictions.transform.dense.weight",
     "transpose", ("H", "H")),
    ("cls/predictions/transform/dense/bias", "cls.predictions.transform.dense.bias", "copy",
     ("H",)),
    ("cls/predictions/transform/LayerNorm/gamma", "cls.predictions.transform.LayerNorm.weight",
     "copy", ("H",)),
    ("cls/predictions/transform/LayerNorm/beta", "cls.predictions.transform.LayerNorm.bias",
     "copy", ("H",)),
    ("cls/predictions/output_bias", "cls.predictions.bias", "copy", ("V",)),
    ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", "copy", (2, "H")),
    ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias", "copy", (2,)),
    # The heads of Google's fine-tuning scripts, stored [out, in] like the NSP weights:
    # run_classifier.py's classifier on the pooled output (N = num_labels, from its shape) and
    # run_squad.py's start/end scorer on every token.
    ("output_weights", "classifier.weight", "copy", ("N", "H")),
    ("output_bias", "classifier.bias", "copy", ("N",)),
    ("cls/squad/output_weights", "qa_outputs.weight", "copy", (2, "H")),
    ("cls/squad/output_bias", "qa_outputs.bias", "copy", (2,)),
)
# The Hugging Face class whose head each fine-tuning head's tensors are.
TASKS = {"classifier.weight": "BertForSequenceClassification",
         "qa_outputs.weight": "BertForQuestionAnswering"}
_TRANSFORMS = {"copy": lambda x: x, "transpose": lambda x: x.T}
# Shape letters -> bert_config.json fields (BertConfig's fields of the same names).
_DIMS = {"V": "vocab_size", "H": "hidden_size", "F": "intermediate_size",
         "P": "max_position_embeddings", "T": "type_vocab_size"}
# Heads converted when present, whole; the encoder (bert/embeddings, bert/encoder) is required.
OPTIONAL_GROUPS = ("bert/pooler/", "cls/predictions/", "cls/seq_relationship/", "output_",
                   "cls/squad/")
# Training bookkeeping, not weights: reported, never read.
OPTIMIZER_VARIABLE = re.compile(
    r"^(global_step|beta1_power|beta2_power)$|/(adam_m|adam_v|Adam|Adam_1)$")
# bert_config.json field -> bertjax BertConfig field; all required.
_REQUIRED = dict(vocab_size="vocab_size", hidden_size="hidden_size",
                 num_layers="num_hidden_layers", num_heads="num_attention_heads",
                 intermediate_size="intermediate_size",
                 max_position_embeddings="max_position_embeddings",
                 type_vocab_size="type_vocab_size")
# bert_config.json field -> (bertjax BertConfig field, Google's default).
_OPTIONAL = dict(hidden_dropout_prob=("dropout_rate", 0.1),
                 attention_probs_dropout_prob=("attention_dropout_rate", 0.1),
                 initializer_range=("initializer_range", 0.02))


@dataclasses.dataclass(frozen=True)
class TfConversion:
  """What `convert_dir` did.

  Attributes:
    report: `hf.from_hf`'s report (loaded, missing bertjax parameters).
    checkpoint: the checkpoint prefix read (GOOGLE_DIR/bert_model.ckpt).
    ignored: optimizer variables and global_step, not converted.
    do_lower_case: written to OUT/tokenizer_config.json.
    do_lower_case_from: where that choice came from, in words.
  """
  report: hf.ConversionReport
  checkpoint: str
  ignored: list[str]
  do_lower_case: bool
  do_lower_case_from: str


_PATTERNS = [(hf_rules.template_regex(g), h, t, s) for g, h, t, s in RULES]


# --- bert_config.json ---------------------------------------------------------------------------

def google_config_to_bert_config(google: dict[str, Any]) -> BertConfig:
  """Google's bert_config.json (as a dict) -> bertjax BertConfig.

  Google's own fields beyond those listed (pooler_type, directionality, ... of the multilingual
  and Chinese releases) describe what bertjax does anyway and are ignored.

  Raises:
    UserError: a missing size field, an activation other than gelu, or invalid values.
  """
  absent = sorted(g for g in _REQUIRED.values() if g not in google)
  if absent:
    raise UserError(f"{CONFIG_FILE} lacks {absent}; give the bert_config.json released with the "
                    "checkpoint.")
  act = str(google.get("hidden_act", "gelu")).lower()
  if act != "gelu":
    raise UserError(f"{CONFIG_FILE} has hidden_act={google['hidden_act']!r}; bertjax's BERT "
                    "uses gelu, as Google's released models do.")
  try:
    return BertConfig(**{ours: google[g] for ours, g in _REQUIRED.items()},
                      **{ours: google.get(g, default) for g, (ours, default) in _OPTIONAL.items()},
                      layer_norm_eps=1e-12,  # modeling.py's layer_norm (tf.contrib's default)
                      hidden_act="gelu")
  except (TypeError, ValueError) as e:
    raise UserError(f"{CONFIG_FILE} does not describe a valid BERT: {e}") from None


def load_google_config(directory: str) -> BertConfig:
  """DIRECTORY/bert_config.json (Google's fields) -> BertConfig."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(path):
    raise UserError(f"no {CONFIG_FILE} in {directory}; give the directory of a Google BERT "
                    f"release (bert_config.json, vocab.txt, {CHECKPOINT}.*).")
  try:
    with open(path, encoding="utf-8") as f:
      google = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); give the bert_config.json released with "
                    "the checkpoint.") from None
  if not isinstance(google, dict):
    raise UserError(f"{path} is not a JSON object; give the bert_config.json released with the "
                    "checkpoint.")
  return google_config_to_bert_config(google)


# --- the checkpoint on disk ---------------------------------------------------------------------

def checkpoint_prefix(directory: str) -> str:
  """The checkpoint in DIRECTORY: bert_model.ckpt, else the only `*.index` there.

  Raises:
    UserError: no checkpoint, several (and none is bert_model.ckpt), or no data file.
  """
  prefix = os.path.join(directory, CHECKPOINT)
  if not os.path.isfile(prefix + ".index"):
    found = sorted(glob.glob(os.path.join(glob.escape(directory), "*.index")))
    if len(found) != 1:
      names = ", ".join(os.path.basename(p) for p in found) or "none"
      raise UserError(f"no {CHECKPOINT}.index in {directory} (.index files: {names}); give the "
                      f"directory holding {CHECKPOINT}.index and {CHECKPOINT}.data-00000-of-00001.")
    prefix = found[0][:-len(".index")]
  if not glob.glob(glob.escape(prefix) + ".data-*-of-*"):
    raise UserError(f"{prefix}.index has no data file beside it ({os.path.basename(prefix)}"
                    ".data-00000-of-00001); the download is incomplete, fetch the whole release.")
  return prefix


def _import_tensorflow():
  try:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError("reading a TensorFlow checkpoint needs TensorFlow; "
                    "pip install 'bertjax[tf]'.") from None
  return tf


def load_tf_checkpoint(prefix: str) -> tuple[dict[str, np.ndarray], list[str]]:
  """The variables of a TF checkpoint, without its optimizer bookkeeping.

  Args:
    prefix: the checkpoint prefix, e.g. GOOGLE_DIR/bert_model.ckpt.
  Returns:
    ({Google name: float32 numpy array} of every variable but global_step and optimizer slots,
     the sorted names of those, which are not read).
  Raises:
    UserError: TensorFlow missing, or files that are missing or not a TF checkpoint.
  """
  tf = _import_tensorflow()
  try:
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    ignored = [n for n in names if OPTIMIZER_VARIABLE.search(n)]
    variables = {n: np.asarray(reader.get_tensor(n), np.float32) for n in names
                 if not OPTIMIZER_VARIABLE.search(n)}
  except (tf.errors.OpError, ValueError) as e:
    first = str(e).strip().split("\n")[0]
    raise UserError(f"{prefix} could not be read as a TensorFlow checkpoint ({first}); "
                    "re-download the release (bert_model.ckpt.index and .data-*).") from None
  return variables, ignored


# --- the conversion -----------------------------------------------------------------------------

def _rule(name: str) -> tuple[str, str, tuple[Any, ...], int | None] | None:
  """(Hugging Face name, transform, shape, layer index or None) for a Google name, or None."""
  for pattern, hf_name, transform, shape in _PATTERNS:
    match = pattern.match(name)
    if match:
      layer = match.groupdict().get("i")
      filled = hf_name.replace("{i}", layer) if layer is not None else hf_name
      return filled, transform, shape, None if layer is None else int(layer)
  return None


def _expected_names(config: BertConfig) -> list[str]:
  """Every Google variable of a BertForPreTraining with `config`'s layers."""
  names = []
  for google, _, _, _ in RULES:
    if "{i}" in google:
      names += [google.replace("{i}", str(i)) for i in range(config.num_layers)]
    else:
      names.append(google)
  return names


def to_hf_state_dict(variables: dict[str, np.ndarray], config: BertConfig
                     ) -> dict[str, np.ndarray]:
  """Google BERT variables -> Hugging Face BertForPreTraining tensors, every one checked.

  Args:
    variables: {Google name: array}, e.g. from `load_tf_checkpoint`; optimizer variables that
      are still here are skipped.
    config: from bert_config.json (`load_google_config`).
  Returns:
    {Hugging Face name: array} for `hf.from_hf`.
  Raises:
    UserError: naming every Google variable that matches no rule, and (the first _MAX_LISTED
      of) those whose shape does not fit `config`, layers beyond it, missing encoder variables
      and heads present only in part.
  """
  dims = {letter: getattr(config, field) for letter, field in _DIMS.items()}
  if "output_weights" in variables:  # run_classifier.py's head: its rows are the labels
    dims["N"] = np.shape(variables["output_weights"])[0]
  unmapped, problems, state = [], [], {}
  for name in sorted(variables):
    if OPTIMIZER_VARIABLE.search(name):
      continue
    array = np.asarray(variables[name])
    rule = _rule(name)
    if rule is None:
      unmapped.append(f"{name} {array.shape}")
      continue
    hf_name, transform, shape, layer = rule
    if layer is not None and layer >= config.num_layers:
      problems.append(f"{name} is a layer beyond num_hidden_layers={config.num_layers} of "
                      f"{CONFIG_FILE}")
      continue
    expected = tuple(dims.get(d, d) for d in shape)
    if array.shape != expected:
      fields = ", ".join(_DIMS.get(d, "num_labels" if d == "N" else str(d)) for d in shape)
      problems.append(f"{name} {array.shape} does not fit {CONFIG_FILE}, which gives "
                      f"{expected} ({fields})")
      continue
    state[hf_name] = _TRANSFORMS[transform](array)
  present = {name for name in variables if not OPTIMIZER_VARIABLE.search(name)}
  for name in _expected_names(config):
    if name in present:
      continue
    group = next((g for g in OPTIONAL_GROUPS if name.startswith(g)), None)
    if group is None:
      problems.append(f"{name} is not in the checkpoint")
    elif any(p.startswith(group) for p in present):
      problems.append(f"{name} is not in the checkpoint, though other variables of {group} are")
  if unmapped or problems:
    count = len(unmapped) + len(problems)
    listed = ([f"{len(unmapped)} variables match no rule: {', '.join(unmapped)}"] if unmapped
              else []) + problems[:_MAX_LISTED]
    if len(problems) > _MAX_LISTED:
      listed.append(f"and {len(problems) - _MAX_LISTED} more")
    raise UserError(f"cannot convert the TensorFlow checkpoint ({count} problems): "
                    f"{'; '.join(listed)}. Check that {CONFIG_FILE} belongs to this checkpoint "
                    "and that it is a BERT of google-research/bert (the names of modeling.py, "
                    "run_pretraining.py, run_classifier.py or run_squad.py).")
  return state


def from_tf(variables: dict[str, np.ndarray], config: BertConfig
            ) -> tuple[dict[str, Any], hf.ConversionReport]:
  """Google BERT variables -> bertjax parameters and `hf.from_hf`'s report.

  A checkpoint of run_classifier.py or run_squad.py converts with its head, to bertjax's
  sequence classification or span head (`report.task` names it). Heads the checkpoint lacks are
  reported missing and left out.

  Raises:
    UserError: as `to_hf_state_dict`, or the heads of both fine-tuning scripts at once.
  """
  state = to_hf_state_dict(variables, config)
  tasks = [task for name, task in TASKS.items() if name in state]
  if len(tasks) > 1:
    raise UserError("the checkpoint holds both run_classifier.py's output_weights and "
                    "run_squad.py's cls/squad/output_weights; a model has one task head, so "
                    "convert a checkpoint of one fine-tuning run.")
  task = tasks[0] if tasks else None
  num_labels = state["classifier.weight"].shape[0] if "classifier.weight" in state else 2
  return hf.from_hf(state, config, task, num_labels)


# --- the tokenizer ------------------------------------------------------------------------------

def choose_lowercase(vocab_file: str, do_lower_case: bool | None,
                     config: BertConfig) -> tuple[bool, str]:
  """(do_lower_case for the WordPiece vocab_file, where the choice came from, in words).

  `do_lower_case` when given; else as `tokenization.load_tokenizer` decides for the vocab.txt
  (tokenizer_config.json beside it, else guessed from upper-case pieces).

  Raises:
    UserError: a bad vocab.txt, or one with more pieces than the embeddings have rows.
  """
  tok = tokenization.load_tokenizer(vocab_file, lowercase=do_lower_case)
  if tok.vocab_size > config.vocab_size:
    raise UserError(f"{vocab_file} has {tok.vocab_size} pieces, more than vocab_size="
                    f"{config.vocab_size} of {CONFIG_FILE}; give the vocab.txt released with "
                    "the checkpoint.")
  beside = os.path.join(os.path.dirname(vocab_file), tokenization.CONFIG_FILE)
  if do_lower_case is not None:
    return tok.lowercase, "--do_lower_case"
  if os.path.isfile(beside):  # load_tokenizer has checked it is a JSON object
    with open(beside, encoding="utf-8") as f:
      if json.load(f).get("do_lower_case") is not None:
        return tok.lowercase, f"do_lower_case in {beside}"
  return tok.lowercase, ("inferred from vocab.txt's pieces (upper-case pieces mean cased); "
                         "pass --do_lower_case=true|false to choose")


# --- a release directory -> a bertjax checkpoint directory ------------------------------------

def convert_dir(src: str, dst: str, do_lower_case: bool | None = None) -> TfConversion:
  """GOOGLE_DIR -> OUT: checkpoints/0/, bert_config.json, vocab.txt, tokenizer_config.json.

  Everything is read and checked before anything is written to `dst`.

  Args:
    src: a Google release directory (bert_config.json, vocab.txt, bert_model.ckpt.*).
    dst: the bertjax checkpoint directory to write (`model_files.save_model_dir`).
    do_lower_case: the tokenizer's casing; None to infer it (`choose_lowercase`).
  """
  config = load_google_config(src)
  vocab = os.path.join(src, tokenization.VOCAB_FILE)
  if not os.path.isfile(vocab):
    raise UserError(f"no {tokenization.VOCAB_FILE} in {src}; Google's releases hold it beside "
                    f"{CONFIG_FILE}, give the whole release directory.")
  lowercase, source = choose_lowercase(vocab, do_lower_case, config)
  prefix = checkpoint_prefix(src)
  variables, ignored = load_tf_checkpoint(prefix)
  params, report = from_tf(variables, config)
  model_files.save_model_dir(dst, params, config, [vocab])
  with open(os.path.join(dst, tokenization.CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump({"do_lower_case": lowercase}, f, indent=2)
    f.write("\n")
  return TfConversion(report=report, checkpoint=prefix, ignored=ignored,
                      do_lower_case=lowercase, do_lower_case_from=source)
