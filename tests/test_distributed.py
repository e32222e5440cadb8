"""Tests of joining a multi-process job (bertjax.training.distributed) and stopping it together
(bertjax.training.preemption): the environment's reading without starting anything, then real jobs of two
CPU processes with two devices each, started through JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID, stopped by a signal to one of them, saving a sharded state and restoring it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from bertjax.errors import UserError
from bertjax.training import distributed, preemption

from conftest import cpu_env
import warm_python

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ADDRESS = "10.0.0.1:8476"
_SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[001-004]", "SLURM_NTASKS": "4",
          "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}


# -- the environment -> jax.distributed.initialize's arguments ------------------------------------

@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"},
     {"coordinator_address": _ADDRESS, "num_processes": 4, "process_id": 3}),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}, None),
    # Cloud TPU VM pod slice (launch/tpu.py exports the address; jax reads the TPU metadata).
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS}, {"coordinator_address": _ADDRESS}),
    ({"TPU_WORKER_HOSTNAMES": "t1k-w-0,t1k-w-1"}, {}),      # GKE, two hosts
    ({"TPU_WORKER_HOSTNAMES": "t1k-w-0"}, None),            # one host
    (_SLURM, {}),
    ({**_SLURM, "SLURM_NTASKS": "1"}, None),
    ({k: v for k, v in _SLURM.items() if k != "SLURM_STEP_NODELIST"}, None),  # no srun
    ({**_SLURM, "JAX_COORDINATOR_ADDRESS": _ADDRESS}, {"coordinator_address": _ADDRESS}),
    ({**_SLURM, "JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "2",
      "JAX_PROCESS_ID": "1"},                               # the variables win over detection
     {"coordinator_address": _ADDRESS, "num_processes": 2, "process_id": 1}),
    ({"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_RANK": "1"}, {}),
    ({"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911", "OMPI_COMM_WORLD_SIZE": "1",
      "OMPI_COMM_WORLD_RANK": "0"}, None),
    # Open MPI 5: no URI for jax to detect; count and rank from mpirun, address from the user.
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
      "JAX_COORDINATOR_ADDRESS": _ADDRESS},
     {"coordinator_address": _ADDRESS, "num_processes": 2, "process_id": 1}),
])
def test_init_args(environ, expected):
  assert distributed.distributed_init_args(environ) == expected


@pytest.mark.parametrize("environ, named", [
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS is not set"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID is not set"),
    ({"JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES are not set"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "", "JAX_PROCESS_ID": "0"},
     "JAX_NUM_PROCESSES is not set"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "JAX_NUM_PROCESSES='two' is not a whole number"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     "JAX_PROCESS_ID=2 with JAX_NUM_PROCESSES=2"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "-1"},
     "JAX_PROCESS_ID=-1 with JAX_NUM_PROCESSES=2"),
    ({"JAX_COORDINATOR_ADDRESS": _ADDRESS, "JAX_NUM_PROCESSES": "0", "JAX_PROCESS_ID": "0"},
     "JAX_PROCESS_ID=0 with JAX_NUM_PROCESSES=0"),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
     "JAX_COORDINATOR_ADDRESS='10.0.0.1' is not HOST:PORT"),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:http"}, "is not HOST:PORT"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "set JAX_COORDINATOR_ADDRESS"),
])
def test_init_args_bad_or_partial(environ, named):
  with pytest.raises(UserError, match=named) as raised:
    distributed.distributed_init_args(environ)
  assert "JAX_COORDINATOR_ADDRESS" in str(raised.value)  # every message says what to set


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(**variables) -> dict[str, str]:
  """This environment without any job description, plus `variables`, for a CPU process."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_", "SLURM_", "OMPI_", "TPU_"))}
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_env(2)["XLA_FLAGS"], **variables)
  return env


def test_address_alone_outside_a_cluster_is_user_error():
  """What jax 0.10.2 makes of JAX_COORDINATOR_ADDRESS alone ('Number of processes must be
  defined') becomes a UserError that names the other two variables."""
  script = ("from bertjax.training import distributed\n"
            "from bertjax.errors import UserError\n"
            "try:\n  distributed.maybe_initialize_distributed()\n"
            "except UserError as e:\n  print('UserError:', e)\n")
  result = warm_python.run(
      [sys.executable, "-c", script], cwd=_REPO, timeout=60,
      env=_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}"))
  assert "UserError: JAX_COORDINATOR_ADDRESS is set" in result.stdout, result.stderr[-2000:]
  assert "JAX_NUM_PROCESSES" in result.stdout and "JAX_PROCESS_ID" in result.stdout


# -- StopSignal in one process ---------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_one_process(signum):
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  with preemption.StopSignal() as stop_signal:
    assert not stop_signal.should_stop(1)
    os.kill(os.getpid(), signum)  # no KeyboardInterrupt, no exit
    time.sleep(0.01)
    assert stop_signal.received == signal.Signals(signum).name
    assert stop_signal.should_stop(2)
  assert {s: signal.getsignal(s) for s in before} == before


def test_stop_signal_refuses_a_python_sigterm_handler(monkeypatch):
  """In a multi-process job, a Python SIGTERM handler has replaced jax's preemption notifier
  (the old trainer's did): StopSignal says so rather than never stopping."""
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  previous = signal.signal(signal.SIGTERM, lambda *_: None)
  try:
    with pytest.raises(RuntimeError, match="replaced the one jax.distributed installs"):
      preemption.StopSignal().__enter__()
  finally:
    signal.signal(signal.SIGTERM, previous)


# -- two real processes ----------------------------------------------------------------------------

