"""Evaluation metrics for fine-tuning, on the host in numpy (float64).

Each function takes two 1-D arrays of equal length `[n]` (labels and predictions, or two score
vectors) and returns a Python float. The definitions are those of the references GLUE results
are reported with: scikit-learn's `accuracy_score`, `f1_score` and `matthews_corrcoef`, and
scipy's `pearsonr` and `spearmanr` (tests/test_metrics.py checks each against them).

`glue_metrics(task, labels, predictions)` returns the metrics the GLUE benchmark reports for a
task, under the key names of Hugging Face `evaluate`'s "glue" metric.
"""
from __future__ import annotations

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
