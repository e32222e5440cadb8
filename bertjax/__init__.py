"""bertjax: BERT (Devlin et al., 2019) in JAX/Flax; the map of the package is docs/DESIGN.md.

The package's commands that moved in the November 2026 layout keep their old names:
`python -m bertjax.bench` still runs, says where it went (stderr) and runs
`bertjax.tools.bench`. `MOVED_COMMANDS` is the table; nothing is imported until asked for.
"""
import importlib.abc
import importlib.util
import sys

MOVED_COMMANDS = {  # old `python -m` name -> the module that runs it now
    "bertjax.bench": "bertjax.tools.bench",
    "bertjax.finetune_bench": "bertjax.tools.finetune_bench",
    "bertjax.real_text_demo": "bertjax.tools.real_text_demo",
    "bertjax.sweep": "bertjax.tools.sweep",
    "bertjax.curves": "bertjax.training.curves",
    "bertjax.data.benchmark": "bertjax.tools.data_benchmark",
    "bertjax.data.movie_reviews": "bertjax.data.finetuning.movie_reviews",
}


class _MovedCommandFinder(importlib.abc.MetaPathFinder):
  """Finds an old command name (after every other finder said no) as its new module."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    new = MOVED_COMMANDS.get(fullname)
    if new is None:
      return None
    print(f"bertjax: {fullname} is now {new} (python -m {new}); running that.", file=sys.stderr)
    # The new module's file under the old name (its loader answers to one name only).
    return importlib.util.spec_from_file_location(fullname, importlib.util.find_spec(new).origin)


if not any(isinstance(finder, _MovedCommandFinder) for finder in sys.meta_path):
  sys.meta_path.append(_MovedCommandFinder())
