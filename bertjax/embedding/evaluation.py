"""Scores of sentence embeddings, in numpy (float64 where it counts), by the rules of the
references they are reported with:

  - `retrieval`: sentence-transformers' `InformationRetrievalEvaluator` (cosine similarity,
    each query's corpus ranked best first, ties to the lower corpus index; accuracy, precision,
    recall, MRR, nDCG and MAP at each k). Its nDCG is binary: a document is relevant (1) or not
    (0) whatever its grade, where BEIR's pytrec_eval weighs grades; as in BEIR, only a
    relevance above 0 counts as relevant.
  - `sts`: sentence-transformers' `EmbeddingSimilarityEvaluator`: Spearman and Pearson
    correlation of each pair's cosine with its gold score (`bertjax.metrics`, scipy's rules).
  - `transfer`: SentEval's binary tasks (MR, CR, SUBJ, MPQA; `InnerKFoldClassifier`): k-fold
    cross-validation of a logistic regression on the frozen embeddings, unstandardised, its C
    (inverse L2 strength) picked in each training part by an inner k-fold from 2**-2 .. 2**3;
    scikit-learn's `StratifiedKFold(shuffle=True, random_state=seed)` folds and
    `LogisticRegression(C)` (lbfgs' problem: the intercept unpenalised, multinomial beyond two
    classes) solved exactly by Newton's method (jax, float64), so no scikit-learn is needed.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import metrics
from bertjax.errors import UserError

SENTEVAL_C = tuple(2.0**t for t in range(-2, 4))  # InnerKFoldClassifier's grid, sklearn's C
SENTEVAL_SEED = 1111  # its StratifiedKFold's random_state


def _unit(x: np.ndarray) -> np.ndarray:
  """Rows of `x` [n, d] divided by their L2 norm (at least 1e-12, as sentence-transformers'
  `cos_sim` has it), float64."""
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def top_k(query_embeddings: np.ndarray, corpus_embeddings: np.ndarray, k: int, *,
          corpus_chunk_size: int = 16384, query_chunk_size: int = 1024
          ) -> tuple[np.ndarray, np.ndarray]:
  """([q, k'] corpus indices, [q, k'] cosines), each query's k' = min(k, c) most similar
  documents of `corpus_embeddings` [c, d] for `query_embeddings` [q, d], best first, ties to the
  lower index. Scored a block of queries by a chunk of the corpus at a time, so no [q, c] matrix
  is held; the result does not depend on the chunk sizes (the cosines are float64's, rounded to
  float32)."""
  queries, corpus = _unit(query_embeddings), _unit(corpus_embeddings)
  k = min(k, len(corpus))
  out_index = np.zeros((len(queries), k), np.int64)
  out_score = np.zeros((len(queries), k), np.float32)
  for q0 in range(0, len(queries), query_chunk_size):
    block = queries[q0:q0 + query_chunk_size]
    best_i = np.zeros((len(block), 0), np.int64)
    best_s = np.zeros((len(block), 0), np.float32)
    for c0 in range(0, len(corpus), corpus_chunk_size):
      # [queries, chunk] cosines, rounded to float32 from float64: a text's copies tie exactly
      # whatever the chunk they fall in (sentence-transformers' float32 sums may not).
      scores = (block @ corpus[c0:c0 + corpus_chunk_size].T).astype(np.float32)
      take = min(k, scores.shape[1])
      if take < scores.shape[1]:
        picked = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        kth = np.take_along_axis(scores, picked, 1).min(axis=1, keepdims=True)
        # Rows with more candidates tied at the k-th score than places: the lowest indices.
        for row in np.flatnonzero((scores >= kth).sum(axis=1) > take):
          picked[row] = np.lexsort((np.arange(scores.shape[1]), -scores[row]))[:take]
      else:
        picked = np.broadcast_to(np.arange(take), scores.shape).copy()
      best_i = np.concatenate([best_i, picked + c0], axis=1)
      best_s = np.concatenate([best_s, np.take_along_axis(scores, picked, 1)], axis=1)
      order = np.lexsort((best_i, -best_s), axis=1)[:, :k]  # by score, then lower index
      best_i, best_s = (np.take_along_axis(a, order, 1) for a in (best_i, best_s))
    out_index[q0:q0 + len(block)], out_score[q0:q0 + len(block)] = best_i, best_s
  return out_index, out_score


def retrieval(query_embeddings: np.ndarray, corpus_embeddings: np.ndarray,
              qrels: Mapping[int, Mapping[int, int]], ks: Sequence[int] = (1, 3, 5, 10, 100),
              *, corpus_chunk_size: int = 16384) -> dict[str, float]:
  """Retrieval metrics of `query_embeddings` [q, d] against `corpus_embeddings` [c, d].

  qrels: {query index: {corpus index: relevance}}; a relevance above 0 makes the document
    relevant. A query with no relevant document is left out (sentence-transformers' rule), as
    are queries not in qrels.
  Returns {"accuracy_at_K", "precision_at_K", "recall_at_K", "mrr_at_K", "ndcg_at_K",
    "map_at_K" for each K of ks, "queries": how many were scored}, each a mean over the queries
    of sentence-transformers' definition (module docstring): accuracy, a relevant document in
    the first K; precision, relevant in the first K / K; recall, / the relevant count; MRR, 1 /
    the rank of the first relevant in the first K; nDCG, binary gains over log2(rank + 1),
    against all relevant first; MAP, precisions at each relevant rank / min(K, relevant count).
  """
  relevant = {int(q): {int(c) for c, grade in docs.items() if grade > 0}
              for q, docs in qrels.items()}
  scored = sorted(q for q, docs in relevant.items() if docs)
  if not scored:
    raise UserError("no query has a relevant document (a relevance above 0); give qrels with "
                    "some.")
  ks = sorted({int(k) for k in ks})
  if ks[0] < 1:
    raise UserError(f"k={ks[0]}; use 1 or more.")
  bad = [(q, c) for q in scored for c in relevant[q]
         if not 0 <= q < len(query_embeddings) or not 0 <= c < len(corpus_embeddings)]
  if bad:
    raise UserError(f"qrels name query {bad[0][0]} and document {bad[0][1]}, but there are "
                    f"{len(query_embeddings)} queries and {len(corpus_embeddings)} documents.")
  ranked, _ = top_k(np.asarray(query_embeddings)[scored], corpus_embeddings, ks[-1],
                    corpus_chunk_size=corpus_chunk_size)
  hits = np.asarray([[i in relevant[q] for i in row] for q, row in zip(scored, ranked)],
                    np.float64).reshape(len(scored), -1)  # [queries, ranks]
  hits = np.pad(hits, ((0, 0), (0, ks[-1] - hits.shape[1])))
  count = np.asarray([len(relevant[q]) for q in scored], np.float64)  # [queries]
  ranks = np.arange(1, ks[-1] + 1)
  discount = 1.0 / np.log2(ranks + 1)
  correct = np.cumsum(hits, axis=1)  # [queries, ranks] relevant up to each rank
  first = np.where(hits.any(axis=1), hits.argmax(axis=1) + 1, ks[-1] + 1)  # rank of the first
  out: dict[str, float] = {}
  for k in ks:
    ideal = np.asarray([discount[:min(int(n), k)].sum() for n in count])
    out[f"accuracy_at_{k}"] = float(np.mean(first <= k))
    out[f"precision_at_{k}"] = float(np.mean(correct[:, k - 1] / k))
    out[f"recall_at_{k}"] = float(np.mean(correct[:, k - 1] / count))
    out[f"mrr_at_{k}"] = float(np.mean(np.where(first <= k, 1.0 / first, 0.0)))
    out[f"ndcg_at_{k}"] = float(np.mean((hits[:, :k] * discount[:k]).sum(axis=1) / ideal))
    out[f"map_at_{k}"] = float(np.mean((hits[:, :k] * correct[:, :k] / ranks[:k]).sum(axis=1) /
                                       np.minimum(k, count)))
  out["queries"] = len(scored)
  return out


def sts(embeddings_a: np.ndarray, embeddings_b: np.ndarray, scores: Sequence[float]
        ) -> dict[str, float]:
  """{"spearman_cosine", "pearson_cosine"}: the correlations of the cosine of each pair
  (`embeddings_a` [n, d], `embeddings_b` [n, d], row by row) with its gold score (`scores` [n]),
  as sentence-transformers' EmbeddingSimilarityEvaluator reports them (NaN where the cosines
  are all equal)."""
  scores = np.asarray(scores, np.float64)
  if np.shape(embeddings_a) != np.shape(embeddings_b) or len(scores) != len(embeddings_a):
    raise UserError(f"{np.shape(embeddings_a)} and {np.shape(embeddings_b)} embeddings for "
                    f"{len(scores)} scores; give one pair of embeddings a score.")
  if len(scores) < 2 or np.all(scores == scores[0]):
    raise UserError(f"{len(scores)} pairs, their scores all {scores[0] if len(scores) else ''}; "
                    "a correlation needs at least 2 pairs of different scores.")
  cosine = np.sum(_unit(embeddings_a) * _unit(embeddings_b), axis=-1)  # [n]
  return {"spearman_cosine": metrics.spearman(scores, cosine),
          "pearson_cosine": metrics.pearson(scores, cosine)}


def stratified_folds(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
  """[n] the fold (0 .. folds - 1) each example is held out in: scikit-learn's
  `StratifiedKFold(folds, shuffle=True, random_state=seed)` test folds, to the example."""
  _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
  encoded = np.unique(first, return_inverse=True)[1][inverse]  # classes by first appearance
  allocation = np.asarray([np.bincount(np.sort(encoded)[i::folds], minlength=len(first))
                           for i in range(folds)])  # [folds, classes]
  rng = np.random.RandomState(seed)  # pylint: disable=no-member
  out = np.empty(len(labels), np.int64)
  for k in range(len(first)):
    fold_of = np.arange(folds).repeat(allocation[:, k])
    rng.shuffle(fold_of)
    out[encoded == k] = fold_of
  return out


class Logistic:
  """A fitted L2-regularised logistic regression: `weights` [d + 1, m], the last row the
  intercept; m = 1 (a sigmoid of class 1 against 0) for two classes, else one column a class
  (softmax). Classes are 0 .. classes - 1."""

  def __init__(self, weights: np.ndarray, classes: int):
    self.weights, self.classes = np.asarray(weights, np.float64), classes

  def logits(self, features: np.ndarray) -> np.ndarray:
    """[n, m] logits of `features` [n, d]."""
    return np.asarray(features, np.float64) @ self.weights[:-1] + self.weights[-1]

  def probabilities(self, features: np.ndarray) -> np.ndarray:
    """[n, classes] class probabilities (scikit-learn's `predict_proba`)."""
    z = self.logits(features)
    z = np.concatenate([np.zeros_like(z), z], axis=1) if self.classes == 2 else z
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)

  def predict(self, features: np.ndarray) -> np.ndarray:
    """[n] the likeliest class (class 1 of two only where its logit is above 0)."""
    z = self.logits(features)
    return (z[:, 0] > 0).astype(np.int64) if self.classes == 2 else z.argmax(axis=1)


