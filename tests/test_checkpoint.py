"""Tests of bertjax.training.checkpoint and bertjax.modeldir.saved_params on a tiny flax model +
optax
state (CPU, a few seconds)."""
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bertjax.training import checkpoint, optim
from bertjax.modeldir import layout, saved_params
from bertjax.errors import UserError

from conftest import cpu_env, tree_digest
import warm_python


class _Tiny(nn.Module):
  """Dense(hidden) -> LayerNorm -> Dense(outputs) named `head`."""
  hidden: int = 4
  head: str = "mlm"
  outputs: int = 2

  @nn.compact
  def __call__(self, x):  # [batch, 3] -> [batch, outputs]
    x = nn.Dense(self.hidden, name="dense")(x)
    x = nn.LayerNorm(name="layer_norm")(x)
    return nn.Dense(self.outputs, name=self.head)(x)


def _state(hidden=4, head="mlm", seed=0, outputs=2):
  """The trainer's state dict after one optimizer step, so every leaf holds distinct values."""
  params = _Tiny(hidden, head, outputs).init(jax.random.PRNGKey(seed),
                                             jnp.ones((1, 3)))["params"]
  tx, _ = optim.make_optimizer(num_train_steps=10, warmup_steps=0)
  opt_state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return dict(step=jnp.asarray(seed + 1, jnp.int32), params=optax.apply_updates(params, updates),
              opt_state=opt_state, rng=jax.random.PRNGKey(seed + 100))


def _abstract(state, sharding=None):
  sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)




def _save(directory, steps, state=None, **kwargs):
  with checkpoint.Checkpoints(directory, save_every_steps=kwargs.pop("every", 1),
                              keep=kwargs.pop("keep", None)) as checkpoints:
    return [checkpoints.save(s, state or _state(), {"epoch": 0, "index": s}, **kwargs)
            for s in steps]


def test_round_trip_of_state_and_data_position(tmp_path):
  state = _state()
  position = {"epoch": 1, "index": 17, "files": ["a.txt", "b.txt"], "rng": None}
  directory = tmp_path / "checkpoints"
  with checkpoint.Checkpoints(directory, save_every_steps=1, keep=3) as checkpoints:
    assert checkpoints.latest_step() is None
    assert checkpoints.save(5, state, position)
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=3)
  assert checkpoints.latest_step() == 5
  restored, restored_position = checkpoints.restore(_abstract(state))
  _assert_trees_equal(restored, state)  # also the optax namedtuples
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(restored))
  assert restored_position == position
  checkpoints.close()


def test_restore_without_checkpoint_raises(tmp_path):
  checkpoints = checkpoint.Checkpoints(tmp_path / "none", save_every_steps=1, keep=1)
  with pytest.raises(UserError, match="no checkpoint"):
    checkpoints.restore(_abstract(_state()))
  assert not (tmp_path / "none").exists()  # opening does not create the directory


def test_keeps_the_last_k(tmp_path):
  directory = tmp_path / "checkpoints"
  assert _save(directory, [1, 2, 3, 4], keep=2) == [True] * 4
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=2)
  assert checkpoints.all_steps() == [3, 4]
  assert sorted(p.name for p in directory.iterdir()) == ["3", "4"]


def test_save_every_steps_and_force(tmp_path):
  directory = tmp_path / "checkpoints"
  assert _save(directory, range(1, 8), every=3) == [False, False, True, False, False, True, False]
  with checkpoint.Checkpoints(directory, save_every_steps=3, keep=None) as checkpoints:
    assert checkpoints.all_steps() == [3, 6]
    assert checkpoints.save(7, _state(), None, force=True)  # end of run / preemption
    checkpoints.wait()
    before = tree_digest(directory / "7")
    # The same step again (e.g. preemption at the last step) is not written twice.
    assert not checkpoints.save(7, _state(seed=3), None, force=True)
  assert tree_digest(directory / "7") == before
  assert checkpoint.Checkpoints(directory, save_every_steps=3, keep=None).all_steps() == [3, 6, 7]


@pytest.mark.parametrize("other, expected_in_message", [
    (dict(hidden=6), "params/dense/kernel: (3, 4) in the checkpoint, (3, 6) in the model"),
    (dict(head="classifier"), "params/classifier/kernel: (4, 2) in the model, absent from"),
])
def test_mismatched_model_raises_and_changes_nothing(tmp_path, other, expected_in_message):
  directory = tmp_path / "checkpoints"
  _save(directory, [2])
  before = tree_digest(tmp_path)
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=1)
  with pytest.raises(UserError) as error:
    checkpoints.restore(_abstract(_state(**other)))
  message = str(error.value)
  assert expected_in_message in message
  assert "different model" in message and "--workdir" in message
  checkpoints.close()
  assert tree_digest(tmp_path) == before


