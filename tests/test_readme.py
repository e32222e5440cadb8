"""docs/pretraining.md's "Pretraining data" commands, run exactly as written (in a directory
holding bertjax/data/corpus/austen.txt, a slice of the bundled corpus), and every page's other
commands parsed. The pages are read through tests/docs_text.py."""
import importlib
import os
import re
import shlex
import sys

import pytest

from bertjax.data import sources

import docs_text
from conftest import cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section_commands(title):
  """The `python -m bertjax...` command lines of the section `## title` of the README or of
  the page under docs/ that has it."""
  section = docs_text.section(title)
  blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
  return [line for block in blocks for line in block.splitlines()
          if line.startswith("python -m bertjax.")]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
  """A directory holding bertjax/data/corpus/austen.txt, where the commands run from a
  checkout find the bundled corpus: here its first 60 chapters, so that they run in seconds."""
  root = tmp_path_factory.mktemp("readme")
  return write_corpus_slice(root)


def write_corpus_slice(root):
  """Writes the first 60 chapters of the bundled corpus to ROOT/bertjax/data/corpus/austen.txt
  (no package there: `python -m bertjax...` still imports the checkout's); returns root."""
  corpus = root / "bertjax" / "data" / "corpus"
  corpus.mkdir(parents=True)
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:60]
  (corpus / "austen.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
  return root


def test_pretraining_data_commands_run_as_written(text_dir):
  commands = _section_commands("Pretraining data")
  assert len(commands) == 4, commands
  env = cpu_env(optimized=True)  # the tiny config's sizes: XLA's optimized code repays it
  for command in commands:
    args = shlex.split(command)
    out = warm_python.run([sys.executable, *args[1:]], cwd=text_dir, env=env,
                          timeout=600)
    assert out.returncode == 0, (command, out.stderr[-3000:])
  assert sorted(os.listdir(text_dir / "data_128_512")) == [
      "documents", "done", "info.json", "plan.json", "seq128", "seq512", "vocab.model"]
  for run in ("run_prepared", "run_static"):
    assert (text_dir / run / "checkpoints" / "20").is_dir()
    assert "data" not in os.listdir(text_dir / run)


def _readme_commands(prefix):
  """Argument lists of every command of the README and the pages under docs/ that starts with
  `prefix` (backslash-continued lines joined; [optional] parts and "..." dropped)."""
  text = re.sub(r"\\\n\s*", " ", docs_text.all_text())
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for line in block.splitlines():
      line = re.sub(r"\[[^\]]*\]|\.\.\.", "", line.strip().split("&&")[-1].strip())
      if line.startswith(prefix):
        commands.append(shlex.split(line, comments=True)[len(prefix.split()):])
  return commands


def test_every_readme_command_names_real_flags_and_config_fields():
  """The pages' other commands (paths of a real cluster, not runnable here) parse: prepare's
  flags exist, and every --config.KEY is a field of the config named."""
  from bertjax.data import prepare  # pylint: disable=import-outside-toplevel

  prepares = _readme_commands("python -m bertjax.data.prepare")
  assert len(prepares) == 4, prepares
  for args in prepares:
    _, unknown = prepare._parser().parse_known_args(args)  # pylint: disable=protected-access
    assert not unknown, (args, unknown)
  mains = _readme_commands("python -m bertjax.main")
  assert len(mains) >= 8, mains
  for args in mains:
    [(name, arg)] = [a.split("/")[-1].partition(".py")[::2] for a in args
                     if a.startswith("--config=")]
    config = importlib.import_module(f"bertjax.configs.{name}").get_config(arg[1:] or None)
    for arg in args:
      if arg.startswith("--config."):
        node = config
        for part in arg[len("--config."):].split("=")[0].split("."):
          assert part in node, (name, arg)
          node = node[part]
  from bertjax.tools import bench  # pylint: disable=import-outside-toplevel
  benches = _readme_commands("python -m bertjax.tools.bench")
  assert len(benches) >= 4, benches
  for args in benches:
    _, unknown = bench._parser().parse_known_args(args)  # pylint: disable=protected-access
    assert not unknown, (args, unknown)
