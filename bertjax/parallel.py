"""Device mesh, shardings and global batch assembly.

One train step is jitted over a `jax.sharding.Mesh` with axes (`data`, `fsdp`, `tensor`). JAX
documents jit + sharding as the successor of `jax.pmap` (now in maintenance mode): with every
device on the `data` axis, the jitted step is the same data-parallel program that pmap gave, and
XLA inserts the gradient all-reduce itself. FSDP and tensor parallelism are not a second training
loop but a different mesh shape plus the rules table below, which maps the logical axis names that
every parameter carries (see `bertjax.models.bert`) onto mesh axes.

The mesh uses `AxisType.Auto` axes, deliberately: shardings are given at the jit boundary
(`in_shardings` / `out_shardings`) and the compiler propagates them through the step, which is
what the logical-axis rules of Flax linen are written for. (`Explicit` axes, the jax 0.10 default
of `jax.make_mesh`, put shardings in the types and would require every op to agree on them.)

On a multi-host pod every host runs the same program after `jax.distributed.initialize()`, reads
only its slice of each global batch, and `global_batch` assembles the global `jax.Array` from the
per-host pieces.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from bertjax.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")

# The batch is split over every axis that holds a replica of the computation: `data` and `fsdp`
# (FSDP is data parallelism whose parameters are also split). Parameters follow their logical
# axes: hidden ('embed') over `fsdp`, vocabulary / heads / feed-forward over `tensor`.
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
)


def maybe_initialize_distributed() -> None:
  """Joins a multi-host job when the environment describes one (Cloud TPU pods, SLURM, ...).

  The sign is TPU_WORKER_HOSTNAMES naming several hosts (GKE) or JAX_COORDINATOR_ADDRESS being
  set; `jax.distributed.initialize()` then finds the process count and index itself on Cloud
  TPU. A TPU VM pod slice sets neither: `launch/tpu.py run` exports JAX_COORDINATOR_ADDRESS
  (worker 0, from the metadata server) on every worker. Elsewhere set JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID. A single host does nothing.
  """
  on_tpu_pod = int(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",")) > 0
  explicit = "JAX_COORDINATOR_ADDRESS" in os.environ
  if (on_tpu_pod or explicit) and not jax.distributed.is_initialized():
    jax.distributed.initialize()


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (`data`, `fsdp`, `tensor`) mesh; -1 on `data` takes all remaining devices."""
  devices = list(devices if devices is not None else jax.devices())
  n = len(devices)
  if fsdp < 1 or tensor < 1 or n % (fsdp * tensor):
    raise UserError(
        f"mesh fsdp={fsdp} x tensor={tensor} does not divide the {n} devices; set "
        "--config.mesh.fsdp and --config.mesh.tensor to divisors of the device count.")
  if data == -1:
    data = n // (fsdp * tensor)
  if data * fsdp * tensor != n:
    raise UserError(
        f"mesh data={data} x fsdp={fsdp} x tensor={tensor} != {n} devices; use "
        "--config.mesh.data=-1 to span all devices.")
  return jax.make_mesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of every batch array: leading (batch) dimension split over `data` x `fsdp`."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_size(global_batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
  """Fails clearly when the global batch cannot be split evenly over the batch shards."""
  shards = num_batch_shards(mesh)
  if global_batch_size % shards:
    raise UserError(
        f"{what}={global_batch_size} is not divisible by the {shards} devices that share the "
        f"batch; set --config.{what} to a multiple of {shards}.")


def param_shardings(boxed_abstract_params: Any, mesh: Mesh) -> Any:
  """Maps parameters carrying logical axis names (nn.LogicallyPartitioned) to NamedShardings.

  Args:
    boxed_abstract_params: the params tree from `jax.eval_shape(model.init, ...)`, still boxed.
  Returns:
    a tree of NamedSharding with the structure of the unboxed params.
  """
  specs = nn.get_partition_spec(boxed_abstract_params)
  return nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)


def optimizer_state_shardings(tx: optax.GradientTransformation, abstract_params: Any,
                              params_sharding: Any, mesh: Mesh) -> Any:
  """Shardings of the optimizer state: moments follow their parameter, counters replicate."""
  abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
  return optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_opt_state, params_sharding,
      transform_non_params=lambda _: replicated(mesh))


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles this host's slice of the batch into global arrays sharded over the mesh.

  Args:
    local_batch: numpy arrays [per_host_batch, ...] (this host's rows of the global batch).
  Returns:
    jax.Arrays [per_host_batch * process_count, ...] with `batch_sharding(mesh)`.
  """
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
