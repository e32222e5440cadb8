"""bertjax.models.dropout: flax's Dropout's job with one 32-bit draw for two elements of a row,
or one threefry hash for four (model.dropout_per_hash=4). (That the default draws no bits on
another device is tests/test_audit.py's data-parallel contract; four a hash is checked here.)"""
import dataclasses
import sys

import jax
import jax.extend.random  # pylint: disable=unused-import
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.models.dropout import Dropout, keep_mask
from conftest import cpu_env
import warm_python


def test_each_element_is_dropped_at_the_rate_independently_and_the_two_halves_alike():
  keep = np.asarray(keep_mask(jax.random.PRNGKey(3), (1000, 2001), 0.1))
  dropped = 1 - keep.mean()
  rate = round(0.1 * 65536) / 65536
  assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / keep.size)
  half = 1001  # of each row: the low halves of its draws, then the high ones
  low, high = keep[:, :half - 1], keep[:, half:]  # element j and j + 1001 share a draw
  assert abs((1 - low.mean()) - (1 - high.mean())) < 0.003
  both = np.mean(~low & ~high)  # one draw's two halves dropped together: rate**2 if independent
  assert abs(both - rate**2) < 0.002
  rows = np.mean(~keep[:-1] & ~keep[1:])  # neighbouring rows: other draws
  assert abs(rows - rate**2) < 0.002


def test_one_32_bit_draw_decides_two_elements_of_a_row():
  jaxpr = str(jax.make_jaxpr(lambda k: keep_mask(k, (2, 3, 7), 0.1))(jax.random.PRNGKey(0)))
  assert "shape=(2, 3, 4)" in jaxpr and "random_bits" in jaxpr
  keep = np.asarray(keep_mask(jax.random.PRNGKey(0), (2, 3, 7), 0.5))
  bits = np.asarray(jax.random.bits(jax.random.PRNGKey(0), (2, 3, 4), jnp.uint32))
  halves = np.concatenate([bits & 0xFFFF, bits >> 16], axis=-1)[..., :7]
  np.testing.assert_array_equal(keep, halves >= 32768)


def test_the_bfloat16_output_keeps_the_expectation():
  """The scale 1 / (1 - rate) in float32, the product rounded once: kept elements are within
  half a bfloat16 step of x / (1 - rate), and their sum within 0.02% of it; a bfloat16 scale
  (1.109375 for 1.111...) would make it 0.16% low."""
  x = jax.random.uniform(jax.random.PRNGKey(1), (512, 1024), minval=1.0, maxval=2.0)
  x = x.astype(jnp.bfloat16)
  y = Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
  assert y.dtype == jnp.bfloat16
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
  kept = y64 != 0
  exact = x64[kept] * 65536 / (65536 - round(0.1 * 65536))
  np.testing.assert_allclose(y64[kept], exact, rtol=2**-8)
  assert abs(y64[kept].sum() / exact.sum() - 1) < 2e-4


def test_dropout_keeps_the_expectation_and_is_the_identity_when_deterministic():
  x = jnp.linspace(-2.0, 3.0, 400_000).reshape(400, 1000)
  layer = Dropout(0.1)
  y = layer.apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(7)})
  y, x_np = np.asarray(y), np.asarray(x)
  kept = y != 0
  scale = 65536 / (65536 - round(0.1 * 65536))
  np.testing.assert_allclose(y[kept], x_np[kept] * scale, rtol=1e-6)
  assert abs(y.mean() - x_np.mean()) < 0.01
  np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)
  other = Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(8)})
  assert not np.array_equal(np.asarray(other) != 0, kept)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dropout_keeps_the_dtype(dtype):
  x = jnp.ones((4, 6), dtype)
  y = Dropout(0.5).apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})
  assert y.dtype == dtype and y.shape == x.shape


