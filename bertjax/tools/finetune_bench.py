"""Fine-tuning speed, end to end: bertjax's command line against transformers, on real sentences.

  python -m bertjax.tools.finetune_bench [--num_train=3200] [--num_dev=800] [--size=small]
      [--num_layers=6] [--batch_size=32] [--eval_batch_size=64] [--max_seq_length=128]
      [--vocab_size=8000] [--packing=K] [--length_buckets=L] [--peers=bertjax,transformers]
      [--workdir=DIR] [--json=OUT.json]

The task is the bundled movie-review sentences (`bertjax.data.finetuning.movie_reviews`,
binarised by the sign of their human rating; `--num_train` / `--num_dev` of its fixed split),
one epoch at batch `--batch_size`, then the dev accuracy. Both peers start from the same weights
and see the same token ids:

- setup (untimed): the SST-2 files, a sentencepiece vocabulary of `--vocab_size` trained on the
  training sentences, a randomly initialised BERT (`bert_config(size, num_layers=...)`; speed
  does not depend on the weights) saved as a bertjax model directory, that directory exported to
  Hugging Face's format (`bertjax.convert`, `--to=hf`), and the token ids bertjax's GLUE reader
  makes (`bertjax.data.finetuning.glue.encode_examples`), written for the transformers peer.
- bertjax: `python -m bertjax.main --config=configs/glue.py --config.task=sst2 ...` in a
  subprocess: the real command, with its start-up, data reading, compilation, checkpoint and
  evaluation, with configs/glue.py's defaults (data.packing="auto": as many sentences a row as
  fit in max_seq_length on average, 4 here; data.length_buckets="auto"); `--packing` and
  `--length_buckets` set its `data.packing` (sentences a row, 0 = one) and
  `data.length_buckets` instead. The report gives the packing the run took (its first line).
- transformers: `BertForSequenceClassification` (PyTorch) in a subprocess
  (`bertjax.tools.finetune_bench_torch`): AdamW with bertjax's
  settings (lr 2e-5, eps 1e-6, weight decay 0.01 off biases and LayerNorm, linear warmup over 10%
  of the steps then linear decay, clipping at norm 1.0, dropout 0.1), each batch padded to its
  longest sentence (dynamic padding), then the dev set in batches of `--eval_batch_size`, each
  padded to its longest, under `torch.inference_mode`. The classifier head is freshly initialised
  in both (each library's own initialiser); the encoder is the same.

What is timed is the wall time of each whole process, import to exit, and its CPU time (user +
system, all threads: steadier than wall time on a machine that others share); the script
prints both, the ratio of wall times and both dev accuracies. `--jax_cache_dir=DIR` gives the
bertjax process JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR): a second run of
the script with the same DIR shows a run whose compilations are cached, as in a sweep's later
runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.convert import __main__ as convert
from bertjax.data.finetuning import glue as glue_data
from bertjax.data.finetuning import movie_reviews
from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.workdir import CONFIG_FILE, EVAL_RESULTS_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What the setup leaves in the bench directory.

  Attributes:
    glue_dir: DIR with SST-2/train.tsv and dev.tsv.
    model_dir: the bertjax model directory (`--config.init_checkpoint`).
    hf_dir: the same weights in Hugging Face's format.
    token_ids: an .npz of bertjax's features of both splits for the transformers peer:
      {train,dev}_{input_ids,input_mask} [N, max_seq_length] int32 and {train,dev}_label [N].
  """
  glue_dir: str
  model_dir: str
  hf_dir: str
  token_ids: str


