"""The checkpoints of one run: save the train state and data position, resume from the newest.

On-disk layout: orbax-checkpoint's `CheckpointManager`, one directory per step under
WORKDIR/`bertjax.workdir.CHECKPOINTS_DIR`, each laid out as `bertjax.modeldir.layout` says (the
train state, and the data position with the run's train.prng_impl and the divergence guard's
record, `bertjax.training.divergence`).

The train state is the trainer's plain dict `{'step', 'params', 'opt_state', 'rng'}`; anything
that is a pytree of arrays can be saved, but `bertjax.modeldir.saved_params.load_params` (which
starts another run from it) reads the `params` entry, so a state meant to initialise other runs
must keep its parameters under the key 'params' (a nested dict of arrays, as a linen model's
"params" collection).

Before anything is restored, every array's shape in the checkpoint is compared with what the
caller expects; a checkpoint of a different model is a `UserError`, and nothing on disk is
touched. So is one saved with another PRNG (train.prng_impl; checkpoints that predate its
record were all threefry) than the run resuming it.

Faults (each one line for the user, a `UserError` or a warning, instead of orbax's tracebacks;
`bertjax.modeldir.checkpoint_faults` recognises them and keeps orbax's echoes off stderr):

* A checkpoint that does not read back whole (a truncated or missing file, missing metadata):
  `resume` warns, moves it aside as `<step>.corrupt-<time>` (outside orbax's step listing, kept
  for inspection) and resumes from the newest one that reads; if none does, it refuses and
  names them, changing nothing. Every host reads and all agree before process 0 renames.
* A full disk while saving (in `save`, or in the background write that the next `save`, `wait`
  or `close` waits for): the partial `<step>.orbax-checkpoint-tmp` directory is removed, the
  earlier checkpoints stay (orbax rotates old ones out only after a save has finished), and a
  `UserError` says which disk is full and what to free.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from bertjax.errors import UserError
from bertjax.modeldir import checkpoint_faults, layout

def _on_every_host(ok: bool) -> bool:
  """Whether `ok` holds on every process (a collective: all processes must call it)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


