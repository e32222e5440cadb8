"""launch/: tpu.py's commands (--dry-run, exact), its remote shell scripts run here against a
fake worker, its failures; slurm.py's commands and sbatch script (exact), the script run here
against a fake srun, scancel and scontrol; colab.ipynb's structure, code and bertjax commands;
the README's."""
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_PY = os.path.join(REPO, "launch", "tpu.py")
SLURM_PY = os.path.join(REPO, "launch", "slurm.py")
NOTEBOOK = os.path.join(REPO, "launch", "colab.ipynb")
LAUNCH_README = os.path.join(REPO, "launch", "README.md")
ENV_VARS = ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "TPU_NAME")
COMMON = ["--project=proj", "--zone=us-central2-b", "--name=bert"]
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
WHERE = ["--project=proj", "--zone=us-central2-b"]


def tpu(*args, env=None, **kwargs):
  """Runs launch/tpu.py with `args`, none of its environment variables set unless in `env`."""
  base = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
  return subprocess.run([sys.executable, TPU_PY, *args], env={**base, **(env or {})},
                        capture_output=True, text=True, timeout=60, **kwargs)


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


def check_syntax(script):
  for shell in ("bash", "sh"):
    result = subprocess.run([shell, "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, (shell, result.stderr)


# ----------------------------------------------------------------------------------------------
# tpu.py --dry-run


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
                         "--exclude=__pycache__", "--exclude=*.egg-info",
                         "--exclude=.pytest_cache", "--exclude=build", "--exclude=dist",
                         "-C", REPO, "."]
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


RUN_ARGS = ["--config=configs/base.py", "--config.train.batch_size=512",
            "--config.data.input_files=/mnt/my-bucket/text/*.txt",
            "--config.data.vocab_model=/mnt/my-bucket/vocab file.txt"]
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


# ----------------------------------------------------------------------------------------------
# tpu.py: bad input and failures.


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
  assert (tmp_path / "bertjax-bert.tar.gz").stat().st_size > 10_000  # tar ran first


# ----------------------------------------------------------------------------------------------
# slurm.py


def slurm(*args, env=None, **kwargs):
  """Runs launch/slurm.py with `args`."""
  return subprocess.run([sys.executable, SLURM_PY, *args], env={**os.environ, **(env or {})},
                        capture_output=True, text=True, timeout=60, **kwargs)


def slurm_dry_run(*args):
  result = slurm(*args, "--dry-run")
  assert result.returncode == 0, result.stderr
  return result.stdout


SUBMIT_ARGS = ["--nodes=2", "--gpus-per-node=8", "--cpus-per-task=16", "--partition=gpu",
               "--account=bert-lab", "--time=1-12:00:00", "--job-name=bert",
               "--venv=/shared/bertjax-venv", "--setup=module load nccl",
               "--sbatch=--mem=0", "--config=configs/base.py",
               "--workdir=/shared/runs/bert_base", "--config.train.batch_size=512",
               "--config.data.input_files=/shared/text/*.txt",
               "--config.data.vocab_model=/shared/vocab file.txt"]
SBATCH_SCRIPT = f"""\
#!/bin/bash
# bertjax on 2 node(s) x 8 GPU(s), written by launch/slurm.py; submit it with sbatch.
#SBATCH --job-name=bert
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --partition=gpu
#SBATCH --account=bert-lab
#SBATCH --time=1-12:00:00
#SBATCH --output=/shared/runs/bert_base/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --mem=0

cd {shlex.quote(REPO)} || exit 1
module load nccl
. /shared/bertjax-venv/bin/activate
# One process a node drives all 8 GPU(s) of it: without this,
# jax.distributed.initialize() would give it GPU number $SLURM_LOCALID (0) alone.
export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7
echo "bertjax: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST"

# USR1 (--signal above) comes 120 s before the time limit: SIGTERM to every task,
# which saves a checkpoint at the same step on all nodes and exits 0; then requeue.
time_limit=0
on_time_limit() {{
  time_limit=1; trapped=1
  echo "bertjax: the time limit is near: SIGTERM to every task (a checkpoint)" >&2
  scancel --signal=TERM "$SLURM_JOB_ID"
}}
trap on_time_limit USR1

srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=16 --kill-on-bad-exit=1 \
python -m bertjax.main --config=configs/base.py --workdir=/shared/runs/bert_base \
--config.train.batch_size=512 '--config.data.input_files=/shared/text/*.txt' \
'--config.data.vocab_model=/shared/vocab file.txt' &
step=$!
# A trap ends wait early (status > 128): then wait again, for srun's own exit status.
while :; do
  trapped=0; status=0; wait "$step" || status=$?
  if [ "$trapped" = 0 ] || [ "$status" -le 128 ]; then break; fi
done
if [ "$time_limit" = 1 ] && [ "$status" = 0 ]; then
  echo "bertjax: checkpoint saved; requeueing job $SLURM_JOB_ID to go on" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


def test_submit_dry_run_is_the_script_then_sbatch():
  assert slurm_dry_run("submit", *SUBMIT_ARGS) == (
      "mkdir -p /shared/runs/bert_base\n"
      "cat > /shared/runs/bert_base/bert.sbatch <<'BERTJAX_SBATCH'\n"
      f"{SBATCH_SCRIPT}BERTJAX_SBATCH\n"
      "sbatch /shared/runs/bert_base/bert.sbatch\n")
  check_syntax(SBATCH_SCRIPT)


def test_submit_defaults_and_no_requeue():
  out = slurm_dry_run("submit", "--gpus-per-node=h100:4", "--config=configs/tiny.py",
                      "--workdir=/shared/tiny", "--no-requeue", "--signal-before=600")
  script = out.split("<<'BERTJAX_SBATCH'\n")[1].split("BERTJAX_SBATCH\n")[0]
  check_syntax(script)
  directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
  assert directives == [
      "#SBATCH --job-name=bertjax", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
      "#SBATCH --gpus-per-node=h100:4", "#SBATCH --output=/shared/tiny/slurm-%j.out",
      "#SBATCH --open-mode=append", "#SBATCH --no-requeue", "#SBATCH --signal=B:USR1@600"]
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3\n" in script
  assert ("srun --nodes=1 --ntasks-per-node=1 --gpus-per-node=h100:4 --kill-on-bad-exit=1 "
          "python -m bertjax.main --config=configs/tiny.py --workdir=/shared/tiny &\n") in script
  assert "activate" not in script and "scontrol" not in script
  assert out.endswith("\nsbatch /shared/tiny/bertjax.sbatch\n")


def fake_programs(tmp_path, srun_body):
  """A bin directory with a fake srun (records its cwd, environment and arguments, then runs
  `srun_body`), scancel (SIGTERM to the pid in tmp_path/srun.pid), scontrol and sbatch, which log
  their arguments to tmp_path/calls; and a venv whose activate puts that directory first on
  PATH."""
  fake_bin, venv = tmp_path / "bin", tmp_path / "venv"
  fake_bin.mkdir()
  (venv / "bin").mkdir(parents=True)
  calls = tmp_path / "calls"
  (fake_bin / "srun").write_text(
      "#!/bin/sh\n"
      f'printf "%s\\n" "$PWD" "$VIRTUAL_ENV" "$JAX_LOCAL_DEVICE_IDS" "$@" END > {tmp_path}/srun\n'
      f"{srun_body}\n")
  (fake_bin / "scancel").write_text(
      f'#!/bin/sh\necho "scancel $*" >> {calls}\nkill -TERM "$(cat {tmp_path}/srun.pid)"\n')
  (fake_bin / "scontrol").write_text(f'#!/bin/sh\necho "scontrol $*" >> {calls}\n')
  (fake_bin / "sbatch").write_text(
      f'#!/bin/sh\necho "sbatch $*" >> {calls}\necho "Submitted batch job 4242"\n')
  for f in fake_bin.iterdir():
    f.chmod(0o755)
  (venv / "bin" / "activate").write_text(
      f'VIRTUAL_ENV="{venv}"; export VIRTUAL_ENV; PATH="{fake_bin}:$PATH"\n')
  return {"PATH": f"{fake_bin}:{os.environ['PATH']}"}, venv, calls


def submit_here(tmp_path, env, venv, *extra):
  """`slurm.py submit` for real (a fake sbatch): returns the sbatch script it wrote."""
  workdir = tmp_path / "run"
  result = slurm("submit", "--nodes=2", "--gpus-per-node=4", f"--venv={venv}",
                 "--config=configs/base.py", f"--workdir={workdir}", *RUN_ARGS[1:], *extra,
                 env=env)
  assert result.returncode == 0, result.stderr
  assert "Submitted batch job 4242" in result.stdout
  return workdir / "bertjax.sbatch"


def run_batch_script(script, tmp_path, **kwargs):
  """The sbatch script run with bash, as Slurm runs it on the job's first node."""
  env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLURM_JOB_ID": "4242",
         "SLURM_JOB_NODELIST": "gpu[01-02]"}
  return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kwargs)


