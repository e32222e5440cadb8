"""bertjax.convert on planted errors in a checkpoint: an unmapped tensor, a layer beyond the
config, a missing tensor, a partial head, a wrong shape, an untied decoder, and bad parameters
to export are each named."""
import numpy as np
import pytest
from flax import traverse_util

from bertjax.convert import hf, hf_files
from bertjax.errors import UserError
from convert_hf_helpers import _flat
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def state_and_config(pretraining):
  _, directory = pretraining
  return (hf_files.load_hf_state_dict(directory),
          hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)))


def test_unmapped_tensor_is_named(state_and_config):
  state, config = state_and_config
  extra = {**state, "bert.encoder.layer.0.attention.self.gate.weight": np.zeros((32, 32))}
  with pytest.raises(UserError, match=r"bert\.encoder\.layer\.0\.attention\.self\.gate\.weight "
                     r"\(32, 32\) matches no rule"):
    hf.from_hf(extra, config)
  with pytest.raises(UserError, match=r"foo\.weight"):
    hf.from_hf({**state, "foo.weight": np.zeros(3)}, config)


def test_layer_beyond_config_is_named(state_and_config):
  state, config = state_and_config
  extra = {**state, "bert.encoder.layer.2.output.dense.bias": np.zeros(32)}
  with pytest.raises(UserError, match=r"layer\.2\.output\.dense\.bias maps to "
                     r"bert/encoder/layer_2/feed_forward/output/bias"):
    hf.from_hf(extra, config)


def test_missing_tensor_is_named(state_and_config):
  state, config = state_and_config
  fewer = {k: v for k, v in state.items() if k != "bert.encoder.layer.1.attention.self.key.bias"}
  with pytest.raises(UserError, match=r"bert\.encoder\.layer\.1\.attention\.self\.key\.bias is "
                     r"not in the checkpoint \(bertjax's bert/encoder/layer_1/attention/key/bias "
                     r"\(32,\)\)"):
    hf.from_hf(fewer, config)
  # A checkpoint whose names carry no prefix (BertModel's) is answered in its own names.
  bare = {k[len("bert."):]: v for k, v in fewer.items() if k.startswith("bert.")}
  with pytest.raises(UserError, match=r"\): encoder\.layer\.1\.attention\.self\.key\.bias is not"):
    hf.from_hf(bare, config)


def test_partial_head_is_named(state_and_config):
  state, config = state_and_config
  fewer = {k: v for k, v in state.items() if k != "cls.seq_relationship.bias"}
  with pytest.raises(UserError, match=r"cls\.seq_relationship\.bias is not in the checkpoint "
                     r"\(bertjax's next_sentence/classifier/bias \(2,\)\), though other "
                     "parameters of next_sentence/ are"):
    hf.from_hf(fewer, config)


def test_wrong_shape_is_named(state_and_config):
  state, config = state_and_config
  wrong = {**state, "bert.encoder.layer.0.intermediate.dense.weight": np.zeros((36, 32))}
  with pytest.raises(UserError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight "
                     r"\(36, 32\) -> bert/encoder/layer_0/feed_forward/intermediate/kernel "
                     r"\(32, 36\) \(transpose\), the model expects \(32, 37\)"):
    hf.from_hf(wrong, config)


def test_untied_decoder_is_refused(state_and_config):
  state, config = state_and_config
  untied = {**state, "cls.predictions.decoder.weight":
            state["bert.embeddings.word_embeddings.weight"] + 1.0}
  with pytest.raises(UserError, match="cls.predictions.decoder.weight differs from the word "
                     "embeddings"):
    hf.from_hf(untied, config)


def test_to_hf_errors_name_the_parameter(state_and_config):
  state, config = state_and_config
  params, _ = hf.from_hf(state, config)
  flat = _flat(params)
  flat["bert/pooler/dense/kernel"] = np.zeros((32, 31), np.float32)
  del flat["bert/encoder/layer_0/attention/query/bias"]
  with pytest.raises(UserError, match=r"bert/pooler/dense/kernel \(32, 31\), the config "
                     r"expects \(32, 32\).*layer_0/attention/query/bias \(32,\) is missing"):
    hf.to_hf(traverse_util.unflatten_dict(flat, sep="/"), config)
