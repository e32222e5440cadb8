"""Audit of a pretraining or contrastive config's steps on a mesh: what they communicate,
multiply and hold.

  python -m bertjax.tools.audit --config=configs/base.py --devices=8 \
      [--config.mesh.fsdp=8] [--config.mesh.tensor=2] [--config.KEY=VALUE ...] [--json=OUT.json]
  python -m bertjax.tools.audit --config=configs/embeddings.py --devices=8 \
      --config.init_checkpoint=MODEL --config.embedding.pooling=mean
  .tpu-venv/bin/python -m bertjax.tools.audit --config=configs/large.py:fast \
      --compile_for=tpu:v5p-64 --config.mesh.fsdp=32

Compiles the trainer's own train and eval steps (`bertjax.training.steps.build`, as a run
builds them) for the config's model, batch and mesh, on `--devices` simulated CPU devices (any
machine; without --devices, on the machine's own devices) or, with `--compile_for=tpu:SLICE`,
by XLA's TPU compiler for the chips of a TPU slice (`bertjax.tools.tpu_target`: a Python with
libtpu; model.dtype and model.attention `auto` are then the TPU's: bfloat16, splash), runs
nothing, and prints for each:

- its collectives: kind, count, the bytes per device (the whole tensor: a reduce-scatter's
  input, an all-gather's output) and the mesh axes they span (`bertjax.tools.hlo`). What to
  expect: data parallelism, the gradient all-reduce over `data` and scalar metrics; FSDP,
  all-gathers of the parameters and reduce-scatters of their gradients over `fsdp`; tensor
  parallelism, a few collectives per layer over `tensor`; the eval step, scalars only;
- its matmuls by operand and result dtypes, as the program asks for them (before a backend
  changes them);
- the memory XLA plans per device (arguments, outputs, temporaries; total less donated), and
  on a TPU its share of the chip's HBM;
- the seconds it took to compile.

The batch is random, with the config's shapes (train.batch_size and eval_batch_size rows of
data.max_seq_length tokens, data.max_predictions_per_seq predictions; with data.packing, train
rows of data.max_sequences_per_row sequences and the prediction slots a packed row has, eval
rows unpacked, as a run's) and a vocabulary of data.vocab_size. A contrastive config
(`configs/embeddings.py`) audits its model (`config.init_checkpoint`, read as its run reads it)
on (anchor, positive) rows of data.max_seq_length tokens (0: the model's length): the exchange
of negatives is an all-gather of the embeddings ([batch, dim] per column), beside the gradient's
all-reduce. On a CPU a program is compiled for the CPU: the collectives are those its SPMD
partitioning made, which is the same pass on every backend, though a GPU's or TPU's compiler may
later fuse or reorder them; `--compile_for` gives the TPU program's own.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence


def _simulated_devices(argv: Sequence[str]) -> None:
  """--devices=N: N CPU devices, set where XLA reads it, before jax is imported."""
  for arg in argv:
    if arg.startswith("--devices="):
      count = arg.split("=", 1)[1]
      if not count.isdigit() or int(count) < 1:
        return  # refused by main, once jax starts with the machine's devices
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                 + f" --xla_force_host_platform_device_count={count}")
      os.environ["JAX_PLATFORMS"] = "cpu"


if __name__ == "__main__":
  _simulated_devices(sys.argv)

# pylint: disable=wrong-import-position
import jax
import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from bertjax import main as bertjax_main
from bertjax import run_config
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax import tasks
from bertjax.data.pretraining import packing as packing_plans
from bertjax.tasks import embeddings, pretraining, pretraining_config
from bertjax.modeldir import model_options
from bertjax.tools import bench, bench_measure, hlo, tpu_target
from bertjax.training import parallel, steps
from bertjax.training import task as task_lib
# pylint: enable=wrong-import-position

_FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py); override fields with --config.KEY=VALUE.",
    flag_values=_FLAGS, lock_config=True)
flags.DEFINE_integer("devices", 0, "Simulate this many CPU devices (0: the machine's own).",
                     flag_values=_FLAGS)
flags.DEFINE_string("json", "", "Also write the audit to this JSON file.", flag_values=_FLAGS)
flags.DEFINE_string("compile_for", "", "tpu:SLICE (tpu:v5e-8, tpu:v5p-64, ...): compile for that "
                    "TPU slice's chips with libtpu (bertjax.tools.tpu_target).",
                    flag_values=_FLAGS)


def _task(config: run_config.PretrainingRun) -> tuple[task_lib.Task, dict, dict]:
  """The pretraining task of `config` without data, and a random train and eval batch of the
  config's shapes (packed train rows as the loader lays them out: data.max_sequences_per_row
  sequences and `packing.predictions_per_row` slots a row; evaluation is not packed)."""
  data, tr = config.data, config.train
  make = lambda rows, packing=0, predictions=data.max_predictions_per_seq: bench.make_batch(
      data.vocab_size, rows, data.max_seq_length, predictions, packing=packing)
  train = make(tr.batch_size)
  if data.packing:
    train = make(tr.batch_size, data.max_sequences_per_row, packing_plans.predictions_per_row(
        data.max_seq_length, data.max_sequences_per_row, data.max_predictions_per_seq,
        data.masked_lm_prob))
  model_config = pretraining_config.model_config(config, data.vocab_size)
  task = task_lib.Task(
      model=heads.BertForPreTraining(model_config,
                                     next_sentence=config.pretraining.uses_nsp),
      terms=pretraining.make_terms(5, config.pretraining.uses_nsp),
      batches=task_lib.Batches(train=lambda position: iter(())),
      schedule=task_lib.Schedule.of(tr))
  return task, train, make(tr.eval_batch_size)


def _embedding_task(config: run_config.EmbeddingsRun) -> tuple[task_lib.Task, dict, dict]:
  """The contrastive task of `config` (its model read, no data), and a random (anchor,
  positive) train and eval batch of the config's shapes."""
  model = embeddings.load_embedder(config)
  network = embeddings.make_network(config, model)
  terms, gradient = embeddings.objective(config, network, 2, model.dimension)
  rng = np.random.default_rng(0)

  def make(rows):
    ids = rng.integers(1, network.config.vocab_size, (rows, 2, model.max_seq_length), np.int32)
    return {"input_ids": ids, "input_mask": np.ones_like(ids),
            "duplicate_ids": np.arange(rows, dtype=np.int32),
            "example_weight": np.ones((rows,), np.float32)}

  tr = config.train
  steps_count = tr.num_train_steps if tr.num_train_steps > 0 else 1000
  task = task_lib.Task(
      model=network, terms=terms, batches=task_lib.Batches(train=lambda position: iter(())),
      schedule=task_lib.Schedule(steps_count, max(tr.warmup_steps, 0), 100, 1000, 1000),
      gradient=gradient)
  return task, make(tr.batch_size), make(tr.eval_batch_size)


