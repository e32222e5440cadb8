"""Entry point: `python -m bertjax.main --config=configs/tiny.py --workdir=DIR [--config.K=V]`.

Parses the flags and hands the config to the task it names (`bertjax.tasks.REGISTRY`). Bad
input of any kind (a `UserError`) is printed as one line and exits with status 2.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import parallel, tasks
from bertjax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py); override fields with --config.KEY=VALUE.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for all outputs (vocabulary, checkpoints, metrics).")
flags.mark_flags_as_required(["config", "workdir"])


def _fail(message: str) -> None:
  print(f"bertjax: error: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with an unknown --config.KEY turned into one clear message."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:  # ml_collections: an override names no existing field
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    detail = str(e).strip("'\"").replace("\\n", " ").replace("\n", " ").replace("\\'", "'")
    _fail(f"unknown config key among {', '.join(overrides)}: {detail}. "
          "The fields a config has are listed, with comments, in configs/tiny.py.")
  except flags.Error as e:
    _fail(f"{e}. Check the flag's value; run with --helpfull for the flags.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; flags are written --name=value.")
  config = _CONFIG.value
  try:
    parallel.maybe_initialize_distributed()
    tasks.run(config, _WORKDIR.value)
  except UserError as e:
    _fail(str(e))


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main, flags_parser=_parse_flags)
