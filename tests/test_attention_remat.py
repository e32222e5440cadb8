"""Rematerialization (BertConfig.remat 'full' and 'dots'): with dropout on, the same loss and
gradients as without remat, and each layer one checkpointed call with the policy remat names."""
import functools

import jax
import numpy as np
import pytest

from bertjax.models import heads

from attention_helpers import (CONFIG, _assert_trees_close, _params, _with, jit,
                               pretraining_loss, unpacked_batch)


DROPOUT = _with(dropout_rate=0.1, attention_dropout_rate=0.1)  # remat must replay the masks


@functools.cache
def _loss_and_grads(remat):
  """Loss and gradients of BertForPreTraining(DROPOUT, remat) with dropout on, same rng."""
  model = heads.BertForPreTraining(_with(DROPOUT, remat=remat))
  batch = unpacked_batch()

  def loss(params):
    outputs = heads.apply_to_batch(model, params, batch, deterministic=False,
                                   rngs={"dropout": jax.random.key(7)})
    return pretraining_loss(outputs, batch)

  return jit(jax.value_and_grad(loss))(_params("pretraining"))


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat):
  loss, grads = _loss_and_grads(remat)
  expected_loss, expected_grads = _loss_and_grads("none")
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  _assert_trees_close(grads, expected_grads, 1e-6)
  assert jax.tree.structure(grads) == jax.tree.structure(expected_grads)  # same names

  # Each layer is one checkpointed call, with the policy remat names.
  model = heads.BertForPreTraining(_with(DROPOUT, remat=remat))
  batch = unpacked_batch()
  jaxpr = jax.make_jaxpr(lambda p: heads.apply_to_batch(model, p, batch, deterministic=True))(
      _params("pretraining"))
  policies = [e.params["policy"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "remat2"]
  expected_policy = {"full": None,
                     "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}[remat]
  assert policies == [expected_policy] * CONFIG.num_layers
