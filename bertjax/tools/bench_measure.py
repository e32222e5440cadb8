"""How the benchmark measures a step: its time, and its memory (the process's peak on CPU, XLA's
compiled plan, the activations the backward pass keeps, a device's share).

Used by every peer of `bertjax.tools.bench` (its docstring says what each figure means and how a
GPU's peak is read) and by `bertjax.tools.bench_peers`.
"""
from __future__ import annotations

import resource
import time
from typing import Any, Callable

import jax
from jax.extend import core

from bertjax.models import heads
from bertjax.training import parallel, steps
from bertjax.training import task as task_lib


class CpuPeakMemory:
  """Peak RSS in bytes since the last `reset_peak()`, less the RSS at `start()`.

  On Linux the peak (VmHWM) can be reset, so `reset_peak()` after the warmup steps leaves the
  compiler's transient memory out; elsewhere it is the growth of the lifetime peak (ru_maxrss).
  """

  def start(self) -> None:
    self._exact = self.reset_peak()
    self._base = (self._status("VmRSS") if self._exact
                  else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

  @staticmethod
  def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux: "5" to clear_refs); False where it cannot."""
    try:
      with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
      return True
    except OSError:
      return False

  @staticmethod
  def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")

  def delta(self) -> int:
    peak = (self._status("VmHWM") if self._exact
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return max(peak - self._base, 0)


def time_steps(step: Callable[[], None], sync: Callable[[], None], steps: int, warmup: int,
               after_warmup: Callable[[], Any]) -> float:
  """Seconds a step, `steps` calls of `step` run back to back as a training loop runs them:
  each is dispatched without waiting for the one before, and `sync` (which blocks until the
  last call's work is done) is called once, at the end; total / steps. First `warmup` calls
  (compilation), `sync`, then `after_warmup`."""
  for _ in range(warmup):
    step()
  sync()
  after_warmup()
  start = time.perf_counter()
  for _ in range(steps):
    step()
  sync()
  return (time.perf_counter() - start) / steps


def compiled_memory_bytes(compiled) -> dict[str, int]:
  """What XLA plans to hold per device for a compiled step: {arguments, outputs, temporaries,
  total}, total = arguments + outputs - the donated (aliased) buffers + temporaries.

  XLA's CPU compiler does not keep remat's savings in its plan (its schedule computes the
  rematerialised forward early: a stack of checkpointed tanh layers plans more temporaries than
  the plain one), so on CPU the remat rows differ in `saved_activation_bytes`, not here."""
  analysis = compiled.memory_analysis()
  parts = dict(arguments=analysis.argument_size_in_bytes, outputs=analysis.output_size_in_bytes,
               temporaries=analysis.temp_size_in_bytes)
  parts["total"] = (parts["arguments"] + parts["outputs"] - analysis.alias_size_in_bytes
                    + parts["temporaries"])
  return {k: int(v) for k, v in parts.items()}


def saved_activations(task: task_lib.Task, setup: steps.Setup, batch: Any,
                      seq_len: int) -> dict[str, int]:
  """`saved_activation_bytes` of the task's loss with dropout, traced under the setup's mesh as
  its train step is (so its attention is the step's path), a device's share of them (the
  batch's rows are split over data x fsdp). `batch`: ShapeDtypeStructs."""

  def loss(params, batch):
    outputs = heads.apply_to_batch(task.model, params, batch, deterministic=False,
                                   rngs={"dropout": jax.random.PRNGKey(0)})
    return sum(jax.numpy.sum(values * weights) / jax.numpy.maximum(jax.numpy.sum(weights), 1)
               for name, (values, weights) in task.terms(outputs, batch).items()
               if task_lib.is_loss(name))

  saved = steps.under_mesh(setup.mesh, lambda *args: saved_activation_bytes(
      *args, seq_len=seq_len))(loss, setup.abstract_state["params"], batch)
  return {k: v // parallel.num_batch_shards(setup.mesh) for k, v in saved.items()}


def saved_activation_bytes(loss: Callable[..., Any], *args, seq_len: int) -> dict[str, int]:
  """Bytes the backward pass of `loss` keeps from its forward pass: the residuals of
  `jax.vjp(loss, *args)`, less those that are the arguments themselves (the parameters, the
  batch). Traced only (args may be ShapeDtypeStructs), so it holds for any backend; it is what
  remat trades for recomputation.

  Returns:
    {"activations": all of them, "attention_matrices": those shaped [..., seq_len, seq_len]
    (scores, probabilities, dropout masks), which a fused attention kernel (cuDNN, splash) does
    not keep: it saves [batch, heads, seq] softmax statistics instead}.
  """
  closed, shapes = jax.make_jaxpr(lambda *a: jax.vjp(loss, *a), return_shape=True)(*args)
  jaxpr = closed.jaxpr
  residuals = jaxpr.outvars[len(jaxpr.outvars) - len(jax.tree.leaves(shapes[1])):]
  arguments = set(jaxpr.invars)
  kept = [v.aval for v in {v for v in residuals
                           if not isinstance(v, core.Literal) and v not in arguments}]
  size = lambda aval: aval.size * aval.dtype.itemsize
  return dict(activations=int(sum(size(a) for a in kept)),
              attention_matrices=int(sum(size(a) for a in kept
                                         if a.shape[-2:] == (seq_len, seq_len))))
