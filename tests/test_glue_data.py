"""Tests of bertjax.data.finetuning.glue: GLUE's files and TFDS -> examples -> BERT features; and
the leaderboard files of bertjax.tasks.glue.

The .tsv files written here copy the layouts download_glue_data.py leaves (header rows, columns,
CoLA's headerless train/dev, MRPC's byte order mark, MNLI's 12/16/10-column files), with rows
taken from the real files.
"""
import os
import time

import numpy as np
import pytest
import transformers

from bertjax import tokenization
from bertjax.data.finetuning import glue
from bertjax.data.finetuning.glue import Example
from bertjax.errors import UserError
from bertjax.tasks import glue as glue_task

FILES = {
    "CoLA/train.tsv": (  # no header: source, label, original label, sentence
        "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
        "gj04\t0\t*\tThey drank the pub.\n"
        "cj99\t1\t\tThe \"quoted\" word stays.\n"),
    "CoLA/dev.tsv": "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n",
    "CoLA/test.tsv": "index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked.\n",
    "SST-2/train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\n"
                       "contains no wit , only labored gags \t0\nthat loves its characters \t1\n",
    "SST-2/test.tsv": "index\tsentence\n0\tuneasy mishmash of styles and genres .\n",
    "MRPC/train.tsv": (
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother , whom he called \" the witness \" , of "
        "deliberately distorting his evidence .\tReferring to him as only \" the witness \" , "
        "Amrozi accused his brother of deliberately distorting his evidence .\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's .\n"),
    "MRPC/test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                     "0\t1089874\t1089925\tPCCW 's chief .\tCurrent Chief .\n"
                     "1\t3019446\t3019327\tThe world .\tThe globe .\n",
    "QQP/train.tsv": (
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level is enough?\t0\n"
        "363362\t29356\tHow do I?\n"  # a field missing: skipped, as transformers' QqpProcessor
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control it?\t1\n"),
    "QQP/test.tsv": "id\tquestion1\tquestion2\n0\tWould the world be ok?\tIs it ok?\n",
    "STS-B/dev.tsv": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing."
        "\tA man wearing a hard hat is dancing.\t5.000\n"
        "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse."
        "\tA child is riding a horse.\t4.750\n"),
    "STS-B/test.tsv": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
        "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair."
        "\tA girl is brushing her hair.\n"),
    "MNLI/train.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t31193\t31193n\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tConceptually cream "
        "skimming has two basic dimensions.\tProduct and geography are what make cream skimming "
        "work.\tneutral\tneutral\n"),
    "MNLI/dev_matched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
        "label5\tgold_label\n"
        "0\t63735\t63735n\tslate\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tThe new rights are nice "
        "enough\tEveryone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral"
        "\tneutral\tneutral\n"
        "1\t91383\t91383c\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tThis site includes a "
        "list.\tThe Government Executive articles are not on the site.\tcontradiction\t"
        "contradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n"),
    "MNLI/dev_mismatched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
        "label5\tgold_label\n"
        "0\t75290\t75290c\tletters\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tYour contribution helped."
        "\tYour contributions were of no help.\tcontradiction\tcontradiction\tcontradiction\t"
        "contradiction\tcontradiction\tcontradiction\n"),
    "MNLI/test_matched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
        "0\t31493\t31493\ttravel\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tHierbas is a liqueur.\t"
        "Hierbas is a drink.\n"),
    "MNLI/test_mismatched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
        "0\t41\t41\tverbatim\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tWhat we ate.\tWe ate.\n"
        "1\t42\t42\tverbatim\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tWho went.\tThey went.\n"),
    "QNLI/dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhat came into force?\tThe law came "
                    "into force.\tentailment\n1\tWhy?\tBecause.\tnot_entailment\n",
    "RTE/train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tNo weapons were found.\tWeapons "
                     "were found.\tnot_entailment\n",
    "RTE/test.tsv": "index\tsentence1\tsentence2\n0\tMaude fought.\tMaude won.\n",
    "WNLI/dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe drain is clogged with hair. It "
                    "has to be cleaned.\tThe hair has to be cleaned.\t0\n",
    "diagnostic/diagnostic.tsv": "index\tsentence1\tsentence2\n0\tThe cat sat on the mat.\tThe "
                                 "cat did not sit on the mat.\n",
}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("glue_data")
  for name, text in FILES.items():
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_bytes(text.encode("utf-8"))
  return str(root)