def srun_call(tmp_path):
  cwd, venv, device_ids, *argv, end = (tmp_path / "srun").read_text().split("\n")[:-1]
  assert end == "END"
  return cwd, venv, device_ids, argv


def test_submit_writes_the_script_and_runs_sbatch_on_it(tmp_path):
  env, venv, calls = fake_programs(tmp_path, "exit 0")
  script = submit_here(tmp_path, env, venv)
  assert calls.read_text() == f"sbatch {script}\n"
  assert (tmp_path / "run").is_dir()  # Slurm opens the log there before the script starts
  out = slurm_dry_run("submit", "--nodes=2", "--gpus-per-node=4", f"--venv={venv}",
                      "--config=configs/base.py", f"--workdir={tmp_path / 'run'}", *RUN_ARGS[1:])
  assert f"<<'BERTJAX_SBATCH'\n{script.read_text()}BERTJAX_SBATCH\n" in out


def test_dry_run_output_pastes_into_a_shell(tmp_path):
  """The printed here-document writes the same script; the printed sbatch submits it."""
  env, _, calls = fake_programs(tmp_path, "exit 0")
  workdir = tmp_path / "pasted"
  out = slurm_dry_run("submit", *SUBMIT_ARGS[:-4], f"--workdir={workdir}")
  result = subprocess.run(["bash", "-c", out], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=20)
  assert result.returncode == 0, result.stderr
  script = (workdir / "bert.sbatch").read_text()
  assert script == out.split("<<'BERTJAX_SBATCH'\n")[1].split("BERTJAX_SBATCH\n")[0]
  assert calls.read_text() == f"sbatch {workdir / 'bert.sbatch'}\n"


