"""SQuAD: reading, run_squad.py's windows and postprocessing, the official scores, fine-tuning.

Expected values are worked out by hand from run_squad.py's and the official evaluation scripts'
rules (the comments show the arithmetic). The end-to-end tests write SQuAD JSON whose answer is
the word after "key" in contexts longer than one window, fine-tune a small random BERT on it, and
check the official-format output files.
"""
import json
import os
import sys

import numpy as np
import pytest

from bertjax import metrics, tokenization
from bertjax.data.finetuning import squad as squad_data
from bertjax.tasks import squad_answers
from bertjax.errors import UserError
from bertjax import tasks
from bertjax.tasks import squad
from bertjax.tokenization import WordPieceTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = [f"word{i}" for i in range(30)]
ROOTS, SUFFIXES, COLORS = ["zor", "kel", "mar"], ["##bax", "##lo"], ["red", "blue", "gold"]
VOCAB = (SPECIALS + ["what", "follows", "key", "?", ",", ".", "(", ")", "-"] + FILLER + ROOTS +
         SUFFIXES + COLORS)
# One- or two-piece answer words: "zorbax" is zor ##bax.
ANSWER_WORDS = [r + s[2:] for r in ROOTS for s in SUFFIXES] + COLORS
QUESTION = "What follows key?"


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("".join(t + "\n" for t in VOCAB))
  return str(path)


@pytest.fixture(scope="module")
def tok(vocab_file):
  return WordPieceTokenizer(vocab_file, lowercase=True)


def _ids(tok, pieces):
  return [tok.token_to_id(p) for p in pieces]


# ----------------------------------------------------------------------------------------------
# Metrics: the official scripts' rules, on hand-computed cases.


def test_normalize_exact_match_and_f1():
  assert metrics.squad_normalize_answer("The  Quick, Brown fox!") == "quick brown fox"
  assert metrics.squad_normalize_answer("An apple a day") == "apple day"
  assert metrics.squad_normalize_answer("Theater's anthem") == "theaters anthem"
  assert metrics.squad_exact_match("The Cat.", "cat") == 1.0
  assert metrics.squad_exact_match("cats", "cat") == 0.0
  # pred {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3, F1 = 2 * 2/3 / (5/3) = 0.8
  assert metrics.squad_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
  # shared words count with multiplicity: min(2, 1) = 1; P = 1/2, R = 1, F1 = 2/3
  assert metrics.squad_f1("cat cat", "cat") == pytest.approx(2 / 3)
  assert metrics.squad_f1("dog", "cat") == 0.0
  # Both normalize to nothing: v1.1 scores 0 (no shared word), v2.0 scores 1 (they agree).
  assert metrics.squad_f1("the", "a") == 0.0
  assert metrics.squad_f1("the", "a", version_2=True) == 1.0
  assert metrics.squad_f1("", "cat", version_2=True) == 0.0


def _qa(qid, *answers):
  return {"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0}
                                                   for a in answers]}


def test_squad_metrics_v1():
  data = [{"paragraphs": [{"context": "", "qas": [
      _qa("q1", "Denver Broncos", "The Denver Broncos"),
      _qa("q2", "Carolina Panthers", "Panthers"),
      _qa("q3", "Levi's Stadium")]}]}]
  predictions = {"q1": "denver broncos", "q2": "the panthers team", "extra": "ignored"}
  result = metrics.squad_metrics(data, predictions)
  # q1: EM 1, F1 1. q2: EM 0; F1 max(vs "carolina panthers": P 1/2 R 1/2 -> 1/2,
  # vs "panthers": P 1/2 R 1 -> 2/3) = 2/3. q3: no prediction, 0 (but counted).
  assert result == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 2 / 3) / 3})
  with pytest.raises(ValueError, match="version_2=True"):
    metrics.squad_metrics([{"paragraphs": [{"qas": [_qa("q", )]}]}], {"q": ""})


