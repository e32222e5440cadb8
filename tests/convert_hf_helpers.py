"""Shared by the tests of bertjax.convert against transformers (test_convert_hf_*.py).

Small randomly initialised transformers models are saved to temporary directories, converted,
and run side by side on the same padded segment-pair batch; `_close` is agreement within ATOL
(float32, eval mode / deterministic=True). `pretraining` is a module-scoped fixture: a test
module imports it to get its own saved BertForPreTraining.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from bertjax.convert import hf, hf_files
from bertjax.models import bert, heads

ATOL = 1e-5
VOCAB = 99
MASK_ID = 4  # any id; the random model has no real [MASK]


def _hf_config(**overrides):
  return transformers.BertConfig(**{**dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37,
                                           max_position_embeddings=64), **overrides})


def _save_hf(cls, directory, seed=0, **config_overrides):
  """A seeded random transformers model `cls`, saved (safetensors) to `directory`."""
  torch.manual_seed(seed)
  model = cls(_hf_config(**config_overrides)).eval()
  model.save_pretrained(str(directory))
  return model, str(directory)


def _convert(directory):
  config = hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  params, report = hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  return params, config, report


def _batch():
  """[3, 12] ids, segment pairs (A then B) and padding of different lengths (0 = pad)."""
  rng = np.random.RandomState(0)
  lengths = [12, 9, 5]
  ids = rng.randint(5, VOCAB, (3, 12))
  mask = (np.arange(12)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
  segments = np.zeros_like(ids)
  for row, length in enumerate(lengths):
    segments[row, length // 2:length] = 1
  ids = ids * mask
  ids[:, 2] = MASK_ID
  ids[0, 7] = MASK_ID
  return ids, segments, mask


def _torch_out(model, ids, segments, mask):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(segments), output_hidden_states=True)


def _close(ours, theirs):
  np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), rtol=0, atol=ATOL)


def _close_mlm(ours, theirs, config):
  """bertjax's MLM logits [..., padded_vocab_size] = transformers' [..., vocab_size] within ATOL
  on the real columns; the padding columns are float32 min (never predicted)."""
  ours = np.asarray(ours)
  assert ours.shape == tuple(theirs.shape[:-1]) + (config.padded_vocab_size,)
  assert (ours[..., config.vocab_size:] == np.finfo(np.float32).min).all()
  _close(ours[..., :config.vocab_size], theirs)


def _assert_encoder_parity(params, config, torch_out, batch, pooler=True):
  ids, segments, mask = batch
  out = bert.BertEncoder(config, use_pooler=pooler).apply(
      {"params": params["bert"]}, ids, segments, mask, deterministic=True,
      output_hidden_states=True)
  assert len(out.hidden_states) == len(torch_out.hidden_states) == config.num_layers + 1
  for ours, theirs in zip(out.hidden_states, torch_out.hidden_states):
    _close(ours, theirs)
  _close(out.sequence_output, torch_out.hidden_states[-1])
  if pooler:
    _close(out.pooled_output, torch_out.pooler_output)


def _fresh_params(config, seed=1):
  ids = jnp.zeros((1, 4), jnp.int32)
  variables = heads.BertForPreTraining(config).init(jax.random.PRNGKey(seed), ids, ids, ids,
                                                    deterministic=True)
  return jax.tree.map(np.asarray, nn.unbox(variables)["params"])


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def _assert_trees_equal(a, b):
  fa, fb = _flat(a), _flat(b)
  assert sorted(fa) == sorted(fb)
  for path in fa:
    np.testing.assert_array_equal(np.asarray(fa[path]), np.asarray(fb[path]), err_msg=path)


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
  return _save_hf(transformers.BertForPreTraining, tmp_path_factory.mktemp("pretraining"))
