#!/usr/bin/env python3
"""Multi-node GPU training with SLURM for bertjax: submit a job, read its log, stop it.

  python launch/slurm.py submit --nodes=2 --gpus-per-node=8 --cpus-per-task=32 \\
      --partition=gpu --account=A --time=24:00:00 --venv=/shared/bertjax-venv \\
      --config=configs/base.py --workdir=/shared/runs/bert_base --config.train.batch_size=256 ...
  python launch/slurm.py logs --workdir=/shared/runs/bert_base --job=12345 [--follow]
  python launch/slurm.py stop --job=12345

Every subcommand takes --dry-run: it prints what it would do, shell-quoted and ready to paste,
and does nothing. `submit` writes the sbatch script to WORKDIR/JOB_NAME.sbatch and runs
`sbatch` on it (its dry run prints the script as a here-document); `logs` runs `tail` on the
job's log, WORKDIR/slurm-JOBID.out; `stop` runs `scancel`. Run it on the cluster's login node,
where sbatch and scancel are; Python's standard library only (copy this file with its
launch/common.py, side by side, if you like).

The job:
  * One process per node (`--ntasks-per-node=1`), driving all of the node's GPUs
    (`--gpus-per-node`): the usual layout of JAX on GPUs, one process per host with every GPU of
    the host a local device. `srun` starts `python -m bertjax.main --config=... --workdir=...`
    plus the --config.KEY=VALUE overrides given, once on every node, in --repo-dir (default:
    this checkout), after --setup's shell lines and the activation of --venv. Without --venv or
    --setup the job runs the `python` of the environment sbatch was called from (sbatch passes
    its environment on). srun's --kill-on-bad-exit=1 ends every process when one fails, instead
    of leaving the others waiting in a collective.
  * bertjax joins the processes itself:
    `bertjax.training.distributed.maybe_initialize_distributed()` calls
    `jax.distributed.initialize()` in a SLURM step of more than one task, and jax reads the job
    from the variables srun sets (jax/_src/clusters/slurm_cluster.py): SLURM_NTASKS processes
    (one a node), this one SLURM_PROCID, the coordinator on the first node of
    SLURM_STEP_NODELIST, port 61440 + SLURM_JOB_ID % 4096 (JAX_COORDINATOR_PORT overrides it).
    jax would also give each process only the GPU numbered SLURM_LOCALID, its layout of one
    process per GPU: with one process per node that is GPU 0 alone, so the script exports
    JAX_LOCAL_DEVICE_IDS=0,...,G-1 (G = --gpus-per-node), which jax.distributed.initialize()
    takes instead, and each process drives all G GPUs of its node.
  * The workdir must be on a file system that every node shares (NFS, Lustre, GPFS, ...), at the
    same path: every process writes its shards of each checkpoint there. So must the code
    (--repo-dir), the venv and the data; a node's local disk or /tmp does not work. `submit`
    creates the workdir (from the login node, which sees the same file system) because Slurm
    opens the log there before the script starts. Prepare the text once with
    python -m bertjax.data.prepare and pass --config.data.prepared=DIR (else host 0
    prepares WORKDIR/data while the others wait).
  * Batch sizes must be divisible by nodes x GPUs (each GPU is one JAX device).

Stopping, time limits, preemption:
  * `stop` runs `scancel --signal=TERM JOBID`: Slurm sends SIGTERM to every task of the job's
    steps, i.e. the bertjax process on every node, and not to the batch script. bertjax saves a
    checkpoint on all hosts at the same step and exits 0, srun ends with 0, and so does the job;
    `submit` with the same --workdir resumes from the checkpoint. (Not `scancel --full`: that
    also signals srun, which turns a SIGTERM of its own into SIGKILL of its tasks; not
    `--batch`: that signals the batch script alone.)
  * Time limit (--time): `#SBATCH --signal=B:USR1@S` (S = --signal-before, default 120) warns
    the batch script S seconds before the limit (Slurm may send it up to a minute early). Its
    trap does what `stop` does; once srun has ended with 0 it runs `scontrol requeue`: the job
    (same ID, same log, --open-mode=append) waits in the queue again and resumes from that
    checkpoint, until training ends. Give S enough time for a checkpoint on your file system.
  * Preemption or a node failure: `#SBATCH --requeue` puts the job back in the queue. Slurm
    sends SIGTERM to every process and SIGKILL after the cluster's GraceTime, so the run resumes
    from the checkpoint bertjax saved on SIGTERM if the grace time sufficed, else from the last
    periodic one (config.train.checkpoint_every_steps).
  * --no-requeue: neither requeue; at the time limit the run saves a checkpoint and the job ends.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

# launch/ is the script's directory, first on sys.path: its sibling module, by its name.
from common import (HEREDOC_END, REPO_ROOT, LaunchError, Step, WriteFile, check_overrides,
                    make_parser, parse_with_overrides, run_command)

PROG = "slurm.py"
MAX_SIGNAL_TIME = 65535  # the most seconds sbatch's --signal=...@TIME takes


# ----------------------------------------------------------------------------------------------
# Values.


def gpu_count(gpus_per_node: str) -> int:
  """The number of GPUs in a --gpus-per-node value: 8, or TYPE:8 (e.g. h100:8)."""
  match = re.fullmatch(r"(?:[A-Za-z0-9_.-]+:)?([1-9][0-9]*)", gpus_per_node)
  if not match:
    raise LaunchError(f"--gpus-per-node={gpus_per_node} is not a GPU count: write N or TYPE:N, "
                      "e.g. 8 or h100:8.")
  return int(match.group(1))


def slurm_seconds(time: str) -> int:
  """Seconds in a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
  match = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", time)
  if not match:
    raise LaunchError(f"--time={time} is not a Slurm time limit: write MINUTES, HH:MM:SS or "
                      "DAYS-HH:MM:SS, e.g. 24:00:00 or 2-00:00:00.")
  days, first, second, third = match.groups()
  if days is not None:  # D-H, D-H:M, D-H:M:S
    hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
  elif third is not None:  # H:M:S
    hours, minutes, seconds = int(first), int(second), int(third)
  else:  # M, M:S
    hours, minutes, seconds = 0, int(first), int(second or 0)
  return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def check_job(job: str) -> str:
  """A Slurm job ID, e.g. 12345 (or 12345_7 in an array)."""
  if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
    raise LaunchError(f"--job={job} is not a Slurm job ID (the number sbatch printed: "
                      "\"Submitted batch job 12345\").")
  return job


