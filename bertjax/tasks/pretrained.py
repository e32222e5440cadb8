"""The pretrained model that `config.init_checkpoint` names: its directory and its tokenizer.

A pretraining workdir and a directory written by `python -m bertjax.convert` both hold
bert_config.json (the model's BertConfig) and the tokenizer (vocab.model or vocab.txt) beside
checkpoints/; init_checkpoint may name that directory or a checkpoint inside it.
"""
from __future__ import annotations

import os

from bertjax import tokenization
from bertjax.convert import hf
from bertjax.errors import UserError


def find_model_dir(path: str) -> str:
  """The directory holding bert_config.json: `path`, or a parent of a checkpoint inside it."""
  candidate = os.path.abspath(path)
  for _ in range(3):  # OUT, OUT/checkpoints, OUT/checkpoints/STEP
    if os.path.isfile(os.path.join(candidate, hf.BERT_CONFIG_FILE)):
      return candidate
    candidate = os.path.dirname(candidate)
  raise UserError(f"no {hf.BERT_CONFIG_FILE} at or above {path}; give a pretraining workdir or "
                  "a directory from `python -m bertjax.convert --from=hf` (or --from=tf).")


def tokenizer_files(model_dir: str) -> dict[str, bytes]:
  """{file name: contents} of the tokenizer files beside a model (vocab.txt, vocab.model,
  tokenizer_config.json, ...), for a fine-tuning workdir to carry them along, so that the
  workdir is itself a model directory (init_checkpoint, `convert --to=hf`)."""
  out = {}
  for path in hf.tokenizer_files(model_dir):
    with open(path, "rb") as f:
      out[os.path.basename(path)] = f.read()
  return out


def load_tokenizer(model_dir: str) -> tokenization.Tokenizer:
  """The tokenizer saved beside a model: vocab.model (sentencepiece) or vocab.txt (WordPiece)."""
  if os.path.isfile(os.path.join(model_dir, "vocab.model")):
    return tokenization.SentencePieceTokenizer(os.path.join(model_dir, "vocab.model"))
  return tokenization.load_tokenizer(model_dir)
