"""A run's WORKDIR: the name of each file in it, and holding it for one run (a job of any hosts).

Every file a run writes in WORKDIR is named once, here (the constants below); the model
directory's files that a run writes there too, bert_config.json and the tokenizer's, are named by
`bertjax.modeldir.model_files`, which reads them back from any model directory; the tasks'
prediction files by the tasks that write them (`bertjax.tasks.glue.EVAL_PREDICTIONS_FILE`,
ner's, swag's, squad_answers': run_squad's names).

Two runs on one workdir would interleave their checkpoints, logs and prepared data, so
`bertjax.main` holds the workdir for the whole run, from before any work (data preparation writes
WORKDIR/data) to its end. Process 0 of a job takes the lock; the other processes of a multi-host
job share it and are told by process 0 whether it was taken, so a second job on the same workdir
is refused on every process with the same message.

The lock itself (its file, heartbeat and takeover of a dead run's) is `bertjax.lock`.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import jax
import numpy as np
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils

from bertjax.errors import UserError
from bertjax.lock import Lock

# WORKDIR/... (and .lock: bertjax.lock.LOCK_FILE)
CONFIG_FILE = "config.json"  # the run's whole config, written at its start
CHECKPOINTS_DIR = "checkpoints"  # checkpoints/<step>/ (`bertjax.training.checkpoint`)
METRICS_FILE = "metrics.jsonl"  # one line per logged step and evaluation (reports)
TENSORBOARD_DIR = "tensorboard"  # the same scalars as TensorBoard events (reports)
EVAL_RESULTS_FILE = "eval_results.json"  # the last evaluation and the task's main metric
CURVES_FILE = "curves.png"  # the loss and the main metric against the steps (curves)
DATA_DIR = "data"  # pretraining: the config's text, prepared on first use
LABELS_FILE = "labels.json"  # NER: the tags in the order of the model's classes

_MESSAGE_BYTES = 4096  # room for process 0's message to the other processes


def _job() -> dict | None:
  """The multi-host job this process belongs to ({coordinator, processes}), None if alone."""
  if not jax.distributed.is_initialized():
    return None
  coordinator = (getattr(jax_distributed.global_state, "coordinator_address", None)
                 or os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("SLURM_JOB_ID"))
  return {"coordinator": coordinator, "processes": jax.process_count()}


def _from_process_0(message: str) -> str:
  """Process 0's `message` on every process of the job (a collective: all must call it)."""
  data = message.encode()[:_MESSAGE_BYTES].ljust(_MESSAGE_BYTES, b"\0")
  received = multihost_utils.broadcast_one_to_all(np.frombuffer(data, np.uint8))
  return np.asarray(received, np.uint8).tobytes().rstrip(b"\0").decode(errors="replace")


@contextlib.contextmanager
def held(workdir: str) -> Iterator[None]:
  """Holds `workdir` for the run inside: process 0 takes WORKDIR/.lock, every process of a
  multi-host job learns the outcome. Call it on every process, after
  `distributed.maybe_initialize_distributed`.

  Raises:
    UserError (on every process): the workdir cannot be used, or another run holds it.
  """
  multiprocess = jax.distributed.is_initialized() and jax.process_count() > 1
  lock, message = None, ""
  try:
    if not multiprocess or jax.process_index() == 0:
      try:
        lock = Lock.take(workdir, job=_job())
      except UserError as e:
        message = str(e)
    if multiprocess:
      message = _from_process_0(message)
    if message:
      raise UserError(message)
    yield
  finally:
    if lock is not None:
      lock.release()
