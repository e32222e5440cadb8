"""Entry point: `python -m bertjax.main --config=configs/tiny.py --workdir=DIR [--config.K=V]`.

Parses the flags, holds the workdir for the run (`bertjax.workdir`: one run at a time) and hands
the config to the task it names (`bertjax.tasks.REGISTRY`). Bad input of any kind (a
`UserError`, a config file that cannot be loaded) is printed as one line and exits with status 2.
"""
import os
import sys
import traceback

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import configs, tasks, workdir
from bertjax.training import distributed
from bertjax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py); override fields with --config.KEY=VALUE.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for all outputs (vocabulary, checkpoints, metrics).")
flags.mark_flags_as_required(["config", "workdir"])
_PACKAGED_CONFIGS = os.path.dirname(configs.__file__)  # configs/ as installed: bertjax.configs


def fail(message: str) -> None:
  """Prints `message` as bertjax's one error line and exits with status 2."""
  print(f"bertjax: error: {message}", file=sys.stderr)
  sys.exit(2)


def _config_file(value: str) -> str:
  """--config's value, PATH or PATH:ARG, with a configs/NAME.py that the cwd lacks turned into
  the installed package's (bertjax.configs) NAME.py, so that commands run from any directory.
  A file found in neither place stops here with one line."""
  path, colon, arg = value.partition(":")
  packaged = os.path.join(_PACKAGED_CONFIGS, path[len("configs/"):])
  if not os.path.isfile(path) and path.startswith("configs/") and os.path.isfile(packaged):
    path, value = packaged, packaged + colon + arg
  if not os.path.isfile(path):
    names = sorted(n for n in os.listdir(_PACKAGED_CONFIGS) if n.endswith(".py") and n[0] != "_")
    fail(f"no config file {path}, neither here nor among bertjax's configs/: {' '.join(names)}.")
  try:
    with open(path, "rb"):
      pass
  except OSError as e:
    fail(f"cannot read the config file {path} ({e.strerror}); check its permissions.")
  return value


def find_config(argv: list[str]) -> list[str]:
  """argv with the value of --config=VALUE (or --config VALUE) passed through _config_file."""
  argv = list(argv)
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      argv[i] = "--config=" + _config_file(arg[len("--config="):])
    elif arg == "--config" and i + 1 < len(argv):
      argv[i + 1] = _config_file(argv[i + 1])
  return argv


def _config_path(argv: list[str]) -> str:
  """The config file that argv's --config names ('' if none)."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg[len("--config="):].partition(":")[0]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1].partition(":")[0]
  return ""


def _config_file_error(error: BaseException, path: str) -> str | None:
  """'PATH, line N: ...' when `error`, or an exception it was raised from (ml_collections and
  absl wrap a config's TypeError and ValueError), is a syntax error or came from the config
  file's own code; None otherwise."""
  path = os.path.realpath(path) if path else ""
  while error is not None:
    if isinstance(error, SyntaxError) and error.filename:
      text = f": {error.text.strip()}" if error.text and error.text.strip() else ""
      return f"{error.filename}, line {error.lineno}: {error.msg}{text}"
    lines = [line for frame, line in traceback.walk_tb(error.__traceback__)
             if path and os.path.realpath(frame.f_code.co_filename) == path]
    if lines:
      return f"{path}, line {lines[-1]}: {type(error).__name__}: {error}"
    error = error.__cause__ or error.__context__
  return None


def _config_load_message(error: Exception, path: str) -> str | None:
  """The message for a config file that does not load (a syntax error, an exception in its
  code, no get_config); None for other errors."""
  located = _config_file_error(error, path)
  if located:
    return (f"the config file does not load: {located}. Fix the file (configs/tiny.py shows the "
            "form).")
  if isinstance(error, AttributeError) and "get_config" in str(error):
    return (f"the config file {path} has no get_config(); define get_config(arg=None) returning "
            "an ml_collections.ConfigDict (configs/tiny.py shows the form).")
  if path and isinstance(error, flags.Error) and "--config must have a value" in str(error):
    return f"get_config() of {path} returned None; make it return the config."
  return None


def _flag_error_message(error: Exception, argv: list[str]) -> str | None:
  """The message for an override that names no field or a flag value that does not parse; None
  for other errors."""
  if isinstance(error, (KeyError, AttributeError)):  # ml_collections: no such field
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    detail = str(error).strip("'\"").replace("\\n", " ").replace("\n", " ").replace("\\'", "'")
    return (f"unknown config key among {', '.join(overrides)}: {detail}. "
            "The fields are listed, with comments, in bertjax/run_config/ (one schema for "
            "each kind of run).")
  if isinstance(error, flags.Error):
    return f"{error}. Check the flag's value; run with --helpfull for the flags."
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a config file that does not load, an unknown --config.KEY or a
  bad flag value turned into one clear message."""
  argv = find_config(argv)
  try:
    return flags.FLAGS(argv)
  except UserError as e:  # a config's get_config refused its argument (configs/squad.py:v3)
    fail(str(e))
  except Exception as e:  # pylint: disable=broad-except
    message = _config_load_message(e, _config_path(argv)) or _flag_error_message(e, argv)
    if message is None:
      raise
    fail(message)


def parsed_config(argv: list[str]) -> ml_collections.ConfigDict:
  """The config that --config and its --config.KEY overrides made, once parse_flags has run;
  stops with one line on stray arguments or a get_config() that returned something else."""
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]}; flags are written --name=value.")
  config = _CONFIG.value
  if not isinstance(config, ml_collections.ConfigDict):
    fail(f"get_config() of {config_flags.get_config_filename(flags.FLAGS['config'])} returned "
         f"{type(config).__name__}, not an ml_collections.ConfigDict; return the config.")
  return config


def run_task(config: ml_collections.ConfigDict, directory: str):
  """Runs the config's task in `directory`, held for the run (`bertjax.workdir`: one run at a
  time); returns what the task returns. Call `distributed.maybe_initialize_distributed` first.

  Raises:
    UserError: bad input of any kind.
  """
  with workdir.held(directory):  # before any work: one run at a time on a workdir
    return tasks.run(config, directory)


def main(argv: list[str]) -> None:
  config = parsed_config(argv)
  directory = os.path.abspath(os.path.expanduser(_WORKDIR.value))
  try:
    distributed.maybe_initialize_distributed()
    run_task(config, directory)
  except UserError as e:
    fail(str(e))


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main, flags_parser=parse_flags)
