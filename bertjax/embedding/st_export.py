"""A bertjax model written as a sentence-transformers directory, which sentence-transformers
loads (`SentenceTransformer(DIR)`) and which embeds as bertjax does.

  python -m bertjax.embedding.st_export --src=MODEL_DIR --dst=ST_DIR --pooling=mean [--normalize]
      [--max_seq_length=N]
  python -m bertjax.embedding.st_export --src=WORKDIR --dst=ST_DIR

MODEL_DIR is a bertjax model directory or workdir, BERT or ModernBERT; a contrastive run's
WORKDIR (`bertjax.tasks.embeddings`) has its pooling, normalisation, length and prompts. ST_DIR gets the encoder as
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
import shutil
import sys

from bertjax.convert import __main__ as convert
from bertjax.embedding import embedder, st_files
from bertjax.errors import UserError
from bertjax.modeldir import model_files

# A contrastive run's workdir keeps its starting model's Hugging Face tokenizer files.
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_LEGACY_FLAGS = {mode: flag for flag, mode in st_files.LEGACY_POOLING.items()}


def _write(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def module_files(hidden_size: int, pooling_modes: tuple[str, ...], *, normalize: bool = False,
                 max_seq_length: int, include_prompt: bool = True, do_lower_case: bool = False,
                 prompts: dict[str, str] | None = None) -> dict[str, str]:
  """{path in the directory: JSON text} of the module files that make a model directory a
  sentence-transformers one (module docstring), its Transformer module the directory itself:
  modules.json, 1_Pooling/config.json (2_Normalize/ is an empty directory, named by
  modules.json), sentence_bert_config.json and config_sentence_transformers.json."""
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling",
              "type": "sentence_transformers.models.Pooling"}]
  if normalize:
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
  text = lambda value: json.dumps(value, indent=2) + "\n"
  return {
      st_files.MODULES_FILE: text(modules),
      "1_Pooling/config.json": text({
          "word_embedding_dimension": hidden_size,
          **{flag: mode in pooling_modes for mode, flag in _LEGACY_FLAGS.items()},
          "include_prompt": include_prompt}),
      "sentence_bert_config.json": text({"max_seq_length": max_seq_length,
                                         "do_lower_case": do_lower_case}),
      "config_sentence_transformers.json": text({
          "prompts": dict(prompts or {}), "default_prompt_name": None,
          "similarity_fn_name": "cosine"})}


def export(src: str, dst: str, pooling_modes: tuple[str, ...] = (), normalize: bool = False,
           max_seq_length: int = 0) -> None:
  """Writes the sentence-transformers directory `dst` of the bertjax model `src` (module
  docstring); `max_seq_length` 0 is the model's max_position_embeddings. A workdir of a
  contrastive run (`bertjax.tasks.embeddings`) holds its own modules: its pooling,
  normalisation, length and prompts are exported, and the flags may not change them."""
  if not os.path.isdir(src):
    raise UserError(f"--src={src} is not a directory; give a bertjax model directory.")
  trained = st_files.is_sentence_transformers_dir(src)
  if trained and not os.path.isfile(os.path.join(src, model_files.BERT_CONFIG_FILE)):
    raise UserError(f"--src={src} is a sentence-transformers directory already.")
  if trained and (pooling_modes or normalize or max_seq_length):
    raise UserError(f"--src={src} is a contrastive run's workdir with its own pooling, "
                    "normalisation and length; leave --pooling, --normalize and "
                    "--max_seq_length out.")
  recipe = st_files.read_recipe(src) if trained else None
  if recipe is not None:
    pooling_modes, normalize = recipe.pooling, recipe.normalize
    max_seq_length = recipe.max_seq_length or 0
  if not pooling_modes:
    raise UserError("give --pooling (mean, cls, max, mean_sqrt_len_tokens, weightedmean or "
                    "lasttoken): a sentence-transformers model says how it pools.")
  bad = [m for m in pooling_modes if m not in st_files.POOLING_MODES]
  if bad:
    raise UserError(f"--pooling={bad[0]}; use {', '.join(st_files.POOLING_MODES)}.")
  model_dir = model_files.find_model_dir(src)
  config = model_files.load_bert_config(model_dir)
  length = max_seq_length or config.max_position_embeddings
  if not 2 <= length <= config.max_position_embeddings:
    raise UserError(f"--max_seq_length={length}; use 2 to the model's "
                    f"{config.max_position_embeddings} positions.")
  convert.to_hf_dir(model_dir, dst)  # refuses a dst that holds files
  if trained and os.path.isfile(os.path.join(src, _HF_TOKENIZER_FILES[0])):
    for name in _HF_TOKENIZER_FILES:  # the tokenizer it was trained and embeds with, as it is
      if os.path.isfile(os.path.join(src, name)):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
  files = module_files(config.hidden_size, pooling_modes, normalize=normalize,
                       max_seq_length=length,
                       include_prompt=recipe.include_prompt if recipe else True,
                       prompts=recipe.prompts if recipe else None)
  for name, text in files.items():
    _write(os.path.join(dst, name), text)
  if normalize:
    os.makedirs(os.path.join(dst, "2_Normalize"), exist_ok=True)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.embedding.st_export",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--src", required=True, help="a bertjax model directory or workdir")
  parser.add_argument("--dst", required=True, help="a new (or empty) directory")
  parser.add_argument("--pooling", default="", help="comma-separated pooling modes (not for a "
                      "contrastive run's workdir, which has its own)")
  parser.add_argument("--normalize", action="store_true", help="unit vectors (Normalize)")
  parser.add_argument("--max_seq_length", type=int, default=0,
                      help="tokens a text is cut to (0: the model's positions)")
  args = parser.parse_args(argv)
  try:
    export(args.src, args.dst, embedder.pooling_modes(args.pooling),
           args.normalize, args.max_seq_length)
  except UserError as e:
    print(f"st_export: error: {e}", file=sys.stderr)
    return 2
  recipe = st_files.read_recipe(args.dst)
  print(f"wrote the sentence-transformers model {args.dst} (pooling {','.join(recipe.pooling)}"
        f"{', normalized' if recipe.normalize else ''})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
