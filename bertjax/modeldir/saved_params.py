"""Parameters read by path from a checkpoint or a model directory: what `config.init_checkpoint`
starts a run from.

A checkpoint of any bertjax run, or a model directory that `python -m bertjax.convert` wrote
(`bertjax.modeldir.model_files`), can initialise another run: `load_params` reads only the `params`
entry of its saved train state (no optimizer state, step or rng) and puts each parameter in the
place of the same path in the new model's freshly initialised parameters. What the new model
has and the checkpoint lacks (a new task head) keeps its fresh value; what the checkpoint has
and the new model lacks (the pretraining heads, when fine-tuning) is left unread; a parameter
of the same path and another shape is a `UserError`, except under `fresh_on_mismatch` and for
the padding rows of the vocabulary-axis parameters (`VOCAB_ROW_PARAMS`). `LoadReport` says
which parameters went which way.

The checkpoint's layout is `bertjax.modeldir.layout`'s; `find_step_dir` finds the step in a
workdir, its checkpoints/ directory or a step directory.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from bertjax import workdir
from bertjax.errors import UserError
from bertjax.modeldir import layout


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
    resized: vocabulary-axis parameters (VOCAB_ROW_PARAMS, also in `loaded`) saved with another
      number of padding rows (an unpadded checkpoint, or another pad_vocab_to_multiple): their
      vocab_size real rows were loaded and the model's padding rows set to zero.
  """
  step_dir: str
  loaded: list[str]
  missing: list[str]
  unused: list[str]
  replaced: list[str] = dataclasses.field(default_factory=list)
  resized: list[str] = dataclasses.field(default_factory=list)


# Parameters whose first axis is the vocabulary: [padded_vocab_size, ...] in the model, of which
# the first vocab_size rows are the tokens and the rest padding that is never looked up or
# predicted (BertConfig.pad_vocab_to_multiple). Other formats store only the vocab_size rows.
VOCAB_ROW_PARAMS = ("bert/embeddings/word_embeddings/embedding", "masked_lm/output_bias")


def vocab_rows(array: np.ndarray, vocab_size: int, rows: int) -> np.ndarray:
  """The `vocab_size` real rows of a vocabulary-axis parameter, then zero rows up to `rows`.

  Args:
    array: [at least vocab_size, ...], e.g. an unpadded [vocab_size, hidden] embedding table or
      a padded [padded_vocab_size] MLM bias.
    vocab_size: the number of real rows (BertConfig.vocab_size).
    rows: the rows wanted: padded_vocab_size to pad, vocab_size to strip (>= vocab_size).
  Returns:
    [rows, ...] of array's dtype: array[:vocab_size], then rows - vocab_size rows of zeros.
  """
  array = np.asarray(array)
  if array.shape[0] < vocab_size or rows < vocab_size:
    raise ValueError(f"{array.shape[0]} rows -> {rows} rows cannot keep {vocab_size} real rows")
  padding = np.zeros((rows - vocab_size,) + array.shape[1:], array.dtype)
  return np.concatenate([array[:vocab_size], padding])


def _vocab_rows_fit(saved: tuple[int, ...], expected: tuple[int, ...], vocab_size: int) -> bool:
  """Whether a saved vocabulary-axis parameter holds the model's vocab_size real rows, so that
  only its padding differs."""
  return (len(saved) == len(expected) >= 1 and saved[1:] == expected[1:]
          and min(saved[0], expected[0]) >= vocab_size)


def find_step_dir(path: epath.PathLike) -> epath.Path:
  """The step directory that `path` names: a workdir (its latest checkpoint), a checkpoints
  directory (its latest step) or one step directory."""
  # orbax reads only absolute paths: a relative local one (--config.init_checkpoint=CKPT) is
  # taken from the working directory.
  path = epath.Path(path if "://" in str(path) else os.path.abspath(path))
  if not path.exists():
    raise UserError(f"checkpoint path {path} does not exist; set --config.init_checkpoint to a "
                    "workdir, its checkpoints/ directory or one step directory in it.")
  if (path / layout.STATE_ITEM).is_dir():
    return path
  root = path / workdir.CHECKPOINTS_DIR if (path / workdir.CHECKPOINTS_DIR).is_dir() else path
  latest = ocp.step.latest_step_metadata(root, ocp.step.standard_name_format())
  if latest is None or not (latest.path / layout.STATE_ITEM).is_dir():
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
  metadata = ocp.StandardCheckpointHandler().metadata(step_dir / layout.STATE_ITEM)
  saved_tree = getattr(metadata, "tree", metadata)
  if not isinstance(saved_tree, dict) or "params" not in saved_tree:
    raise UserError(f"{step_dir} holds no 'params' in its saved state; init_checkpoint must be a "
                    "bertjax checkpoint (convert other formats first).")
  return {layout.path_str(p): tuple(m.shape)
          for p, m in jax.tree_util.tree_flatten_with_path(saved_tree["params"])[0]}


