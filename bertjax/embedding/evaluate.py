"""Evaluates a model's sentence embeddings: retrieval, STS or SentEval transfer, as one JSON line.

  python -m bertjax.embedding.evaluate --model=DIR
      (--retrieval=BEIR_DIR [--split=test] | --sts=FILE | --transfer=mr|FILE [--folds=10])
      [--pooling=mean] [--normalize] [--prompt=TEXT | --prompt_name=NAME]
      [--query_prompt=TEXT] [--document_prompt=TEXT] [--batch_size=32] [--max_seq_length=N]
      [--output=FILE.json]

DIR is what `python -m bertjax.embed` takes (`bertjax.embedding.embedder`). The data: a BEIR
directory, an STS file of scored pairs, "mr" (the bundled movie reviews) or a TSV of labelled
texts (`bertjax.embedding.eval_files`); the metrics and whose rules they follow:
`bertjax.embedding.evaluation`. Retrieval embeds queries with the model's "query" prompt and
documents with its "document" (else "passage", else "corpus") prompt where it has them, as
sentence-transformers' encode_query and encode_document do; --query_prompt and
--document_prompt replace them, and --prompt or --prompt_name applies to every text. The JSON
line is printed, and written to FILE.json where asked (never over an existing file); bad input
is one line and exit 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from bertjax.embedding import embedder as embedder_lib
from bertjax.embedding import eval_files, evaluation, st_files
from bertjax.errors import UserError

_DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # sentence-transformers' encode_document


def _prompt(model: embedder_lib.Embedder, side: str | None, args: argparse.Namespace,
            names: tuple[str, ...]) -> dict[str, str]:
  """encode's prompt arguments for one side of a retrieval (module docstring)."""
  if side is not None:
    return {"prompt": side}
  if args.prompt is not None or args.prompt_name is not None:
    return {"prompt": args.prompt, "prompt_name": args.prompt_name}
  return next(({"prompt_name": n} for n in names if n in model.recipe.prompts), {})


def _check(args: argparse.Namespace) -> str:
  """The evaluation asked for ("retrieval", "sts" or "transfer"); UserError for flags that do
  not go together."""
  asked = [name for name in ("retrieval", "sts", "transfer") if getattr(args, name)]
  if len(asked) != 1:
    raise UserError("give one of --retrieval=BEIR_DIR, --sts=FILE and --transfer=mr|FILE" +
                    (f", not {' and '.join('--' + a for a in asked)}." if asked else "."))
  if args.output is not None:
    if not args.output.endswith(".json"):
      raise UserError(f"--output={args.output}: name a .json file.")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
      raise UserError(f"--output={args.output}: its directory does not exist; create it.")
    if os.path.exists(args.output):
      raise UserError(f"--output={args.output} exists; name a new file (nothing is "
                      "overwritten).")
  embedder_lib.check_flags(args.pooling, args.normalize)
  sides = [f for f in ("query_prompt", "document_prompt") if getattr(args, f) is not None]
  if sides and asked != ["retrieval"]:
    raise UserError(f"--{sides[0]} is for --retrieval; give --prompt for every text.")
  if args.split is not None and asked != ["retrieval"]:
    raise UserError("--split is for --retrieval (the qrels file of a BEIR directory).")
  if args.folds is not None and asked != ["transfer"]:
    raise UserError("--folds is for --transfer.")
  return asked[0]


def evaluate(args: argparse.Namespace) -> dict:
  """The result line of `args` (module docstring): what was evaluated, and its metrics."""
  kind = _check(args)
  if kind == "retrieval":
    data = eval_files.read_beir(args.retrieval, args.split or "test")
  elif kind == "sts":
    data = eval_files.read_sts(args.sts)
  else:
    data = eval_files.read_transfer(args.transfer)
    evaluation.check_folds(data[1], args.folds or 10)
  model = embedder_lib.Embedder.from_flags(args.model, args.pooling, args.normalize,
                                           args.max_seq_length)
  common = {"prompt": args.prompt, "prompt_name": args.prompt_name}

  def encode(texts, **prompt):  # each distinct text once: copies tie exactly
    unique, inverse = np.unique(np.asarray(texts, object), return_inverse=True)
    return model.encode(list(unique), batch_size=args.batch_size, progress=True,
                        **prompt)[inverse]

  result = {"model": args.model, "evaluation": kind, "data": getattr(args, kind)}
  if kind == "retrieval":
    queries = encode(data.queries, **_prompt(model, args.query_prompt, args, ("query",)))
    documents = encode(data.documents, **_prompt(model, args.document_prompt, args,
                                                 _DOCUMENT_PROMPTS))
    result.update(split=args.split or "test", documents=len(documents),
                  **evaluation.retrieval(queries, documents, data.qrels))
  elif kind == "sts":
    a, b, scores = data
    result.update(pairs=len(scores), **evaluation.sts(encode(a, **common), encode(b, **common),
                                                      scores))
  else:
    texts, labels = data
    result.update(examples=len(texts), folds=args.folds or 10,
                  **evaluation.transfer(encode(texts, **common), labels, args.folds or 10))
  return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in result.items()}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.embedding.evaluate",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True, help="the model directory")
  parser.add_argument("--retrieval", help="a BEIR directory: corpus.jsonl, queries.jsonl, qrels/")
  parser.add_argument("--split", help="--retrieval: the qrels file, qrels/SPLIT.tsv (test)")
  parser.add_argument("--sts", help="a TSV of scored pairs (sentence1, sentence2, score)")
  parser.add_argument("--transfer", help="mr (the bundled movie reviews), or a TSV of "
                      "label<TAB>text")
  parser.add_argument("--folds", type=int, help="--transfer: cross-validation folds (10)")
  parser.add_argument("--pooling", help="comma-separated pooling modes, for a directory that "
                      f"is not sentence-transformers' ({', '.join(st_files.POOLING_MODES)})")
  parser.add_argument("--normalize", action="store_true",
                      help="with --pooling: divide each embedding by its L2 norm")
  parser.add_argument("--prompt", help="text prepended to every input")
  parser.add_argument("--prompt_name", help="one of the model's prompts, by name, for every input")
  parser.add_argument("--query_prompt", help="--retrieval: text prepended to each query")
  parser.add_argument("--document_prompt", help="--retrieval: text prepended to each document")
  parser.add_argument("--batch_size", type=int, default=32, help="texts a batch")
  parser.add_argument("--max_seq_length", type=int, default=0,
                      help="cut texts to this many tokens (0: the model's)")
  parser.add_argument("--output", help="also write the JSON line to this new .json file")
  args = parser.parse_args(argv)
  try:
    result = evaluate(args)
  except UserError as e:
    print(f"evaluate: error: {e}", file=sys.stderr)
    return 2
  line = json.dumps(result)
  if args.output is not None:
    partial = args.output + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
      f.write(line + "\n")
    os.replace(partial, args.output)
  print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
