"""Tests of the trainer (bertjax.training: task, steps, train, reports) and the pretraining loss:
overfitting, gradient accumulation, data parallelism on 2 devices, the loss / metric arithmetic and
the loop's logs (CPU, tiny models)."""
import dataclasses
import itertools
import json
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import tasks
from bertjax.training import flops, parallel, steps, train
from bertjax.training import task as task_lib
from bertjax.data.pretraining import masking, pairs
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.tasks import pretraining

from conftest import cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=64,
                                ids_never_masked=frozenset({0, 1, 2, 3, 4}))


def _config(**train_overrides):
  """configs/tiny.py with a 16-token sequence and a small batch, typed."""
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
  return tasks.typed(config)


def _documents(num_docs=12, seed=0):
  """Synthetic documents of token ids (>= 5, so never special) with repeated structure."""
  rng = np.random.default_rng(seed)
  return [[list(rng.integers(5, SPECIAL.vocab_size, size=rng.integers(3, 9)))
           for _ in range(6)] for _ in range(num_docs)]


class _Batches:
  """Masked batches of fixed examples: training batch j from rows drawn with seed j (position =
  batches served), eval in order with the last batch padded by zero rows of weight 0."""

  def __init__(self, examples, batch_size):
    self.examples, self.batch_size = examples, batch_size

  def _batch(self, rows, seed):
    ids = self.examples["input_ids"][rows]
    batch = {key: value[rows] for key, value in self.examples.items()}
    batch.update(masking.mask_batch(ids, batch["input_mask"], np.random.default_rng(seed),
                                    SPECIAL, 0.15, 4))
    batch["example_weight"] = np.ones(len(rows), np.float32)
    return batch

  def train(self, position):
    j = (position or {"batches": 0})["batches"]
    n = len(self.examples["input_ids"])
    while True:
      rows = np.random.default_rng([0, j]).permutation(n)[:self.batch_size]
      j += 1
      yield self._batch(rows, [1, j]), {"batches": j}

  def eval(self):
    n = len(self.examples["input_ids"])
    for start in range(0, n, self.batch_size):
      batch = self._batch(np.arange(start, min(n, start + self.batch_size)), [2, start])
      pad = self.batch_size - len(batch["input_ids"])
      yield {key: np.pad(value, [(0, pad)] + [(0, 0)] * (value.ndim - 1))
             for key, value in batch.items()}


def _task(config, dropout=0.1):
  """A pretraining Task over synthetic documents, as tasks.pretraining builds it from text."""
  examples = pairs.create_segment_pairs(_documents(), config.data.max_seq_length, 0.1,
                                        np.random.default_rng(0), SPECIAL, dupe_factor=2)
  batches = _Batches(examples, config.train.batch_size)
  model = heads.BertForPreTraining(_bert_config(dropout))
  return task_lib.Task(model=model, terms=pretraining.make_terms(7),
                       batches=task_lib.Batches(train=batches.train, eval=batches.eval),
                       schedule=task_lib.Schedule.of(config.train), score=pretraining.score)


def _bert_config(dropout):
  return bert_config("tiny", vocab_size=SPECIAL.vocab_size, dropout_rate=dropout,
                     attention_dropout_rate=dropout, max_position_embeddings=32)


def _first_batch(task):
  return next(task.batches.train(None))[0]


def _build(config, task, devices=None, batch=None):
  """steps.build on the config's checked mesh over `devices` (default: all), initialised with
  `batch` (default: the task's first)."""
  return steps.build(config, task, _first_batch(task) if batch is None else batch,
                     steps.make_checked_mesh(config, devices))


def test_tiny_model_overfits_one_batch():
  config = _config(learning_rate=3e-3)
  task = _task(config, dropout=0.0)
  setup = _build(config, task)
  state = setup.init_state()
  batch = parallel.global_batch(_first_batch(task), setup.mesh)
  losses = []
  for step in range(100):
    state, metrics = setup.train_step(state, batch, setup.learning_rate(step))
    losses.append(float(metrics.compute()["loss"]))
  metrics = metrics.compute()
  assert losses[0] > 3.0  # ~ln(64) + ln(2) at the start
  assert losses[-1] < 0.1, losses[-10:]
  assert float(metrics["mlm_accuracy"]) == pytest.approx(1.0, abs=1e-5)
  assert float(metrics["nsp_accuracy"]) == 1.0
  assert int(state["step"]) == 100


