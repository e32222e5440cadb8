"""Embeds texts: one vector a text, from a sentence-transformers, Hugging Face or bertjax model.

  python -m bertjax.embed --model=DIR --input=FILE --output=OUT.npy [--field=NAME]
      [--pooling=mean] [--normalize] [--prompt=TEXT | --prompt_name=NAME] [--batch_size=32]
      [--max_seq_length=N] [--dtype=float32|float16]

FILE holds one text a line, or (with --field, or a .jsonl name) one JSON object a line whose
field NAME (default "text") is the text. OUT.npy gets a [texts, dimension] array in FILE's order
(`numpy.load`). DIR and what is computed from it: `bertjax.embedding.embedder`; a directory that
is not sentence-transformers' needs --pooling (and --normalize for unit vectors). Nothing is
overwritten; bad input is one line and exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from bertjax.data import sources
from bertjax.embedding import embedder as embedder_lib
from bertjax.embedding import st_files
from bertjax.errors import UserError


def read_texts(path: str, field: str | None) -> list[str]:
  """The texts of FILE (module docstring): lines, or a JSONL field (`field`, or "text" for a
  .jsonl file)."""
  if not os.path.isfile(path):
    raise UserError(f"--input={path} is not a file; give a text file (one text a line) or a "
                    "JSONL file.")
  with open(path, "rb") as f:
    lines = sources.decode_text(path, f.read()).splitlines()
  if not lines:
    raise UserError(f"{path} is empty; give one text a line.")
  if field is None and not path.endswith(".jsonl"):
    return lines
  field = field or "text"
  texts = []
  for number, line in enumerate(lines, start=1):
    try:
      value = json.loads(line)[field]
    except (ValueError, TypeError, KeyError, IndexError):
      raise UserError(f"{path} line {number} is not a JSON object with a {field!r} field; give "
                      "one object a line, or --field=NAME for another field.") from None
    if not isinstance(value, str):
      raise UserError(f"{path} line {number}: {field!r} is {type(value).__name__}, not text.")
    texts.append(value)
  return texts


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.embed", description=__doc__.split(
      "\n")[0])
  parser.add_argument("--model", required=True, help="the model directory")
  parser.add_argument("--input", required=True, help="texts: one a line, or JSONL")
  parser.add_argument("--output", required=True, help="a new .npy file")
  parser.add_argument("--field", help="JSONL: the field holding the text (default: text)")
  parser.add_argument("--pooling", help="comma-separated pooling modes, for a directory that "
                      f"is not sentence-transformers' ({', '.join(st_files.POOLING_MODES)})")
  parser.add_argument("--normalize", action="store_true",
                      help="with --pooling: divide each embedding by its L2 norm")
  parser.add_argument("--prompt", help="text prepended to each input")
  parser.add_argument("--prompt_name", help="one of the model's prompts, by name")
  parser.add_argument("--batch_size", type=int, default=32, help="texts a batch")
  parser.add_argument("--max_seq_length", type=int, default=0,
                      help="cut texts to this many tokens (0: the model's)")
  parser.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                      help="of the array written")
  args = parser.parse_args(argv)
  try:
    if not args.output.endswith(".npy"):
      raise UserError(f"--output={args.output}: name a .npy file (numpy.save's format).")
    if os.path.exists(args.output):
      raise UserError(f"--output={args.output} exists; name a new file (nothing is "
                      "overwritten).")
    texts = read_texts(args.input, args.field)
    model = embedder_lib.Embedder.from_flags(args.model, args.pooling, args.normalize,
                                             args.max_seq_length)
    vectors = model.encode(texts, batch_size=args.batch_size, prompt=args.prompt,
                           prompt_name=args.prompt_name, progress=True,
                           dtype=np.dtype(args.dtype))
  except UserError as e:
    print(f"embed: error: {e}", file=sys.stderr)
    return 2
  partial = args.output[:-len(".npy")] + ".partial.npy"
  np.save(partial, vectors)
  os.replace(partial, args.output)
  print(f"embedded {len(texts)} texts: [{vectors.shape[0]}, {vectors.shape[1]}] {args.dtype} -> "
        f"{args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
