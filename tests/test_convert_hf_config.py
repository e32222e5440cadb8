"""bertjax.convert's config translation: Hugging Face config.json <-> BertConfig both ways,
the GELU variants, and the configs it refuses."""
import pytest
import transformers

from bertjax.convert import hf_files
from bertjax.errors import UserError
from convert_hf_helpers import VOCAB, _hf_config
from convert_hf_helpers import pretraining  # noqa: F401  (the fixture)


def test_config_both_ways(pretraining):
  _, directory = pretraining
  config = hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
          config.intermediate_size, config.max_position_embeddings) == (VOCAB, 32, 2, 4, 37, 64)
  assert config.hidden_act == "gelu"
  assert hf_files.hf_config_to_bert_config(hf_files.bert_config_to_hf_config(config)) == config
  # transformers reads what we write
  hf_config = transformers.BertConfig(**hf_files.bert_config_to_hf_config(config))
  assert hf_config.num_hidden_layers == 2 and hf_config.hidden_act == "gelu"


@pytest.mark.parametrize("act,ours", [("gelu", "gelu"), ("gelu_new", "gelu_tanh"),
                                      ("gelu_pytorch_tanh", "gelu_tanh")])
def test_config_activations(act, ours):
  assert hf_files.hf_config_to_bert_config(_hf_config(hidden_act=act).to_dict()).hidden_act == ours


@pytest.mark.parametrize("change,named", [
    (dict(hidden_act="relu"), "hidden_act='relu'"),
    (dict(model_type="roberta"), "model_type='roberta'"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(is_decoder=True), "is_decoder"),
    (dict(num_attention_heads=5), "num_heads"),
])
def test_config_errors(change, named):
  with pytest.raises(UserError, match=named):
    hf_files.hf_config_to_bert_config({**_hf_config().to_dict(), **change})
