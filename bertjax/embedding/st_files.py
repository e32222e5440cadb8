"""A sentence-transformers directory read as a recipe: which encoder, then pooling, dense layers
and normalisation, at which length, with which prompts.

  DIR/modules.json                     the modules in order; bertjax runs Transformer, Pooling,
                                       Dense and Normalize (sentence-transformers 2 to 6 name them
                                       sentence_transformers.models.X or ...modules.x.X)
  DIR/<Transformer path>/              a Hugging Face BERT or ModernBERT (config.json, weights,
                                       tokenizer files); its sentence_bert_config.json may give
                                       max_seq_length and do_lower_case (before version 6)
  DIR/<Pooling path>/config.json       pooling_mode ("mean", or several) and include_prompt; before
                                       version 6 pooling_mode_cls_token, pooling_mode_mean_tokens, ...
  DIR/<Dense path>/config.json         in_features, out_features, bias, activation_function; the
                                       weights in model.safetensors or pytorch_model.bin (linear.*)
  DIR/config_sentence_transformers.json
                                       prompts {name: text}, default_prompt_name, similarity_fn_name

The longest input is sentence_bert_config.json's max_seq_length where it is given, else the
tokenizer's model_max_length (tokenizer_config.json), never more than the model's
max_position_embeddings, as sentence-transformers reads it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from bertjax.convert import hf_files
from bertjax.errors import UserError

MODULES_FILE = "modules.json"
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Before sentence-transformers 6, each pooling mode was a bool of Pooling's config.json.
LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean",
                   "pooling_mode_lasttoken": "lasttoken"}
# Dense's activation_function (a torch class path) -> the name `bertjax.embedding.embedder` runs.
ACTIVATIONS = {"Identity": "identity", "Tanh": "tanh", "ReLU": "relu", "GELU": "gelu",
               "Sigmoid": "sigmoid"}
_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclasses.dataclass(frozen=True)
class Dense:
  """A Dense module: y = activation(x @ weight.T + bias); weight [out_features, in_features]."""
  weight: np.ndarray
  bias: np.ndarray | None
  activation: str


@dataclasses.dataclass(frozen=True)
class Recipe:
  """What a sentence-transformers directory computes after its encoder.

  Attributes:
    transformer_dir: the Hugging Face model directory of its Transformer module.
    pooling: the pooling modes, concatenated in this order (`POOLING_MODES`).
    include_prompt: whether a prompt's tokens are pooled with the text's.
    dense: the Dense modules after pooling, in order.
    normalize: whether the embedding is divided by its L2 norm last.
    max_seq_length: tokens a text is cut to, special tokens included (None: the model's).
    do_lower_case: the text is lower-cased before tokenizing.
    prompts: {name: text} prepended to a text by name; default_prompt_name: the one used when
      none is asked for (None: none).
    similarity: the similarity function the model was trained with ("cosine", "dot", ...).
  """
  transformer_dir: str
  pooling: tuple[str, ...]
  include_prompt: bool = True
  dense: tuple[Dense, ...] = ()
  normalize: bool = False
  max_seq_length: int | None = None
  do_lower_case: bool = False
  prompts: dict[str, str] = dataclasses.field(default_factory=dict)
  default_prompt_name: str | None = None
  similarity: str = "cosine"


def is_sentence_transformers_dir(directory: str) -> bool:
  """Whether `directory` is a sentence-transformers model (it has modules.json)."""
  return os.path.isfile(os.path.join(directory, MODULES_FILE))


def _json(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    raise UserError(f"{path} is not readable JSON ({e}); restore it from the model's "
                    "source.") from None


def _pooling(config: dict[str, Any], where: str) -> tuple[tuple[str, ...], bool]:
  """(modes, include_prompt) of a Pooling config.json, either format."""
  modes = config.get("pooling_mode")
  if modes is None:
    modes = [mode for key, mode in LEGACY_POOLING.items() if config.get(key)] or ["mean"]
  modes = (modes,) if isinstance(modes, str) else tuple(modes)
  bad = [m for m in modes if m not in POOLING_MODES]
  if bad:
    raise UserError(f"{where}: pooling mode {bad[0]!r} is not one bertjax runs "
                    f"({', '.join(POOLING_MODES)}).")
  return modes, bool(config.get("include_prompt", True))


def _dense(directory: str) -> Dense:
  """A Dense module's weights and activation from its directory."""
  config = _json(os.path.join(directory, "config.json"))
  activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
  name = ACTIVATIONS.get(activation.rsplit(".", 1)[-1])
  if name is None:
    raise UserError(f"{directory}: Dense activation {activation!r} is not one bertjax runs "
                    f"({', '.join(ACTIVATIONS)}).")
  safetensors = os.path.join(directory, "model.safetensors")
  if os.path.isfile(safetensors):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    weights = load_file(safetensors)
  else:
    weights = hf_files.load_hf_state_dict(directory)
  if "linear.weight" not in weights:
    raise UserError(f"{directory} holds no Dense weights (linear.weight in model.safetensors or "
                    "pytorch_model.bin); restore them from the model's source.")
  bias = weights.get("linear.bias")
  return Dense(weight=np.asarray(weights["linear.weight"], np.float32),
               bias=None if bias is None else np.asarray(bias, np.float32), activation=name)


def read_recipe(directory: str) -> Recipe:
  """The recipe of the sentence-transformers model in `directory` (module docstring).

  Raises:
    UserError: a module bertjax does not run, no Transformer or no Pooling module, a pooling
      mode or activation it does not run, unreadable files.
  """
  modules = _json(os.path.join(directory, MODULES_FILE))
  if not isinstance(modules, list):
    raise UserError(f"{directory}/{MODULES_FILE} is not a list of modules.")
  found: dict[str, list[str]] = {name: [] for name in _MODULES}
  for module in modules:
    kind = str(module.get("type", "")).rsplit(".", 1)[-1]
    if kind not in found:
      raise UserError(f"{directory}: module {module.get('type')!r} is not one bertjax runs "
                      f"({', '.join(_MODULES)}).")
    found[kind].append(os.path.join(directory, module.get("path", "")))
  if len(found["Transformer"]) != 1 or not found["Pooling"]:
    raise UserError(f"{directory}/{MODULES_FILE} has no Transformer or no Pooling module; "
                    "bertjax embeds with one encoder followed by pooling.")
  transformer_dir = found["Transformer"][0]
  modes, include_prompt = _pooling(_json(os.path.join(found["Pooling"][0], "config.json")),
                                   found["Pooling"][0])
  bert = _json(os.path.join(transformer_dir, "sentence_bert_config.json"))
  tokenizer = _json(os.path.join(transformer_dir, "tokenizer_config.json"))
  model = _json(os.path.join(transformer_dir, "config.json"))
  length = bert.get("max_seq_length")
  if length is None and int(tokenizer.get("model_max_length", 1 << 30)) < 1 << 30:
    length = int(tokenizer["model_max_length"])
  if length is not None and model.get("max_position_embeddings"):
    length = min(int(length), int(model["max_position_embeddings"]))
  st_config = _json(os.path.join(directory, "config_sentence_transformers.json"))
  return Recipe(transformer_dir=transformer_dir, pooling=modes, include_prompt=include_prompt,
                dense=tuple(_dense(d) for d in found["Dense"]),
                normalize=bool(found["Normalize"]), max_seq_length=length,
                do_lower_case=bool(bert.get("do_lower_case", False)),
                prompts=dict(st_config.get("prompts") or {}),
                default_prompt_name=st_config.get("default_prompt_name"),
                similarity=st_config.get("similarity_fn_name") or "cosine")