def prepare(directory: str, *, num_train: int, num_dev: int, size: str, num_layers: int,
            vocab_size: int, max_seq_length: int, seed: int = 0) -> Prepared:
  """The untimed setup (module docstring) in `directory`; one made before with the same
  arguments (DIRECTORY/setup.json says) is reused."""
  arguments = dict(num_train=num_train, num_dev=num_dev, size=size, num_layers=num_layers,
                   vocab_size=vocab_size, max_seq_length=max_seq_length, seed=seed)
  prepared = Prepared(*(os.path.join(directory, name)
                        for name in ("data", "model", "hf", "token_ids.npz")))
  record = os.path.join(directory, "setup.json")
  if os.path.exists(record):
    with open(record, encoding="utf-8") as f:
      if json.load(f) == arguments:
        return prepared
    raise SystemExit(f"{directory} holds a setup of other arguments; give a new --workdir")
  glue_dir = movie_reviews.write_sst2(prepared.glue_dir, num_dev=num_dev,
                                      num_train=num_train, seed=seed)
  train_examples = glue_data.read_examples("sst2", "train", glue_dir)
  vocab = os.path.join(directory, tokenization.MODEL_FILE)
  tokenizer = tokenization.load_or_train_sentencepiece(
      lambda: (e.text_a for e in train_examples), vocab, vocab_size)
  config = bert_config(size, num_layers=num_layers, vocab_size=tokenizer.vocab_size,
                       max_position_embeddings=max(512, max_seq_length))
  ids = np.zeros((1, 8), np.int32)
  params = heads.BertForPreTraining(config).init(jax.random.PRNGKey(seed), ids, ids, ids,
                                                 deterministic=True)["params"]
  model_files.save_model_dir(prepared.model_dir, jax.tree.map(np.asarray, nn.unbox(params)),
                             config, [vocab])
  convert.to_hf_dir(prepared.model_dir, prepared.hf_dir)
  features = {}
  for split in ("train", "dev"):
    examples = glue_data.read_examples("sst2", split, glue_dir)
    encoded = glue_data.encode_examples(examples, glue_data.TASKS["sst2"], tokenizer,
                                        max_seq_length)
    features.update({f"{split}_{key}": encoded[key]
                     for key in ("input_ids", "input_mask", "label")})
  np.savez(prepared.token_ids, **features)
  with open(record, "w", encoding="utf-8") as f:
    json.dump(arguments, f)
  return prepared


def bertjax_command(prepared: Prepared, workdir: str, *, batch_size: int, eval_batch_size: int,
                    max_seq_length: int, packing: str | None = None,
                    length_buckets: str | None = None) -> list[str]:
  """The bertjax fine-tuning command of the benchmark (one epoch, then the dev set); packing
  and length_buckets None: the config's defaults."""
  return [sys.executable, "-m", "bertjax.main", "--config=configs/glue.py",
          f"--workdir={workdir}", "--config.task=sst2",
          f"--config.init_checkpoint={prepared.model_dir}",
          f"--config.data.glue_dir={prepared.glue_dir}",
          f"--config.data.max_seq_length={max_seq_length}",
          *([] if packing is None else [f"--config.data.packing={packing}"]),
          *([] if length_buckets is None else [f"--config.data.length_buckets={length_buckets}"]),
          f"--config.train.batch_size={batch_size}",
          f"--config.train.eval_batch_size={eval_batch_size}",
          "--config.train.num_train_epochs=1"]


def transformers_command(prepared: Prepared, *, batch_size: int, eval_batch_size: int,
                         seed: int = 0) -> list[str]:
  """The transformers peer's command (`bertjax.tools.finetune_bench_torch`)."""
  return [sys.executable, "-m", "bertjax.tools.finetune_bench_torch",
          f"--hf_dir={prepared.hf_dir}", f"--token_ids={prepared.token_ids}",
          f"--batch_size={batch_size}", f"--eval_batch_size={eval_batch_size}", f"--seed={seed}"]


def _children_cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str] | None = None
          ) -> tuple[dict[str, float], str]:
  """({"seconds": wall, "cpu_seconds": user + system}, stdout) of running `command` from the
  repository root (with `env` added to the environment); raises with its stderr if it fails."""
  cpu, start = _children_cpu_seconds(), time.perf_counter()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                        env={**os.environ, **(env or {})})
  seconds, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu
  if done.returncode:
    raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}")
  return {"seconds": seconds, "cpu_seconds": cpu}, done.stdout


def bertjax_result(workdir: str, stdout: str) -> dict[str, object]:
  """The dev accuracy of a finished bertjax run, the sentences a row it packed (its first line
  says "..., K examples a row)"; 0 when it does not) and its data.length_buckets."""
  with open(os.path.join(workdir, EVAL_RESULTS_FILE), encoding="utf-8") as f:
    accuracy = json.load(f)["accuracy"]
  with open(os.path.join(workdir, CONFIG_FILE), encoding="utf-8") as f:
    buckets = json.load(f)["data"]["length_buckets"]
  packed = re.search(r", (\d+) examples a row\)", stdout)
  return {"accuracy": accuracy, "packing": int(packed.group(1)) if packed else 0,
          "length_buckets": buckets}


