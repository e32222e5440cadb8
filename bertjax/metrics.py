"""Evaluation metrics for fine-tuning, on the host in numpy (float64).

Each function takes two 1-D arrays of equal length `[n]` (labels and predictions, or two score
vectors) and returns a Python float. The definitions are those of the references GLUE results
are reported with: scikit-learn's `accuracy_score`, `f1_score` and `matthews_corrcoef`, and
scipy's `pearsonr` and `spearmanr` (tests/test_metrics.py checks each against them).

`glue_metrics(task, labels, predictions)` returns the metrics the GLUE benchmark reports for a
task, under the key names of Hugging Face `evaluate`'s "glue" metric.

SQuAD: `squad_exact_match` / `squad_f1` score one answer and `squad_metrics` a whole dev file's
predictions, by the rules of the official evaluate-v1.1.py and evaluate-v2.0.py. NER:
`entity_scores` is seqeval's entity-level precision / recall / F1 (conlleval's rules).
"""
from __future__ import annotations

import collections
import re
import string
from typing import Callable

import numpy as np


def _check_pair(a, b, min_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """`a`, `b` as arrays `[n]`; ValueError unless both are 1-D, of one length n >= `min_size`."""
  a, b = np.asarray(a), np.asarray(b)
  if a.ndim != 1 or b.ndim != 1:
    raise ValueError(f"metrics take 1-D arrays; got shapes {a.shape} and {b.shape}.")
  if a.shape != b.shape:
    raise ValueError(f"metric inputs differ in length: {a.shape[0]} and {b.shape[0]}; pass one "
                     "prediction per label.")
  if a.shape[0] < min_size:
    raise ValueError(f"metric inputs have {a.shape[0]} elements; this metric needs at least "
                     f"{min_size}.")
  return a, b


def accuracy(labels, predictions) -> float:
  """Fraction of positions where `predictions` equals `labels`, both `[n]`."""
  labels, predictions = _check_pair(labels, predictions)
  return float(np.mean(labels == predictions))


def f1(labels, predictions, positive=1) -> float:
  """F1 of the class `positive`: 2 TP / (2 TP + FP + FN), both inputs `[n]`.

  With two classes this is sklearn's `f1_score(labels, predictions, pos_label=positive)`; with
  more it is the one-vs-rest F1 of `positive` (sklearn: `labels=[positive], average=None`).
  When `positive` occurs in neither input (TP + FP + FN = 0) the score is 0.0, as sklearn's
  default `zero_division` gives.
  """
  labels, predictions = _check_pair(labels, predictions)
  true_pos = labels == positive
  pred_pos = predictions == positive
  tp = np.sum(true_pos & pred_pos)
  fp = np.sum(~true_pos & pred_pos)
  fn = np.sum(true_pos & ~pred_pos)
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  """Matthews correlation coefficient of class labels `[n]`, any number of classes.

  The multi-class form (Gorodkin's R_K, the "R3" GLUE uses for its diagnostic set) from the
  confusion matrix C: (c s - t.p) / sqrt((s^2 - p.p) (s^2 - t.t)), with c = trace(C), s = n,
  t and p the per-class counts of labels and predictions. For two classes it is the usual
  (TP TN - FP FN) / sqrt(...). 0.0 when a denominator factor is 0 (one input holds a single
  class), as sklearn returns.
  """
  labels, predictions = _check_pair(labels, predictions)
  classes, index = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  k, n = len(classes), len(labels)
  # [n] label index, [n] prediction index -> [k, k] confusion matrix (rows: labels).
  confusion = np.bincount(index[:n] * k + index[n:], minlength=k * k).reshape(k, k)
  t = confusion.sum(axis=1, dtype=np.float64)  # [k] label counts
  p = confusion.sum(axis=0, dtype=np.float64)  # [k] prediction counts
  c = np.trace(confusion, dtype=np.float64)
  s = p.sum()
  cov_tp = c * s - np.dot(t, p)
  cov_pp_tt = (s**2 - np.dot(p, p)) * (s**2 - np.dot(t, t))
  return float(cov_tp / np.sqrt(cov_pp_tt)) if cov_pp_tt else 0.0


def pearson(x, y) -> float:
  """Pearson correlation of `x` and `y`, both `[n]` with n >= 2.

  NaN when either input is constant (the correlation is undefined there) or holds a NaN, as
  scipy.stats.pearsonr returns (scipy also warns; this does not).
  """
  x, y = _check_pair(x, y, min_size=2)
  x, y = x.astype(np.float64), y.astype(np.float64)
  if np.all(x == x[0]) or np.all(y == y[0]):
    return float("nan")
  xm, ym = x - x.mean(), y - y.mean()
  r = np.dot(xm / np.linalg.norm(xm), ym / np.linalg.norm(ym))
  return float(np.clip(r, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks of `x` `[n]`, ties sharing their mean rank (scipy's rankdata 'average')."""
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  starts_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])  # [n]
  starts = np.flatnonzero(starts_run)  # [runs] first sorted position of each run of ties
  ends = np.append(starts[1:], len(x))  # [runs] one past its last
  ranks = np.empty(len(x))
  ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(starts_run) - 1]  # mean of start+1..end
  return ranks


def spearman(x, y) -> float:
  """Spearman rank correlation of `x` and `y`, both `[n]` with n >= 2: Pearson of average ranks.

  NaN when either input is constant or holds a NaN, as scipy.stats.spearmanr returns. (For n = 1
  scipy returns NaN; this raises ValueError, as `pearson` and scipy's pearsonr do.)
  """
  x, y = _check_pair(x, y, min_size=2)
  x, y = x.astype(np.float64), y.astype(np.float64)
  if np.isnan(x).any() or np.isnan(y).any():
    return float("nan")
  return pearson(_average_ranks(x), _average_ranks(y))


# Metric name (as Hugging Face `evaluate`'s "glue" metric reports it) -> fn(labels, predictions).
_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_corrcoef,
    "pearson": pearson,
    "spearmanr": spearman,
}