def check_directive(flag: str, value: str) -> str:
  """A value that goes into an #SBATCH line, which has no quoting: no whitespace."""
  if not value or re.search(r"\s", value):
    raise LaunchError(f"{flag}={value!r}: no spaces or line breaks, it goes into an #SBATCH "
                      "line.")
  return value


def full_path(path: str) -> str:
  return os.path.abspath(os.path.expanduser(path))


def log_path(workdir: str, job: str) -> str:
  """The job's log: stdout and stderr of the script and of every process."""
  return os.path.join(full_path(workdir), f"slurm-{job}.out")


# ----------------------------------------------------------------------------------------------
# The sbatch script.


def _directives(args: argparse.Namespace, workdir: str) -> list[str]:
  """The #SBATCH lines."""
  options = [f"--job-name={args.job_name}", f"--nodes={args.nodes}", "--ntasks-per-node=1",
             f"--gpus-per-node={args.gpus_per_node}"]
  if args.cpus_per_task:
    options.append(f"--cpus-per-task={args.cpus_per_task}")
  if args.partition:
    options.append(f"--partition={check_directive('--partition', args.partition)}")
  if args.account:
    options.append(f"--account={check_directive('--account', args.account)}")
  if args.time:
    options.append(f"--time={args.time}")
  options += [f"--output={check_directive('--workdir', workdir)}/slurm-%j.out",
              "--open-mode=append",
              "--no-requeue" if args.no_requeue else "--requeue",
              f"--signal=B:USR1@{args.signal_before}"]
  for option in args.sbatch:
    if not option.startswith("-"):
      raise LaunchError(f"--sbatch={option}: give an sbatch option, e.g. --sbatch=--mem=0.")
    options.append(check_directive("--sbatch", option))
  return [f"#SBATCH {option}" for option in options]


