"""bertjax.embedding.losses against sentence-transformers' losses on the same embeddings: the loss
and its gradients with respect to every embedding, within 1e-5 in float32
(MultipleNegativesRankingLoss with and without hard negatives, its symmetric form, Matryoshka
over it); duplicates masked out of each other's negatives, and SigLIP's sigmoid loss, against
their formulas written out; and the loss of a batch split over 8 simulated devices, against one
device's, with only the embeddings exchanged."""
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bertjax.embedding import losses

from conftest import ROOT, cpu_env
import warm_python

BATCH, DIM = 6, 16


def _embeddings(columns: int, seed: int = 0) -> list[np.ndarray]:
  """(anchors, positives, negatives...): `columns` float32 [BATCH, DIM] arrays."""
  rng = np.random.default_rng(seed)
  return [rng.standard_normal((BATCH, DIM)).astype(np.float32) for _ in range(columns)]


def _theirs(embeddings, **options):
  """(loss, gradients) of sentence-transformers' MultipleNegativesRankingLoss."""
  from sentence_transformers.losses import MultipleNegativesRankingLoss  # pylint: disable=import-outside-toplevel
  tensors = [torch.tensor(e, requires_grad=True) for e in embeddings]
  loss = MultipleNegativesRankingLoss(model=None, **options).compute_loss_from_embeddings(
      tensors, None)
  loss.backward()
  return float(loss.detach()), [t.grad.numpy() for t in tensors]


def _ours(loss_fn, embeddings, **options):
  value, grads = jax.value_and_grad(
      lambda a, c: loss_fn(a, c, **options), argnums=(0, 1))(embeddings[0], embeddings[1:])
  return float(value), [np.asarray(grads[0])] + [np.asarray(g) for g in grads[1]]


@pytest.mark.parametrize("columns", [2, 3])
@pytest.mark.parametrize("symmetric", [False, True])
def test_in_batch_softmax_is_multiple_negatives_ranking_loss(columns, symmetric):
  """With one hard negative a row or none; plain or symmetric (directions query_to_doc and
  doc_to_query, a softmax each, as MultipleNegativesSymmetricRankingLoss)."""
  embeddings = _embeddings(columns)
  options = (dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
             if symmetric else {})
  theirs, their_grads = _theirs(embeddings, **options)
  ours, our_grads = _ours(losses.in_batch_softmax, embeddings, symmetric=symmetric)
  assert ours == pytest.approx(theirs, rel=1e-5)
  for a, b in zip(our_grads, their_grads):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_matryoshka_is_the_weighted_sum_of_the_truncated_losses():
  """MatryoshkaLoss over MNRL: sentence-transformers' loss of the first d dimensions, weighted,
  for d in 16, 8, 4."""
  embeddings = _embeddings(3)
  dims, weights = (16, 8, 4), (1.0, 0.5, 0.25)
  theirs = sum(w * _theirs([e[:, :d] for e in embeddings])[0] for d, w in zip(dims, weights))
  ours = losses.matryoshka(losses.in_batch_softmax, dims, weights)(embeddings[0],
                                                                     embeddings[1:])
  assert float(ours) == pytest.approx(theirs, rel=1e-5)


def test_duplicate_positives_are_not_each_others_negatives():
  """Rows 1 and 4 share their positive: each one's softmax leaves the other's copy out (in both
  directions), which is the loss written out with those columns removed."""
  a, p = _embeddings(2)
  p[4] = p[1]
  duplicates = jnp.asarray([0, 1, 2, 3, 1, 5])
  for symmetric in (False, True):
    ours = float(losses.in_batch_softmax(a, [p], symmetric=symmetric, duplicates=duplicates))
    scores = np.asarray(losses.cosine(a, p)) * 20.0
    total = 0.0
    for i in range(BATCH):
      keep = [j for j in range(BATCH) if j == i or duplicates[j] != duplicates[i]]
      forward = np.log(np.sum(np.exp(scores[i, keep])))
      if symmetric:
        forward = (forward + np.log(np.sum(np.exp(scores[keep, i])))) / 2
      total += forward - scores[i, i]
    assert ours == pytest.approx(total / BATCH, rel=1e-5)
  assert float(losses.in_batch_softmax(a, [p])) != pytest.approx(ours, rel=1e-3)


def test_sigmoid_is_siglips_formula():
  """SigLIP (Zhai et al. 2023, its Algorithm 1): -1/n sum_ij log sigmoid(z_ij (t x_i.y_j + b)),
  z_ij = 1 if i == j else -1, x and y unit vectors; a hard negative is one more -1 column."""
  a, p, n = _embeddings(3)
  log_scale, bias = np.log(10.0), -10.0
  ours = float(losses.sigmoid(a, [p, n], log_scale=jnp.asarray(log_scale),
                              bias=jnp.asarray(bias)))
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  logits = unit(a) @ unit(np.concatenate([p, n])).T * 10.0 + bias
  labels = -np.ones_like(logits)
  labels[np.arange(BATCH), np.arange(BATCH)] = 1.0
  expected = -np.sum(np.log(1 / (1 + np.exp(-labels * logits)))) / BATCH
  assert ours == pytest.approx(expected, rel=1e-5)


def test_eight_devices_give_one_devices_loss_and_exchange_only_embeddings():
  """The loss and gradients of a global batch of 16 split over 8 simulated devices (2 rows
  each) equal one device's; the compiled program's only collectives move the embeddings (an
  all-gather of [16, 16] per column, at most) and reduce scalars or the gradients' rows."""
  script = textwrap.dedent("""
      import json, re
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from bertjax.embedding import losses
      rng = np.random.default_rng(0)
      a, p, n = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3))
      f = jax.value_and_grad(lambda a, c: losses.in_batch_softmax(a, c, symmetric=True),
                             argnums=(0, 1))
      one = jax.jit(f)(a, [p, n])
      mesh = Mesh(np.asarray(jax.devices()), ("data",))
      rows = NamedSharding(mesh, P("data"))
      a8, p8, n8 = (jax.device_put(x, rows) for x in (a, p, n))
      step = jax.jit(f, out_shardings=(NamedSharding(mesh, P()), (rows, [rows, rows])))
      eight = step(a8, [p8, n8])
      hlo = step.lower(a8, [p8, n8]).compile().as_text()
      collectives = sorted(set(re.findall(
          r"= (f32\\[[0-9,]*\\][^ ]*) (all-gather|all-reduce|reduce-scatter|all-to-all|"
          r"collective-permute)", hlo)))
      print(json.dumps(dict(devices=len(jax.devices()),
                            diff=float(max(np.abs(np.asarray(x) - np.asarray(y)).max() for x, y in
                                           zip(jax.tree.leaves(one), jax.tree.leaves(eight)))),
                            collectives=collectives)))
  """)
  out = warm_python.run([sys.executable, "-c", script], env=cpu_env(8), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  import json  # pylint: disable=import-outside-toplevel
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert report["devices"] == 8 and report["diff"] < 1e-5, report
  assert report["collectives"], report
  for shape, _ in report["collectives"]:
    dims = [int(d) for d in shape[4:shape.index("]")].split(",") if d]
    assert np.prod(dims) <= 16 * 16 * 3, report  # embeddings (or scalars), never more
