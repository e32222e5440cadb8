"""Tests of bertjax.metrics: each metric against scikit-learn / scipy on random inputs (binary
and 3-class, ties, single-class and constant edge cases) to 1e-12, a hand-computed case for each,
input checks, and glue_metrics' keys against Hugging Face evaluate's "glue" metric (< 1 s)."""
import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from sklearn.exceptions import UndefinedMetricWarning

from bertjax import metrics

SEEDS = range(5)
TOL = dict(rtol=0, atol=1e-12)


def _random_classes(seed, num_classes, n=97):
  """Labels and predictions `[n]` in 0..num_classes-1, predictions agreeing ~60% of the time."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, n)
  predictions = np.where(rng.random(n) < 0.6, labels, rng.integers(0, num_classes, n))
  return labels, predictions


def _sk_f1(labels, predictions, positive):
  """sklearn's F1 of `positive`: binary F1 for two classes, one-vs-rest otherwise."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UndefinedMetricWarning)
    if len(np.unique(np.concatenate([labels, predictions]))) <= 2:
      return sklearn.metrics.f1_score(labels, predictions, pos_label=positive)
    return sklearn.metrics.f1_score(labels, predictions, labels=[positive], average=None)[0]


# --- against the references, random inputs -------------------------------------------------------

@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_classification_metrics_match_sklearn(seed, num_classes):
  labels, predictions = _random_classes(seed, num_classes)
  np.testing.assert_allclose(metrics.accuracy(labels, predictions),
                             sklearn.metrics.accuracy_score(labels, predictions), **TOL)
  np.testing.assert_allclose(metrics.matthews_corrcoef(labels, predictions),
                             sklearn.metrics.matthews_corrcoef(labels, predictions), **TOL)
  for positive in range(num_classes):
    np.testing.assert_allclose(metrics.f1(labels, predictions, positive=positive),
                               _sk_f1(labels, predictions, positive), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_classification_metrics_match_sklearn_on_string_labels(seed):
  labels, predictions = _random_classes(seed, 3)
  names = np.array(["contradiction", "entailment", "neutral"])
  labels, predictions = names[labels], names[predictions]
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
  assert metrics.f1(labels, predictions, positive="neutral") == pytest.approx(
      _sk_f1(labels, predictions, "neutral"), abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_correlations_match_scipy(seed, ties):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=61)
  y = 0.7 * x + rng.normal(size=61)
  if ties:  # STS-B-like: scores on a coarse grid, many equal values in both inputs.
    x, y = np.round(x), np.round(y * 2) / 2
    assert len(np.unique(x)) < 20 and len(np.unique(y)) < 30
  np.testing.assert_allclose(metrics.pearson(x, y), scipy.stats.pearsonr(x, y)[0], **TOL)
  np.testing.assert_allclose(metrics.spearman(x, y), scipy.stats.spearmanr(x, y)[0], **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_correlations_match_scipy_on_integers_and_anticorrelation(seed):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 6, 40)  # int labels, heavy ties
  y = -x + rng.integers(0, 3, 40)
  assert metrics.pearson(x, y) < 0
  np.testing.assert_allclose(metrics.pearson(x, y), scipy.stats.pearsonr(x, y)[0], **TOL)
  np.testing.assert_allclose(metrics.spearman(x, y), scipy.stats.spearmanr(x, y)[0], **TOL)


# --- edge cases, against the references --------------------------------------------------------

@pytest.mark.parametrize("labels, predictions", [
    ([1, 1, 1, 1], [1, 0, 1, 0]),  # labels all one class: MCC undefined -> 0.0
    ([0, 1, 0, 1], [1, 1, 1, 1]),  # predictions all one class
    ([2, 2, 2], [2, 2, 2]),        # a single class anywhere, all correct
    ([0, 0, 0], [0, 0, 0]),        # no positive anywhere: F1 0/0 -> 0.0
    ([0, 0, 0], [1, 0, 0]),        # no positive label, a false positive: F1 0.0
    ([1, 1, 1], [0, 0, 0]),        # all positives missed: F1 0.0
    ([1], [1]),                    # one example
])
def test_single_class_edge_cases_match_sklearn(labels, predictions):
  labels, predictions = np.array(labels), np.array(predictions)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # sklearn warns on single labels and ill-defined F1.
    expected_mcc = sklearn.metrics.matthews_corrcoef(labels, predictions)
  assert metrics.matthews_corrcoef(labels, predictions) == expected_mcc
  assert metrics.accuracy(labels, predictions) == sklearn.metrics.accuracy_score(labels,
                                                                                  predictions)
  assert metrics.f1(labels, predictions) == _sk_f1(labels, predictions, 1)


def test_single_class_values():
  assert metrics.matthews_corrcoef(np.array([1, 1, 1, 1]), np.array([1, 0, 1, 0])) == 0.0
  assert metrics.f1(np.array([0, 0, 0]), np.array([0, 0, 0])) == 0.0


@pytest.mark.parametrize("x, y", [
    ([3.0, 3.0, 3.0, 3.0], [1.0, 2.0, 3.0, 4.0]),  # x constant
    ([1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]),  # y constant
    ([7, 7], [7, 7]),                              # both constant
])
def test_constant_input_gives_nan_like_scipy(x, y):
  x, y = np.array(x), np.array(y)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", scipy.stats.ConstantInputWarning)
    assert np.isnan(scipy.stats.pearsonr(x, y)[0]) and np.isnan(scipy.stats.spearmanr(x, y)[0])
  assert np.isnan(metrics.pearson(x, y))
  assert np.isnan(metrics.spearman(x, y))


def test_nan_input_gives_nan_like_scipy():
  x, y = np.array([1.0, np.nan, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 5.0])
  assert np.isnan(scipy.stats.pearsonr(x, y)[0]) and np.isnan(scipy.stats.spearmanr(x, y)[0])
  assert np.isnan(metrics.pearson(x, y)) and np.isnan(metrics.spearman(x, y))
  assert np.isnan(metrics.spearman(y, x))


def test_perfect_and_reversed_correlation():
  x = np.array([0.0, 1.0, 2.5, 4.0, 5.0])
  assert metrics.pearson(x, 2 * x + 1) == pytest.approx(1.0, abs=1e-15)
  assert metrics.pearson(x, -x) == pytest.approx(-1.0, abs=1e-15)
  assert metrics.spearman(x, np.exp(x)) == pytest.approx(1.0, abs=1e-15)  # monotone, not linear
  assert metrics.spearman(x, -x**3) == pytest.approx(-1.0, abs=1e-15)


# --- hand-computed -----------------------------------------------------------------------------

def test_accuracy_by_hand():
  assert metrics.accuracy(np.array([0, 1, 1, 0]), np.array([0, 1, 0, 0])) == 0.75


def test_f1_by_hand():
  # TP = 2 (positions 0, 4), FP = 1 (position 2), FN = 1 (position 1): 2*2 / (4 + 1 + 1).
  labels, predictions = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 1, 0, 1])
  assert metrics.f1(labels, predictions) == pytest.approx(2 / 3, abs=1e-15)
  # Class 0 as the positive one: TP = 1, FP = 1, FN = 1 -> 2 / 4.
  assert metrics.f1(labels, predictions, positive=0) == pytest.approx(0.5, abs=1e-15)