def test_four_elements_a_threefry_hash():
  """model.dropout_per_hash=4: both words of each hash of a position's index, 16 bits an
  element, elements j, j + m, j + 2m, j + 3m (m = ceil(n / 4)) of a row; the rate and the
  independence as with two; half the hashes; rbg keys draw as with two."""
  key = jax.random.key(3)
  keep = np.asarray(keep_mask(key, (1000, 2001), 0.1, per_hash=4))
  rate = round(0.1 * 65536) / 65536
  assert abs((1 - keep.mean()) - rate) < 4 * np.sqrt(rate * (1 - rate) / keep.size)
  m = 501  # the last quarter has 2001 - 3 * 501 = 498: element j of each, j < 498
  quarters = [keep[:, i * m:i * m + 498] for i in range(4)]
  for a in range(4):
    for b in range(a + 1, 4):
      assert abs(np.mean(~quarters[a] & ~quarters[b]) - rate**2) < 0.002, (a, b)
  jaxpr = str(jax.make_jaxpr(lambda k: keep_mask(k, (2, 3, 7), 0.1, per_hash=4))(key))
  assert "threefry2x32" in jaxpr and "shape=(2, 3, 2)" in jaxpr and "random_bits" not in jaxpr
  data = np.asarray(jax.random.key_data(key))
  index = np.arange(12, dtype=np.uint32).reshape(2, 3, 2)
  hi, lo = (np.asarray(w) for w in jax.extend.random.threefry2x32_p.bind(
      data[0], data[1], np.zeros_like(index), index))
  halves = np.concatenate([hi & 0xFFFF, hi >> 16, lo & 0xFFFF, lo >> 16], axis=-1)[..., :7]
  np.testing.assert_array_equal(keep_mask(key, (2, 3, 7), 0.5, per_hash=4), halves >= 32768)
  two = np.asarray(keep_mask(key, (64, 256), 0.1))
  assert (np.asarray(keep_mask(key, (64, 256), 0.1, per_hash=4)) != two).mean() > 0.1
  rbg = jax.random.key(3, impl="rbg")
  np.testing.assert_array_equal(keep_mask(rbg, (8, 9), 0.3, per_hash=4),
                                keep_mask(rbg, (8, 9), 0.3))


def test_four_a_hash_draws_on_each_device_its_shard():
  """On 4 devices, the mask of a batch-sharded array is computed where its shard is: the
  compiled program moves nothing between devices."""
  script = (
      "import jax, numpy as np\n"
      "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
      "from bertjax.models.dropout import keep_mask\n"
      "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
      "f = jax.jit(lambda k: keep_mask(k, (8, 16, 128), 0.1, per_hash=4),\n"
      "            out_shardings=NamedSharding(mesh, P('data')))\n"
      "print(f.lower(jax.random.key(0)).compile().as_text())\n")
  out = warm_python.run([sys.executable, "-c", script], env=cpu_env(4), timeout=300, check=True)
  assert "threefry" in out.stdout or "xor" in out.stdout  # the hash is in the program
  for collective in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
    assert collective not in out.stdout, collective


def test_a_model_with_four_a_hash():
  config = bert_config("tiny", vocab_size=64, dropout_rate=0.1, attention_dropout_rate=0.1,
                       max_position_embeddings=16)
  ids = np.tile(np.arange(5, 21, dtype=np.int32), (2, 1))
  outputs = {}
  for per_hash in (2, 4):
    model = heads.BertForPreTraining(dataclasses.replace(config, dropout_per_hash=per_hash))
    params = model.init(jax.random.key(0), ids, ids * 0, ids * 0 + 1, deterministic=True)
    outputs[per_hash] = np.asarray(model.apply(
        params, ids, ids * 0, ids * 0 + 1, deterministic=False,
        rngs={"dropout": jax.random.key(1)})[0])
  assert np.isfinite(outputs[4]).all() and not np.allclose(outputs[2], outputs[4])
  with pytest.raises(ValueError, match="dropout_per_hash=3; use 2 or 4"):
    dataclasses.replace(config, dropout_per_hash=3)
