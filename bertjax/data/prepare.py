"""Pretraining data, prepared once: text -> vocabulary, tokenized documents, NSP pairs in shards.

  python -m bertjax.data.prepare --input='text/*.txt' --output_dir=DATA --vocab_size=30522 \\
      --max_seq_length=128,512 --dupe_factor=5 --workers=8

This module is the command (its flags and main); bertjax/data/pretraining/ does the work:
layout.py (DATA's files and the flags, Options), text_shards.py, shard_work.py (one text
shard), preparation.py (the whole run) and beam.py.

The input is text files (one sentence per line, a blank line between documents, as
google-research/bert takes) or `tfds:NAME[/CONFIG][:VERSION]:SPLIT`, a TFDS text dataset built
on local disk in array_record format (each example's --tfds_feature is one document). The work
is cut into text shards (text_shards.py: --shard_size_mb of a file, or
--tfds_documents_per_shard documents); each text shard independently becomes (shard_work.py;
layout.py has the files):

* its documents, split into training and held-out ones (a seeded `eval_fraction` of each
  shard's documents, at least 2 when it has 3 or more), tokenized: documents/{train,heldout};
* for each --max_seq_length, NSP pairs by google-research/bert's create_pretraining_data rules
  (pairs.py), `dupe_factor` passes for training and one for the held-out
  documents, a random next segment drawn from the same text shard as the original draws it
  from the same input file: seq{L}/{train,heldout}; with --static_masks, masked too;
* for each length, the plan that packs its training pairs into rows of at most
  --max_sequences_per_row pairs (packing.py): seq{L}/packs-train (held-out pairs stay unpacked);
* with --contiguous=true, for each length also contiguous examples `[CLS] A [SEP] B [SEP]` for
  the No NSP and left-to-right ablations (config.pretraining; the paper, section 5.1): each
  document's text cut into spans of L - 3 tokens, dupe_factor passes cut at other places, each
  span cut into A and B at a sentence boundary (pairs.iter_contiguous_spans), so that both
  segment embeddings train: contiguous{L}/{train,heldout}.

The vocabulary is the given one (--vocab: a sentencepiece .model or a WordPiece vocab.txt,
copied into DATA) or a sentencepiece model trained on training sentences only, from text shards
taken in a seeded order. Shards are processed by --workers processes (default: every core), or
by an Apache Beam pipeline (--runner=DirectRunner, DataflowRunner, FlinkRunner, SparkRunner,
with any further pipeline flags passed to Beam; DATA and the input must be at the same path on
every Beam worker, e.g. a mounted bucket). The result depends on the flags, not on the workers
or the runner. A rerun with the same flags resumes: finished text shards are kept. One run at a
time prepares a DATA (it holds DATA/.lock); a second run on it is refused, naming the first.
DATA/info.json, written last, lists the flags, the counts, the vocabulary's hash and every
shard.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from bertjax.data.pretraining import layout, preparation
from bertjax.errors import UserError


def _ints(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in text.split(",") if v.strip())
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes"):
    return True
  if text.lower() in ("0", "false", "no"):
    return False
  raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m bertjax.data.prepare",
                              description=__doc__.split("\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  defaults = layout.Options(input="")
  types = {int: int, float: float, str: str, bool: _bool, tuple: _ints}
  helps = {
      "input": "text files (comma-separated globs) or tfds:NAME:SPLIT",
      "vocab": "sentencepiece .model or WordPiece vocab.txt; empty: train a sentencepiece one",
      "vocab_size": "size of the sentencepiece vocabulary trained when no --vocab is given",
      "max_seq_length": "comma-separated lengths, one set of NSP pairs (phase) each",
      "max_predictions_per_seq": "per length: masked positions at most (static masks); left "
                                 "at the default: 20 per 128 tokens at every length",
      "dupe_factor": "passes over the training documents, each pairing them differently",
      "short_seq_prob": "chance that a document pass aims at a shorter pair",
      "eval_fraction": "share of each text shard's documents held out for evaluation",
      "static_masks": "store one set of masks per pair (true/false); else masks are drawn "
                      "while training",
      "masked_lm_prob": "share of tokens masked (static masks)",
      "whole_word_masking": "mask whole words, punctuation apart (static masks; true/false)",
      "seed": "seed of every random choice",
      "max_sequences_per_row": "pairs in a row at most when training packs them "
                               "(--config.data.packing); a plan per shard and length",
      "contiguous": "also contiguous spans (two segments) per length, for pretraining "
                    "without NSP or left-to-right (--config.pretraining.nsp=false or "
                    "objective=ltr; true/false)",
      "shard_size_mb": "text per shard: the unit of work of one worker",
      "tfds_feature": "the TFDS text feature that holds a document",
      "tfds_data_dir": "where the TFDS dataset was built; empty: TFDS's default",
      "tfds_documents_per_shard": "TFDS documents per shard"}
  for field in dataclasses.fields(layout.Options):
    default = getattr(defaults, field.name)
    p.add_argument(f"--{field.name}", type=types[type(default)], default=default,
                   required=field.name == "input", help=helps[field.name])
  p.add_argument("--output_dir", required=True, help="new or empty directory (or one to resume)")
  p.add_argument("--workers", type=int, default=0, help="processes (0 = every core)")
  p.add_argument("--runner", default="", help="an Apache Beam runner instead of local processes")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  args, pipeline_args = _parser().parse_known_args(argv)
  if pipeline_args and not args.runner:
    print(f"prepare: error: unknown flags {' '.join(pipeline_args)} (flags for Beam need "
          "--runner)", file=sys.stderr)
    return 2
  flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(layout.Options)}
  if flags["max_predictions_per_seq"] == (20,) and len(flags["max_seq_length"]) > 1:
    # The paper's 20 at 128 tokens, in proportion at other lengths (80 at 512).
    flags["max_predictions_per_seq"] = tuple(max(1, round(n * 20 / 128))
                                             for n in flags["max_seq_length"])
  try:
    info = preparation.prepare(layout.Options(**flags), args.output_dir, args.workers,
                               args.runner, pipeline_args)
  except UserError as e:
    print(f"prepare: error: {e}", file=sys.stderr)
    return 2
  counts = info["counts"]
  phases = ", ".join(f"{n}: {p['examples']} + {p['heldout_examples']} held out"
                     for n, p in info["phases"].items())
  print(f"{args.output_dir}: {counts['documents']} + {counts['heldout_documents']} held-out "
        f"documents, {counts['tokens']} tokens, vocabulary {info['vocab']['size']}; "
        f"examples per length {phases}")
  for length, phase in info["phases"].items():
    if "packs" in phase:
      print(preparation.packing_summary(int(length), phase))
  for length, spans in info.get(layout.CONTIGUOUS, {}).items():
    print(f"contiguous spans at {length}: {spans['examples']} + {spans['heldout_examples']} "
          "held out")
  return 0


if __name__ == "__main__":
  sys.exit(main())
