"""launch/tpu.py and launch/slurm.py on bad input and failures: a missing flag or bad value is
one clear line, a missing gcloud or sbatch runs nothing, a failing command stops the rest."""
import os
import tarfile

import pytest

from launch_helpers import COMMON, slurm, tpu


@pytest.mark.parametrize("args,named", [
    (["create", "--zone=z", "--name=n", "--accelerator-type=v4-8"], "--project"),
    (["create", "--project=p", "--name=n", "--accelerator-type=v4-8"], "--zone"),
    (["create", "--project=p", "--zone=z", "--accelerator-type=v4-8"], "--name"),
    (["create", *COMMON], "--accelerator-type"),
    (["queue", *COMMON], "--accelerator-type"),
    (["queue-status", "--project=p", "--zone=z"], "--name"),
    (["run", *COMMON, "--workdir=w"], "--config"),
    (["run", *COMMON, "--config=configs/base.py"], "--workdir"),
])
def test_a_missing_flag_is_named(args, named):
  result = tpu(*args, "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert named in result.stderr.splitlines()[-1], result.stderr


@pytest.mark.parametrize("args,message", [
    (["run", "--config=c", "--workdir=gs://b/run"], "mount the bucket instead"),
    (["run", "--config=c", "--workdir=/abs", "--bucket=bkt"], "is a path inside the bucket"),
    (["run", "--config=c", "--workdir=w", "--bucket=Bad Bucket"], "is not a bucket name"),
    (["run", "--config=c", "--workdir=w", "--lr=1"], "unrecognized argument '--lr=1'"),
    (["run", "--config=c", "--workdir=w", "--config.seed"], "--config.KEY=VALUE"),
    (["create", "--accelerator-type=tpu8"], "not of the form"),
    (["create", "--accelerator-type=v9x-8"], "pass --version"),
    (["setup", "--ref=main"], "--ref needs --repo"),
    (["queue", "--accelerator-type=v4-8", "--spot", "--reserved"],
     "argument --reserved: not allowed with argument --spot"),
    (["queue", "--accelerator-type=v4-8", "--valid-until-duration=6 hours"], "not a duration"),
    (["queue", "--accelerator-type=v4", "--spot"], "not of the form"),
    (["queue-delete", "--force"], "unrecognized arguments: --force"),
])
def test_bad_input_is_one_clear_error(args, message):
  result = tpu(*args[:1], *COMMON, *args[1:], "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert message in result.stderr, result.stderr


def test_without_gcloud_on_path_nothing_runs(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  result = tpu("create", *COMMON, "--accelerator-type=v4-8", env={"PATH": str(empty)})
  assert result.returncode == 2
  assert "gcloud is not on PATH" in result.stderr and "--dry-run" in result.stderr


def test_runs_the_commands_and_stops_at_the_first_failure(tmp_path):
  """A fake gcloud logs its calls and fails on scp: tar runs, scp fails, ssh never runs."""
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  log = tmp_path / "calls"
  (fake_bin / "gcloud").write_text(
      f'#!/bin/sh\necho "$4" >> {log}\n[ "$4" = scp ] && exit 7\nexit 0\n')
  (fake_bin / "gcloud").chmod(0o755)
  env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
  result = tpu("create", *COMMON, "--accelerator-type=v4-8", env=env)
  assert result.returncode == 0, result.stderr
  result = tpu("setup", *COMMON, env=env)
  assert result.returncode == 7
  assert "command failed (exit status 7): gcloud compute tpus tpu-vm scp" in result.stderr
  assert log.read_text().split() == ["create", "scp"]
  tarball = tmp_path / "bertjax-bert.tar.gz"
  assert tarball.stat().st_size > 10_000  # tar ran first
  with tarfile.open(tarball) as tar:  # the code, not the local environments (.venv, .tpu-venv)
    top = {name.split("/")[1] for name in tar.getnames() if name.count("/")}
  assert "bertjax" in top and not top & {".git", ".venv", ".tpu-venv", ".gpu"}, sorted(top)


SUBMIT_MINIMAL = ["--gpus-per-node=8", "--config=configs/base.py", "--workdir=/shared/w"]


@pytest.mark.parametrize("args,message", [
    (["submit", "--config=configs/base.py", "--workdir=/w"], "--gpus-per-node"),
    (["submit", "--gpus-per-node=8", "--workdir=/w"], "--config"),
    (["submit", "--gpus-per-node=8", "--config=configs/base.py"], "--workdir"),
    (["stop"], "--job"),
    (["logs", "--job=1"], "--workdir"),
    (["submit", *SUBMIT_MINIMAL[1:], "--gpus-per-node=eight"], "is not a GPU count"),
    (["submit", *SUBMIT_MINIMAL, "--time=1 day"], "is not a Slurm time limit"),
    (["submit", *SUBMIT_MINIMAL, "--time=2", "--signal-before=120"], "is not less than"),
    (["submit", *SUBMIT_MINIMAL, "--signal-before=0"], "between 1 and 65535"),
    (["submit", *SUBMIT_MINIMAL, "--nodes=0"], "at least 1"),
    (["submit", *SUBMIT_MINIMAL, "--nodes=two"], "invalid int value: 'two'"),
    (["submit", *SUBMIT_MINIMAL, "--job-name=my job"], "letters, digits"),
    (["submit", *SUBMIT_MINIMAL, "--partition=gpu a100"], "no spaces"),
    (["submit", *SUBMIT_MINIMAL, "--sbatch=mem=0"], "give an sbatch option"),
    (["submit", *SUBMIT_MINIMAL, "--setup=BERTJAX_SBATCH"], "may not be BERTJAX_SBATCH"),
    (["submit", *SUBMIT_MINIMAL, "--lr=1"], "unrecognized argument '--lr=1'"),
    (["submit", *SUBMIT_MINIMAL, "--config.seed"], "--config.KEY=VALUE"),
    (["submit", *SUBMIT_MINIMAL[:1], "--config=configs/nope.py", "--workdir=/w"],
     "no file configs/nope.py in"),
    (["stop", "--job=last"], "is not a Slurm job ID"),
    (["stop", "--job=1", "--config.seed=1"], "unrecognized arguments"),
])
def test_slurm_bad_input_is_one_clear_error(args, message):
  result = slurm(*args, "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert message in result.stderr.splitlines()[-1], result.stderr
  assert "Traceback" not in result.stderr


def test_slurm_without_sbatch_on_path_nothing_runs(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  result = slurm("submit", "--gpus-per-node=8", "--config=configs/base.py",
                 f"--workdir={tmp_path / 'w'}", env={"PATH": str(empty)})
  assert result.returncode == 2
  assert "sbatch is not on PATH" in result.stderr and "--dry-run" in result.stderr
  assert not (tmp_path / "w").exists()
