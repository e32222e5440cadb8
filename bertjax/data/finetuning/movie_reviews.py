"""The bundled movie-review sentences, labelled by sentiment, as an SST-2-style fine-tuning set.

  python -m bertjax.data.finetuning.movie_reviews --output_dir=DIR          # DIR/SST-2/{train,dev}.tsv
      [--pretraining_text=FILE]   # and the training sentences, unlabelled, as pretraining text
  python -m bertjax.main --config=configs/glue.py --config.task=sst2 --config.data.glue_dir=DIR \
      --config.init_checkpoint=CKPT --workdir=RUN

The sentences are the 10,605 Rotten Tomatoes snippets that Hutto & Gilbert (ICWSM 2014) had
rated by at least 20 people each, from -4 (extremely negative) to 4 (extremely positive); the
file ships in bertjax/data/finetuning/movie_reviews/ with its MIT licence (CREDITS.md there says
where it comes from). Binarised by the sign of the mean rating (1: positive, 0: negative); the 37
sentences rated exactly 0 are dropped, which leaves 10,568 (5,242 positive, 5,326 negative).

The split is fixed: one seeded permutation of the labelled sentences (in file order before it);
dev is its first `num_dev` sentences, train its last `num_train` (None: all after dev). So the
same arguments always give the same files, and a smaller split lies within the default one
(the 3,200 / 800 set of the speed script: its dev in the default dev, its train in the default
train).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

from bertjax.errors import UserError

GROUND_TRUTH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "movie_reviews",
                            "movieReviewSnippets_GroundTruth.txt")
NUM_DEV = 1000  # dev sentences of the default split (train: the other 9,568)


@dataclasses.dataclass(frozen=True)
class Rating:
  """One rated sentence of the file: its id (1-based, the file's), mean rating in [-4, 4], text."""
  id: int
  rating: float
  sentence: str


def read_ratings(path: str = GROUND_TRUTH) -> list[Rating]:
  """The rows of movieReviewSnippets_GroundTruth.txt (tab-separated id, mean rating, sentence;
  CRLF line ends, UTF-8), in file order."""
  with open(path, encoding="utf-8", newline="") as f:
    lines = f.read().splitlines()
  ratings = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) != 3:
      raise UserError(f"{path}:{number}: {len(fields)} tab-separated fields, not 3 (id, rating, "
                      "sentence); the file is damaged. Reinstall bertjax.")
    ratings.append(Rating(int(fields[0]), float(fields[1]), fields[2].strip()))
  return ratings


def labelled_sentences(path: str = GROUND_TRUTH) -> list[tuple[str, int]]:
  """(sentence, label) in file order: label 1 for a positive mean rating, 0 for a negative one;
  the sentences rated exactly 0 are left out."""
  return [(r.sentence, int(r.rating > 0)) for r in read_ratings(path) if r.rating != 0]


def split(sentences: list[tuple[str, int]], *, num_dev: int = NUM_DEV,
          num_train: int | None = None, seed: int = 0
          ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
  """(train, dev) of `sentences` (module docstring): dev the first num_dev of a permutation
  seeded by `seed`, train its last num_train (None: all after dev). UserError if they do not
  fit."""
  wanted = num_dev + (num_train or 0)
  if num_dev < 1 or (num_train is not None and num_train < 1) or wanted > len(sentences):
    raise UserError(f"num_dev={num_dev} and num_train={num_train} do not fit "
                    f"{len(sentences)} sentences; ask for at least 1 each and at most "
                    f"{len(sentences)} together.")
  order = np.random.default_rng(seed).permutation(len(sentences))
  start = num_dev if num_train is None else len(sentences) - num_train
  return ([sentences[i] for i in order[start:]], [sentences[i] for i in order[:num_dev]])


def write_sst2(output_dir: str, *, num_dev: int = NUM_DEV, num_train: int | None = None,
               seed: int = 0, path: str = GROUND_TRUTH) -> str:
  """Writes OUTPUT_DIR/SST-2/train.tsv and dev.tsv in GLUE's SST-2 format ("sentence<TAB>label"
  with a header), the layout `--config.data.glue_dir=OUTPUT_DIR --config.task=sst2` reads.
  Returns OUTPUT_DIR."""
  train, dev = split(labelled_sentences(path), num_dev=num_dev, num_train=num_train, seed=seed)
  directory = os.path.join(output_dir, "SST-2")
  os.makedirs(directory, exist_ok=True)
  for name, rows in (("train", train), ("dev", dev)):
    with open(os.path.join(directory, f"{name}.tsv"), "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows))
  return output_dir


def write_pretraining_text(path: str, *, num_dev: int = NUM_DEV, seed: int = 0,
                           sentences_per_document: int = 8,
                           ratings_path: str = GROUND_TRUTH) -> str:
  """Writes the training split's sentences, without their labels, as pretraining text at PATH
  (google-research/bert's format: one sentence a line, a blank line after every
  `sentences_per_document` of them, in the split's order): the in-domain text of
  semi-supervised learning. Every sentence outside `split`'s dev set is written, whatever
  num_train a fine-tuning later takes, and no dev sentence. Returns PATH."""
  if sentences_per_document < 1:
    raise UserError(f"sentences_per_document={sentences_per_document} must be at least 1.")
  train, _ = split(labelled_sentences(ratings_path), num_dev=num_dev, seed=seed)
  documents = [train[i:i + sentences_per_document]
               for i in range(0, len(train), sentences_per_document)]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(text for text, _ in doc) for doc in documents) + "\n")
  return path


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m bertjax.data.finetuning.movie_reviews",
      description="Write the bundled movie-review sentences as GLUE SST-2 files "
                  "(OUTPUT_DIR/SST-2/train.tsv and dev.tsv).")
  parser.add_argument("--output_dir", required=True, help="where SST-2/ is written")
  parser.add_argument("--num_dev", type=int, default=NUM_DEV, help="dev sentences")
  parser.add_argument("--num_train", type=int, default=None,
                      help="training sentences (default: all the others)")
  parser.add_argument("--seed", type=int, default=0, help="seed of the split")
  parser.add_argument("--pretraining_text", default="",
                      help="also write every training sentence, unlabelled, as pretraining "
                           "text to this file (8 sentences a document)")
  args = parser.parse_args(argv)
  try:
    write_sst2(args.output_dir, num_dev=args.num_dev, num_train=args.num_train, seed=args.seed)
    if args.pretraining_text:
      write_pretraining_text(args.pretraining_text, num_dev=args.num_dev, seed=args.seed)
  except UserError as e:
    print(f"movie_reviews: error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {os.path.join(args.output_dir, 'SST-2')}/train.tsv and dev.tsv"
        + (f", and {args.pretraining_text}" if args.pretraining_text else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
