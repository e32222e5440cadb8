"""launch/colab.ipynb run top to bottom with nbclient, on this CPU and without the network, as a
checkout runs it: the clone and install are skipped (this checkout, bertjax installed), the tiny
BERT pretrains and is fine-tuned on the bundled movie reviews for a few steps, and the cells that
need the Hugging Face hub (BERT-base, GLUE MRPC) and those after them print why they skip."""
import json
import os
import socket
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import cpu_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "launch", "colab.ipynb")
STEPS = 10  # BERTJAX_NOTEBOOK_STEPS: pretraining steps (fine-tuning: 3 * STEPS)


def closed_port() -> int:
  """A local TCP port nothing listens on (the hub's endpoint here: connections are refused)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def text_of(cell) -> str:
  """What a code cell printed (stdout, stderr) and the plain text of what it displayed."""
  parts = []
  for output in cell.outputs:
    if output.output_type == "stream":
      parts.append(output.text)
    elif output.output_type in ("display_data", "execute_result"):
      parts.append(output.data.get("text/plain", ""))
  return "".join(parts)


def cell_with(nb, snippet):
  """The one code cell whose source holds `snippet`."""
  [cell] = [c for c in nb.cells if c.cell_type == "code" and snippet in c.source]
  return cell


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
  """(the notebook executed in memory, its BERTJAX_NOTEBOOK_DIR); the file is left as it is."""
  base = tmp_path_factory.mktemp("colab")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  env = {
      "BERTJAX_NOTEBOOK_DIR": str(base),
      "BERTJAX_NOTEBOOK_STEPS": str(STEPS),
      "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",  # offline, even where there is a network
      "JAX_PLATFORMS": "cpu",
      "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],  # !python: ours
      "MPLBACKEND": "module://matplotlib_inline.backend_inline",
      # The session's quick compile: 10 and 30 steps do not repay XLA's optimized code (the
      # notebook: 43.1 s and 68 CPU-s optimized, 40.3 s and 61 CPU-s quick, 2026-12-02).
      "XLA_FLAGS": cpu_env()["XLA_FLAGS"],
  }
  saved = {key: os.environ.get(key) for key in [*env, "HF_HUB_OFFLINE"]}
  os.environ.update(env)  # the kernel and the commands it runs inherit them
  os.environ.pop("HF_HUB_OFFLINE", None)  # the reachability test itself decides
  try:
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": REPO}}).execute()
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  return nb, base


def test_every_cell_ran_without_error(executed):
  nb, _ = executed
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  for cell in code:
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
    assert "Traceback" not in text_of(cell), (cell.source, text_of(cell)[-3000:])


def test_in_a_checkout_it_neither_clones_nor_installs(executed):
  nb, base = executed
  assert f"running in the checkout {REPO}: no clone" in text_of(cell_with(nb, "git\", \"clone"))
  install = text_of(cell_with(nb, "!pip install -q -e ."))
  assert "are installed in" in install and "no pip install" in install
  assert "installing bertjax" not in install and "CpuDevice" in install
  assert not (base / "bertjax").exists()


def test_pretraining_wrote_metrics_and_the_notebook_plotted_them(executed):
  nb, base = executed
  with open(base / "bertjax_tiny" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  evals = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [3, 6, 9, 10]  # every STEPS // 3, and at the end
  assert max(r["step"] for r in rows if r["split"] == "train") == STEPS
  metrics = cell_with(nb, "metrics.jsonl")
  assert "mlm_accuracy" in text_of(metrics)  # the table of evaluations
  assert any("image/png" in o.get("data", {}) for o in metrics.outputs)  # the plots


def test_fine_tuning_on_movie_reviews_ran_offline(executed):
  nb, base = executed
  assert (base / "movie_reviews" / "SST-2" / "train.tsv").is_file()
  with open(base / "tiny_sst2" / "eval_results.json") as f:
    results = json.load(f)
  assert results["step"] == 3 * STEPS and 0 <= results["accuracy"] <= 1
  cell = cell_with(nb, "{SST2_DIR}/eval_results.json")
  assert f'"accuracy": {results["accuracy"]}' in text_of(cell) and "prediction" in text_of(cell)
  assert (base / "tiny_sst2" / "curves.png").is_file()
  assert any("image/png" in o.get("data", {}) for o in cell.outputs)  # the run's curves


def test_hub_cells_and_those_after_them_skip_and_say_why(executed):
  nb, base = executed
  download = text_of(cell_with(nb, "snapshot_download("))
  assert "skipped: the download of google-bert/bert-base-uncased, as http://127.0.0.1:" in download
  assert "cannot be reached" in download
  for snippet, line in [
      ("python -m bertjax.convert", "skipped: the conversion"),
      ("configs/features.py", "skipped: feature extraction"),
      ("def sentence_vector", "skipped: the similarities"),
      ("load_dataset(", "skipped: the download of GLUE MRPC, as "),
      ("--config.task=mrpc", "skipped: MRPC fine-tuning"),
      ("{MRPC_DIR}/eval_results.json", "skipped: the MRPC results")]:
    assert line in text_of(cell_with(nb, snippet)), snippet
  assert sorted(os.listdir(base)) == ["bertjax_tiny", "movie_reviews", "tiny_sst2"]