# One process of the job: joins it, checks the devices and a cross-process sum, then either
# trains (w += 1 per step, a global sum each step) under StopSignal and saves where it stops, or
# restores the latest checkpoint. Prints one line 'RESULT {json}'.
_WORKER = r"""
import json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from bertjax.training import checkpoint, distributed, parallel, preemption

phase, workdir = sys.argv[1], sys.argv[2]
distributed.maybe_initialize_distributed()
pid = jax.process_index()
result = {"process_count": jax.process_count(), "device_count": jax.device_count(),
          "collectives": jax.config.jax_cpu_collectives_implementation}
mesh = parallel.make_mesh()  # data=4 over both processes
rows, repl = parallel.batch_sharding(mesh), parallel.replicated(mesh)
# [8, 3] = 0..23; each process holds its 4 rows.
w = jax.make_array_from_process_local_data(
    rows, np.arange(12, dtype=np.float32).reshape(4, 3) + 12 * pid)
result["sum"] = float(jax.jit(jnp.sum, out_shardings=repl)(w))
checkpoints = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), save_every_steps=1000,
                                     keep=2)

if phase == "train":
  state = {"step": jax.make_array_from_process_local_data(repl, np.zeros((), np.int32)), "w": w}

  @jax.jit
  def train_step(state):
    w = state["w"] + 1
    return {"step": state["step"] + 1, "w": w}, jnp.sum(w)

  step, stopping = 0, False
  with preemption.StopSignal() as stop_signal:
    open(os.path.join(workdir, f"looping{pid}"), "w").close()
    while step < 3000 and not stopping:
      state, total = train_step(state)
      step += 1
      time.sleep(0.01)
      stopping = stop_signal.should_stop(step)
      checkpoints.save(step, state, {"index": step, "process": pid}, force=stopping)
  result.update(stopped_at=step if stopping else None, received=stop_signal.received,
                total=float(total))
else:
  abstract = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=repl),
              "w": jax.ShapeDtypeStruct((8, 3), jnp.float32, sharding=rows)}
  state, position = checkpoints.restore(abstract)
  result.update(step=int(state["step"]), position=position,
                w=multihost_utils.process_allgather(state["w"], tiled=True).tolist(),
                local_rows=[s.index[0].start for s in state["w"].addressable_shards])
checkpoints.close()
print("RESULT " + json.dumps(result), flush=True)
"""


def _run_job(workdir, phase: str, signals=(), timeout: float = 60) -> list[dict]:
  """Runs the two processes of one job to the end; `signals` are (process, signal, seconds
  after it entered StopSignal) sent from here. Returns each process's RESULT."""
  address = f"127.0.0.1:{_free_port()}"
  logs = [workdir / f"{phase}{i}.log" for i in range(2)]
  procs = []
  try:
    for i in range(2):
      with open(logs[i], "w") as log:
        procs.append(warm_python.popen(
            [sys.executable, "-c", _WORKER, phase, str(workdir)], cwd=_REPO, stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2",
                     JAX_PROCESS_ID=str(i))))
    deadline = time.monotonic() + timeout
    for i, signum, delay in signals:
      while not (workdir / f"looping{i}").exists():
        assert time.monotonic() < deadline and procs[i].poll() is None, logs[i].read_text()[-3000:]
        time.sleep(0.05)
      time.sleep(delay)
      procs[i].send_signal(signum)
    for i, proc in enumerate(procs):
      returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      assert returncode == 0, f"process {i} exited {returncode}: {logs[i].read_text()[-3000:]}"
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  results = []
  for log in logs:
    lines = [l for l in log.read_text().splitlines() if l.startswith("RESULT ")]
    assert lines, log.read_text()[-3000:]
    results.append(json.loads(lines[-1][len("RESULT "):]))
  return results


def _check_job(results):
  for r in results:
    assert (r["process_count"], r["device_count"], r["collectives"]) == (2, 4, "gloo")
    assert r["sum"] == sum(range(24))


def test_sigterm_to_one_process_stops_both_and_the_checkpoint_resumes(tmp_path):
  results = _run_job(tmp_path, "train", signals=[(1, signal.SIGTERM, 0.5)])
  _check_job(results)
  stopped_at = results[0]["stopped_at"]
  assert stopped_at is not None and results[1]["stopped_at"] == stopped_at
  assert [r["received"] for r in results] == [None, None]  # jax's handler took the SIGTERM
  assert results[0]["total"] == results[1]["total"] == sum(range(24)) + 24 * stopped_at

  restored = _run_job(tmp_path, "restore")  # two fresh processes
  _check_job(restored)
  for i, r in enumerate(restored):
    assert r["step"] == stopped_at
    assert r["w"] == [[3 * row + col + stopped_at for col in range(3)] for row in range(8)]
    assert r["local_rows"] == [4 * i, 4 * i + 2]  # each process holds its own rows again
    # The JSON item is written by process 0: every process resumes from its data position.
    assert r["position"] == {"index": stopped_at, "process": 0}


@pytest.mark.parametrize("signals, received", [
    ([(0, signal.SIGINT, 0.5)], ["SIGINT", None]),
    ([(0, signal.SIGTERM, 0.5), (1, signal.SIGTERM, 0.2)], [None, None]),  # at different steps
], ids=["sigint-to-one", "sigterm-to-both-skewed"])
def test_signals_stop_both_processes_at_one_step(tmp_path, signals, received):
  results = _run_job(tmp_path, "train", signals=signals)
  _check_job(results)
  assert results[0]["stopped_at"] is not None
  assert results[0]["stopped_at"] == results[1]["stopped_at"]
  # Python sees the SIGINT that it routes into jax's protocol, not a SIGTERM, which jax handles.
  assert [r["received"] for r in results] == received
