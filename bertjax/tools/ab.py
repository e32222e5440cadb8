"""An A/B of the train step in one process: model variants x XLA flag sets, timed in bursts, on a
GPU or TPU (or, `--smoke`, this CPU), within a time budget.

  python -m bertjax.tools.ab [--rows=LABEL,...] [--variants=NAME,...] [--flag_sets=NAME,...]
      [--bursts=5] [--burst_steps=10] [--budget_s=540] [--dtype=bfloat16] [--out=DIR] [--smoke]
  python -m bertjax.tools.accelerator_report --wheels=DIR --ab [the flags above]  # offline

Rows are `bertjax.tools.accelerator_report`'s labels, MODELSEQ-ATTENTION-bBATCH[-packK][-REMAT]
[-PRNG] (e.g. base128-fused-b128, large512-fused-b32, modernbase1024-fused-b64): what one step
trains, on the benchmark's batch (`bertjax.tools.bench_batch`: every token real). A variant
(VARIANTS) changes config fields of the row's step (fused QKV, bfloat16 MLM logits, tanh GELU, the
PRNG, four dropout decisions a hash, remat, a bfloat16 first moment, ModernBERT's local layers by
the Pallas banded kernel, FP8 matmuls); each is built once per row and its step lowered once,
and that lowering is compiled under each flag set (FLAG_SETS: XLA options, as
`Lowered.compile(compiler_options=...)` takes them), side by side in threads. So the candidates
of a row differ only in the variant's program and the compiler's choices.

Timing: each candidate runs one untimed burst, then the candidates are timed round robin,
`--bursts` times each: a burst is `--burst_steps` steps dispatched back to back and blocked once
at the end. The first candidate is timed once more at the end: its last burst against its median
is the drift of the machine over the run. A candidate's step time is the median of its bursts;
tokens/s counts real tokens and MFU = `bertjax.training.flops.model_flops` of the batch's real
work / step time / the device's dense peak for --dtype (none on a CPU).

Output, as it comes: every compile and every burst is a line of OUT/ab.jsonl, flushed, so a run
cut short keeps what it measured. At the end of each row, its table (the winner marked *, each
candidate's speed against the row's first) and a profile trace of the winner's burst in
OUT/trace/ROW (TensorBoard's profile plugin or Perfetto read it). No compile or burst starts
once --budget_s seconds have passed (but the winner's one traced burst); what was measured is
still tabulated.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Sequence

# pylint: disable=wrong-import-position
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # each variant's memory its own
import jax
import numpy as np

from bertjax.errors import UserError
from bertjax.tools import accelerator_report, bench, bench_measure
from bertjax.tools.bench_batch import make_batch
from bertjax.training import compile_ahead, flops, parallel
# pylint: enable=wrong-import-position

# name -> the config fields it sets on the row's step, ("section.field", value) pairs.
VARIANTS = {
    "base": (),
    "fused_qkv": (("model.fused_qkv", True),),
    "bf16_logits": (("model.mlm_logits_dtype", "auto"),),
    "fused_qkv_bf16_logits": (("model.fused_qkv", True), ("model.mlm_logits_dtype", "auto")),
    "gelu_tanh": (("model.hidden_act", "gelu_tanh"),),
    "rbg": (("train.prng_impl", "rbg"),),
    "unsafe_rbg": (("train.prng_impl", "unsafe_rbg"),),
    "remat_dots": (("model.remat", "dots"),),
    "bf16_mu": (("train.mu_dtype", "bfloat16"),),
    "dropout_per_hash4": (("model.dropout_per_hash", 4),),
    # ModernBERT rows: the local layers by the Pallas banded kernel, or by XLA's blocks (what
    # local_kernel auto takes until a GPU has decided)
    "pallas_local": (("model.local_kernel", "pallas"),),
    "xla_local": (("model.local_kernel", "xla"),),
    # the encoder's projections as FP8 matmuls (flax's fp8 ops, delayed scaling)
    "fp8": (("model.fp8", True),),
}
# name -> XLA options for the compile (GPU ones are ignored on a CPU, CPU ones on a GPU).
FLAG_SETS = {
    "default": {},
    "cublaslt": {"xla_gpu_enable_cublaslt": True},  # bias and GELU in the GEMM epilogue
    "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},
    "cudnn_layer_norm": {"xla_gpu_enable_cudnn_layer_norm": True},
    "latency_hiding": {"xla_gpu_enable_latency_hiding_scheduler": True},
    "cpu_fast_math": {"xla_cpu_enable_fast_math": True},
    "cpu_o1": {"xla_backend_optimization_level": 1},
}
LEARNING_RATE = np.float32(1e-4)  # the step's rate argument: bench's flat rate
DEFAULT_ROWS = ("base128-fused-b128", "large512-fused-b32")
DEFAULT_VARIANTS = ("base", "fused_qkv_bf16_logits", "unsafe_rbg")
DEFAULT_FLAG_SETS = ("default", "cublaslt")


@dataclasses.dataclass
class Candidate:
  """One variant compiled under one flag set, and its bursts' seconds a step."""
  variant: str
  flag_set: str
  compiled: Any = None
  compile_s: float = 0.0
  memory_bytes: int = 0
  error: str = ""
  step_s: list[float] = dataclasses.field(default_factory=list)

  @property
  def median_s(self) -> float | None:
    return statistics.median(self.step_s) if self.step_s else None