def _main_command(args: argparse.Namespace, workdir: str, overrides: list[str]) -> str:
  """srun starting bertjax.main once on every node, in the background (see the wait below)."""
  srun = ["srun", f"--nodes={args.nodes}", "--ntasks-per-node=1",
          f"--gpus-per-node={args.gpus_per_node}"]
  if args.cpus_per_task:  # srun does not take it from the allocation on every Slurm version
    srun.append(f"--cpus-per-task={args.cpus_per_task}")
  srun.append("--kill-on-bad-exit=1")
  main = ["python", "-m", "bertjax.main", f"--config={args.config}", f"--workdir={workdir}",
          *overrides]
  return shlex.join(srun + main) + " &"


def sbatch_script(args: argparse.Namespace) -> str:
  """The batch script: #SBATCH options, environment, srun of bertjax.main, time-limit trap."""
  overrides = check_overrides(args.overrides, "submit")
  workdir = full_path(args.workdir)
  repo_dir = full_path(args.repo_dir)
  config_file = args.config.partition(":")[0]
  # configs/NAME.py is the package's bertjax/configs/NAME.py where the checkout has no configs/
  # of its own (as bertjax.main finds it).
  packaged = config_file.startswith("configs/") and os.path.isfile(
      os.path.join(repo_dir, "bertjax", config_file))
  if not os.path.isfile(os.path.join(repo_dir, config_file)) and not packaged:
    raise LaunchError(f"--config={args.config}: no file {config_file} in {repo_dir} (the "
                      "checkout the job runs in, --repo-dir).")
  gpus = gpu_count(args.gpus_per_node)
  if args.time and args.signal_before >= slurm_seconds(args.time):
    raise LaunchError(f"--signal-before={args.signal_before} seconds is not less than "
                      f"--time={args.time}.")
  environment = [*args.setup]
  if args.venv:
    environment.append(f". {shlex.quote(os.path.join(full_path(args.venv), 'bin', 'activate'))}")
  lines = [
      "#!/bin/bash",
      f"# bertjax on {args.nodes} node(s) x {gpus} GPU(s), written by launch/slurm.py; "
      "submit it with sbatch.",
      *_directives(args, workdir),
      "",
      f"cd {shlex.quote(repo_dir)} || exit 1",
      *environment,
      f"# One process a node drives all {gpus} GPU(s) of it: without this,",
      "# jax.distributed.initialize() would give it GPU number $SLURM_LOCALID (0) alone.",
      f"export JAX_LOCAL_DEVICE_IDS={','.join(str(i) for i in range(gpus))}",
      'echo "bertjax: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on '
      '$SLURM_JOB_NODELIST"',
      "",
      f"# USR1 (--signal above) comes {args.signal_before} s before the time limit: SIGTERM to "
      "every task,",
      "# which saves a checkpoint at the same step on all nodes and exits 0"
      + ("." if args.no_requeue else "; then requeue."),
      "time_limit=0",
      "on_time_limit() {",
      "  time_limit=1; trapped=1",
      '  echo "bertjax: the time limit is near: SIGTERM to every task (a checkpoint)" >&2',
      '  scancel --signal=TERM "$SLURM_JOB_ID"',
      "}",
      "trap on_time_limit USR1",
      "",
      _main_command(args, workdir, overrides),
      "step=$!",
      "# A trap ends wait early (status > 128): then wait again, for srun's own exit status.",
      "while :; do",
      '  trapped=0; status=0; wait "$step" || status=$?',
      '  if [ "$trapped" = 0 ] || [ "$status" -le 128 ]; then break; fi',
      "done",
  ]
  if not args.no_requeue:
    lines += [
        'if [ "$time_limit" = 1 ] && [ "$status" = 0 ]; then',
        '  echo "bertjax: checkpoint saved; requeueing job $SLURM_JOB_ID to go on" >&2',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
    ]
  lines.append('exit "$status"')
  if HEREDOC_END in lines:
    raise LaunchError(f"--setup: a line may not be {HEREDOC_END}.")
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Commands. Each function returns the steps to run, in order.