def _fit_one(x: jax.Array, y: jax.Array, mask: jax.Array, c: jax.Array, w: jax.Array
             ) -> jax.Array:
  """[d + 1, m] weights minimising c * (the log-losses of the rows `mask` [n] keeps) + the
  penalty, by Newton's method with a backtracking line search from `w` [d + 1, m]; `x` [n, d + 1]
  (a last column of ones), `y` [n, m] (one-hot; two classes: class 1's column alone)."""
  m, width = y.shape[1], x.shape[1]
  penalty = jnp.ones(width).at[-1].set(0.0)  # [d + 1] no penalty on the intercept
  # Softmax's intercepts may all move together at no cost: a tiny curvature pins them.
  diagonal = jnp.tile(penalty + (1e-10 if m > 1 else 0.0) * (1 - penalty), m)  # [m (d + 1)]

  def objective(w):
    z = x @ w  # [n, m]
    full = jnp.concatenate([jnp.zeros_like(z[:, :1]), z], axis=1) if m == 1 else z
    normaliser = jax.nn.logsumexp(full, axis=1)  # [n]
    loss = jnp.sum(mask * (normaliser - jnp.sum(y * z, axis=1)))
    return c * loss + 0.5 * jnp.sum(penalty[:, None] * w * w), jnp.exp(
        full - normaliser[:, None])[:, -m:]

  def newton(state):
    w, value, p, _, iteration = state
    grad = c * x.T @ (mask[:, None] * (p - y)) + penalty[:, None] * w  # [d + 1, m]
    curvature = mask[:, None, None] * p[:, :, None] * (jnp.eye(m) - p[:, None, :])  # [n, m, m]
    hessian = c * jnp.einsum("na,nkl,nb->kalb", x, curvature, x).reshape(m * width, -1)
    step = jnp.linalg.solve(hessian + jnp.diag(diagonal),
                            grad.T.reshape(-1)).reshape(m, width).T
    decrement = jnp.sum(grad * step)  # twice the fall a full step predicts

    def too_little(search):
      t, new_value, _ = search
      return (new_value > value - 0.25 * t * decrement) & (t >= 1e-10)

    def halve(search):
      t = search[0] / 2
      return (t, *objective(w - t * step))

    t, new_value, new_p = jax.lax.while_loop(too_little, halve,
                                             (jnp.ones((), x.dtype), *objective(w - step)))
    # Done where the step is at float64's precision, or where rounding is all there is to gain.
    take = (decrement > 1e-15 * jnp.maximum(1.0, jnp.abs(value))) & (
        new_value <= value - 0.25 * t * decrement)
    return (jnp.where(take, w - t * step, w), jnp.where(take, new_value, value),
            jnp.where(take, new_p, p), ~take, iteration + 1)

  value, p = objective(w)
  state = jax.lax.while_loop(lambda s: ~s[3] & (s[4] < 100), newton,
                             (w, value, p, jnp.array(False), jnp.array(0)))
  return state[0]