def load_params(path: epath.PathLike, target_params: Any,
                fresh_on_mismatch: Sequence[str] = (), *,
                vocab_size: int | None = None) -> tuple[Any, LoadReport]:
  """Loads the parameters of a saved train state into `target_params` (e.g. `init_checkpoint`).

  Only the `params` entry of the saved state is read (orbax partial restore): no optimizer
  state, step or rng. Parameters are matched by path; shared paths must have equal shapes, but
  for the padding rows of the vocabulary-axis parameters (VOCAB_ROW_PARAMS) when `vocab_size`
  is given.

  Args:
    path: a workdir, its checkpoints/ directory, or one step directory.
    target_params: nested dict of freshly initialised jax.Arrays (or ShapeDtypeStructs with
      shardings), e.g. a fine-tuning model's "params". Loaded arrays take each target leaf's
      dtype and sharding.
    fresh_on_mismatch: path prefixes (e.g. "sequence_classification/", a task head) whose
      parameters keep their fresh values when the saved shape differs, instead of raising.
    vocab_size: the model's real vocabulary size (BertConfig.vocab_size). When given, a
      vocabulary-axis parameter saved with another number of rows, at least vocab_size (an
      unpadded checkpoint, or another pad_vocab_to_multiple), is adapted: its first vocab_size
      rows are loaded and the target's padding rows are zeros (`LoadReport.resized`). Fewer
      rows than vocab_size (another vocabulary) differ like any other shape.
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

  resized = sorted(p for p in VOCAB_ROW_PARAMS if vocab_size is not None and p in saved
                   and p in expected and saved[p] != expected[p]
                   and _vocab_rows_fit(saved[p], expected[p], vocab_size))
  differing = sorted(p for p in saved.keys() & expected.keys()
                     if saved[p] != expected[p] and p not in resized)
  replaced = [p for p in differing if p.startswith(tuple(fresh_on_mismatch))]
  mismatched = [f"{p}: {saved[p]} in the checkpoint, {expected[p]} in the model"
                for p in differing if p not in replaced]
  if mismatched:
    raise UserError(
        f"init_checkpoint {step_dir} has parameters whose shapes differ from the model "
        f"({len(mismatched)}): {layout.listing(mismatched)}. Use a checkpoint of a model of "
        "the same size, or set the model config (vocab, hidden size, layers, ...) to match it.")
  loaded = sorted(saved.keys() & expected.keys() - set(replaced))
  missing = sorted(expected.keys() - saved.keys())
  unused = sorted(saved.keys() - expected.keys())
  report = LoadReport(step_dir=str(step_dir), loaded=loaded, missing=missing, unused=unused,
                      replaced=replaced, resized=resized)
  if not loaded:
    return target_params, report

  def abstract(p):
    x = flat_target[p]
    if p in resized:  # read whole onto one device here, then padded or stripped below
      return jax.ShapeDtypeStruct(saved[p], x.dtype)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

  item = {"params": layout.with_default_sharding(traverse_util.unflatten_dict(
      {p: abstract(p) for p in loaded}, sep="/"))}
  restored = ocp.PyTreeCheckpointer().restore(
      step_dir / layout.STATE_ITEM,
      args=ocp.args.PyTreeRestore(item=item,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                                  partial_restore=True))
  flat_restored = traverse_util.flatten_dict(restored["params"], sep="/")
  for p in resized:
    flat_restored[p] = _placed_like(
        vocab_rows(np.asarray(flat_restored[p]), vocab_size, expected[p][0]), flat_target[p])
  params = traverse_util.unflatten_dict(
      {p: flat_restored.get(p, x) for p, x in flat_target.items()}, sep="/")
  return params, report


def _placed_like(value: np.ndarray, target: Any) -> jax.Array:
  """A host array (the same on every host) as a jax.Array with the dtype and sharding of
  `target` (a jax.Array or a ShapeDtypeStruct; the first local device without a sharding)."""
  value = value.astype(target.dtype)
  sharding = getattr(target, "sharding", None) or jax.sharding.SingleDeviceSharding(
      jax.local_devices()[0])
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
