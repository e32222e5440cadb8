"""Fixtures shared by several test modules: a random BERT directory, a tiny TFDS text dataset."""
import hashlib
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import model_files, tokenization
from bertjax.data import sources
from bertjax.models import bert, heads


def write_chapters(directory, num_documents: int, vocab_size: int = 600) -> tuple[str, str]:
  """(DIRECTORY/chapters.txt: the first `num_documents` chapters of the bundled corpus in
  google-research/bert's format, DIRECTORY/vocab.model: a sentencepiece model of them)."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:num_documents]
  text_file = os.path.join(directory, "chapters.txt")
  with open(text_file, "w") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  vocab = os.path.join(directory, "vocab.model")
  tokenization.load_or_train_sentencepiece(
      lambda: (s for doc in documents for s in doc), vocab, vocab_size)
  return text_file, vocab


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """(text file with 40 chapters of the bundled corpus, a sentencepiece model of it): the
  pretraining runs' text, shared (read only) by every module that does not define its own."""
  return write_chapters(str(tmp_path_factory.mktemp("corpus")), 40)


def tree_digest(path) -> str:
  """Names of the directories and names and bytes of the files under `path` (to show that
  nothing there changed)."""
  digest = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    digest.update(os.path.relpath(root, path).encode() + b"/")
    for name in sorted(files):
      full = os.path.join(root, name)
      digest.update(os.path.relpath(full, path).encode())
      with open(full, "rb") as f:
        digest.update(f.read())
  return digest.hexdigest()


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


def _tiny_builder_class():
  import tensorflow_datasets as tfds

  class BertjaxTinyText(tfds.core.GeneratorBasedBuilder):
    """Three documents; one of them empty."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager  # nothing is downloaded
      return {"train": self._generate_examples(), "test": self._generate_examples(1)}

    def _generate_examples(self, n=3):
      texts = ["Mr. Darcy bowed. She smiled!", "First line.\nSecond line. Third one.", "  "]
      for i in range(n):
        yield i, {"text": texts[i], "title": f"doc {i}"}

  return BertjaxTinyText


@pytest.fixture(scope="session")
def tiny_tfds(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  builder = _tiny_builder_class()(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  return data_dir