@jax.jit
def _fit_all(x: jax.Array, y: jax.Array, masks: jax.Array, c: jax.Array, starts: jax.Array
             ) -> jax.Array:
  """[f, d + 1, m] weights of the f regressions of the rows each of `masks` [f, n] keeps, from
  `starts` [f, d + 1, m] (`_fit_one`)."""
  return jax.lax.map(lambda a: _fit_one(x, y, a[0], c, a[1]), (masks, starts))


def _targets(labels: np.ndarray, classes: int) -> np.ndarray:
  """[n, m] one-hot `labels` [n]; for two classes class 1's column alone."""
  onehot = np.eye(classes)[labels]
  return onehot[:, 1:] if classes == 2 else onehot


def _fits(x: np.ndarray, labels: np.ndarray, classes: int, masks: np.ndarray, c: float,
          starts: np.ndarray | None = None) -> np.ndarray:
  """[f, d + 1, m] weights of the regressions with `c` (`fit_logistic`) on `x` [n, d] and
  `labels` [n], one on the rows each of `masks` [f, n] keeps, in float64."""
  m = 1 if classes == 2 else classes
  with jax.enable_x64(True):
    x = jnp.concatenate([jnp.asarray(x, jnp.float64), jnp.ones((len(x), 1))], axis=1)
    starts = np.zeros((len(masks), x.shape[1], m)) if starts is None else starts
    return np.asarray(_fit_all(x, jnp.asarray(_targets(labels, classes)),
                               jnp.asarray(masks, jnp.float64), jnp.float64(c),
                               jnp.asarray(starts, jnp.float64)))


