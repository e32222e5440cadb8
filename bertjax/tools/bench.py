"""Benchmark of the pretraining train step as users train it, and against Hugging Face
transformers.

  python -m bertjax.tools.bench --size=tiny,mini,base --batch_size=32 --seq_len=128 \
      [--max_predictions=20] [--steps=20] [--warmup=3] [--dtype=auto|float32|bfloat16] \
      [--recipe=fast|paper] [--rows=real|synthetic] [--rows_dir=DIR] [--rows_documents=N] \
      [--peers=bertjax,torch,hf_flax] [--vocab_size=30522] [--json=OUT.json] \
      [--attention=auto|reference|xla|cudnn|splash] [--packing=K] [--remat=none|full|dots] \
      [--optimizer=adamw|lamb|stable_adamw] [--prng=threefry|rbg|unsafe_rbg] [--memory_only]
      [--architecture=bert|modernbert] [--compile_for=tpu:SLICE]

What it times by default is what users train: the fast recipe (`--recipe=fast`,
`bertjax.tools.bench_recipe`: configs/base.py:fast at `--size`, or configs/modernbert.py with
`--architecture=modernbert`, its model, objective, masking and optimizer fields as written) on
real rows (`--rows=real`, `bertjax.tools.bench_rows`: the bundled corpus, or its first
`--rows_documents`, prepared at `--seq_len` with the recipe's masking and packing by the
trainer's own preparation and loader, seconds on a CPU, kept in `--rows_dir`, default
~/.cache/bertjax/bench_rows; the first `--batch_size` rows of the training stream). Their
vocabulary is 8,000 pieces whatever the model's `--vocab_size`: a step's cost depends on the
layout (lengths, packing, real tokens and predictions), not on the ids. `--dtype=auto` is the
recipe's (bfloat16 on GPU and TPU, float32 on CPU). `--rows=synthetic` times a random batch
instead (`bench_batch.make_batch`: every token real, `--max_predictions` a sequence);
`--recipe=paper` the paper's recipe (configs/base.py: attention dropout, so the reference
einsum; one pair a row; float32 MLM logits), the one the transformers peers run.

bertjax's own choices: `--attention` (`auto` keeps the recipe's; `reference` adds the paper's
attention dropout 0.1; a fused path runs without it, which fused kernels cannot apply),
`--packing=K` (real rows: up to K pairs a row, 0 one a row, default the recipe's, 3 for the fast
one; synthetic rows: K sequences of seq_len / K tokens a row, default 0), `--architecture=
modernbert` (ModernBERT of MODERNBERT_SIZES' `--size`, masked LM alone on contiguous spans, which
are not packed), `--remat`, `--optimizer` (default the recipe's) and `--prng`
(`train.prng_impl`). Every bertjax row also gives the seconds its train step and its parameter
init (`steps.build(...).compile_init`, threefry lowered as one kernel a hash on GPUs) take to
compile, and the compiled memory per device of its train step (`jit(step).lower(...).compile()
.memory_analysis()`: arguments + outputs - donated + temporaries, XLA's own plan, for any shape
on any backend); `--memory_only` compiles without running, so the memory of BERT-large at seq
512 can be read on a laptop; add `--compile_for=tpu:SLICE` and XLA's TPU compiler compiles it
for a slice's chips, on this CPU (`bertjax.tools.tpu_target`, a Python with libtpu), --batch_size
split over them, in the TPU's dtype and attention; its memory is per chip, against its HBM.

The transformers peers (`--peers`: bertjax alone by default; every peer with `--recipe=paper`)
run in the same process on the same batch (real rows one pair a row, or synthetic) and do the
whole step: forward with dropout 0.1, MLM + NSP loss, backward, clipping to global norm 1.0 and
an AdamW update.

- bertjax: the trainer's own step, `steps.build(config, task, batch, mesh).train_step(state,
  batch, learning_rate)` (jitted, donated state) with the recipe's optimizer fields, the model
  of `--size`.
- torch: `transformers.BertForPreTraining` in train mode, `torch.optim.AdamW(lr=1e-4,
  betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)`, loss = MLM (labels -100 off the masked
  positions, as HF does) + NSP, `clip_grad_norm_(1.0)`, step, zero_grad. bfloat16 runs under
  `torch.autocast` with float32 parameters, as bertjax keeps float32 parameters and computes in
  bfloat16. On a GPU, float32 matmuls may use TF32 in both (JAX's default precision; torch is set
  to `set_float32_matmul_precision("high")` to match).
- hf_flax: transformers' `FlaxBertForPreTraining` (Flax linen), called with `train=True` and a
  dropout rng; loss = MLM cross-entropy in float32 at every position, averaged over the masked
  ones (as the torch peer's labels -100 do) + NSP; `optax.chain(clip_by_global_norm(1.0),
  adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01))`; one `jax.jit` step with donated
  params and optimizer state. bfloat16 is its `dtype=jnp.bfloat16` (compute dtype; parameters
  stay float32). transformers 5 removed Flax; 4.57.6, the last release with it, runs on this jax
  and flax in a virtual environment of its own (`bench_peers.HF_FLAX_MISSING`, the error without
  it, says how to make one; the [test] extra's transformers 5 tests do not run there). With
  --recipe=paper the default --peers include hf_flax only where FlaxBertForPreTraining imports.

What differs by design: HF, in torch and in Flax, scores the vocabulary at every position
(logits [batch, seq, vocab]) and then drops the ~85% of them without a label; bertjax gathers the
masked positions first, as the original BERT does. That saving is part of what is compared.

Timing: as the trainer runs them, `--steps` steps back to back, each dispatched without waiting
for the one before, blocked once at the end (`jax.block_until_ready` on the state;
`torch.cuda.synchronize()` on a GPU); the step time reported is that total / `--steps`, after
`--warmup` untimed steps (which include compilation).

Model FLOPs per step (`bertjax.training.flops.model_flops` of the batch's real work, the formula
the trainer logs too, of the model the step runs) are the same for every peer, so the ratio is of
useful work; they count the MLM head at the gathered real prediction slots only. HF's
full-sequence logits do 6 * B * (S - P) * H * (V + H) more, which this count leaves out. Real
rows count their real tokens (not padding) and each sequence's own attention (a packed row's
sequences, each its own length squared, not seq_len squared); synthetic rows are all real
tokens. tokens/s counts real tokens; fill = real tokens / the batch's slots. MFU = model FLOPs /
step time / the device's peak (dense, for the dtype), where known.

Peak memory: on a GPU, jax's `peak_bytes_in_use` of the device and
`torch.cuda.max_memory_allocated` (reset before the peer). jax's figure cannot be reset: it is the
process's high-water mark so far, compilation included, so the second JAX peer of a size (hf_flax
after bertjax, or any JAX peer after a larger size) reports the larger of its own peak and the
earlier ones (run `--peers=hf_flax` with one --size for its own). On CPU, the peak resident
memory of the process during the timed steps less its resident memory before the peer was set up
(Linux: VmHWM, reset after the warmup, so the compiler's transient memory is left out; elsewhere
the growth of ru_maxrss). The first JAX peer in the process also carries what the XLA runtime
and compiler keep resident (hundreds of MiB on CPU), so run each JAX peer alone to compare them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence

# jax must not take 75% of a GPU's memory up front: the torch peer shares the device.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# pylint: disable=wrong-import-position
import jax
import ml_collections
import numpy as np

from bertjax import run_config
from bertjax.errors import UserError
from bertjax.modeldir import model_options
from bertjax.models import heads
from bertjax.models.attention import resolve_attention
from bertjax.models.config import ATTENTIONS, MODERNBERT_SIZES, REMATS, SIZES
from bertjax.tasks import pretraining, pretraining_config
from bertjax.tools import bench_measure, bench_peers, bench_recipe, bench_rows, bench_tables
from bertjax.tools import tpu_target
from bertjax.tools.bench_batch import make_batch  # also bench.make_batch to the tools and tests
from bertjax.tools.bench_peers import PEERS
from bertjax.training import flops, optim, parallel
from bertjax.training import steps as train_steps
from bertjax.training import task as task_lib
# pylint: enable=wrong-import-position

DTYPES = ("float32", "bfloat16")
ROWS = ("real", "synthetic")


@dataclasses.dataclass(frozen=True)
class BertjaxOptions:
  """bertjax's own choices for its step (the flags of the same names). The defaults are the
  paper's recipe (the step bertjax.tools.ab and init_compile build); the command's are FAST."""
  recipe: str = "paper"  # bench_recipe.RECIPES
  attention: str = "auto"
  packing: int | None = 0  # None: the recipe's (real rows)
  remat: str = "none"
  optimizer: str = "adamw"  # "": the recipe's
  prng: str = "threefry"
  memory_only: bool = False
  architecture: str = "bert"
  compile_for: str = ""  # tpu:SLICE (bertjax.tools.tpu_target): compiled for its chips
  overrides: tuple[tuple[str, Any], ...] = ()  # ("section.field", value), set last


FAST = BertjaxOptions(recipe="fast", packing=None, optimizer="")  # the command's defaults


def row_config(size: str, batch_size: int, seq_len: int, max_predictions: int, dtype: str,
               steps: int, warmup: int, options: BertjaxOptions) -> ml_collections.ConfigDict:
  """The config of a row's step (`bench_recipe.row_config`: the recipe with the row's shapes and
  bertjax's choices), for steps + warmup + 1 steps."""
  return bench_recipe.row_config(
      options.recipe, options.architecture, size, dtype=dtype, batch_size=batch_size,
      seq_len=seq_len, max_predictions=max_predictions, steps=steps + warmup + 1,
      attention=options.attention, remat=options.remat, optimizer=options.optimizer,
      prng=options.prng, packing=options.packing, overrides=options.overrides)


