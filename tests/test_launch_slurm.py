"""launch/slurm.py: its commands and sbatch script (exact), and the script run here against a
fake srun, scancel, scontrol and sbatch."""
import os
import shlex
import signal
import subprocess
import time

import pytest

from launch_helpers import REPO, RUN_ARGS, check_syntax, slurm


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
