"""The seconds bertjax's parameter init takes to compile, threefry lowered as bertjax does or as
jax does by default.

  python -m bertjax.tools.init_compile --size=base --seq_len=128 [--unrolled] [--json=OUT.json]

The init is `steps.build(...).compile_init` of the benchmark's pretraining task
(`bertjax.tools.bench.build_bertjax`, batch 8, bfloat16, threefry keys): on a GPU it lowers each
threefry hash as one kernel (`jax_threefry_gpu_kernel_lowering`), which compiles in seconds;
`--unrolled` compiles it as jax does by default, with the 20 rounds of each hash inline (3 min
47 s for BERT-base on an H100), by replacing that setting's context with a null one. On CPU and
TPU the two are the same program. Prints one line; `--json` writes {size, seq_len, unrolled,
init_compile_s, device, platform}.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import types
from typing import Any, Sequence

import jax

from bertjax.errors import UserError
from bertjax.models.config import SIZES
from bertjax.tools import bench
from bertjax.training import steps as train_steps

VOCAB_SIZE = 30522
BATCH_SIZE = 8


def init_compile_s(size: str, seq_len: int, unrolled: bool) -> float:
  """Seconds `compile_init` takes for BERT of `size` at `seq_len` (module docstring)."""
  batch = bench.make_batch(VOCAB_SIZE, BATCH_SIZE, seq_len, max(1, seq_len * 5 // 32))
  _, setup = bench.build_bertjax(size, batch, VOCAB_SIZE, "bfloat16", steps=1, warmup=1,
                                 options=bench.BertjaxOptions(attention="xla"))
  kernel_lowering = train_steps.jax_config
  if unrolled:  # compile_init's `with jax_config.threefry_gpu_kernel_lowering(True):` does nothing
    train_steps.jax_config = types.SimpleNamespace(
        threefry_gpu_kernel_lowering=lambda _: contextlib.nullcontext())
  try:
    start = time.perf_counter()
    setup.compile_init()
    return time.perf_counter() - start
  finally:
    train_steps.jax_config = kernel_lowering


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Parses the flags, compiles the init, prints the seconds (and writes --json)."""
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.init_compile",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default="base")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--unrolled", action="store_true",
                      help="threefry's hashes inline, as jax lowers them by default")
  parser.add_argument("--json", default="", help="also write the result to this JSON file")
  args = parser.parse_args(argv)
  try:
    if args.size not in SIZES:
      raise UserError(f"unknown --size {args.size!r}; use one of {', '.join(SIZES)}.")
    if args.seq_len < 8:
      raise UserError(f"--seq_len={args.seq_len}; use 8 or more.")
    seconds = init_compile_s(args.size, args.seq_len, args.unrolled)
  except UserError as e:
    print(f"bertjax.tools.init_compile: error: {e}", file=sys.stderr)
    sys.exit(2)
  device = jax.devices()[0]
  result = dict(size=args.size, seq_len=args.seq_len, unrolled=args.unrolled,
                init_compile_s=seconds, device=device.device_kind, platform=device.platform)
  print(f"{args.size} seq {args.seq_len}: the init compiled in {seconds:.1f} s "
        f"({'unrolled' if args.unrolled else 'kernel-lowered'} threefry, {device.device_kind})")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
      f.write("\n")
  return result


if __name__ == "__main__":
  main()
