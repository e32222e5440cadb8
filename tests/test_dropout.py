"""bertjax.models.dropout: flax's Dropout's job with one 32-bit draw for two elements of a row.
(That it draws no bits on another device is tests/test_audit.py's data-parallel contract.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.dropout import Dropout, keep_mask


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
