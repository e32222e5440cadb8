"""`python -m MODULE ARGS` (or `python SCRIPT ARGS`, `python -c CODE ARGS`) for the tests, forked
from a Python that has already imported bertjax's library (JAX, Flax, Optax, Orbax, matplotlib
...) instead of started from nothing.

The suite starts about a hundred `python -m bertjax.main` (`bertjax.data.prepare`,
`bertjax.convert`, tests/spiking_main.py ...) processes; each spent about 2 CPU seconds
importing before its first line of work. Here a pytest worker starts a server process that
imports those libraries once (without creating a JAX backend: XLA's flags and the device count
are read later, by each command) and freezes them out of the garbage collector (so the children
do not copy their pages), then forks once per command. The forked child is a process of its
own: it takes the command's environment, working directory, standard streams and arguments,
runs the module as `__main__` (runpy, as `python -m` does), and exits through the interpreter's
own exit with the command's status, which the server reports back. Output, exit status and
files written are those of a fresh process (tests/test_warm_python.py compares them); an
uncaught exception's traceback lacks runpy's two frames.

A server serves one environment less LATE_VARIABLES (the variables read after its imports): a
command whose environment differs elsewhere (JAX_PLATFORMS, PYTHONPATH, ...) goes to another
server, started on that environment's second command; a command run once, a module the server
has imported, or a command that sets import-time variables itself (PLAIN_MODULES, unless its
environment holds them already) runs as a plain subprocess. A tiny pretraining run: 3.8 s forked
against 5.0 s started afresh.

`run` is subprocess.run; `popen` is subprocess.Popen, for the commands a test signals, kills or
runs side by side as one job's processes (jax.distributed's variables are late ones): a server
runs several commands at a time, and reports each one's pid as it starts and its status as it
ends. test_multihost's 17 processes: 118 CPU-s plain, 93 forked.
"""
import atexit
import gc
import os
import pickle
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

# Libraries imported once in the server, before any fork: bertjax's tasks (and with them JAX,
# Flax, Optax, Orbax), and what a run imports when it first needs it (the data loader, the
# TensorBoard writer, matplotlib for curves.png). No command is among them: runpy runs a
# command's module afresh as __main__.
PRELOADED = ("bertjax.tasks", "bertjax.training.train", "grain", "tensorboardX",
             "matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.PngImagePlugin")
# Environment variables that may differ between the server and a command: read after the
# server's imports (XLA's flags when the backend is created, jax.distributed's when it starts),
# or set by a library the test process imported, to its default (CRC32C_SW_MODE) or for a
# library the server does not import (torch).
LATE_VARIABLES = ("XLA_FLAGS", "PYTEST_CURRENT_TEST", "JAX_COORDINATOR_ADDRESS",
                  "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "CRC32C_SW_MODE",
                  "TORCHINDUCTOR_CACHE_DIR")
# The garbage collector's thresholds of the commands forked, and of conftest's pytest workers:
# the young generation collected every 50,000 allocations instead of 700 (a tiny run traces and
# lowers its model's steps: millions of short-lived objects). A command's own process would keep
# Python's defaults; what it computes is the same.
GC_THRESHOLDS = (50_000, 20, 10)
# Commands that set a variable JAX reads while it is imported (JAX_PLATFORMS) before they import
# it: run plainly, unless their environment holds its value already (JAX_PLATFORMS=cpu).
PLAIN_MODULES = ("bertjax.tools.audit",)


def _receive(sock: socket.socket):
  """(object, file descriptors) of one message: 4-byte length, pickle; fds as ancillary data."""
  header, fds, _, _ = socket.recv_fds(sock, 4, 8)
  if not header:
    raise EOFError
  size = int.from_bytes(header, "big")
  data = b""
  while len(data) < size:
    chunk = sock.recv(size - len(data))
    if not chunk:
      raise EOFError
    data += chunk
  return pickle.loads(data), fds


def _send(sock: socket.socket, obj, fds=()):
  data = pickle.dumps(obj)
  socket.send_fds(sock, [len(data).to_bytes(4, "big")], list(fds))
  sock.sendall(data)


def _child(request, fds) -> int:
  """In the forked process: become the command, run it, return its exit status."""
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  program = request["program"]
  sys.argv = ["-c" if program[0] == "-c" else program[-1], *request["args"]]
  # Where Python looks first: the working directory for -m, "" (it too) for -c, the script's
  # directory otherwise.
  sys.path[0] = {"-m": request["cwd"], "-c": ""}.get(
      program[0], os.path.dirname(os.path.abspath(program[-1])))
  np.random.seed()  # a process of its own draws numbers of its own (`random` reseeds itself)
  try:
    if program[0] == "-m":
      runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    elif program[0] == "-c":
      sys.modules["__main__"].__dict__.clear()  # the code runs in a __main__ of its own
      sys.modules["__main__"].__dict__.update(__name__="__main__", __doc__=None, __spec__=None,
                                              __package__=None, __builtins__=__builtins__)
      code = compile(program[1], "<string>", "exec")
      exec(code, sys.modules["__main__"].__dict__)  # pylint: disable=exec-used
    else:
      runpy.run_path(program[0], run_name="__main__")
    return 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)
    return 1
  except BaseException as e:  # pylint: disable=broad-except
    # As Python prints an exception that ends a program, from the program's first frame on
    # (`python -m` would also show two frames of runpy's own).
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
      tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)
    return 1