def test_tasks():
  assert list(glue.TASKS) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte",
                              "wnli", "ax"]
  assert glue.TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
  assert glue.TASKS["ax"].labels == glue.TASKS["mnli"].labels
  assert glue.TASKS["rte"].labels == glue.TASKS["qnli"].labels == ("entailment",
                                                                   "not_entailment")
  assert glue.TASKS["mrpc"].labels == glue.TASKS["wnli"].labels == ("0", "1")
  assert glue.TASKS["stsb"].is_regression and glue.TASKS["stsb"].num_labels == 1
  assert not glue.TASKS["mnli"].is_regression and glue.TASKS["mnli"].num_labels == 3
  assert glue.TASKS["ax"].splits == ("test",)
  assert {t for t, _ in glue_task.SUBMISSION_FILES} == set(glue.TASKS)
  for (task, split), name in glue_task.SUBMISSION_FILES.items():
    assert split in glue.TASKS[task].splits and split.startswith("test") and name.endswith(".tsv")


@pytest.mark.parametrize("task, split, expected", [
    ("cola", "train", [
        Example("train-0", "Our friends won't buy this analysis, let alone the next one we "
                "propose.", None, "1"),
        Example("train-1", "They drank the pub.", None, "0"),
        Example("train-2", 'The "quoted" word stays.', None, "1")]),  # no quoting
    ("cola", "dev", [Example("dev-0", "The sailors rode the breeze clear of the rocks.", None,
                             "1")]),
    ("cola", "test", [Example("test-0", "Bill whistled past the house.", None, None),
                      Example("test-1", "The car honked.", None, None)]),
    ("sst2", "train", [Example("train-0", "hide new secretions from the parental units ", None,
                               "0"),
                       Example("train-1", "contains no wit , only labored gags ", None, "0"),
                       Example("train-2", "that loves its characters ", None, "1")]),
    ("sst2", "test", [Example("test-0", "uneasy mishmash of styles and genres .", None, None)]),
    ("mrpc", "train", [
        Example("train-0", 'Amrozi accused his brother , whom he called " the witness " , of '
                "deliberately distorting his evidence .", 'Referring to him as only " the '
                'witness " , Amrozi accused his brother of deliberately distorting his evidence .',
                "1"),
        Example("train-1", "Yucaipa owned Dominick 's .", "Yucaipa bought Dominick 's .", "0")]),
    ("mrpc", "test", [Example("test-0", "PCCW 's chief .", "Current Chief .", None),
                      Example("test-1", "The world .", "The globe .", None)]),
    ("qqp", "train", [
        Example("train-0", "How is the life of a math student?", "Which level is enough?", "0"),
        Example("train-2", "How do I control my horny emotions?", "How do you control it?",
                "1")]),
    ("qqp", "test", [Example("test-0", "Would the world be ok?", "Is it ok?", None)]),
    ("stsb", "dev", [
        Example("dev-0", "A man with a hard hat is dancing.",
                "A man wearing a hard hat is dancing.", "5.000"),
        Example("dev-1", "A young child is riding a horse.", "A child is riding a horse.",
                "4.750")]),
    ("stsb", "test", [Example("test-0", "A girl is styling her hair.",
                              "A girl is brushing her hair.", None)]),
    ("mnli", "train", [Example("train-0", "Conceptually cream skimming has two basic "
                               "dimensions.", "Product and geography are what make cream "
                               "skimming work.", "neutral")]),
    ("mnli", "dev_matched", [
        Example("dev_matched-0", "The new rights are nice enough",
                "Everyone really likes the newest benefits", "neutral"),
        Example("dev_matched-1", "This site includes a list.",
                "The Government Executive articles are not on the site.", "contradiction")]),
    ("mnli", "dev_mismatched", [Example("dev_mismatched-0", "Your contribution helped.",
                                        "Your contributions were of no help.",
                                        "contradiction")]),
    ("mnli", "test_matched", [Example("test_matched-0", "Hierbas is a liqueur.",
                                      "Hierbas is a drink.", None)]),
    ("mnli", "test_mismatched", [Example("test_mismatched-0", "What we ate.", "We ate.", None),
                                 Example("test_mismatched-1", "Who went.", "They went.", None)]),
    ("qnli", "dev", [Example("dev-0", "What came into force?", "The law came into force.",
                             "entailment"),
                     Example("dev-1", "Why?", "Because.", "not_entailment")]),
    ("rte", "train", [Example("train-0", "No weapons were found.", "Weapons were found.",
                              "not_entailment")]),
    ("rte", "test", [Example("test-0", "Maude fought.", "Maude won.", None)]),
    ("wnli", "dev", [Example("dev-0", "The drain is clogged with hair. It has to be cleaned.",
                             "The hair has to be cleaned.", "0")]),
    ("ax", "test", [Example("test-0", "The cat sat on the mat.",
                            "The cat did not sit on the mat.", None)]),
])
def test_read_examples(glue_dir, task, split, expected):
  assert glue.read_examples(task, split, glue_dir) == expected


