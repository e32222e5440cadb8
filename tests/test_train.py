"""Tests of bertjax.train and the pretraining loss: overfitting, gradient accumulation,
data parallelism on 2 devices, and the loss / metric arithmetic (CPU, tiny models)."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import parallel, train
from bertjax.data import pretraining_examples as pe
from bertjax.data.pipeline import PretrainingBatches
from bertjax.errors import UserError
from bertjax.models import bert, heads
from bertjax.tasks import pretraining

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = pe.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=64,
                           ids_never_masked=frozenset({0, 1, 2, 3, 4}))


def _config(**train_overrides):
  """configs/tiny.py with a 16-token sequence and a small batch."""
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.data.max_seq_length = 16
  config.data.max_predictions_per_seq = 4
  config.train.batch_size = 8
  config.train.eval_batch_size = 8
  config.train.num_train_steps = 100
  config.train.warmup_steps = 0
  config.train.learning_rate = 1e-3
  config.train.update(train_overrides)
  return config


def _documents(num_docs=12, seed=0):
  """Synthetic documents of token ids (>= 5, so never special) with repeated structure."""
  rng = np.random.default_rng(seed)
  return [[list(rng.integers(5, SPECIAL.vocab_size, size=rng.integers(3, 9)))
           for _ in range(6)] for _ in range(num_docs)]


def _task(config, dropout=0.1):
  """A pretraining Task over synthetic documents, as tasks.pretraining builds it from text."""
  examples = pe.create_segment_pairs(_documents(), config.data.max_seq_length, 0.1,
                                     np.random.default_rng(0), SPECIAL, dupe_factor=2)
  batches = PretrainingBatches(examples, batch_size=config.train.batch_size, seed=0,
                               special=SPECIAL, max_predictions_per_seq=4)
  model = heads.BertForPreTraining(bert.bert_config(
      "tiny", vocab_size=SPECIAL.vocab_size, dropout_rate=dropout,
      attention_dropout_rate=dropout, max_position_embeddings=32))

  def init_params(rng, batch):
    return model.init({"params": rng}, batch["input_ids"], batch["segment_ids"],
                      batch["input_mask"], batch["masked_lm_positions"],
                      deterministic=True)["params"]

  return train.Task(
      init_params=init_params, loss_fn=pretraining.make_loss_fn(model),
      eval_fn=pretraining.make_eval_fn(model, 7), summarize_eval=pretraining.summarize_eval,
      train_batches=batches.iterate, eval_batches=batches.eval_batches,
      init_batch=next(batches.iterate())[0])


def test_tiny_model_overfits_one_batch():
  config = _config(learning_rate=3e-3)
  task = _task(config, dropout=0.0)
  setup = train.build(config, task)
  state = setup.init_state()
  batch = parallel.global_batch(task.init_batch, setup.mesh)
  losses = []
  for _ in range(100):
    state, metrics = setup.train_step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[0] > 3.0  # ~ln(64) + ln(2) at the start
  assert losses[-1] < 0.1, losses[-10:]
  assert float(metrics["mlm_accuracy"]) == pytest.approx(1.0, abs=1e-5)
  assert float(metrics["nsp_accuracy"]) == 1.0
  assert int(state["step"]) == 100


def test_metrics_of_a_step():
  config = _config(num_train_steps=10, warmup_steps=5, learning_rate=1e-3)
  task = _task(config)
  setup = train.build(config, task)
  state = setup.init_state()
  params_before = jax.device_get(state["params"])
  state, metrics = setup.train_step(state, parallel.global_batch(task.init_batch, setup.mesh))
  assert set(metrics) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy",
                          "grad_norm", "param_norm", "learning_rate"}
  np.testing.assert_allclose(metrics["loss"], metrics["mlm_loss"] + metrics["nsp_loss"], rtol=1e-6)
  assert float(metrics["learning_rate"]) == 0.0  # step 0 of the warmup
  assert float(metrics["grad_norm"]) > 0
  np.testing.assert_allclose(metrics["param_norm"], optax.global_norm(state["params"]), rtol=1e-6)
  # Learning rate 0 at step 0: AdamW moves nothing, not even by weight decay.
  jax.tree.map(np.testing.assert_array_equal, params_before, jax.device_get(state["params"]))


def test_loss_is_weighted_mean_over_masked_positions():
  """The MLM loss ignores positions of weight 0 and padded examples; exact against numpy."""
  config = _config()
  task = _task(config, dropout=0.0)
  params = task.init_params(jax.random.PRNGKey(0), task.init_batch)
  batch = dict(task.init_batch)
  batch["masked_lm_weights"] = batch["masked_lm_weights"].copy()
  batch["masked_lm_weights"][:, -1] = 0  # drop the last prediction of every row
  model = heads.BertForPreTraining(bert.bert_config(
      "tiny", vocab_size=SPECIAL.vocab_size, dropout_rate=0.0, attention_dropout_rate=0.0,
      max_position_embeddings=32))
  mlm_logits, nsp_logits = jax.jit(model.apply, static_argnames="deterministic")(
      {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
      batch["masked_lm_positions"], deterministic=True)
  log_probs = np.asarray(jax.nn.log_softmax(mlm_logits))
  w = batch["masked_lm_weights"]
  ce = -np.take_along_axis(log_probs, batch["masked_lm_ids"][..., None], -1)[..., 0]
  expected_mlm = (ce * w).sum() / (w.sum() + 1e-5)
  nsp_log_probs = np.asarray(jax.nn.log_softmax(nsp_logits))
  expected_nsp = -nsp_log_probs[np.arange(len(w)), batch["next_sentence_label"]].mean()
  loss, metrics = jax.jit(task.loss_fn)(params, batch, jax.random.PRNGKey(1))
  np.testing.assert_allclose(metrics["mlm_loss"], expected_mlm, rtol=1e-5)
  np.testing.assert_allclose(metrics["nsp_loss"], expected_nsp, rtol=1e-5)
  np.testing.assert_allclose(loss, expected_mlm + expected_nsp, rtol=1e-5)

  # Evaluation: padded rows (example_weight 0) change no sum.
  eval_fn = jax.jit(task.eval_fn)
  sums = eval_fn(params, batch)
  padded = {k: np.concatenate([v, np.zeros_like(v[:3])]) for k, v in batch.items()}
  padded_sums = eval_fn(params, padded)
  for key in sums:
    np.testing.assert_allclose(padded_sums[key], sums[key], rtol=1e-5, err_msg=key)
  summary = pretraining.summarize_eval({k: float(v) for k, v in sums.items()})
  np.testing.assert_allclose(summary["mlm_loss"], (ce * w).sum() / w.sum(), rtol=1e-5)
  assert summary["examples"] == len(w)
  expected_baseline = ((batch["masked_lm_ids"] == 7) * w).sum() / w.sum()
  np.testing.assert_allclose(summary["frequency_baseline_mlm_accuracy"], expected_baseline)


def test_gradient_accumulation_matches_one_big_batch():
  """k micro-batches of B/k give the update of one batch of B (no dropout, equal weights)."""
  results = []
  for k in (1, 2):
    config = _config(grad_accum_steps=k, num_train_steps=3)
    task = _task(config, dropout=0.0)
    batch = dict(task.init_batch)
    batch["masked_lm_weights"] = np.ones_like(batch["masked_lm_weights"])  # equal per row
    setup = train.build(config, task)
    state = setup.init_state()
    for _ in range(2):
      state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh))
    results.append((jax.device_get(state["params"]), float(metrics["loss"])))
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               results[0][0], results[1][0])


def test_batch_not_divisible_by_grad_accum_is_a_user_error():
  with pytest.raises(UserError, match="grad_accum_steps=3"):
    train.make_checked_mesh(_config(grad_accum_steps=3))


def test_two_devices_match_one_device():
  """Data parallelism: a step over 2 devices = the same global batch on 1 device (to 1e-5)."""
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
      import jax, numpy as np
      assert jax.device_count() == 2, jax.devices()
      from bertjax import parallel, train
      import test_train as t
      results = []
      for devices in (jax.devices()[:1], jax.devices()):
        config = t._config(num_train_steps=3)
        task = t._task(config)  # dropout on: the masks must not depend on the device count
        setup = train.build(config, task, devices)
        state = setup.init_state()
        batches = task.train_batches(None)
        for _ in range(3):
          batch = parallel.global_batch(next(batches)[0], setup.mesh)
          state, metrics = setup.train_step(state, batch)
        assert len(state["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
                   .sharding.device_set) == len(devices)
        assert len(batch["input_ids"].sharding.device_set) == len(devices)
        results.append((jax.device_get(state["params"]), float(metrics["loss"])))
      np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-5, rtol=1e-5)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                   results[0][0], results[1][0])
      print("PARITY OK", results[0][1])
      """)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "PARITY OK" in out.stdout