def test_restore_into_a_named_sharding(tmp_path):
  state = _state()
  directory = tmp_path / "checkpoints"
  _save(directory, [1], state=state)
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = NamedSharding(mesh, P())
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=1)
  restored, _ = checkpoints.restore(_abstract(state, sharding))
  assert all(x.sharding == sharding for x in jax.tree.leaves(restored))
  _assert_trees_equal(restored, state)


@pytest.mark.parametrize("where", ["workdir", "checkpoints", "step"])
def test_load_params_from_workdir_checkpoints_or_step(tmp_path, where):
  saved = _state(seed=1)
  _save(tmp_path / "checkpoints", [1], state=_state(seed=2))
  _save(tmp_path / "checkpoints", [3], state=saved)
  path = {"workdir": tmp_path, "checkpoints": tmp_path / "checkpoints",
          "step": tmp_path / "checkpoints" / "3"}[where]
  target = _state(seed=5)["params"]
  params, report = saved_params.load_params(path, target)
  _assert_trees_equal(params, saved["params"])  # the latest step, not step 1
  assert report.missing == [] and report.unused == []
  assert report.step_dir.endswith("3")


def test_load_params_reports_missing_and_unused(tmp_path):
  saved = _state(head="mlm", seed=1)
  _save(tmp_path / "checkpoints", [1], state=saved)
  target = _state(head="classifier", seed=7)["params"]
  params, report = saved_params.load_params(tmp_path, target)
  assert report.missing == ["classifier/bias", "classifier/kernel"]
  assert report.unused == ["mlm/bias", "mlm/kernel"]
  assert report.loaded == ["dense/bias", "dense/kernel", "layer_norm/bias", "layer_norm/scale"]
  assert jax.tree.structure(params) == jax.tree.structure(target)
  for name in ("dense", "layer_norm"):
    _assert_trees_equal(params[name], saved["params"][name])
  _assert_trees_equal(params["classifier"], target["classifier"])  # kept fresh


def test_load_params_keeps_a_head_of_other_shape_fresh_when_asked(tmp_path):
  """A classifier for 2 labels does not fit a 3-label task: fresh_on_mismatch keeps the new
  head fresh (reported as replaced) and still loads the rest; without it, an error."""
  saved = _state(head="classifier", seed=1, outputs=2)
  _save(tmp_path / "checkpoints", [1], state=saved)
  target = _state(head="classifier", seed=7, outputs=3)["params"]
  with pytest.raises(UserError, match=r"classifier/kernel: \(4, 2\) in the checkpoint, \(4, 3\)"):
    saved_params.load_params(tmp_path, target)
  params, report = saved_params.load_params(tmp_path, target, fresh_on_mismatch=("classifier/",))
  assert report.replaced == ["classifier/bias", "classifier/kernel"] and report.missing == []
  assert report.loaded == ["dense/bias", "dense/kernel", "layer_norm/bias", "layer_norm/scale"]
  _assert_trees_equal(params["classifier"], target["classifier"])
  _assert_trees_equal(params["dense"], saved["params"]["dense"])
  with pytest.raises(UserError, match=r"dense/kernel: \(3, 4\) in the checkpoint, \(3, 6\)"):
    saved_params.load_params(tmp_path, _state(hidden=6, head="classifier", outputs=3)["params"],
                           fresh_on_mismatch=("classifier/",))  # only the head may differ


def test_load_params_shape_mismatch_and_bad_paths(tmp_path):
  _save(tmp_path / "checkpoints", [1])
  with pytest.raises(UserError, match=r"dense/kernel: \(3, 4\) in the checkpoint, \(3, 6\)"):
    saved_params.load_params(tmp_path, _state(hidden=6)["params"])
  with pytest.raises(UserError, match="does not exist"):
    saved_params.load_params(tmp_path / "nowhere", _state()["params"])
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match="no checkpoint found"):
    saved_params.load_params(tmp_path / "empty", _state()["params"])


_EMBEDDING, _BIAS = saved_params.VOCAB_ROW_PARAMS  # [rows, hidden], [rows]


def _vocab_params(rows, seed=0, hidden=3):
  """A word-embedding table [rows, hidden], an MLM bias [rows] and a dense kernel, every entry
  non-zero (padding rows too, as a trained model's may be)."""
  rng = np.random.default_rng(seed)
  value = lambda *shape: jnp.asarray(rng.uniform(1, 2, shape), jnp.float32)
  return {"bert": {"embeddings": {"word_embeddings": {"embedding": value(rows, hidden)}}},
          "masked_lm": {"output_bias": value(rows)}, "dense": {"kernel": value(hidden, 2)}}