def build_bertjax(size: str, batch: dict[str, np.ndarray], vocab_size: int, dtype: str,
                  steps: int, warmup: int, options: BertjaxOptions = BertjaxOptions(),
                  devices: Sequence[jax.Device] | None = None
                  ) -> tuple[task_lib.Task, train_steps.Setup]:
  """bertjax's pretraining task (the recipe's model of `size`: MLM + NSP, or ModernBERT's MLM)
  and its `steps.build` Setup for the benchmark's `batch` ([batch, seq] keys, real or
  `make_batch`'s) on a mesh of `devices` (default: jax's); nothing compiled yet."""
  batch_size, seq_len = batch["input_ids"].shape
  max_predictions = batch["masked_lm_positions"].shape[1]
  config = run_config.typed(row_config(size, batch_size, seq_len, max_predictions, dtype, steps,
                                       warmup, options), run_config.PretrainingRun)
  nsp = config.pretraining.uses_nsp
  model = heads.BertForPreTraining(pretraining_config.model_config(config, vocab_size),
                                   next_sentence=nsp)
  task = task_lib.Task(model=model, terms=pretraining.make_terms(5, nsp),
                       batches=task_lib.Batches(train=lambda position: iter(())),
                       schedule=task_lib.Schedule.of(config.train))
  return task, train_steps.build(config, task, batch,
                                 train_steps.make_checked_mesh(config, devices))