def _report(lowered: Any, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """{collectives: hlo.summary rows, matmuls: {dtypes: count}, memory: bytes per device,
  compile_s}."""
  start = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  return dict(collectives=hlo.summary(hlo.collectives(compiled.as_text(), mesh)),
              matmuls=dict(hlo.matmuls(lowered.as_text())),
              memory=bench_measure.compiled_memory_bytes(compiled), compile_s=compile_s)


def audit(config: ml_collections.ConfigDict | run_config.TrainingRun,
          devices: Sequence[jax.Device] | None = None,
          steps_to_compile: Sequence[str] = ("train", "eval")) -> dict[str, Any]:
  """Compiles `config`'s train and eval steps (a pretraining or contrastive config, typed here
  where it is a ConfigDict) on the config's mesh over `devices` (default: jax's; a TPU slice's
  from `tpu_target.devices`, whose platform then resolves model.dtype `auto`).

  Returns:
    {mesh: {axis: size}, devices, device (its kind), platform, hbm_bytes (a TPU chip's, else
    None), parameter_bytes, and for each of `steps_to_compile` ("train", "eval") its _report}.
  """
  if isinstance(config, ml_collections.ConfigDict):
    config = tasks.typed(config)
  device = (devices or jax.devices())[0]
  if config.model.dtype == model_options.AUTO:  # the compute dtype of the devices compiled for
    config = dataclasses.replace(config, model=dataclasses.replace(
        config.model, dtype=model_options.resolve_dtype(model_options.AUTO, device.platform)))
  if isinstance(config, run_config.EmbeddingsRun):
    task, train_batch, eval_batch = _embedding_task(config)
  elif isinstance(config, run_config.PretrainingRun):
    task, train_batch, eval_batch = _task(config)
  else:
    raise UserError(f"the audit takes a pretraining or a contrastive config, not "
                    f"task={config.task!r}.")
  setup = steps.build(config, task, train_batch, steps.make_checked_mesh(config, devices))
  on_mesh = lambda batch: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=parallel.batch_sharding(setup.mesh)), batch)
  params = setup.abstract_state["params"]
  lower = dict(train=lambda: setup.train_step.lower(setup.abstract_state, on_mesh(train_batch),
                                                    setup.learning_rate(0)),
               eval=lambda: setup.eval_step.lower(params, on_mesh(eval_batch)))
  return dict(
      mesh=dict(setup.mesh.shape), devices=setup.mesh.devices.size, device=device.device_kind,
      platform=device.platform,
      hbm_bytes=tpu_target.hbm_bytes(device.device_kind) if device.platform == "tpu" else None,
      parameter_bytes=sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)),
      **{step: _report(lower[step](), setup.mesh) for step in steps_to_compile})


