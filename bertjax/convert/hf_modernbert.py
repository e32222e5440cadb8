"""ModernBERT's config.json (transformers' ModernBertConfig) <-> BertConfig(architecture=
'modernbert'), and what bertjax refuses of it.

  config.json                                  BertConfig
  vocab_size, hidden_size, intermediate_size,  the same (num_hidden_layers -> num_layers,
  num_hidden_layers, num_attention_heads,      num_attention_heads -> num_heads)
  max_position_embeddings, initializer_range
  norm_eps                                     layer_norm_eps
  hidden_activation                            hidden_act ('gelu' exact; 'gelu_new',
                                               'gelu_pytorch_tanh' -> 'gelu_tanh')
  local_attention                              local_attention (the whole window)
  layer_types (transformers 5) or              global_attention_every: layer i global when
  global_attn_every_n_layers (earlier)         i % n == 0; another pattern is refused
  rope_parameters {"full_attention":           rope_theta_global, rope_theta_local
  {"rope_theta"}, "sliding_attention": {...}}
  (transformers 5) or global_rope_theta,
  local_rope_theta (earlier)
  classifier_pooling                           pooling ('cls' or 'mean')
  attention_dropout                            dropout_rate (the attention output's dropout,
                                               `modernbert.Layer`) and attention_dropout_rate
                                               (the probabilities'): transformers applies it
                                               to both (`attention_dropout`)

Refused, one UserError naming the field: biases bertjax's ModernBERT has not (norm_bias,
attention_bias, mlp_bias, classifier_bias: its head's Dense), no MLM decoder bias
(decoder_bias=false), a head activation other than the encoder's (classifier_activation), a
rope_type other than 'default' (or rope_scaling), a layer pattern that is not "global every n-th
from layer 0". Not weights, so not refused: embedding_dropout and mlp_dropout (bertjax has
neither dropout), classifier_dropout (bertjax's heads take dropout_rate), sparse_prediction,
deterministic_flash_attn, initializer_cutoff_factor (bertjax's is transformers' default, 2).

Dropout written back: transformers' one attention_dropout is bertjax's two rates where they are
equal; where they differ (ModernBERT's recipe: 0.1 on the attention output, none on the
probabilities) no value means the same there, so config.json gets 0.0 (the released ModernBERT
configs' value: fine-tuning in transformers without dropout unless the user sets it) and both
rates under "bertjax_dropout", which --from=hf reads back, and the export says so
(`dropout_note`).

Written back (`to_hf_config`): the fields transformers 5 reads (layer_types, rope_parameters)
and those earlier versions read (global_attn_every_n_layers, global_rope_theta,
local_rope_theta), so the directory loads in either; the special token ids from the tokenizer
saved with the model (`special_token_ids`).
"""
from __future__ import annotations

from typing import Any, Iterable

from bertjax.modeldir import model_files
from bertjax.errors import UserError
from bertjax.models.config import BertConfig

MODEL_TYPE = "modernbert"
DROPOUT_KEY = "bertjax_dropout"  # config.json: bertjax's two attention dropout rates
# Hugging Face hidden_activation -> bertjax hidden_act, and back.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' ModernBertConfig defaults of the fields read here.
_DEFAULTS = dict(max_position_embeddings=8192, initializer_range=0.02, norm_eps=1e-5,
                 hidden_activation="gelu", local_attention=128, global_attn_every_n_layers=3,
                 global_rope_theta=160_000.0, local_rope_theta=10_000.0,
                 classifier_pooling="cls", attention_dropout=0.0)
# transformers' special token ids, written when no tokenizer is saved with the model.
_TOKEN_IDS = dict(pad_token_id=50283, eos_token_id=50282, bos_token_id=50281,
                  cls_token_id=50281, sep_token_id=50282)
# Fields bertjax's ModernBERT has no weights or computation for: (name, the value it can take).
_FIXED = (("norm_bias", False), ("attention_bias", False), ("mlp_bias", False),
          ("classifier_bias", False), ("decoder_bias", True))
_SIZES = dict(vocab_size="vocab_size", hidden_size="hidden_size",
              num_layers="num_hidden_layers", num_heads="num_attention_heads",
              intermediate_size="intermediate_size")


def _get(hf_config: dict[str, Any], key: str):
  value = hf_config.get(key)
  return _DEFAULTS[key] if value is None else value


def layer_types(num_layers: int, every: int) -> list[str]:
  """transformers' layer_types of `every`: layer i full attention when i % every == 0."""
  return [SLIDING if i % every else FULL for i in range(num_layers)]


