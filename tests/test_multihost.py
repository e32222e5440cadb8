"""Pretraining as a two-host job: two processes of 2 CPU devices each, joined by jax.distributed
on 127.0.0.1 through the plain environment-variable route (JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID), with gloo collectives, running `python -m bertjax.main`.

- Losses and final parameters equal one process with 4 devices and the same global batch.
- Stopped at step k and rerun in two fresh processes: equal to the uninterrupted run; rerun in
  four processes of one device: equal too (the data position is global).
- SIGTERM to only one of the two processes: both save the same step and exit 0.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import traverse_util

from bertjax.modeldir import saved_params

from conftest import cpu_env, write_chapters
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(text file with 20 chapters of the bundled corpus, a sentencepiece model of it)."""
  return write_chapters(str(tmp_path_factory.mktemp("corpus")), 20)


def _command(workdir, corpus, *overrides):
  text_file, vocab = corpus
  return [sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py", f"--workdir={workdir}",
          f"--config.data.input_files={text_file}", f"--config.data.vocab_model={vocab}",
          "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
          "--config.data.dupe_factor=1", "--config.data.eval_fraction=0.1",
          "--config.model.dropout_rate=0.1", "--config.model.attention_dropout_rate=0.1",
          "--config.train.batch_size=8", "--config.train.eval_batch_size=16",
          f"--config.train.num_train_steps={STEPS}", "--config.train.warmup_steps=1",
          "--config.train.log_every_steps=1", f"--config.train.eval_every_steps={STEPS}",
          "--config.train.eval_steps=1", "--config.train.checkpoint_every_steps=100", *overrides]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, corpus, *overrides, processes=2):
  """Starts the job: `processes` processes of 4 / processes CPU devices each."""
  env = cpu_env(4 // processes)
  if processes > 1:
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}",
               JAX_NUM_PROCESSES=str(processes))
  return [warm_python.popen(_command(workdir, corpus, *overrides),
                            env=dict(env, JAX_PROCESS_ID=str(i)) if processes > 1 else env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


def _finish(procs, timeout=400):
  """(stdout, stderr) of each process once all exit 0; kills them all on a failure."""
  try:
    outputs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs


def _run(workdir, corpus, *overrides, processes=2):
  return _finish(_start(workdir, corpus, *overrides, processes=processes))


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return [(r["step"], r["loss"]) for r in records if r["split"] == "train"]


def _params(workdir, step):
  """The float32 parameters saved at `step`, restored onto this process's one device."""
  step_dir = os.path.join(workdir, "checkpoints", str(step))
  target = traverse_util.unflatten_dict(
      {path: jax.ShapeDtypeStruct(shape, np.float32)
       for path, shape in saved_params.saved_param_shapes(step_dir).items()}, sep="/")
  return jax.tree.map(np.asarray, saved_params.load_params(step_dir, target)[0])


@pytest.fixture(scope="module")
def two_hosts(corpus, tmp_path_factory):
  """The workdir of the uninterrupted two-process run, and the processes' output."""
  workdir = tmp_path_factory.mktemp("two_hosts") / "run"
  return workdir, _run(workdir, corpus)


def test_two_processes_equal_one_process_of_four_devices(two_hosts, corpus, tmp_path):
  workdir, outputs = two_hosts
  one = tmp_path / "one"
  _run(one, corpus, processes=1)
  two_losses, one_losses = _losses(workdir), _losses(one)
  assert [s for s, _ in two_losses] == list(range(1, STEPS + 1))
  print("losses, 2 processes x 2 devices:", two_losses)
  print("losses, 1 process x 4 devices:  ", one_losses)
  np.testing.assert_allclose([l for _, l in two_losses], [l for _, l in one_losses],
                             rtol=1e-6, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               _params(workdir, STEPS), _params(one, STEPS))
  assert "examples" in json.loads((workdir / "eval_results.json").read_text())
  assert all("2 hosts" not in err for _, err in outputs)


@pytest.fixture(scope="module")
def stopped_at_2(corpus, tmp_path_factory):
  """The two-process run stopped at step 2 (`train.stop_after_steps`), as a template: each test
  resumes a copy of it."""
  workdir = tmp_path_factory.mktemp("stopped") / "run"
  _run(workdir, corpus, "--config.train.stop_after_steps=2")
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
  return workdir


def test_stopped_and_rerun_in_fresh_processes_equals_the_uninterrupted_run(two_hosts, stopped_at_2,
                                                                           corpus, tmp_path):
  straight, _ = two_hosts
  resumed = tmp_path / "resumed"
  shutil.copytree(stopped_at_2, resumed)
  outputs = _run(resumed, corpus)
  assert all("resuming from step 2" in out for out, _ in outputs)
  jax.tree.map(np.testing.assert_array_equal, _params(straight, STEPS), _params(resumed, STEPS))
  assert _losses(resumed) == _losses(straight)


def test_resumed_on_four_processes_continues_the_two_process_run(two_hosts, stopped_at_2, corpus,
                                                                 tmp_path):
  """The data position is global: stopped at step 2 on 2 processes x 2 devices and resumed on 4
  processes x 1 device, the run sees the batches the uninterrupted run saw (every example of
  the epoch once) and ends with its parameters."""
  straight, _ = two_hosts
  resumed = tmp_path / "resumed"
  shutil.copytree(stopped_at_2, resumed)
  outputs = _run(resumed, corpus, processes=4)
  assert all("resuming from step 2" in out for out, _ in outputs)
  np.testing.assert_allclose([l for _, l in _losses(resumed)], [l for _, l in _losses(straight)],
                             rtol=1e-6, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               _params(straight, STEPS), _params(resumed, STEPS))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_one_process_stops_both_at_the_same_step(sig, corpus, tmp_path):
  workdir = tmp_path / "run"
  procs = _start(workdir, corpus, "--config.train.num_train_steps=100000",
                 "--config.train.eval_every_steps=100000")
  deadline = time.time() + 300
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if (workdir / "metrics.jsonl").exists() and len(_losses(workdir)) >= 3:
      break
    time.sleep(0.5)
  procs[1].send_signal(sig)  # only the second process hears it
  outputs = _finish(procs, timeout=200)
  saved = [re.search(r"saved a checkpoint at step (\d+)", out) for out, _ in outputs]
  assert all(saved), [out[-500:] for out, _ in outputs]
  steps = {int(m.group(1)) for m in saved}
  assert len(steps) == 1, steps
  assert sorted(int(s) for s in os.listdir(workdir / "checkpoints")) == list(steps)
  assert all(out.count("saved a checkpoint") == 1 for out, _ in outputs)
