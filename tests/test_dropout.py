"""bertjax.models.dropout: flax's Dropout's job with one 32-bit draw for two elements."""
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
  flat = keep.reshape(-1)
  half = (flat.size + 1) // 2  # the low halves of the draws, then the high ones
  low, high = flat[:half], flat[half:]
  assert abs((1 - low.mean()) - (1 - high.mean())) < 0.003
  both = np.mean(~low & ~high)  # one draw's two halves dropped together: rate**2 if independent
  assert abs(both - rate**2) < 0.002


def test_one_32_bit_draw_decides_two_elements():
  jaxpr = str(jax.make_jaxpr(lambda k: keep_mask(k, (3, 7), 0.1))(jax.random.PRNGKey(0)))
  assert "shape=(11,)" in jaxpr and "random_bits" in jaxpr


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