def serve(fd: int):
  """The server: imports PRELOADED, then forks once per request on socket `fd`, several
  commands at a time: each child's pid is sent when it starts, its exit status when it ends
  (a SIGCHLD wakes the loop)."""
  import importlib  # pylint: disable=import-outside-toplevel
  for name in PRELOADED:
    importlib.import_module(name)
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  assert not xla_bridge._backends, "a backend was created while importing"  # pylint: disable=protected-access
  gc.freeze()  # the imported objects: never collected, so the children never copy their pages
  gc.set_threshold(*GC_THRESHOLDS)  # the children's
  sock = socket.socket(fileno=fd)
  wake_read, wake_write = os.pipe()
  os.set_blocking(wake_write, False)
  signal.set_wakeup_fd(wake_write)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  _send(sock, {"modules": sorted(sys.modules)})
  children = {}  # pid -> the request's id
  while True:
    ready = select.select([sock, wake_read], [], [])[0]
    if wake_read in ready:
      os.read(wake_read, 4096)
    while children:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        break
      _send(sock, {"id": children.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})
    if sock not in ready:
      continue
    try:
      request, fds = _receive(sock)
    except EOFError:
      return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      sock.close()
      signal.set_wakeup_fd(-1)
      signal.signal(signal.SIGCHLD, signal.SIG_DFL)
      os.close(wake_read)
      os.close(wake_write)
      code = 1
      try:
        code = _child(request, fds)
      finally:
        sys.exit(code)  # the interpreter's own exit: atexit handlers, streams flushed
    for descriptor in fds:
      os.close(descriptor)
    children[pid] = request["id"]
    _send(sock, {"id": request["id"], "pid": pid})


