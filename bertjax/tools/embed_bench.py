"""Embedding speed: bertjax's `embed` against sentence-transformers' `encode`, end to end.

  python -m bertjax.tools.embed_bench prepare --dir=DIR [--sentences=10000] [--size=minilm]
  python -m bertjax.tools.embed_bench run --dir=DIR --engine=bertjax|sentence-transformers
  farm-bench --timeout 1800 -n 3 \
      --vs 'python -m bertjax.tools.embed_bench run --dir=DIR --engine=sentence-transformers' \
      -- python -m bertjax.tools.embed_bench run --dir=DIR --engine=bertjax

`prepare` writes DIR/model, a sentence-transformers directory of a random BERT the shape of
all-MiniLM-L6-v2 (6 layers of 384, 12 heads, 1,536 wide; `--size=base`: BERT-base) with a
WordPiece vocabulary of 30,522 trained on the bundled corpus, mean pooling and Normalize, at
max_seq_length 256; and DIR/sentences.txt, the corpus's first sentences (the weights are random:
the speed does not depend on them). `run` embeds every sentence, in one process from its start,
loading included, batch 32 (sentence-transformers' default), and prints sentences a second; a
whole-process timing of the two commands in turn (farm-bench) gives the ratio. Both run
float32 on this machine's CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from bertjax.data import sources
from bertjax.embedding import embedder

SIZES = {"tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64),  # the test's
         "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536),
         "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072)}


def prepare(directory: str, sentences: int, size: str) -> None:
  """Writes DIR/model and DIR/sentences.txt (module docstring)."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)
  lines = [s for doc in documents for s in doc if len(s.split()) >= 3][:sentences]
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "sentences.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  encoder_dir = os.path.join(directory, "encoder")
  wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
  wordpiece.train_from_iterator((s for doc in documents for s in doc), vocab_size=30522,
                                show_progress=False)
  os.makedirs(encoder_dir, exist_ok=True)
  wordpiece.save_model(encoder_dir)
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=wordpiece.get_vocab_size(),
                                   max_position_embeddings=512, **SIZES[size])
  transformers.BertModel(config).eval().save_pretrained(encoder_dir)
  transformers.BertTokenizerFast(vocab=os.path.join(encoder_dir, "vocab.txt")
                                 ).save_pretrained(encoder_dir)
  transformer = models.Transformer(encoder_dir, max_seq_length=256)
  SentenceTransformer(modules=[
      transformer, models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean"),
      models.Normalize()], device="cpu").save(os.path.join(directory, "model"))
  print(f"wrote {directory}/model ({size}) and {len(lines)} sentences")


def run(directory: str, engine: str) -> tuple[float, np.ndarray]:
  """Embeds DIR/sentences.txt with `engine`; prints and returns (sentences a second, the
  embeddings)."""
  start = time.perf_counter()
  with open(os.path.join(directory, "sentences.txt"), encoding="utf-8") as f:
    texts = f.read().splitlines()
  model_dir = os.path.join(directory, "model")
  if engine == "bertjax":
    vectors = embedder.Embedder.load(model_dir).encode(texts, batch_size=32)
  else:
    from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
    vectors = SentenceTransformer(model_dir, device="cpu").encode(texts, batch_size=32)
  seconds = time.perf_counter() - start
  print(f"{engine}: {len(texts)} sentences, [{vectors.shape[0]}, {vectors.shape[1]}], "
        f"{seconds:.1f} s, {len(texts) / seconds:.0f} sentences/s")
  return len(texts) / seconds, vectors


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.embed_bench",
                                   description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  make = sub.add_parser("prepare", help="write the model and the sentences")
  make.add_argument("--dir", required=True)
  make.add_argument("--sentences", type=int, default=10_000)
  make.add_argument("--size", choices=sorted(SIZES), default="minilm")
  timed = sub.add_parser("run", help="embed the sentences with one engine")
  timed.add_argument("--dir", required=True)
  timed.add_argument("--engine", choices=["bertjax", "sentence-transformers"], required=True)
  args = parser.parse_args(argv)
  if args.command == "prepare":
    prepare(args.dir, args.sentences, args.size)
  else:
    run(args.dir, args.engine)
  return 0


if __name__ == "__main__":
  sys.exit(main())
