"""The divergence tests' data hook (test-only, no flag a user sees): a run's training stream
with chosen batches changed or dropped, by their place in the stream.

A batch's place is (phase, examples) of its data position after it: the global examples
consumed (`bertjax.data.pipeline`) in the pretraining phase (0, or 1 for the long phase; 0 for
fine-tuning), so the same batches are changed however the stream is restarted (a resume, a
rollback). `spiked` makes a batch's loss explode: its masked-LM labels become [PAD], which a
masked LM learns never to predict, and its NSP or classification labels are flipped.

  python tests/spiking_main.py PHASE:EXAMPLES[,...] KILL --config=... ...

is `python -m bertjax.main` with the batches at those places spiked, and the process killed
(SIGKILL) when it draws a batch the KILL-th time (PHASE:EXAMPLES:TIMES; "-": never).
"""
from __future__ import annotations

import dataclasses
import os
import signal
from typing import Callable, Iterable

import numpy as np

from bertjax.training import train

PAD_ID = 0  # [PAD] in bertjax's vocabularies (sentencepiece's it trains, and WordPiece's)
REAL_TRAIN_AND_EVALUATE = train.train_and_evaluate  # before any test replaces it


def spiked(batch: dict) -> dict:
  """`batch` with wrong labels: every masked-LM label [PAD], NSP and classification labels
  flipped (0 <-> 1, other classes to 0)."""
  batch = dict(batch)
  if "masked_lm_ids" in batch:
    batch["masked_lm_ids"] = np.full_like(batch["masked_lm_ids"], PAD_ID)
  for key in ("next_sentence_labels", "label"):  # NSP, a GLUE classification
    if key in batch and np.issubdtype(batch[key].dtype, np.integer):
      batch[key] = (batch[key] == 0).astype(batch[key].dtype)
  return batch


def place(position: dict) -> tuple[int, int]:
  """(phase, examples) of a data position."""
  return int(position.get("phase", 0)), int(position["examples"])


def with_stream(change: Callable[[dict, tuple[int, int]], dict | None]):
  """`train.train_and_evaluate` whose task's training batches pass through `change(batch, its
  place)`: the batch to train on, or None to drop it."""

  def train_and_evaluate(config, workdir, task, context):
    def stream(position) -> Iterable:
      for batch, after in task.batches.train(position):
        changed = change(batch, place(after))
        if changed is not None:
          yield changed, after

    batches = dataclasses.replace(task.batches, train=stream)
    return REAL_TRAIN_AND_EVALUATE(config, workdir, dataclasses.replace(task, batches=batches),
                                   context)

  return train_and_evaluate


def spiking(places: set[tuple[int, int]], kill: tuple[int, int, int] | None = None):
  """`change` for `with_stream`: spikes the batches at `places`; with `kill` (phase, examples,
  times), kills this process (SIGKILL: nothing saved, nothing cleaned up) when it draws the
  batch at (phase, examples) the times-th time."""
  drawn: dict[tuple[int, int], int] = {}

  def change(batch: dict, at: tuple[int, int]) -> dict:
    drawn[at] = drawn.get(at, 0) + 1
    if kill is not None and (*at, drawn[at]) == tuple(kill):
      os.kill(os.getpid(), signal.SIGKILL)
    return spiked(batch) if at in places else batch

  return change


def dropping(places: set[tuple[int, int]]):
  """`change` for `with_stream`: the stream without the batches at `places`."""
  return lambda batch, at: None if at in places else batch