class _Server:
  """A server started with environment `env`, on a socket of this process."""

  def __init__(self, env: dict[str, str]):
    self.env_key = env_key(env)
    ours, theirs = socket.socketpair()
    self.process = subprocess.Popen(
        [sys.executable, "-c", "import importlib.util as u; "
         f"s = u.spec_from_file_location('warm_python', {__file__!r}); "
         f"m = u.module_from_spec(s); s.loader.exec_module(m); m.serve({theirs.fileno()})"],
        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
    theirs.close()
    self.sock = ours
    self.modules = set(_receive(self.sock)[0]["modules"])
    self.requests = 0
    self.replies: dict[int, dict] = {}  # request id -> {"pid": ..., "returncode": ...}

  def start(self, program, args, env, cwd, fds) -> tuple[int, int]:
    """(request id, pid) of `program` (["-m", MODULE], ["-c", CODE] or [SCRIPT]) started with
    `args`, its standard streams `fds`."""
    self.requests += 1
    _send(self.sock, {"id": self.requests, "program": program, "args": list(args), "env": env,
                      "cwd": cwd}, fds)
    while "pid" not in self.replies.get(self.requests, {}):
      self._read(None)
    return self.requests, self.replies[self.requests].pop("pid")

  def _read(self, timeout) -> None:
    """One reply of the server into `replies`; socket.timeout after `timeout` seconds (0: only
    if one is waiting)."""
    if not select.select([self.sock], [], [], timeout)[0]:
      raise socket.timeout
    reply = _receive(self.sock)[0]  # (a reply is sent whole: read it all)
    self.replies.setdefault(reply.pop("id"), {}).update(reply)

  def returncode(self, request: int, timeout=None) -> int | None:
    """The exit status of `request`; None if it has not ended within `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while "returncode" not in self.replies.get(request, {}):
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      try:
        self._read(left)
      except socket.timeout:
        return None
    return self.replies.pop(request)["returncode"]  # (asked once: the caller keeps it)

  def busy(self) -> bool:
    """Whether a command it started has not been seen ending."""
    return any("returncode" not in reply for reply in self.replies.values())

  def close(self):
    self.sock.close()
    self.process.wait(timeout=60)


# This process's servers, by environment (less LATE_VARIABLES), the one used last at the end; a
# server is started for the second command of an environment (a command run once gains
# nothing), and the one used longest ago is closed beyond MAX_SERVERS (each holds ~450 MB).
MAX_SERVERS = 2
_SERVERS: dict[tuple, _Server] = {}
_SEEN: set[tuple] = set()


@atexit.register
def _close_servers():
  while _SERVERS:
    _SERVERS.pop(next(iter(_SERVERS))).close()


def env_key(env: dict[str, str]) -> tuple:
  """What the commands of one server have in common: `env` less LATE_VARIABLES."""
  return tuple(sorted((k, v) for k, v in env.items() if k not in LATE_VARIABLES))


def _server(env: dict[str, str]) -> _Server | None:
  key = env_key(env)
  if key in _SERVERS:
    _SERVERS[key] = _SERVERS.pop(key)  # the last used
  elif key in _SEEN:
    idle = [k for k in _SERVERS if not _SERVERS[k].busy()]  # the one used longest ago first
    for old in idle[:max(0, len(_SERVERS) + 1 - MAX_SERVERS)]:
      _SERVERS.pop(old).close()
    _SERVERS[key] = _Server(env)
  else:
    _SEEN.add(key)
    return None
  return _SERVERS[key]


def _warm(command: list[str], env: dict[str, str]) -> tuple[list[str] | None, _Server | None]:
  """(the program, ["-m", MODULE], ["-c", CODE] or [SCRIPT], the server to fork it from) where
  `command` is [sys.executable, *program, ARGS...] and nothing in its environment or module
  tells a forked process from a plain one; else (None, None)."""
  program = (command[1:3] if command[1] in ("-m", "-c") else command[1:2]
             if command[1].endswith(".py") else None)
  if (command[0] != sys.executable or program is None
      or program[-1] in PLAIN_MODULES and env.get("JAX_PLATFORMS") != "cpu"):
    return None, None
  server = _server(env)
  if server is None or program[-1] in server.modules:
    return None, None
  return program, server


def _text(data: bytes) -> str:
  """What subprocess's text mode makes of `data`: decoded, with universal newlines."""
  return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run(command: list[str], *, env=None, cwd=None, timeout=None, input=None,  # pylint: disable=redefined-builtin
        check=False) -> subprocess.CompletedProcess:
  """subprocess.run(command, capture_output=True, text=True, ...): the same result, forked from
  a warm server where `_warm` finds one (a command past its timeout killed, as subprocess.run
  does)."""
  env = dict(os.environ if env is None else env)
  cwd = os.path.abspath(cwd or os.getcwd())
  program, server = _warm(command, env)
  if server is None:
    return subprocess.run(command, env=env, cwd=cwd, timeout=timeout, input=input,
                          capture_output=True, text=True, check=check)
  process = _WarmProcess(command, program, server, env, cwd, subprocess.PIPE, subprocess.PIPE,
                         True, input)
  try:
    out, err = process.communicate(timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    raise
  result = subprocess.CompletedProcess(command, process.returncode, out, err)
  if check:
    result.check_returncode()
  return result


class _WarmProcess:
  """What subprocess.Popen gives for a command forked from a warm server: pid, returncode,
  poll, wait, communicate, send_signal, terminate and kill. An output given as PIPE goes to a
  file, read by communicate once the command has ended; `input` (text) is its standard input,
  else /dev/null."""

  def __init__(self, command, program, server, env, cwd, stdout, stderr, text,
               input=None):  # pylint: disable=redefined-builtin
    self.args, self.returncode, self._server, self._text = command, None, server, text
    self._pipes = [tempfile.TemporaryFile() if stream == subprocess.PIPE else None
                   for stream in (stdout, stderr)]
    with open(os.devnull, "r+b") as devnull:
      def fd(stream, default, pipe):
        if pipe is not None:
          return pipe.fileno()
        if stream is None:
          return default
        return devnull.fileno() if stream == subprocess.DEVNULL else (
            stream if isinstance(stream, int) else stream.fileno())
      out = fd(stdout, 1, self._pipes[0])
      err = out if stderr == subprocess.STDOUT else fd(stderr, 2, self._pipes[1])
      with tempfile.TemporaryFile() as stdin:
        if input is not None:
          stdin.write(input.encode())
          stdin.seek(0)
        self._request, self.pid = server.start(
            program, command[1 + len(program):], env, cwd,
            [devnull.fileno() if input is None else stdin.fileno(), out, err])

  def poll(self) -> int | None:
    if self.returncode is None:
      self.returncode = self._server.returncode(self._request, 0)
    return self.returncode

  def wait(self, timeout=None) -> int:
    if self.returncode is None:
      self.returncode = self._server.returncode(self._request, timeout)
      if self.returncode is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout=None):
    """(stdout, stderr): what went to each PIPE (text if `text`), else None."""
    self.wait(timeout)
    outputs = []
    for pipe in self._pipes:
      if pipe is not None:
        pipe.seek(0)
        data = pipe.read()
        outputs.append(_text(data) if self._text else data)
      else:
        outputs.append(None)
    return tuple(outputs)

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def popen(command: list[str], *, env=None, cwd=None, stdout=None, stderr=None, text=False):
  """subprocess.Popen(command, env=, cwd=, stdout=, stderr=, text=): the command started where
  `run` would fork it (several at a time: a job of several processes), else a plain Popen."""
  env = dict(os.environ if env is None else env)
  cwd = os.path.abspath(cwd or os.getcwd())
  program, server = _warm(command, env)
  if server is None:
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text)
  return _WarmProcess(command, program, server, env, cwd, stdout, stderr, text)