class Log:
  """OUT/ab.jsonl: one JSON line per event, flushed as written."""

  def __init__(self, out: str):
    os.makedirs(out, exist_ok=True)
    self._file = open(os.path.join(out, "ab.jsonl"), "a", encoding="utf-8")

  def write(self, **fields: Any) -> None:
    self._file.write(json.dumps(fields) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _burst(candidate: Candidate, state: Any, batch: Any, steps: int) -> tuple[Any, float]:
  """`steps` steps of `candidate` from `state`, back to back, blocked once: (state, s a step)."""
  start = time.perf_counter()
  for _ in range(steps):
    state, _ = candidate.compiled(state, batch, LEARNING_RATE)
  jax.block_until_ready(state)
  return state, (time.perf_counter() - start) / steps


def _compile(lowered: Any, flag_set: str) -> Candidate:
  """`lowered` compiled under FLAG_SETS[flag_set], with its seconds and XLA's memory plan."""
  start = time.perf_counter()
  compiled = lowered.compile(compiler_options=FLAG_SETS[flag_set] or None)
  return Candidate("", flag_set, compiled, time.perf_counter() - start,
                   bench_measure.compiled_memory_bytes(compiled)["total"])


def run_row(label: str, args: argparse.Namespace, log: Log, deadline: float) -> list[dict]:
  """Builds, compiles and times one row's candidates; returns their summaries (and writes the
  row's profile trace)."""
  row = accelerator_report.parse_row(label)
  row = accelerator_report.smoke(row) if args.smoke else row
  platform = jax.devices()[0].platform
  predictions, vocab_size = accelerator_report.row_batch_shape(row, args.smoke)
  batch = make_batch(vocab_size, row.batch_size, row.seq_len, predictions, packing=row.packing)
  work = flops.work_of(batch)
  peak = flops.peak_flops(jax.devices()[0].device_kind, args.dtype)
  compiling, states, batches, model_flops = [], {}, {}, 0
  with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    for variant in args.variants:
      if time.monotonic() > deadline:
        log.write(row=label, variant=variant, skipped="budget")
        continue
      options = bench.BertjaxOptions(
          attention=accelerator_report.row_attention(row, platform), packing=row.packing,
          remat=row.remat, prng=row.prng, architecture=row.architecture,
          overrides=VARIANTS[variant])
      try:
        task, setup = bench.build_bertjax(row.size, batch, vocab_size, args.dtype, steps=1,
                                          warmup=1, options=options)
        lowered = setup.train_step.lower(
            setup.abstract_state, compile_ahead.abstract_global_batch(batch, setup.mesh),
            LEARNING_RATE)
        states[variant] = setup.compile_init()()
        batches[variant] = parallel.global_batch(batch, setup.mesh)
        model_flops = flops.model_flops(task.model.config, work)
      except Exception as e:  # pylint: disable=broad-except
        log.write(row=label, variant=variant, error=f"{type(e).__name__}: {e}")
        continue
      for flag_set in args.flag_sets:  # compiled side by side, with the next variant's build
        compiling.append((variant, flag_set, pool.submit(_compile, lowered, flag_set)))
    candidates = []
    for variant, flag_set, future in compiling:
      try:
        candidate = dataclasses.replace(future.result(), variant=variant, flag_set=flag_set)
      except Exception as e:  # pylint: disable=broad-except
        candidate = Candidate(variant, flag_set, error=f"{type(e).__name__}: {e}")
      log.write(row=label, variant=variant, flag_set=flag_set, compile_s=candidate.compile_s,
                memory_bytes=candidate.memory_bytes, error=candidate.error)
      candidates.append(candidate)
  ready = [c for c in candidates if not c.error]
  for candidate in ready:  # the untimed burst: first-call allocations
    if time.monotonic() <= deadline:
      states[candidate.variant], _ = _burst(candidate, states[candidate.variant],
                                            batches[candidate.variant], args.burst_steps)
  # Round robin, then the first once more: the drift.
  schedule = ([(c, False) for _ in range(args.bursts) for c in ready]
              + [(c, True) for c in ready[:1]])
  drift_s = None
  for index, (candidate, drift) in enumerate(schedule):
    if time.monotonic() > deadline:
      log.write(row=label, skipped="budget", bursts_done=index)
      break
    states[candidate.variant], seconds = _burst(candidate, states[candidate.variant],
                                                batches[candidate.variant], args.burst_steps)
    if drift:
      drift_s = seconds
    else:
      candidate.step_s.append(seconds)
    log.write(row=label, variant=candidate.variant, flag_set=candidate.flag_set,
              burst=index // len(ready), step_s=seconds, drift=drift)
  summaries = _summaries(label, candidates, work.tokens, model_flops, peak, drift_s)
  for summary in summaries:
    log.write(**summary)
  winner = min((c for c in ready if c.step_s), key=lambda c: c.median_s, default=None)
  if winner is not None:
    trace = os.path.join(args.out, "trace", label)
    with jax.profiler.trace(trace):
      states[winner.variant], _ = _burst(winner, states[winner.variant],
                                         batches[winner.variant], args.burst_steps)
  print(format_row(label, summaries, args, drift_s))
  return summaries


def _summaries(label: str, candidates: Sequence[Candidate], tokens: int, model_flops: int,
               peak: float | None, drift_s: float | None) -> list[dict]:
  """A row's candidates as summary dicts (split "summary"), the fastest marked winner."""
  timed = [c for c in candidates if c.step_s]
  first = timed[0].median_s if timed else None
  best = min((c.median_s for c in timed), default=None)
  out = []
  for c in candidates:
    step_s = c.median_s
    out.append(dict(
        split="summary", row=label, variant=c.variant, flag_set=c.flag_set, error=c.error,
        step_s=step_s, bursts=len(c.step_s), compile_s=c.compile_s, memory_bytes=c.memory_bytes,
        tokens_per_second=tokens / step_s if step_s else None,
        mfu=model_flops / step_s / peak if step_s and peak else None,
        speedup=first / step_s if step_s else None, winner=step_s is not None and step_s == best,
        drift=(drift_s / first - 1) if drift_s and first and c is timed[0] else None))
  return out


def format_row(label: str, summaries: Sequence[dict], args: argparse.Namespace,
               drift_s: float | None) -> str:
  """A row's table: one line a candidate, the winner marked *."""
  device = jax.devices()[0]
  first = next((s for s in summaries if s["step_s"]), None)
  drift = (f"; the first again at the end: {drift_s / first['step_s'] - 1:+.1%}"
           if drift_s and first else "")
  lines = [f"{label} ({device.device_kind}, {args.dtype}; {args.bursts} bursts of "
           f"{args.burst_steps} steps{drift})",
           f"  {'variant':<22} {'flags':<17} {'step ms':>9} {'tokens/s':>11} {'MFU':>6} "
           f"{'vs first':>8} {'compile s':>9} {'plan GiB':>8}"]
  for s in summaries:
    if s["error"] or not s["step_s"]:
      why = s["error"] or "not timed (budget)"
      lines.append(f"  {s['variant']:<22} {s['flag_set']:<17} {why[:80]}")
      continue
    mfu = f"{s['mfu']:.1%}" if s["mfu"] else "-"
    lines.append(f"{'*' if s['winner'] else ' '} {s['variant']:<22} {s['flag_set']:<17} "
                 f"{s['step_s'] * 1e3:>9.2f} {s['tokens_per_second']:>11,.0f} {mfu:>6} "
                 f"{s['speedup']:>8.3f} {s['compile_s']:>9.1f} "
                 f"{s['memory_bytes'] / 2**30:>8.2f}")
  return "\n".join(lines)


def _names(text: str, known: dict, what: str) -> tuple[str, ...]:
  names = tuple(name.strip() for name in text.split(",") if name.strip())
  unknown = [name for name in names if name not in known]
  if not names or unknown:
    raise UserError(f"--{what}={text!r}: {', '.join(unknown) or 'none given'} not among "
                    f"{', '.join(known)}.")
  return names


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.ab", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="row labels, in order")
  parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                      help=f"of {', '.join(VARIANTS)}")
  parser.add_argument("--flag_sets", default=",".join(DEFAULT_FLAG_SETS),
                      help=f"of {', '.join(FLAG_SETS)}")
  parser.add_argument("--bursts", type=int, default=5, help="timed bursts a candidate")
  parser.add_argument("--burst_steps", type=int, default=10, help="steps a burst")
  parser.add_argument("--budget_s", type=float, default=540, help="seconds for everything")
  parser.add_argument("--dtype", default="bfloat16", help="compute dtype: bfloat16 or float32")
  parser.add_argument("--out", default="ab_out", help="ab.jsonl and trace/ go here")
  parser.add_argument("--smoke", action="store_true", help="the rows at BERT-tiny sizes (CPU)")
  return parser


def main(argv: Sequence[str] | None = None) -> list[dict]:
  """Parses the flags and runs every row within the budget; returns the rows' summaries."""
  deadline = time.monotonic()
  args = _parser().parse_args(argv)
  deadline += args.budget_s
  try:
    rows = [label.strip() for label in args.rows.split(",") if label.strip()]
    for label in rows:
      accelerator_report.parse_row(label)
    if not rows or any(label.startswith("unrolled_init") for label in rows):
      raise UserError(f"--rows={args.rows!r}: give train-step rows, e.g. base128-fused-b128.")
    args.variants = _names(args.variants, VARIANTS, "variants")
    args.flag_sets = _names(args.flag_sets, FLAG_SETS, "flag_sets")
    if args.bursts < 1 or args.burst_steps < 1:
      raise UserError(f"--bursts={args.bursts} --burst_steps={args.burst_steps}; use 1 or more.")
    if args.dtype not in bench.DTYPES:
      raise UserError(f"unknown --dtype {args.dtype!r}; use {' or '.join(bench.DTYPES)}.")
  except UserError as e:
    print(f"bertjax.tools.ab: error: {e}", file=sys.stderr)
    sys.exit(2)
  log = Log(args.out)
  try:
    return [summary for label in rows for summary in run_row(label, args, log, deadline)]
  finally:
    log.close()


if __name__ == "__main__":
  main()
