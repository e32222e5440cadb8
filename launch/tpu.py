#!/usr/bin/env python3
"""Cloud TPU VMs for bertjax: create, set up on every worker, run, read logs, stop, delete.

  python launch/tpu.py create --name=bert --zone=us-central2-b --project=P --accelerator-type=v4-8
  python launch/tpu.py queue  --name=bert --zone=us-central2-b --project=P \\
      --accelerator-type=v4-32 [--spot | --reserved] [--valid-until-duration=6h]  # or wait for it
  python launch/tpu.py queue-status --name=bert --zone=us-central2-b --project=P
  python launch/tpu.py setup  --name=bert --zone=us-central2-b --project=P [--repo=URL --ref=REF]
  python launch/tpu.py run    --name=bert --zone=us-central2-b --project=P --bucket=B \\
      --config=configs/base.py --workdir=runs/bert_base --config.train.batch_size=256 ...
  python launch/tpu.py logs   --name=bert --zone=us-central2-b --project=P [--follow]
  python launch/tpu.py stop   --name=bert --zone=us-central2-b --project=P
  python launch/tpu.py delete --name=bert --zone=us-central2-b --project=P
  python launch/tpu.py queue-delete --name=bert --zone=us-central2-b --project=P  # after `queue`

Every subcommand takes --dry-run: it prints the commands it would run, one a line (shell-quoted,
ready to paste), and runs nothing. Otherwise it runs them in order with the Google Cloud CLI
(`gcloud`, which must be on PATH and logged in) and stops at the first that fails. --project,
--zone and --name default to $CLOUDSDK_CORE_PROJECT, $CLOUDSDK_COMPUTE_ZONE and $TPU_NAME.

Capacity: `create` makes the TPU VM now or fails (e.g. when the zone has no free v4-32).
`queue` asks for it through a queued resource instead (`gcloud compute tpus queued-resources
create QR --node-id=NAME ...`, QR being --queued-resource, by default the same as --name): the
request waits in Cloud TPU's queue (WAITING_FOR_RESOURCES, then PROVISIONING) until the capacity
is free, and then creates the TPU VM NAME (ACTIVE), with which setup, run, logs and stop work as
after `create`. --spot asks for Spot capacity, --reserved for your project's reservation;
--valid-until-duration=6h gives up if it is not provisioned by then. `queue-status` shows the
request and its state (`queued-resources describe`); `queue-delete` deletes the request and,
with it, its TPU VM (`queued-resources delete --force`): use it rather than `delete` for a TPU
that `queue` made.

What happens on the workers:
  setup  on every worker (`gcloud ... ssh --worker=all`), unless a run is going on there:
         installs Python >= 3.11 (the image's python3 if new enough, else Ubuntu's python3.11)
         and git; puts the code in ~/bertjax (a clone of --repo at --ref, or, without --repo,
         this working tree sent as a tarball with `gcloud ... scp --worker=all`); makes the
         venv ~/bertjax-venv and runs `pip install -e ~/bertjax "jax[tpu]==<the jax that
         setup.py pins>"` (jax's tpu extra pins its libtpu, which pip takes from the package
         index like any other package, so no extra find-links page is needed).
  run    the same command on every worker: `python -m bertjax.main --config=... --workdir=...`
         plus the --config.KEY=VALUE overrides given, started with nohup in the background
         (ssh can disconnect); each worker logs to its own ~/bertjax-run.log and keeps the pid in
         ~/bertjax-run.pid. A second run while one is going on fails on that worker.
  stop   sends SIGTERM on every worker; bertjax saves a checkpoint and exits 0 (as on a Cloud
         TPU preemption), and `run` with the same workdir resumes from it.

Multi-host (pod slices, e.g. v4-32: 4 hosts of 4 chips, v5litepod-16: 2 hosts of 8 chips):
  * Every worker runs the same program. bertjax calls `jax.distributed.initialize()` when
    TPU_WORKER_HOSTNAMES (set by GKE) or JAX_COORDINATOR_ADDRESS is in the environment
    (bertjax/training/distributed.py, maybe_initialize_distributed). A TPU VM made by
    `gcloud ... create` sets neither, so `run` reads the workers from the metadata server and,
    on a slice of more than one host, exports JAX_COORDINATOR_ADDRESS=<worker 0>:8482; jax then
    takes the process count and this worker's index from the metadata server. (Without it, libtpu would still
    join the hosts, but orbax's checkpoints need the jax.distributed client.) On one host
    (v4-8) nothing is exported.
  * Each host reads only its shard of every global batch, so the text (or static examples) must
    be readable at the same path on every worker, and the workdir (checkpoints written by all
    hosts) must be shared: use --bucket. bertjax reads and writes local paths only (orbax
    checkpoints through a file system), so a Cloud Storage bucket is mounted with gcsfuse on
    every worker at /mnt/BUCKET, and --workdir is a path inside it. A gs:// workdir is refused.
  * Prepare the text once (python -m bertjax.data.prepare --output_dir=/mnt/BUCKET/data) and
    pass --config.data.prepared=/mnt/BUCKET/data; else host 0 prepares WORKDIR/data while the
    other hosts wait.
  * The worker's service account needs read/write access to the bucket.

The shell steps run on the workers are in launch/tpu_worker.py; what tpu.py shares with
slurm.py (errors, --dry-run, running the commands) in launch/common.py.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile

# launch/ is the script's directory, first on sys.path: its sibling modules, by their names.
import tpu_worker as worker
from common import (REPO_ROOT, LaunchError, check_overrides, make_parser, parse_with_overrides,
                    run_command)

PROG = "tpu.py"

# TPU software version (runtime image) for JAX by TPU generation, as the Cloud TPU docs list them
# ("TPU software versions": v6e, v5p, v5e; v4 and older share the Ubuntu 22.04 base image).
RUNTIME_VERSIONS = {
    "v6e": "v2-alpha-tpuv6e",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v4": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v2": "tpu-ubuntu2204-base",
}

# Left out of the tarball of the working tree: version control, build outputs, and the local
# environments (the venv, `.tpu-venv` of `--compile_for=tpu:...`, the GPU machine's `.gpu` wheels).
TAR_EXCLUDES = (".git", ".venv", ".tpu-venv", ".gpu", "__pycache__", "*.egg-info", ".pytest_cache",
                "build", "dist")


# ----------------------------------------------------------------------------------------------
# Values.


def pinned_jax_version(setup_py: str = os.path.join(REPO_ROOT, "setup.py")) -> str:
  """The version of jax that setup.py pins ("jax==X")."""
  with open(setup_py, encoding="utf-8") as f:
    match = re.search(r"""["']jax==([0-9][0-9a-z.]*)["']""", f.read())
  if not match:
    raise LaunchError(f"no jax==VERSION pin in {setup_py}; it is where the jax[tpu] version "
                      "installed on the workers comes from.")
  return match.group(1)


def runtime_version(accelerator_type: str) -> str:
  """The TPU software version for an accelerator type such as v4-8, v5litepod-16, v6e-8."""
  match = re.fullmatch(r"(v[0-9]+[a-z]*)-([0-9]+)", accelerator_type)
  if not match:
    raise LaunchError(f"--accelerator-type={accelerator_type} is not of the form GENERATION-SIZE "
                      "(e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8).")
  generation = match.group(1)
  if generation not in RUNTIME_VERSIONS:
    raise LaunchError(f"no default TPU software version for {generation}; pass --version "
                      f"(known: {', '.join(f'{g}: {v}' for g, v in RUNTIME_VERSIONS.items())}).")
  return RUNTIME_VERSIONS[generation]


def bucket_name(bucket: str) -> str:
  """A Cloud Storage bucket name, without gs:// (which is accepted)."""
  name = bucket[len("gs://"):] if bucket.startswith("gs://") else bucket
  name = name.rstrip("/")
  if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", name):
    raise LaunchError(f"--bucket={bucket} is not a bucket name (lowercase letters, digits, "
                      "'-', '_', '.'); give the bucket alone, e.g. --bucket=my-bucket, and the "
                      "path inside it with --workdir.")
  return name


def resolve_workdir(workdir: str, bucket: str | None) -> str:
  """The workdir as the workers see it: inside the mounted bucket with --bucket."""
  if workdir.startswith("gs://"):
    raise LaunchError(f"--workdir={workdir}: bertjax writes its workdir through local paths; "
                      "mount the bucket instead: --bucket=BUCKET --workdir=PATH_IN_BUCKET.")
  if bucket is None:
    return workdir
  if os.path.isabs(workdir):
    raise LaunchError(f"--workdir={workdir} with --bucket is a path inside the bucket, relative "
                      f"(e.g. runs/bert_base, which the workers see as "
                      f"{worker.MOUNT_ROOT}/{bucket}/runs/bert_base).")
  return f"{worker.MOUNT_ROOT}/{bucket}/{workdir}".rstrip("/")


# ----------------------------------------------------------------------------------------------
# Commands. Each function returns the argv lists to run, in order.


def _tpu_vm(verb: str, args: argparse.Namespace) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, args.name,
          f"--project={args.project}", f"--zone={args.zone}"]


