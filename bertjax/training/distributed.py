"""Joining a multi-process job: `jax.distributed.initialize` as the environment describes it.

Every process of a job (the hosts of a Cloud TPU pod slice, the tasks of a SLURM step, the ranks
of an Open MPI job, or processes started by hand) runs the same command; before anything starts
a JAX backend, `maybe_initialize_distributed` reads the environment, joins the job (or does
nothing for a single process) and turns a partial or bad description into a `UserError` that
says what to set. `distributed_init_args` is the reading alone, without starting anything.
After it, `bertjax.training.parallel` builds the mesh over every process's devices.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax

from bertjax.errors import UserError

_PLAIN_VARS = "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID"
_PLAIN_EXAMPLE = ("e.g. JAX_COORDINATOR_ADDRESS=10.0.0.1:8476 and JAX_NUM_PROCESSES=2 on both "
                  "hosts, JAX_PROCESS_ID=0 on the first and JAX_PROCESS_ID=1 on the second, where "
                  "10.0.0.1 is the first host's address and 8476 a free port")
# The variables by which jax's cluster detection recognises a SLURM step / an Open MPI job.
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
               "SLURM_LOCALID")
_OMPI_URI = "OMPI_MCA_orte_hnp_uri"


def _int_var(environ: Mapping[str, str], name: str) -> int:
  try:
    return int(environ[name])
  except ValueError:
    raise UserError(f"{name}={environ[name]!r} is not a whole number; set {_PLAIN_VARS} "
                    f"({_PLAIN_EXAMPLE}).") from None


def _check_address(address: str) -> None:
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise UserError(f"JAX_COORDINATOR_ADDRESS={address!r} is not HOST:PORT; set it to the "
                    "address of process 0's host and a free port, e.g. 10.0.0.1:8476.")


def distributed_init_args(environ: Mapping[str, str]) -> dict[str, Any] | None:
  """How to join the multi-process job that `environ` describes, without starting anything.

  Args:
    environ: the environment variables (os.environ).
  Returns:
    None when this is a single process; else the keyword arguments for
    `jax.distributed.initialize` (what is left out, jax detects from the cluster: {} on a Cloud
    TPU pod, SLURM or Open MPI).
  Raises:
    UserError: a partial or bad set of the JAX_* variables (the message says what to set).
  """
  address = environ.get("JAX_COORDINATOR_ADDRESS", "")
  explicit = "JAX_NUM_PROCESSES" in environ or "JAX_PROCESS_ID" in environ
  ompi_size = int(environ.get("OMPI_COMM_WORLD_SIZE", "1") or "1")
  if address and not explicit and ompi_size > 1 and _OMPI_URI not in environ:
    # Open MPI 5 no longer exports the variable by which jax finds its job: count and rank from
    # mpirun, the address from the user.
    environ = {**environ, "JAX_NUM_PROCESSES": environ["OMPI_COMM_WORLD_SIZE"],
               "JAX_PROCESS_ID": environ.get("OMPI_COMM_WORLD_RANK", "")}
    explicit = True
  if explicit:
    missing = [v for v in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
               if not environ.get(v)]
    if missing:
      raise UserError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; "
                      f"a multi-process job started by hand needs all of {_PLAIN_VARS}, the "
                      f"same address and count on every process and ids 0..count-1: "
                      f"{_PLAIN_EXAMPLE}.")
    _check_address(address)
    num_processes = _int_var(environ, "JAX_NUM_PROCESSES")
    process_id = _int_var(environ, "JAX_PROCESS_ID")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(f"JAX_PROCESS_ID={process_id} with JAX_NUM_PROCESSES={num_processes}: the "
                      "count must be at least 1 and each process's id one of 0..count-1; set "
                      f"{_PLAIN_VARS} ({_PLAIN_EXAMPLE}).")
    if num_processes == 1:
      return None
    return {"coordinator_address": address, "num_processes": num_processes,
            "process_id": process_id}
  if address:  # launch/tpu.py on a TPU VM pod slice, or a chosen coordinator on SLURM / MPI
    _check_address(address)
    return {"coordinator_address": address}
  hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES", "")
  if len([h for h in hosts.split(",") if h.strip()]) > 1:
    return {}
  if all(environ.get(v) for v in _SLURM_VARS) and int(environ["SLURM_NTASKS"]) > 1:
    return {}
  if ompi_size > 1:
    if _OMPI_URI in environ:
      return {}
    raise UserError(f"this is process {environ.get('OMPI_COMM_WORLD_RANK', '?')} of "
                    f"{ompi_size} of an Open MPI job that does not export {_OMPI_URI} (Open MPI "
                    "5); set JAX_COORDINATOR_ADDRESS to the host of rank 0 and a free port, "
                    "e.g. mpirun -x JAX_COORDINATOR_ADDRESS=10.0.0.1:8476 ...")
  return None


def maybe_initialize_distributed() -> None:
  """Joins the multi-process job that the environment describes; a single process does nothing.

  Call it first, before anything that starts a JAX backend. Four ways to describe a job:
    1. Cloud TPU: a pod slice on GKE (TPU_WORKER_HOSTNAMES names several hosts), or a TPU VM
       pod slice, where `launch/tpu.py run` exports JAX_COORDINATOR_ADDRESS (worker 0) and jax
       takes the process count and index from the TPU metadata.
    2. SLURM: `srun` with more than one task (SLURM_NTASKS > 1); jax takes everything from
       SLURM's variables. Set JAX_COORDINATOR_ADDRESS too to choose the coordinator's port.
    3. Open MPI: `mpirun -np N` with N > 1 (OMPI_COMM_WORLD_SIZE); jax takes everything from
       Open MPI's variables, except under Open MPI 5, which needs JAX_COORDINATOR_ADDRESS.
    4. By hand, anywhere: JAX_COORDINATOR_ADDRESS=HOST:PORT (process 0's host, a free port),
       JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=0..N-1, one id per process.
  A partial or bad set of the JAX_* variables is a UserError that says what to set. On CPU,
  processes exchange arrays through gloo (jax_cpu_collectives_implementation).
  """
  kwargs = distributed_init_args(os.environ)
  if kwargs is None or jax.distributed.is_initialized():
    return
  if ((jax.config.jax_platforms or "").split(",")[0].strip() == "cpu"
      and jax.config.jax_cpu_collectives_implementation is None):
    # Must be set before the backend starts; without it CPU processes cannot run collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(**kwargs)
  except ValueError as e:
    if "must be defined" not in str(e):
      raise
    raise UserError(
        f"JAX_COORDINATOR_ADDRESS is set but this process cannot tell the job's process count "
        f"or its own index ({e}); outside a Cloud TPU pod, SLURM or Open MPI, set all of "
        f"{_PLAIN_VARS}: {_PLAIN_EXAMPLE}.") from None
