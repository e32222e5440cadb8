"""Contrastive sentence embeddings (`bertjax.tasks.embeddings`): a model trained so that each
anchor is nearest its positive among every text of the global batch.

  python -m bertjax.main --config=configs/embeddings.py --workdir=DIR \
      --config.init_checkpoint=MODEL --config.embedding.pooling=mean \
      --config.data.train_file=PAIRS.tsv
  python -m bertjax.main --config=configs/embeddings.py:simcse --workdir=DIR \
      --config.init_checkpoint=MODEL --config.embedding.pooling=cls

MODEL: a bertjax model directory or workdir, a Hugging Face BERT or ModernBERT directory, or a
sentence-transformers directory (which has its own pooling: leave embedding.pooling unset).
PAIRS: (anchor, positive[, hard negatives]) a line, tab-separated, or JSONL.

The default is sentence-transformers' MultipleNegativesRankingLoss recipe (its
training_nli_v2.py example: cosine times 20, mean pooling, rate 2e-5 warmed up over 10% of one
epoch; batch 64 here, 128 there); `:simcse` is unsupervised SimCSE's (Gao et al. 2021, Table
D.1 for BERT-base: plain text, each sentence its own positive, dropout 0.1 the noise,
temperature 0.05 = scale 20, rate 3e-5, batch 64, 32 tokens, one epoch; "" = the bundled
corpus). SimCSE trains [CLS] through an MLP it drops afterwards; here the pooling is the
embedding itself, with no MLP.
"""
from bertjax import run_config


def get_config(arg=None):
  """EmbeddingsRun's fields (`bertjax.run_config.EmbeddingsRun`, each commented there); arg
  "simcse" is unsupervised SimCSE on plain text."""
  config = run_config.defaults(run_config.EmbeddingsRun)
  if arg == "simcse":
    config.data.simcse = True
    config.data.max_seq_length = 32
    config.train.learning_rate = 3e-5
  elif arg:
    raise ValueError(f"configs/embeddings.py takes 'simcse' or nothing, not {arg!r}")
  return config
