"""One run at a time on a directory: DIR/.lock, taken atomically, with a heartbeat.

It guards a run's WORKDIR (`bertjax.workdir.held`) and a DATA that `bertjax.data.prepare` is
writing. It imports no jax, so data preparation does not either.

The lock is the file DIR/.lock, created atomically (a hard link to a complete temporary file;
O_EXCL where the filesystem has no hard links) and holding JSON: the owner's host, pid, the start
time of that pid (a reused pid is not taken for the owner), where that pid is meaningful (host,
boot and pid namespace), when the run started, its command and, on a multi-host job, the job's
coordinator and process count. While the run lives, a thread touches the file every
HEARTBEAT_SECONDS (also while data is prepared, when no step is logged).

A lock is stale, and the next run takes it over with a line saying whose it was, when
  * its owner ran here (same host, boot and pid namespace) and that process is gone (kill -9, a
    crash): decided at once from the pid, whatever the heartbeat;
  * its owner ran elsewhere (another host of a shared filesystem, another container) and its
    heartbeat is older than STALE_SECONDS: a host that died takes its heartbeat with it. The
    age compares this host's clock with the file's mtime (set by the file server), so clocks may
    disagree by minutes without harm.
Otherwise the run is refused with the owner in the message, which says to remove the file if
that run is known to be dead (e.g. its host is gone and STALE_SECONDS is too long to wait).

A run removes its lock when it ends, on an error too. Two runs that find the same stale lock at
the same instant are told apart by removing it only while its bytes are still the stale ones;
the window left (between that check and the removal) is microseconds.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import threading
import time
import uuid

from bertjax.errors import UserError

LOCK_FILE = ".lock"  # DIR/.lock: the run that holds DIR
HEARTBEAT_SECONDS = 30.0  # how often a run touches its lock
STALE_SECONDS = 600.0  # a lock from elsewhere untouched this long belongs to a dead run


def _where() -> str:
  """Where a pid means this process: host, boot and pid namespace ('' where /proc lacks them)."""
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
    namespace = os.readlink("/proc/self/ns/pid")
  except OSError:
    return ""
  return f"{socket.gethostname()}/{boot}/{namespace}"


def _process_start(pid: int) -> str | None:
  """The start time of process `pid` (clock ticks since boot), None if it is gone or a zombie
  or /proc cannot tell."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rpartition(")")[2].split()
  except OSError:
    return None
  return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int, start: str | None) -> bool:
  """Whether process `pid` of this host (and pid namespace) lives and is the one that started
  at `start` (None: not recorded)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # it exists, as another user
  if os.path.isdir("/proc/self"):
    now = _process_start(pid)
    return now is not None and (start is None or now == start)
  return True


def _owner_record(job: dict | None) -> dict:
  """The lock's contents for this process (`job`: its multi-host job, or None)."""
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "pid_start": _process_start(os.getpid()), "where": _where(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": sys.argv,
          "job": job, "token": uuid.uuid4().hex}


def _describe(owner: dict) -> str:
  """'pid 12 on host h (started ...)', with the job of a multi-host run."""
  text = f"pid {owner.get('pid')} on host {owner.get('host')} (started {owner.get('started')})"
  job = owner.get("job")
  if job:
    text += (f", process 0 of a {job.get('processes')}-process job with coordinator "
             f"{job.get('coordinator')}")
  return text


def check_directory(workdir: str, flag: str = "--workdir") -> bool:
  """Creates `workdir` if needed; UserError if it is a file, lies under one or cannot be
  created (naming `flag`, the flag that gave it). Returns whether it was created."""
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"{flag}={workdir} is a file, not a directory; give a directory (a new "
                    "one is created) or move the file away.")
  if os.path.isdir(workdir):
    return False
  parent = os.path.dirname(workdir)
  while parent and not os.path.lexists(parent):
    parent = os.path.dirname(parent)
  if parent and not os.path.isdir(parent):
    raise UserError(f"{flag}={workdir} cannot be created: {parent} is a file, not a "
                    f"directory; give a {flag} elsewhere or move the file away.")
  try:
    os.makedirs(workdir)
  except FileExistsError:
    return False
  except OSError as e:
    raise UserError(f"{flag}={workdir} cannot be created ({e.strerror}: {e.filename}); give "
                    f"a {flag} in a directory you can write to.") from None
  return True


def _not_writable(workdir: str, error: OSError, flag: str) -> UserError:
  return UserError(f"the {flag[2:]} {workdir} is not writable ({error.strerror}); make it "
                   f"writable (e.g. chmod u+w {workdir}) or give another {flag}.")


def _create(path: str, text: str) -> bool:
  """Writes `text` to a new file `path` at once; False if `path` exists."""
  temporary = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
  with open(temporary, "w") as f:
    f.write(text)
  try:
    os.link(temporary, path)
    return True
  except FileExistsError:
    return False
  except OSError as e:
    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
      raise
  finally:
    os.remove(temporary)
  try:  # no hard links here: O_EXCL, whose file is empty for a moment
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w") as f:
    f.write(text)
  return True


