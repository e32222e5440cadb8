"""Entry point: `python -m bertjax.main --config=configs/tiny.py --workdir=DIR [--config.K=V]`.

Parses the flags and hands the config to the task it names (`bertjax.tasks.REGISTRY`). Bad
input of any kind (a `UserError`) is printed as one line and exits with status 2.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import configs, parallel, tasks
from bertjax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py); override fields with --config.KEY=VALUE.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for all outputs (vocabulary, checkpoints, metrics).")
flags.mark_flags_as_required(["config", "workdir"])
_PACKAGED_CONFIGS = os.path.dirname(configs.__file__)  # configs/ as installed: bertjax.configs


def _fail(message: str) -> None:
  print(f"bertjax: error: {message}", file=sys.stderr)
  sys.exit(2)


def _config_file(value: str) -> str:
  """--config's value, PATH or PATH:ARG, with a configs/NAME.py that the cwd lacks turned into
  the installed package's (bertjax.configs) NAME.py, so that commands run from any directory.
  A file found in neither place stops here with one line."""
  path, colon, arg = value.partition(":")
  if os.path.isfile(path):
    return value
  packaged = os.path.join(_PACKAGED_CONFIGS, path[len("configs/"):])
  if path.startswith("configs/") and os.path.isfile(packaged):
    return packaged + colon + arg
  names = sorted(n for n in os.listdir(_PACKAGED_CONFIGS) if n.endswith(".py") and n[0] != "_")
  _fail(f"no config file {path}, neither here nor among bertjax's configs/: {' '.join(names)}.")


def _find_config(argv: list[str]) -> list[str]:
  """argv with the value of --config=VALUE (or --config VALUE) passed through _config_file."""
  argv = list(argv)
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      argv[i] = "--config=" + _config_file(arg[len("--config="):])
    elif arg == "--config" and i + 1 < len(argv):
      argv[i + 1] = _config_file(argv[i + 1])
  return argv


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with an unknown --config.KEY turned into one clear message."""
  try:
    return flags.FLAGS(_find_config(argv))
  except (KeyError, AttributeError) as e:  # ml_collections: an override names no existing field
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    detail = str(e).strip("'\"").replace("\\n", " ").replace("\n", " ").replace("\\'", "'")
    _fail(f"unknown config key among {', '.join(overrides)}: {detail}. "
          "The fields are listed, with comments, in configs/tiny.py (pretraining) and "
          "configs/finetuning.py (fine-tuning).")
  except flags.Error as e:
    _fail(f"{e}. Check the flag's value; run with --helpfull for the flags.")
  except UserError as e:  # a config's get_config refused its argument (configs/squad.py:v3)
    _fail(str(e))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; flags are written --name=value.")
  config = _CONFIG.value
  try:
    parallel.maybe_initialize_distributed()
    tasks.run(config, os.path.abspath(os.path.expanduser(_WORKDIR.value)))
  except UserError as e:
    _fail(str(e))


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main, flags_parser=_parse_flags)
