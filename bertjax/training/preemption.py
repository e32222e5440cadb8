"""Stopping a run on SIGTERM or SIGINT, at the same step on every process.

Cloud TPU preempts a VM with SIGTERM; `launch/tpu.py stop`, SLURM's `scancel` and a person at the
terminal (Ctrl-C: SIGINT) stop a run the same way. The signal may reach one host of a pod, or all
of them at different steps, but a checkpoint save is collective: every process must decide to
stop after the same step, or the ones that go on block in their next step while the others wait
in the save. So no process decides alone:

* Several processes (after `jax.distributed.initialize()`): the decision is jax's preemption sync
  protocol. `initialize()` installs a native SIGTERM handler (its preemption notifier); on the
  first SIGTERM anywhere, every process sends the coordination service how many times it has
  asked `reached_preemption_sync_point`, and all agree on the next count after the largest. A
  Python `signal.signal(SIGTERM, ...)` would replace that handler and the notice would never be
  sent, so none is installed here; SIGINT is routed into the same protocol by sending this
  process a SIGTERM.
* One process: a flag that the SIGTERM/SIGINT handler sets.

The sync point is asked with a count of calls rather than the train step: all processes start the
loop at the same step and call once per step, so counts and steps agree, and a signal that comes
before the first call of a resumed run (while restoring or compiling) still stops it after its
first step (jax's counter starts at 0 and the agreed point is the largest count + 1). Nothing else
may ask the sync point with other numbers: `bertjax.training.checkpoint` keeps orbax from doing so.

Usage (every process runs the same loop):
  with StopSignal() as stop_signal:
    while step < stop:
      ... one train step ...; step += 1
      stopping = stop_signal.should_stop(step)
      checkpoints.save(step, state, position, force=step == stop or stopping)
      if stopping:
        break
"""
from __future__ import annotations

import itertools
import os
import signal
import threading

import jax
from jax.experimental import multihost_utils

from bertjax.errors import UserError

# How many times this process has asked jax's preemption sync point: it is process-wide state in
# jax too (one sync manager per process), so one count per process, continued by every StopSignal.
_sync_calls = itertools.count(1)


class StopSignal:
  """Turns SIGTERM / SIGINT on any process into a stop at one step that every process agrees on.

  A context manager: inside it, SIGINT no longer raises KeyboardInterrupt, and on one process
  SIGTERM no longer ends it; both handlers are restored on exit. Enter it on every process,
  in the main thread, and call `should_stop` exactly once per train step. It may be entered
  before the state is restored, so that a SIGINT then is caught too (it counts calls, not steps).

  Attributes:
    received: 'SIGINT' or 'SIGTERM' once this process got it, as far as Python sees: in a
      multi-process job jax's native handler takes SIGTERM, so there it stays None (as on the
      hosts that got no signal; they stop at the agreed step all the same).
  """

  def __init__(self):
    self.received: str | None = None
    self._multiprocess = False
    self._previous: dict[int, object] = {}

  def __enter__(self) -> StopSignal:
    self._multiprocess = jax.distributed.is_initialized()
    if self._multiprocess:
      if not jax.config.jax_enable_preemption_service:
        raise UserError(
            "jax_enable_preemption_service is off, so the processes of this job cannot agree "
            "on a step to stop at on SIGTERM; remove JAX_ENABLE_PREEMPTION_SERVICE=0 (or "
            "--jax_enable_preemption_service=false) from the launch.")
      replaced = signal.getsignal(signal.SIGTERM)
      if callable(replaced):
        raise RuntimeError(
            f"a Python SIGTERM handler ({replaced!r}) replaced the one jax.distributed installs "
            "for its preemption sync; remove it (bertjax.training.preemption.StopSignal handles "
            "SIGTERM).")
    if threading.current_thread() is not threading.main_thread():
      return self  # signal handlers can only be set from the main thread
    handled = [signal.SIGINT] if self._multiprocess else [signal.SIGINT, signal.SIGTERM]
    for signum in handled:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum: int, frame) -> None:
    del frame
    if self.received is None:
      self.received = signal.Signals(signum).name
      if self._multiprocess:
        os.kill(os.getpid(), signal.SIGTERM)  # into jax's preemption notifier

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop after `step`: the same answer, at the same step, on every process.

    Args:
      step: the number of train steps done (one more than at the previous call).
    Returns:
      True at the step where all processes stop, once a signal reached any of them. A process
      may be blocked here for a moment while the processes agree.
    """
    del step  # the processes agree on a count of calls, which follows the steps (module docs)
    if not self._multiprocess:
      return self.received is not None
    return multihost_utils.reached_preemption_sync_point(next(_sync_calls))
