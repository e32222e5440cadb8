"""Fixtures shared by the fine-tuning tests."""
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import model_files
from bertjax.models import bert, heads


def save_random_bert(directory, vocab: list[str]) -> str:
  """A random (untrained) small BERT (L2 H64 A2, 64 positions) with WordPiece vocabulary
  `vocab`, saved as a bertjax checkpoint directory (DIRECTORY/bert, with bert_config.json and
  vocab.txt), the form `--config.init_checkpoint` takes. Returns its path."""
  os.makedirs(directory, exist_ok=True)
  vocab_file = os.path.join(directory, "vocab.txt")
  with open(vocab_file, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in vocab))
  config = bert.BertConfig(vocab_size=len(vocab), hidden_size=64, num_layers=2, num_heads=2,
                           intermediate_size=128, max_position_embeddings=64)
  ids = np.zeros((1, 4), np.int32)
  params = heads.BertForPreTraining(config).init(jax.random.PRNGKey(0), ids, ids, ids,
                                                 deterministic=True)["params"]
  out = os.path.join(directory, "bert")
  model_files.save_model_dir(out, jax.tree.map(np.asarray, nn.unbox(params)), config,
                             [vocab_file])
  return out


@pytest.fixture(scope="session")
def random_bert():
  """save_random_bert, for a module's model_dir fixture."""
  return save_random_bert