@pytest.mark.parametrize("srun_status", [0, 3])
def test_batch_script_runs_bertjax_once_per_node(tmp_path, srun_status):
  """srun gets bertjax.main with the flags, in the checkout, the venv active, all GPUs a node;
  its exit status is the job's; no requeue."""
  env, venv, calls = fake_programs(tmp_path, f"exit {srun_status}")
  script = submit_here(tmp_path, env, venv)
  job = run_batch_script(script, tmp_path)
  out, err = job.communicate(timeout=20)
  assert job.returncode == srun_status, err
  cwd, active_venv, device_ids, argv = srun_call(tmp_path)
  assert cwd == REPO and active_venv == str(venv) and device_ids == "0,1,2,3"
  assert argv == ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--kill-on-bad-exit=1",
                  "python", "-m", "bertjax.main", "--config=configs/base.py",
                  f"--workdir={tmp_path / 'run'}", *RUN_ARGS[1:]]
  assert "bertjax: job 4242 (restart 0) on gpu[01-02]" in out
  assert calls.read_text() == f"sbatch {script}\n"  # no scancel, no scontrol


@pytest.mark.parametrize("requeue", [True, False])
def test_batch_script_at_the_time_limit_checkpoints_then_requeues(tmp_path, requeue):
  """Slurm's USR1 to the batch script: scancel --signal=TERM reaches srun's tasks (here the
  fake srun, which exits 0 like bertjax after its checkpoint), then scontrol requeue."""
  env, venv, calls = fake_programs(
      tmp_path, f"trap 'echo TERM > {tmp_path}/srun.term; exit 0' TERM\n"
      f"echo $$ > {tmp_path}/srun.pid\nwhile :; do sleep 0.05; done")
  script = submit_here(tmp_path, env, venv, *([] if requeue else ["--no-requeue"]))
  job = run_batch_script(script, tmp_path)
  try:
    for _ in range(200):
      if (tmp_path / "srun.pid").exists() and (tmp_path / "srun.pid").read_text().strip():
        break
      time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    _, err = job.communicate(timeout=20)
  finally:
    if job.poll() is None:
      job.kill()
      subprocess.run(["kill", (tmp_path / "srun.pid").read_text().strip()])
  assert job.returncode == 0, err
  assert (tmp_path / "srun.term").read_text() == "TERM\n"
  assert "the time limit is near" in err
  expected = [f"sbatch {script}", "scancel --signal=TERM 4242"]
  if requeue:
    expected.append("scontrol requeue 4242")
  assert calls.read_text().splitlines() == expected


def test_logs_and_stop():
  assert slurm_dry_run("logs", "--workdir=/shared/runs/bert_base", "--job=4242") == (
      "tail -n 50 /shared/runs/bert_base/slurm-4242.out\n")
  assert slurm_dry_run("logs", "--workdir=/shared/runs/bert_base", "--job=4242", "--lines=5",
                       "--follow") == "tail -n 5 -F /shared/runs/bert_base/slurm-4242.out\n"
  assert slurm_dry_run("stop", "--job=4242") == "scancel --signal=TERM 4242\n"


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


# ----------------------------------------------------------------------------------------------
# colab.ipynb and the README's commands.


