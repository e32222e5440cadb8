"""Embedding speed: bertjax's `embed` against sentence-transformers' `encode`, end to end.

  python -m bertjax.tools.embed_bench prepare --dir=DIR [--sentences=10000] [--size=minilm]
  python -m bertjax.tools.embed_bench run --dir=DIR --engine=bertjax|sentence-transformers
  python -m bertjax.tools.embed_bench train --dir=DIR --engine=bertjax|sentence-transformers
      [--batch_size=32] [--steps=30] [--grad_cache_chunk=0]
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

`train` trains MultipleNegativesRankingLoss on pairs of consecutive sentences (cosine times 20,
AdamW at 2e-5, clipped at 1.0, no dropout, texts cut to 64 tokens) for --steps steps at
--batch_size pairs, and prints the steps a second of the last third of them (the first steps
compile): bertjax's contrastive task (`config.task=embeddings`) against sentence-transformers'
loss in a torch loop, on the same model directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from bertjax import tasks
from bertjax.configs import embeddings
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


def train(directory: str, engine: str, batch_size: int, steps: int, chunk: int = 0) -> float:
  """Trains MNRL on DIR's sentences with `engine` (module docstring), with GradCache chunks of
  `chunk` pairs (sentence-transformers: CachedMultipleNegativesRankingLoss's mini-batches; 0:
  none); prints and returns the steady steps a second."""
  with open(os.path.join(directory, "sentences.txt"), encoding="utf-8") as f:
    texts = f.read().splitlines()
  pairs = list(zip(texts[0::2], texts[1::2]))[:batch_size * steps]
  model_dir, timed = os.path.join(directory, "model"), max(1, steps // 3)
  if engine == "bertjax":
    with tempfile.TemporaryDirectory() as work:
      path = os.path.join(work, "pairs.tsv")
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{a}\t{b}\n" for a, b in pairs))
      config = embeddings.get_config()
      config.init_checkpoint, config.data.train_file = model_dir, path
      config.data.max_seq_length, config.data.eval_fraction = 64, 0.0
      config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
      config.train.batch_size, config.train.num_train_steps = batch_size, steps
      config.train.warmup_steps, config.train.log_every_steps = 0, timed
      config.embedding.grad_cache_chunk = chunk
      tasks.run(config, os.path.join(work, "run"))
      with open(os.path.join(work, "run", "metrics.jsonl"), encoding="utf-8") as f:
        last = [json.loads(line) for line in f if "examples_per_second" in line][-1]
    rate = last["examples_per_second"] / batch_size
  else:
    import torch  # pylint: disable=import-outside-toplevel
    from sentence_transformers import SentenceTransformer, losses  # pylint: disable=import-outside-toplevel
    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = 64
    model.eval()  # no dropout, as bertjax's run
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, eps=1e-6, weight_decay=0.01)
    loss_fn = (losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=chunk)
               if chunk else losses.MultipleNegativesRankingLoss(model))
    start = 0.0
    for step in range(steps):
      if step == steps - timed:
        start = time.perf_counter()
      batch = pairs[step * batch_size:(step + 1) * batch_size]
      loss = loss_fn([model.tokenize([p[i] for p in batch]) for i in (0, 1)], None)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()
      optimizer.zero_grad()
    rate = timed / (time.perf_counter() - start)
  cached = f", GradCache chunks of {chunk}" if chunk else ""
  print(f"{engine}: MNRL, batch {batch_size} pairs{cached}, {rate:.2f} steps/s over the last "
        f"{timed} of {steps} steps")
  return rate


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
  trained = sub.add_parser("train", help="train MNRL on sentence pairs with one engine")
  trained.add_argument("--dir", required=True)
  trained.add_argument("--engine", choices=["bertjax", "sentence-transformers"], required=True)
  trained.add_argument("--batch_size", type=int, default=32)
  trained.add_argument("--steps", type=int, default=30)
  trained.add_argument("--grad_cache_chunk", type=int, default=0,
                       help="GradCache: pairs embedded at a time (0: the whole batch)")
  args = parser.parse_args(argv)
  if args.command == "prepare":
    prepare(args.dir, args.sentences, args.size)
  elif args.command == "train":
    train(args.dir, args.engine, args.batch_size, args.steps, args.grad_cache_chunk)
  else:
    run(args.dir, args.engine)
  return 0


if __name__ == "__main__":
  sys.exit(main())
