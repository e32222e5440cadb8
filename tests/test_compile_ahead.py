"""bertjax.training.compile_ahead: steps compiled ahead per batch shape, and the shapes a run will meet."""
import itertools
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.training import compile_ahead, parallel
from bertjax.data.pipeline import FeatureBatches


def _weighted_sum(weights, batch):
  return jnp.sum(batch["x"] * weights) + jnp.sum(batch["y"])


def _batch(rows, width):
  return {"x": np.arange(rows * width, dtype=np.float32).reshape(rows, width) / 7,
          "y": np.ones(rows, np.int32)}


def test_prepared_shapes_run_their_ahead_compiled_executable_and_others_go_through_jit():
  mesh = parallel.make_mesh(-1, 1, 1)
  jitted = jax.jit(_weighted_sum)
  weights = jnp.float32(3.0)
  leading = jax.ShapeDtypeStruct((), jnp.float32, sharding=parallel.replicated(mesh))
  with compile_ahead.pool() as executor:
    step = compile_ahead.PerShape(jitted, leading, mesh, executor)
    step.prepare([_batch(4, 8), _batch(4, 16), _batch(4, 8)])
    for width in (8, 16):
      batch = _batch(4, width)
      got = step(jax.device_put(weights, parallel.replicated(mesh)),
                 parallel.global_batch(batch, mesh))
      np.testing.assert_allclose(got, 3 * batch["x"].sum() + 4, rtol=1e-6)
    assert jitted._cache_size() == 0  # pylint: disable=protected-access
    other = _batch(4, 24)
    got = step(jax.device_put(weights, parallel.replicated(mesh)),
               parallel.global_batch(other, mesh))
    np.testing.assert_allclose(got, 3 * other["x"].sum() + 4, rtol=1e-6)
    assert jitted._cache_size() == 1  # pylint: disable=protected-access


def test_signature_counts_the_global_rows_and_canonical_dtypes():
  local = {"x": np.zeros((4, 8), np.int64), "y": np.zeros(4, np.float32)}
  assert compile_ahead.signature(local, hosts=2) == (("x", (8, 8), "int32"),
                                                      ("y", (8,), "float32"))


def test_distinct_shapes_of_bucketed_batches_are_the_widths_an_epoch_meets():
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 60, size=96)
  mask = (np.arange(64)[None, :] < lengths[:, None]).astype(np.int32)
  features = {"input_ids": mask * 5, "segment_ids": 0 * mask, "input_mask": mask,
              "label": np.zeros(96, np.int32)}
  batches = FeatureBatches(features, batch_size=8, seed=0, length_buckets=(16, 32, 48))
  epoch = [batch for (batch, _), _ in zip(batches.iterate(None), range(12))]
  samples = compile_ahead.distinct_shapes(
      itertools.islice((batch for batch, _ in batches.iterate(None)), 12))
  widths = [batch["input_ids"].shape[1] for batch in samples]
  assert sorted(widths) == sorted({batch["input_ids"].shape[1] for batch in epoch})
  assert len(widths) == len(set(widths)) > 1
  assert widths[0] == epoch[0]["input_ids"].shape[1]  # the first step's shape first
