"""Feature extraction: per-token vectors of chosen layers (google-research/bert's
extract_features.py, same output format).

  python -m bertjax.main --config=configs/features.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.input_file=FILE --config.layers=-1,-2,-3,-4

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf`. FILE: one
input a line, "text_a ||| text_b" for a pair. Writes DIR/features.jsonl; the values equal the
hidden states of transformers' BertModel on the same weights (to 1e-5, tests/test_features.py).
"""
from bertjax import run_config


def get_config(arg=None):
  """Feature extraction's fields (`bertjax.run_config.FeaturesRun`, each commented there)."""
  del arg
  return run_config.defaults(run_config.FeaturesRun)