@pytest.mark.parametrize("saved_rows", [11, 12, 32], ids=["unpadded", "padded-4", "padded-32"])
def test_load_params_pads_or_strips_the_vocabulary_rows(tmp_path, saved_rows):
  """A vocabulary of 11 tokens saved with 11, 12 or 32 rows loads into a model padded to 16: the
  11 real rows are copied and the model's padding rows are zeros."""
  saved = _vocab_params(saved_rows, seed=1)
  _save(tmp_path / "checkpoints", [1], state={"step": jnp.int32(1), "params": saved})
  target = _vocab_params(16, seed=2)
  params, report = saved_params.load_params(tmp_path, target, vocab_size=11)
  assert report.resized == [_EMBEDDING, _BIAS]
  assert report.loaded == sorted([_EMBEDDING, _BIAS, "dense/kernel"]) and report.replaced == []
  for path in (_EMBEDDING, _BIAS):
    value, original = _flat(params)[path], np.asarray(_flat(saved)[path])
    assert value.shape[0] == 16 and value.dtype == jnp.float32
    np.testing.assert_array_equal(value[:11], original[:11])
    assert not np.asarray(value[11:]).any()
  np.testing.assert_array_equal(params["dense"]["kernel"], saved["dense"]["kernel"])


def test_load_params_other_vocabulary_is_still_a_mismatch(tmp_path):
  """Rows fewer than vocab_size (another vocabulary), another hidden size, or no vocab_size
  given: the shapes differ as before (an error, or fresh values under fresh_on_mismatch)."""
  _save(tmp_path / "checkpoints", [1], state={"step": jnp.int32(1),
                                               "params": _vocab_params(10, seed=1)})
  target = _vocab_params(16, seed=2)
  with pytest.raises(UserError, match=r"word_embeddings/embedding: \(10, 3\) in the checkpoint, "
                     r"\(16, 3\) in the model"):
    saved_params.load_params(tmp_path, target, vocab_size=11)
  params, report = saved_params.load_params(tmp_path, target, ("bert/", "masked_lm/"),
                                          vocab_size=11)
  assert report.replaced == [_EMBEDDING, _BIAS] and report.resized == []
  _assert_trees_equal(params["masked_lm"], target["masked_lm"])
  with pytest.raises(UserError, match=r"output_bias: \(10,\) in the checkpoint, \(16,\)"):
    saved_params.load_params(tmp_path, target)  # no vocab_size: rows must match
  with pytest.raises(UserError, match=r"word_embeddings/embedding: \(10, 3\) in the checkpoint, "
                     r"\(16, 4\) in the model"):
    saved_params.load_params(tmp_path, _vocab_params(16, hidden=4), vocab_size=10)


def _flat(tree):
  return {layout.path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


_TWO_DEVICES = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from bertjax.training import checkpoint
    from bertjax.modeldir import saved_params
    assert jax.device_count() == 2, jax.devices()
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows, cols = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "data"))
    value = np.arange(8, dtype=np.float32).reshape(4, 2)
    state = {"params": {"w": jax.device_put(value, rows)}, "step": jnp.int32(1)}
    with checkpoint.Checkpoints(sys.argv[1], save_every_steps=1, keep=1) as checkpoints:
      checkpoints.save(1, state, {"index": 1})
    abstract = {"params": {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32, sharding=cols)},
                "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))}
    restored, position = checkpoint.Checkpoints(sys.argv[1], save_every_steps=1,
                                                keep=1).restore(abstract)
    assert restored["params"]["w"].sharding == cols, restored["params"]["w"].sharding
    np.testing.assert_array_equal(restored["params"]["w"], value)
    assert position == {"index": 1}
    params, report = saved_params.load_params(sys.argv[1], {"w": jnp.zeros((4, 2))})
    np.testing.assert_array_equal(params["w"], value)
    # Vocabulary rows padded on load (3 real rows of 4 saved -> 6) keep the target's sharding.
    bias = {"masked_lm": {"output_bias": np.arange(1, 5, dtype=np.float32)}}
    with checkpoint.Checkpoints(sys.argv[2], save_every_steps=1, keep=1) as checkpoints:
      checkpoints.save(1, {"params": bias, "step": jnp.int32(1)}, None)
    split = NamedSharding(mesh, P("data"))
    target = {"masked_lm": {"output_bias": jax.device_put(np.ones(6, np.float32), split)}}
    params, report = saved_params.load_params(sys.argv[2], target, vocab_size=3)
    loaded = params["masked_lm"]["output_bias"]
    assert report.resized == ["masked_lm/output_bias"] and loaded.sharding == split
    np.testing.assert_array_equal(loaded, [1, 2, 3, 0, 0, 0])
    print("OK")
""")


def test_save_sharded_restore_resharded_on_two_devices(tmp_path):
  env = cpu_env(2)
  result = warm_python.run([sys.executable, "-c", _TWO_DEVICES, str(tmp_path / "checkpoints"),
                            str(tmp_path / "vocab")], env=env, timeout=120)
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