def test_squad_metrics_v2():
  data = [{"paragraphs": [{"context": "", "qas": [
      _qa("a", "Paris"), _qa("b", "the Seine river", "Seine"), _qa("c"), _qa("d"),
      _qa("e", "a")]}]}]  # e's only answer normalizes to nothing: its gold becomes ""
  predictions = {"a": "Paris", "b": "river", "c": "", "d": "London", "e": ""}
  # exact: a 1, b 0, c 1, d 0, e 1. f1: b = max(P 1 R 1/2 -> 2/3, 0) = 2/3.
  result = metrics.squad_metrics(data, predictions, version_2=True)
  assert result == pytest.approx({
      "exact": 60.0, "f1": 100 * (1 + 2 / 3 + 1 + 0 + 1) / 5, "total": 5,
      "HasAns_exact": 200 / 3, "HasAns_f1": 100 * (1 + 2 / 3 + 1) / 3, "HasAns_total": 3,
      "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})

  na_probs = {"a": 0.1, "b": 0.7, "c": 0.9, "d": 2.0, "e": 0.5}
  result = metrics.squad_metrics(data, predictions, na_probs, 1.0, version_2=True)
  # d's 2.0 > 1.0: d counts as answered "" -> 1. Best thresholds: start at 2 (the NoAns
  # questions), then by na_prob: a +1 (3, 0.1), e +1 (4, 0.5), b +0 / +2/3 (exact 4 / f1 4.67,
  # 0.7), c +0, d -1 (predicted "London").
  assert result == pytest.approx({
      "exact": 80.0, "f1": 100 * (1 + 2 / 3 + 1 + 1 + 1) / 5, "total": 5,
      "HasAns_exact": 200 / 3, "HasAns_f1": 100 * (1 + 2 / 3 + 1) / 3, "HasAns_total": 3,
      "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
      "best_exact": 80.0, "best_exact_thresh": 0.5,
      "best_f1": 100 * (4 + 2 / 3) / 5, "best_f1_thresh": 0.7})
  with pytest.raises(ValueError, match="no prediction"):
    metrics.squad_metrics(data, {"a": "Paris"}, version_2=True)


# ----------------------------------------------------------------------------------------------
# Reading.


def test_split_words():
  words, char_to_word = squad_data.split_words(" a b\u202fcd\n")
  assert words == ("a", "b", "cd")
  assert char_to_word == [-1, 0, 0, 1, 1, 2, 2, 2]  # whitespace belongs to the word before it


def _dataset(*qas, context="word0 key (Zorbax), word1."):
  return {"version": "1.1", "data": [{"title": "t", "paragraphs": [
      {"context": context, "qas": list(qas)}]}]}


def test_read_examples():
  zorbax = {"id": "q1", "question": QUESTION,
            "answers": [{"text": "Zorbax", "answer_start": 11}]}
  misplaced = {"id": "q2", "question": QUESTION,  # "word1" is not at character 0
               "answers": [{"text": "word1", "answer_start": 0}]}
  impossible = {"id": "q3", "question": QUESTION, "answers": [], "is_impossible": True}
  examples = squad_data.read_examples(_dataset(zorbax, misplaced), is_training=True,
                                      version_2_with_negative=False)
  assert examples == [squad_data.Example("q1", QUESTION, ("word0", "key", "(Zorbax),", "word1."),
                                         "Zorbax", 2, 2)]  # q2 is skipped, as run_squad does
  examples = squad_data.read_examples(_dataset(zorbax, impossible), is_training=True,
                                      version_2_with_negative=True)
  assert [(e.qas_id, e.is_impossible, e.start_position) for e in examples] == [
      ("q1", False, 2), ("q3", True, -1)]
  # Prediction reads every question, answers or not.
  examples = squad_data.read_examples(_dataset(misplaced, impossible), is_training=False,
                                      version_2_with_negative=False)
  assert [e.qas_id for e in examples] == ["q2", "q3"]

  with pytest.raises(UserError, match="version_2_with_negative=True"):
    squad_data.read_examples(_dataset(impossible), is_training=True,
                             version_2_with_negative=False)
  two = dict(zorbax, answers=zorbax["answers"] * 2)
  with pytest.raises(UserError, match="q1 .* has 2 answers; each training question needs "
                     "exactly one"):
    squad_data.read_examples(_dataset(two), is_training=True, version_2_with_negative=False)
  outside = dict(zorbax, answers=[{"text": "Zorbax", "answer_start": 40}])
  with pytest.raises(UserError, match="outside its context"):
    squad_data.read_examples(_dataset(outside), is_training=True, version_2_with_negative=False)
  with pytest.raises(UserError, match=r"data\[0\].paragraphs\[0\].qas\[0\] lacks \"question\""):
    squad_data.read_examples(_dataset({"id": "q"}), is_training=False,
                             version_2_with_negative=False)


def test_read_dataset_errors(tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    squad_data.read_dataset(str(tmp_path / "missing.json"))
  with pytest.raises(UserError, match="is a directory"):
    squad_data.read_dataset(str(tmp_path))
  bad = tmp_path / "bad.json"
  bad.write_text('{"data": [')
  with pytest.raises(UserError, match="not valid JSON"):
    squad_data.read_dataset(str(bad))
  bad.write_bytes(b'{"data": ["caf\xe9"]}')  # Latin-1
  with pytest.raises(UserError, match="not UTF-8"):
    squad_data.read_dataset(str(bad))
  bad.write_text("[1, 2]")
  with pytest.raises(UserError, match="not SQuAD's format"):
    squad_data.read_dataset(str(bad))


# ----------------------------------------------------------------------------------------------
# Windows.


def test_doc_spans_and_max_context():
  assert squad_data.doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad_data.doc_spans(10, 4, 8) == [(0, 4), (4, 4), (8, 2)]  # steps <= window length
  assert squad_data.doc_spans(3, 4, 2) == [(0, 3)]
  assert squad_data.doc_spans(0, 4, 2) == []
  spans = [(0, 4), (2, 4), (4, 4), (6, 4)]
  # token 2: span 0 scores min(2, 1) + .04, span 1 min(0, 3) + .04 -> 0; token 3: 0.04 vs 1.04
  # -> 1; and so on.
  best = squad_data.max_context(spans, 10).argmax(axis=0)
  np.testing.assert_array_equal(best, [0, 0, 0, 1, 1, 2, 2, 3, 3, 3])
  assert squad_data.max_context(spans, 10).sum(axis=0).tolist() == [1] * 10
  # Equal context on both sides: the longer window wins (1 + 0.04 > 1 + 0.03).
  assert squad_data.max_context([(0, 4), (1, 3)], 4)[:, 2].tolist() == [True, False]


def _windows_examples():
  long = squad_data.Example("q1", QUESTION, ("word0", "word1", "key", "(Zorbax),", "word2",
                                             "word3", "word4", "word5", "word6", "word7"),
                            "Zorbax", 3, 3)
  short = squad_data.Example("q2", QUESTION, ("key", "red"), "red", 1, 1)
  return [long, short]


def test_windows(tok):
  # q1's context: word0 word1 key ( zor ##bax ) , word2 ... word7 = 14 tokens; the question is
  # cut to "what follows key" (3); a row of 12 holds 12 - 3 - 3 = 6 context tokens; windows
  # start 4 apart: tokens [0, 6), [4, 10), [8, 14).
  features = squad_data.convert_examples_to_features(
      _windows_examples(), tok, max_seq_length=12, doc_stride=4, max_query_length=3,
      is_training=True)
  assert len(features) == 4
  np.testing.assert_array_equal(features.example_index, [0, 0, 0, 1])
  np.testing.assert_array_equal(features.doc_span_index, [0, 1, 2, 0])
  query = ["[CLS]", "what", "follows", "key", "[SEP]"]
  context = ["word0", "word1", "key", "(", "zor", "##bax", ")", ",", "word2", "word3", "word4",
             "word5", "word6", "word7"]
  for row, start in zip(features.input_ids[:3], (0, 4, 8)):
    assert row.tolist() == _ids(tok, query + context[start:start + 6] + ["[SEP]"])
  assert features.input_ids[3].tolist() == _ids(tok, query + ["key", "red", "[SEP]"]) + [0] * 4
  np.testing.assert_array_equal(features.segment_ids[0], [0] * 5 + [1] * 7)
  np.testing.assert_array_equal(features.segment_ids[3], [0] * 5 + [1] * 3 + [0] * 4)
  np.testing.assert_array_equal(features.input_mask[3], [1] * 8 + [0] * 4)
  # The answer "Zorbax" is word 3, "(Zorbax),": tokens 3..7, narrowed to zor ##bax (4, 5). It is
  # at row positions 5 + 4 - start in windows 0 and 1; window 2 and padding point at [CLS].
  np.testing.assert_array_equal(features.start_position, [9, 5, 0, 6])
  np.testing.assert_array_equal(features.end_position, [10, 6, 0, 6])
  np.testing.assert_array_equal(features.token_to_orig[0],
                                [-1] * 5 + [0, 1, 2, 3, 3, 3] + [-1])
  np.testing.assert_array_equal(features.token_to_orig[3], [-1] * 5 + [0, 1] + [-1] * 5)
  # Max context: tokens 0-4 in window 0, 5-8 in window 1, 9-13 in window 2 (token 4: window 0
  # min(4, 1) vs window 1 min(0, 5); token 8: window 1 min(4, 1) vs window 2 min(0, 5)).
  np.testing.assert_array_equal(features.token_is_max_context[0], [0] * 5 + [1] * 5 + [0] * 2)
  np.testing.assert_array_equal(features.token_is_max_context[1], [0] * 6 + [1] * 4 + [0] * 2)
  np.testing.assert_array_equal(features.token_is_max_context[2], [0] * 6 + [1] * 5 + [0])
  # Impossible questions point at [CLS] in every window; prediction features carry no labels.
  impossible = squad_data.Example("q3", QUESTION, _windows_examples()[0].doc_tokens,
                                  is_impossible=True)
  features = squad_data.convert_examples_to_features(
      [impossible], tok, max_seq_length=12, doc_stride=4, max_query_length=3, is_training=True)
  assert features.start_position.tolist() == features.end_position.tolist() == [0, 0, 0]
  inputs = features.model_inputs(with_labels=False)
  assert sorted(inputs) == ["feature_index", "input_ids", "input_mask", "segment_ids"]
  with pytest.raises(UserError, match="must exceed data.max_query_length"):
    squad_data.convert_examples_to_features(_windows_examples(), tok, max_seq_length=6,
                                            doc_stride=4, max_query_length=3, is_training=True)


def test_improve_answer_span(tok):
  # "(Zorbax-Kello)." is the pieces ( zor ##bax - kel ##lo ) .
  doc = _ids(tok, ["(", "zor", "##bax", "-", "kel", "##lo", ")", "."])
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Zorbax") == (1, 2)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Kello") == (4, 5)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Zorbax-Kello") == (1, 5)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Marlo") == (0, 7)  # not inside


def test_basic_tokenize_is_berts(vocab_file):
  # pylint: disable-next=import-outside-toplevel
  from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer
  texts = ["Steve Smith's (1895-1943).", "Café,  ÅNGSTRÖM\tx", "中文ab\u00adc", "a\x00b -- ¿Qué?"]
  for lowercase in (True, False):
    tokenizer = WordPieceTokenizer(vocab_file, lowercase=lowercase)
    reference = BasicTokenizer(do_lower_case=lowercase, tokenize_chinese_chars=True)
    for text in texts:
      assert squad_answers.basic_tokenize(text, tokenizer) == reference.tokenize(text), text


def test_get_final_text(vocab_file, tok):
  cased = WordPieceTokenizer(vocab_file, lowercase=False)
  assert squad_answers.get_final_text("steve smith", "Steve Smith's", tok) == "Steve Smith"
  assert squad_answers.get_final_text("1895", "(1895-1943).", tok) == "1895"
  assert squad_answers.get_final_text("cafe", "Café,", tok) == "Café"
  # Decomposed é: lower-casing strips the accent, the lengths differ, the whole text is kept.
  assert squad_answers.get_final_text("cafe", "Cafe\u0301,", tok) == "Cafe\u0301,"
  assert squad_answers.get_final_text("john", "Steve Smith's", tok) == "Steve Smith's"
  # Cased: the prediction must match the case.
  assert squad_answers.get_final_text("steve smith", "Steve Smith's", cased) == "Steve Smith's"
  assert squad_answers.get_final_text("Steve Smith", "Steve Smith's", cased) == "Steve Smith"
  assert squad_data.detokenize(_ids(tok, ["zor", "##bax", ",", "red"]), tok) == "zorbax , red"


def test_sentencepiece_answers(tmp_path):
  rng = np.random.default_rng(0)
  words = ["key", "red", "Zorbax", "Kello", "word", "thing", "(Zorbax),", "(red)."]
  sp = tokenization.train_sentencepiece(
      (" ".join(rng.choice(words, size=8)) for _ in range(300)), str(tmp_path / "sp"), 64)
  assert [sp.id_to_token(i) for i in sp.encode("(Zorbax),")] == ["\u2581(", "Zorbax", "),"]
  assert [sp.id_to_token(i) for i in sp.encode("Zorbax")] == ["\u2581Zorbax"]  # another piece
  example = squad_data.Example("q", "key?", ("key", "(Zorbax),", "red"), "Zorbax", 1, 1)
  features = squad_data.convert_examples_to_features(
      [example], sp, max_seq_length=20, doc_stride=4, max_query_length=4, is_training=True)
  start, end = features.start_position[0], features.end_position[0]
  assert sp.id_to_token(int(features.input_ids[0, start])) == "Zorbax" and start == end
  context = features.input_ids[0, start - 2:end + 3]  # ▁key ▁( Zorbax ), ▁red
  assert squad_data.detokenize(context, sp) == "key (Zorbax), red"
  assert squad_answers.get_final_text("Zorbax", "(Zorbax),", sp) == "Zorbax"


# ----------------------------------------------------------------------------------------------
# Postprocessing.


def _logits(num_features, seq, entries):
  """[num_features, seq] start and end logits: -10, except {(feature, position): (s, e)}."""
  start, end = np.full((num_features, seq), -10.0), np.full((num_features, seq), -10.0)
  for (f, position), (s, e) in entries.items():
    if s is not None:
      start[f, position] = s
    if e is not None:
      end[f, position] = e
  return start, end


def test_postprocess(tok):
  examples = _windows_examples()
  features = squad_data.convert_examples_to_features(
      examples, tok, max_seq_length=12, doc_stride=4, max_query_length=3, is_training=False)
  start, end = _logits(4, 12, {
      (0, 0): (1.0, 1.0),  # window 0: null score 2
      (0, 9): (5.0, None), (0, 10): (None, 4.0),  # zor ##bax: 9
      (1, 0): (3.0, 2.0),  # window 1: null score 5
      (1, 5): (8.0, None), (1, 6): (None, 8.0),  # 16, but token 4 is window 0's max context
      (2, 0): (4.0, 4.0),
      (3, 6): (2.0, 2.0),  # q2: "red"
  })
  result = squad_answers.postprocess(examples, features, start, end, tok)
  assert result.predictions == {"q1": "Zorbax", "q2": "red"}
  assert result.null_odds == {} and not result.version_2_with_negative
  nbest = result.nbest["q1"]
  assert nbest[0]["text"] == "Zorbax" and (nbest[0]["start_logit"], nbest[0]["end_logit"]) == (
      5.0, 4.0)
  scores = [e["start_logit"] + e["end_logit"] for e in nbest]
  assert scores == sorted(scores, reverse=True) and len(nbest) <= 20
  assert len({e["text"] for e in nbest}) == len(nbest) and "" not in {e["text"] for e in nbest}
  assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
  # The window 1 span (16) is not taken; window 1's ##bax (position 6) ends "bax" at -10 + 8.
  assert "bax" in [e["text"] for e in nbest]
  # One token at most: window 1's ##bax (-10 + 8) beats window 0's zor (5 - 10).
  short = squad_answers.postprocess(examples, features, start, end, tok, max_answer_length=1)
  assert [e["text"] for e in short.nbest["q1"][:2]] == ["bax", "Zor"]
  # 3 best starts and ends of a window hold no valid one-token span: run_squad's "empty".
  short = squad_answers.postprocess(examples, features, start, end, tok, n_best_size=3,
                                 max_answer_length=1)
  assert short.nbest["q1"] == [{"text": "empty", "probability": 1.0, "start_logit": 0.0,
                                "end_logit": 0.0}]

  # SQuAD 2.0: the null score is the smallest [CLS] score over the windows: 2 (window 0); the
  # best span scores 9, so null - best = -7.
  v2 = squad_answers.postprocess(examples, features, start, end, tok, version_2_with_negative=True)
  assert v2.predictions["q1"] == "Zorbax" and v2.null_odds["q1"] == pytest.approx(-7.0)
  null = [e for e in v2.nbest["q1"] if e["text"] == ""]
  assert [(e["start_logit"], e["end_logit"]) for e in null] == [(1.0, 1.0)]
  assert null[0]["probability"] == pytest.approx(np.exp(2 - 9) * v2.nbest["q1"][0]["probability"])
  v2 = squad_answers.postprocess(examples, features, start, end, tok, version_2_with_negative=True,
                              null_score_diff_threshold=-7.5)
  assert v2.predictions["q1"] == ""  # -7 > -7.5
  # Windows without logits: q1 (missing window 2) is left out.
  partial = squad_answers.postprocess(examples, features, start[[0, 1, 3]], end[[0, 1, 3]], tok,
                                   feature_index=np.array([0, 1, 3]))
  assert partial.predictions == {"q2": "red"}


# ----------------------------------------------------------------------------------------------
# Fine-tuning end to end.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random (untrained) small BERT saved as a bertjax checkpoint with its vocab.txt."""
  return random_bert(tmp_path_factory.mktemp("model"), VOCAB)


def _write_squad(path, rng, n, impossible_share):
  """n paragraphs of 35-54 filler words; the answer (capitalized, in "(...),", so that
  get_final_text must trim it) is the answer word (one or two pieces) after "key". An impossible
  question's context has neither."""
  paragraphs = []
  for i in range(n):
    words = list(rng.choice(FILLER, size=rng.integers(35, 55)))
    qa = {"id": f"q{i}", "question": QUESTION, "answers": [], "is_impossible": True}
    if rng.random() >= impossible_share:
      answer = str(rng.choice(ANSWER_WORDS)).capitalize()
      position = int(rng.integers(0, len(words)))
      before = " ".join(words[:position] + ["key"])
      words = [before, f"({answer}),"] + words[position:]
      qa.update(answers=[{"text": answer, "answer_start": len(before) + 2}],
                is_impossible=False)
    paragraphs.append({"context": " ".join(words), "qas": [qa]})
  path.write_text(json.dumps({"version": "v2.0" if impossible_share else "1.1",
                              "data": [{"title": "synthetic", "paragraphs": paragraphs}]}))
  return str(path)


def _config(model_dir, train_file, predict_file, version="v1.1"):
  from bertjax.configs import squad as squad_config  # pylint: disable=import-outside-toplevel
  config = squad_config.get_config(version)
  config.init_checkpoint = model_dir
  config.data.update(train_file=train_file, predict_file=predict_file, max_seq_length=48,
                     doc_stride=16, max_query_length=8)
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=1e-3,
                      num_train_epochs=3.0, log_every_steps=1000,
                      eval_every_steps=10**6)  # evaluate at the end only
  return config