def global_attention_every(hf_config: dict[str, Any], num_layers: int) -> int:
  """BertConfig.global_attention_every of config.json's layer_types (or, without them, of its
  global_attn_every_n_layers).

  Raises:
    UserError: a pattern bertjax cannot express (global every n-th layer from layer 0).
  """
  types = hf_config.get("layer_types")
  if types is None:
    every = _get(hf_config, "global_attn_every_n_layers")
    if not isinstance(every, int) or every < 1:
      raise UserError(f"config.json has global_attn_every_n_layers={every!r}; it must be a "
                      "positive integer.")
    return every
  fulls = [i for i, kind in enumerate(types) if kind == FULL]
  every = fulls[1] if len(fulls) > 1 else max(num_layers, 1)
  if list(types) != layer_types(num_layers, every):
    raise UserError(
        f"config.json has layer_types={list(types)}; bertjax's ModernBERT attends globally "
        f"in every n-th layer from layer 0 ('{FULL}') and locally ('{SLIDING}') in the others "
        f"(global_attention_every), over num_hidden_layers={num_layers} layers, so this "
        "pattern cannot be converted.")
  return every


def _rope_thetas(hf_config: dict[str, Any]) -> tuple[float, float]:
  """(global, local) rotary bases of config.json; UserError for a rope bertjax has not."""
  if hf_config.get("rope_scaling"):
    raise UserError(f"config.json has rope_scaling={hf_config['rope_scaling']!r}; bertjax's "
                    "rotary embeddings are the default (unscaled) ones only.")
  thetas = []
  parameters = hf_config.get("rope_parameters") or {}
  for kind, old in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
    rope = dict(parameters.get(kind) or {})
    if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
      raise UserError(f"config.json's rope_parameters[{kind!r}] is {rope}; bertjax's rotary "
                      "embeddings take rope_type 'default' and a rope_theta only.")
    thetas.append(float(rope["rope_theta"] if "rope_theta" in rope else _get(hf_config, old)))
  return thetas[0], thetas[1]


def to_bert_config(hf_config: dict[str, Any]) -> BertConfig:
  """A ModernBertConfig (its config.json as a dict) -> BertConfig(architecture='modernbert').

  Raises:
    UserError: a missing size, or what bertjax cannot represent (the module docstring).
  """
  absent = sorted(hf for hf in _SIZES.values() if hf not in hf_config)
  if absent:
    raise UserError(f"config.json lacks {absent}; give the config.json saved with the model.")
  for key, allowed in _FIXED:
    if key in hf_config and bool(hf_config[key]) != allowed:
      raise UserError(f"config.json sets {key}={hf_config[key]!r}; bertjax's ModernBERT has "
                      f"only {key}={str(allowed).lower()} (the released models' layout), so "
                      "these weights cannot be converted.")
  act = _get(hf_config, "hidden_activation")
  if act not in ACTIVATIONS:
    raise UserError(f"config.json has hidden_activation={act!r}; bertjax supports "
                    f"{sorted(ACTIVATIONS)} (exact or tanh GELU).")
  head_act = hf_config.get("classifier_activation") or "gelu"  # transformers' default
  if ACTIVATIONS.get(head_act) != ACTIVATIONS[act]:
    raise UserError(f"config.json has classifier_activation={head_act!r} and hidden_activation="
                    f"{act!r}; bertjax's ModernBERT head uses the encoder's activation, so "
                    "they must be the same function.")
  pooling = _get(hf_config, "classifier_pooling")
  num_layers = hf_config["num_hidden_layers"]
  every = global_attention_every(hf_config, num_layers)
  theta_global, theta_local = _rope_thetas(hf_config)
  dropout = _get(hf_config, "attention_dropout")
  output_dropout, probabilities_dropout = _bertjax_dropout(hf_config, dropout)
  try:
    return BertConfig(
        **{ours: hf_config[hf] for ours, hf in _SIZES.items()},
        architecture="modernbert",
        max_position_embeddings=_get(hf_config, "max_position_embeddings"),
        layer_norm_eps=_get(hf_config, "norm_eps"),
        initializer_range=_get(hf_config, "initializer_range"), hidden_act=ACTIVATIONS[act],
        local_attention=_get(hf_config, "local_attention"), global_attention_every=every,
        rope_theta_global=theta_global, rope_theta_local=theta_local, pooling=pooling,
        dropout_rate=output_dropout, attention_dropout_rate=probabilities_dropout)
  except ValueError as e:
    raise UserError(f"config.json does not describe a ModernBERT bertjax can build: {e}"
                    ) from None


