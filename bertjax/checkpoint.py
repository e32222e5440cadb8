"""Checkpoints: save and resume a run, and start one from another run's parameters.

On-disk layout (orbax-checkpoint `CheckpointManager`, one directory per step):

  WORKDIR/checkpoints/<step>/state/           the train state, a pytree of arrays (orbax OCDBT)
  WORKDIR/checkpoints/<step>/data_position/   {"data_position": <JSON>} where the data stopped

The train state is the trainer's plain dict `{'step', 'params', 'opt_state', 'rng'}`; anything
that is a pytree of arrays can be saved, but `load_params` reads the `params` entry, so a state
meant to initialise other runs must keep its parameters under the key 'params' (a nested dict
of arrays, as a linen model's "params" collection).

Before anything is restored, every array's shape in the checkpoint is compared with what the
caller expects; a checkpoint of a different model is a `UserError`, and nothing on disk is
touched.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from bertjax.errors import UserError

CHECKPOINTS_DIR = "checkpoints"  # under the workdir
STATE_ITEM = "state"
DATA_ITEM = "data_position"
_MAX_LISTED = 5  # differences named in an error message


def _handlers() -> dict[str, ocp.CheckpointHandler]:
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


def _listing(diffs: list[str]) -> str:
  more = f"; and {len(diffs) - _MAX_LISTED} more" if len(diffs) > _MAX_LISTED else ""
  return "; ".join(diffs[:_MAX_LISTED]) + more


def _with_sharding(abstract: Any) -> Any:
  """ShapeDtypeStructs without a sharding get the first local device (orbax would otherwise
  restore them as numpy arrays)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(
      lambda x: x if getattr(x, "sharding", None) is not None
      else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)


