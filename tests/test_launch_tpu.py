"""launch/tpu.py: its commands (--dry-run, exact) and the remote shell scripts they run,
one of them run here against a fake worker."""
import os
import re
import shlex
import subprocess
import time

import pytest

from launch_helpers import COMMON, REPO, RUN_ARGS, check_syntax, tpu

GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
WHERE = ["--project=proj", "--zone=us-central2-b"]


def dry_run(*args, env=None):
  """The commands printed by --dry-run, each split into its argv."""
  result = tpu(*args, "--dry-run", env=env)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def remote_script(cmd):
  """The shell line an ssh command runs on the workers (its --command=)."""
  [script] = [a[len("--command="):] for a in cmd if a.startswith("--command=")]
  return script


def pinned_jax():
  with open(os.path.join(REPO, "setup.py")) as f:
    return re.search(r'"jax==([0-9.]+)"', f.read()).group(1)


@pytest.mark.parametrize("accelerator,version", [
    ("v4-8", "tpu-ubuntu2204-base"),  # one host
    ("v4-32", "tpu-ubuntu2204-base"),  # a pod slice of 4 hosts
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_create(accelerator, version):
  assert dry_run("create", *COMMON, f"--accelerator-type={accelerator}") == [
      GCLOUD_TPU + ["create", "bert", *WHERE, f"--accelerator-type={accelerator}",
                    f"--version={version}"]]


def test_create_spot_version_and_environment():
  env = {"CLOUDSDK_CORE_PROJECT": "proj", "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
         "TPU_NAME": "bert"}
  assert dry_run("create", "--accelerator-type=v4-32", "--version=tpu-vm-base", "--spot",
                 env=env) == [
      GCLOUD_TPU + ["create", "bert", *WHERE, "--accelerator-type=v4-32",
                    "--version=tpu-vm-base", "--spot"]]


def test_setup_copies_the_working_tree_to_all_workers(tmp_path):
  commands = dry_run("setup", *COMMON, env={"TMPDIR": str(tmp_path)})
  tarball = str(tmp_path / "bertjax-bert.tar.gz")
  assert commands[0] == ["tar", "-czf", tarball, "--exclude=.git", "--exclude=.venv",
                         "--exclude=.tpu-venv", "--exclude=.gpu", "--exclude=__pycache__",
                         "--exclude=*.egg-info", "--exclude=.pytest_cache", "--exclude=build",
                         "--exclude=dist", "-C", REPO, "."]
  assert commands[1] == GCLOUD_TPU + ["scp", tarball, "bert:bertjax-src.tar.gz", *WHERE,
                                      "--worker=all"]
  assert commands[2][:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  assert len(commands) == 3
  script = remote_script(commands[2])
  check_syntax(script)
  steps = ["set -e",
           "tar -xzf $HOME/bertjax-src.tar.gz -C $HOME/bertjax",
           '"$PY" -m venv $HOME/bertjax-venv',
           f"$HOME/bertjax-venv/bin/pip install -q -e $HOME/bertjax 'jax[tpu]=={pinned_jax()}'"]
  positions = [script.find(step) for step in steps]
  assert -1 not in positions and positions == sorted(positions), positions


def test_setup_clones_a_repo_at_a_ref():
  [ssh] = dry_run("setup", *COMMON, "--repo=https://example.org/me/bertjax.git", "--ref=v1")
  assert ssh[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  script = remote_script(ssh)
  check_syntax(script)
  assert ("git clone --quiet https://example.org/me/bertjax.git $HOME/bertjax; "
          "git -C $HOME/bertjax checkout --quiet v1; ") in script
  assert f"'jax[tpu]=={pinned_jax()}'" in script


OVERRIDES_QUOTED = ("--config.train.batch_size=512 '--config.data.input_files=/mnt/my-bucket/"
                    "text/*.txt' '--config.data.vocab_model=/mnt/my-bucket/vocab file.txt'")


def test_run_with_a_bucket():
  [ssh] = dry_run("run", *COMMON, "--bucket=gs://my-bucket", "--workdir=runs/base", *RUN_ARGS)
  assert ssh[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  script = remote_script(ssh)
  check_syntax(script)
  mount = ('if ! mountpoint -q /mnt/my-bucket; then sudo mkdir -p /mnt/my-bucket; '
           'sudo chown "$(id -u):$(id -g)" /mnt/my-bucket; gcsfuse --implicit-dirs '
           "--rename-dir-limit=200000 my-bucket /mnt/my-bucket; fi; ")
  main = ("setsid nohup python -m bertjax.main --config=configs/base.py "
          f"--workdir=/mnt/my-bucket/runs/base {OVERRIDES_QUOTED} > $HOME/bertjax-run.log "
          "2>&1 < /dev/null & echo $! > $HOME/bertjax-run.pid; ")
  assert mount in script and main in script
  assert script.index(mount) < script.index(main)


def test_run_without_a_bucket():
  [ssh] = dry_run("run", *COMMON, "--workdir=/home/me/run", *RUN_ARGS)
  script = remote_script(ssh)
  assert "gcsfuse" not in script
  assert (f"python -m bertjax.main --config=configs/base.py --workdir=/home/me/run "
          f"{OVERRIDES_QUOTED} > ") in script


@pytest.mark.parametrize("endpoints,coordinator", [
    ("t1v-n-0-w-0:0:10.130.0.5", None),  # v4-8: one host, no jax.distributed coordinator
    ("t1v-n-0-w-0:0:10.130.0.5,t1v-n-0-w-1:1:10.130.0.6,t1v-n-0-w-2:2:10.130.0.7,"
     "t1v-n-0-w-3:3:10.130.0.8", "10.130.0.5:8482"),  # v4-32: worker 0 coordinates
    ("host-0,host-1", "host-0:8482"),  # the metadata's newer form, host names only
])
def test_run_script_on_a_fake_worker(tmp_path, endpoints, coordinator):
  """The run command's script, run here: curl answers the metadata query, `python` (from the
  venv's activate) records its arguments and environment; then a second run is refused."""
  home, fake_bin = tmp_path / "home", tmp_path / "bin"
  (home / "bertjax").mkdir(parents=True)
  (home / "bertjax-venv" / "bin").mkdir(parents=True)
  fake_bin.mkdir()
  (fake_bin / "curl").write_text(f"#!/bin/sh\necho '{endpoints}'\n")
  (fake_bin / "python").write_text(
      "#!/bin/sh\n"
      'printf "%s\\n" "$PWD" "${JAX_COORDINATOR_ADDRESS-unset}" "$@" END > "$HOME/called"\n'
      "exec sleep 30\n")
  for f in fake_bin.iterdir():
    f.chmod(0o755)
  (home / "bertjax-venv" / "bin" / "activate").write_text(f'PATH="{fake_bin}:$PATH"\n')
  [ssh] = dry_run("run", *COMMON, "--workdir=/data/run", *RUN_ARGS)
  env = {"HOME": str(home), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
  try:
    first = subprocess.run(["bash", "-c", remote_script(ssh)], env=env, capture_output=True,
                           text=True, timeout=20)
    assert first.returncode == 0, first.stderr
    for _ in range(100):
      if (home / "called").exists() and (home / "called").read_text().endswith("END\n"):
        break
      time.sleep(0.05)
    cwd, address, *argv, _ = (home / "called").read_text().split("\n")[:-1]
    assert cwd == str(home / "bertjax")
    assert address == (coordinator or "unset")
    assert argv == ["-m", "bertjax.main", "--config=configs/base.py", "--workdir=/data/run",
                    *RUN_ARGS[1:]]
    second = subprocess.run(["bash", "-c", remote_script(ssh)], env=env, capture_output=True,
                            text=True, timeout=20)
    assert second.returncode == 1 and "a run is going on" in second.stderr
  finally:
    if (home / "bertjax-run.pid").exists():
      subprocess.run(["kill", (home / "bertjax-run.pid").read_text().strip()])


def test_logs_stop_delete():
  assert dry_run("logs", *COMMON) == [
      GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=0",
                    "--command=tail -n 50 $HOME/bertjax-run.log"]]
  assert dry_run("logs", *COMMON, "--worker=2", "--lines=10", "--follow") == [
      GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=2",
                    "--command=tail -n 10 -F $HOME/bertjax-run.log"]]
  [stop] = dry_run("stop", *COMMON)
  assert stop[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  assert 'kill -TERM "$(cat $HOME/bertjax-run.pid)"' in remote_script(stop)
  check_syntax(remote_script(stop))
  assert dry_run("delete", *COMMON) == [GCLOUD_TPU + ["delete", "bert", *WHERE]]
  assert dry_run("delete", *COMMON, "--yes") == [
      GCLOUD_TPU + ["delete", "bert", *WHERE, "--quiet"]]


GCLOUD_QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]


def test_queue():
  assert dry_run("queue", *COMMON, "--accelerator-type=v4-32") == [
      GCLOUD_QUEUED + ["create", "bert", *WHERE, "--node-id=bert", "--accelerator-type=v4-32",
                       "--runtime-version=tpu-ubuntu2204-base"]]
  assert dry_run("queue", *COMMON, "--accelerator-type=v5litepod-16", "--spot",
                 "--valid-until-duration=6h", "--queued-resource=bert-qr") == [
      GCLOUD_QUEUED + ["create", "bert-qr", *WHERE, "--node-id=bert",
                       "--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite",
                       "--spot", "--valid-until-duration=6h"]]
  assert dry_run("queue", *COMMON, "--accelerator-type=v6e-8", "--version=v2-alpha-tpuv6e",
                 "--reserved", "--valid-until-duration=1h30m") == [
      GCLOUD_QUEUED + ["create", "bert", *WHERE, "--node-id=bert", "--accelerator-type=v6e-8",
                       "--runtime-version=v2-alpha-tpuv6e", "--reserved",
                       "--valid-until-duration=1h30m"]]


def test_queue_status_and_delete():
  assert dry_run("queue-status", *COMMON) == [GCLOUD_QUEUED + ["describe", "bert", *WHERE]]
  assert dry_run("queue-status", *COMMON, "--queued-resource=bert-qr") == [
      GCLOUD_QUEUED + ["describe", "bert-qr", *WHERE]]
  assert dry_run("queue-delete", *COMMON) == [
      GCLOUD_QUEUED + ["delete", "bert", *WHERE, "--force"]]
  assert dry_run("queue-delete", *COMMON, "--yes") == [
      GCLOUD_QUEUED + ["delete", "bert", *WHERE, "--force", "--quiet"]]