def submit_commands(args: argparse.Namespace) -> list[Step]:
  if not re.fullmatch(r"[A-Za-z0-9._-]+", args.job_name):
    raise LaunchError(f"--job-name={args.job_name}: letters, digits, '.', '_' and '-' only.")
  if args.nodes < 1:
    raise LaunchError(f"--nodes={args.nodes}: at least 1.")
  if args.cpus_per_task is not None and args.cpus_per_task < 1:
    raise LaunchError(f"--cpus-per-task={args.cpus_per_task}: at least 1.")
  if not 0 < args.signal_before <= MAX_SIGNAL_TIME:
    raise LaunchError(f"--signal-before={args.signal_before}: between 1 and {MAX_SIGNAL_TIME} "
                      "seconds.")
  script = WriteFile(os.path.join(full_path(args.workdir), f"{args.job_name}.sbatch"),
                     sbatch_script(args))
  return [script, ["sbatch", script.path]]


def logs_commands(args: argparse.Namespace) -> list[Step]:
  tail = ["tail", "-n", str(args.lines)] + (["-F"] if args.follow else [])
  return [tail + [log_path(args.workdir, check_job(args.job))]]


def stop_commands(args: argparse.Namespace) -> list[Step]:
  return [["scancel", "--signal=TERM", check_job(args.job)]]


COMMANDS = {"submit": submit_commands, "logs": logs_commands, "stop": stop_commands}


# ----------------------------------------------------------------------------------------------
# Flags and execution.


def build_parser() -> argparse.ArgumentParser:
  parser, sub, common = make_parser(PROG, __doc__,
                                    "print what it would run, ready to paste, and run nothing")

  p = sub.add_parser("submit", parents=[common], allow_abbrev=False,
                     help="write the sbatch script and submit it (extra --config.KEY=VALUE "
                          "pass on)")
  p.add_argument("--config", required=True,
                 help="config file in the repo, e.g. configs/base.py")
  p.add_argument("--workdir", required=True,
                 help="workdir on the shared file system (checkpoints, metrics, the log)")
  p.add_argument("--nodes", type=int, default=1, help="nodes, one process each (default: 1)")
  p.add_argument("--gpus-per-node", required=True,
                 help="GPUs each process drives: N or TYPE:N, e.g. 8 or h100:8")
  p.add_argument("--cpus-per-task", type=int, default=None,
                 help="CPU cores of each process (Slurm's default may be 1; give the node's)")
  p.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's)")
  p.add_argument("--account", default=None, help="account to charge (default: yours)")
  p.add_argument("--time", default=None,
                 help="time limit, e.g. 24:00:00 or 2-00:00:00 (default: the partition's)")
  p.add_argument("--job-name", default="bertjax", help="job name (default: bertjax)")
  p.add_argument("--repo-dir", default=REPO_ROOT,
                 help="the bertjax checkout the job runs in, on the shared file system "
                      "(default: this one)")
  p.add_argument("--venv", default=None,
                 help="virtual environment with bertjax and jax[cuda12] to activate")
  p.add_argument("--setup", action="append", default=[],
                 help="a shell line to run first, e.g. 'module load cuda' (repeatable)")
  p.add_argument("--signal-before", type=int, default=120,
                 help="seconds before the time limit at which the run checkpoints "
                      "(default: 120)")
  p.add_argument("--no-requeue", action="store_true",
                 help="no requeue on preemption or after the time-limit checkpoint")
  p.add_argument("--sbatch", action="append", default=[],
                 help="another sbatch option, e.g. --sbatch=--mem=0 (repeatable)")

  p = sub.add_parser("logs", parents=[common], allow_abbrev=False,
                     help="show the end of the job's log")
  p.add_argument("--job", required=True, help="the job ID")
  p.add_argument("--workdir", required=True, help="the job's --workdir")
  p.add_argument("--lines", type=int, default=50, help="lines to show (default: 50)")
  p.add_argument("--follow", action="store_true", help="keep following it (Ctrl-C ends)")

  p = sub.add_parser("stop", parents=[common], allow_abbrev=False,
                     help="SIGTERM every process of the job (they checkpoint and exit)")
  p.add_argument("--job", required=True, help="the job ID")
  return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
  return parse_with_overrides(build_parser(), argv, "submit")


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  return run_command(PROG, COMMANDS, args, lambda program: "; run this on the cluster's login "
                     "node.")


if __name__ == "__main__":
  sys.exit(main())
