"""GLUE examples to BERT features (bertjax.data.finetuning.glue.encode_examples): the exact
input ids, segment ids, masks and labels, label errors, and truncation of sentence pairs as
google-research/bert's _truncate_seq_pair (and where transformers' BertTokenizer differs)."""
import numpy as np
import pytest
import transformers

from bertjax.data.finetuning import glue
from bertjax.data.finetuning.glue import Example
from bertjax.errors import UserError

from glue_helpers import WORDS
from glue_helpers import tok, vocab_file  # noqa: F401  (the fixtures)


def ids(*words):
  return [5 + WORDS.index(w) for w in words]


def test_encode_examples_exact(tok):
  mrpc = glue.TASKS["mrpc"]
  examples = [Example("dev-0", "The cats sat.", "A dog ran?", "1"),
              Example("dev-1", "It is the mat", "Zebra", "0"),  # "zebra" is [UNK] (1)
              Example("dev-2", "the cat", "", "0")]  # B with no pieces: [CLS] A [SEP]
  features = glue.encode_examples(examples, mrpc, tok, max_seq_length=12)
  assert set(features) == {"input_ids", "segment_ids", "input_mask", "label"}
  cls, sep = tok.cls_id, tok.sep_id
  rows = [[cls, *ids("the", "cat", "##s", "sat", "."), sep, *ids("a", "dog", "ran", "?"), sep],
          [cls, *ids("it", "is", "the", "mat"), sep, tok.unk_id, sep],
          [cls, *ids("the", "cat"), sep]]
  expected = np.zeros((3, 12), np.int32)
  for i, row in enumerate(rows):
    expected[i, :len(row)] = row
  np.testing.assert_array_equal(features["input_ids"], expected)
  np.testing.assert_array_equal(features["segment_ids"], [
      [0] * 7 + [1] * 5, [0] * 6 + [1] * 2 + [0] * 4, [0] * 12])
  np.testing.assert_array_equal(features["input_mask"], [
      [1] * 12, [1] * 8 + [0] * 4, [1] * 4 + [0] * 8])
  np.testing.assert_array_equal(features["label"], [1, 0, 0])
  for key in ("input_ids", "segment_ids", "input_mask", "label"):
    assert features[key].dtype == np.int32
  # A single sentence is cut to max_seq_length - 2; labels index the task's label tuple.
  features = glue.encode_examples(
      [Example("train-0", "the cat sat on the mat", None, "0"),
       Example("train-1", "it ran", None, "1")], glue.TASKS["cola"], tok, max_seq_length=5)
  np.testing.assert_array_equal(features["input_ids"], [
      [cls, *ids("the", "cat", "sat"), sep], [cls, *ids("it", "ran"), sep, 0]])
  np.testing.assert_array_equal(features["segment_ids"], np.zeros((2, 5)))
  np.testing.assert_array_equal(features["label"], [0, 1])
  mnli = glue.encode_examples([Example("train-0", "a", "b", "neutral"),
                               Example("train-1", "a", "b", "contradiction")],
                              glue.TASKS["mnli"], tok, 8)
  np.testing.assert_array_equal(mnli["label"], [2, 0])


def test_encode_examples_labels(tok):
  stsb = glue.encode_examples([Example("dev-0", "a", "b", "3.800"),
                               Example("dev-1", "a", "b", "0.000")], glue.TASKS["stsb"], tok, 8)
  assert stsb["label"].dtype == np.float32
  np.testing.assert_array_equal(stsb["label"], np.float32([3.8, 0.0]))
  # Test examples (or any without a label) give no "label".
  test = glue.encode_examples([Example("test-0", "a", "b", None),
                               Example("test-1", "a", "b", "1")], glue.TASKS["rte"], tok, 8)
  assert set(test) == {"input_ids", "segment_ids", "input_mask"}
  empty = glue.encode_examples([], glue.TASKS["mrpc"], tok, 8)
  assert empty["input_ids"].shape == (0, 8) and empty["label"].shape == (0,)
  with pytest.raises(UserError, match=r"example train-7: GLUE rte label '1' is not one of "
                     "entailment, not_entailment"):
    glue.encode_examples([Example("train-7", "a", "b", "1")], glue.TASKS["rte"], tok, 8)
  with pytest.raises(UserError, match=r"example dev-0: GLUE stsb label 'x' is not a number"):
    glue.encode_examples([Example("dev-0", "a", "b", "x")], glue.TASKS["stsb"], tok, 8)
  with pytest.raises(UserError, match=r"max_seq_length=2 cannot hold"):
    glue.encode_examples([Example("dev-0", "a", "b", "1")], glue.TASKS["mrpc"], tok, 2)


