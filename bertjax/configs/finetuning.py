"""The fine-tuning default: the fields glue.py, ner.py, squad.py and swag.py share (each commented
in bertjax/run_config/, `FinetuningRun`).

Not run by itself (it names no task): each of those configs is this plus its task, its data
fields and the few values its recipe changes. The values are the paper's GLUE recipe (section
4.1): batch 32, 3 epochs, learning rate 2e-5 with linear decay, warmup 10%, dropout 0.1, 128
tokens, from a pretrained model (`--config.init_checkpoint`). What runs faster than the paper did
and gives its results, batches cut to length buckets and (GLUE) sentences packed several to a
row, is on by default.
"""
from bertjax import run_config


def get_config(arg=None):
  """The fine-tuning defaults (`bertjax.run_config.FinetuningRun`, every field commented there)."""
  del arg
  return run_config.defaults(run_config.FinetuningRun)
