"""Checkpoint faults: orbax's errors that are a full disk or a damaged checkpoint, and their echoes.

`bertjax.training.checkpoint.Checkpoints` reports each of these as one line of its own (a
`UserError` or a warning) instead of orbax's tracebacks; this module tells them apart and
cleans up after them:

* A full disk (an OSError's ENOSPC / EDQUOT, or tensorstore's "[os_error_code='28']"):
  `is_disk_full`; `remove_partial_saves` deletes the `<step>.orbax-checkpoint-tmp` directory
  of the failed save and `disk_full_message` says which disk is full and what to free.
* A damaged checkpoint (a truncated or missing file, missing or garbled metadata): `is_damaged`,
  asked only of errors raised while reading one. A network or memory failure is not damage, so
  that a good checkpoint is never moved aside for it.
* The echoes: orbax's and tensorstore's threads log each failed write or read of one failure
  with a traceback, hundreds of lines for one full disk. `install_quiet_failures` installs, once
  per process, a filter that keeps those off stderr; `reading()` marks the reads during which
  damage is expected.
"""
from __future__ import annotations

import contextlib
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
from typing import Iterator, Sequence

from etils import epath

# A full disk, as the OS (OSError) or tensorstore ("... [os_error_code='28']") words it.
_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|os_error_code='(28|122)'")
# tensorstore's words for files that are missing, truncated or garbled (not for a network or
# memory failure, which must not get a good checkpoint moved aside).
_DAMAGED = re.compile(r"\b(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|FAILED_PRECONDITION)\b")
# orbax writes a step to STEP.orbax-checkpoint-tmp*, then renames it to STEP.
TEMPORARY_SUFFIX = ".orbax-checkpoint-tmp"
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


def is_damaged(error: BaseException) -> bool:
  """Whether `error`, raised while reading a checkpoint, says that its files are missing,
  truncated or garbled."""
  errors = list(_chain(error))
  if any(isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e) for e in errors):
    return False
  return any(isinstance(e, (FileNotFoundError, json.JSONDecodeError)) or _DAMAGED.search(str(e))
             for e in errors)


def reason(error: BaseException) -> str:
  """The first line of the innermost cause of `error`, for a one-line message."""
  root = list(_chain(error))[-1]
  line = (str(root).strip().splitlines() or [type(root).__name__])[0].rstrip(".")
  return line if len(line) <= 300 else line[:297] + "..."


@contextlib.contextmanager
def reading() -> Iterator[None]:
  """Marks a read of a checkpoint that may be damaged: while it lasts, orbax's and tensorstore's
  reports of damaged files are noise (`install_quiet_failures`). A read that fails collects the
  garbage before it ends, so that its leftover coroutines report while still marked."""
  _reading.set()
  try:
    yield
  except BaseException:
    gc.collect()  # the failed read's leftover coroutines report now, while _reading is set
    raise
  finally:
    _reading.clear()


def _is_noise(text: str) -> bool:
  """Whether a log line, stray traceback or unraisable exception of orbax / tensorstore / asyncio
  repeats a failure that bertjax reports as one message of its own: a write to a full disk, or a
  read of a damaged checkpoint (`Checkpoints.restore`, `Checkpoints.resume`)."""
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


def install_quiet_failures() -> None:
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


def remove_partial_saves(directory: epath.Path) -> list[str]:
  """Removes the temporary directories (`<step>.orbax-checkpoint-tmp*`) of failed saves in
  `directory`. Call it on one process only.

  Returns:
    their names, each followed by " (not yet: remove it by hand)" where it would not go.
  """
  removed = []
  for partial in directory.glob(f"*{TEMPORARY_SUFFIX}*"):
    gone = _remove_partial(partial)
    removed.append(partial.name if gone else f"{partial.name} (not yet: remove it by hand)")
  return removed


def _megabytes(nbytes: float) -> str:
  return f"{nbytes / 1e6:.1f} MB"


def disk_full_message(directory: epath.Path, step: int, nbytes: int,
                      error: BaseException | None, removed: Sequence[str],
                      kept: Sequence[int]) -> str:
  """The one message of a save that filled the disk.

  Args:
    directory: the checkpoints directory (local or gs://).
    step: the step whose save failed.
    nbytes: the bytes of the state it was writing.
    error: this host's error; None if the write failed on another host.
    removed: what `remove_partial_saves` removed (empty on the processes that did not remove).
    kept: the steps still saved, oldest first.
  Returns:
    which disk is full and why, what was removed and kept, what to free, and where the rerun
    resumes.
  """
  free = ""
  if os.path.isdir(str(directory)):  # a local disk (not gs://)
    free = f"; {_megabytes(shutil.disk_usage(str(directory)).free)} free there"
  cause = "on another host" if error is None else reason(error)
  if error is not None and is_disk_full(error):
    quota = any("quota" in str(e) or getattr(e, "errno", 0) == errno.EDQUOT or "'122'" in str(e)
                for e in _chain(error))
    cause = "Disk quota exceeded" if quota else "No space left on device"
  resume = (f"it resumes from step {kept[-1]}" if kept else "with no earlier checkpoint, it "
            "starts over")
  return (
      f"the disk holding {directory} is full ({cause}): the checkpoint of step {step} "
      f"(up to {_megabytes(nbytes)}{free}) could not be written. Removed its partial directory "
      f"{', '.join(removed) or '(none left)'}; the checkpoints kept (steps "
      f"{', '.join(map(str, kept)) or 'none'}) are intact. Free at least {_megabytes(nbytes)} "
      "on that disk (other runs' workdirs or checkpoints, for instance) or lower "
      f"--config.train.keep_checkpoints, then rerun the same command: {resume}.")