def _ssh_all(args: argparse.Namespace, steps: list[str]) -> list[str]:
  """One ssh running the shell `steps` on every worker of the TPU VM."""
  return _tpu_vm("ssh", args) + ["--worker=all", f"--command={worker.shell_line(steps)}"]


def _queued_resource(verb: str, args: argparse.Namespace) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", verb,
          args.queued_resource or args.name, f"--project={args.project}", f"--zone={args.zone}"]


def check_duration(duration: str) -> str:
  """A gcloud duration such as 6h, 2d, 1h30m (or ISO 8601: P1DT6H)."""
  if not re.fullmatch(r"([0-9]+[smhd])+|P[0-9.DWMYTHS]+", duration):
    raise LaunchError(f"--valid-until-duration={duration} is not a duration; write it as "
                      "e.g. 6h, 2d, 1h30m.")
  return duration


def create_commands(args: argparse.Namespace) -> list[list[str]]:
  version = args.version or runtime_version(args.accelerator_type)
  cmd = _tpu_vm("create", args) + [f"--accelerator-type={args.accelerator_type}",
                                   f"--version={version}"]
  if args.spot:
    cmd.append("--spot")
  return [cmd]


def queue_commands(args: argparse.Namespace) -> list[list[str]]:
  version = args.version or runtime_version(args.accelerator_type)
  cmd = _queued_resource("create", args) + [
      f"--node-id={args.name}", f"--accelerator-type={args.accelerator_type}",
      f"--runtime-version={version}"]
  if args.spot:
    cmd.append("--spot")
  if args.reserved:
    cmd.append("--reserved")
  if args.valid_until_duration:
    cmd.append(f"--valid-until-duration={check_duration(args.valid_until_duration)}")
  return [cmd]


