"""Faults around checkpoints, through the command line on a small corpus (tiny model, 32-token
sequences, batch 8, a few steps on the CPU): a loss that becomes NaN, a damaged latest
checkpoint, a disk that fills up during a save. Each ends in one line (an error, or a warning
and a resume), no traceback, and no good checkpoint lost."""
import errno
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.training import checkpoint, train
from bertjax.errors import UserError

from conftest import cpu_env, tree_digest
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags(corpus, *overrides):
  """Flags of a short tiny run on the test corpus (6 steps, a checkpoint every 2, the last 2
  kept), then `overrides`."""
  text_file, vocab = corpus
  return [f"--config.data.input_files={text_file}", f"--config.data.vocab_model={vocab}",
          "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
          "--config.data.dupe_factor=2", "--config.data.eval_fraction=0.1",
          "--config.train.batch_size=8", "--config.train.eval_batch_size=16",
          "--config.train.num_train_steps=6", "--config.train.warmup_steps=2",
          "--config.train.log_every_steps=1", "--config.train.eval_every_steps=100",
          "--config.train.checkpoint_every_steps=2", "--config.train.eval_steps=1", *overrides]


def _run(workdir, flags):
  env = cpu_env()
  return warm_python.run([sys.executable, "-m", "bertjax.main",
                          f"--config={os.path.join(ROOT, 'bertjax/configs/tiny.py')}",
                          f"--workdir={workdir}", *flags],
                         env=env, cwd=ROOT, timeout=300)


def _lines(out, prefix):
  """The lines of stderr from `prefix` on (tqdm's carriage returns split lines; a message may
  follow a progress bar on its line)."""
  return [line[line.index(prefix):] for line in out.stderr.splitlines() if prefix in line]


def _one_line(out, prefix, *expected):
  """The one line of stderr starting with `prefix`, holding every `expected` text, and no
  traceback anywhere."""
  lines = _lines(out, prefix)
  assert len(lines) == 1, out.stderr[-3000:]
  for text in expected:
    assert text in lines[0], (text, lines[0])
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  return lines[0]


def _entries(workdir):
  """The names in WORKDIR/checkpoints, sorted."""
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


def _steps(workdir):
  return sorted(int(name) for name in _entries(workdir) if name.isdigit())


def _saved_state(workdir, step):
  return ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))


def _largest_data_file(step_dir):
  files = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(step_dir, "state"))
           for name in names if os.sep + "d" + os.sep in os.path.join(root, name)]
  return max(files, key=os.path.getsize)


def test_nan_loss_stops_at_that_step_and_keeps_every_finite_checkpoint(corpus, tmp_path):
  """A learning rate of 1e6 without warmup makes the loss NaN within a few steps. With a
  checkpoint every step and 2 kept, saving on would rotate the finite ones out."""
  workdir = tmp_path / "run"
  out = _run(workdir, _flags(corpus, "--config.train.learning_rate=1e6",
                             "--config.train.warmup_steps=0",
                             "--config.train.checkpoint_every_steps=1"))
  assert out.returncode == 2, out.stderr[-3000:]
  message = _one_line(out, "bertjax: error:", "NaN or infinite at step", "diverged",
                      "train.learning_rate=1e+06", "train.warmup_steps=0", "clip_norm",
                      "--config.train.learning_rate")
  step = int(re.search(r"at step (\d+)", message).group(1))
  assert 2 <= step < 6, message
  kept = _steps(workdir)
  assert kept == list(range(max(1, step - 2), step)), (kept, message)  # the last 2 before it
  assert _entries(workdir) == [str(s) for s in kept]  # no partial save
  assert f"steps {', '.join(map(str, kept))}" in message
  for saved in kept:
    state = _saved_state(workdir, saved)
    assert int(state["step"]) == saved
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"])), saved
  # The non-finite steps were never logged either.
  with open(workdir / "metrics.jsonl") as f:
    logged = [line for line in f if '"split": "train"' in line]
  assert len(logged) == step - 1 and "NaN" not in "".join(logged) and "Infinity" not in "".join(
      logged)