def test_squad_v1_learns_and_writes_run_squad_files(model_dir, tok, tmp_path):
  rng = np.random.default_rng(0)
  train_file = _write_squad(tmp_path / "train.json", rng, 320, 0.0)
  dev_file = _write_squad(tmp_path / "dev.json", rng, 48, 0.0)
  config = _config(model_dir, train_file, dev_file)
  workdir = tmp_path / "run"
  result = tasks.run(config, str(workdir))
  assert config.train.num_train_steps == 3 * (320 // 16)  # epochs of questions, as run_squad
  dev = json.loads(open(dev_file).read())
  features = squad_data.convert_examples_to_features(
      squad_data.read_examples(dev, is_training=False, version_2_with_negative=False),
      tok, max_seq_length=48, doc_stride=16, max_query_length=8, is_training=False)
  assert len(features) > 1.5 * 48  # most contexts span several windows
  assert set(result) == {"exact_match", "f1"}
  assert result["exact_match"] > 90, result  # chance: about 0

  predictions = json.loads((workdir / squad_answers.PREDICTIONS_FILE).read_text())
  qids = [qa["id"] for qa in metrics.squad_questions(dev["data"])]
  assert list(predictions) == qids and all(isinstance(v, str) for v in predictions.values())
  # The official scoring of predictions.json gives the reported result.
  assert metrics.squad_metrics(dev["data"], predictions) == pytest.approx(result)
  golds = {qa["id"]: qa["answers"][0]["text"] for qa in metrics.squad_questions(dev["data"])}
  exact = [q for q in qids if predictions[q] == golds[q]]  # original casing, "(", ")," trimmed
  assert len(exact) > 0.9 * len(qids)
  nbest = json.loads((workdir / squad_answers.NBEST_FILE).read_text())
  assert list(nbest) == qids
  assert all(set(e) == {"text", "probability", "start_logit", "end_logit"}
             for entries in nbest.values() for e in entries)
  assert not (workdir / squad_answers.NULL_ODDS_FILE).exists()
  assert json.loads((workdir / "eval_results.json").read_text())["f1"] == result["f1"]


def test_squad_v2_learns_no_answer(model_dir, tmp_path):
  rng = np.random.default_rng(1)
  train_file = _write_squad(tmp_path / "train.json", rng, 320, 0.3)
  dev_file = _write_squad(tmp_path / "dev.json", rng, 48, 0.3)
  workdir = tmp_path / "run"
  config = _config(model_dir, train_file, dev_file, "v2.0")
  config.train.num_train_epochs = 6.0  # most windows point at [CLS]: spans come later
  result = tasks.run(config, str(workdir))
  assert result["HasAns_total"] + result["NoAns_total"] == result["total"] == 48
  assert result["HasAns_total"] > 20 and result["NoAns_total"] > 5
  assert result["HasAns_exact"] > 85 and result["NoAns_exact"] > 85, result
  assert {"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} <= set(result)
  predictions = json.loads((workdir / squad_answers.PREDICTIONS_FILE).read_text())
  null_odds = json.loads((workdir / squad_answers.NULL_ODDS_FILE).read_text())
  assert list(null_odds) == list(predictions)
  # predictions.json answers "" exactly where null_odds exceeds the threshold (0.0).
  assert all((predictions[q] == "") == (null_odds[q] > 0.0) for q in predictions)
  dev = json.loads(open(dev_file).read())
  assert metrics.squad_metrics(dev["data"], predictions, null_odds,
                               version_2=True) == pytest.approx(result)


def test_bad_configs_are_named(model_dir, tmp_path):
  rng = np.random.default_rng(2)
  v1_file = _write_squad(tmp_path / "v1.json", rng, 20, 0.0)
  v2_file = _write_squad(tmp_path / "v2.json", rng, 20, 0.5)
  with pytest.raises(UserError, match="set --config.init_checkpoint"):
    tasks.run(_config("", v1_file, v1_file), str(tmp_path / "a"))
  with pytest.raises(UserError, match="does not exist"):
    tasks.run(_config(model_dir, str(tmp_path / "nope.json"), v1_file), str(tmp_path / "b"))
  with pytest.raises(UserError, match="version_2_with_negative=True"):
    tasks.run(_config(model_dir, v1_file, v2_file), str(tmp_path / "c"))
  with pytest.raises(UserError, match="version_2_with_negative=True"):
    tasks.run(_config(model_dir, v2_file, v1_file), str(tmp_path / "d"))
  short = _config(model_dir, v1_file, v1_file)
  short.data.max_query_length = 45
  with pytest.raises(UserError, match="must exceed data.max_query_length"):
    tasks.run(short, str(tmp_path / "e"))
  assert not any((tmp_path / d).exists() for d in "abcde")
  from bertjax.configs import squad as squad_config  # pylint: disable=import-outside-toplevel
  assert squad_config.get_config("v2.0").train.learning_rate == 5e-5
  assert squad_config.get_config("v2.0").data.version_2_with_negative
  assert squad_config.get_config().train.learning_rate == 3e-5
  with pytest.raises(UserError, match="v1.1 or v2.0"):
    squad_config.get_config("v3")
