"""Compiling a run's jitted functions ahead of time, side by side.

XLA compiles a jitted step once for each batch shape it meets: fine-tuning's length buckets and
packed widths give two or three training shapes and as many evaluation shapes, and each compile
takes seconds on one CPU core. Met one by one, those compiles are the run's start-up and pause
it mid-run. `PerShape` compiles the shapes a run will meet (its task's `Batches.samples`) in a
thread pool at the start (XLA compiles without holding Python's GIL), so they run side by side,
with the restore and with the first steps, and each call then runs its shape's executable.
A shape nobody announced is compiled at its first call, as `jax.jit` does.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

import jax
import numpy as np

from bertjax.training import parallel

Batch = Mapping[str, Any]  # {key: [batch, ...]} numpy (per host) or jax.Array (global)


@contextlib.contextmanager
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
  """A pool for compiles, as many threads as cores, at most 4 (a compile uses one core); on
  leaving, the compiles not started are dropped and the running ones waited for."""
  executor = concurrent.futures.ThreadPoolExecutor(
      max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="compile")
  try:
    yield executor
  finally:
    executor.shutdown(wait=True, cancel_futures=True)


def signature(batch: Batch, hosts: int = 1) -> tuple:
  """What a compiled step depends on in a batch: each key's global shape and dtype (a per-host
  batch's rows times `hosts`)."""
  return tuple(sorted(
      (key, (np.shape(value)[0] * hosts,) + tuple(np.shape(value)[1:]),
       str(jax.dtypes.canonicalize_dtype(np.result_type(value))))
      for key, value in batch.items()))


def abstract_global_batch(local_batch: Batch, mesh: jax.sharding.Mesh
                          ) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch that `parallel.global_batch(local_batch, mesh)` makes, as shapes."""
  hosts, sharding = jax.process_count(), parallel.batch_sharding(mesh)
  return {key: jax.ShapeDtypeStruct((value.shape[0] * hosts,) + value.shape[1:],
                                    jax.dtypes.canonicalize_dtype(value.dtype),
                                    sharding=sharding)
          for key, value in local_batch.items()}


class PerShape:
  """A jitted `fn(leading, batch, *trailing)` called through executables compiled ahead, one per
  batch signature.

  Args:
    jitted: the `jax.jit` function, called as jitted(leading, batch, *trailing).
    leading: the abstract first argument (ShapeDtypeStructs with shardings: the train state,
      the parameters).
    mesh: the mesh the batches are sharded over.
    executor: the pool the compiles run in.
    trailing: examples of the arguments after the batch (the train step's learning rate), as
      their shapes and dtypes are what a compile depends on.
  """

  def __init__(self, jitted, leading: Any, mesh: jax.sharding.Mesh,
               executor: concurrent.futures.Executor, trailing: Sequence[Any] = ()):
    self._jitted, self._leading, self._mesh, self._executor = jitted, leading, mesh, executor
    self._trailing = tuple(trailing)
    self._compiled: dict[tuple, concurrent.futures.Future] = {}

  def prepare(self, local_batches: Sequence[Batch]) -> None:
    """Starts compiling for the shapes of these per-host batches (those not started yet)."""
    for local_batch in local_batches:
      key = signature(local_batch, jax.process_count())
      if key not in self._compiled:
        abstract = abstract_global_batch(local_batch, self._mesh)
        self._compiled[key] = self._executor.submit(
            lambda abstract=abstract: self._jitted.lower(
                self._leading, abstract, *self._trailing).compile())

  def __call__(self, leading: Any, batch: Batch, *trailing: Any):
    """jitted(leading, batch, *trailing), on the executable compiled ahead for the batch's
    shapes when there is one (waiting for its compile to finish), else through jax.jit."""
    compiled = self._compiled.get(signature(batch))
    if compiled is None:
      return self._jitted(leading, batch, *trailing)
    return compiled.result()(leading, batch, *trailing)


def distinct_shapes(batches: Iterable[Batch]) -> list[Batch]:
  """The first batch of each signature among `batches`, in order met."""
  found: dict[tuple, Batch] = {}
  for batch in batches:
    found.setdefault(signature(batch), batch)
  return list(found.values())
