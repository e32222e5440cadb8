"""Shared by the tests of launch/ (test_launch_tpu.py, test_launch_slurm.py,
test_launch_errors.py, test_launch_docs.py): the paths of the launch scripts, the flags every
tpu.py command takes, a run's bertjax flags, and running tpu.py / slurm.py in a subprocess."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_PY = os.path.join(REPO, "launch", "tpu.py")
SLURM_PY = os.path.join(REPO, "launch", "slurm.py")
ENV_VARS = ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "TPU_NAME")
COMMON = ["--project=proj", "--zone=us-central2-b", "--name=bert"]

RUN_ARGS = ["--config=configs/base.py", "--config.train.batch_size=512",
            "--config.data.input_files=/mnt/my-bucket/text/*.txt",
            "--config.data.vocab_model=/mnt/my-bucket/vocab file.txt"]


def tpu(*args, env=None, **kwargs):
  """Runs launch/tpu.py with `args`, none of its environment variables set unless in `env`."""
  base = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
  return subprocess.run([sys.executable, TPU_PY, *args], env={**base, **(env or {})},
                        capture_output=True, text=True, timeout=60, **kwargs)


def check_syntax(script):
  for shell in ("bash", "sh"):
    result = subprocess.run([shell, "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, (shell, result.stderr)


def slurm(*args, env=None, **kwargs):
  """Runs launch/slurm.py with `args`."""
  return subprocess.run([sys.executable, SLURM_PY, *args], env={**os.environ, **(env or {})},
                        capture_output=True, text=True, timeout=60, **kwargs)