def run(args: argparse.Namespace) -> dict[str, object]:
  """Sets up, runs the peers one after the other and returns the figures."""
  directory = args.workdir or tempfile.mkdtemp(prefix="finetune_bench_")
  prepared = prepare(directory, num_train=args.num_train, num_dev=args.num_dev, size=args.size,
                     num_layers=args.num_layers, vocab_size=args.vocab_size,
                     max_seq_length=args.max_seq_length)
  results: dict[str, object] = {
      "num_train": args.num_train, "num_dev": args.num_dev, "size": args.size,
      "num_layers": args.num_layers, "batch_size": args.batch_size,
      "max_seq_length": args.max_seq_length, "jax_cache_dir": args.jax_cache_dir,
      "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()[0]}
  for peer in args.peers.split(","):
    if peer == "bertjax":
      workdir = os.path.join(directory, f"bertjax_run_{len(os.listdir(directory))}")
      env = {"JAX_COMPILATION_CACHE_DIR": args.jax_cache_dir} if args.jax_cache_dir else {}
      times, out = timed(bertjax_command(
          prepared, workdir, batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
          max_seq_length=args.max_seq_length, packing=args.packing,
          length_buckets=args.length_buckets), env)
      results["bertjax"] = {**times, **bertjax_result(workdir, out)}
    elif peer == "transformers":
      times, out = timed(transformers_command(prepared, batch_size=args.batch_size,
                                              eval_batch_size=args.eval_batch_size))
      results["transformers"] = {**times, **json.loads(out.strip().splitlines()[-1])}
    else:
      raise SystemExit(f"unknown peer {peer!r}; use bertjax and/or transformers")
    print(f"{peer}: {results[peer]}", flush=True)
  results["load_average_after"] = os.getloadavg()[0]
  return results


def report(results: dict[str, object]) -> str:
  """The figures as a few lines of text."""
  ran = results.get("bertjax", {})
  lines = [f"{results['num_layers']}-layer {results['size']} BERT, {results['num_train']} "
           f"training / {results['num_dev']} dev sentences, batch {results['batch_size']}, one "
           f"epoch; bertjax packed {ran.get('packing', '-')} sentences a row, data.length_buckets="
           f"{ran.get('length_buckets', '-')!r}; load average "
           f"{results['load_average_before']:.2f} before, {results['load_average_after']:.2f} "
           f"after, on {results['cpu_count']} cores"]
  for peer in ("bertjax", "transformers"):
    if peer in results:
      r = results[peer]
      lines.append(f"  {peer:13s} {r['seconds']:7.1f} s wall {r['cpu_seconds']:7.1f} s CPU   "
                   f"dev accuracy {r['accuracy']:.4f}")
  if "bertjax" in results and "transformers" in results:
    ratio = results["transformers"]["seconds"] / results["bertjax"]["seconds"]
    lines.append(f"  bertjax is {ratio:.2f}x as fast as transformers (transformers' wall time / "
                 "bertjax's)")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.finetune_bench",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_train", type=int, default=3200, help="training sentences")
  parser.add_argument("--num_dev", type=int, default=800, help="dev sentences scored")
  parser.add_argument("--size", default="small", help="a row of bertjax.models.config.SIZES")
  parser.add_argument("--num_layers", type=int, default=6, help="layers (overrides the size's)")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--eval_batch_size", type=int, default=64)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=8000,
                      help="sentencepiece vocabulary trained on the training sentences")
  parser.add_argument("--packing", default=None,
                      help="bertjax's data.packing: sentences a row (0 = one; default: the "
                      "config's, auto)")
  parser.add_argument("--length_buckets", default=None,
                      help="bertjax's data.length_buckets ('' = pad every batch to the maximum; "
                      "default: the config's, auto)")
  parser.add_argument("--peers", default="bertjax,transformers")
  parser.add_argument("--jax_cache_dir", default="",
                      help="JAX's persistent compilation cache for the bertjax run ('' = none)")
  parser.add_argument("--workdir", default="", help="where the setup and runs go (default: new "
                      "temporary directory)")
  parser.add_argument("--json", default="", help="also write the figures here")
  args = parser.parse_args(argv)
  results = run(args)
  print(report(results))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
