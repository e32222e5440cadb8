"""The smallest BERT a run can start from, for tests where the model's size is beside the point
and compiling its steps is most of their time (tests/test_embeddings_training.py,
tests/test_sweep.py)."""
import os

import flax.linen as nn
import jax
import numpy as np

from bertjax.modeldir import model_files
from bertjax.models import heads
from bertjax.models.config import BertConfig


def save_tiny_bert(directory, vocab: list[str], max_position_embeddings: int = 64) -> str:
  """A random one-layer BERT (H16, 2 heads, feed-forward 32, `max_position_embeddings`
  positions) with WordPiece vocabulary `vocab`, saved as a bertjax checkpoint directory
  (DIRECTORY/bert, with bert_config.json and vocab.txt), as conftest.save_random_bert saves
  its L2 H64 one. Returns its path."""
  os.makedirs(directory, exist_ok=True)
  vocab_file = os.path.join(directory, "vocab.txt")
  with open(vocab_file, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in vocab))
  config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_layers=1, num_heads=2,
                      intermediate_size=32, max_position_embeddings=max_position_embeddings)
  ids = np.zeros((1, 4), np.int32)
  params = jax.jit(lambda key: heads.BertForPreTraining(config).init(
      key, ids, ids, ids, deterministic=True)["params"])(jax.random.PRNGKey(0))
  out = os.path.join(directory, "bert")
  model_files.save_model_dir(out, jax.tree.map(np.asarray, nn.unbox(params)), config,
                             [vocab_file])
  return out