def test_matthews_binary_by_hand():
  # TP = 2, TN = 1, FP = 1, FN = 1: (2*1 - 1*1) / sqrt(3 * 3 * 2 * 2) = 1/6.
  labels, predictions = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 1, 0, 1])
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(1 / 6, abs=1e-15)


def test_matthews_three_class_by_hand():
  # Confusion [[2,0,0],[0,1,1],[0,1,1]]: c = 4, s = 6, t = p = [2,2,2]:
  # (4*6 - 12) / sqrt((36 - 12) * (36 - 12)) = 12 / 24.
  labels, predictions = np.array([0, 1, 2, 0, 1, 2]), np.array([0, 2, 1, 0, 1, 2])
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(0.5, abs=1e-15)
  # Perfect and perfectly wrong (a cyclic shift, every class still predicted equally often).
  assert metrics.matthews_corrcoef(labels, labels) == 1.0
  assert metrics.matthews_corrcoef(labels, (labels + 1) % 3) == pytest.approx(-0.5, abs=1e-15)


def test_pearson_by_hand():
  # Centered x = [-1, 0, 1], y = [-4/3, -1/3, 5/3]: 3 / (sqrt(2) * sqrt(42) / 3) = 9 / sqrt(84).
  assert metrics.pearson(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])) == pytest.approx(
      9 / np.sqrt(84), abs=1e-15)


