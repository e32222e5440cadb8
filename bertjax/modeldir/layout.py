"""The on-disk layout of a step directory, which checkpoints and model directories share, and the
paths and shapes of the state tree it holds.

  DIR/checkpoints/<step>/state/           a pytree of arrays (orbax OCDBT): a run's train state
                                          {'step', 'params', 'opt_state', 'rng'}, or a model
                                          directory's {'step', 'params'}
  DIR/checkpoints/<step>/data_position/   {"data_position": <JSON>} where a run's data stopped
                                          (None in a model directory), and "prng_impl"

Parameters are read by path ('params/bert/layer_0/attention/query/kernel') from the state's
metadata before any array is, so a model of other shapes is refused by name.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp

STATE_ITEM = "state"
DATA_ITEM = "data_position"
_MAX_LISTED = 5  # differences named in an error message


def handlers() -> dict[str, ocp.CheckpointHandler]:
  """orbax's handler of each item of a step directory."""
  return {STATE_ITEM: ocp.StandardCheckpointHandler(), DATA_ITEM: ocp.JsonCheckpointHandler()}


def _key_name(key: Any) -> str:
  """One step of a key path as text. Dict keys, sequence indices and attribute names all map to
  their plain name, because orbax's metadata stores tuples as lists and namedtuples (optax
  states) as dicts keyed by field name."""
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_str(path: Sequence[Any]) -> str:
  """A key path as 'params/bert/layer_0/attention/query/kernel'."""
  return "/".join(_key_name(k) for k in path)


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{path: shape} for every leaf of a pytree of arrays, ShapeDtypeStructs or orbax metadata."""
  return {path_str(path): tuple(getattr(leaf, "shape", ()))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shape_differences(saved: dict[str, tuple[int, ...]],
                      expected: dict[str, tuple[int, ...]]) -> list[str]:
  """Human-readable differences between two {path: shape} maps; parameters ('params/...')
  first, so that an error message names them before their optimizer moments."""
  diffs = []
  for path in sorted(saved.keys() | expected.keys(), key=lambda p: (not p.startswith("params"), p)):
    if path not in expected:
      diffs.append(f"{path}: {saved[path]} in the checkpoint, absent from the model")
    elif path not in saved:
      diffs.append(f"{path}: {expected[path]} in the model, absent from the checkpoint")
    elif saved[path] != expected[path]:
      diffs.append(f"{path}: {saved[path]} in the checkpoint, {expected[path]} in the model")
  return diffs


def listing(diffs: list[str]) -> str:
  """The first few of `diffs` for an error message, "; "-joined, then how many more there are."""
  more = f"; and {len(diffs) - _MAX_LISTED} more" if len(diffs) > _MAX_LISTED else ""
  return "; ".join(diffs[:_MAX_LISTED]) + more


def with_default_sharding(abstract: Any) -> Any:
  """ShapeDtypeStructs without a sharding get the first local device (orbax would otherwise
  restore them as numpy arrays)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(
      lambda x: x if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