class _Manager(ocp.CheckpointManager):
  """orbax's CheckpointManager without its own preemption checks.

  It would ask jax's preemption sync point with the step being saved, in `save` and, after an
  asynchronous save, from its finalize thread, while the train loop is already steps further.
  Each call sets the process's counter in jax's sync protocol, so a SIGTERM that comes just
  then makes the processes agree on a point that is already behind, and they never stop (or
  one skips it and the others wait in the save). `bertjax.training.preemption.StopSignal` is the
  only caller of the sync point.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class Checkpoints:
  """The checkpoints of one run: train state + data position per step, the last `keep` kept.

  Saving is asynchronous (the arrays are copied to host memory, then written in the background
  while training goes on); `wait()` blocks until written and `close()` waits too. A background
  write that failed raises in the next `save` that writes, in `wait` or in `close` (a full disk
  as a UserError). Every process of a multi-host job must make the same calls.

  Usage:
    checkpoints = Checkpoints(workdir / "checkpoints", save_every_steps=1000, keep=3)
    if checkpoints.latest_step() is not None:
      state, position = checkpoints.resume(abstract_state)  # the newest that reads back whole
    ...
    checkpoints.save(step, state, position)               # saves when step % 1000 == 0
    checkpoints.save(step, state, position, force=True)   # the end of the run, preemption
    checkpoints.close()
  """

  def __init__(self, directory: epath.PathLike, *, save_every_steps: int, keep: int | None,
               async_save: bool = True, prng_impl: str | None = None):
    """Opens (does not create) `directory`; it is created by the first save.

    Args:
      directory: where step directories go, usually WORKDIR/checkpoints (local or gs://).
      save_every_steps: `save` writes at steps that are multiples of this (unless forced).
      keep: how many of the latest checkpoints to keep (None: all).
      async_save: write in a background thread (False: `save` returns once written).
      prng_impl: the run's train.prng_impl (the kind of its state's rng), recorded with each
        save; restoring a checkpoint saved with another is a UserError. None: neither.
    """
    if save_every_steps < 1:
      raise UserError(f"checkpoint_every_steps={save_every_steps} must be at least 1; set "
                      "--config.train.checkpoint_every_steps.")
    if keep is not None and keep < 1:
      raise UserError(f"keep_checkpoints={keep} must be at least 1; set "
                      "--config.train.keep_checkpoints.")
    self.directory = epath.Path(directory)
    self._save_every_steps = save_every_steps
    self._async = async_save
    self._prng_impl = prng_impl
    self._writing: tuple[int, int] | None = None  # (step, bytes) of a save not yet waited for
    self._closed = False
    checkpoint_faults.install_quiet_failures()
    # Save at multiples of save_every_steps; unlike orbax's default, not also at the first step
    # seen. A preemption is a forced save at the step bertjax.training.preemption agreed on.
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_every_steps),
        max_to_keep=keep, create=False, enable_async_checkpointing=async_save)
    self._manager = _Manager(self.directory, item_handlers=layout.handlers(), options=options)

  def latest_step(self) -> int | None:
    """The newest saved step, None if there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every kept step, oldest first."""
    return sorted(self._manager.all_steps())

  def due(self, step: int, *, force: bool = False) -> bool:
    """Whether `save(step, ..., force=force)` would write a checkpoint."""
    return (force or step % self._save_every_steps == 0) and step not in self._manager.all_steps()

  def save(self, step: int, state: Any, data_position: Any, *, force: bool = False,
           guard: Any = None) -> bool:
    """Saves `state` and `data_position` as `step` when due (or when `force`).

    Args:
      step: the number of train steps done.
      state: pytree of jax.Arrays (sharded or not), e.g. {'step','params','opt_state','rng'}.
      data_position: JSON-serialisable value (dict, None, ...) that resumes the data pipeline.
      force: save even if `step` is not a multiple of `save_every_steps` (end of run,
        preemption). A step that is already saved is never overwritten.
      guard: JSON-serialisable record of the divergence guard (`guard_record` reads it back);
        None: none.
    Returns:
      whether a save was started.
    Raises:
      UserError: the disk is full (this save, or the previous one, written in the background);
        the partial directory is removed, the earlier checkpoints are kept.
    """
    if not self.due(step, force=force):
      return False
    self._finish_writing()
    nbytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(state))
    recorded = {"data_position": data_position}
    if self._prng_impl is not None:
      recorded["prng_impl"] = self._prng_impl
    if guard is not None:
      recorded["guard"] = guard
    try:
      started = self._manager.save(
          step, force=True, args=ocp.args.Composite(**{
              layout.STATE_ITEM: ocp.args.StandardSave(state),
              layout.DATA_ITEM: ocp.args.JsonSave(recorded)}))
    except Exception as e:  # pylint: disable=broad-except
      if not checkpoint_faults.is_disk_full(e):
        raise
      raise UserError(self._disk_full(step, nbytes, e)) from e
    if started and self._async:
      self._writing = (step, nbytes)
    return started

  def _finish_writing(self) -> None:
    """Waits for the save written in the background, if any; on every host, so that all raise
    if one host's write failed."""
    if self._writing is None:
      return
    (step, nbytes), self._writing = self._writing, None
    error = None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      error = e
    if _on_every_host(error is None):
      return
    message = self._disk_full(step, nbytes, error)
    if error is not None and not checkpoint_faults.is_disk_full(error):
      raise error
    raise UserError(message) from error

  def _disk_full(self, step: int, nbytes: int, error: BaseException | None) -> str:
    """Removes the partial save of `step` (process 0; every host waits for it) and returns the
    message of a full disk (`error`: this host's, None if the write failed on another host)."""
    removed = []
    if jax.process_index() == 0:
      removed = checkpoint_faults.remove_partial_saves(self.directory)
    _barrier("bertjax:checkpoint_disk_full")
    self._manager.reload()
    return checkpoint_faults.disk_full_message(self.directory, step, nbytes, error, removed,
                                               self.all_steps())

  def _step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)  # orbax's standard step names: the number alone

  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises UserError unless the saved state at `step` has exactly the keys and shapes of
    `abstract_state`. Reads only metadata (missing or unreadable metadata raises what orbax
    raises: FileNotFoundError, json.JSONDecodeError, ...)."""
    saved = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / layout.STATE_ITEM)
    saved = getattr(saved, "tree", saved)
    if not saved:
      raise FileNotFoundError(
          f"no arrays named in {self._step_dir(step) / layout.STATE_ITEM}/_METADATA")
    with_fp8 = "fp8" in saved  # an fp8 model's scaling state (`bertjax.training.steps`)
    if isinstance(abstract_state, dict) and with_fp8 != ("fp8" in abstract_state):
      raise UserError(
          f"the checkpoint at step {step} in {self.directory} was written with model.fp8="
          f"{str(with_fp8).lower()}; resume with --config.model.fp8={str(with_fp8).lower()}, or "
          "use a new --workdir. Nothing was changed.")
    diffs = layout.shape_differences(layout.flat_shapes(saved),
                                     layout.flat_shapes(abstract_state))
    if diffs:
      raise UserError(
          f"the checkpoint at step {step} in {self.directory} does not match the model "
          f"({len(diffs)} differences): {layout.listing(diffs)}. This workdir holds a checkpoint "
          "of a different model; use a new --workdir or the matching config. Nothing was changed.")

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, Any]:
    """Restores the state and data position of `step` (default: the latest).

    Args:
      abstract_state: pytree of jax.ShapeDtypeStruct with `.sharding` set, in the structure of
        the saved state; arrays are restored straight into those shardings (and dtypes).
      step: which step; None for the latest.
    Returns:
      (state: pytree of jax.Array like `abstract_state`, data_position as saved).
    Raises:
      UserError: no such checkpoint, one whose keys or shapes differ from `abstract_state`, or
        one that does not read back whole (`resume` skips those).
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        raise UserError(f"no checkpoint in {self.directory}; start without resuming or point "
                        "--workdir at the run to resume.")
    elif step not in self._manager.all_steps():
      raise UserError(f"no checkpoint for step {step} in {self.directory}; it holds steps "
                      f"{self.all_steps()}.")
    try:
      return self._read(abstract_state, step)
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if not checkpoint_faults.is_damaged(e):
        raise
      raise UserError(f"the checkpoint {self._step_dir(step)} does not read back "
                      f"({checkpoint_faults.reason(e)}); "
                      "restore another step or move it away.") from e

  def _read(self, abstract_state: Any, step: int) -> tuple[Any, Any]:
    """`restore` of one step through orbax's handlers, without the manager's barriers, so that
    a host whose read fails does not leave the others waiting (they agree afterwards)."""
    step_dir = self._step_dir(step)
    handler = ocp.StandardCheckpointHandler()
    try:
      with checkpoint_faults.reading():
        position = ocp.JsonCheckpointHandler().restore(step_dir / layout.DATA_ITEM)
        self._check_prng_impl(position.get("prng_impl", "threefry"), step)
        self.check_compatible(abstract_state, step)
        restore = ocp.args.StandardRestore(layout.with_default_sharding(abstract_state))
        state = handler.restore(step_dir / layout.STATE_ITEM, args=restore)
    finally:
      handler.close()
    return state, position["data_position"]

  def guard_record(self, step: int) -> Any:
    """The divergence guard's record saved with `step` (None: none, or one that predates it)."""
    with checkpoint_faults.reading():
      recorded = ocp.JsonCheckpointHandler().restore(self._step_dir(step) / layout.DATA_ITEM)
    return recorded.get("guard")

  def _check_prng_impl(self, saved: str, step: int) -> None:
    """UserError if the checkpoint at `step` was saved with another train.prng_impl than this
    run's (`saved`: threefry for those that predate the record)."""
    if self._prng_impl is not None and saved != self._prng_impl:
      raise UserError(
          f"the checkpoint at step {step} in {self.directory} was saved with "
          f"train.prng_impl={saved}, and this run has train.prng_impl={self._prng_impl}; a run "
          f"resumes with the PRNG it started with: rerun with --config.train.prng_impl={saved} "
          "(or use a new --workdir). Nothing was changed.")

  def resume(self, abstract_state: Any) -> tuple[Any, Any]:
    """`restore` of the newest checkpoint that reads back whole.

    Newer ones that do not (a file truncated or missing, metadata deleted or garbled) are moved
    aside to `<step>.corrupt-<time>` in the same directory, for inspection, with a one-line
    warning each. Every host reads every candidate and all agree before process 0 renames, so
    all resume from the same step.

    Args:
      abstract_state: as for `restore`.
    Returns:
      (state, data position) of the newest readable checkpoint.
    Raises:
      UserError: no checkpoint at all, none that reads (they are named, and nothing is moved),
        or the newest readable one is of another model.
    """
    damaged: list[tuple[int, str]] = []
    for step in reversed(self.all_steps()):
      restored, reason = None, None
      try:
        restored = self._read(abstract_state, step)
      except UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        if not checkpoint_faults.is_damaged(e):
          raise
        reason = checkpoint_faults.reason(e)
      if _on_every_host(reason is None):
        self._set_aside(damaged, step)
        return restored
      damaged.append((step, reason or "on another host"))
    if not damaged:
      raise UserError(f"no checkpoint in {self.directory}; start without resuming or point "
                      "--workdir at the run to resume.")
    named = "; ".join(f"{self._step_dir(s)}: {reason}" for s, reason in damaged)
    raise UserError(
        f"no checkpoint in {self.directory} reads back whole: {named}. Move these directories "
        "out of it (to inspect them) to start over in this workdir, or use a new --workdir; "
        "nothing was changed.")

  def _set_aside(self, damaged: list[tuple[int, str]], resumed: int) -> None:
    """Renames the `damaged` (step, reason) directories to `<step>.corrupt-<time>` (process 0,
    with a warning each), then every host lists the steps again."""
    if not damaged:
      return
    stamp = time.strftime("%Y%m%dT%H%M%S")
    if jax.process_index() == 0:
      for step, reason in damaged:
        aside = self.directory / f"{step}.corrupt-{stamp}"
        self._step_dir(step).rename(aside)
        print(f"bertjax: warning: the checkpoint of step {step} in {self.directory} does not "
              f"read back ({reason}); moved it to {aside.name} and resuming from step {resumed}.",
              file=sys.stderr, flush=True)
    _barrier("bertjax:checkpoints_set_aside")
    self._manager.reload()

  def wait(self) -> None:
    """Blocks until every started save is on disk.

    Raises:
      UserError: the disk filled up during a background save (see `save`).
    """
    self._finish_writing()
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves (raising as `wait`), then releases the manager."""
    if self._closed:
      return
    try:
      self.wait()
    finally:
      self._closed = True
      self._manager.close()

  def __enter__(self) -> "Checkpoints":
    return self

  def abandon(self) -> None:
    """Releases the manager on the way out of an error, raising nothing more: its background
    writes are waited for (a failed one is what the error being raised reports), so none is
    left running when the process exits."""
    if self._closed:
      return
    self._closed = True
    for release in (self._manager.wait_until_finished, self._manager.close):
      try:
        release()
      except Exception:  # pylint: disable=broad-except
        pass

  def __exit__(self, exc_type, *exc) -> None:
    if exc_type is None:
      self.close()
    else:
      self.abandon()
