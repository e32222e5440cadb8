"""NER on CoNLL-2003-format data (bertjax.data.finetuning.ner, bertjax.tasks.ner, configs/ner.py).

Reading, first-sub-token features, windows and the way back to words are checked on small exact
cases; seqeval's numbers on a hand example. End to end, a small random BERT with a WordPiece
vocabulary (which lacks some names, so they split into pieces) is fine-tuned on synthetic
CoNLL files whose tags follow from the words, and has to tag the dev file well.
"""
import json
import os
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import metrics, tokenization
from bertjax.data.finetuning import ner as ner_data
from bertjax.errors import UserError
from bertjax import tasks
from bertjax.models import heads
from bertjax.tasks import finetuning, ner
from bertjax.training import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = [f"word{i}" for i in range(30)]
# "maximilian", "okonkwo" and "berlinton" are not in the vocabulary: they split into pieces.
PIECES = ["alice", "bob", "carol", "max", "##imi", "##lian", "smith", "jones", "ok", "##on",
          "##kwo", "paris", "london", "berlin", "##ton", "new", "york", "acme", "corp", "met",
          "in", "."]
VOCAB = SPECIALS + PIECES + FILLER
FIRST = ["Alice", "Bob", "Carol", "Maximilian"]  # B-PER
LAST = ["Smith", "Jones", "Okonkwo"]  # I-PER after a first name
CITIES = ["Paris", "London", "Berlinton"]  # B-LOC


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random (untrained) small BERT saved as a bertjax checkpoint with its vocab.txt."""
  return random_bert(tmp_path_factory.mktemp("model"), VOCAB)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
  return tokenization.load_tokenizer(model_dir)


def _sentence(rng, length):
  """(words, tags): filler words (O) with a person, a place and an organisation among them."""
  words = [str(w) for w in rng.choice(FILLER, size=length)]
  tags = ["O"] * length
  entities = [[(str(rng.choice(FIRST)), "B-PER")] + (
      [(str(rng.choice(LAST)), "I-PER")] if rng.random() < 0.6 else []),
              [(str(rng.choice(CITIES)), "B-LOC")] if rng.random() < 0.7 else
              [("New", "B-LOC"), ("York", "I-LOC")],
              [("Acme", "B-ORG")] + ([("Corp", "I-ORG")] if rng.random() < 0.5 else [])]
  for entity in entities:
    if rng.random() < 0.75:
      at = int(rng.integers(0, len(words) + 1))
      words[at:at] = [w for w, _ in entity]
      tags[at:at] = [t for _, t in entity]
  return words + ["."], tags + ["O"]


def _write_conll(path, sentences, columns=4):
  """CoNLL-2003 as distributed: a -DOCSTART- line, then "word POS chunk NER" lines."""
  lines = ["-DOCSTART- -X- -X- O", ""]
  for words, tags in sentences:
    for word, tag in zip(words, tags):
      lines.append(f"{word} NNP B-NP {tag}" if columns == 4 else f"{word} {tag}")
    lines.append("")
  path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def conll_dir(tmp_path_factory):
  """train.txt, valid.txt and test.txt; a few sentences of each are longer than 32 pieces."""
  directory = tmp_path_factory.mktemp("conll")
  rng = np.random.default_rng(0)
  for name, n in (("train.txt", 320), ("valid.txt", 64), ("test.txt", 48)):
    sentences = [_sentence(rng, int(rng.integers(3, 9))) for _ in range(n)]
    sentences += [_sentence(rng, 40) for _ in range(3)]
    _write_conll(directory / name, sentences, columns=2 if name == "test.txt" else 4)
  return directory


def _config(model_dir, data_dir, **train):
  from bertjax.configs import ner as ner_config  # pylint: disable=import-outside-toplevel
  config = ner_config.get_config()
  config.init_checkpoint = model_dir
  config.data.data_dir = str(data_dir)
  config.data.max_seq_length = 32
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update({**dict(batch_size=16, eval_batch_size=32, learning_rate=2e-3,
                              num_train_epochs=3.0, log_every_steps=1000), **train})
  return config


def _make_task(config, workdir):
  """finetuning.make_task of NER on the typed `config` (a ConfigDict), with its run context."""
  typed = tasks.typed(config)
  return finetuning.make_task(ner.SPEC, typed, workdir, train.run_context(typed))


def _read_output(path):
  """A predictions file -> [sentence][word] (word, gold, predicted) rows."""
  sentences, current = [], []
  for line in path.read_text().splitlines():
    if line:
      current.append(tuple(line.split(" ")))
    elif current:
      sentences.append(current)
      current = []
  assert not current, "the last sentence must end with a blank line"
  return sentences


# ----------------------------------------------------------------------------------------------
# Reading.


def test_read_conll_docstart_blank_lines_and_columns(tmp_path):
  path = tmp_path / "a.txt"
  path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
                  "German JJ B-NP B-MISC\n\n\n  \nPeter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER"
                  "\n-DOCSTART- -X- -X- O\nBRUSSELS\tNNP\tB-NP\tB-LOC")  # no final newline
  sentences = ner_data.read_conll(str(path))
  assert sentences == [
      ner_data.Sentence(("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC"), 3),
      ner_data.Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER"), 9),
      ner_data.Sentence(("BRUSSELS",), ("B-LOC",), 12)]
  chunks = ner_data.read_conll(str(path), label_column=2)
  assert chunks[0].tags == ("B-NP", "B-VP", "B-NP")
  two = tmp_path / "b.txt"
  two.write_text("EU B-ORG\nrejects O\n\nPeter B-PER\nSão\u00a0Paulo  B-LOC\n")  # NBSP: one word
  assert [(s.words, s.tags) for s in ner_data.read_conll(str(two))] == [
      (("EU", "rejects"), ("B-ORG", "O")), (("Peter", "São\u00a0Paulo"), ("B-PER", "B-LOC"))]
  words_only = tmp_path / "c.txt"
  words_only.write_text("EU\nrejects\n\nPeter\n")
  assert ner_data.read_conll(str(words_only)) == [
      ner_data.Sentence(("EU", "rejects"), None, 1), ner_data.Sentence(("Peter",), None, 4)]
  assert ner_data.label_list(sentences) == ["B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER", "O"]
  assert ner_data.label_list(sentences[1:2]) == ["B-PER", "I-PER", "O"]  # "O" always a class


def test_read_errors_are_named(tmp_path):
  with pytest.raises(UserError, match="missing.txt does not exist"):
    ner_data.read_conll(str(tmp_path / "missing.txt"))
  with pytest.raises(UserError, match="is a directory"):
    ner_data.read_conll(str(tmp_path))
  cases = {b"caf\xe9 O\n": "not UTF-8: line 1",
           b"EU B-ORG\nrejects\n": r"b.txt:2: 1 column\(s\), but earlier lines have a tag",
           b"\n-DOCSTART- -X- O O\n\n": "holds no sentence"}
  for data, message in cases.items():
    (tmp_path / "b.txt").write_bytes(data)
    with pytest.raises(UserError, match=message):
      ner_data.read_conll(str(tmp_path / "b.txt"))
  (tmp_path / "b.txt").write_text("EU NNP B-NP B-ORG\n")
  for column in (4, -5, 0):
    with pytest.raises(UserError, match=f"b.txt:1: no label column {column} in 4 columns"):
      ner_data.read_conll(str(tmp_path / "b.txt"), label_column=column)
  (tmp_path / "c.txt").write_text("EU\n\nrejects\n")
  with pytest.raises(UserError, match="training file has no tags"):
    ner_data.label_list(ner_data.read_conll(str(tmp_path / "c.txt")))
  dev = [ner_data.Sentence(("a", "b"), ("O", "B-PER"), 7),
         ner_data.Sentence(("c",), ("B-FOO",), 10)]
  with pytest.raises(UserError, match="dev.txt:10: tag 'B-FOO' does not occur in the training"):
    ner_data.check_tags(dev, ["B-PER", "O"], "dev.txt")


# ----------------------------------------------------------------------------------------------
# Features and the way back.


def test_first_sub_token_carries_the_label(tokenizer):
  labels = ["B-LOC", "B-PER", "I-PER", "O"]
  sentence = ner_data.Sentence(("Alice", "Maximilian", "met", "Okonkwo", "\u200b"),
                               ("B-PER", "I-PER", "O", "B-PER", "O"), 1)
  features, windows = ner_data.encode_sentences([sentence], labels, tokenizer, 14)
  ids = [tokenizer.token_to_id(t) for t in ["[CLS]", "alice", "max", "##imi", "##lian", "met",
                                            "ok", "##on", "##kwo", "[UNK]", "[SEP]"]]
  np.testing.assert_array_equal(features["input_ids"], [ids + [0, 0, 0]])
  np.testing.assert_array_equal(features["input_mask"], [[1] * 11 + [0] * 3])
  np.testing.assert_array_equal(features["segment_ids"], np.zeros((1, 14)))
  # first sub-tokens: alice (1), max (2), met (5), ok (6), and the empty word as [UNK] (9)
  np.testing.assert_array_equal(features["label_weights"],
                                [[0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(features["label_ids"],
                                [[0, 1, 2, 0, 0, 3, 1, 0, 0, 3, 0, 0, 0, 0]])
  assert features["label_weights"].dtype == np.float32 and features["label_ids"].dtype == np.int32
  assert windows == [ner_data.Window(0, 0, 5)]
  untagged, _ = ner_data.encode_sentences([ner_data.Sentence(sentence.words, None, 1)], labels,
                                          tokenizer, 14)
  assert "label_ids" not in untagged
  np.testing.assert_array_equal(untagged["label_weights"], features["label_weights"])
  with pytest.raises(UserError, match="max_seq_length=2"):
    ner_data.encode_sentences([sentence], labels, tokenizer, 2)
  with pytest.raises(UserError, match="train.txt:1: tag 'B-PER' does not occur"):
    ner_data.encode_sentences([sentence], ["O"], tokenizer, 14, "train.txt")


def test_long_sentences_split_into_windows_of_whole_words(tokenizer):
  labels = ["B-PER", "I-PER", "O"]
  rng = np.random.default_rng(1)
  words = [str(w) for w in rng.choice(FIRST + LAST + FILLER[:5], size=23)]
  tags = [str(t) for t in rng.choice(labels, size=23)]
  sentences = [ner_data.Sentence(("Bob",), ("B-PER",), 1),
               ner_data.Sentence(tuple(words), tuple(tags), 3)]
  pieces = [len(tokenizer.encode(w)) for w in words]
  assert max(pieces) == 3 and sum(pieces) > 2 * 8
  features, windows = ner_data.encode_sentences(sentences, labels, tokenizer, 10)
  assert windows[0] == ner_data.Window(0, 0, 1) and len(windows) >= 4
  # Consecutive windows of the long sentence cover every word exactly once.
  assert [w.sentence for w in windows[1:]] == [1] * (len(windows) - 1)
  assert windows[1].start == 0 and windows[-1].end == 23
  assert all(a.end == b.start for a, b in zip(windows[1:], windows[2:]))
  for row, window in enumerate(windows[1:], start=1):
    length = sum(pieces[window.start:window.end])
    assert length <= 8 and (window.end == 23 or length + pieces[window.end] > 8)  # as long as fits
    assert features["input_mask"][row].sum() == length + 2
    assert features["input_ids"][row, length + 1] == tokenizer.sep_id
    assert features["label_weights"][row].sum() == window.end - window.start
  kept = features["label_ids"][1:][features["label_weights"][1:] > 0]
  np.testing.assert_array_equal(kept, [labels.index(t) for t in tags])

  # A word longer than the row keeps its first pieces; its first sub-token is still labelled.
  features, windows = ner_data.encode_sentences(
      [ner_data.Sentence(("Maximilian", "Bob"), ("B-PER", "O"), 1)], labels, tokenizer, 4)
  assert windows == [ner_data.Window(0, 0, 1), ner_data.Window(0, 1, 2)]
  np.testing.assert_array_equal(features["input_ids"][0], [
      tokenizer.cls_id, tokenizer.token_to_id("max"), tokenizer.token_to_id("##imi"),
      tokenizer.sep_id])


def test_predictions_map_back_to_one_tag_per_word(tokenizer):
  labels = ["B-LOC", "B-PER", "I-PER", "O"]
  sentences = [ner_data.Sentence(("Alice", "Okonkwo", "met"), ("B-PER", "I-PER", "O"), 1),
               ner_data.Sentence(("Maximilian",) * 5 + ("Paris",), ("B-PER",) * 5 + ("B-LOC",),
                                 5),
               ner_data.Sentence(("in", "London"), ("O", "B-LOC"), 12)]
  features, windows = ner_data.encode_sentences(sentences, labels, tokenizer, 10)
  assert [w.sentence for w in windows] == [0, 1, 1, 1, 2]
  gold = [list(s.tags) for s in sentences]
  predictions = np.where(features["label_weights"] > 0, features["label_ids"], 3)  # O elsewhere
  assert ner.tags_of_words(windows, sentences, predictions, features["label_weights"],
                           labels) == gold
  # Fewer rows (an evaluation cut short): sentences with a missing row are None.
  assert ner.tags_of_words(windows, sentences, predictions[:3], features["label_weights"],
                           labels) == [gold[0], None, None]
  bad = features["label_weights"].copy()
  bad[1, 1] = 0
  with pytest.raises(ValueError, match="row 1 has 1 first sub-tokens but its window holds 2"):
    ner.tags_of_words(windows, sentences, predictions, bad, labels)


def test_seqeval_scores_on_a_hand_example():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
  predicted = [["B-PER", "I-PER", "B-MISC", "B-ORG"], ["O", "I-ORG", "I-ORG"]]
  # Gold: PER, LOC, ORG. Predicted: PER (right), MISC, ORG at the LOC, and ORG from I-ORG after O
  # (right: conlleval starts an entity there; strict IOB2 would not).
  scores = metrics.entity_scores(gold, predicted)
  assert scores == pytest.approx({"precision": 2 / 4, "recall": 2 / 3, "f1": 4 / 7,
                                  "accuracy": 4 / 7})
  iob1 = metrics.entity_scores([["I-PER", "I-PER", "B-PER", "O"]], [["B-PER", "I-PER", "B-PER", "O"]])
  assert iob1["f1"] == 1.0  # the same two entities, written in IOB1 and IOB2
  assert metrics.entity_scores([["O", "O"]], [["O", "O"]]) == {
      "precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}
  sentences = [ner_data.Sentence(("a",) * 4, tuple(gold[0]), 1),
               ner_data.Sentence(("b",) * 3, tuple(gold[1]), 6)]
  assert ner.score_sentences(sentences, [predicted[0], None]) == metrics.entity_scores(
      gold[:1], predicted[:1])
  assert ner.score_sentences(sentences, [None, None]) == {}


# ----------------------------------------------------------------------------------------------
# Fine-tuning.


def test_ner_learns_and_writes_conll_predictions(model_dir, conll_dir, tmp_path):
  workdir = tmp_path / "ner"
  config = _config(model_dir, conll_dir)
  config.data.predict_file = "test.txt"
  result = tasks.run(config, str(workdir))
  assert set(result) == {"loss", "precision", "recall", "f1", "accuracy"}
  assert result["f1"] > 0.9, result  # an untrained tagger finds almost no entity
  saved = json.loads((workdir / "eval_results.json").read_text())
  steps = json.loads((workdir / "config.json").read_text())["train"]["num_train_steps"]
  assert config.train.num_train_steps == -1 and steps > 0  # from the epochs, as run
  assert saved["f1"] == result["f1"] and saved["step"] == steps
  assert json.loads((workdir / "labels.json").read_text()) == [
      "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]

  dev = ner_data.read_conll(str(conll_dir / "valid.txt"))
  rows = _read_output(workdir / ner.EVAL_PREDICTIONS_FILE)
  assert [[r[0] for r in s] for s in rows] == [list(s.words) for s in dev]  # every word, once
  assert [[r[1] for r in s] for s in rows] == [list(s.tags) for s in dev]
  assert max(len(s.words) for s in dev) > 32  # sentences longer than a row are all there
  scores = metrics.entity_scores([[r[1] for r in s] for s in rows], [[r[2] for r in s] for s in rows])
  assert scores["f1"] == pytest.approx(result["f1"])

  test = ner_data.read_conll(str(conll_dir / "test.txt"))
  rows = _read_output(workdir / ner.TEST_PREDICTIONS_FILE)
  assert [[r[:2] for r in s] for s in rows] == [list(zip(s.words, s.tags)) for s in test]
  test_scores = json.loads((workdir / ner.TEST_RESULTS_FILE).read_text())
  assert test_scores == pytest.approx(metrics.entity_scores(
      [[r[1] for r in s] for s in rows], [[r[2] for r in s] for s in rows]))
  assert test_scores["f1"] > 0.9, test_scores


def test_saved_labels_keep_their_ids(model_dir, conll_dir, tmp_path):
  saved = ["O", "I-PER", "I-ORG", "I-LOC", "I-MISC", "B-PER", "B-ORG", "B-MISC", "B-LOC"]
  (tmp_path / "labels.json").write_text(json.dumps(saved))
  task = _make_task(_config(model_dir, conll_dir), str(tmp_path))
  assert json.loads(task.files["labels.json"]) == saved
  params = jax.eval_shape(lambda rng, batch: heads.init_from_batch(task.model, rng, batch),
                          jax.random.PRNGKey(0), next(task.batches.train(None))[0])
  assert nn.unbox(params)["token_tagging"]["classifier"]["kernel"].shape == (64, len(saved))
  (tmp_path / "labels.json").write_text(json.dumps(["O", "B-PER"]))
  with pytest.raises(UserError, match="tag 'B-\\w+' does not occur.*a fresh workdir"):
    _make_task(_config(model_dir, conll_dir), str(tmp_path))


def test_bad_configs_are_named(model_dir, conll_dir, tmp_path):
  with pytest.raises(UserError, match="set --config.init_checkpoint"):
    tasks.run(_config("", conll_dir), str(tmp_path / "a"))
  with pytest.raises(UserError, match="missing.txt does not exist"):
    config = _config(model_dir, conll_dir)
    config.data.train_file = "missing.txt"
    tasks.run(config, str(tmp_path / "b"))
  with pytest.raises(UserError, match="no valid.txt or dev.txt in"):
    tasks.run(_config(model_dir, tmp_path), str(tmp_path / "c"))
  bad_dev = tmp_path / "dev.txt"
  bad_dev.write_text("Alice NNP B-NP B-PER\nin IN B-PP O\nRome NNP B-NP B-CITY\n")
  config = _config(model_dir, conll_dir)
  config.data.eval_file = str(bad_dev)
  with pytest.raises(UserError, match="dev.txt:3: tag 'B-CITY' does not occur in the training"):
    tasks.run(config, str(tmp_path / "d"))
  config = _config(model_dir, conll_dir, batch_size=1024)
  with pytest.raises(UserError, match="fewer than one global batch"):
    tasks.run(config, str(tmp_path / "e"))
  assert not any((tmp_path / d).exists() for d in "abcde")
