"""What launch/tpu.py runs on the TPU workers: the shell steps of setup, run, logs and stop.

Every step is a shell line for `gcloud compute tpus tpu-vm ssh --worker=all --command=LINE`
(`shell_line` joins them): the paths bertjax uses in the ssh user's home directory, the check
that no run is going on, Python and the code for `setup`, the bucket's mount and the
coordinator's address for `run`, and SIGTERM for `stop`. launch/tpu.py's docstring tells what
each subcommand does there.
"""
from __future__ import annotations

import shlex

# On the workers (relative to the home directory of the ssh user).
REMOTE_REPO = "$HOME/bertjax"
REMOTE_VENV = "$HOME/bertjax-venv"
REMOTE_LOG = "$HOME/bertjax-run.log"
REMOTE_PID = "$HOME/bertjax-run.pid"
REMOTE_TARBALL = "bertjax-src.tar.gz"  # scp'd into the home directory
MOUNT_ROOT = "/mnt"  # --bucket=B is mounted at /mnt/B
COORDINATOR_PORT = 8482  # jax's default for Cloud TPU (jax._src.clusters.cloud_tpu_cluster)
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"

# Without gcsfuse on a worker, the run stops before it starts, saying where to get it.
GCSFUSE_MISSING = (
    "echo 'gcsfuse is not installed on this worker: install Cloud Storage FUSE as its guide says "
    "(https://cloud.google.com/storage/docs/cloud-storage-fuse/install), on every worker' >&2; "
    "exit 1")


def shell_line(steps: list[str]) -> str:
  """Shell steps as one line that stops at the first failing step (`set -e`); a step ending in
  `&` (started in the background) is followed by a space, as `&;` is a syntax error."""
  line = "set -e"
  for step in steps:
    line += (" " if line.endswith("&") else "; ") + step
  return line


def not_running_step() -> str:
  """Stops the script on a worker where a run started by `run` is still going on."""
  return (f'if [ -f {REMOTE_PID} ] && kill -0 "$(cat {REMOTE_PID})" 2>/dev/null; then '
          'echo "bertjax: a run is going on on $(hostname) '
          f'(pid $(cat {REMOTE_PID})); stop it first (tpu.py stop)" >&2; exit 1; fi')


def python_steps() -> list[str]:
  """Python >= 3.11 (jax's minimum) and git: the image's python3 if new enough (Ubuntu 24.04
  images), else Ubuntu 22.04's python3.11 package."""
  apt = "sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq"
  return [
      "if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; "
      "then PY=python3; else PY=python3.11; fi",
      f"{apt} update",
      f'{apt} install -y git "$PY" "$PY-venv"',
  ]


def mount_steps(bucket: str) -> list[str]:
  """Mounts gs://BUCKET at /mnt/BUCKET (once) with gcsfuse, which the worker must have.
  --rename-dir-limit lets orbax rename a finished checkpoint's temporary directory."""
  mount = f"{MOUNT_ROOT}/{bucket}"
  return [
      f"command -v gcsfuse >/dev/null || {{ {GCSFUSE_MISSING}; }}",
      f"if ! mountpoint -q {mount}; then sudo mkdir -p {mount}; "
      f'sudo chown "$(id -u):$(id -g)" {mount}; '
      f"gcsfuse --implicit-dirs --rename-dir-limit=200000 {bucket} {mount}; fi",
  ]


def coordinator_steps() -> list[str]:
  """On a slice of more than one host, JAX_COORDINATOR_ADDRESS=<worker 0>:PORT, from the
  metadata server's worker-network-endpoints ("h0,h1,..." or "name:id:ip,...")."""
  return [
      f"eps=$(curl -sf -H Metadata-Flavor:Google {METADATA_URL}worker-network-endpoints "
      "|| true)",
      'case "$eps" in *,*) w0=${eps%%,*}; '
      f'export JAX_COORDINATOR_ADDRESS="${{w0##*:}}:{COORDINATOR_PORT}";; esac',
  ]


def fetch_steps(repo: str | None, ref: str | None) -> list[str]:
  """The code into REMOTE_REPO: a clone of `repo` at `ref`, or, without `repo`, the tarball of
  the working tree that setup copied to the home directory as REMOTE_TARBALL."""
  if repo:
    fetch = [f"rm -rf {REMOTE_REPO}", f"git clone --quiet {shlex.quote(repo)} {REMOTE_REPO}"]
    if ref:
      fetch.append(f"git -C {REMOTE_REPO} checkout --quiet {shlex.quote(ref)}")
    return fetch
  return [f"rm -rf {REMOTE_REPO}", f"mkdir -p {REMOTE_REPO}",
          f"tar -xzf $HOME/{REMOTE_TARBALL} -C {REMOTE_REPO}", f"rm $HOME/{REMOTE_TARBALL}"]


def install_steps(jax_version: str) -> list[str]:
  """The venv REMOTE_VENV with bertjax (editable) and jax[tpu]==jax_version."""
  pip = f"{REMOTE_VENV}/bin/pip"
  return [
      f'"$PY" -m venv {REMOTE_VENV}',
      f"{pip} install -q --upgrade pip",
      f"{pip} install -q -e {REMOTE_REPO} " + shlex.quote(f"jax[tpu]=={jax_version}"),
      'echo "bertjax: set up on $(hostname)"',
  ]


def run_steps(main: str, bucket: str | None) -> list[str]:
  """`main` (a shell command) started in the background with nohup, logging to REMOTE_LOG, its
  pid in REMOTE_PID; the bucket mounted first, if any."""
  return [
      not_running_step(),
      *(mount_steps(bucket) if bucket else []),
      *coordinator_steps(),
      f"cd {REMOTE_REPO}",
      f". {REMOTE_VENV}/bin/activate",
      f"setsid nohup {main} > {REMOTE_LOG} 2>&1 < /dev/null &",
      f"echo $! > {REMOTE_PID}",
      f'echo "bertjax: started on $(hostname) (pid $!); log: {REMOTE_LOG}"',
  ]


def tail_step(lines: int, follow: bool) -> str:
  """The end of REMOTE_LOG (followed with -F)."""
  return f"tail -n {lines}{' -F' if follow else ''} {REMOTE_LOG}"


def stop_steps() -> list[str]:
  """SIGTERM to the run started by `run`, if it is going on."""
  return [
      f'if [ -f {REMOTE_PID} ] && kill -TERM "$(cat {REMOTE_PID})" 2>/dev/null; '
      'then echo "bertjax: SIGTERM sent on $(hostname); it saves a checkpoint and exits"; '
      'else echo "bertjax: no run going on on $(hostname)"; fi',
  ]