# GLUE task -> the metrics reported for it (Wang et al. 2019; HF evaluate's "glue" metric). `ax`,
# the diagnostic set scored with an MNLI model, is reported as the 3-class Matthews correlation
# (the paper's R3); HF's metric has no `ax`.
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("matthews_correlation",),
}


def glue_metrics(task: str, labels, predictions) -> dict[str, float]:
  """The GLUE metrics of `task` for `labels` and `predictions`, both `[n]`.

  Class ids for classification tasks, scores for `stsb`. Returns e.g. {"accuracy": ..., "f1": ...}
  for mrpc; raises ValueError for a task not in GLUE_METRICS.
  """
  if task not in GLUE_METRICS:
    raise ValueError(f"unknown GLUE task {task!r}; known tasks: {', '.join(GLUE_METRICS)}.")
  return {name: _METRICS[name](labels, predictions) for name in GLUE_METRICS[task]}


# ----------------------------------------------------------------------------------------------
# SQuAD: the rules of the official evaluation scripts, evaluate-v1.1.py and evaluate-v2.0.py.

_SQUAD_PUNCTUATION = frozenset(string.punctuation)
_SQUAD_ARTICLES = re.compile(r"\b(a|an|the)\b")


def squad_normalize_answer(text: str) -> str:
  """SQuAD's answer normalization: lower-case, drop punctuation (string.punctuation), replace the
  articles a/an/the by spaces, collapse whitespace; in that order."""
  text = "".join(c for c in text.lower() if c not in _SQUAD_PUNCTUATION)
  return " ".join(_SQUAD_ARTICLES.sub(" ", text).split())


def squad_exact_match(prediction: str, ground_truth: str) -> float:
  """1.0 if the normalized answers are equal, else 0.0."""
  return float(squad_normalize_answer(prediction) == squad_normalize_answer(ground_truth))


def squad_f1(prediction: str, ground_truth: str, *, version_2: bool = False) -> float:
  """Token F1 of two answers: the normalized words they share (with multiplicity), over both.

  No shared word gives 0.0. With `version_2` (evaluate-v2.0.py's compute_f1) an answer that
  normalizes to nothing (e.g. "" for no answer) scores 1.0 against another such answer and 0.0
  against any other; evaluate-v1.1.py scores it 0.0 always.
  """
  pred_tokens = squad_normalize_answer(prediction).split()
  gold_tokens = squad_normalize_answer(ground_truth).split()
  if version_2 and (not pred_tokens or not gold_tokens):
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_questions(data: list) -> list[dict]:
  """The qas entries of SQuAD's data list (data[].paragraphs[].qas[]), in file order."""
  return [qa for article in data for paragraph in article["paragraphs"]
          for qa in paragraph["qas"]]


