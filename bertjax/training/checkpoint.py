"""Checkpoints: save and resume a run, and start one from another run's parameters.

On-disk layout (orbax-checkpoint `CheckpointManager`, one directory per step):

  WORKDIR/checkpoints/<step>/state/           the train state, a pytree of arrays (orbax OCDBT)
  WORKDIR/checkpoints/<step>/data_position/   {"data_position": <JSON>} where the data stopped

The train state is the trainer's plain dict `{'step', 'params', 'opt_state', 'rng'}`; anything
that is a pytree of arrays can be saved, but `load_params` reads the `params` entry, so a state
meant to initialise other runs must keep its parameters under the key 'params' (a nested dict
of arrays, as a linen model's "params" collection).

Before anything is restored, every array's shape in the checkpoint is compared with what the
caller expects; a checkpoint of a different model is a `UserError`, and nothing on disk is
touched.

Faults (each one line for the user, a `UserError` or a warning, instead of orbax's tracebacks):

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

import dataclasses
import errno
import gc
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from typing import Any, Iterator, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util
from jax.experimental import multihost_utils

from bertjax.errors import UserError

CHECKPOINTS_DIR = "checkpoints"  # under the workdir
STATE_ITEM = "state"
DATA_ITEM = "data_position"
_MAX_LISTED = 5  # differences named in an error message


def _handlers() -> dict[str, ocp.CheckpointHandler]:
  return {STATE_ITEM: ocp.StandardCheckpointHandler(), DATA_ITEM: ocp.JsonCheckpointHandler()}


def _key_name(key: Any) -> str:
  """One step of a key path as text. Dict keys, sequence indices and attribute names all map to
  their plain name, because orbax's metadata stores tuples as lists and namedtuples (optax
  states) as dicts keyed by field name."""
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_str(path: Sequence[Any]) -> str:
  """A key path as 'params/bert/layer_0/attention/query/kernel'."""
  return "/".join(_key_name(k) for k in path)


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{path: shape} for every leaf of a pytree of arrays, ShapeDtypeStructs or orbax metadata."""
  return {path_str(path): tuple(getattr(leaf, "shape", ()))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shape_differences(saved: dict[str, tuple[int, ...]],
                      expected: dict[str, tuple[int, ...]]) -> list[str]:
  """Human-readable differences between two {path: shape} maps; parameters ('params/...')
  first, so that an error message names them before their optimizer moments."""
  diffs = []
  for path in sorted(saved.keys() | expected.keys(), key=lambda p: (not p.startswith("params"), p)):
    if path not in expected:
      diffs.append(f"{path}: {saved[path]} in the checkpoint, absent from the model")
    elif path not in saved:
      diffs.append(f"{path}: {expected[path]} in the model, absent from the checkpoint")
    elif saved[path] != expected[path]:
      diffs.append(f"{path}: {saved[path]} in the checkpoint, {expected[path]} in the model")
  return diffs


def _listing(diffs: list[str]) -> str:
  more = f"; and {len(diffs) - _MAX_LISTED} more" if len(diffs) > _MAX_LISTED else ""
  return "; ".join(diffs[:_MAX_LISTED]) + more


def _with_sharding(abstract: Any) -> Any:
  """ShapeDtypeStructs without a sharding get the first local device (orbax would otherwise
  restore them as numpy arrays)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(
      lambda x: x if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)


# A full disk, as the OS (OSError) or tensorstore ("... [os_error_code='28']") words it.
_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|os_error_code='(28|122)'")
# tensorstore's words for files that are missing, truncated or garbled (not for a network or
# memory failure, which must not get a good checkpoint moved aside).
_DAMAGED = re.compile(r"\b(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|FAILED_PRECONDITION)\b")
_TEMPORARY = ".orbax-checkpoint-tmp"  # orbax writes STEP.orbax-checkpoint-tmp*, then renames it
_reading = threading.Event()  # set while a checkpoint is read (it may be damaged)


def _chain(error: BaseException | None) -> Iterator[BaseException]:
  """`error` and the exceptions it was raised from or during, outermost first."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` (or one it came from) is a write to a full disk or past a quota."""
  return any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
             or _DISK_FULL.search(str(e)) for e in _chain(error))