def _read(path: str) -> tuple[bytes, float] | None:
  """(the lock's bytes, seconds since it was last touched), None if there is none."""
  try:
    with open(path, "rb") as f:
      data = f.read()
    return data, time.time() - os.stat(path).st_mtime
  except FileNotFoundError:
    return None


def _stale_reason(data: bytes, age: float) -> str | None:
  """Why a lock with these bytes, last touched `age` seconds ago, is stale; None if it is held."""
  try:
    owner = json.loads(data)
    pid = int(owner["pid"])
  except (ValueError, TypeError, KeyError):
    owner, pid = None, None
  if owner is not None and owner.get("where") and owner["where"] == _where():
    return None if _alive(pid, owner.get("pid_start")) else f"{_describe(owner)}, which is gone"
  if age > STALE_SECONDS:
    return f"{_describe(owner) if owner else 'an unreadable lock'}, untouched for {age:.0f} s"
  return None


def _refusal(workdir: str, path: str, data: bytes, age: float, flag: str) -> UserError:
  """The message of a run refused by a live lock."""
  try:
    owner = json.loads(data)
    int(owner["pid"])
  except (ValueError, TypeError, KeyError):
    return UserError(f"{path} exists but cannot be read as a bertjax lock; another run may be "
                     f"starting on {workdir}. If none is, remove {path} and rerun.")
  if owner.get("where") == _where():
    return UserError(f"{workdir} is in use by another run: {_describe(owner)}. Wait for it to "
                     "end or stop it (a run that died is taken over by the next one), or give "
                     f"another {flag}.")
  return UserError(f"{workdir} is in use by another run: {_describe(owner)}, last heartbeat "
                   f"{age:.0f} s ago. If that run is dead, remove {path} and rerun (a lock "
                   f"untouched for {STALE_SECONDS:.0f} s is taken over by itself); otherwise "
                   f"wait for it or give another {flag}.")


class Lock:
  """WORKDIR/.lock held by this process (see the module docs); `release` when done. It guards
  any directory one run at a time writes (bertjax.data.prepare takes DATA/.lock); `flag` is the
  flag that gave the directory, named in messages."""

  def __init__(self, workdir: str, *, created: bool, flag: str = "--workdir",
               job: dict | None = None):
    self.workdir, self.flag = workdir, flag
    self.path = os.path.join(workdir, LOCK_FILE)
    self._created = created  # the workdir, by this run: removed again if left empty
    self._record = _owner_record(job)
    self._text = json.dumps(self._record, indent=2) + "\n"
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  @classmethod
  def take(cls, workdir: str, flag: str = "--workdir", job: dict | None = None) -> Lock:
    """Creates the workdir if needed and takes its lock, taking over a stale one.

    Raises:
      UserError: the workdir is a file, cannot be created or written, or another run holds it.
    """
    lock = cls(workdir, created=check_directory(workdir, flag), job=job, flag=flag)
    try:
      lock._acquire()
    except BaseException:
      lock._remove_workdir_if_new()
      raise
    lock._thread = threading.Thread(target=lock._heartbeat, name="bertjax workdir lock",
                                    daemon=True)
    lock._thread.start()
    return lock

  def _acquire(self) -> None:
    for _ in range(5):
      try:
        if _create(self.path, self._text):
          return
      except OSError as e:
        raise _not_writable(self.workdir, e, self.flag) from None
      found = _read(self.path)
      if found is None:
        continue  # released meanwhile
      data, age = found
      reason = _stale_reason(data, age)
      if reason is None:
        raise _refusal(self.workdir, self.path, data, age, self.flag)
      again = _read(self.path)
      if again is not None and again[0] == data:  # still the stale one: ours to remove
        print(f"bertjax: taking over {self.path} from {reason}.", file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
          os.remove(self.path)
    raise UserError(f"could not take {self.path}: other runs are starting on {self.workdir} at "
                    "the same time; start one run per workdir.")

  def _ours(self) -> bool:
    found = _read(self.path)
    return found is not None and found[0] == self._text.encode()

  def _heartbeat(self) -> None:
    """Touches the lock every HEARTBEAT_SECONDS until released; stops, with a warning, if the
    lock is no longer this run's (removed by hand, or taken by another run)."""
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        if not self._ours():
          raise FileNotFoundError(self.path)
        os.utime(self.path)
      except OSError:
        print(f"bertjax: warning: {self.path} was removed or replaced while this run holds "
              f"{self.workdir}; another run may now write to it.", file=sys.stderr)
        return

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if it is still this run's (and the workdir too
    if this run created it and left it empty)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with contextlib.suppress(OSError):
      if self._ours():
        os.remove(self.path)
    self._remove_workdir_if_new()

  def _remove_workdir_if_new(self) -> None:
    if self._created:
      with contextlib.suppress(OSError):
        os.rmdir(self.workdir)  # only if empty