def queue_status_commands(args: argparse.Namespace) -> list[list[str]]:
  return [_queued_resource("describe", args)]


def queue_delete_commands(args: argparse.Namespace) -> list[list[str]]:
  return [_queued_resource("delete", args) + ["--force"] + (["--quiet"] if args.yes else [])]


def setup_commands(args: argparse.Namespace) -> list[list[str]]:
  jax_version = pinned_jax_version()
  commands = []
  if not args.repo:
    if args.ref:
      raise LaunchError("--ref needs --repo (without --repo, this working tree is copied).")
    tarball = os.path.join(tempfile.gettempdir(), f"bertjax-{args.name}.tar.gz")
    commands.append(["tar", "-czf", tarball, *[f"--exclude={p}" for p in TAR_EXCLUDES],
                     "-C", REPO_ROOT, "."])
    commands.append(["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball,
                     f"{args.name}:{worker.REMOTE_TARBALL}", f"--project={args.project}",
                     f"--zone={args.zone}", "--worker=all"])
  commands.append(_ssh_all(args, [worker.not_running_step(), *worker.python_steps(),
                                  *worker.fetch_steps(args.repo, args.ref),
                                  *worker.install_steps(jax_version)]))
  return commands


def run_commands(args: argparse.Namespace) -> list[list[str]]:
  overrides = check_overrides(args.overrides, "run")
  bucket = bucket_name(args.bucket) if args.bucket else None
  workdir = resolve_workdir(args.workdir, bucket)
  main = shlex.join(["python", "-m", "bertjax.main", f"--config={args.config}",
                     f"--workdir={workdir}", *overrides])
  return [_ssh_all(args, worker.run_steps(main, bucket))]


def logs_commands(args: argparse.Namespace) -> list[list[str]]:
  tail = worker.tail_step(args.lines, args.follow)
  return [_tpu_vm("ssh", args) + [f"--worker={args.worker}", f"--command={tail}"]]


def stop_commands(args: argparse.Namespace) -> list[list[str]]:
  return [_ssh_all(args, worker.stop_steps())]


def delete_commands(args: argparse.Namespace) -> list[list[str]]:
  return [_tpu_vm("delete", args) + (["--quiet"] if args.yes else [])]


COMMANDS = {"create": create_commands, "setup": setup_commands, "run": run_commands,
            "logs": logs_commands, "stop": stop_commands, "delete": delete_commands,
            "queue": queue_commands, "queue-status": queue_status_commands,
            "queue-delete": queue_delete_commands}


# ----------------------------------------------------------------------------------------------
# Flags and execution.


