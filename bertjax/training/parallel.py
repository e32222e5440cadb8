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

On a multi-host pod every host runs the same program after joining the job
(`bertjax.training.distributed`), reads only its slice of each global batch, and `global_batch`
assembles the global `jax.Array` from the per-host pieces.
"""
from __future__ import annotations

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
# Activations (`bertjax.models.layers.constrain`) are split by batch rows over the same axes and,
# inside a layer, by heads or feed-forward columns over `tensor`; their hidden axis is never
# split: without these constraints XLA follows the parameters' `fsdp` split of the hidden axis
# into the activations, and an FSDP step moved activations between devices (all-to-alls, and
# all-reduces of hidden states) beside the parameters and gradients.
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)


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
  Raises:
    UserError: a split dimension that its mesh axes do not divide (`check_divisible`).
  """
  specs = nn.get_partition_spec(boxed_abstract_params)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)
  check_divisible(nn.unbox(boxed_abstract_params), specs, shardings)
  return shardings


def check_divisible(abstract_params: Any, logical_specs: Any, shardings: Any) -> None:
  """Fails clearly, before anything is compiled, where a parameter's dimension does not split
  evenly over the mesh axes its logical axis maps to (jit would raise a bare IndivisibleError).

  Args:
    abstract_params: the unboxed params (arrays or ShapeDtypeStructs).
    logical_specs: their PartitionSpecs of logical axis names (`nn.get_partition_spec`).
    shardings: their NamedShardings (`nn.logical_to_mesh_sharding`).
  Raises:
    UserError: naming each such parameter, its size, the mesh axis and the fix.
  """
  is_spec = lambda x: isinstance(x, P)
  flat_params = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
  flat_specs = jax.tree_util.tree_leaves(logical_specs, is_leaf=is_spec)
  flat_shardings = jax.tree_util.tree_leaves(shardings)
  problems = []
  for (path, leaf), logical, sharding in zip(flat_params, flat_specs, flat_shardings):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec)):
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      split = int(np.prod([sharding.mesh.shape[a] for a in axes]))
      if size % split == 0:
        continue
      axis = logical[dim] if dim < len(logical) else None
      where = " x ".join(f"'{a}'={sharding.mesh.shape[a]}" for a in axes)
      if axis == "vocab":
        fix = (f"set --config.model.pad_vocab_to_multiple to a multiple of {split} (e.g. "
               f"{np.lcm(128, split)}) so that the vocabulary rows are padded to divide")
      else:
        fix = (f"set --config.mesh.{axes[0]} to a divisor of {size}, or use a model size that "
               f"the mesh divides")
      problems.append(f"parameter {name} {tuple(leaf.shape)}: its '{axis}' dimension of {size} "
                      f"does not split over mesh axis {where}; {fix}")
  if problems:
    more = f"; and {len(problems) - 4} more" if len(problems) > 4 else ""
    raise UserError(f"parameters that do not divide over the mesh ({len(problems)}): "
                    + "; ".join(problems[:4]) + more + ".")


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
