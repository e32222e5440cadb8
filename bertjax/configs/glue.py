"""GLUE fine-tuning (the paper, section 4.1): one task of the benchmark on a pretrained BERT.

  python -m bertjax.main --config=configs/glue.py --workdir=DIR --config.task=mrpc \
      --config.init_checkpoint=CKPT --config.data.glue_dir=GLUE_DIR

config.task: cola sst2 mrpc qqp stsb mnli qnli rte wnli. CKPT: a pretraining workdir or a
directory from `python -m bertjax.convert --from=hf|tf` (e.g. Google's BERT-base). GLUE_DIR: the
layout of GLUE's download_glue_data.py (MRPC/train.tsv, ...); leave it empty to read TFDS's
glue/<task> prepared under data.tfds_data_dir. The defaults are the paper's: batch 32, 3 epochs,
learning rate 2e-5 (the paper picks the best of 5e-5, 4e-5, 3e-5, 2e-5 on dev), warmup 10%,
dropout 0.1, 128 tokens. The paper did not pack; data.packing="auto" lays short sentences
several to a row (the bundled movie reviews: 4), which is exact: each step is the same 32
examples, each pooled from its own [CLS] and attending only to itself, so the steps are the
paper's and the losses and predictions those of one a row (dropout draws other bits of the same
distribution); `--config.data.packing=0` runs one a row. Writes eval_results.json (dev
metrics), eval_predictions.tsv and, for data.predict_splits, GLUE leaderboard files (e.g.
MRPC.tsv).
"""
from bertjax import run_config


def get_config(arg=None):
  """GLUE's fields (`bertjax.run_config.GlueRun`, each commented there); task mrpc."""
  del arg
  return run_config.defaults(run_config.GlueRun)