def _is_damaged(error: BaseException) -> bool:
  """Whether `error`, raised while reading a checkpoint, says that its files are missing,
  truncated or garbled."""
  errors = list(_chain(error))
  if any(isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e) for e in errors):
    return False
  return any(isinstance(e, (FileNotFoundError, json.JSONDecodeError)) or _DAMAGED.search(str(e))
             for e in errors)


def _reason(error: BaseException) -> str:
  """The first line of the innermost cause of `error`, for a one-line message."""
  root = list(_chain(error))[-1]
  line = (str(root).strip().splitlines() or [type(root).__name__])[0].rstrip(".")
  return line if len(line) <= 300 else line[:297] + "..."


def _is_noise(text: str) -> bool:
  """Whether a log line, stray traceback or unraisable exception of orbax / tensorstore / asyncio
  repeats a failure that bertjax reports as one message of its own: a write to a full disk, or a
  read of a damaged checkpoint (`restore`, `resume`)."""
  if _DISK_FULL.search(text) or "Encountered error while reading" in text:
    return True
  return bool(_DAMAGED.search(text)) and (_reading.is_set()
                                          or "exception was never retrieved" in text)


class _NoiseFilter(logging.Filter):
  """Drops the log records (absl's, asyncio's) that `_is_noise`: orbax's threads log each failed
  write or read of one failure with a traceback, hundreds of lines for one full disk."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += " " + " ".join(str(e) for e in _chain(record.exc_info[1]))
    return not _is_noise(text)


_quiet_installed = False


def _install_quiet_failures() -> None:
  """Once per process: keeps the echoes of a failure that bertjax reports itself (a full disk, a
  damaged checkpoint) off stderr. These are orbax's and asyncio's log records about it, the
  exceptions its unawaited reads leave behind ("Exception ignored in <coroutine ...>"), and the
  "Event loop is closed" tracebacks that tensorstore's threads report (as unraisable) when a
  callback reaches the event loop that orbax closed after the failure. Anything else passes."""
  global _quiet_installed
  if _quiet_installed:
    return
  _quiet_installed = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_NoiseFilter())
  previous = sys.unraisablehook

  def unraisablehook(unraisable):
    value = unraisable.exc_value
    loop_closed = isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
    if not (loop_closed or (value is not None
                            and _is_noise(" ".join(str(e) for e in _chain(value))))):
      previous(unraisable)

  sys.unraisablehook = unraisablehook


def _on_every_host(ok: bool) -> bool:
  """Whether `ok` holds on every process (a collective: all processes must call it)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _remove_partial(path: epath.Path, settle_seconds: float = 0.5, timeout: float = 60) -> bool:
  """Removes `path`, the directory of a failed save, whose other writes may still be ending in
  orbax's and tensorstore's threads (they go on after the first one fails, and may recreate
  it): again until it stays gone for `settle_seconds`. Returns whether it is gone."""
  deadline = time.monotonic() + timeout
  while path.exists() and time.monotonic() < deadline:
    try:
      path.rmtree()
    except OSError:
      pass  # a file written meanwhile: try again
    time.sleep(settle_seconds)
  return not path.exists()


def _megabytes(nbytes: float) -> str:
  return f"{nbytes / 1e6:.1f} MB"