def load_notebook():
  with open(NOTEBOOK, encoding="utf-8") as f:
    return json.load(f)


def cell_source(cell):
  source = cell["source"]
  return source if isinstance(source, str) else "".join(source)


def test_notebook_is_nbformat_4_without_outputs():
  nb = load_notebook()
  assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
  assert isinstance(nb["metadata"], dict) and nb["metadata"]["kernelspec"]["language"] == "python"
  kinds = [cell["cell_type"] for cell in nb["cells"]]
  assert set(kinds) <= {"code", "markdown", "raw"} and kinds.count("code") >= 5
  if nb["nbformat_minor"] >= 5:
    ids = [cell["id"] for cell in nb["cells"]]
    assert len(set(ids)) == len(ids)
  for cell in nb["cells"]:
    assert isinstance(cell["metadata"], dict)
    assert isinstance(cell["source"], (str, list))
    if cell["cell_type"] == "code":
      assert cell["outputs"] == [] and cell["execution_count"] is None


def test_notebook_code_compiles():
  for i, cell in enumerate(load_notebook()["cells"]):
    if cell["cell_type"] == "code":
      python = "\n".join(line for line in cell_source(cell).split("\n")
                         if not line.lstrip().startswith(("!", "%")))
      compile(python, f"colab.ipynb cell {i}", "exec")


def bertjax_commands(text, prefixes):
  """Argument lists of the commands in `text` (backslash-continued lines joined) that start with
  one of `prefixes`, such as "python -m bertjax.main"."""
  text = re.sub(r"\\\n\s*", " ", text)
  found = []
  for line in text.split("\n"):
    line = line.strip().lstrip("!").replace("nohup ", "")
    for prefix in prefixes:
      if line.startswith(prefix):
        found.append(shlex.split(line.split(" > ")[0], comments=True)[len(prefix.split()):])
  return found


def load_config(spec):
  """get_config() of a config file spec, e.g. configs/squad.py:v2.0."""
  path, _, arg = spec.partition(":")
  full = os.path.join(REPO, path)
  assert os.path.isfile(full), f"{spec}: no such config"
  module_spec = importlib.util.spec_from_file_location(f"_config_{os.path.basename(path)}", full)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def check_command(args):
  """--config names a config file and every --config.KEY=VALUE a field of it. Returns it."""
  [config_spec] = [a[len("--config="):] for a in args if a.startswith("--config=")]
  config = load_config(config_spec)
  for arg in args:
    if arg.startswith("--config."):
      key, _, value = arg[len("--config."):].partition("=")
      assert value, arg
      node = config
      for part in key.split("."):
        assert part in node, f"{config_spec} has no field {key} ({arg})"
        node = node[part]
  return config_spec


def test_notebook_commands_name_real_configs_and_fields():
  text = "\n".join(cell_source(c) for c in load_notebook()["cells"] if c["cell_type"] == "code")
  commands = bertjax_commands(text, ["python -m bertjax.main"])
  assert {check_command(args) for args in commands} == {
      "configs/tiny.py", "configs/features.py", "configs/glue.py"}
  assert "--config.train.num_train_steps={STEPS}" in commands[0]  # BERTJAX_NOTEBOOK_STEPS
  assert 'STEPS = int(os.environ.get("BERTJAX_NOTEBOOK_STEPS", "300"))' in text
  assert "REPO_URL = " in text and '!pip install -q -e . "{JAX}"' in text
  assert "snapshot_download" in text and "python -m bertjax.convert --from=hf" in text


def test_readme_commands_name_real_configs_and_fields_and_parse():
  with open(LAUNCH_README, encoding="utf-8") as f:
    text = f.read()
  runs = bertjax_commands(text, ["python launch/tpu.py run", "python launch/slurm.py submit",
                                 "python -m bertjax.main"])
  assert {check_command(args) for args in runs} == {"configs/base.py", "configs/glue.py"}
  env = {"CLOUDSDK_CORE_PROJECT": "p", "CLOUDSDK_COMPUTE_ZONE": "z", "TPU_NAME": "n"}
  launches = bertjax_commands(text, ["python launch/tpu.py"])
  assert {args[0] for args in launches} == {
      "create", "queue", "queue-status", "setup", "run", "logs", "stop", "delete",
      "queue-delete"}
  for args in launches:
    result = tpu(*args, "--dry-run", env=env)
    assert result.returncode == 0, (args, result.stderr)
  launches = bertjax_commands(text, ["python launch/slurm.py"])
  assert [args[0] for args in launches] == ["submit", "submit", "logs", "stop"]
  for args in launches:
    result = slurm(*args, "--dry-run")
    assert result.returncode == 0, (args, result.stderr)