def bench_bertjax(size: str, batch: dict[str, np.ndarray], vocab_size: int, dtype: str,
                  steps: int, warmup: int, options: BertjaxOptions = BertjaxOptions(),
                  devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
  """Times bertjax's jitted train step on a mesh of `devices` (default: jax's); returns
  {step_s, peak_memory_bytes, device, platform, devices (their count), hbm_bytes (a TPU chip's,
  else None), attention (the path it resolved to), compiled_memory (compiled_memory_bytes and
  saved_activations), step_compile_s, init_compile_s}. With options.memory_only (which
  `tpu_target.devices` need) the step is compiled, not run; step_s and init_compile_s None."""
  seq_len = batch["input_ids"].shape[1]
  device = (devices or jax.devices())[0]
  memory = bench_measure.CpuPeakMemory()
  memory.start()
  task, setup = build_bertjax(size, batch, vocab_size, dtype, steps, warmup, options, devices)
  batch_spec = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=parallel.batch_sharding(setup.mesh)),
      dict(batch))
  start = time.perf_counter()
  learning_rate = setup.learning_rate(0)  # the flat rate: the step's third argument
  compiled = setup.train_step.lower(setup.abstract_state, batch_spec, learning_rate).compile()
  step_compile_s = time.perf_counter() - start

  planned = dict(bench_measure.compiled_memory_bytes(compiled),
                 **bench_measure.saved_activations(task, setup, batch_spec, seq_len))
  result = dict(device=device.device_kind, platform=device.platform,
                devices=setup.mesh.devices.size, hbm_bytes=tpu_target.hbm_bytes(
                    device.device_kind) if device.platform == "tpu" else None,
                attention=resolve_attention(task.model.config, device.platform, seq_len),
                compiled_memory=planned, step_compile_s=step_compile_s)
  if options.memory_only:
    return dict(result, step_s=None, peak_memory_bytes=0, init_compile_s=None)
  start = time.perf_counter()
  init = setup.compile_init()
  init_compile_s = time.perf_counter() - start
  state = init()
  device_batch = parallel.global_batch(batch, setup.mesh)

  def step():
    nonlocal state
    state, _ = compiled(state, device_batch, learning_rate)

  step_s = bench_measure.time_steps(step, lambda: jax.block_until_ready(state), steps, warmup,
                                    memory.reset_peak)
  if device.platform == "cpu":
    peak = memory.delta()
  else:
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
  del state
  return dict(result, step_s=step_s, peak_memory_bytes=int(peak),
              init_compile_s=init_compile_s)


