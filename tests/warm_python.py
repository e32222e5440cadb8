"""`python -m MODULE ARGS` (or `python SCRIPT ARGS`) for the tests, forked from a Python that
has already imported bertjax's library (JAX, Flax, Optax, Orbax, matplotlib ...) instead of
started from nothing.

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
has imported, or a command that sets import-time variables itself (PLAIN_MODULES) runs as a plain
subprocess. A tiny pretraining run: 3.8 s forked against 5.0 s started afresh.
"""
import atexit
import gc
import os
import pickle
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
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
# it: run plainly.
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
  module = program[0] == "-m"
  sys.argv = [program[-1], *request["args"]]
  # Where Python looks first: the working directory for -m, the script's directory otherwise.
  sys.path[0] = request["cwd"] if module else os.path.dirname(os.path.abspath(program[-1]))
  np.random.seed()  # a process of its own draws numbers of its own (`random` reseeds itself)
  try:
    if module:
      runpy.run_module(program[1], run_name="__main__", alter_sys=True)
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
  """The server: imports PRELOADED, then forks once per request on socket `fd`."""
  import importlib  # pylint: disable=import-outside-toplevel
  for name in PRELOADED:
    importlib.import_module(name)
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  assert not xla_bridge._backends, "a backend was created while importing"  # pylint: disable=protected-access
  gc.freeze()  # the imported objects: never collected, so the children never copy their pages
  gc.set_threshold(*GC_THRESHOLDS)  # the children's
  sock = socket.socket(fileno=fd)
  _send(sock, {"modules": sorted(sys.modules)})
  while True:
    try:
      request, fds = _receive(sock)
    except EOFError:
      return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      sock.close()
      code = 1
      try:
        code = _child(request, fds)
      finally:
        sys.exit(code)  # the interpreter's own exit: atexit handlers, streams flushed
    for descriptor in fds:
      os.close(descriptor)
    _send(sock, {"pid": pid})
    _, status = os.waitpid(pid, 0)
    _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})


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

  def run(self, program, args, env, cwd, timeout, fds) -> int:
    """The exit status of `program` (["-m", MODULE] or [SCRIPT]) run with `args`, its standard
    streams `fds`; socket.timeout after `timeout` seconds, the command killed."""
    _send(self.sock, {"program": program, "args": list(args), "env": env, "cwd": cwd}, fds)
    pid = _receive(self.sock)[0]["pid"]
    self.sock.settimeout(timeout)
    try:
      return _receive(self.sock)[0]["returncode"]
    except socket.timeout:
      os.kill(pid, signal.SIGKILL)
      self.sock.settimeout(None)
      _receive(self.sock)
      raise
    finally:
      self.sock.settimeout(None)

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
    while len(_SERVERS) >= MAX_SERVERS:
      _SERVERS.pop(next(iter(_SERVERS))).close()
    _SERVERS[key] = _Server(env)
  else:
    _SEEN.add(key)
    return None
  return _SERVERS[key]


def _text(data: bytes) -> str:
  """What subprocess's text mode makes of `data`: decoded, with universal newlines."""
  return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run(command: list[str], *, env=None, cwd=None, timeout=None, input=None,  # pylint: disable=redefined-builtin
        check=False) -> subprocess.CompletedProcess:
  """subprocess.run(command, capture_output=True, text=True, ...): the same result, forked from
  a warm server where `command` is [sys.executable, "-m", MODULE, ARGS...] or [sys.executable,
  SCRIPT.py, ARGS...] and nothing in its environment or module tells the two apart."""
  env = dict(os.environ if env is None else env)
  cwd = os.path.abspath(cwd or os.getcwd())
  program = (command[1:3] if command[1] == "-m" else command[1:2]
             if command[1].endswith(".py") else None)
  warm = (command[0] == sys.executable and program is not None
          and program[-1] not in PLAIN_MODULES)
  server = _server(env) if warm else None
  if server is None or program[-1] in server.modules:
    return subprocess.run(command, env=env, cwd=cwd, timeout=timeout, input=input,
                          capture_output=True, text=True, check=check)
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
       tempfile.TemporaryFile() as stdin:
    if input is not None:
      stdin.write(input.encode())
      stdin.seek(0)
    try:
      code = server.run(program, command[1 + len(program):], env, cwd, timeout,
                        [stdin.fileno(), out.fileno(), err.fileno()])
    except socket.timeout:
      raise subprocess.TimeoutExpired(command, timeout) from None
    out.seek(0)
    err.seek(0)
    result = subprocess.CompletedProcess(command, code, _text(out.read()), _text(err.read()))
  if check:
    result.check_returncode()
  return result