class _Manager(ocp.CheckpointManager):
  """orbax's CheckpointManager without its own preemption checks.

  It would ask jax's preemption sync point with the step being saved, in `save` and, after an
  asynchronous save, from its finalize thread, while the train loop is already steps further.
  Each call sets the process's counter in jax's sync protocol, so a SIGTERM that comes just
  then makes the processes agree on a point that is already behind, and they never stop (or
  one skips it and the others wait in the save). `bertjax.preemption.StopSignal` is the only
  caller of the sync point.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class Checkpoints:
  """The checkpoints of one run: train state + data position per step, the last `keep` kept.

  Saving is asynchronous (the arrays are copied to host memory, then written in the background
  while training goes on); `wait()` blocks until written and `close()` waits too. Every process
  of a multi-host job must make the same calls.

  Usage:
    checkpoints = Checkpoints(workdir / "checkpoints", save_every_steps=1000, keep=3)
    if checkpoints.latest_step() is not None:
      state, position = checkpoints.restore(abstract_state)
    ...
    checkpoints.save(step, state, position)               # saves when step % 1000 == 0
    checkpoints.save(step, state, position, force=True)   # the end of the run, preemption
    checkpoints.close()
  """

  def __init__(self, directory: epath.PathLike, *, save_every_steps: int, keep: int | None,
               async_save: bool = True):
    """Opens (does not create) `directory`; it is created by the first save.

    Args:
      directory: where step directories go, usually WORKDIR/checkpoints (local or gs://).
      save_every_steps: `save` writes at steps that are multiples of this (unless forced).
      keep: how many of the latest checkpoints to keep (None: all).
      async_save: write in a background thread (False: `save` returns once written).
    """
    if save_every_steps < 1:
      raise UserError(f"checkpoint_every_steps={save_every_steps} must be at least 1; set "
                      "--config.train.checkpoint_every_steps.")
    if keep is not None and keep < 1:
      raise UserError(f"keep_checkpoints={keep} must be at least 1; set "
                      "--config.train.keep_checkpoints.")
    self.directory = epath.Path(directory)
    # Save at multiples of save_every_steps; unlike orbax's default, not also at the first step
    # seen. A preemption is a forced save at the step bertjax.preemption agreed on.
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_every_steps),
        max_to_keep=keep, create=False, enable_async_checkpointing=async_save)
    self._manager = _Manager(self.directory, item_handlers=_handlers(), options=options)

  def latest_step(self) -> int | None:
    """The newest saved step, None if there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every kept step, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, data_position: Any, *, force: bool = False) -> bool:
    """Saves `state` and `data_position` as `step` when due (or when `force`).

    Args:
      step: the number of train steps done.
      state: pytree of jax.Arrays (sharded or not), e.g. {'step','params','opt_state','rng'}.
      data_position: JSON-serialisable value (dict, None, ...) that resumes the data pipeline.
      force: save even if `step` is not a multiple of `save_every_steps` (end of run,
        preemption). A step that is already saved is never overwritten.
    Returns:
      whether a save was started.
    """
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
        step, force=force,
        args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(state),
            DATA_ITEM: ocp.args.JsonSave({"data_position": data_position})}))

  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises UserError unless the saved state at `step` has exactly the keys and shapes of
    `abstract_state`. Reads only metadata."""
    saved = self._manager.item_metadata(step)[STATE_ITEM]
    diffs = shape_differences(flat_shapes(getattr(saved, "tree", saved)),
                              flat_shapes(abstract_state))
    if diffs:
      raise UserError(
          f"the checkpoint at step {step} in {self.directory} does not match the model "
          f"({len(diffs)} differences): {_listing(diffs)}. This workdir holds a checkpoint of a "
          "different model; use a new --workdir or the matching config. Nothing was changed.")

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, Any]:
    """Restores the state and data position of `step` (default: the latest).

    Args:
      abstract_state: pytree of jax.ShapeDtypeStruct with `.sharding` set, in the structure of
        the saved state; arrays are restored straight into those shardings (and dtypes).
      step: which step; None for the latest.
    Returns:
      (state: pytree of jax.Array like `abstract_state`, data_position as saved).
    Raises:
      UserError: no such checkpoint, or one whose keys or shapes differ from `abstract_state`.
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        raise UserError(f"no checkpoint in {self.directory}; start without resuming or point "
                        "--workdir at the run to resume.")
    elif step not in self._manager.all_steps():
      raise UserError(f"no checkpoint for step {step} in {self.directory}; it holds steps "
                      f"{self.all_steps()}.")
    self.check_compatible(abstract_state, step)
    restored = self._manager.restore(
        step, args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardRestore(_with_sharding(abstract_state)),
            DATA_ITEM: ocp.args.JsonRestore()}))
    return restored[STATE_ITEM], restored[DATA_ITEM]["data_position"]

  def wait(self) -> None:
    """Blocks until every started save is on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves, then releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpoints":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


@dataclasses.dataclass(frozen=True)
class LoadReport:
  """What `load_params` did, as parameter paths ('bert/layer_0/attention/query/kernel').

  Attributes:
    step_dir: the step directory read.
    loaded: parameters taken from the checkpoint.
    missing: parameters of the target that the checkpoint lacks; they keep the target's
      (freshly initialised) values, e.g. a new task head.
    unused: parameters in the checkpoint that the target has no place for, e.g. the
      pretraining heads when fine-tuning.
    replaced: parameters under `fresh_on_mismatch` whose saved shape differs from the target's
      (e.g. a classifier for another number of labels); they keep the fresh values too.
  """
  step_dir: str
  loaded: list[str]
  missing: list[str]
  unused: list[str]
  replaced: list[str] = dataclasses.field(default_factory=list)


def find_step_dir(path: epath.PathLike) -> epath.Path:
  """The step directory that `path` names: a workdir (its latest checkpoint), a checkpoints
  directory (its latest step) or one step directory."""
  path = epath.Path(path)
  if not path.exists():
    raise UserError(f"checkpoint path {path} does not exist; set --config.init_checkpoint to a "
                    "workdir, its checkpoints/ directory or one step directory in it.")
  if (path / STATE_ITEM).is_dir():
    return path
  root = path / CHECKPOINTS_DIR if (path / CHECKPOINTS_DIR).is_dir() else path
  latest = ocp.step.latest_step_metadata(root, ocp.step.standard_name_format())
  if latest is None or not (latest.path / STATE_ITEM).is_dir():
    raise UserError(f"no checkpoint found in {path}; give a workdir, its checkpoints/ "
                    "directory or one step directory (one that holds state/).")
  return latest.path


def saved_param_shapes(path: epath.PathLike) -> dict[str, tuple[int, ...]]:
  """{'a/b/c': shape} of the parameters saved at `path` (as load_params finds it), read from the
  checkpoint's metadata without loading any array.

  Raises:
    UserError: no checkpoint at `path`, or no 'params' in it.
  """
  step_dir = find_step_dir(path)
  metadata = ocp.StandardCheckpointHandler().metadata(step_dir / STATE_ITEM)
  saved_tree = getattr(metadata, "tree", metadata)
  if not isinstance(saved_tree, dict) or "params" not in saved_tree:
    raise UserError(f"{step_dir} holds no 'params' in its saved state; init_checkpoint must be a "
                    "bertjax checkpoint (convert other formats first).")
  return {path_str(p): tuple(m.shape)
          for p, m in jax.tree_util.tree_flatten_with_path(saved_tree["params"])[0]}


def load_params(path: epath.PathLike, target_params: Any,
                fresh_on_mismatch: Sequence[str] = ()) -> tuple[Any, LoadReport]:
  """Loads the parameters of a saved train state into `target_params` (e.g. `init_checkpoint`).

  Only the `params` entry of the saved state is read (orbax partial restore): no optimizer
  state, step or rng. Parameters are matched by path; shared paths must have equal shapes.

  Args:
    path: a workdir, its checkpoints/ directory, or one step directory.
    target_params: nested dict of freshly initialised jax.Arrays (or ShapeDtypeStructs with
      shardings), e.g. a fine-tuning model's "params". Loaded arrays take each target leaf's
      dtype and sharding.
    fresh_on_mismatch: path prefixes (e.g. "sequence_classification/", a task head) whose
      parameters keep their fresh values when the saved shape differs, instead of raising.
  Returns:
    (params: the structure of `target_params`, with every parameter the checkpoint has
     replaced by the saved value, LoadReport).
  Raises:
    UserError: no checkpoint at `path`, no 'params' in it, or shared paths with different shapes.
  """
  step_dir = find_step_dir(path)
  saved = saved_param_shapes(step_dir)
  flat_target = traverse_util.flatten_dict(target_params, sep="/")
  expected = {p: tuple(x.shape) for p, x in flat_target.items()}

  differing = sorted(p for p in saved.keys() & expected.keys() if saved[p] != expected[p])
  replaced = [p for p in differing if p.startswith(tuple(fresh_on_mismatch))]
  mismatched = [f"{p}: {saved[p]} in the checkpoint, {expected[p]} in the model"
                for p in differing if p not in replaced]
  if mismatched:
    raise UserError(
        f"init_checkpoint {step_dir} has parameters whose shapes differ from the model "
        f"({len(mismatched)}): {_listing(mismatched)}. Use a checkpoint of a model of the same "
        "size, or set the model config (vocab, hidden size, layers, ...) to match it.")
  loaded = sorted(saved.keys() & expected.keys() - set(replaced))
  missing = sorted(expected.keys() - saved.keys())
  unused = sorted(saved.keys() - expected.keys())
  report = LoadReport(step_dir=str(step_dir), loaded=loaded, missing=missing, unused=unused,
                      replaced=replaced)
  if not loaded:
    return target_params, report

  def abstract(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

  item = {"params": _with_sharding(traverse_util.unflatten_dict(
      {p: abstract(flat_target[p]) for p in loaded}, sep="/"))}
  restored = ocp.PyTreeCheckpointer().restore(
      step_dir / STATE_ITEM,
      args=ocp.args.PyTreeRestore(item=item,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                                  partial_restore=True))
  flat_restored = traverse_util.flatten_dict(restored["params"], sep="/")
  params = traverse_util.unflatten_dict(
      {p: flat_restored.get(p, x) for p, x in flat_target.items()}, sep="/")
  return params, report
