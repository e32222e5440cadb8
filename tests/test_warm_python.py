"""warm_python.run gives what subprocess.run gives for the same command: exit status, output,
the working directory, arguments and device count, an exception's traceback, and a timeout's
TimeoutExpired with the command killed. The commands run a script in the suite's environment
(cpu_env), so they share the server of the worker's other tests."""
import subprocess
import sys
import textwrap

import pytest

from conftest import cpu_env
import warm_python

SCRIPT = textwrap.dedent("""\
    import os, sys
    import jax
    print(jax.device_count(), os.getcwd(), sys.argv, "bertjax.main" in sys.modules)
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["raise"]:
      raise ValueError("as asked")
    if sys.argv[1:] == ["sleep"]:
      import time
      time.sleep(60)
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
    """)


@pytest.fixture(scope="module")
def script(tmp_path_factory):
  path = tmp_path_factory.mktemp("scripts") / "warm_check.py"
  path.write_text(SCRIPT)
  return str(path)


@pytest.mark.parametrize("args", [["3", "b c"], ["raise"]])
def test_a_warm_command_is_a_plain_one(script, tmp_path, args):
  command = [sys.executable, script, *args]
  plain = subprocess.run(command, env=cpu_env(2), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=False)
  for num_devices in (2, 2, 4):  # the second command of an environment starts its server
    warm = warm_python.run(command, env=cpu_env(num_devices), cwd=tmp_path, timeout=120)
    assert warm.returncode == plain.returncode
    assert warm.stdout == plain.stdout.replace("2 ", f"{num_devices} ", 1)
    # (a traceback: less runpy's own frames, which `python -m` shows)
    assert warm.stderr == "".join(line for line in plain.stderr.splitlines(keepends=True)
                                  if "<frozen runpy>" not in line)
  # The last ones were forked from a server with bertjax's library and not its commands, which
  # runpy runs afresh as __main__ (a module imported before would run twice, with a warning).
  [server] = [s for s in warm_python._SERVERS.values()  # pylint: disable=protected-access
              if s.env_key == warm_python.env_key(cpu_env(2))]
  assert "bertjax.tasks" in server.modules and "bertjax.main" not in server.modules
  if args == ["raise"]:
    assert "ValueError: as asked" in warm.stderr and warm.returncode == 1


def test_a_warm_command_past_its_timeout_is_killed(script, tmp_path):
  for _ in range(2):  # the second starts the server, if no test started it before
    warm_python.run([sys.executable, script], env=cpu_env(1), cwd=tmp_path)
  with pytest.raises(subprocess.TimeoutExpired):
    warm_python.run([sys.executable, script, "sleep"], env=cpu_env(1), cwd=tmp_path, timeout=2)
  out = warm_python.run([sys.executable, script], env=cpu_env(1), cwd=tmp_path)  # it goes on
  assert out.returncode == 0 and out.stdout.startswith("1 "), out.stderr


def test_warm_processes_run_side_by_side_and_take_signals(script, tmp_path):
  """warm_python.popen, as a job's processes are started: several at a time from one server,
  each with its own output and exit status, a signal delivered to the command's own process,
  and a kill seen as -SIGKILL; what a plain Popen of the same command gives."""
  for _ in range(2):  # the second starts the server, if no test started it before
    warm_python.run([sys.executable, script], env=cpu_env(1), cwd=tmp_path)
  command = [sys.executable, script]
  sleeping = warm_python.popen(command + ["sleep"], env=cpu_env(1), cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  assert isinstance(sleeping, warm_python._WarmProcess)  # pylint: disable=protected-access
  ends = [warm_python.popen(command + [code], env=cpu_env(1), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for code in ("3", "4")]
  plain = subprocess.run(command + ["3"], env=cpu_env(1), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
  outputs = [p.communicate(timeout=120) for p in ends]
  assert [p.returncode for p in ends] == [3, 4]
  assert outputs[0] == (plain.stdout, plain.stderr)
  assert outputs[1][0] == plain.stdout.replace("'3'", "'4'")
  assert sleeping.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    sleeping.wait(timeout=0.2)
  sleeping.kill()
  assert sleeping.wait(timeout=60) == -9 and sleeping.poll() == -9
  terminated = warm_python.popen(command + ["sleep"], env=cpu_env(1), cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  terminated.terminate()
  assert terminated.wait(timeout=60) == -15


def test_a_warm_dash_c_command_is_a_plain_one(tmp_path):
  """`python -c CODE ARGS`: its arguments, __main__, first path entry, standard input and a
  traceback's frames as a plain process has them."""
  code = textwrap.dedent("""\
      import sys
      import __main__
      print(sys.argv, __name__, repr(sys.path[0]), sorted(k for k in vars(__main__)
                                                        if not k.startswith("__")))
      print(sys.stdin.read())
      if sys.argv[1:] == ["raise"]:
        raise ValueError("as asked")
      """)
  for args in ([], ["raise"]):
    command = [sys.executable, "-c", code, *args]
    plain = subprocess.run(command, env=cpu_env(1), cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, check=False, input="typed\n")
    for _ in range(2):  # the second, if no test started the server before
      warm = warm_python.run(command, env=cpu_env(1), cwd=tmp_path, timeout=120, input="typed\n")
    assert (warm.returncode, warm.stdout, warm.stderr) == (
        plain.returncode, plain.stdout, plain.stderr)