def _bertjax_dropout(hf_config: dict[str, Any], dropout: float) -> tuple[float, float]:
  """(the attention output's dropout, the probabilities'): config.json's bertjax_dropout where a
  bertjax export wrote it, else attention_dropout for both (transformers' meaning)."""
  rates = hf_config.get(DROPOUT_KEY)
  if rates is None:
    return dropout, dropout
  try:
    return float(rates["attention_output"]), float(rates["attention_probabilities"])
  except (KeyError, TypeError, ValueError):
    raise UserError(f"config.json's {DROPOUT_KEY}={rates!r} is not {{\"attention_output\": "
                    "rate, \"attention_probabilities\": rate}; fix or remove it (then "
                    "attention_dropout is read for both).") from None


def attention_dropout(config: BertConfig) -> dict[str, Any]:
  """config.json's dropout fields for bertjax's two attention rates (module docstring):
  {"attention_dropout": the rate} when they are equal, else 0.0 and both under bertjax_dropout."""
  if config.dropout_rate == config.attention_dropout_rate:
    return {"attention_dropout": config.dropout_rate}
  return {"attention_dropout": 0.0,
          DROPOUT_KEY: {"attention_output": config.dropout_rate,
                        "attention_probabilities": config.attention_dropout_rate}}


def dropout_note(config: BertConfig) -> str | None:
  """What the export tells the user when transformers cannot hold the model's dropout, else
  None."""
  if not config.is_modernbert or config.dropout_rate == config.attention_dropout_rate:
    return None
  return (f"config.json: attention_dropout=0.0: transformers applies one rate to the attention "
          f"probabilities and output, and this model trained with {config.dropout_rate} on the "
          f"output and {config.attention_dropout_rate} on the probabilities; both are kept under "
          f"{DROPOUT_KEY} (read back by --from=hf). Set attention_dropout to fine-tune with "
          "dropout in transformers.")


def special_token_ids(directory: str | None, vocab_size: int) -> dict[str, int | None]:
  """config.json's pad/bos/eos/cls/sep token ids: those of the tokenizer saved in `directory`
  ([PAD], [CLS], [SEP]); without one (or a readable one), transformers' defaults where the
  vocabulary has them, else None (an embedding's padding_idx must lie inside it)."""
  if directory is not None and model_files.tokenizer_files(directory):
    try:
      tokenizer = model_files.load_tokenizer(directory)
      return dict(pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.sep_id,
                  bos_token_id=tokenizer.cls_id, cls_token_id=tokenizer.cls_id,
                  sep_token_id=tokenizer.sep_id)
    except UserError:  # copied as it is; the ids fall back as without one
      pass
  return {k: (v if v < vocab_size else None) for k, v in _TOKEN_IDS.items()}


def to_hf_config(config: BertConfig, architectures: Iterable[str],
                 labels: dict[str, Any], token_ids: dict[str, int | None]) -> dict[str, Any]:
  """BertConfig(architecture='modernbert') -> a ModernBertConfig dict (config.json)."""
  act = _HF_ACTIVATION[config.hidden_act]
  every = config.global_attention_every
  return {**labels,
      "architectures": list(architectures),
      "model_type": MODEL_TYPE,
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "hidden_activation": act,
      "max_position_embeddings": config.max_position_embeddings,
      "initializer_range": config.initializer_range,
      "initializer_cutoff_factor": 2.0,
      "norm_eps": config.layer_norm_eps,
      "norm_bias": False,
      "attention_bias": False,
      "mlp_bias": False,
      **attention_dropout(config),
      "embedding_dropout": 0.0,
      "mlp_dropout": 0.0,
      "local_attention": config.local_attention,
      "layer_types": layer_types(config.num_layers, every),
      "global_attn_every_n_layers": every,
      "rope_parameters": {
          FULL: {"rope_theta": config.rope_theta_global, "rope_type": "default"},
          SLIDING: {"rope_theta": config.rope_theta_local, "rope_type": "default"}},
      "global_rope_theta": config.rope_theta_global,
      "local_rope_theta": config.rope_theta_local,
      "decoder_bias": True,
      "classifier_pooling": config.pooling,
      "classifier_dropout": config.dropout_rate,
      "classifier_bias": False,
      "classifier_activation": act,
      "tie_word_embeddings": True,
      **token_ids,
  }