def test_metrics_of_a_step():
  config = _config(num_train_steps=10, warmup_steps=5, learning_rate=1e-3)
  task = _task(config)
  setup = _build(config, task)
  state = setup.init_state()
  params_before = jax.device_get(state["params"])
  state, metrics = setup.train_step(state, parallel.global_batch(_first_batch(task), setup.mesh),
                                    setup.learning_rate(0))
  metrics = metrics.compute()
  assert set(metrics) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy",
                          "frequency_baseline_mlm_accuracy", "grad_norm", "param_norm",
                          "learning_rate"}
  np.testing.assert_allclose(metrics["loss"], metrics["mlm_loss"] + metrics["nsp_loss"], rtol=1e-6)
  assert float(metrics["learning_rate"]) == 0.0  # step 0 of the warmup
  assert float(metrics["grad_norm"]) > 0
  np.testing.assert_allclose(metrics["param_norm"], optax.global_norm(state["params"]), rtol=1e-6)
  # Learning rate 0 at step 0: AdamW moves nothing, not even by weight decay.
  jax.tree.map(np.testing.assert_array_equal, params_before, jax.device_get(state["params"]))


def _reference_losses(params, batch):
  """(MLM mean over the masked positions, NSP mean over the examples) in numpy, from logits."""
  model = heads.BertForPreTraining(_bert_config(0.0))
  mlm_logits, nsp_logits = jax.jit(
      lambda p, b: heads.apply_to_batch(model, p, b, deterministic=True))(params, batch)
  log_probs = np.asarray(jax.nn.log_softmax(mlm_logits))
  w = batch["masked_lm_weights"]
  ce = -np.take_along_axis(log_probs, batch["masked_lm_ids"][..., None], -1)[..., 0]
  nsp_log_probs = np.asarray(jax.nn.log_softmax(nsp_logits))
  nsp = -nsp_log_probs[np.arange(len(w)), batch["next_sentence_label"]].mean()
  return (ce * w).sum() / w.sum(), nsp


def test_loss_is_weighted_mean_over_masked_positions():
  """The MLM loss ignores positions of weight 0 and padded examples; exact against numpy."""
  config = _config(learning_rate=1e-3, warmup_steps=5)  # step 0: learning rate 0
  task = _task(config, dropout=0.0)
  setup = _build(config, task)
  state = setup.init_state()
  params = jax.device_get(state["params"])
  batch = dict(_first_batch(task))
  batch["masked_lm_weights"] = batch["masked_lm_weights"].copy()
  batch["masked_lm_weights"][:, -1] = 0  # drop the last prediction of every row
  expected_mlm, expected_nsp = _reference_losses(params, batch)
  _, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh),
                                setup.learning_rate(0))
  metrics = metrics.compute()
  np.testing.assert_allclose(metrics["mlm_loss"], expected_mlm, rtol=1e-5)
  np.testing.assert_allclose(metrics["nsp_loss"], expected_nsp, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], expected_mlm + expected_nsp, rtol=1e-5)

  # Evaluation: padded rows (example_weight 0) change no total.
  def totals(b):
    return steps.run_eval_step(setup, params, [b])[0]

  padded = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in batch.items()}
  padded_setup = _build(_config(eval_batch_size=16), task, batch=batch)
  unpadded = totals(batch)
  with_padding = steps.run_eval_step(padded_setup, params, [padded])[0]
  for key in unpadded:
    np.testing.assert_allclose(with_padding[key].total, unpadded[key].total, rtol=1e-5)
    assert with_padding[key].count == unpadded[key].count, key
  summary = pretraining.score(unpadded, None)
  w = batch["masked_lm_weights"]
  np.testing.assert_allclose(summary["mlm_loss"], expected_mlm, rtol=1e-5)
  assert summary["examples"] == len(w)
  expected_baseline = ((batch["masked_lm_ids"] == 7) * w).sum() / w.sum()
  np.testing.assert_allclose(summary["frequency_baseline_mlm_accuracy"], expected_baseline)
  np.testing.assert_allclose(summary["mlm_perplexity"], np.exp(expected_mlm), rtol=1e-5)