def _check_options(options: BertjaxOptions, peers: Sequence[str], seq_len: int,
                   max_predictions: int, rows: str) -> None:
  """Raises UserError naming the first of bertjax's own flags that cannot work."""
  for flag, value, allowed in (("recipe", options.recipe, bench_recipe.RECIPES),
                               ("rows", rows, ROWS),
                               ("attention", options.attention, ATTENTIONS),
                               ("remat", options.remat, REMATS),
                               ("optimizer", options.optimizer or "adamw", optim.OPTIMIZERS),
                               ("prng", options.prng, tuple(train_steps.PRNG_IMPLS))):
    if value not in allowed:
      raise UserError(f"unknown --{flag} {value!r}; use one of {', '.join(allowed)}.")
  if options.compile_for and not options.memory_only:
    raise UserError(f"--compile_for={options.compile_for} compiles for chips this machine does "
                    "not have, so nothing can run there: add --memory_only.")
  if (options.packing or options.memory_only or options.architecture != "bert"
      or options.recipe == "fast") and list(peers) != ["bertjax"]:
    raise UserError("--packing, --memory_only, --architecture=modernbert and --recipe=fast (the "
                    "default) are bertjax's alone (transformers has no packing, its memory is "
                    "measured by running, it runs the paper's BERT); add --peers=bertjax, or "
                    "--recipe=paper to compare with transformers.")
  if options.architecture not in ("bert", "modernbert"):
    raise UserError(f"unknown --architecture {options.architecture!r}; use bert, modernbert.")
  packing = options.packing or 0
  if packing < 0:
    raise UserError(f"--packing={packing}; use 0 (one sequence a row) or more.")
  if rows == "real" and packing and options.architecture == "modernbert":
    raise UserError(f"--packing={packing}: ModernBERT's real rows are contiguous spans, which "
                    "fill their rows and are not packed; drop --packing, or add --rows=synthetic.")
  if rows == "synthetic" and packing and seq_len // packing < 2:
    raise UserError(f"--packing={packing} leaves fewer than 2 tokens a sequence at "
                    f"--seq_len={seq_len}; use 0 (no packing) or fewer sequences a row.")
  if rows == "synthetic" and packing and max_predictions > seq_len - packing:
    raise UserError(f"--max_predictions={max_predictions} is more than the {seq_len} - "
                    f"{packing} tokens that are not [CLS]; lower it.")


def _check(sizes: Sequence[str], peers: Sequence[str], dtype: str, architecture: str = "bert",
           **positive: int) -> None:
  """Raises UserError naming the first argument that cannot work."""
  known = MODERNBERT_SIZES if architecture == "modernbert" else SIZES
  for size in sizes:
    if size not in known:
      raise UserError(f"unknown --size {size!r}; use one or more of {','.join(known)} "
                      "(comma-separated).")
  if not sizes:
    raise UserError(f"--size is empty; give one or more of {','.join(known)}.")
  for peer in peers:
    if peer not in PEERS:
      raise UserError(f"unknown --peers entry {peer!r}; use one or more of {','.join(PEERS)}.")
  if not peers:
    raise UserError(f"--peers is empty; give one or more of {','.join(PEERS)}.")
  if "hf_flax" in peers and bench_peers.flax_bert_for_pretraining() is None:
    raise UserError(bench_peers.HF_FLAX_MISSING)
  if dtype not in ("auto",) + DTYPES:
    raise UserError(f"unknown --dtype {dtype!r}; use one of auto, {', '.join(DTYPES)}.")
  for name, value in positive.items():
    if value < 1:
      raise UserError(f"--{name}={value}; use 1 or more.")
  if positive["max_predictions"] >= positive["seq_len"]:
    raise UserError(f"--max_predictions={positive['max_predictions']} must be below "
                    f"--seq_len={positive['seq_len']} (position 0 is [CLS]); lower it.")
  if positive["vocab_size"] < 6:
    raise UserError(f"--vocab_size={positive['vocab_size']}; use 6 or more (5 special ids).")


