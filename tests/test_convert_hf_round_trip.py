"""bertjax.convert's round trips, bit for bit: Hugging Face -> bertjax -> Hugging Face and
bertjax -> Hugging Face -> bertjax; and every bertjax parameter (encoder, pretraining and task
heads) has a rule."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.convert import hf, hf_files, hf_rules
from bertjax.models.config import BertConfig
from convert_hf_helpers import VOCAB, _assert_trees_equal, _convert, _flat, _fresh_params
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)


def test_round_trip_hf_bertjax_hf(pretraining):
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  params, config, _ = _convert(directory)
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)


def test_round_trip_bertjax_hf_bertjax():
  config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position_embeddings=64)
  params = _fresh_params(config, seed=7)
  tensors = hf.to_hf(params, config)
  assert "cls.predictions.decoder.weight" not in tensors  # tied
  back, report = hf.from_hf(tensors, config)
  _assert_trees_equal(back, params)
  assert report.missing == [] and report.ignored == [] and report.task is None


def test_every_bertjax_parameter_has_a_rule():
  config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=37, max_position_embeddings=64)
  assert len(hf.to_hf(_fresh_params(config), config)) == len(hf.expected_shapes(config))
  for task, head in hf_rules.TASK_HEADS.items():
    ids = jnp.zeros((1, 2, 4) if head.choices else (1, 4), jnp.int32)
    variables = head.model(config, 3).init(jax.random.PRNGKey(0), ids, ids, ids,
                                           deterministic=True)
    params = jax.tree.map(np.asarray, nn.unbox(variables)["params"])
    assert hf.params_task(params)[0] == task
    tensors = hf.to_hf(params, config)
    assert len(tensors) == len(_flat(params))
    assert {f"{head.hf_prefix}.weight", f"{head.hf_prefix}.bias"} <= set(tensors)