def fit_logistic(features: np.ndarray, labels: np.ndarray, c: float, classes: int = 0
                 ) -> Logistic:
  """The minimiser of c * sum of log-losses + |W|^2 / 2 (intercepts unpenalised) over
  `features` [n, d] and `labels` [n] (ints 0 .. classes - 1; 0: max + 1): scikit-learn's
  `LogisticRegression(C=c)` problem, solved by Newton's method with a backtracking line search
  in float64 (jax, on the default device) until the Newton decrement is at float64's
  precision."""
  labels = np.asarray(labels)
  classes = classes or int(labels.max()) + 1
  return Logistic(_fits(features, labels, classes, np.ones((1, len(labels))), c)[0], classes)


def transfer(embeddings: np.ndarray, labels: Sequence[int], folds: int = 10,
             seed: int = SENTEVAL_SEED, cs: Sequence[float] = SENTEVAL_C) -> dict:
  """SentEval's evaluation of `embeddings` [n, d] on a classification by `labels` [n] (any
  ints; module docstring): for each of `folds` stratified folds, C is the value of `cs` whose
  logistic regressions (`fit_logistic`) score best in a `folds`-fold cross-validation of the
  other folds (the mean accuracy in percent rounded to 2 places, the first of equals, as
  SentEval rounds), and the regression with that C on all other folds predicts the fold. The
  `folds` regressions of one C are fitted together (one compiled program for them all), each
  from the one of the C before (the first C's from the fold before's).

  Returns {"accuracy": the mean held-out accuracy (a fraction; SentEval reports it x 100,
  rounded), "dev_accuracy": the mean of the inner cross-validations' best, "fold_accuracies",
  "c": the C chosen for each fold}.
  """
  x = np.asarray(embeddings, np.float64)
  names, y = np.unique(np.asarray(labels), return_inverse=True)
  if len(x) != len(y):
    raise UserError(f"{len(x)} embeddings for {len(y)} labels; give one label an embedding.")
  check_folds(labels, folds)
  outer = stratified_folds(y, folds, seed)
  chosen, dev, held_out, first = [], [], [], None
  for fold in range(folds):
    train = outer != fold
    inner = np.full(len(y), -1)
    inner[train] = stratified_folds(y[train], folds, seed)
    masks = np.stack([train & (inner != i) for i in range(folds)])  # [folds, n]
    scores, weights, starts = [], first, []
    for c in cs:
      weights = _fits(x, y, len(names), masks, c, weights)
      first = weights if first is None or c == cs[0] else first
      right = [Logistic(weights[i], len(names)).predict(x[inner == i]) == y[inner == i]
               for i in range(folds)]
      scores.append(np.round(100 * np.mean([np.mean(r) for r in right]), 2))
      starts.append(weights[:1])
    best = int(np.argmax(scores))
    model = Logistic(_fits(x, y, len(names), train[None], cs[best], starts[best])[0],
                     len(names))
    chosen.append(float(cs[best]))
    dev.append(scores[best] / 100)
    held_out.append(float(np.mean(model.predict(x[~train]) == y[~train])))
  return {"accuracy": float(np.mean(held_out)), "dev_accuracy": float(np.mean(dev)),
          "fold_accuracies": held_out, "c": chosen}


def check_folds(labels: Sequence[int], folds: int) -> None:
  """UserError unless `labels` [n] hold 2 classes or more, each at least 2 x `folds` times, and
  folds >= 2 (so that every part of the inner cross-validations holds every class)."""
  names, counts = np.unique(np.asarray(labels), return_counts=True)
  if len(names) < 2 or folds < 2 or counts.min() < 2 * folds:
    raise UserError(f"folds={folds} over {len(labels)} examples of {len(names)} classes (the "
                    f"smallest, {names[counts.argmin()]}, has {counts.min()}); give at least 2 "
                    "classes, 2 or more folds, and 2 x folds examples of each class.")