def run(sizes: Sequence[str] = ("tiny",), peers: Sequence[str] | None = None, batch_size: int = 32,
        seq_len: int = 128, max_predictions: int = 20, steps: int = 20, warmup: int = 3,
        dtype: str = "auto", vocab_size: int = 30522, options: BertjaxOptions = FAST,
        rows: str = "real", rows_dir: str = "", rows_documents: int = bench_rows.DOCUMENTS
        ) -> list[dict[str, Any]]:
  """Benchmarks each peer (default: bertjax; with the paper's BERT recipe
  `bench_peers.default_peers()`) at each size, on real rows (`bench_rows.real_batch`, prepared in
  rows_dir, default `bench_rows.default_rows_dir()`) or synthetic ones; one row per (size, peer).

  Returns:
    rows with size, peer, device, platform, dtype (resolved), batch_size, seq_len,
    max_predictions, steps, recipe, rows, rows_source (real rows' prepared directory), packing
    (sequences a row at most; 0: one), sequences, tokens, fill (real tokens / slots), predictions,
    prediction_slots (a row's), step_ms (back to back), tokens_per_s (real tokens),
    examples_per_s (sequences), peak_memory_bytes, model_flops (of the real work),
    achieved_flops_per_s, mfu (None where the peak is unknown), on bertjax rows speedup_vs_<peer>
    (its tokens/s / that peer's), attention (the path used), remat, optimizer, prng,
    step_compile_s, init_compile_s and compiled_memory (bytes per device: arguments, outputs,
    temporaries, total, saved activations). With options.memory_only timing fields are None,
    and rows have devices and hbm_bytes (bench_bertjax's), for options.compile_for's chips.
  """
  if peers is None:
    paper_bert = options.recipe == "paper" and options.architecture == "bert"
    peers = bench_peers.default_peers() if paper_bert else ("bertjax",)
  _check(sizes, peers, dtype, options.architecture, batch_size=batch_size, seq_len=seq_len,
         max_predictions=max_predictions, steps=steps, warmup=warmup, vocab_size=vocab_size)
  _check_options(options, peers, seq_len, max_predictions, rows)
  devices = (tpu_target.devices(tpu_target.parse(options.compile_for)) if options.compile_for
             else None)
  dtype = model_options.resolve_dtype(dtype, (devices or jax.devices())[0].platform)
  results = []
  for size in sizes:
    config = row_config(size, batch_size, seq_len, max_predictions, dtype, steps, warmup, options)
    batch, source = bench_rows.row_batch(config, rows, vocab_size, rows_dir, rows_documents,
                                         options.packing or 0)
    typed = run_config.typed(config, run_config.PretrainingRun)
    model_config = pretraining_config.model_config(typed, vocab_size)
    work = flops.work_of(batch)
    step_flops = flops.model_flops(model_config, work)
    shape = dict(size=size, dtype=dtype, batch_size=batch_size, seq_len=seq_len,
                 max_predictions=max_predictions, recipe=options.recipe, rows=rows,
                 rows_source=source, **bench_rows.layout(batch, work), model_flops=step_flops)
    by_peer = {}
    for peer in peers:
      if peer == "bertjax":
        result = bench_bertjax(size, batch, vocab_size, dtype, steps, warmup, options, devices)
        if options.memory_only:
          results.append(dict(shape, peer=peer, device=result["device"],
                              platform=result["platform"], devices=result["devices"],
                              hbm_bytes=result["hbm_bytes"], steps=0, step_ms=None,
                              tokens_per_s=None, mfu=None, peak_memory_bytes=None,
                              **_bertjax_fields(result, typed)))
          continue
      elif peer == "torch":
        result = bench_peers.bench_torch(model_config, batch, dtype, steps, warmup)
      else:
        result = bench_peers.bench_hf_flax(model_config, batch, dtype, steps, warmup)
      step_s = result["step_s"]
      peak = flops.peak_flops(result["device"], dtype)  # None on CPUs
      row = dict(shape, peer=peer, device=result["device"], platform=result["platform"],
                 steps=steps, step_ms=1e3 * step_s, tokens_per_s=work.tokens / step_s,
                 examples_per_s=work.sequences / step_s,
                 peak_memory_bytes=result["peak_memory_bytes"],
                 achieved_flops_per_s=step_flops / step_s,
                 mfu=None if peak is None else step_flops / step_s / peak)
      if "attention" in result:
        row["attention"] = result["attention"]
      if peer == "bertjax":
        row.update(_bertjax_fields(result, typed))
      by_peer[peer] = row
      results.append(row)
    for peer, row in by_peer.items():
      if "bertjax" in by_peer and peer != "bertjax":
        by_peer["bertjax"][f"speedup_vs_{peer}"] = (by_peer["bertjax"]["tokens_per_s"]
                                                    / row["tokens_per_s"])
  return results


