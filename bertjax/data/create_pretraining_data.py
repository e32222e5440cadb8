"""Static masking: text files -> masked MLM + NSP examples in .npz shards.

  python -m bertjax.data.create_pretraining_data --input_file=GLOB[,GLOB] \\
    --vocab_model=SPM.model --output_dir=DIR --max_seq_length=128 \\
    --max_predictions_per_seq=20 --masked_lm_prob=0.15 --short_seq_prob=0.1 --dupe_factor=5 \\
    --random_seed=12345 --whole_word_masking=false --num_shards=4

The input is one sentence per line with a blank line between documents, as google-research/bert
takes. The corpus is paired `dupe_factor` times (each pass pairs and masks differently), the
examples are shuffled and written as DIR/examples-XXXXX-of-YYYYY.npz with the batch keys
(`input_ids segment_ids input_mask next_sentence_label masked_lm_positions masked_lm_ids
masked_lm_weights`; next_sentence_label is is_random_next: 1 = B is random) plus DIR/info.json
(the flags and the counts). Point `config.data.static_examples` at DIR, or read the shards
with `load_static_examples`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from bertjax.data import pretraining_examples as pe
from bertjax.data.pretraining_examples import load_static_examples  # noqa: F401 (re-export)
from bertjax.errors import UserError

_MASK_CHUNK = 4096  # examples masked at a time


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes"):
    return True
  if text.lower() in ("0", "false", "no"):
    return False
  raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m bertjax.data.create_pretraining_data",
                              description=__doc__.split("\n")[0])
  p.add_argument("--input_file", required=True,
                 help="text files: comma-separated globs (one sentence per line, blank line "
                 "between documents)")
  p.add_argument("--vocab_model", required=True, help="sentencepiece .model file")
  p.add_argument("--output_dir", required=True, help="new or empty directory for the shards")
  p.add_argument("--max_seq_length", type=int, default=128, help="tokens per example")
  p.add_argument("--max_predictions_per_seq", type=int, default=20,
                 help="masked positions per example at most")
  p.add_argument("--masked_lm_prob", type=float, default=0.15, help="fraction of tokens masked")
  p.add_argument("--short_seq_prob", type=float, default=0.1,
                 help="chance a document pass targets a shorter length")
  p.add_argument("--dupe_factor", type=int, default=10,
                 help="passes over the corpus, each with different pairs and masks")
  p.add_argument("--random_seed", type=int, default=12345, help="seed of all random choices")
  p.add_argument("--whole_word_masking", type=_bool, default=False,
                 help="mask all pieces of a word together (true/false)")
  p.add_argument("--num_shards", type=int, default=1, help="number of .npz files")
  return p


def create_static_examples(documents: Sequence[Sequence[Sequence[int]]],
                           special: pe.SpecialTokens, rng: np.random.Generator, *,
                           max_seq_length: int, max_predictions_per_seq: int,
                           masked_lm_prob: float, short_seq_prob: float, dupe_factor: int,
                           word_start_table: np.ndarray | None) -> dict[str, np.ndarray]:
  """Tokenized documents -> a shuffled, masked example set (PAIR_KEYS + MASK_KEYS).

  Like the original: the documents are shuffled, paired dupe_factor times, masked, and the
  examples shuffled, all from `rng`. word_start_table ([vocab_size] bool) turns on whole-word
  masking.
  """
  documents = [documents[i] for i in rng.permutation(len(documents))]
  examples = pe.create_segment_pairs(documents, max_seq_length, short_seq_prob, rng, special,
                                     dupe_factor=dupe_factor)
  masked = []
  for start in range(0, len(examples["input_ids"]), _MASK_CHUNK):
    ids = examples["input_ids"][start:start + _MASK_CHUNK]  # [chunk, seq]
    masked.append(pe.mask_batch(
        ids, examples["input_mask"][start:start + _MASK_CHUNK], rng, special, masked_lm_prob,
        max_predictions_per_seq,
        None if word_start_table is None else word_start_table[ids]))
  examples.update({key: np.concatenate([m[key] for m in masked]) for key in masked[0]})
  order = rng.permutation(len(examples["input_ids"]))
  return {key: value[order] for key, value in examples.items()}


def run(args: argparse.Namespace) -> dict[str, int]:
  """Does the work of the command line; returns the counts written to info.json."""
  # Imported here so the rest of bertjax.data does not depend on them.
  from bertjax import tokenization
  from bertjax.data import sources

  if os.path.isdir(args.output_dir) and os.listdir(args.output_dir):
    raise UserError(f"--output_dir={args.output_dir} is not empty; give a new or empty "
                    "directory (shards are never overwritten).")
  if args.num_shards < 1:
    raise UserError(f"--num_shards={args.num_shards}; use 1 or more.")
  if not 0 < args.masked_lm_prob < 1:
    raise UserError(f"--masked_lm_prob={args.masked_lm_prob}; use a value in (0, 1), e.g. 0.15.")
  if args.max_predictions_per_seq < 1:
    raise UserError(f"--max_predictions_per_seq={args.max_predictions_per_seq}; use 1 or more.")
  if not os.path.isfile(args.vocab_model):
    raise UserError(f"--vocab_model={args.vocab_model} is not a file; give a sentencepiece "
                    ".model file.")
  tok = tokenization.SentencePieceTokenizer(args.vocab_model)
  special = pe.SpecialTokens.from_tokenizer(tok)
  texts = sources.read_text_files([p for p in args.input_file.split(",") if p])
  documents = [[tok.encode(sentence) for sentence in doc] for doc in texts]
  word_start_table = None
  if args.whole_word_masking:
    word_start_table = np.asarray(tok.is_word_start(np.arange(tok.vocab_size)), bool)
  examples = create_static_examples(
      documents, special, np.random.default_rng(args.random_seed),
      max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
      masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
      dupe_factor=args.dupe_factor, word_start_table=word_start_table)
  paths = pe.save_static_examples(examples, args.output_dir, args.num_shards)
  counts = {"documents": len(documents), "examples": len(examples["input_ids"]),
            "shards": len(paths),
            "random_next": int(examples["next_sentence_label"].sum()),
            "predictions": int(examples["masked_lm_weights"].sum())}
  with open(os.path.join(args.output_dir, "info.json"), "w") as f:
    json.dump({"flags": vars(args), "counts": counts}, f, indent=2)
  return counts


def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    counts = run(args)
  except UserError as e:
    print(f"create_pretraining_data: error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {counts['examples']} examples from {counts['documents']} documents in "
        f"{counts['shards']} shards to {args.output_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
