"""The divergence guard (bertjax.training.divergence) and its rollbacks in the loop
(bertjax.training.train), on tiny pretraining runs of the test corpus with batches made to
spike through a test-only data hook (tests/spike_data.py).

- The spike tests against synthetic windows; the record a checkpoint keeps decides alike.
- A spiked batch is found at its step; the run restores the checkpoint before it, skips the
  batches from there through the spike, logs the rollback, and ends with the parameters of a
  run that never met those batches (bitwise), with gradient accumulation.
- Killed (SIGKILL) right after a rollback or after the next checkpoint, then rerun: the same end.
- The learning-rate factor, and the bounded number of rollbacks, then one message.
- Two hosts take the same rollback and end as one process with their devices.
- Packing and the long phase; a fine-tuning run.
- Bad settings refused, one message each.
"""
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from clu import metrics as clu_metrics
from flax import traverse_util

from bertjax import run_config, tasks
from bertjax.configs import glue, tiny
from bertjax.errors import UserError
from bertjax.modeldir import saved_params
from bertjax.tasks import pretraining
from bertjax.tools import divergence_margins
from bertjax.training import checkpoint, curves, divergence, train

import spike_data
from conftest import GLUE_VOCAB, cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 8
STEPS = 48
SPIKE = (0, 40 * BATCH)  # the batch of step 40 of an undisturbed run


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
  """The test corpus prepared once (32-token pairs), shared by the runs."""
  text_file, vocab = corpus
  data = tmp_path_factory.mktemp("prepared") / "data"
  out = warm_python.run([sys.executable, "-m", "bertjax.data.prepare", f"--input={text_file}",
                         f"--vocab={vocab}", f"--output_dir={data}", "--max_seq_length=32,64",
                         "--max_predictions_per_seq=5,10", "--dupe_factor=2",
                         "--eval_fraction=0.1"], env=cpu_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return str(data)


def _flags(prepared, *overrides):
  """A 48-step tiny run checked every step, a checkpoint every 4, a window of 8 steps, policy
  rollback; then `overrides` (--config.KEY=VALUE)."""
  return [f"--config.data.prepared={prepared}", "--config.data.max_seq_length=32",
          "--config.data.max_predictions_per_seq=5", "--config.model.dropout_rate=0.1",
          "--config.train.batch_size=8", "--config.train.eval_batch_size=16",
          f"--config.train.num_train_steps={STEPS}", "--config.train.warmup_steps=2",
          "--config.train.log_every_steps=1", "--config.train.eval_every_steps=100",
          "--config.train.eval_steps=1", "--config.train.checkpoint_every_steps=4",
          "--config.divergence.window=8", "--config.divergence.policy=rollback", *overrides]


def _config(prepared, *overrides):
  """The ConfigDict of `_flags`."""
  config = tiny.get_config()
  for flag in _flags(prepared, *overrides):
    key, value = flag.removeprefix("--config.").split("=", 1)
    section, field = key.split(".")
    kind = type(config[section][field])
    config[section][field] = (value == "true") if kind is bool else kind(value)
  return config


def _run(monkeypatch, workdir, change, prepared, *overrides):
  """An in-process run of `_config` whose training stream passes through `change`."""
  monkeypatch.setattr(train, "train_and_evaluate", spike_data.with_stream(change))
  return tasks.run(_config(prepared, *overrides), str(workdir))


def _records(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


def _params(workdir):
  """The float32 parameters of the latest checkpoint, restored onto this process's device."""
  root = os.path.join(workdir, "checkpoints")
  step_dir = os.path.join(root, str(max(int(s) for s in os.listdir(root) if s.isdigit())))
  target = traverse_util.unflatten_dict(
      {path: jax.ShapeDtypeStruct(shape, np.float32)
       for path, shape in saved_params.saved_param_shapes(step_dir).items()}, sep="/")
  return jax.tree.map(np.asarray, saved_params.load_params(step_dir, target)[0])


def _assert_equal_params(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _recorded_guard(workdir, step):
  return checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), save_every_steps=1,
                                keep=None).guard_record(step)


# The spike tests.


class _Step(types.SimpleNamespace):
  """A train_step metrics Collection's watched averages, from plain values."""

  def __init__(self, loss, grad_norm=1.0, param_norm=10.0):
    as_average = lambda v: clu_metrics.Average(total=np.float32(v), count=np.float32(1))
    super().__init__(loss=as_average(loss), grad_norm=as_average(grad_norm),
                     param_norm=as_average(param_norm))


def _guard(**fields):
  return divergence.Guard(run_config.Divergence(**{"window": 5, **fields}))


def test_spike_tests_on_synthetic_windows():
  """Median 2.0, robust deviation 1.4826 x 0.1: a loss spikes above max(2 + 6 x 0.148, 1.25 x
  2) = 2.89; nothing is tested before the window is full; a spike leaves the window as it was;
  non-finite values come first; the record resumes the same decisions."""
  guard = _guard()
  assert guard.check([(s, _Step(9.0 if s == 1 else 2.0)) for s in range(1, 5)]) is None  # 4 < 5
  guard = _guard()
  window = [(s, _Step(v)) for s, v in enumerate([1.9, 2.0, 2.1, 2.0, 1.9], start=1)]
  assert guard.check(window) is None
  assert guard.check([(6, _Step(2.88))]) is None
  record = guard.record()
  diverged = guard.check([(7, _Step(2.0)), (8, _Step(2.9)), (9, _Step(99.0))])
  assert (diverged.step, diverged.signal) == (8, "loss_spike")
  assert diverged.threshold == pytest.approx(2 + 6 * 0.14826, abs=1e-6)  # the z-score binds
  assert diverged.median == 2.0
  assert "the loss spiked at step 8" in diverged.describe()
  stop = divergence.message(diverged, run_config.Train(), guard, [4], "WORKDIR/checkpoints")
  assert stop.startswith("the loss spiked at step 8 (loss=2.9, grad_norm=1, param_norm=10; a "
                         "spike is loss > 2.89, the median of the window being 2): training "
                         "diverged and stopped there without saving"), stop
  assert "(steps 4) are all from before it" in stop
  assert "--config.divergence.policy=rollback would restore the newest checkpoint" in stop
  resumed = divergence.Guard(run_config.Divergence(window=5), json.loads(json.dumps(record)))
  assert resumed.check([(7, _Step(2.0)), (8, _Step(2.9))]).step == 8  # the same decision
  grad = _guard().check([*window, (6, _Step(2.0, grad_norm=8.1))])
  assert (grad.step, grad.signal) == (6, "grad_norm_spike")  # 8 x the median norm 1.0
  nan = _guard().check([(1, _Step(2.0, param_norm=float("inf"))), (2, _Step(float("nan")))])
  assert (nan.step, nan.signal) == (1, "nonfinite")
  zscore_only = _guard(loss_ratio=0.0).check([*window, (6, _Step(2.0 + 6 * 0.14826 + 0.01))])
  assert zscore_only.signal == "loss_spike"
  assert _guard(loss_ratio=0.0, loss_zscore=0.0).check([*window, (6, _Step(1e9))]) is None


def test_batches_to_skip_count_the_abandoned_stretch_again_on_a_second_rollback():
  guard = _guard(policy="rollback", skip_batches=3)
  spike = divergence.Diverged(step=14, signal="loss_spike", values=dict.fromkeys(
      divergence.WATCHED, 1.0))
  assert guard.batches_to_skip(spike, 12) == 2 + 3
  guard.rolled_back(spike, 12, None, 5, {"examples": 1})
  again = divergence.Diverged(step=13, signal="nonfinite", values=spike.values)
  assert guard.batches_to_skip(again, 12) == 5 + 1 + 3  # the 5 skipped, step 13's, 3 more
  assert guard.batches_to_skip(again, 8) == 5 + 3  # another checkpoint: from it
  assert [r["restored_step"] for r in guard.rollbacks] == [12]


@pytest.mark.parametrize("fields, expected", [
    ({"window": 0}, "divergence.window=0 must be at least 1"),
    ({"lr_factor": -0.5}, "divergence.lr_factor=-0.5 must be positive"),
    ({"policy": "retry"}, "divergence.policy='retry' is not one of stop, rollback"),
    ({"loss_ratio": 0.5}, "divergence.loss_ratio=0.5 must be 0 (off) or above 1"),
    ({"max_rollbacks": -1}, "divergence.max_rollbacks=-1 must be 0 or more"),
    ({"policy": "rollback"}, "train.checkpoint_every_steps=24 saves none before the last"),
])
def test_bad_settings_are_refused(fields, expected):
  with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
    divergence.check_config(run_config.Divergence(**fields), 24, 24)


def test_bad_setting_on_the_command_line_is_one_message(prepared, tmp_path):
  """Refused before anything is written to the workdir."""
  workdir = tmp_path / "run"
  out = warm_python.run([sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
                         f"--workdir={workdir}",
                         *_flags(prepared, "--config.divergence.window=0")],
                        env=cpu_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 2, out.stderr[-3000:]
  assert "bertjax: error: divergence.window=0 must be at least 1" in out.stderr
  assert "--config.divergence.window" in out.stderr and "Traceback" not in out.stderr
  assert not os.path.exists(workdir / "checkpoints") and not os.path.exists(
      workdir / "metrics.jsonl")


# Rollbacks in the loop.


@pytest.fixture(scope="module")
def rolled_back(prepared, tmp_path_factory):
  """(the run whose batch of step 40 spikes, gradient accumulation 2; the run without the
  batches of steps 37 to 40, same settings, policy stop)."""
  monkeypatch = pytest.MonkeyPatch()
  try:
    spiked = tmp_path_factory.mktemp("spiked")
    _run(monkeypatch, spiked, spike_data.spiking({SPIKE}), prepared,
         "--config.train.grad_accum_steps=2")
    reference = tmp_path_factory.mktemp("reference")
    abandoned = {(0, step * BATCH) for step in range(37, 41)}
    _run(monkeypatch, reference, spike_data.dropping(abandoned), prepared,
         "--config.train.grad_accum_steps=2", "--config.divergence.policy=stop")
  finally:
    monkeypatch.undo()
  return spiked, reference


def test_a_spike_rolls_back_and_ends_as_a_run_that_never_met_its_batches(rolled_back):
  spiked, reference = rolled_back
  [rollback] = _records(spiked, "rollback")
  assert rollback["step"] == 40 and rollback["signal"] == "loss_spike", rollback
  assert rollback["restored_step"] == 36 and rollback["skipped_batches"] == 4
  assert rollback["data_position"]["examples"] == 40 * BATCH
  assert rollback["loss"] > 1.25 * float(np.median(  # the defaults' ratio, against the window
      [r["loss"] for r in _records(reference, "train")[31:39]]))
  logged = [r["step"] for r in _records(spiked, "train")]
  assert logged == list(range(1, STEPS + 1)), logged  # each once: the abandoned ones replaced
  _assert_equal_params(_params(spiked), _params(reference))
  # Saved with every later checkpoint: the rollback, the window as of that step.
  guard = _recorded_guard(spiked, STEPS)
  assert [r["step"] for r in guard["rollbacks"]] == [40]
  assert guard["window"]["loss"] == [r["loss"] for r in _records(reference, "train")[-8:]]
  assert curves.rollbacks(curves.read_records(spiked)) == [(40, rollback["loss"])]
  loss_panel = curves.figure(curves.read_records(spiked), "mlm_accuracy").axes[0]
  assert [(list(line.get_xdata()), line.get_label()) for line in loss_panel.lines
          if line.get_marker() == "x"] == [([40], "rollback (divergence)")]


@pytest.mark.parametrize("kill, resumes_from", [
    ((0, 41 * BATCH, 1), 36),  # the first batch drawn after the rollback: nothing new saved
    # Step 45's batch: checkpoint 40 written whole (saving 44 waited for it), 44 maybe not.
    ((0, 49 * BATCH, 1), 40),
], ids=["right_after", "after_the_next_checkpoint"])
def test_killed_after_a_rollback_and_rerun_ends_the_same(rolled_back, prepared, tmp_path, kill,
                                                         resumes_from):
  spiked, _ = rolled_back
  workdir = tmp_path / "run"
  command = [sys.executable, os.path.join(ROOT, "tests", "spiking_main.py"),
             f"{SPIKE[0]}:{SPIKE[1]}", ":".join(map(str, kill)),
             "--config=configs/tiny.py", f"--workdir={workdir}",
             *_flags(prepared, "--config.train.grad_accum_steps=2")]
  out = warm_python.run(command, env=cpu_env(), cwd=ROOT, timeout=300)
  assert out.returncode == -9, out.stderr[-3000:]
  assert "divergence: a loss spike at step 40" in out.stdout + out.stderr
  command[3] = "-"  # the same command, without the kill
  out = warm_python.run(command, env=cpu_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  resumed = int(re.search(r"resuming from step (\d+)", out.stdout).group(1))
  assert resumed == resumes_from or resumes_from == 40 and resumed == 44, out.stdout
  _assert_equal_params(_params(workdir), _params(spiked))
  assert _records(workdir, "rollback") == _records(spiked, "rollback")
  assert [r["step"] for r in _records(workdir, "train")] == list(range(1, STEPS + 1))


def test_learning_rate_factor_and_the_last_rollback(monkeypatch, prepared, tmp_path, capsys):
  """lr_factor 0.5 for 3 steps after the rollback; max_rollbacks 1: the second spike (the
  batch of step 48 of an undisturbed run, met at step 44) stops the run, naming both, with
  every checkpoint from before it kept."""
  workdir = tmp_path / "run"
  with pytest.raises(UserError) as stopped:
    _run(monkeypatch, workdir, spike_data.spiking({SPIKE, (0, 48 * BATCH)}), prepared,
         "--config.divergence.lr_factor=0.5", "--config.divergence.lr_factor_steps=3",
         "--config.divergence.max_rollbacks=1", "--config.train.keep_checkpoints=1",
         "--config.divergence.loss_zscore=3")  # the window after a rollback is noisier
  message = str(stopped.value)
  assert "spiked at step 44" in message, message  # the loss or the gradient norm
  assert "It had already rolled back 1 time, as many as divergence.max_rollbacks=1 allows: " \
         "loss_spike at step 40 -> step 36, 4 batches skipped." in message
  assert "--config.train.learning_rate" in message
  assert "divergence: a loss spike at step 40" in capsys.readouterr().out
  rates = {r["step"]: r["learning_rate"] for r in _records(workdir, "train")}
  # Warmup over 2 steps, then linear to 0 at the last step; step s makes update s - 1.
  schedule = 2e-3 * (STEPS - np.arange(STEPS)) / (STEPS - 2)
  for step in (37, 38, 39):  # the step after 36 and the two after it
    assert rates[step] == pytest.approx(0.5 * schedule[step - 1], rel=1e-5), step
  assert rates[40] == pytest.approx(schedule[39], rel=1e-5)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["40"]  # kept: from before step 44


def _two_hosts(command, workdir):
  """`command` as two processes of 2 CPU devices each, joined on 127.0.0.1."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [warm_python.popen(command + [f"--workdir={workdir}"], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=cpu_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                         JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)))
           for i in range(2)]
  outs = [p.communicate(timeout=400) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return [stdout + stderr for stdout, stderr in outs]


def test_two_hosts_take_the_same_rollback(prepared, tmp_path):
  """Both processes log the same rollback; the job ends as one process with their 4 devices.
  A shorter run than the others' (every step on two hosts costs their collectives): 28 steps,
  the batch of step 24 spiked (the window full since step 9), checked every 4 steps (the guard
  still tests each step, in order)."""
  command = [sys.executable, os.path.join(ROOT, "tests", "spiking_main.py"),
             f"0:{24 * BATCH}", "-", "--config=configs/tiny.py",
             *_flags(prepared, "--config.train.num_train_steps=28",
                     "--config.train.log_every_steps=4")]
  outputs = _two_hosts(command, tmp_path / "two")
  lines = [[line[line.index("divergence:"):] for line in out.splitlines() if "divergence:" in line]
           for out in outputs]
  assert len(lines[0]) == 1 and lines[0] == lines[1], lines
  one = tmp_path / "one"
  out = warm_python.run(command + [f"--workdir={one}"], env=cpu_env(4), cwd=ROOT,
                        timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  where = lambda r: (r["step"], r["restored_step"], r["skipped_batches"], r["data_position"])
  assert ([where(r) for r in _records(tmp_path / "two", "rollback")]
          == [where(r) for r in _records(one, "rollback")] == [(24, 20, 4, {
              "phase": 0, "batches": 20, "examples": 24 * BATCH, "packed": False})])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               _params(tmp_path / "two"), _params(one))


def test_long_phase_and_packing_keep_their_steps(monkeypatch, prepared, tmp_path, capsys):
  """Packed rows, and the long phase (64 tokens) from step 41: a spike in the first phase (the
  batch of step 36) and one in the long phase (its sixth batch, met at step 46). The first
  rollback skips within the first phase, so the long phase still starts after step 40."""
  workdir = tmp_path / "run"
  flags = ("--config.data.packing=true", "--config.data.long_seq_length=64",
           "--config.data.long_max_predictions_per_seq=10", "--config.train.long_seq_from_step=40")
  per_step = _examples_per_step(prepared, tmp_path, flags)
  capsys.readouterr()  # the probe's stream says when its long phase starts too
  spikes = {(0, 36 * per_step[0]), (1, 6 * per_step[1])}
  _run(monkeypatch, workdir, spike_data.spiking(spikes), prepared, *flags)
  assert "after 40 steps (train.long_seq_from_step)" in capsys.readouterr().out
  first, second = _records(workdir, "rollback")
  assert (first["step"], first["restored_step"], first["skipped_batches"]) == (36, 32, 4)
  assert first["data_position"] == {"phase": 0, "batches": 32, "examples": 36 * per_step[0],
                                    "packed": True}
  assert (second["step"], second["restored_step"], second["skipped_batches"]) == (46, 44, 2)
  assert second["data_position"] == {"phase": 1, "batches": 44, "examples": 6 * per_step[1],
                                     "packed": True}
  assert [r["step"] for r in _records(workdir, "train")] == list(range(1, STEPS + 1))
  assert [r["step"] for r in _recorded_guard(workdir, STEPS)["rollbacks"]] == [36, 46]
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(workdir)))


def _examples_per_step(prepared, tmp_path, flags):
  """(examples a step of the first phase consumes, of the long phase), from the data positions
  after the first two batches of each phase of the run's training stream (drawn, not trained
  on)."""
  config = tasks.typed(_config(prepared, *flags))
  (tmp_path / "probe").mkdir()
  task = pretraining.make_task(config, str(tmp_path / "probe"), train.run_context(config))
  seen = {}
  for _, after in itertools.islice(task.batches.train(None), 42):
    phase, examples = spike_data.place(after)
    seen.setdefault(phase, []).append(examples)
  first, long = (seen[phase][:2] for phase in (0, 1))
  return first[1] - first[0], long[1] - long[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  return random_bert(tmp_path_factory.mktemp("model"), GLUE_VOCAB)


def _glue(model_dir, glue_dir, **divergence_fields):
  config = glue.get_config()
  config.task = "sst2"
  config.init_checkpoint = model_dir
  config.data.glue_dir = glue_dir
  config.data.max_seq_length = 32
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=1e-3,
                      num_train_epochs=4.0, log_every_steps=1, checkpoint_every_steps=10)
  # Fine-tuning's spike tests are off by default (run_config.FinetuningDivergence): on here.
  config.divergence.update(window=8, loss_zscore=6.0, loss_ratio=1.25, **divergence_fields)
  return config


def test_fine_tuning_rolls_back_past_flipped_labels(monkeypatch, model_dir, glue_dir, tmp_path):
  """SST-2 (91 steps) whose batch of step 70, when the model is right on most rows, has its
  labels flipped: restored to step 60, the 10 batches of steps 61 to 70 skipped; the end equals
  a run without them."""
  spiked, reference = tmp_path / "spiked", tmp_path / "reference"
  monkeypatch.setattr(train, "train_and_evaluate", spike_data.with_stream(
      spike_data.spiking({(0, 70 * 16)})))
  tasks.run(_glue(model_dir, glue_dir, policy="rollback"), str(spiked))
  monkeypatch.setattr(train, "train_and_evaluate", spike_data.with_stream(
      spike_data.dropping({(0, step * 16) for step in range(61, 71)})))
  tasks.run(_glue(model_dir, glue_dir), str(reference))
  [rollback] = _records(spiked, "rollback")
  assert (rollback["step"], rollback["restored_step"], rollback["skipped_batches"]) == (
      70, 60, 10), rollback
  assert rollback["data_position"] == {"examples": 70 * 16}
  _assert_equal_params(_params(spiked), _params(reference))


def test_margins_replay_a_logged_run(rolled_back):
  """The rolled-back run as logged (the spiked step replaced by the steps retrained): below
  the tests everywhere; a window of 2 with a ratio of 1.01 makes an early step diverge."""
  spiked, _ = rolled_back
  out = warm_python.run([sys.executable, "-m", "bertjax.tools.divergence_margins",
                         f"--workdir={spiked}"], env=cpu_env(), cwd=ROOT, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "settings: window=8, loss_zscore=6, loss_ratio=1.25" in out.stdout, out.stdout
  margin = float(out.stdout.split(f"loss: {STEPS - 8} steps tested, margin ")[1].split()[0])
  assert 0 < margin < 1 and "diverged: never" in out.stdout
  records = curves.read_records(spiked)
  found = divergence_margins.margins(records, run_config.Divergence(
      window=2, loss_zscore=0, loss_ratio=1.01, grad_norm_zscore=0, grad_norm_ratio=0))
  assert found["diverged"] is not None and "the loss spiked" in found["diverged"]
  assert found["loss"]["margin"] > 1 and found["grad_norm"]["tested"] == 0
