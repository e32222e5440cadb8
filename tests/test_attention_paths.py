"""The attention paths and sequence packing against the reference path (bertjax.models.attention,
bertjax.models.bert, bertjax.models.heads) on a tiny float32 model on CPU: the xla path, and
packed batches, give the reference path's outputs per example and the same gradients; the cudnn
path's arguments (run by jax's 'xla' implementation) do too; packing without sequence ids does
not; and a model that takes no packed batches refuses one."""
import functools

import numpy as np
import pytest

from bertjax.models import heads

from attention_helpers import (CONFIG, MODELS, PREDICTIONS, _assert_trees_close, _params, _run,
                               assert_close, jit, packed_batch, real_leaves)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_attention_paths_and_packing_equal_the_reference(model_name):
  """The xla path on the padded batch, and the reference and xla paths on the same examples
  packed, give the reference path's padded outputs per example and the same gradients."""
  packed, where = packed_batch()
  (outputs, expected_grads), _ = _run(model_name, "reference")
  expected = real_leaves(outputs)  # pretraining: mlm [3, P, V], nsp [3, 2]
  for path in ("reference", "xla"):
    (outputs, grads), (packed_outputs, packed_grads) = _run(model_name, path)
    if path != "reference":
      _assert_trees_close(real_leaves(outputs), expected, 1e-5)
      _assert_trees_close(grads, expected_grads, 1e-5)

    packed_outputs = real_leaves(packed_outputs)  # mlm [2, k P, V], nsp [2, k, 2]
    for example, (row, slot) in where.items():
      if model_name == "pretraining":
        predictions = slice(slot * PREDICTIONS, (slot + 1) * PREDICTIONS)
        assert_close(packed_outputs[0][row, predictions], expected[0][example], 1e-5, path)
      assert_close(packed_outputs[-1][row, slot], expected[-1][example], 1e-5, path)
    _assert_trees_close(packed_grads, expected_grads, 1e-5)


def test_cudnn_path_arguments_equal_the_reference():
  """BertForPreTraining by the cudnn path (key_value_seq_lengths on the padded batch), its
  arguments run by the xla implementation: the reference outputs and gradients. (Packed, the
  cudnn path passes the mask the xla path passes: test_dot_product_attention_kwargs_...)"""
  (outputs, grads), = _run("pretraining", "cudnn", ("unpacked",))
  (expected, expected_grads), _ = _run("pretraining", "reference")
  _assert_trees_close(real_leaves(outputs), real_leaves(expected), 1e-5)
  _assert_trees_close(grads, expected_grads, 1e-5)


def test_packing_without_sequence_ids_attends_across():
  """Guards the packing test: the same packed rows without their sequence ids (attention across
  the packed sequences) give the second sequence other logits."""
  packed, where = packed_batch()
  del packed["sequence_ids"]
  model = heads.BertForPreTraining(CONFIG)
  _, nsp = jit(functools.partial(heads.apply_to_batch, model, deterministic=True))(
      _params("pretraining"), packed)
  (_, expected_nsp), _ = _run("pretraining", "reference")[0]
  row, slot = where[1]
  assert np.abs(np.asarray(nsp[row, slot] - expected_nsp[1])).max() > 1e-2


def test_packed_batch_for_a_model_without_packing_is_refused():
  packed, _ = packed_batch()
  model = heads.BertForTokenClassification(CONFIG, 5)
  with pytest.raises(ValueError, match="does not take packed batches"):
    heads.apply_to_batch(model, {}, packed, deterministic=True)
