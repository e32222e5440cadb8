"""SQuAD's official scores: the v1.1 and v2.0 evaluation scripts' normalization, exact match
and F1, and squad_metrics over a dataset (with v2.0's no-answer probabilities and best
thresholds), on cases worked out by hand (the comments show the arithmetic).
"""
import pytest

from bertjax import metrics


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