def truncate_seq_pair(tokens_a, tokens_b, max_length):
  """google-research/bert run_classifier.py's _truncate_seq_pair, as written there."""
  while True:
    total_length = len(tokens_a) + len(tokens_b)
    if total_length <= max_length:
      break
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def test_truncated_lengths_match_google():
  for len_a in range(12):
    for len_b in range(12):
      for max_length in range(15):
        a, b = list(range(len_a)), list(range(len_b))
        truncate_seq_pair(a, b, max_length)
        assert glue.truncated_lengths(len_a, len_b, max_length) == (len(a), len(b)), (
            len_a, len_b, max_length)


def test_truncation_against_google_and_transformers(tok, vocab_file):
  """Pairs of 1-11 one-piece words, every budget: our features hold google-research/bert's
  lengths. transformers' BertTokenizer (truncation="longest_first", tokenizers' Rust) agrees
  except in one case: an odd budget split evenly between two cut sequences, where it gives the
  odd token to the sequence that was longer (B on a tie) and Google always to A. Measured here:
  HF's lengths for (A, B) are Google's for (B, A) swapped back whenever A is not longer."""
  hf = transformers.BertTokenizer(vocab_file, do_lower_case=True)
  words = [f"w{i}" for i in range(60)]
  pairs = [(la, lb) for la in range(1, 12) for lb in range(1, 12)]
  examples = [Example(f"dev-{i}", " ".join(words[:la]), " ".join(words[30:30 + lb]), "0")
              for i, (la, lb) in enumerate(pairs)]
  disagreements = 0
  for max_seq_length in range(3, 20):
    ours = glue.encode_examples(examples, glue.TASKS["mrpc"], tok, max_seq_length)
    theirs = hf([e.text_a for e in examples], [e.text_b for e in examples],
                truncation="longest_first", max_length=max_seq_length, padding="max_length",
                return_tensors="np")
    for i, (la, lb) in enumerate(pairs):
      a, b = glue.truncated_lengths(la, lb, max_seq_length - 3)
      row = [tok.cls_id, *range(18, 18 + a), tok.sep_id, *range(48, 48 + b), tok.sep_id]
      row += [0] * (max_seq_length - len(row))
      np.testing.assert_array_equal(ours["input_ids"][i], row)
      pad = max_seq_length - a - b - 3
      np.testing.assert_array_equal(ours["segment_ids"][i],
                                    [0] * (a + 2) + [1] * (b + 1) + [0] * pad)
      np.testing.assert_array_equal(ours["input_mask"][i], np.array(row) != 0)
      hf_lengths = (a, b) if la > lb else glue.truncated_lengths(lb, la, max_seq_length - 3)[::-1]
      if hf_lengths == (a, b):
        np.testing.assert_array_equal(theirs["input_ids"][i], ours["input_ids"][i])
        np.testing.assert_array_equal(theirs["token_type_ids"][i], ours["segment_ids"][i])
        np.testing.assert_array_equal(theirs["attention_mask"][i], ours["input_mask"][i])
      else:
        disagreements += 1
        hf_row = theirs["input_ids"][i]
        assert (np.sum((hf_row >= 18) & (hf_row < 48)), np.sum(hf_row >= 48)) == hf_lengths
        assert a == b + 1 and (max_seq_length - 3) % 2 == 1
  assert disagreements > 0
