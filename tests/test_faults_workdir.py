"""Faults around the workdir and the config file, through the command line: two runs on one
workdir (WORKDIR/.lock, also for a two-process job), a kill -9 and the takeover, a workdir that
cannot be written, a config file that does not load, and resumes that are refused without
touching the workdir (CPU, a 32-token tiny model on a small slice of the bundled corpus).

Refused runs exit 2 with one line "bertjax: error: ...", no traceback, and leave every file that
was there as it was (a digest of the tree before and after)."""
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from bertjax import lock, workdir
from bertjax.training import reports
from bertjax.errors import UserError

from conftest import cpu_env, tree_digest, write_chapters
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG_RUN = ["--config.train.num_train_steps=100000", "--config.train.eval_every_steps=100000",
            "--config.data.long_seq_length=48", "--config.data.long_max_predictions_per_seq=7",
            "--config.train.long_seq_from_step=3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Pairs of 32 and 48 tokens prepared from 20 chapters of the bundled corpus."""
  directory = tmp_path_factory.mktemp("corpus")
  text_file, vocab = write_chapters(str(directory), 20)
  prepared = directory / "prepared"
  out = warm_python.run(
      [sys.executable, "-m", "bertjax.data.prepare", f"--input={text_file}", f"--vocab={vocab}",
       f"--output_dir={prepared}", "--max_seq_length=32,48", "--max_predictions_per_seq=5,7",
       "--dupe_factor=1", "--eval_fraction=0.1", "--workers=1"],
      env=_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return str(prepared)


def _flags(data, *overrides):
  """Flags of a short tiny run on the prepared data, then `overrides`."""
  return [f"--config.data.prepared={data}", "--config.data.max_seq_length=32",
          "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=8",
          "--config.train.eval_batch_size=16", "--config.train.num_train_steps=6",
          "--config.train.warmup_steps=2", "--config.train.log_every_steps=1",
          "--config.train.eval_every_steps=3", "--config.train.checkpoint_every_steps=2",
          "--config.train.eval_steps=2", *overrides]


def _command(directory, flags, config="configs/tiny.py"):
  return [sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={directory}",
          *flags]


def _env(**extra):
  return cpu_env(**extra)


def _run(directory, flags, config="configs/tiny.py", preexec_fn=None):
  return subprocess.run(_command(directory, flags, config), env=_env(), cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False,
                        preexec_fn=preexec_fn)




def _error_line(returncode, stderr):
  """The one "bertjax: error:" line of a run refused with exit status 2, without a traceback."""
  assert returncode == 2, (returncode, stderr[-3000:])
  message = [line for line in stderr.splitlines() if line.startswith("bertjax: error:")]
  assert len(message) == 1, stderr[-3000:]
  assert "Traceback" not in stderr
  return message[0]


def _refused(tree, directory, flags, *expected, config="configs/tiny.py", preexec_fn=None):
  """Runs on `directory`; asserts exit 2, one message holding `expected`, and `tree` (a
  directory holding the workdir or the workdir itself) unchanged. Returns the message."""
  before = tree_digest(tree)
  out = _run(directory, flags, config=config, preexec_fn=preexec_fn)
  message = _error_line(out.returncode, out.stderr)
  for text in expected:
    assert text in message, message
  assert tree_digest(tree) == before
  return message


def _train_steps(directory):
  """The train steps of metrics.jsonl, in order (a line cut short by a kill left out)."""
  with open(os.path.join(directory, "metrics.jsonl")) as f:
    return [json.loads(line)["step"] for line in f
            if line.endswith("\n") and json.loads(line)["split"] == "train"]


# ----------------------------------------------------------------------------------------------
# One run at a time: WORKDIR/.lock.


@pytest.fixture(scope="module")
def first_run(data, tmp_path_factory):
  """(process, workdir) of a long run that holds its workdir: it has logged 12 steps, so the
  checkpoint of step 8 or later is committed; in the 48-token phase from step 3."""
  directory = tmp_path_factory.mktemp("lock") / "run"
  process = warm_python.popen(_command(directory, _flags(data, *LONG_RUN)), env=_env(),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and process.poll() is None:
    if (directory / "metrics.jsonl").exists() and len(_train_steps(directory)) >= 12:
      break
    time.sleep(0.05)
  assert process.poll() is None, process.returncode
  yield process, directory
  if process.poll() is None:
    process.kill()
    process.wait()


def _wait_until_stopped(pid):
  """Returns once the process is stopped (state T in /proc): a signal is delivered
  asynchronously, and a write it has not yet stopped would change the workdir's digest."""
  deadline = time.time() + 10
  while time.time() < deadline:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      if f.read().rsplit(")", 1)[1].split()[0] == "T":
        return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} did not stop")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_second_run_and_a_second_job_are_refused_while_the_first_holds_the_workdir(
    first_run, data):
  process, directory = first_run
  assert process.poll() is None, "the first run must still hold the workdir (tests in file order)"
  process.send_signal(signal.SIGSTOP)  # the workdir stays still while the others are refused
  _wait_until_stopped(process.pid)
  try:
    owner = json.loads((directory / lock.LOCK_FILE).read_text())
    assert owner["pid"] == process.pid and owner["host"] == socket.gethostname()
    message = _refused(directory, directory, _flags(data, *LONG_RUN), "is in use by another run",
                       f"pid {process.pid} on host {socket.gethostname()}")
    assert str(directory) in message
    # A two-process job: process 0 is refused and tells process 1, which exits with it.
    before = tree_digest(directory)
    env = _env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}", JAX_NUM_PROCESSES="2")
    job = [warm_python.popen(_command(directory, _flags(data, *LONG_RUN)),
                             env=dict(env, JAX_PROCESS_ID=str(i)), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
    try:
      outputs = [p.communicate(timeout=120) for p in job]
    finally:
      for p in job:
        if p.poll() is None:
          p.kill()
    messages = {_error_line(p.returncode, err) for p, (_, err) in zip(job, outputs)}
    assert messages == {message}
    assert tree_digest(directory) == before
  finally:
    process.send_signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def resumed(first_run, data):
  """The first run killed with SIGKILL, then the same command to step 16: (workdir, the steps
  that the killed run had logged, the rerun's output)."""
  process, directory = first_run
  process.kill()
  assert process.wait(timeout=60) == -signal.SIGKILL
  assert (directory / lock.LOCK_FILE).exists()  # left by the killed run
  logged = _train_steps(directory)
  out = _run(directory, _flags(data, *LONG_RUN, "--config.train.stop_after_steps=16"))
  return directory, logged, out


def test_after_kill_9_the_next_run_takes_over_and_logs_each_step_once(first_run, resumed):
  process, _ = first_run
  directory, logged, out = resumed
  assert out.returncode == 0, out.stderr[-3000:]
  assert re.search(rf"taking over .*\.lock from pid {process.pid} .*which is gone", out.stderr)
  resumed_from = int(re.search(r"resuming from step (\d+)", out.stdout + out.stderr).group(1))
  assert 8 <= resumed_from <= max(logged)
  print(f"the killed run logged steps {logged}; the rerun resumed from step {resumed_from}")
  assert _train_steps(directory) == list(range(1, 17))  # each step once
  assert not (directory / lock.LOCK_FILE).exists()  # released at the end


def test_a_refused_resume_leaves_the_workdir_as_it_was(resumed, data):
  """Another model, or data that cannot serve the checkpoint's position (it is in the 48-token
  phase; the rerun has none): refused before config.json, metrics or TensorBoard are touched."""
  directory, _, out = resumed
  assert out.returncode == 0, out.stderr[-3000:]
  _refused(directory, directory, _flags(data, *LONG_RUN, "--config.train.stop_after_steps=18",
                                        "--config.model.size=mini"),
           "does not match the model", "--workdir")
  _refused(directory, directory, _flags(data, "--config.train.num_train_steps=100000",
                                        "--config.train.stop_after_steps=18"),
           "data position", "another data pipeline")


def test_a_lock_from_another_host_is_refused_until_its_heartbeat_is_stale(tmp_path):
  """In-process: a lock whose owner ran elsewhere is judged by its heartbeat (its mtime)."""
  path = tmp_path / lock.LOCK_FILE
  path.write_text(json.dumps({"host": "other-host", "pid": 1, "where": "other-host/boot/pid:[1]",
                              "started": "2030-01-01 00:00:00 UTC", "job": None}))
  with pytest.raises(UserError, match=r"pid 1 on host other-host .*last heartbeat \d+ s ago\. "
                                      rf"If that run is dead, remove {re.escape(str(path))}"):
    lock.Lock.take(str(tmp_path))
  old = time.time() - lock.STALE_SECONDS - 60
  os.utime(path, (old, old))
  taken = lock.Lock.take(str(tmp_path))
  assert json.loads(path.read_text())["pid"] == os.getpid()
  taken.release()
  assert os.listdir(tmp_path) == []


def test_metrics_are_cut_back_to_the_restored_step(tmp_path):
  """In-process: what a crashed run logged after its checkpoint, and a line it cut short, go."""
  path = tmp_path / workdir.METRICS_FILE
  lines = [json.dumps({"step": s, "split": "train", "loss": 1.0}) for s in (1, 2, 3, 4)]
  path.write_text("\n".join(lines) + "\n" + '{"step": 5, "spl')
  reports.keep_steps_up_to(path, 3)
  assert path.read_text() == "\n".join(lines[:3]) + "\n"
  assert os.listdir(tmp_path) == [workdir.METRICS_FILE]


# ----------------------------------------------------------------------------------------------
# A workdir that cannot be written; a config file that does not load.


def _without_root_file_access():
  """For a subprocess run as root: drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so that file
  modes bind it as they bind any user."""
  libc = ctypes.CDLL(None, use_errno=True)
  for capability in (1, 2):
    if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
      raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_workdir_that_cannot_be_written_is_refused_before_any_work(data, tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("the user's file\n")
  flags = _flags(data)
  _refused(tmp_path, a_file, flags, f"--workdir={a_file} is a file, not a directory")
  _refused(tmp_path, a_file / "run", flags, f"{a_file} is a file, not a directory")
  read_only = tmp_path / "read_only"
  read_only.mkdir()
  (read_only / "notes.txt").write_text("the user's file\n")
  read_only.chmod(0o555)
  drop = _without_root_file_access if os.geteuid() == 0 else None
  _refused(tmp_path, read_only, flags, f"the workdir {read_only} is not writable",
           f"chmod u+w {read_only}", preexec_fn=drop)
  _refused(tmp_path, read_only / "run", flags, f"--workdir={read_only / 'run'} cannot be created",
           "Permission denied", preexec_fn=drop)


@pytest.mark.parametrize("text, expected", [
    (None, "no config file {path}"),
    ("def get_config(:\n  pass\n", "{path}, line 1: invalid syntax: def get_config(:"),
    ("import ml_collections\n\ndef get_config():\n  return undefined_name\n",
     "{path}, line 4: NameError: name 'undefined_name' is not defined"),
    ("CONFIG = 1\n", "{path} has no get_config()"),
], ids=["missing", "syntax_error", "name_error", "no_get_config"])
def test_a_config_file_that_does_not_load_is_one_message(text, expected, data, tmp_path):
  config = tmp_path / "config.py"
  if text is not None:
    config.write_text(text)
  directory = tmp_path / "run"
  _refused(tmp_path, directory, _flags(data), expected.format(path=config), config=str(config))
  assert not directory.exists()
