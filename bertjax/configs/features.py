"""Feature extraction: per-token vectors of chosen layers (google-research/bert's
extract_features.py, same output format).

  python -m bertjax.main --config=configs/features.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.input_file=FILE --config.layers=-1,-2,-3,-4

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf`. FILE: one
input a line, "text_a ||| text_b" for a pair. Writes DIR/features.jsonl; the values equal the
hidden states of transformers' BertModel on the same weights (to 1e-5, tests/test_features.py).
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "features"  # a name in bertjax.tasks.REGISTRY
  config.init_checkpoint = ""  # the model (required), with bert_config.json and its tokenizer
  config.input_file = ""  # text, one input a line; "text_a ||| text_b" for pairs (required)
  config.layers = "-1,-2,-3,-4"  # layer indices: -1 = the last layer, 0 = the first
  config.max_seq_length = 128  # tokens per input with [CLS]/[SEP]; longer inputs are cut
  config.batch_size = 8  # inputs per forward pass
  return config