def _megabytes(nbytes: int) -> str:
  return f"{nbytes / 1e6:.2f}"


def format_audit(result: dict[str, Any]) -> str:
  """The audit as text: per step, a table of collectives, the matmul dtypes and the memory."""
  mesh = " x ".join(f"{axis}={size}" for axis, size in result["mesh"].items())
  lines = [f"mesh {mesh} ({result['devices']} devices), {result['device']}; parameters "
           f"{_megabytes(result['parameter_bytes'])} MB"]
  for step in [s for s in ("train", "eval") if s in result]:
    report = result[step]
    lines += ["", f"{step} step", f"  {'collective':<20}{'count':>6}{'MB/device':>12}  axes"]
    for row in report["collectives"]:
      lines.append(f"  {row['kind']:<20}{row['count']:>6}{_megabytes(row['nbytes']):>12}  "
                   f"{','.join(row['axes']) or '-'}")
    if not report["collectives"]:
      lines.append("  (none)")
    lines.append("  matmuls: " + ", ".join(f"{count} {dtypes}" for dtypes, count in
                                          sorted(report["matmuls"].items())))
    lines.append("  memory per device (MB): " + ", ".join(
        f"{name} {_megabytes(nbytes)}" for name, nbytes in report["memory"].items())
        + (f" ({report['memory']['total'] / result['hbm_bytes']:.0%} of a chip's "
           f"{result['hbm_bytes'] / 2**30:.0f} GiB HBM)" if result["hbm_bytes"] else ""))
    lines.append(f"  compiled in {report['compile_s']:.1f} s")
  return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    bertjax_main.fail(f"unexpected arguments {list(argv[1:])}; flags are written --name=value.")
  config = _CONFIG.value
  devices = _FLAGS.devices
  if _FLAGS["devices"].present and devices < 1:
    bertjax_main.fail(f"--devices={devices}: simulate 1 or more CPU devices (e.g. --devices=8), "
                      "or leave the flag out to audit on this machine's own devices.")
  if devices and _FLAGS.compile_for:
    bertjax_main.fail(f"--devices={devices} simulates CPU devices and --compile_for="
                      f"{_FLAGS.compile_for} compiles for a TPU slice's chips; give one of them.")
  if devices and jax.device_count() != devices:
    bertjax_main.fail(f"--devices={devices} simulates CPU devices when jax starts, but jax "
                      f"already has {jax.device_count()}; run the audit as its own process.")
  try:
    target = (tpu_target.devices(tpu_target.parse(_FLAGS.compile_for)) if _FLAGS.compile_for
              else None)
    result = audit(config, target)
  except UserError as e:
    bertjax_main.fail(str(e))
  print(format_audit(result))
  if _FLAGS.json:
    with open(_FLAGS.json, "w") as f:
      json.dump(result, f, indent=1)


def _parse(argv: list[str]) -> list[str]:
  """Parses the flags (a bad one is one line and exit 2)."""
  try:
    return _FLAGS(bertjax_main.find_config(argv))
  except UserError as e:
    bertjax_main.fail(str(e))
  except Exception as e:  # pylint: disable=broad-except
    bertjax_main.fail(f"{e}. Check the flags: --config=FILE, --config.KEY=VALUE, --devices=N, "
                      "--compile_for=tpu:SLICE, --json=FILE.")
  return []


if __name__ == "__main__":
  main(_parse(sys.argv))