def test_read_examples_line_endings_and_blank_lines(tmp_path):
  (tmp_path / "RTE").mkdir()
  (tmp_path / "RTE" / "dev.tsv").write_bytes(
      b"index\tsentence1\tsentence2\tlabel\r\n0\tA \xc3\xa9.\tB.\tentailment\r\n\r\n"
      b"1\tC.\tD.\tnot_entailment")
  assert glue.read_examples("rte", "dev", str(tmp_path)) == [
      Example("dev-0", "A \u00e9.", "B.", "entailment"),
      Example("dev-1", "C.", "D.", "not_entailment")]


def test_read_examples_errors(glue_dir, tmp_path):
  with pytest.raises(UserError, match=r"unknown GLUE task 'sst-2'; use one of cola, sst2, mrpc, "
                     r"qqp, stsb, mnli, qnli, rte, wnli, ax\."):
    glue.read_examples("sst-2", "train", glue_dir)
  with pytest.raises(UserError, match=r"GLUE task 'mnli' has no split 'dev'; use one of train, "
                     r"dev_matched, dev_mismatched, test_matched, test_mismatched\."):
    glue.read_examples("mnli", "dev", glue_dir)
  with pytest.raises(UserError, match=r"'ax' has no split 'train'; use one of test\."):
    glue.read_examples("ax", "train", glue_dir)
  missing = str(tmp_path / "nowhere")
  with pytest.raises(UserError) as e:
    glue.read_examples("cola", "train", missing)
  assert str(e.value).startswith(
      f"GLUE cola train needs {missing}/CoLA/train.tsv, but {missing} does not exist; get GLUE "
      "with download_glue_data.py (--data_dir=DIR writes DIR/CoLA/train.tsv")
  assert "TFDS glue/<task>" in str(e.value)
  with pytest.raises(UserError, match=rf"needs {tmp_path}/SST-2/dev\.tsv, but {tmp_path}/SST-2 "
                     "does not exist"):
    glue.read_examples("sst2", "dev", str(tmp_path))
  with pytest.raises(UserError, match=rf"GLUE mrpc dev needs {glue_dir}/MRPC/dev\.tsv, but "
                     rf"{glue_dir}/MRPC/dev\.tsv does not exist"):
    glue.read_examples("mrpc", "dev", glue_dir)

  def write(directory, name, data):
    (tmp_path / directory).mkdir(exist_ok=True)
    (tmp_path / directory / name).write_bytes(data)
    return str(tmp_path / directory / name)

  path = write("RTE", "train.tsv", b"index\tsentence1\tsentence2\tlabel\n0\tCaf\xe9.\tB.\t0\n")
  with pytest.raises(UserError, match=rf"{path} is not UTF-8: line 2, byte offset 37"):
    glue.read_examples("rte", "train", str(tmp_path))
  path = write("MNLI", "train.tsv", FILES["MNLI/train.tsv"].encode() +
               b"1\t2\t3\tgenre\ta\tb\tc\td\tPremise only.\tHypothesis.\n")
  with pytest.raises(UserError, match=rf"{path}:3: 10 tab-separated columns, but GLUE mnli train "
                     "rows have at least 11; the file is damaged or not GLUE's"):
    glue.read_examples("mnli", "train", str(tmp_path))
  path = write("CoLA", "train.tsv", b"gj04\t1\t\tFine.\nA headerless row\tof two\n")
  with pytest.raises(UserError, match=rf"{path}:2: 2 tab-separated columns, but GLUE cola train "
                     "rows have at least 4"):
    glue.read_examples("cola", "train", str(tmp_path))
  path = write("RTE", "dev.tsv", b"index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tneutral\n")
  with pytest.raises(UserError, match=rf"{path}:2: GLUE rte label 'neutral' is not one of "
                     "entailment, not_entailment"):
    glue.read_examples("rte", "dev", str(tmp_path))
  path = write("STS-B", "train.tsv", b"index\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore\n"
               b"0\tg\tf\ty\to\tn\tn\tA.\tB.\thigh\n")
  with pytest.raises(UserError, match=rf"{path}:2: GLUE stsb label 'high' is not a number"):
    glue.read_examples("stsb", "train", str(tmp_path))
  (tmp_path / "WNLI" / "dev.tsv").mkdir(parents=True)
  with pytest.raises(UserError, match=r"WNLI/dev\.tsv is a directory"):
    glue.read_examples("wnli", "dev", str(tmp_path))