def test_spearman_with_ties_by_hand():
  # Average ranks x -> [1, 2.5, 2.5, 4], y -> [1, 3, 2, 4]; centered [-1.5, 0, 0, 1.5] and
  # [-1.5, 0.5, -0.5, 1.5]: 4.5 / (sqrt(4.5) * sqrt(5)) = sqrt(0.9).
  x, y = np.array([10.0, 20.0, 20.0, 30.0]), np.array([1.0, 7.0, 3.0, 9.0])
  assert metrics.spearman(x, y) == pytest.approx(np.sqrt(0.9), abs=1e-15)


# --- input checks ------------------------------------------------------------------------------

ALL = [metrics.accuracy, metrics.f1, metrics.matthews_corrcoef, metrics.pearson, metrics.spearman]


@pytest.mark.parametrize("fn", ALL)
def test_empty_input_raises(fn):
  with pytest.raises(ValueError, match="0 elements"):
    fn(np.array([], dtype=np.int64), np.array([], dtype=np.int64))


@pytest.mark.parametrize("fn", ALL)
def test_mismatched_lengths_raise(fn):
  with pytest.raises(ValueError, match="differ in length: 3 and 2"):
    fn(np.array([0, 1, 1]), np.array([0, 1]))


@pytest.mark.parametrize("fn", ALL)
def test_not_1d_raises(fn):
  with pytest.raises(ValueError, match="1-D"):
    fn(np.array([[0, 1], [1, 0]]), np.array([[0, 1], [1, 0]]))


@pytest.mark.parametrize("fn", [metrics.pearson, metrics.spearman])
def test_correlation_of_one_pair_raises(fn):
  with pytest.raises(ValueError, match="at least 2"):
    fn(np.array([1.0]), np.array([2.0]))


# --- GLUE --------------------------------------------------------------------------------------

# Keys as Hugging Face evaluate's "glue" metric returns them (metrics/glue/glue.py); `ax`, which
# that metric lacks, as GLUE's diagnostic is scored: Matthews correlation.
EXPECTED_KEYS = {
    "cola": ["matthews_correlation"],
    "sst2": ["accuracy"], "mnli": ["accuracy"], "mnli_matched": ["accuracy"],
    "mnli_mismatched": ["accuracy"], "qnli": ["accuracy"], "rte": ["accuracy"],
    "wnli": ["accuracy"],
    "mrpc": ["accuracy", "f1"], "qqp": ["accuracy", "f1"],
    "stsb": ["pearson", "spearmanr"],
    "ax": ["matthews_correlation"],
}


def _hf_glue_reference(task, labels, predictions):
  """What HF evaluate's glue metric computes (sklearn + scipy), ax added as GLUE scores it."""
  if task in ("cola", "ax"):
    return {"matthews_correlation": sklearn.metrics.matthews_corrcoef(labels, predictions)}
  if task == "stsb":
    return {"pearson": scipy.stats.pearsonr(predictions, labels)[0],
            "spearmanr": scipy.stats.spearmanr(predictions, labels)[0]}
  accuracy = float((predictions == labels).mean())
  if task in ("mrpc", "qqp"):
    return {"accuracy": accuracy, "f1": sklearn.metrics.f1_score(y_true=labels, y_pred=predictions)}
  return {"accuracy": accuracy}


@pytest.mark.parametrize("task", sorted(EXPECTED_KEYS))
def test_glue_metrics_match_hf_reference(task):
  assert set(metrics.GLUE_METRICS) == set(EXPECTED_KEYS)
  if task == "stsb":
    rng = np.random.default_rng(0)
    labels = np.round(rng.uniform(0, 5, 50) * 5) / 5
    predictions = labels + rng.normal(scale=0.8, size=50)
  else:
    labels, predictions = _random_classes(1, 3 if task in ("mnli", "mnli_matched",
                                                           "mnli_mismatched", "ax") else 2)
  result = metrics.glue_metrics(task, labels, predictions)
  assert list(result) == EXPECTED_KEYS[task]
  assert all(type(value) is float for value in result.values())
  expected = _hf_glue_reference(task, labels, predictions)
  for key in expected:
    np.testing.assert_allclose(result[key], expected[key], **TOL)


def test_glue_metrics_unknown_task_lists_known_ones():
  with pytest.raises(ValueError, match="unknown GLUE task 'sts-b'.*cola.*mrpc.*stsb.*ax"):
    metrics.glue_metrics("sts-b", np.array([1.0, 2.0]), np.array([1.0, 2.0]))
