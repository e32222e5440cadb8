"""A model directory: what makes a checkpoint a model others can start from.

  DIR/bert_config.json   the BertConfig fields (bertjax's names) that describe the weights, as
                         JSON; vocab_size is the real vocabulary, pad_vocab_to_multiple gives
                         the rows of the saved embedding table and MLM bias, causal whether the
                         model attends left to right only (a file without it: false)
  DIR/checkpoints/       orbax step directories (`bertjax.modeldir.layout`); `params` holds
                         the weights that `bertjax.modeldir.saved_params` loads
  DIR/vocab.txt or DIR/vocab.model or DIR/tokenizer.json, DIR/tokenizer_config.json, ...
                         the tokenizer: WordPiece (vocab.txt, maybe with Hugging Face's
                         tokenizer.json beside it), sentencepiece, or a byte-level BPE
                         tokenizer.json alone (ModernBERT's); every file of TOKENIZER_FILES
                         present is carried along when a model directory is written

A pretraining or fine-tuning workdir is one, and so is what `python -m bertjax.convert` writes;
`config.init_checkpoint` may name the directory or a checkpoint inside it (`find_model_dir`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from bertjax import tokenization, workdir
from bertjax.errors import UserError
from bertjax.models.config import BertConfig
from bertjax.modeldir import checkpoint_faults, layout

BERT_CONFIG_FILE = "bert_config.json"
# Tokenizer files a model directory may hold (Google's, Hugging Face's and sentencepiece's names):
# tokenizer.json is a WordPiece vocab.txt's Hugging Face twin, or a byte-level BPE tokenizer alone.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.model")


# BertConfig fields that are how a run computes, not what the model is: they change no
# parameter, so bert_config.json leaves them out and a run that starts from the model takes them
# from its own config (`model_options.bert_overrides`).
RUN_CHOICES = ("attention", "remat", "mlm_logits_dtype", "fused_qkv", "dropout_per_hash",
               "local_kernel", "fp8")


def bert_config_json(config: BertConfig) -> str:
  """The text of bert_config.json for `config`: every field but RUN_CHOICES."""
  fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in RUN_CHOICES}
  return json.dumps(fields, indent=2) + "\n"


def load_bert_config(directory: str) -> BertConfig:
  """DIRECTORY/bert_config.json -> BertConfig.

  RUN_CHOICES found there are ignored (BertConfig's defaults; the run sets its own). A file
  without pad_vocab_to_multiple (written before bertjax padded the vocabulary) gets BertConfig's
  default; `saved_params.load_params(..., vocab_size=...)` pads its unpadded weights on load.
  """
  path = os.path.join(directory, BERT_CONFIG_FILE)
  if not os.path.isfile(path):
    raise UserError(f"no {BERT_CONFIG_FILE} in {directory}; give a directory written by "
                    "`python -m bertjax.convert --from=hf` (or write the model's BertConfig "
                    "fields there as JSON).")
  with open(path, encoding="utf-8") as f:
    fields = json.load(f)
  if not isinstance(fields, dict):
    raise UserError(f"{path} is not a JSON object of BertConfig fields; fix or rewrite it.")
  try:
    return BertConfig(**{k: v for k, v in fields.items() if k not in RUN_CHOICES})
  except (TypeError, ValueError) as e:
    raise UserError(f"{path} is not a valid BertConfig ({e}); fix or rewrite it.") from None


def find_model_dir(path: str) -> str:
  """The directory holding bert_config.json: `path`, or a parent of a checkpoint inside it."""
  candidate = os.path.abspath(path)
  for _ in range(3):  # OUT, OUT/checkpoints, OUT/checkpoints/STEP
    if os.path.isfile(os.path.join(candidate, BERT_CONFIG_FILE)):
      return candidate
    candidate = os.path.dirname(candidate)
  raise UserError(f"no {BERT_CONFIG_FILE} at or above {path}; give a pretraining workdir or "
                  "a directory from `python -m bertjax.convert --from=hf` (or --from=tf).")


def tokenizer_files(directory: str) -> list[str]:
  """The paths of the tokenizer files (TOKENIZER_FILES) that exist in `directory`."""
  return [os.path.join(directory, n) for n in TOKENIZER_FILES
          if os.path.isfile(os.path.join(directory, n))]


def tokenizer_file_contents(directory: str) -> dict[str, bytes]:
  """{file name: contents} of the tokenizer files in `directory`, for a fine-tuning workdir to
  carry them along (`task.Task.files`), so that it is a model directory in turn."""
  out = {}
  for path in tokenizer_files(directory):
    with open(path, "rb") as f:
      out[os.path.basename(path)] = f.read()
  return out


def load_tokenizer(directory: str) -> tokenization.Tokenizer:
  """The tokenizer saved in a model directory: vocab.model (sentencepiece), vocab.txt
  (WordPiece, cased or not as tokenizer_config.json says) or, with neither, a byte-level BPE
  tokenizer.json (`tokenization.ByteLevelBPETokenizer`)."""
  if os.path.isfile(os.path.join(directory, tokenization.MODEL_FILE)):
    return tokenization.SentencePieceTokenizer(os.path.join(directory, tokenization.MODEL_FILE))
  return tokenization.load_tokenizer(directory)


def save_model_dir(out_dir: str, params: dict[str, Any], config: BertConfig,
                   tokenizer_paths: Iterable[str] = ()) -> None:
  """Writes a model directory that `config.init_checkpoint=OUT` can start from.

  OUT/checkpoints/0: {'step': int32 0, 'params': params} and no data position
  (`bertjax.modeldir.layout`); OUT/bert_config.json: the BertConfig fields; and each of
  `tokenizer_paths` copied into OUT. A step 0 already there is kept, not overwritten.

  Raises:
    UserError: the disk is full (the partial step directory is removed).
  """
  os.makedirs(out_dir, exist_ok=True)
  state = {"step": jnp.asarray(0, jnp.int32), "params": jax.tree.map(jnp.asarray, params)}
  directory = os.path.join(os.path.abspath(out_dir), workdir.CHECKPOINTS_DIR)
  checkpoint_faults.install_quiet_failures()
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  with ocp.CheckpointManager(directory, item_handlers=layout.handlers(),
                             options=options) as manager:
    try:
      manager.save(0, force=True, args=ocp.args.Composite(**{
          layout.STATE_ITEM: ocp.args.StandardSave(state),
          layout.DATA_ITEM: ocp.args.JsonSave({"data_position": None})}))
      manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      if not checkpoint_faults.is_disk_full(e):
        raise
      checkpoint_faults.remove_partial_saves(epath.Path(directory))
      raise UserError(f"the disk holding {out_dir} is full ({checkpoint_faults.reason(e)}): "
                      "the model's parameters could not be written (the partial directory is "
                      "removed). Free space on that disk and run the same command again.") from e
  with open(os.path.join(out_dir, BERT_CONFIG_FILE), "w", encoding="utf-8") as f:
    f.write(bert_config_json(config))
  for path in tokenizer_paths:
    shutil.copy(path, os.path.join(out_dir, os.path.basename(path)))