def build_parser() -> argparse.ArgumentParser:
  parser, sub, common = make_parser(PROG, __doc__,
                                    "print the commands, one a line, and run nothing")
  common.add_argument("--project", default=os.environ.get("CLOUDSDK_CORE_PROJECT"),
                      help="Google Cloud project (default: $CLOUDSDK_CORE_PROJECT)")
  common.add_argument("--zone", default=os.environ.get("CLOUDSDK_COMPUTE_ZONE"),
                      help="zone of the TPU, e.g. us-central2-b (default: $CLOUDSDK_COMPUTE_ZONE)")
  common.add_argument("--name", default=os.environ.get("TPU_NAME"),
                      help="name of the TPU VM (default: $TPU_NAME)")

  accelerator = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  accelerator.add_argument(
      "--accelerator-type", required=True,
      help="e.g. v4-8 (one host), v4-32 (4 hosts), v5litepod-16, v5p-8, v6e-8")
  accelerator.add_argument(
      "--version", default=None,
      help="TPU software version (default: by generation, "
           + ", ".join(f"{g}: {v}" for g, v in RUNTIME_VERSIONS.items()) + ")")
  queued = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  queued.add_argument("--queued-resource", default=None,
                      help="ID of the queued resource (default: --name)")

  p = sub.add_parser("create", parents=[common, accelerator], allow_abbrev=False,
                     help="create a TPU VM or pod slice")
  p.add_argument("--spot", action="store_true", help="a Spot TPU (cheaper, preemptible)")

  p = sub.add_parser("queue", parents=[common, accelerator, queued], allow_abbrev=False,
                     help="ask for a TPU VM or pod slice through a queued resource")
  kind = p.add_mutually_exclusive_group()
  kind.add_argument("--spot", action="store_true", help="Spot capacity (cheaper, preemptible)")
  kind.add_argument("--reserved", action="store_true",
                    help="capacity from the project's reservation")
  p.add_argument("--valid-until-duration", default=None,
                 help="give up unless provisioned within this long, e.g. 6h, 2d")

  sub.add_parser("queue-status", parents=[common, queued], allow_abbrev=False,
                 help="show the queued resource and its state")

  p = sub.add_parser("queue-delete", parents=[common, queued], allow_abbrev=False,
                     help="delete the queued resource and its TPU VM")
  p.add_argument("--yes", action="store_true", help="do not ask for confirmation")

  p = sub.add_parser("setup", parents=[common], allow_abbrev=False,
                     help="install bertjax and jax[tpu] on all workers")
  p.add_argument("--repo", default=None,
                 help="git URL to clone on the workers (default: copy this working tree)")
  p.add_argument("--ref", default=None, help="branch, tag or commit of --repo to check out")

  p = sub.add_parser("run", parents=[common], allow_abbrev=False,
                     help="start bertjax.main on all workers (extra --config.KEY=VALUE pass on)")
  p.add_argument("--config", required=True, help="config file in the repo, e.g. configs/base.py")
  p.add_argument("--workdir", required=True,
                 help="workdir on the workers; with --bucket, a path inside the bucket")
  p.add_argument("--bucket", default=None,
                 help=f"Cloud Storage bucket mounted with gcsfuse at {worker.MOUNT_ROOT}/BUCKET on "
                      "every worker; the workdir goes there")

  p = sub.add_parser("logs", parents=[common], allow_abbrev=False,
                     help="show the end of a worker's log")
  p.add_argument("--worker", default="0", help="which worker's log (default: 0)")
  p.add_argument("--lines", type=int, default=50, help="lines to show (default: 50)")
  p.add_argument("--follow", action="store_true", help="keep following it (Ctrl-C ends)")

  sub.add_parser("stop", parents=[common], allow_abbrev=False,
                 help="SIGTERM the run on all workers (it checkpoints and exits)")

  p = sub.add_parser("delete", parents=[common], allow_abbrev=False,
                     help="delete the TPU VM (one that `queue` made: queue-delete)")
  p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
  return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
  parser = build_parser()
  args = parse_with_overrides(parser, argv, "run")
  for flag, env in (("project", "CLOUDSDK_CORE_PROJECT"), ("zone", "CLOUDSDK_COMPUTE_ZONE"),
                    ("name", "TPU_NAME")):
    if not getattr(args, flag):
      parser.error(f"--{flag} is required (or set ${env})")
  return args


def _not_on_path(program: str) -> str:
  """Where to get a program the commands need (gcloud)."""
  return (". Install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run "
          "`gcloud auth login`." if program == "gcloud" else ".")


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  return run_command(PROG, COMMANDS, args, _not_on_path)


if __name__ == "__main__":
  sys.exit(main())