def test_damaged_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(
    corpus, tmp_path):
  """A truncated data file in the latest checkpoint: one warning, the directory renamed aside
  (not deleted), the run resumes from the step before. With every checkpoint damaged (one
  truncated, one without its metadata): refused, naming both, nothing changed."""
  original = tmp_path / "original"
  out = _run(original, _flags(corpus, "--config.train.stop_after_steps=4"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert _entries(original) == ["2", "4"]

  workdir = tmp_path / "truncated"
  shutil.copytree(original, workdir)
  os.truncate(_largest_data_file(workdir / "checkpoints" / "4"), 1000)
  damaged = tree_digest(workdir / "checkpoints" / "4")
  out = _run(workdir, _flags(corpus))
  assert out.returncode == 0, out.stderr[-3000:]
  warning = _one_line(out, "bertjax: warning:", "checkpoint of step 4", "does not read back",
                      "resuming from step 2")
  assert "bertjax: error" not in out.stderr
  assert "resuming from step 2" in out.stdout
  aside = [name for name in _entries(workdir) if name.startswith("4.corrupt-")]
  assert len(aside) == 1 and aside[0] in warning, (_entries(workdir), warning)
  assert tree_digest(workdir / "checkpoints" / aside[0]) == damaged  # kept as it was
  assert _steps(workdir) == [4, 6]  # step 4 trained and saved again, then 6

  workdir = tmp_path / "all_damaged"
  shutil.copytree(original, workdir)
  os.truncate(_largest_data_file(workdir / "checkpoints" / "4"), 1000)
  os.remove(workdir / "checkpoints" / "2" / "state" / "_METADATA")
  before = tree_digest(workdir)
  out = _run(workdir, _flags(corpus))
  assert out.returncode == 2, out.stderr[-3000:]
  _one_line(out, "bertjax: error:", "no checkpoint", "reads back whole",
            str(workdir / "checkpoints" / "4"), str(workdir / "checkpoints" / "2"), "_METADATA",
            "--workdir", "nothing was changed")
  assert tree_digest(workdir) == before


def _mount_tmpfs(directory, megabytes):
  """Mounts a tmpfs of `megabytes` on `directory` (again with a new size if mounted); False
  where that is not allowed."""
  directory.mkdir(exist_ok=True)
  options = f"remount,size={megabytes}m" if os.path.ismount(directory) else f"size={megabytes}m"
  try:
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                            capture_output=True, text=True, check=False)
  except OSError:
    return False
  return result.returncode == 0


def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_the_rerun_resumes(
    corpus, tmp_path):
  """On an 11 MB tmpfs (a real full disk): the prepared data and the checkpoint of step 2 (about
  6 MB) fit, the checkpoint of step 4 does not. One message, the partial directory removed, step
  2 kept (with keep_checkpoints=1, orbax would remove it once 4 is written); once the disk is
  larger the same command resumes from step 2."""
  disk = tmp_path / "disk"
  if not _mount_tmpfs(disk, 11):
    pytest.skip("cannot mount a tmpfs here (needs root); "
                "test_disk_full_in_a_background_save_is_one_user_error covers it in-process")
  try:
    workdir = disk / "run"
    flags = _flags(corpus, "--config.train.keep_checkpoints=1")
    out = _run(workdir, flags)
    assert out.returncode == 2, out.stderr[-3000:]
    _one_line(out, "bertjax: error:", f"the disk holding {workdir / 'checkpoints'} is full",
              "No space left on device", "checkpoint of step 4", "Free at least",
              "keep_checkpoints", "resumes from step 2")
    assert _entries(workdir) == ["2"]  # the partial 4.orbax-checkpoint-tmp is gone
    assert _mount_tmpfs(disk, 24)
    out = _run(workdir, flags)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from step 2" in out.stdout  # step 2 was kept whole
    assert _entries(workdir) == ["6"]
  finally:
    subprocess.run(["umount", str(disk)], check=False)


def test_disk_full_in_a_background_save_is_one_user_error(tmp_path, monkeypatch):
  """The same at the level of `Checkpoints`, without a small disk: orbax's background write of
  a step's data position raises ENOSPC (monkeypatched), after the arrays were written."""
  def state(step):
    return {"step": jnp.asarray(step), "params": {"w": jnp.full((64, 64), float(step))}}

  directory = tmp_path / "checkpoints"
  with checkpoint.Checkpoints(directory, save_every_steps=1, keep=1) as checkpoints:
    checkpoints.save(1, state(1), {"batches": 1})
  saved = tree_digest(directory / "1")

  async def full_disk(self, item, path):
    del self, item
    (path / "metadata").write_text("{\"partial")
    raise OSError(errno.ENOSPC, "No space left on device", str(path / "metadata"))

  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", full_disk)
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=1)
  assert checkpoints.save(2, state(2), {"batches": 2})  # started; fails in the background
  with pytest.raises(UserError, match=r"is full \(No space left on device\): the checkpoint of "
                     r"step 2 .* then rerun the same command: it resumes from step 1"):
    checkpoints.save(3, state(3), {"batches": 3})
  checkpoints.close()
  monkeypatch.undo()
  assert sorted(os.listdir(directory)) == ["1"]
  assert tree_digest(directory / "1") == saved
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state(1))
  restored, position = checkpoint.Checkpoints(directory, save_every_steps=1,
                                              keep=2).resume(abstract)
  assert int(restored["step"]) == 1 and position == {"batches": 1}


def test_a_report_write_that_meets_a_full_disk_is_one_user_error(tmp_path, monkeypatch):
  """metrics.jsonl flushed while a background save fills the disk (a race the tmpfs test above
  can lose): the error is the save's message, not an OSError of the report; a full disk with no
  failed save names the workdir's disk and the step a rerun resumes from; other errors pass."""
  def state(step):
    return {"step": jnp.asarray(step), "params": {"w": jnp.full((64, 64), float(step))}}

  async def full_disk(self, item, path):
    del self, item
    raise OSError(errno.ENOSPC, "No space left on device", str(path / "metadata"))

  full = OSError(errno.ENOSPC, "No space left on device")
  directory = tmp_path / "checkpoints"
  with checkpoint.Checkpoints(directory, save_every_steps=1, keep=1) as checkpoints:
    checkpoints.save(1, state(1), {"batches": 1})
    assert train._raise_full_disk(ValueError("not a disk"), checkpoints, tmp_path) is None
    assert train._raise_full_disk(None, checkpoints, tmp_path) is None
    with pytest.raises(UserError, match=rf"the disk holding {tmp_path} is full \(No space left "
                       r"on device\) while writing the run's reports\. .* resumes from step 1"):
      train._raise_full_disk(full, checkpoints, tmp_path)
  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", full_disk)
  checkpoints = checkpoint.Checkpoints(directory, save_every_steps=1, keep=1)
  assert checkpoints.save(2, state(2), {"batches": 2})  # fails in the background
  with pytest.raises(UserError, match=r"is full \(No space left on device\): the checkpoint of "
                     r"step 2 .* it resumes from step 1"):
    train._raise_full_disk(full, checkpoints, tmp_path)
  checkpoints.close()
  assert sorted(os.listdir(directory)) == ["1"]