def test_gradient_accumulation_matches_one_big_batch():
  """k micro-batches of B/k give the loss, metrics and update of one batch of B, also when the
  micro-batches hold different numbers of masked positions (each term is divided by the whole
  batch's weight, not by each micro-batch's own)."""
  config = _config(num_train_steps=3)
  batch = dict(_first_batch(_task(config, dropout=0.0)))
  weights = batch["masked_lm_weights"].copy()
  weights[0::2, 1:] = 0  # the rows of micro-batch 0 (every 2nd row) keep one prediction
  batch["masked_lm_weights"] = weights
  assert weights[0::2].sum() != weights[1::2].sum()
  results = []
  for k in (1, 2):
    config = _config(grad_accum_steps=k, num_train_steps=3)
    task = _task(config, dropout=0.0)
    setup = _build(config, task, batch=batch)
    state = setup.init_state()
    for step in range(2):
      state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh),
                                        setup.learning_rate(step))
    results.append((jax.device_get(state["params"]), metrics.compute()))
  for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm"):
    np.testing.assert_allclose(results[0][1][key], results[1][1][key], rtol=1e-6, err_msg=key)
  # Adam's update divides by sqrt(v): float rounding of a near-zero gradient shows at 1e-7.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               results[0][0], results[1][0])


def test_batch_not_divisible_by_grad_accum_is_a_user_error():
  with pytest.raises(UserError, match="grad_accum_steps=3"):
    steps.make_checked_mesh(_config(grad_accum_steps=3))


