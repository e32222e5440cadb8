"""GradCache (bertjax.embedding.grad_cache) on a one-layer BERT with mean pooling and dropout on: the
loss and every parameter's gradient, computed a chunk at a time, equal those of the whole batch
differentiated at once (the same dropout keys), for chunks of 2 rows of a batch of 8; without
dropout, those of the plain full-batch embedding (chunks of 4); a chunk that does not divide the
batch is refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.embedding import grad_cache, losses
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.models.config import BertConfig

BATCH, SEQ = 8, 12


def _assert_close(ours, theirs, where: str):
  """Within 1e-5 of the tensor's largest entry (float32 sums in another order)."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max() + 1e-7, where


def _setup(dropout: float):
  config = BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4,
                      intermediate_size=37, max_position_embeddings=64, dropout_rate=dropout,
                      attention_dropout_rate=dropout)
  encoder = heads.make_encoder(config, use_pooler=False)
  rng = np.random.default_rng(0)
  inputs = {}
  for column in ("anchor", "positive", "negative"):
    lengths = rng.integers(3, SEQ + 1, BATCH)
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    inputs[column] = {"input_ids": rng.integers(5, 50, (BATCH, SEQ)).astype(np.int32) * mask,
                      "input_mask": mask}
  params = encoder.init(jax.random.key(0), inputs["anchor"]["input_ids"],
                        deterministic=True)["params"]

  def embed(params, chunk, key):
    out = {}
    for k, (column, x) in enumerate(sorted(chunk.items())):
      hidden = encoder.apply({"params": params}, x["input_ids"], None, x["input_mask"],
                             deterministic=dropout == 0.0,
                             rngs={"dropout": jax.random.fold_in(key, k)}).sequence_output
      weights = x["input_mask"][..., None].astype(jnp.float32)
      out[column] = jnp.sum(hidden * weights, 1) / jnp.sum(weights, 1)  # mean pooling
    return out

  def loss(_, embeddings):  # no parameters of its own
    return losses.in_batch_softmax(embeddings["anchor"],
                                   [embeddings["positive"], embeddings["negative"]])

  return embed, loss, params, inputs


def test_chunked_gradients_equal_the_whole_batch(chunk_size=2):
  embed, loss, params, inputs = _setup(dropout=0.1)
  rng = jax.random.key(7)

  def whole(p):  # the same chunks and keys, one graph: what GradCache must reproduce
    chunks, count = grad_cache.chunked(inputs, chunk_size)
    keys = jnp.stack([jax.random.fold_in(rng, i) for i in range(count)])
    parts = jax.vmap(embed, in_axes=(None, 0, 0))(p, chunks, keys)  # [count, chunk_size, dim]
    return loss(p, jax.tree.map(lambda e: e.reshape(-1, e.shape[-1]), parts))

  (expected, expected_grads), (value, grads) = jax.jit(lambda p: (  # one program to compile
      jax.value_and_grad(whole)(p), grad_cache.value_and_grad(embed, loss, p, inputs, rng,
                                                              chunk_size)))(params)
  assert float(value) == pytest.approx(float(expected), rel=1e-6)
  for path, (a, b) in zip(jax.tree_util.tree_leaves_with_path(grads),
                          zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads))):
    _assert_close(a, b, jax.tree_util.keystr(path[0]))
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-3  # a real gradient


def test_without_dropout_it_is_the_plain_full_batch_gradient():
  embed, loss, params, inputs = _setup(dropout=0.0)
  rng = jax.random.key(0)
  (expected, expected_grads), (value, grads) = jax.jit(lambda p: (  # one program to compile
      jax.value_and_grad(lambda p: loss(p, embed(p, inputs, rng)))(p),
      grad_cache.value_and_grad(embed, loss, p, inputs, rng, chunk_size=4)))(params)
  assert float(value) == pytest.approx(float(expected), rel=1e-6)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    _assert_close(a, b, "")


def test_a_chunk_that_does_not_divide_the_batch_is_refused():
  embed, loss, params, inputs = _setup(dropout=0.0)
  with pytest.raises(UserError, match="a GradCache chunk of 3 rows does not divide the batch "
                     r"of 8; give a chunk size that divides it \(e.g. 8\)"):
    grad_cache.value_and_grad(embed, loss, params, inputs, jax.random.key(0), chunk_size=3)
