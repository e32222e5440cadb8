"""A Hugging Face `save_pretrained` directory: config.json (<-> BertConfig) and the weights.

config.json's model_type picks the architecture: 'bert' here, 'modernbert' in
`bertjax.convert.hf_modernbert`.

Weights are read from model.safetensors (or its sharded index) with safetensors.numpy; only
without them from pytorch_model.bin (or its index), and then through
`torch.load(..., weights_only=True)`, so a pickle that would run code is refused.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable

import numpy as np

from bertjax.convert import hf_modernbert, hf_rules
from bertjax.errors import UserError
from bertjax.models.config import BertConfig

# Hugging Face hidden_act -> bertjax hidden_act.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def hf_config_to_bert_config(hf_config: dict[str, Any]) -> BertConfig:
  """A transformers BertConfig or ModernBertConfig (its config.json as a dict) -> bertjax
  BertConfig (ModernBERT's: `hf_modernbert.to_bert_config`).

  Raises:
    UserError: neither a BERT nor a ModernBERT config, an architecture bertjax does not have
      (decoder, cross attention, relative positions), an unknown activation, or a missing field.
  """
  model_type = hf_config.get("model_type", "bert")
  if model_type == hf_modernbert.MODEL_TYPE:
    return hf_modernbert.to_bert_config(hf_config)
  if model_type != "bert":
    raise UserError(f"config.json has model_type={model_type!r}; only 'bert' and 'modernbert' "
                    "checkpoints convert (bertjax has no other architecture).")
  for key, bad in (("is_decoder", True), ("add_cross_attention", True)):
    if hf_config.get(key, False) == bad:
      raise UserError(f"config.json sets {key}={bad}; bertjax has only the bidirectional "
                      "encoder, so convert an encoder-only BERT checkpoint.")
  position_type = hf_config.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise UserError(f"config.json has position_embedding_type={position_type!r}; bertjax has "
                    "only 'absolute' position embeddings.")
  act = hf_config.get("hidden_act", "gelu")
  if act not in _ACTIVATIONS:
    raise UserError(f"config.json has hidden_act={act!r}; bertjax supports {sorted(_ACTIVATIONS)}"
                    " (exact or tanh GELU).")
  fields = dict(vocab_size="vocab_size", hidden_size="hidden_size",
                num_layers="num_hidden_layers", num_heads="num_attention_heads",
                intermediate_size="intermediate_size",
                max_position_embeddings="max_position_embeddings")
  absent = sorted(hf for hf in fields.values() if hf not in hf_config)
  if absent:
    raise UserError(f"config.json lacks {absent}; give the config.json saved with the model.")
  try:
    return BertConfig(
        **{ours: hf_config[hf] for ours, hf in fields.items()},
        type_vocab_size=hf_config.get("type_vocab_size", 2),
        dropout_rate=hf_config.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf_config.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
        initializer_range=hf_config.get("initializer_range", 0.02),
        hidden_act=_ACTIVATIONS[act])
  except ValueError as e:
    raise UserError(f"config.json does not describe a valid BERT: {e}") from None


def hf_task(hf_config: dict[str, Any]) -> tuple[str | None, int]:
  """(the task architecture (of the task heads of config.json's model_type's table) that
  config.json's `architectures` names, or None; its number of labels: len(id2label), else
  num_labels, else 2)."""
  table = hf_rules.TABLES.get(hf_config.get("model_type", "bert"), hf_rules.BERT)
  tasks = [a for a in hf_config.get("architectures") or () if a in table.task_heads]
  if len(tasks) > 1:
    raise UserError(f"config.json names several task architectures {tasks}; keep the one these "
                    "weights belong to.")
  num_labels = len(hf_config["id2label"]) if hf_config.get("id2label") else hf_config.get(
      "num_labels", 2)
  return (tasks[0] if tasks else None), int(num_labels)


def bert_config_to_hf_config(config: BertConfig,
                             architectures: Iterable[str] = ("BertForPreTraining",),
                             num_labels: int | None = None,
                             token_ids: dict[str, int | None] | None = None) -> dict[str, Any]:
  """bertjax BertConfig -> a transformers BertConfig dict (what config.json holds), or a
  ModernBertConfig dict for a ModernBERT (`hf_modernbert.to_hf_config`; `token_ids`, its
  special token ids, default to `hf_modernbert.special_token_ids` of no tokenizer).

  `num_labels`, for a task head, is written as generic `id2label` / `label2id`.
  """
  labels = {} if num_labels is None else {
      "id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
      "label2id": {f"LABEL_{i}": i for i in range(num_labels)}}
  if config.is_modernbert:
    if token_ids is None:
      token_ids = hf_modernbert.special_token_ids(None, config.vocab_size)
    return hf_modernbert.to_hf_config(config, architectures, labels, token_ids)
  return {**labels,
      "architectures": list(architectures),
      "model_type": "bert",
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size,
      "hidden_dropout_prob": config.dropout_rate,
      "attention_probs_dropout_prob": config.attention_dropout_rate,
      "layer_norm_eps": config.layer_norm_eps,
      "initializer_range": config.initializer_range,
      "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_new"}[config.hidden_act],
      "position_embedding_type": "absolute",
      "pad_token_id": 0,
      "tie_word_embeddings": True,
  }



def load_hf_config(hf_dir: str) -> dict[str, Any]:
  """HF_DIR/config.json as a dict."""
  path = os.path.join(hf_dir, "config.json")
  if not os.path.isfile(path):
    raise UserError(f"no config.json in {hf_dir}; give a directory written by "
                    "transformers' save_pretrained.")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); give the config.json saved with the "
                    "model.") from None


def _shards(hf_dir: str, single: str, index: str) -> list[str] | None:
  if os.path.isfile(os.path.join(hf_dir, single)):
    return [os.path.join(hf_dir, single)]
  index_path = os.path.join(hf_dir, index)
  if os.path.isfile(index_path):
    with open(index_path, encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(hf_dir, name) for name in files]
  return None


def _load_torch_file(path: str) -> dict[str, np.ndarray]:
  """A pytorch_model.bin read with torch's weights-only unpickler (no code runs)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError(f"{path} is a torch pickle and torch is not installed; install torch (CPU "
                    "build) or convert the checkpoint to model.safetensors.") from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # UnpicklingError, RuntimeError, ...: anything torch refuses
    raise UserError(f"{path} could not be read as plain weights ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}); it may hold code, not only "
                    "tensors. Use a model.safetensors from a source you trust.") from None
  if not isinstance(state, dict):
    raise UserError(f"{path} holds a {type(state).__name__}, not a dict of tensors; give a "
                    "state dict saved by save_pretrained.")
  return {name: t.detach().to(torch.float32).numpy() for name, t in state.items()
          if isinstance(t, torch.Tensor)}


def load_hf_state_dict(hf_dir: str) -> dict[str, np.ndarray]:
  """The weights of a save_pretrained directory as {name: float32 numpy array}.

  model.safetensors (or its sharded index) first, read with safetensors.numpy; otherwise
  pytorch_model.bin (or its index) through `torch.load(..., weights_only=True)`, so a pickle
  that would run code raises instead.

  Raises:
    UserError: no weights file, an unreadable file, or a pickle that is not plain weights.
  """
  from safetensors import SafetensorError  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  state: dict[str, np.ndarray] = {}
  files = _shards(hf_dir, "model.safetensors", "model.safetensors.index.json")
  if files is not None:
    for path in files:
      try:
        state.update(load_file(path))
      except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise UserError(f"{path} could not be read as safetensors ({e}); re-download or "
                        "re-save the model.") from None
    return {name: np.asarray(x, np.float32) for name, x in state.items()}
  files = _shards(hf_dir, "pytorch_model.bin", "pytorch_model.bin.index.json")
  if files is None:
    raise UserError(f"no model.safetensors or pytorch_model.bin in {hf_dir}; give a directory "
                    "written by transformers' save_pretrained.")
  for path in files:
    state.update(_load_torch_file(path))
  return state