def test_two_devices_match_one_device():
  """Data parallelism: a step over 2 devices = the same global batch on 1 device (to 1e-5)."""
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
      import jax, numpy as np
      assert jax.device_count() == 2, jax.devices()
      from bertjax.tools import bench
      from bertjax.training import parallel
      import test_train as t
      results = []
      for devices in (jax.devices()[:1], jax.devices()):
        config = t._config(num_train_steps=3)
        task = t._task(config)  # dropout on: the masks must not depend on the device count
        setup = t._build(config, task, devices)
        state = setup.init_state()
        batches = task.batches.train(None)
        for step in range(3):
          batch = parallel.global_batch(next(batches)[0], setup.mesh)
          state, metrics = setup.train_step(state, batch, setup.learning_rate(step))
        assert len(state["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
                   .sharding.device_set) == len(devices)
        assert len(batch["input_ids"].sharding.device_set) == len(devices)
        results.append((jax.device_get(state["params"]), float(metrics.compute()["loss"])))
      np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-5, rtol=1e-5)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                   results[0][0], results[1][0])
      print("PARITY OK", results[0][1])
      """)
  env = cpu_env(2)
  out = warm_python.run([sys.executable, "-c", script], env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "PARITY OK" in out.stdout


def test_evaluate_sums_over_all_batches():
  config = _config()
  task = _task(config, dropout=0.0)
  setup = _build(config, task)
  state = setup.init_state()
  summary, predictions = steps.evaluate(setup, task, state["params"])
  assert predictions is None  # pretraining predicts nothing
  num_examples = sum(float(b["example_weight"].sum()) for b in task.batches.eval())
  assert summary["examples"] == num_examples
  assert 0 <= summary["mlm_accuracy"] <= 1 and 0 <= summary["nsp_accuracy"] <= 1
  assert summary["mlm_loss"] > 3.0  # untrained: about ln(64)
  one, _ = steps.evaluate(setup, task, state["params"], max_batches=1)
  assert one["examples"] == config.train.eval_batch_size


def test_one_forward_pass_per_eval_batch_compiled_once():
  """Metrics and predictions of an eval batch come from one traced forward pass, and the eval
  step is traced once for all batches and evaluations."""
  config = _config(eval_batch_size=8)
  base = _task(config, dropout=0.0)
  traced = {"model": 0, "terms": 0, "predict": 0}

  class CountingModel(heads.BertForPreTraining):
    def __call__(self, *args, **kwargs):
      traced["model"] += 1
      return super().__call__(*args, **kwargs)

  def counting(name, fn):
    def wrapped(*args):
      traced[name] += 1
      return fn(*args)
    return wrapped

  task = dataclasses.replace(
      base, model=CountingModel(_bert_config(0.0)), terms=counting("terms", base.terms),
      predict=counting("predict", lambda outputs, batch: {"nsp": outputs[1]}))
  setup = _build(config, task)
  params = setup.init_state()["params"]
  traced.update(model=0, terms=0, predict=0)  # init traced the model
  for _ in range(2):
    steps.evaluate(setup, task, params)
  assert len(list(task.batches.eval())) > 1
  assert traced == {"model": 1, "terms": 1, "predict": 1}, traced


def test_predictions_cover_every_real_example_in_order():
  """predict outputs come back per example, padding rows dropped, in eval order, and reach
  score with the metric totals."""
  config = _config(eval_batch_size=8)
  base = _task(config, dropout=0.0)
  seen = {}

  def score(totals, predictions):
    seen.update(predictions)
    return {"first_token_mean": float(np.mean(predictions["first_token"])),
            **task_lib.means(totals)}

  task = dataclasses.replace(
      base, predict=lambda outputs, batch: {"first_token": batch["input_ids"][:, 1],
                                            "label": batch["next_sentence_label"]},
      score=score)
  setup = _build(config, task)
  state = setup.init_state()
  metrics, predictions = steps.evaluate(setup, task, state["params"])
  batches = list(task.batches.eval())
  assert batches[-1]["example_weight"].min() == 0  # the last batch is padded
  real = np.concatenate([b["example_weight"] for b in batches]) > 0
  expected = np.concatenate([b["input_ids"][:, 1] for b in batches])[real]
  np.testing.assert_array_equal(predictions["first_token"], expected)
  np.testing.assert_array_equal(seen["label"], np.concatenate(
      [b["next_sentence_label"] for b in batches])[real])
  assert metrics["first_token_mean"] == pytest.approx(expected.mean())
  assert "mlm_accuracy" in metrics
  np.testing.assert_array_equal(
      steps.run_eval_step(setup, state["params"], task.batches.eval())[1]["first_token"],
      expected)


def test_logged_flops_are_the_real_work_of_each_batch(tmp_path):
  """The trainer logs, per step, flops.model_flops of the batch's real work (the benchmark's
  formula), below the count with padding as work, and real tokens per second; no MFU on a CPU
  (its peak is unknown)."""
  config = _config(num_train_steps=2, log_every_steps=1, eval_every_steps=2,
                   checkpoint_every_steps=2)
  # longer than most of the synthetic pairs: padding
  config = dataclasses.replace(config, data=dataclasses.replace(config.data, max_seq_length=32))
  task = _task(config, dropout=0.0)
  train.train_and_evaluate(config, str(tmp_path), task, train.run_context(config))
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train_records = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in train_records] == [1, 2]
  batches = [batch for batch, _ in itertools.islice(task.batches.train(None), 2)]
  for record, batch in zip(train_records, batches):
    work = flops.work_of(batch)
    assert record["model_flops_per_step"] == flops.model_flops(task.model.config, work)
    padded = flops.Work(tokens=batch["input_ids"].size, sequences=8, squared_lengths=8 * 32**2,
                        predictions=batch["masked_lm_weights"].size)
    assert work.tokens < padded.tokens and work.predictions < padded.predictions
    assert record["model_flops_per_step"] < flops.model_flops(task.model.config, padded)
    assert record["model_tflops_per_device"] > 0
    # Both per second of the same interval: real tokens per example of this batch.
    assert record["tokens_per_second"] / record["examples_per_second"] == pytest.approx(
        batch["input_mask"].sum() / 8)
    assert "mfu" not in record


def test_an_error_while_the_bar_draws_starts_on_its_own_line(tmp_path, capsys):
  """A UserError raised by the data at step 4 (e.g. a damaged record) leaves the progress bar
  closed, its line ended, so that bertjax's error line (`bertjax.main.fail`) starts a line."""
  config = _config(num_train_steps=50, log_every_steps=1, eval_every_steps=50,
                   checkpoint_every_steps=50)
  base = _task(config, dropout=0.0)

  def damaged_after_three(position):
    for served, item in enumerate(base.batches.train(position)):
      if served == 3:  # batches 0, 1 and 2: steps 1, 2 and 3
        raise UserError("a pair record of shard 0 is damaged")
      yield item

  task = dataclasses.replace(base, batches=dataclasses.replace(base.batches,
                                                               train=damaged_after_three))
  try:
    train.train_and_evaluate(config, str(tmp_path), task, train.run_context(config))
  except UserError as e:  # as bertjax.main prints it: the error's traceback, and the bar, alive
    assert "damaged" in str(e)
    err = capsys.readouterr().err
  assert "train:" in err  # the bar was drawn
  assert err.endswith("\n"), repr(err[-200:])
  assert "3/50" in err.splitlines()[-1]  # and closed after step 3