# ----------------------------------------------------------------------------------------------
# Features.

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "##s", "a", ".", "?", "is", "it"]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  """[PAD] [UNK] [CLS] [SEP] [MASK] at 0-4, then WORDS (5...), then w0..w59 (18...)."""
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"w{i}" for i in range(60)]
  path.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def tok(vocab_file):
  return tokenization.WordPieceTokenizer(vocab_file, lowercase=True)


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


# ----------------------------------------------------------------------------------------------
# TFDS: a builder with glue/mrpc's features, built here with no network.


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


# ----------------------------------------------------------------------------------------------
# Submissions.


def test_write_submission(tmp_path, glue_dir):
  examples = glue.read_examples("mnli", "test_mismatched", glue_dir)
  path = tmp_path / "sub" / glue_task.SUBMISSION_FILES[("mnli", "test_mismatched")]
  glue_task.write_submission(glue.TASKS["mnli"], "test_mismatched", examples, np.array([2, 0]),
                        str(path))
  assert path.name == "MNLI-mm.tsv"
  assert path.read_text() == "index\tprediction\n0\tneutral\n1\tcontradiction\n"
  # Scores [N, num_labels] give their best class.
  examples = [Example("test-5", "a", "b", None), Example("test-9", "c", "d", None)]
  glue_task.write_submission(glue.TASKS["mrpc"], "test", examples,
                        np.array([[0.1, 0.9], [2.0, -1.0]]), str(path))
  assert path.read_text() == "index\tprediction\n5\t1\n9\t0\n"
  glue_task.write_submission(glue.TASKS["stsb"], "test", examples, np.array([5.23456, -0.2]),
                        str(path))
  assert path.read_text() == "index\tprediction\n5\t5.000\n9\t0.000\n"
  glue_task.write_submission(glue.TASKS["stsb"], "test", examples, np.array([[3.14159], [2.0]]),
                        str(path))
  assert path.read_text() == "index\tprediction\n5\t3.142\n9\t2.000\n"
  glue_task.write_submission(glue.TASKS["ax"], "test", examples, np.array([1, 2]), str(path))
  assert path.read_text() == "index\tprediction\n5\tentailment\n9\tneutral\n"
  assert os.listdir(tmp_path / "sub") == ["MNLI-mm.tsv"]  # no temporary file left
  with pytest.raises(ValueError, match=r"predictions have shape \(3,\); want \(2,\) or \(2, 2\)"):
    glue_task.write_submission(glue.TASKS["rte"], "test", examples, np.array([0, 1, 1]), str(path))
  with pytest.raises(ValueError, match=r"prediction 2 for test-9 is not a class of rte"):
    glue_task.write_submission(glue.TASKS["rte"], "test", examples, np.array([0, 2]), str(path))
  with pytest.raises(ValueError, match=r"example test-5 is not of split 'dev'"):
    glue_task.write_submission(glue.TASKS["rte"], "dev", examples, np.array([0, 1]), str(path))
  with pytest.raises(UserError, match=r"'mnli' has no split 'test'"):
    glue_task.write_submission(glue.TASKS["mnli"], "test", examples, np.array([0, 1]), str(path))
