"""train.prng_impl: threefry keeps the parameters and dropout of the untyped keys bitwise; rbg
and unsafe_rbg train and resume; each checkpoint records its PRNG, and a resume with another
(or a name that is none of them) is one line naming the fix."""
import concurrent.futures
import dataclasses
import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import tasks
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.tasks import pretraining
from bertjax.training import checkpoint, steps
from bertjax.training import task as task_lib

from conftest import cpu_env, tree_digest
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**train):
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.train.update(dict(batch_size=4, eval_batch_size=4, warmup_steps=0, **train))
  return tasks.typed(config)


def _build(config, task, batch):
  """steps.build on the config's checked mesh."""
  return steps.build(config, task, batch, steps.make_checked_mesh(config))


def _batch(seed=0):
  """A pretraining batch of 4 rows of 16 tokens (vocabulary 64), 3 masked positions a row."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 64, (4, 16)).astype(np.int32)
  return dict(input_ids=ids, segment_ids=np.repeat([[0] * 8 + [1] * 8], 4, 0).astype(np.int32),
              input_mask=np.ones_like(ids), masked_lm_positions=np.array([[1, 5, 9]] * 4,
                                                                         np.int32),
              masked_lm_ids=ids[:, [1, 5, 9]], masked_lm_weights=np.ones((4, 3), np.float32),
              next_sentence_label=np.array([0, 1, 0, 1], np.int32),
              example_weight=np.ones(4, np.float32))


def _task():
  model = heads.BertForPreTraining(bert_config("tiny", vocab_size=64, max_position_embeddings=32,
                                               dropout_rate=0.1, attention_dropout_rate=0.1))
  return task_lib.Task(model=model, terms=pretraining.make_terms(7),
                       batches=task_lib.Batches(train=None, eval=None),
                       schedule=task_lib.Schedule.of(_config().train))


@pytest.fixture(scope="module")
def threefry_state():
  """The initial state of `_task()` at `_batch()` with the default PRNG (threefry), built once
  for the tests that look at it."""
  return _build(_config(), _task(), _batch()).init_state()


def test_threefry_init_and_dropout_are_those_of_untyped_keys_bitwise(threefry_state):
  """The default keeps every earlier run's numbers: the parameters are those of
  heads.init_from_batch jitted with jax.random.PRNGKey(seed)'s first half (no kernel lowering),
  the state's rng is the second half's data, and dropout from its typed key is the same."""
  task, batch, state = _task(), _batch(), threefry_state
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(0))
  old = jax.jit(lambda: nn.unbox(heads.init_from_batch(task.model, init_rng, batch)))()
  assert jax.tree.structure(old) == jax.tree.structure(state["params"])
  for was, now in zip(jax.tree.leaves(old), jax.tree.leaves(state["params"])):
    np.testing.assert_array_equal(np.asarray(was), np.asarray(now))
  np.testing.assert_array_equal(np.asarray(state["rng"]), np.asarray(dropout_rng))

  def loss(rng):
    outputs = heads.apply_to_batch(task.model, state["params"], batch, deterministic=False,
                                   rngs={"dropout": jax.random.fold_in(rng, 3)})
    return outputs[0]

  typed = jax.random.wrap_key_data(state["rng"], impl=steps.PRNG_IMPLS["threefry"])
  np.testing.assert_array_equal(loss(dropout_rng), loss(typed))
  assert not np.array_equal(loss(dropout_rng), loss(jax.random.PRNGKey(5)))  # dropout is on


def test_only_the_init_is_lowered_with_threefrys_gpu_kernel(monkeypatch):
  """The init (compiled in a thread, as compile_ahead does) is traced for lowering with
  jax_threefry_gpu_kernel_lowering on, the train step with it off (the flag only acts on a GPU;
  this shows where it is set)."""
  flag = steps.jax_config.threefry_gpu_kernel_lowering
  seen = {"init": [], "train": []}
  init_variables_from_batch = heads.init_variables_from_batch  # what steps.build inits with

  def recorded_init(*args):
    seen["init"].append(flag.value)
    return init_variables_from_batch(*args)

  monkeypatch.setattr(heads, "init_variables_from_batch", recorded_init)
  task, batch = _task(), _batch()

  def recorded_terms(outputs, batch):
    seen["train"].append(flag.value)
    return pretraining.make_terms(7)(outputs, batch)

  task = dataclasses.replace(task, terms=recorded_terms)
  setup = _build(_config(), task, batch)
  seen["init"].clear()  # build's eval_shape
  with concurrent.futures.ThreadPoolExecutor(1) as executor:
    state = executor.submit(setup.compile_init).result()()
  setup.train_step.lower(setup.abstract_state, batch, setup.learning_rate(0))
  assert seen["init"] and all(seen["init"]), seen
  assert seen["train"] and not any(seen["train"]), seen
  assert not flag.value and int(state["step"]) == 0


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_keys_train_and_differ_from_threefry(impl, threefry_state):
  task, batch, threefry = _task(), _batch(), threefry_state
  setup = _build(_config(prng_impl=impl), task, batch)
  state = setup.init_state()
  assert state["rng"].shape == (4,) and state["rng"].dtype == jnp.uint32
  assert not any(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(threefry["params"]),
                                                      jax.tree.leaves(state["params"]))
                 if np.asarray(a).std() > 0)  # every random parameter differs
  for step in range(2):
    state, metrics = setup.train_step(state, batch, setup.learning_rate(step))
  assert int(state["step"]) == 2 and np.isfinite(float(metrics.compute()["loss"]))


def test_a_prng_impl_that_is_none_of_the_three_is_one_user_error():
  with pytest.raises(UserError) as error:
    _build(_config(prng_impl="philox4x32"), _task(), _batch())
  assert str(error.value) == ("train.prng_impl='philox4x32' is not one of threefry, rbg, "
                              "unsafe_rbg; set --config.train.prng_impl to one of them.")


def _state(rng_words):
  return {"step": jnp.asarray(3, jnp.int32), "rng": jnp.arange(rng_words, dtype=jnp.uint32)}


def test_a_checkpoint_resumes_only_with_the_prng_it_was_saved_with(tmp_path):
  """rbg and unsafe_rbg keys have the same shape: the recorded name tells them apart; a
  checkpoint from before the record (none written) was threefry."""
  recorded, unrecorded = tmp_path / "rbg", tmp_path / "old"
  for directory, impl, words in ((recorded, "rbg", 4), (unrecorded, None, 2)):
    with checkpoint.Checkpoints(directory, save_every_steps=1, keep=1,
                                prng_impl=impl) as checkpoints:
      checkpoints.save(3, _state(words), {"batches": 3}, force=True)
  before = tree_digest(tmp_path)
  abstract = jax.eval_shape(lambda: _state(4))
  refused = checkpoint.Checkpoints(recorded, save_every_steps=1, keep=1, prng_impl="unsafe_rbg")
  with pytest.raises(UserError) as error:
    refused.resume(abstract)
  refused.close()
  assert str(error.value) == (
      f"the checkpoint at step 3 in {recorded} was saved with train.prng_impl=rbg, and this run "
      "has train.prng_impl=unsafe_rbg; a run resumes with the PRNG it started with: rerun with "
      "--config.train.prng_impl=rbg (or use a new --workdir). Nothing was changed.")
  old = checkpoint.Checkpoints(unrecorded, save_every_steps=1, keep=1, prng_impl="rbg")
  with pytest.raises(UserError, match="saved with train.prng_impl=threefry, and this run has "
                                      "train.prng_impl=rbg"):
    old.resume(abstract)
  old.close()
  assert tree_digest(tmp_path) == before
  for directory, impl, words in ((recorded, "rbg", 4), (unrecorded, "threefry", 2)):
    with checkpoint.Checkpoints(directory, save_every_steps=1, keep=1,
                                prng_impl=impl) as checkpoints:
      state, position = checkpoints.resume(jax.eval_shape(lambda w=words: _state(w)))
    np.testing.assert_array_equal(np.asarray(state["rng"]), np.arange(words))
    assert position == {"batches": 3}


def _run(workdir, corpus, *flags):
  """A tiny pretraining run on the test corpus: 4 steps of 8 rows of 32 tokens, a checkpoint
  every 2, then `flags`."""
  text_file, vocab = corpus
  env = cpu_env()
  return warm_python.run(
      [sys.executable, "-m", "bertjax.main", f"--config={os.path.join(ROOT, 'bertjax/configs/tiny.py')}",
       f"--workdir={workdir}", f"--config.data.input_files={text_file}",
       f"--config.data.vocab_model={vocab}", "--config.data.max_seq_length=32",
       "--config.data.max_predictions_per_seq=5", "--config.data.dupe_factor=2",
       "--config.data.eval_fraction=0.1", "--config.train.batch_size=8",
       "--config.train.eval_batch_size=16", "--config.train.num_train_steps=4",
       "--config.train.warmup_steps=1", "--config.train.log_every_steps=1",
       "--config.train.eval_every_steps=100", "--config.train.checkpoint_every_steps=2",
       "--config.train.eval_steps=1", "--config.model.dropout_rate=0.1", *flags],
      env=env, cwd=ROOT, timeout=300)


def test_unsafe_rbg_resumes_and_a_rerun_with_another_prng_is_refused(corpus, tmp_path):
  """Through the command line: stopped at step 2, the run rerun without the flag (threefry) is
  refused in one line naming the fix, its checkpoints untouched; rerun as it started, it
  resumes to the end with finite losses."""
  workdir = tmp_path / "run"
  first = _run(workdir, corpus, "--config.train.prng_impl=unsafe_rbg",
               "--config.train.stop_after_steps=2")
  assert first.returncode == 0, first.stderr[-3000:]
  before = tree_digest(workdir / "checkpoints")
  refused = _run(workdir, corpus)
  assert refused.returncode == 2, refused.stderr[-3000:]
  errors = [line for line in refused.stderr.splitlines() if "bertjax: error:" in line]
  assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
  assert ("was saved with train.prng_impl=unsafe_rbg, and this run has train.prng_impl="
          "threefry; a run resumes with the PRNG it started with: rerun with "
          "--config.train.prng_impl=unsafe_rbg") in errors[0], errors[0]
  assert tree_digest(workdir / "checkpoints") == before
  resumed = _run(workdir, corpus, "--config.train.prng_impl=unsafe_rbg")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resuming from step 2" in resumed.stdout, resumed.stdout[-3000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in records if r["split"] == "train"]
  assert len(losses) == 4 and np.all(np.isfinite(losses)), records
