"""CPU demo: a tiny BERT (L2 H128 A2) pretrained with MLM + NSP on the bundled Jane Austen corpus.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/bertjax_tiny

Prepares the corpus into WORKDIR/data once (a sentencepiece vocabulary trained on the training
chapters, NSP pairs in shards; reused on later runs), masks batches as it streams them,
pretrains for a few minutes on 2 CPU cores, evaluates on held-out chapters and checkpoints. Held-out MLM accuracy ends far above the frequency baseline (predicting the most
common token) and NSP accuracy above 50%; the README gives the figures measured.

Its values are the pretraining defaults, every field commented in bertjax/run_config/
(`PretrainingRun`): base.py (and large.py) are this plus the paper's values. Warmup is 10% of the
steps (train.warmup_proportion), so `--config.train.num_train_steps=50` is a short run that
works as it is. `--config.pretraining.nsp=false` and `--config.pretraining.objective=ltr`
pretrain the paper's No NSP and LTR & No NSP ablations (section 5.1) instead.
"""
from bertjax import run_config


def get_config(arg=None):
  """The pretraining defaults (`bertjax.run_config.PretrainingRun`, every field commented
  there): the CPU demo."""
  del arg
  return run_config.defaults(run_config.PretrainingRun)
