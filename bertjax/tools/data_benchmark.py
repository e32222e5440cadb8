"""Figures of the pretraining data path: preparation throughput, the training process's peak
memory as the corpus grows, the loader's masked examples per second per core, and how well
sequence packing fills rows.

  python -m bertjax.tools.data_benchmark --text_mb=100,1000 --workers=2 --dir=/tmp/bertjax_data_bench

For each size, the bundled corpus is repeated into DIR/text_NMB.txt, prepared with
`bertjax.data.prepare` (vocabulary 8000, 128 and 512 tokens, dupe_factor 5, 16 MB text shards
so that every worker has work) in `--workers` processes, and then
`python -m bertjax.main --config=configs/tiny.py` trains
`--steps` steps from it in a child process whose peak resident memory (VmHWM) is printed.
The loader is timed on one thread (dynamic masking, batches of 256) at 128 and 512 tokens,
unpacked and packed. `--packing_of=DATA` prints only the packing figures of prepared DATA: real
tokens / slots unpacked and packed, and the examples a packed row holds on average.
Timings are of this machine: run it on a quiet one.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from bertjax.data import sources
from bertjax.data.pretraining import layout, loader, masking, preparation, shards

_VOCAB = 8000


def corpus_file(directory: str, megabytes: int) -> str:
  """DIRECTORY/text_NMB.txt: the bundled corpus repeated to at least `megabytes` MB."""
  path = os.path.join(directory, f"text_{megabytes}MB.txt")
  if not os.path.exists(path):
    with open(sources.BUNDLED_CORPUS, "rb") as f:
      text = f.read().rstrip(b"\n") + b"\n\n"
    with open(path + ".tmp", "wb") as f:
      for _ in range(-(-megabytes * 2**20 // len(text))):
        f.write(text)
    os.replace(path + ".tmp", path)
  return path


def time_preparation(text: str, output_dir: str, workers: int, lengths: tuple[int, ...]
                     ) -> tuple[float, dict]:
  """(seconds, info.json) of preparing `text` into a new `output_dir`."""
  options = layout.Options(input=text, vocab_size=_VOCAB, max_seq_length=lengths,
                            max_predictions_per_seq=tuple(round(n * 20 / 128) for n in lengths),
                            dupe_factor=5, eval_fraction=0.01, shard_size_mb=16)
  start = time.perf_counter()
  info = preparation.prepare(options, output_dir, workers=workers, progress=False)
  return time.perf_counter() - start, info


def training_peak_rss(data: str, workdir: str, steps: int) -> float:
  """Peak resident memory (GiB) of `python -m bertjax.main` training `steps` steps of the tiny
  config from prepared `data`."""
  command = [sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
             f"--workdir={workdir}", f"--config.data.prepared={data}",
             f"--config.train.num_train_steps={steps}", "--config.train.warmup_steps=1",
             f"--config.train.eval_every_steps={steps}", "--config.train.eval_steps=2",
             f"--config.train.log_every_steps={steps}"]
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  peak = 0  # VmHWM: the peak since exec (ru_maxrss would count this process's size at fork)
  while process.poll() is None:
    try:
      with open(f"/proc/{process.pid}/status") as f:
        peak = max(peak, int(f.read().split("VmHWM:")[1].split()[0]))
    except (OSError, IndexError):
      pass
    time.sleep(0.1)
  if process.returncode:
    raise SystemExit(f"training failed: rerun {' '.join(command)} to see why")
  return peak / 2**20  # KiB -> GiB


def loader_throughput(data: str, length: int, seconds: float = 5.0,
                      packing: bool = False) -> float:
  """Masked examples per second that one thread makes (read, decode, mask, and lay out in rows
  with packing) at `length`."""
  prepared = loader.PreparedData(data)
  tok = prepared.tokenizer()
  rules = loader.Masking(masking.SpecialTokens.from_tokenizer(tok), 0.15, round(length * 20 / 128),
                         True, 0, None)
  batches = loader.PairBatches(prepared, length, rules, batch_size=256, threads=1,
                               packing=packing)
  n = batches.num_rows()
  rng = np.random.default_rng(0)
  done, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    rows = rng.integers(n, size=256)
    if packing:
      batch = batches._packed_batch(rows, np.zeros(256, int))  # pylint: disable=protected-access
      done += int(batch["example_weight"].sum())
    else:
      batches._batch("train", rows, np.zeros(256, int))  # pylint: disable=protected-access
      done += 256
  return done / (time.perf_counter() - start)


def packing_figures(data: str) -> list[str]:
  """A line per length of prepared `data` on its packing: examples a row, real tokens / slots
  unpacked and packed."""
  info = loader.PreparedData(data).info
  return [preparation.packing_summary(int(length), phase) if "packs" in phase else
          f"packing at {length}: no plans (prepared by an older bertjax)"
          for length, phase in info["phases"].items()]


def heldout_overlap(data: str, n: int = 8) -> float:
  """The share of the held-out documents' token n-grams that occur in the training documents
  (text that repeats across documents, not a leak: the split is by document)."""
  prepared = loader.PreparedData(data)

  def grams(split):
    listing = prepared.info["documents"][split]
    source = shards.Records([os.path.join(data, name) for name, _ in listing],
                            [n for _, n in listing])
    out = set()
    for record in source.read(np.arange(len(source))):
      tokens = np.concatenate(shards.decode_document(record, prepared.dtype)).tolist()
      out.update(tuple(tokens[j:j + n]) for j in range(len(tokens) - n + 1))
    return out

  heldout = grams("heldout")
  return len(heldout & grams("train")) / max(1, len(heldout))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--text_mb", default="100,1000", help="corpus sizes in MB")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--steps", type=int, default=50, help="training steps for the RSS")
  parser.add_argument("--dir", default="/tmp/bertjax_data_bench")
  parser.add_argument("--overlap_of", default="", help="only print the held-out 8-gram overlap "
                      "of this prepared directory")
  parser.add_argument("--packing_of", default="", help="only print the packing figures of this "
                      "prepared directory")
  args = parser.parse_args(argv)
  if args.packing_of:
    print(f"{args.packing_of}:", *packing_figures(args.packing_of), sep="\n  ")
    return
  if args.overlap_of:
    print(f"{args.overlap_of}: {heldout_overlap(args.overlap_of):.1%} of the held-out 8-grams "
          "occur in the training documents")
    return
  os.makedirs(args.dir, exist_ok=True)
  first = None
  for megabytes in (int(m) for m in args.text_mb.split(",")):
    text = corpus_file(args.dir, megabytes)
    mb = os.path.getsize(text) / 2**20
    data = os.path.join(args.dir, f"data_{megabytes}MB")
    if os.path.exists(os.path.join(data, layout.INFO_FILE)):
      print(f"{mb:.0f} MB: reusing {data}")
    else:
      seconds, info = time_preparation(text, data, args.workers, (128, 512))
      print(f"{mb:.0f} MB prepared (lengths 128 and 512, dupe_factor 5) in {seconds:.0f} s with "
            f"{args.workers} workers: {mb / seconds * 60 / args.workers:.1f} MB of text per "
            f"minute per worker; {info['phases']['128']['examples']:,} examples at 128, "
            f"{info['phases']['512']['examples']:,} at 512")
    print(*packing_figures(data), sep="\n")
    rss = training_peak_rss(data, os.path.join(args.dir, f"run_{megabytes}MB_{time.time():.0f}"),
                            args.steps)
    print(f"{mb:.0f} MB: peak RSS of the training process {rss:.2f} GiB")
    first = first or data
  for length in (128, 512):
    rate = loader_throughput(first, length)
    print(f"loader, seq {length}: {rate:,.0f} masked examples/s on one core "
          f"(5,500 sequences/s, an H100's BERT-base rate at 128, takes {5500 / rate:.1f} cores)")
    rate = loader_throughput(first, length, packing=True)
    print(f"loader, seq {length}, packed: {rate:,.0f} masked examples/s on one core")


if __name__ == "__main__":
  main()
