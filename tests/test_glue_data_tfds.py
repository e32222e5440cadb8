"""Reading GLUE from TFDS (bertjax.data.finetuning.glue.read_tfds_examples): builders with
glue/mrpc's and glue/stsb's features, built here with no network; a dataset not prepared
locally; and our TFDS feature and class tables against TFDS's glue configs."""
import time

import numpy as np
import pytest

from bertjax.data.finetuning import glue
from bertjax.data.finetuning.glue import Example
from bertjax.errors import UserError

from glue_helpers import tok, vocab_file  # noqa: F401  (the fixtures)


def _builder_classes():
  """Builders named bertjax_glue_mrpc_like and bertjax_glue_stsb_like: glue/mrpc's (and
  glue/stsb's) features and splits, eight tiny examples a split."""
  import tensorflow_datasets as tfds

  class GlueLike(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")
    LABEL = None  # the label feature
    SCORES = [0.0, 3.8, 5.0, 0.25, 1.2, 4.75, 2.6, 3.0]  # labels (class i % 2, or these)

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
          "label": self.LABEL, "idx": np.int32}))

    def _split_generators(self, dl_manager):
      del dl_manager  # nothing is downloaded
      return {"train": self._generate_examples("train"),
              "validation": self._generate_examples("validation"),
              "test": self._generate_examples("test")}

    def _generate_examples(self, split):
      for i in range(8):
        label = i % 2 if isinstance(self.LABEL, tfds.features.ClassLabel) else self.SCORES[i]
        yield i, {"sentence1": f"{split} first {i} caf\u00e9", "sentence2": f"second {i}",
                  "label": -1 if split == "test" else label, "idx": i}

  class BertjaxGlueMrpcLike(GlueLike):
    LABEL = tfds.features.ClassLabel(names=["not_equivalent", "equivalent"])

  class BertjaxGlueStsbLike(GlueLike):
    LABEL = np.float32

  return BertjaxGlueMrpcLike, BertjaxGlueStsbLike


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  for builder_class in _builder_classes():
    builder_class(data_dir=data_dir, file_format="array_record").download_and_prepare()
  return data_dir


def test_read_tfds_examples(tiny_tfds, tok):
  name = "bertjax_glue_mrpc_like"
  dev = glue.read_tfds_examples("mrpc", "dev", tiny_tfds, name=name)
  assert dev == [
      Example(f"dev-{i}", f"validation first {i} caf\u00e9", f"second {i}", "01"[i % 2])
      for i in range(8)]  # in idx order, though TFDS stores them shuffled
  test = glue.read_tfds_examples("mrpc", "test", tiny_tfds, name=name)
  assert test == [
      Example(f"test-{i}", f"test first {i} caf\u00e9", f"second {i}", None) for i in range(8)]
  stsb = glue.read_tfds_examples("stsb", "train", tiny_tfds, name="bertjax_glue_stsb_like")
  assert [e.label for e in stsb] == ["0.0", "3.8", "5.0", "0.25", "1.2", "4.75", "2.6", "3.0"]
  assert [e.guid for e in stsb] == [f"train-{i}" for i in range(8)]
  np.testing.assert_array_equal(  # the labels encode to exactly the float32 scores TFDS holds
      glue.encode_examples(stsb, glue.TASKS["stsb"], tok, 16)["label"],
      np.float32([0.0, 3.8, 5.0, 0.25, 1.2, 4.75, 2.6, 3.0]))
  assert all(e.label is None for e in glue.read_tfds_examples(
      "stsb", "test", tiny_tfds, name="bertjax_glue_stsb_like"))
  # STS-B, RTE and WNLI share glue/mrpc's text features; WNLI names the same classes "0"/"1"
  # as not_entailment/entailment, so this builder's names are rejected for it.
  with pytest.raises(UserError, match=r"'bertjax_glue_mrpc_like' has classes \['not_equivalent', "
                     r"'equivalent'\], not glue/wnli's \['entailment', 'not_entailment'\]"):
    glue.read_tfds_examples("wnli", "train", tiny_tfds, name=name)
  with pytest.raises(UserError, match=r"has classes \['not_equivalent', 'equivalent'\], but "
                     r"glue/stsb's label is a score"):
    glue.read_tfds_examples("stsb", "train", tiny_tfds, name=name)
  with pytest.raises(UserError, match=r"'bertjax_glue_stsb_like' has classes \[\], not glue/mrpc"):
    glue.read_tfds_examples("mrpc", "train", tiny_tfds, name="bertjax_glue_stsb_like")
  with pytest.raises(UserError, match=r"lacks the feature\(s\) question1, question2 of glue/qqp; "
                     r"its features are idx, label, sentence1, sentence2"):
    glue.read_tfds_examples("qqp", "train", tiny_tfds, name=name)
  with pytest.raises(UserError, match=r"has no split 'validation_matched' \(our 'dev_matched'\); "
                     r"its splits are"):
    glue.read_tfds_examples("mnli", "dev_matched", tiny_tfds, name=name)
  with pytest.raises(UserError, match=r"GLUE task 'mrpc' has no split 'validation'"):
    glue.read_tfds_examples("mrpc", "validation", tiny_tfds, name=name)


def test_read_tfds_examples_not_prepared(tmp_path):
  start = time.perf_counter()
  with pytest.raises(UserError, match=r"TFDS dataset 'glue/mrpc' is not prepared locally in "
                     r".* \(no download is attempted\); prepare it first .*: tfds build glue/mrpc "
                     r"--data_dir=.* --file_format=array_record \(or read GLUE's \.tsv files: "
                     r"--config\.data\.glue_dir\)"):
    glue.read_tfds_examples("mrpc", "train", str(tmp_path))
  with pytest.raises(UserError, match=r"'glue/ax' is not prepared locally"):
    glue.read_tfds_examples("ax", "test", str(tmp_path))
  with pytest.raises(UserError, match=r"'no_such_glue_xyz' is not known"):
    glue.read_tfds_examples("mrpc", "train", str(tmp_path), name="no_such_glue_xyz")
  assert time.perf_counter() - start < 10  # no network retries


def test_tfds_tables_match_tfds_glue():
  """Our TFDS feature and class tables agree with TFDS's glue configs."""
  from tensorflow_datasets.text import glue as tfds_glue
  configs = {c.name: c for c in tfds_glue.Glue.BUILDER_CONFIGS}
  for task in glue.TASKS:
    config = configs[task]
    key_a, key_b = glue._TFDS_TEXTS[task]
    assert [k for k in (key_a, key_b) if k] == list(config.text_features)
    if glue.TASKS[task].is_regression:
      assert config.label_classes is None
    else:
      names = config.label_classes
      assert sorted(glue._TFDS_LABELS[task]) == sorted(names)
      # Where GLUE's files say "0"/"1", TFDS casts them to the class index: names[i] is str(i).
      for i, n in enumerate(names):
        mapped = glue._TFDS_LABELS[task][n]
        assert mapped == n or mapped == str(i)
        assert mapped in glue.TASKS[task].labels