def squad_metrics(data: list, predictions: dict[str, str], na_probs: dict[str, float] | None = None,
                  na_prob_thresh: float = 1.0, *, version_2: bool = False) -> dict[str, float]:
  """SQuAD scores of `predictions` against the answers of `data`, as the official scripts give.

  SQuAD v1.1 (evaluate-v1.1.py): each question scores the best exact match and F1 over its
  answers; a question without a prediction scores 0. Returns {"exact_match", "f1"}, in percent.

  SQuAD v2.0 (evaluate-v2.0.py, `version_2`): answers that normalize to nothing are dropped, and a
  question without answers (unanswerable) has the one gold answer "" (only "" scores 1 on it).
  A question whose na_probs entry exceeds na_prob_thresh counts as answered "" (default na_probs:
  0 for every question). Returns "exact", "f1" and "total" over all questions, the same with
  prefixes "HasAns_" and "NoAns_" over answerable and unanswerable ones (when there are any), and,
  when na_probs is given, "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh": the
  best scores over all na_probs thresholds and the thresholds reaching them.

  Args:
    data: the "data" list of a SQuAD file (data[].paragraphs[].qas[] with id and answers[].text).
    predictions: {question id: answer text} ("" for no answer).
    na_probs: v2.0: {question id: score that the question has no answer}, e.g. null_odds.json.
    na_prob_thresh: v2.0: the no-answer threshold on na_probs (the official default 1.0).
    version_2: score by evaluate-v2.0.py's rules, else evaluate-v1.1.py's.

  Raises:
    ValueError: no questions; v1.1: a question without answers; v2.0: a question without a
      prediction or (na_probs given) without an na_probs entry, which the official script fails on.
  """
  questions = squad_questions(data)
  if not questions:
    raise ValueError("the SQuAD data holds no questions.")
  if not version_2:
    exact = f1_sum = 0.0
    for qa in questions:
      if not qa["answers"]:
        raise ValueError(f"question {qa['id']} has no answers; score SQuAD 2.0 data with "
                         "version_2=True.")
      if qa["id"] not in predictions:
        continue  # scores 0, as "Unanswered question ... will receive score 0"
      prediction, golds = predictions[qa["id"]], [a["text"] for a in qa["answers"]]
      exact += max(squad_exact_match(prediction, gold) for gold in golds)
      f1_sum += max(squad_f1(prediction, gold) for gold in golds)
    return {"exact_match": 100.0 * exact / len(questions), "f1": 100.0 * f1_sum / len(questions)}

  missing = [qa["id"] for qa in questions if qa["id"] not in predictions]
  if missing:
    raise ValueError(f"{len(missing)} questions have no prediction (e.g. {missing[0]}); "
                     "evaluate-v2.0.py needs one for every question.")
  has_answer = {qa["id"]: bool(qa["answers"]) for qa in questions}
  exact_raw, f1_raw = {}, {}
  for qa in questions:
    golds = [a["text"] for a in qa["answers"] if squad_normalize_answer(a["text"])] or [""]
    prediction = predictions[qa["id"]]
    exact_raw[qa["id"]] = max(squad_exact_match(prediction, gold) for gold in golds)
    f1_raw[qa["id"]] = max(squad_f1(prediction, gold, version_2=True) for gold in golds)
  probs = {qid: 0.0 for qid in predictions} if na_probs is None else na_probs
  lacking = [qid for qid in has_answer if qid not in probs]
  if lacking:
    raise ValueError(f"{len(lacking)} questions have no na_probs entry (e.g. {lacking[0]}).")

  def thresholded(raw):  # a question predicted unanswerable scores 1 iff it is
    return {qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else s
            for qid, s in raw.items()}

  exact, f1_scores = thresholded(exact_raw), thresholded(f1_raw)

  def summary(qids, prefix=""):
    return {f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            f"{prefix}f1": 100.0 * sum(f1_scores[q] for q in qids) / len(qids),
            f"{prefix}total": len(qids)}

  result = summary(list(exact))
  for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
    qids = [qid for qid, has in has_answer.items() if has == wanted]
    if qids:
      result.update(summary(qids, prefix))
  if na_probs is not None:
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
      best, thresh = _squad_best_threshold(predictions, raw, na_probs, has_answer)
      result[f"best_{name}"], result[f"best_{name}_thresh"] = best, thresh
  return result


def _squad_best_threshold(predictions: dict[str, str], scores: dict[str, float],
                          na_probs: dict[str, float], has_answer: dict[str, bool]
                          ) -> tuple[float, float]:
  """evaluate-v2.0.py's find_best_thresh: (best score in percent, its na_probs threshold).

  Starting from "every question answered \"\"" (all unanswerable ones right), questions are
  answered in the order of increasing na_probs: an answerable one adds its score, an unanswerable
  one with a non-empty prediction costs 1.
  """
  score = best = float(sum(not has for has in has_answer.values()))
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_answer[qid]:
      score += scores[qid]
    elif predictions[qid]:
      score -= 1
    if score > best:
      best, best_thresh = score, na_probs[qid]
  return 100.0 * best / len(scores), best_thresh


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
  """Entity-level precision, recall and F1 by seqeval (its default mode: conlleval's rules, IOB1
  or IOB2 tags) and the accuracy over words, for [num_sentences][num_words] tags (NER).

  Precision, recall and F1 are 0.0 where nothing is predicted (or nothing is gold).
  """
  import seqeval.metrics as m  # pylint: disable=import-outside-toplevel
  return {"precision": float(m.precision_score(gold, predicted, zero_division=0)),
          "recall": float(m.recall_score(gold, predicted, zero_division=0)),
          "f1": float(m.f1_score(gold, predicted, zero_division=0)),
          "accuracy": float(m.accuracy_score(gold, predicted))}