class _Manager(ocp.CheckpointManager):
  """orbax's CheckpointManager without its own preemption checks.

  It would ask jax's preemption sync point with the step being saved, in `save` and, after an
  asynchronous save, from its finalize thread, while the train loop is already steps further.
  Each call sets the process's counter in jax's sync protocol, so a SIGTERM that comes just
  then makes the processes agree on a point that is already behind, and they never stop (or
  one skips it and the others wait in the save). `bertjax.training.preemption.StopSignal` is the only
  caller of the sync point.
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
               async_save: bool = True):
    """Opens (does not create) `directory`; it is created by the first save.

    Args:
      directory: where step directories go, usually WORKDIR/checkpoints (local or gs://).
      save_every_steps: `save` writes at steps that are multiples of this (unless forced).
      keep: how many of the latest checkpoints to keep (None: all).
      async_save: write in a background thread (False: `save` returns once written).
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
    self._writing: tuple[int, int] | None = None  # (step, bytes) of a save not yet waited for
    self._closed = False
    _install_quiet_failures()
    # Save at multiples of save_every_steps; unlike orbax's default, not also at the first step
    # seen. A preemption is a forced save at the step bertjax.training.preemption agreed on.
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_every_steps),
        max_to_keep=keep, create=False, enable_async_checkpointing=async_save)
    self._manager = _Manager(self.directory, item_handlers=_handlers(), options=options)

  def latest_step(self) -> int | None:
    """The newest saved step, None if there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every kept step, oldest first."""
    return sorted(self._manager.all_steps())

  def due(self, step: int, *, force: bool = False) -> bool:
    """Whether `save(step, ..., force=force)` would write a checkpoint."""
    return (force or step % self._save_every_steps == 0) and step not in self._manager.all_steps()

  def save(self, step: int, state: Any, data_position: Any, *, force: bool = False) -> bool:
    """Saves `state` and `data_position` as `step` when due (or when `force`).

    Args:
      step: the number of train steps done.
      state: pytree of jax.Arrays (sharded or not), e.g. {'step','params','opt_state','rng'}.
      data_position: JSON-serialisable value (dict, None, ...) that resumes the data pipeline.
      force: save even if `step` is not a multiple of `save_every_steps` (end of run,
        preemption). A step that is already saved is never overwritten.
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
    try:
      started = self._manager.save(
          step, force=True,
          args=ocp.args.Composite(**{
              STATE_ITEM: ocp.args.StandardSave(state),
              DATA_ITEM: ocp.args.JsonSave({"data_position": data_position})}))
    except Exception as e:  # pylint: disable=broad-except
      if not is_disk_full(e):
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
    if error is not None and not is_disk_full(error):
      raise error
    raise UserError(message) from error

  def _disk_full(self, step: int, nbytes: int, error: BaseException | None) -> str:
    """Removes the partial save of `step` (process 0; every host waits for it) and returns the
    message of a full disk (`error`: this host's, None if the write failed on another host)."""
    removed = []
    if jax.process_index() == 0:
      for partial in self.directory.glob(f"*{_TEMPORARY}*"):
        gone = _remove_partial(partial)
        removed.append(partial.name if gone else f"{partial.name} (not yet: remove it by hand)")
    _barrier("bertjax:checkpoint_disk_full")
    self._manager.reload()
    kept = self.all_steps()
    free = ""
    if os.path.isdir(str(self.directory)):  # a local disk (not gs://)
      free = f"; {_megabytes(shutil.disk_usage(str(self.directory)).free)} free there"
    cause = "on another host" if error is None else _reason(error)
    if error is not None and is_disk_full(error):
      quota = any("quota" in str(e) or getattr(e, "errno", 0) == errno.EDQUOT or "'122'" in str(e)
                  for e in _chain(error))
      cause = "Disk quota exceeded" if quota else "No space left on device"
    resume = (f"it resumes from step {kept[-1]}" if kept else "with no earlier checkpoint, it "
              "starts over")
    return (
        f"the disk holding {self.directory} is full ({cause}): the checkpoint of step {step} "
        f"(up to {_megabytes(nbytes)}{free}) could not be written. Removed its partial directory "
        f"{', '.join(removed) or '(none left)'}; the checkpoints kept (steps "
        f"{', '.join(map(str, kept)) or 'none'}) are intact. Free at least {_megabytes(nbytes)} "
        "on that disk (other runs' workdirs or checkpoints, for instance) or lower "
        f"--config.train.keep_checkpoints, then rerun the same command: {resume}.")

  def _step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)  # orbax's standard step names: the number alone

  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises UserError unless the saved state at `step` has exactly the keys and shapes of
    `abstract_state`. Reads only metadata (missing or unreadable metadata raises what orbax
    raises: FileNotFoundError, json.JSONDecodeError, ...)."""
    saved = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / STATE_ITEM)
    saved = getattr(saved, "tree", saved)
    if not saved:
      raise FileNotFoundError(f"no arrays named in {self._step_dir(step) / STATE_ITEM}/_METADATA")
    diffs = shape_differences(flat_shapes(saved), flat_shapes(abstract_state))
    if diffs:
      raise UserError(
          f"the checkpoint at step {step} in {self.directory} does not match the model "
          f"({len(diffs)} differences): {_listing(diffs)}. This workdir holds a checkpoint of a "
          "different model; use a new --workdir or the matching config. Nothing was changed.")

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
      if not _is_damaged(e):
        raise
      raise UserError(f"the checkpoint {self._step_dir(step)} does not read back ({_reason(e)}); "
                      "restore another step or move it away.") from e

  def _read(self, abstract_state: Any, step: int) -> tuple[Any, Any]:
    """`restore` of one step through orbax's handlers, without the manager's barriers, so that
    a host whose read fails does not leave the others waiting (they agree afterwards)."""
    step_dir = self._step_dir(step)
    handler = ocp.StandardCheckpointHandler()
    _reading.set()
    try:
      self.check_compatible(abstract_state, step)
      state = handler.restore(step_dir / STATE_ITEM,
                              args=ocp.args.StandardRestore(_with_sharding(abstract_state)))
      position = ocp.JsonCheckpointHandler().restore(step_dir / DATA_ITEM)
    except BaseException:
      gc.collect()  # the failed read's leftover coroutines report now, while _reading is set
      raise
    finally:
      _reading.clear()
      handler.close()
    return state, position["data_position"]

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
        if not _is_damaged(e):
          raise
        reason = _reason(e)
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


@dataclasses.dataclass(frozen=True)
class LoadReport:
  """What `load_params` did, as parameter paths ('bert/layer_0/attention/query/kernel').

  Attributes:
    step_dir: the step directory read.
    loaded: parameters taken from the checkpoint.
    missing: parameters of the target that the checkpoint lacks; they keep the target's
      (freshly initialised) values, e.g. a new task head.
    unused: parameters in the checkpoint that the target has no place for, e.g. the
      pretraining heads when fine-tuning.
    replaced: parameters under `fresh_on_mismatch` whose saved shape differs from the target's
      (e.g. a classifier for another number of labels); they keep the fresh values too.
    resized: vocabulary-axis parameters (VOCAB_ROW_PARAMS, also in `loaded`) saved with another
      number of padding rows (an unpadded checkpoint, or another pad_vocab_to_multiple): their
      vocab_size real rows were loaded and the model's padding rows set to zero.
  """
  step_dir: str
  loaded: list[str]
  missing: list[str]
  unused: list[str]
  replaced: list[str] = dataclasses.field(default_factory=list)
  resized: list[str] = dataclasses.field(default_factory=list)


# Parameters whose first axis is the vocabulary: [padded_vocab_size, ...] in the model, of which
# the first vocab_size rows are the tokens and the rest padding that is never looked up or
# predicted (BertConfig.pad_vocab_to_multiple). Other formats store only the vocab_size rows.
VOCAB_ROW_PARAMS = ("bert/embeddings/word_embeddings/embedding", "masked_lm/output_bias")


def vocab_rows(array: np.ndarray, vocab_size: int, rows: int) -> np.ndarray:
  """The `vocab_size` real rows of a vocabulary-axis parameter, then zero rows up to `rows`.

  Args:
    array: [at least vocab_size, ...], e.g. an unpadded [vocab_size, hidden] embedding table or
      a padded [padded_vocab_size] MLM bias.
    vocab_size: the number of real rows (BertConfig.vocab_size).
    rows: the rows wanted: padded_vocab_size to pad, vocab_size to strip (>= vocab_size).
  Returns:
    [rows, ...] of array's dtype: array[:vocab_size], then rows - vocab_size rows of zeros.
  """
  array = np.asarray(array)
  if array.shape[0] < vocab_size or rows < vocab_size:
    raise ValueError(f"{array.shape[0]} rows -> {rows} rows cannot keep {vocab_size} real rows")
  padding = np.zeros((rows - vocab_size,) + array.shape[1:], array.dtype)
  return np.concatenate([array[:vocab_size], padding])


def _vocab_rows_fit(saved: tuple[int, ...], expected: tuple[int, ...], vocab_size: int) -> bool:
  """Whether a saved vocabulary-axis parameter holds the model's vocab_size real rows, so that
  only its padding differs."""
  return (len(saved) == len(expected) >= 1 and saved[1:] == expected[1:]
          and min(saved[0], expected[0]) >= vocab_size)


def find_step_dir(path: epath.PathLike) -> epath.Path:
  """The step directory that `path` names: a workdir (its latest checkpoint), a checkpoints
  directory (its latest step) or one step directory."""
  # orbax reads only absolute paths: a relative local one (--config.init_checkpoint=CKPT) is
  # taken from the working directory.
  path = epath.Path(path if "://" in str(path) else os.path.abspath(path))
  if not path.exists():
    raise UserError(f"checkpoint path {path} does not exist; set --config.init_checkpoint to a "
                    "workdir, its checkpoints/ directory or one step directory in it.")
  if (path / STATE_ITEM).is_dir():
    return path
  root = path / CHECKPOINTS_DIR if (path / CHECKPOINTS_DIR).is_dir() else path
  latest = ocp.step.latest_step_metadata(root, ocp.step.standard_name_format())
  if latest is None or not (latest.path / STATE_ITEM).is_dir():
    raise UserError(f"no checkpoint found in {path}; give a workdir, its checkpoints/ "
                    "directory or one step directory (one that holds state/).")
  return latest.path


def saved_param_shapes(path: epath.PathLike) -> dict[str, tuple[int, ...]]:
  """{'a/b/c': shape} of the parameters saved at `path` (as load_params finds it), read from the
  checkpoint's metadata without loading any array.

  Raises:
    UserError: no checkpoint at `path`, or no 'params' in it.
  """
  step_dir = find_step_dir(path)
  metadata = ocp.StandardCheckpointHandler().metadata(step_dir / STATE_ITEM)
  saved_tree = getattr(metadata, "tree", metadata)
  if not isinstance(saved_tree, dict) or "params" not in saved_tree:
    raise UserError(f"{step_dir} holds no 'params' in its saved state; init_checkpoint must be a "
                    "bertjax checkpoint (convert other formats first).")
  return {path_str(p): tuple(m.shape)
          for p, m in jax.tree_util.tree_flatten_with_path(saved_tree["params"])[0]}


def load_params(path: epath.PathLike, target_params: Any,
                fresh_on_mismatch: Sequence[str] = (), *,
                vocab_size: int | None = None) -> tuple[Any, LoadReport]:
  """Loads the parameters of a saved train state into `target_params` (e.g. `init_checkpoint`).

  Only the `params` entry of the saved state is read (orbax partial restore): no optimizer
  state, step or rng. Parameters are matched by path; shared paths must have equal shapes, but
  for the padding rows of the vocabulary-axis parameters (VOCAB_ROW_PARAMS) when `vocab_size`
  is given.

  Args:
    path: a workdir, its checkpoints/ directory, or one step directory.
    target_params: nested dict of freshly initialised jax.Arrays (or ShapeDtypeStructs with
      shardings), e.g. a fine-tuning model's "params". Loaded arrays take each target leaf's
      dtype and sharding.
    fresh_on_mismatch: path prefixes (e.g. "sequence_classification/", a task head) whose
      parameters keep their fresh values when the saved shape differs, instead of raising.
    vocab_size: the model's real vocabulary size (BertConfig.vocab_size). When given, a
      vocabulary-axis parameter saved with another number of rows, at least vocab_size (an
      unpadded checkpoint, or another pad_vocab_to_multiple), is adapted: its first vocab_size
      rows are loaded and the target's padding rows are zeros (`LoadReport.resized`). Fewer
      rows than vocab_size (another vocabulary) differ like any other shape.
  Returns:
    (params: the structure of `target_params`, with every parameter the checkpoint has
     replaced by the saved value, LoadReport).
  Raises:
    UserError: no checkpoint at `path`, no 'params' in it, or shared paths with different shapes.
  """
  step_dir = find_step_dir(path)
  saved = saved_param_shapes(step_dir)
  flat_target = traverse_util.flatten_dict(target_params, sep="/")
  expected = {p: tuple(x.shape) for p, x in flat_target.items()}

  resized = sorted(p for p in VOCAB_ROW_PARAMS if vocab_size is not None and p in saved
                   and p in expected and saved[p] != expected[p]
                   and _vocab_rows_fit(saved[p], expected[p], vocab_size))
  differing = sorted(p for p in saved.keys() & expected.keys()
                     if saved[p] != expected[p] and p not in resized)
  replaced = [p for p in differing if p.startswith(tuple(fresh_on_mismatch))]
  mismatched = [f"{p}: {saved[p]} in the checkpoint, {expected[p]} in the model"
                for p in differing if p not in replaced]
  if mismatched:
    raise UserError(
        f"init_checkpoint {step_dir} has parameters whose shapes differ from the model "
        f"({len(mismatched)}): {_listing(mismatched)}. Use a checkpoint of a model of the same "
        "size, or set the model config (vocab, hidden size, layers, ...) to match it.")
  loaded = sorted(saved.keys() & expected.keys() - set(replaced))
  missing = sorted(expected.keys() - saved.keys())
  unused = sorted(saved.keys() - expected.keys())
  report = LoadReport(step_dir=str(step_dir), loaded=loaded, missing=missing, unused=unused,
                      replaced=replaced, resized=resized)
  if not loaded:
    return target_params, report

  def abstract(p):
    x = flat_target[p]
    if p in resized:  # read whole onto one device here, then padded or stripped below
      return jax.ShapeDtypeStruct(saved[p], x.dtype)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

  item = {"params": _with_sharding(traverse_util.unflatten_dict(
      {p: abstract(p) for p in loaded}, sep="/"))}
  restored = ocp.PyTreeCheckpointer().restore(
      step_dir / STATE_ITEM,
      args=ocp.args.PyTreeRestore(item=item,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                                  partial_restore=True))
  flat_restored = traverse_util.flatten_dict(restored["params"], sep="/")
  for p in resized:
    flat_restored[p] = _placed_like(
        vocab_rows(np.asarray(flat_restored[p]), vocab_size, expected[p][0]), flat_target[p])
  params = traverse_util.unflatten_dict(
      {p: flat_restored.get(p, x) for p, x in flat_target.items()}, sep="/")
  return params, report


def _placed_like(value: np.ndarray, target: Any) -> jax.Array:
  """A host array (the same on every host) as a jax.Array with the dtype and sharding of
  `target` (a jax.Array or a ShapeDtypeStruct; the first local device without a sharding)."""
  value = value.astype(target.dtype)
  sharding = getattr(target, "sharding", None) or jax.sharding.SingleDeviceSharding(
      jax.local_devices()[0])
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