def test_evaluate_sums_over_all_batches():
  config = _config()
  task = _task(config, dropout=0.0)
  setup = train.build(config, task)
  state = setup.init_state()
  summary = train.evaluate(setup, task, state["params"])
  num_examples = sum(float(b["example_weight"].sum()) for b in task.eval_batches())
  assert summary["examples"] == num_examples
  assert 0 <= summary["mlm_accuracy"] <= 1 and 0 <= summary["nsp_accuracy"] <= 1
  assert summary["mlm_loss"] > 3.0  # untrained: about ln(64)
  one = train.evaluate(setup, task, state["params"], max_batches=1)
  assert one["examples"] == config.train.eval_batch_size


def test_predictions_cover_every_real_example_in_order():
  """predict_fn outputs come back per example, padding rows dropped, in eval order, and
  score_predictions' metrics join summarize_eval's."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  config = _config(eval_batch_size=8)
  base = _task(config, dropout=0.0)
  seen = {}

  def score(predictions):
    seen.update(predictions)
    return {"first_token_mean": float(np.mean(predictions["first_token"]))}

  task = dataclasses.replace(
      base, predict_fn=lambda params, batch: {"first_token": batch["input_ids"][:, 1],
                                              "label": batch["next_sentence_label"]},
      score_predictions=score)
  setup = train.build(config, task)
  state = setup.init_state()
  metrics, predictions = train.evaluate_with_predictions(setup, task, state["params"])
  batches = list(task.eval_batches())
  assert batches[-1]["example_weight"].min() == 0  # the last batch is padded
  real = np.concatenate([b["example_weight"] for b in batches]) > 0
  expected = np.concatenate([b["input_ids"][:, 1] for b in batches])[real]
  np.testing.assert_array_equal(predictions["first_token"], expected)
  np.testing.assert_array_equal(seen["label"], np.concatenate(
      [b["next_sentence_label"] for b in batches])[real])
  assert metrics["first_token_mean"] == pytest.approx(expected.mean())
  assert "mlm_accuracy" in metrics
  np.testing.assert_array_equal(
      train.predict(setup, task.eval_batches(), state["params"])["first_token"], expected)
