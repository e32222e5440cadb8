"""What launch/tpu.py and launch/slurm.py share: their errors, the steps they run or print, the
--config.KEY=VALUE overrides they pass on to bertjax.main, and the run of a subcommand.

A launcher is a table of subcommands, each a function from the parsed flags to the steps to run
in order: argv lists, or `WriteFile`s (a file to write, as slurm.py's sbatch script). `main`
prints them with --dry-run, one a line ready to paste, or runs them and stops at the first that
fails. Python's standard library only: the launchers run on machines without bertjax's
dependencies (a workstation with gcloud, a cluster's login node), and import this module from
their own directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from typing import Callable

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEREDOC_END = "BERTJAX_SBATCH"  # ends a WriteFile's here-document in a --dry-run


class LaunchError(Exception):
  """Bad input or a failed command: printed as one line, exit status 2 (or the command's)."""

  def __init__(self, message: str, returncode: int = 2):
    super().__init__(message)
    self.returncode = returncode


@dataclasses.dataclass(frozen=True)
class WriteFile:
  """A step that writes `text` to `path` (creating its directory).

  Attributes:
    path: absolute path of the file.
    text: its content.
  """
  path: str
  text: str

  def shell(self) -> str:
    """The step as shell lines: mkdir, then cat with a quoted here-document."""
    return (f"mkdir -p {shlex.quote(os.path.dirname(self.path))}\n"
            f"cat > {shlex.quote(self.path)} <<'{HEREDOC_END}'\n{self.text}{HEREDOC_END}")


Step = list[str] | WriteFile


def check_overrides(extra: list[str], command: str) -> list[str]:
  """The --config.KEY=VALUE arguments passed through to bertjax.main by `command`."""
  for arg in extra:
    if not arg.startswith("--config."):
      raise LaunchError(f"unrecognized argument {arg!r}; only --config.KEY=VALUE overrides "
                        f"pass through to bertjax (with `{command}`).")
    if "=" not in arg:
      raise LaunchError(f"{arg}: write overrides as --config.KEY=VALUE (one argument).")
  return extra


def make_parser(prog: str, doc: str, dry_run_help: str
                ) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction,
                           argparse.ArgumentParser]:
  """(the launcher's parser, its subcommands, the parent parser of the flags every subcommand
  takes: --dry-run). The description is the first paragraph of `doc`."""
  common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  common.add_argument("--dry-run", action="store_true", help=dry_run_help)
  parser = argparse.ArgumentParser(
      prog=prog, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
      description=doc.split("\n\n")[0], epilog="See launch/README.md for the whole flow.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  return parser, sub, common


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str],
                         passes_overrides: str) -> argparse.Namespace:
  """The flags; the arguments the parser does not know are args.overrides, which only the
  subcommand `passes_overrides` takes (checked by `check_overrides` when it builds its steps)."""
  args, extra = parser.parse_known_args(argv)
  if extra and args.command != passes_overrides:
    parser.error(f"unrecognized arguments: {' '.join(extra)}")
  args.overrides = extra
  return args


def show(step: Step) -> str:
  """A step as shell text, ready to paste."""
  return step.shell() if isinstance(step, WriteFile) else shlex.join(step)


def execute(steps: list[Step], not_on_path: Callable[[str], str]) -> None:
  """Runs the steps in order; LaunchError at the first that fails or cannot start.

  Args:
    steps: argv lists and WriteFiles.
    not_on_path: a program's name -> what to say after "PROGRAM is not on PATH" (where to get it
      or run it), before "--dry-run prints the commands without running them."
  """
  for program in dict.fromkeys(s[0] for s in steps if not isinstance(s, WriteFile)):
    if shutil.which(program) is None:
      raise LaunchError(f"{program} is not on PATH{not_on_path(program)} --dry-run prints the "
                        "commands without running them.")
  for step in steps:
    if isinstance(step, WriteFile):
      print(f"+ write {step.path}", file=sys.stderr, flush=True)
      try:
        os.makedirs(os.path.dirname(step.path), exist_ok=True)
        with open(step.path, "w", encoding="utf-8") as f:
          f.write(step.text)
      except OSError as e:
        raise LaunchError(f"cannot write {step.path}: {e.strerror}") from e
      continue
    print(f"+ {shlex.join(step)}", file=sys.stderr, flush=True)
    returncode = subprocess.run(step, check=False).returncode
    if returncode != 0:
      raise LaunchError(f"command failed (exit status {returncode}): {shlex.join(step)}",
                        returncode)


def run_command(prog: str, commands: dict[str, Callable[[argparse.Namespace], list[Step]]],
                args: argparse.Namespace, not_on_path: Callable[[str], str]) -> int:
  """Builds the steps of args.command and prints (--dry-run) or runs them; the exit status.

  A LaunchError is printed as one line "PROG: error: ..." and gives its returncode; Ctrl-C
  (e.g. the end of `logs --follow`) gives 130.
  """
  try:
    steps = commands[args.command](args)
    if args.dry_run:
      for step in steps:
        print(show(step))
    else:
      execute(steps, not_on_path)
  except LaunchError as e:
    print(f"{prog}: error: {e}", file=sys.stderr)
    return e.returncode
  except KeyboardInterrupt:  # e.g. the end of `logs --follow`
    return 130
  return 0
