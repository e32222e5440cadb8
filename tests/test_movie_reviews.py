"""The bundled movie-review sentences (bertjax.data.finetuning.movie_reviews): the shipped file is the one
credited, binarised by the sign of its rating, split the same way every time, and written as
SST-2 files that the GLUE reader reads back."""
import hashlib
import os

import numpy as np
import pytest

from bertjax.data.finetuning import glue, movie_reviews
from bertjax.errors import UserError


def test_the_shipped_file_is_the_credited_one():
  with open(movie_reviews.GROUND_TRUTH, "rb") as f:
    data = f.read()
  assert hashlib.sha256(data).hexdigest() == (
      "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350")
  directory = os.path.dirname(movie_reviews.GROUND_TRUTH)
  assert {"LICENSE.txt", "CREDITS.md"} <= set(os.listdir(directory))
  with open(os.path.join(directory, "LICENSE.txt"), encoding="utf-8") as f:
    assert "MIT License" in f.read()


def test_ratings_and_labels():
  ratings = movie_reviews.read_ratings()
  assert len(ratings) == 10605
  assert [r.id for r in ratings] == list(range(1, 10606))
  assert ratings[2] == movie_reviews.Rating(3, -0.6, "Effective but too tepid biopic")
  assert all(-4 <= r.rating <= 4 and r.sentence for r in ratings)
  sentences = movie_reviews.labelled_sentences()
  assert len(sentences) == 10568 == len(ratings) - sum(r.rating == 0 for r in ratings)
  labels = np.array([label for _, label in sentences])
  assert labels.sum() == 5242  # 49.6% positive
  rated = [r for r in ratings if r.rating != 0]
  assert all(label == int(r.rating > 0) and text == r.sentence
             for (text, label), r in zip(sentences, rated))


def test_the_split_is_fixed_and_nested():
  sentences = movie_reviews.labelled_sentences()
  train, dev = movie_reviews.split(sentences)
  assert (len(train), len(dev)) == (9568, 1000)
  assert sorted(train + dev) == sorted(sentences)
  assert movie_reviews.split(sentences) == (train, dev)
  assert 0.45 < np.mean([label for _, label in dev]) < 0.55
  small_train, small_dev = movie_reviews.split(sentences, num_dev=800, num_train=3200)
  assert small_dev == dev[:800] and small_train == train[-3200:]  # within the default split
  other_train, _ = movie_reviews.split(sentences, seed=1)
  assert other_train != train
  with pytest.raises(UserError, match="num_dev=10000 and num_train=1000 do not fit 10568"):
    movie_reviews.split(sentences, num_dev=10000, num_train=1000)


def test_sst2_files_read_back_through_the_glue_reader(tmp_path):
  assert movie_reviews.main([f"--output_dir={tmp_path}", "--num_dev=50", "--num_train=200"]) == 0
  train, dev = movie_reviews.split(movie_reviews.labelled_sentences(), num_dev=50, num_train=200)
  for split, rows in (("train", train), ("dev", dev)):
    examples = glue.read_examples("sst2", split, str(tmp_path))
    assert [(e.text_a, int(e.label)) for e in examples] == rows
  assert (tmp_path / "SST-2" / "dev.tsv").read_text().startswith("sentence\tlabel\n")
  assert movie_reviews.main([f"--output_dir={tmp_path}", "--num_dev=0"]) == 2


def test_pretraining_text_is_the_training_sentences_without_dev(tmp_path):
  """--pretraining_text: every training sentence once, no dev sentence, no label, eight
  sentences a document; the pretraining's text reader takes it."""
  from bertjax.data import sources  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "reviews.txt")
  assert movie_reviews.main([f"--output_dir={tmp_path}", f"--pretraining_text={path}"]) == 0
  documents = sources.read_text_files(path)
  sentences = [s for doc in documents for s in doc]
  train, dev = movie_reviews.split(movie_reviews.labelled_sentences())
  assert sentences == [text for text, _ in train]
  assert not set(sentences) & {text for text, _ in dev}
  assert [len(d) for d in documents] == [8] * (len(train) // 8) + ([len(train) % 8]
                                                                   if len(train) % 8 else [])
  with pytest.raises(UserError, match="sentences_per_document=0"):
    movie_reviews.write_pretraining_text(path, sentences_per_document=0)