def _bertjax_fields(result: dict[str, Any], config: run_config.PretrainingRun) -> dict[str, Any]:
  return dict(attention=result["attention"], remat=config.model.remat,
              optimizer=config.train.optimizer, prng=config.train.prng_impl,
              step_compile_s=result["step_compile_s"], init_compile_s=result["init_compile_s"],
              compiled_memory=result["compiled_memory"])


def _csv(text: str) -> list[str]:
  return [part.strip() for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.bench", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  flag = parser.add_argument
  flag("--size", default="tiny", help="comma-separated BERT sizes")
  flag("--peers", default=None, help="comma-separated, of bertjax, torch, hf_flax (default: "
       "bertjax; with --recipe=paper all three where transformers has FlaxBertForPreTraining)")
  flag("--batch_size", type=int, default=32)
  flag("--seq_len", type=int, default=128)
  flag("--max_predictions", type=int, default=20, help="masked positions a sequence at most")
  flag("--steps", type=int, default=20, help="timed steps")
  flag("--warmup", type=int, default=3, help="untimed steps first (compilation)")
  flag("--dtype", default="auto", help="auto (bfloat16 on GPU/TPU), float32 or bfloat16")
  flag("--vocab_size", type=int, default=30522)
  flag("--json", default="", help="also write the rows to this JSON file")
  flag("--recipe", default="fast", help="fast (configs/base.py:fast) or paper")
  flag("--rows", default="real", help="real (the bundled corpus, prepared) or synthetic")
  flag("--rows_dir", default="", help="where real rows are kept (~/.cache/bertjax/bench_rows)")
  flag("--rows_documents", type=int, default=bench_rows.DOCUMENTS,
       help="real rows of the bundled corpus's first N documents only (default 0: all 269)")
  flag("--attention", default="auto", help="bertjax's attention: auto (the recipe's), "
       "reference, xla, cudnn, splash (fused ones without attention dropout)")
  flag("--packing", type=int, default=None, help="bertjax only: sequences a row (0 = one; "
       "default: the recipe's on real rows, 0 on synthetic ones)")
  flag("--remat", default="none", help="bertjax's remat: none, full, dots")
  flag("--optimizer", default="", help="adamw, lamb, stable_adamw (default: the recipe's)")
  flag("--prng", default="threefry", help="bertjax's train.prng_impl: threefry, rbg, unsafe_rbg")
  flag("--architecture", default="bert", help="bertjax's model: bert, modernbert")
  flag("--memory_only", action="store_true",
       help="bertjax only: compile the step and print its memory, run nothing")
  flag("--compile_for", default="", help="tpu:SLICE (tpu:v5e-8, tpu:v5p-8, ...): with "
       "--memory_only, compile for that TPU slice's chips with libtpu (bertjax.tools.tpu_target)")
  return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Parses the flags, runs the benchmark, prints the table (and writes --json)."""
  args = _parser().parse_args(argv)
  options = BertjaxOptions(recipe=args.recipe, attention=args.attention, packing=args.packing,
                           remat=args.remat, optimizer=args.optimizer, prng=args.prng,
                           memory_only=args.memory_only, architecture=args.architecture,
                           compile_for=args.compile_for)
  try:
    rows = run(sizes=_csv(args.size), peers=None if args.peers is None else _csv(args.peers),
               batch_size=args.batch_size,
               seq_len=args.seq_len, max_predictions=args.max_predictions, steps=args.steps,
               warmup=args.warmup, dtype=args.dtype, vocab_size=args.vocab_size,
               options=options, rows=args.rows, rows_dir=args.rows_dir,
               rows_documents=args.rows_documents)
  except UserError as e:
    print(f"bertjax.tools.bench: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(bench_tables.format_memory_table(rows) if args.memory_only
        else bench_tables.format_table(rows))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"rows": rows, "note": bench_tables.HF_LOGITS_NOTE}, f, indent=2)
      f.write("\n")
  return rows


if __name__ == "__main__":
  main()
