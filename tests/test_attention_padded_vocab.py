"""The padded vocabulary (BertConfig.padded_vocab_size): the padded columns of the MLM logits
get no probability mass and leave the loss, the real logits and the real rows' gradients as the
unpadded model's."""
import jax
import numpy as np
from flax import traverse_util

from bertjax.models import heads

from attention_helpers import (CONFIG, _params, _run, _with, assert_close, jit,
                               pretraining_loss, unpacked_batch)


def test_padded_vocabulary_columns_get_no_mass_and_leave_the_loss_unchanged():
  """101 real rows padded to 128 vs the same real rows unpadded: equal real logits, loss and
  real-row gradients; padded logits float32 min, softmax 0, gradients 0."""
  vocab, padded = CONFIG.vocab_size, CONFIG.padded_vocab_size
  assert (vocab, padded) == (101, 128)
  params = _params("pretraining")
  flat = traverse_util.flatten_dict(params, sep="/")
  rows = ("bert/embeddings/word_embeddings/embedding", "masked_lm/output_bias")
  assert all(flat[name].shape[0] == padded for name in rows)
  unpadded = traverse_util.unflatten_dict(
      {k: v[:vocab] if k in rows else v for k, v in flat.items()}, sep="/")
  batch = unpacked_batch()

  def loss(params):
    outputs = heads.apply_to_batch(heads.BertForPreTraining(_with(pad_vocab_to_multiple=1)),
                                   params, batch, deterministic=True)
    return pretraining_loss(outputs, batch), outputs

  (loss_u, (mlm_u, nsp_u)), grads_u = jit(jax.value_and_grad(loss, has_aux=True))(unpadded)
  ((mlm_p, nsp_p), grads_p), _ = _run("pretraining", "reference")  # the padded model
  loss_p = pretraining_loss((mlm_p, nsp_p), batch)
  assert mlm_p.shape[-1] == padded and mlm_u.shape[-1] == vocab
  assert_close(mlm_p[..., :vocab], mlm_u, 1e-5)
  np.testing.assert_array_equal(mlm_p[..., vocab:], np.finfo(np.float32).min)
  np.testing.assert_array_equal(jax.nn.softmax(mlm_p)[..., vocab:], 0.0)
  assert int(np.asarray(mlm_p).argmax(-1).max()) < vocab
  assert_close(nsp_p, nsp_u, 1e-5)
  np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)

  flat_p = traverse_util.flatten_dict(grads_p, sep="/")
  flat_u = traverse_util.flatten_dict(grads_u, sep="/")
  for name, g in flat_p.items():
    if name in rows:
      np.testing.assert_array_equal(g[vocab:], 0.0)
      g = g[:vocab]
    assert_close(g, flat_u[name], 1e-5, name)
