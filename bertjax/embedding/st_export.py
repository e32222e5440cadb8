"""A bertjax model written as a sentence-transformers directory, which sentence-transformers
loads (`SentenceTransformer(DIR)`) and which embeds as bertjax does.

  python -m bertjax.embedding.st_export --src=MODEL_DIR --dst=ST_DIR --pooling=mean [--normalize]
      [--max_seq_length=N]

MODEL_DIR is a bertjax model directory or workdir, BERT or ModernBERT. ST_DIR gets the encoder as
`python -m bertjax.convert --to=hf` writes it (config.json, model.safetensors, the tokenizer
files transformers loads), then the modules: modules.json (Transformer, Pooling, Normalize where
asked), 1_Pooling/config.json, sentence_bert_config.json and config_sentence_transformers.json,
in the format of sentence-transformers before version 6 (module types
sentence_transformers.models.*, pooling_mode_* flags), which versions 2 to 6 all read.
`bertjax.embedding.embedder.Embedder.load(ST_DIR)` reads it back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from bertjax.convert import __main__ as convert
from bertjax.embedding import st_files
from bertjax.errors import UserError
from bertjax.modeldir import model_files

_LEGACY_FLAGS = {mode: flag for flag, mode in st_files.LEGACY_POOLING.items()}


def _write_json(path: str, value) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
    f.write("\n")


def export(src: str, dst: str, pooling_modes: tuple[str, ...], normalize: bool = False,
           max_seq_length: int = 0) -> None:
  """Writes the sentence-transformers directory `dst` of the bertjax model `src` (module
  docstring); `max_seq_length` 0 is the model's max_position_embeddings."""
  if not pooling_modes:
    raise UserError("give --pooling (mean, cls, max, mean_sqrt_len_tokens, weightedmean or "
                    "lasttoken): a sentence-transformers model says how it pools.")
  bad = [m for m in pooling_modes if m not in st_files.POOLING_MODES]
  if bad:
    raise UserError(f"--pooling={bad[0]}; use {', '.join(st_files.POOLING_MODES)}.")
  if os.path.isdir(src) and st_files.is_sentence_transformers_dir(src):
    raise UserError(f"--src={src} is a sentence-transformers directory already.")
  if not os.path.isdir(src):
    raise UserError(f"--src={src} is not a directory; give a bertjax model directory.")
  model_dir = model_files.find_model_dir(src)
  config = model_files.load_bert_config(model_dir)
  length = max_seq_length or config.max_position_embeddings
  if not 2 <= length <= config.max_position_embeddings:
    raise UserError(f"--max_seq_length={length}; use 2 to the model's "
                    f"{config.max_position_embeddings} positions.")
  convert.to_hf_dir(model_dir, dst)  # refuses a dst that holds files
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling",
              "type": "sentence_transformers.models.Pooling"}]
  if normalize:
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    os.makedirs(os.path.join(dst, "2_Normalize"), exist_ok=True)
  _write_json(os.path.join(dst, st_files.MODULES_FILE), modules)
  _write_json(os.path.join(dst, "1_Pooling", "config.json"), {
      "word_embedding_dimension": config.hidden_size,
      **{flag: mode in pooling_modes for mode, flag in _LEGACY_FLAGS.items()},
      "include_prompt": True})
  _write_json(os.path.join(dst, "sentence_bert_config.json"),
              {"max_seq_length": length, "do_lower_case": False})
  _write_json(os.path.join(dst, "config_sentence_transformers.json"),
              {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.embedding.st_export",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--src", required=True, help="a bertjax model directory or workdir")
  parser.add_argument("--dst", required=True, help="a new (or empty) directory")
  parser.add_argument("--pooling", required=True, help="comma-separated pooling modes")
  parser.add_argument("--normalize", action="store_true", help="unit vectors (Normalize)")
  parser.add_argument("--max_seq_length", type=int, default=0,
                      help="tokens a text is cut to (0: the model's positions)")
  args = parser.parse_args(argv)
  try:
    export(args.src, args.dst, tuple(m.strip() for m in args.pooling.split(",") if m.strip()),
           args.normalize, args.max_seq_length)
  except UserError as e:
    print(f"st_export: error: {e}", file=sys.stderr)
    return 2
  print(f"wrote the sentence-transformers model {args.dst} (pooling {args.pooling}"
        f"{', normalized' if args.normalize else ''})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
