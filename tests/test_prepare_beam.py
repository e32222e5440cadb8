"""bertjax.data.prepare --runner: a Beam pipeline writes the same DATA as local processes."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bertjax.data import sources
from bertjax.errors import UserError

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--vocab_size=600", "--max_seq_length=32,64", "--dupe_factor=2", "--eval_fraction=0.1",
         "--shard_size_mb=0.05", "--workers=2"]
needs_beam = pytest.mark.skipif(importlib.util.find_spec("apache_beam") is None,
                                reason="pip install 'bertjax[beam]'")


def _prepare(*args: str) -> subprocess.CompletedProcess:
  """Runs python -m bertjax.data.prepare ARGS on the CPU; returns the finished process."""
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  return warm_python.run([sys.executable, "-m", "bertjax.data.prepare", *args], env=env,
                         timeout=300)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
  """40 documents of the bundled corpus in google-research/bert's format (~0.5 MB, 10 shards)."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:40]
  path = tmp_path_factory.mktemp("text") / "text.txt"
  path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
  return str(path)


def _files(directory) -> dict[str, bytes]:
  """{path relative to DATA: bytes} of every shard file and packing plan in DATA."""
  found = {}
  for parent, _, names in os.walk(directory):
    for name in names:
      if name.endswith((".array_record", ".npy")):
        path = os.path.join(parent, name)
        with open(path, "rb") as f:
          found[os.path.relpath(path, directory)] = f.read()
  return found


@needs_beam
def test_beam_runner_writes_what_local_processes_write(text_file, tmp_path):
  local = _prepare(f"--input={text_file}", f"--output_dir={tmp_path / 'A'}", *FLAGS)
  assert local.returncode == 0, local.stderr
  # FnApiRunner is what DirectRunner runs offline (online it first fetches the Prism binary);
  # multi_processing pickles the work to 2 worker processes, as a cluster's runner does.
  beam = _prepare(f"--input={text_file}", f"--output_dir={tmp_path / 'B'}", *FLAGS,
                  "--runner=FnApiRunner", "--direct_num_workers=2",
                  "--direct_running_mode=multi_processing")
  assert beam.returncode == 0, beam.stderr
  infos = []
  for name in "AB":
    with open(tmp_path / name / "info.json") as f:
      infos.append(json.load(f))
  for key in ("counts", "phases", "documents"):
    assert infos[0][key] == infos[1][key]
  assert infos[0]["counts"]["documents"] > 0 and len(infos[0]["phases"]) == 2
  files = _files(tmp_path / "A")
  assert len(files) > 30  # 10 text shards: documents, seq32, seq64, train and held out, plans
  assert files == _files(tmp_path / "B")


def test_pipeline_flag_without_runner_is_one_line(text_file, tmp_path):
  result = _prepare(f"--input={text_file}", f"--output_dir={tmp_path / 'A'}", *FLAGS,
                    "--project=P")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "prepare: error: unknown flags --project=P (flags for Beam need --runner)"]
  assert not os.path.exists(tmp_path / "A")


@needs_beam
@pytest.mark.parametrize("runner, args, message", [
    ("NoSuchRunner", [], "Unexpected pipeline runner: NoSuchRunner"),
    ("no_such_module.Runner", [], "cannot be loaded: No module named 'no_such_module'"),
    ("DirectRunner", ["--direct_num_workers=x"], "--direct_num_workers: invalid int value"),
    # Beam's validation (DataflowRunner's missing --project etc. is one, but may reach GCP).
    ("DirectRunner", ["--type_check_additional=bogus"], "refused the pipeline flags: Unrecog"),
])
def test_bad_runner_or_flag_is_a_user_error(tmp_path, capsys, runner, args, message):
  from bertjax.data.pretraining import (beam as prepare_beam)  # pylint: disable=import-outside-toplevel

  for refuse in (lambda: prepare_beam.check(runner, args),
                 lambda: prepare_beam.run(str(tmp_path), [0], runner, args)):
    with pytest.raises(UserError, match=message) as error:
      refuse()
    assert "\n" not in str(error.value)
  assert "usage:" not in capsys.readouterr().err  # Beam's argparse usage is not printed
  assert not os.listdir(tmp_path)


def test_without_beam_says_how_to_install(monkeypatch):
  from bertjax.data.pretraining import (beam as prepare_beam)  # pylint: disable=import-outside-toplevel

  monkeypatch.setitem(sys.modules, "apache_beam", None)  # import apache_beam fails
  with pytest.raises(UserError, match=r"pip install 'bertjax\[beam\]'"):
    prepare_beam.check("DirectRunner", [])


@needs_beam
def test_worker_without_data_is_a_user_error(tmp_path):
  from bertjax.data.pretraining import (beam as prepare_beam)  # pylint: disable=import-outside-toplevel

  with pytest.raises(UserError, match="every worker reads and writes"):
    prepare_beam.process_shard(0, str(tmp_path))
