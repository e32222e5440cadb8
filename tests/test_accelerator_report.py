"""Tests of bertjax.tools.accelerator_report (and bertjax.tools.init_compile): README's CPU
command run as written (rows run, a failed row listed, JSON written), the budget (rows skipped,
a row stopped), row labels, offline wheels, an uninstalled checkout."""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from bertjax.errors import UserError
from bertjax.models import config as model_config
from bertjax.tools import accelerator_report as report
from bertjax.tools import bench_rows, init_compile
from bertjax.training import steps

import docs_text
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITLES = ("row", "attention", "B", "pk", "fill", "remat", "prng", "step ms", "tokens/s", "MFU",
          "plan GiB", "peak GiB", "compile s", "init s", "wall s", "status")


def _readme_commands():
  """docs/accelerators.md's accelerator_report command lines, as written."""
  text = docs_text.all_text()
  return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S)
          for line in block.splitlines()
          if line.startswith("python -m bertjax.tools.accelerator_report")]


def _run(args, cwd):
  # The real rows are prepared under the test's own cache (bench's default --rows_dir).
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(cwd / "cache"))
  return warm_python.run([sys.executable, *args], cwd=cwd, env=env, timeout=600)


def test_readme_smoke_command_runs_as_written(tmp_path):
  """The table has every column and a line per row; the cuDNN row fails on a CPU and says why;
  the others have figures; the JSON holds the same rows."""
  [command] = [c for c in _readme_commands() if "--smoke" in c]
  out = _run(shlex.split(command)[1:], tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  header = lines[0]
  assert re.split(r"\s{1,}", header.replace("step ms", "step_ms").replace(
      "plan GiB", "plan_GiB").replace("peak GiB", "peak_GiB").replace(
          "compile s", "compile_s").replace("init s", "init_s").replace("wall s", "wall_s")) == [
              t.replace(" ", "_") for t in TITLES]
  rows = {line.split()[0]: line for line in lines[2:5]}
  assert list(rows) == ["base128-fused-b128", "base128-cudnn-b128", "unrolled_init-base128"]
  assert rows["base128-fused-b128"].rstrip().endswith("ok")
  assert re.search(r"failed: .*cudnn attention needs an NVIDIA GPU", rows["base128-cudnn-b128"])
  assert "BERT-tiny sizes (--smoke)" in out.stdout
  written = json.loads((tmp_path / "smoke.json").read_text())
  assert written["environment"]["platform"] == "cpu"
  fused, cudnn, init = written["rows"]
  assert (fused["status"], cudnn["status"], init["status"]) == ("ok", "failed", "ok")
  # --smoke: BERT-tiny, seq 128 / 8, batch 128 / 16; the fused path on a CPU is xla; the fast
  # recipe on real rows, packed up to 3 a row.
  assert (fused["size"], fused["seq_len"], fused["batch_size"], fused["attention"]) == (
      "tiny", 16, 8, "xla")
  assert (fused["recipe"], fused["rows"], fused["packing"]) == ("fast", "real", 3)
  assert 0 < fused["fill"] <= 1 and fused["sequences"] >= 8
  assert f"{100 * fused['fill']:.0f}%" in rows["base128-fused-b128"]
  assert fused["tokens_per_s"] > 0 and fused["mfu"] is None
  assert fused["compiled_memory"]["total"] > 0 and fused["init_compile_s"] > 0
  assert "needs an NVIDIA GPU" in cudnn["error"] and "Traceback" not in cudnn["error"]
  assert init["unrolled"] and init["init_compile_s"] > 0
  # Each figure of the table is the JSON's.
  assert f"{fused['step_ms']:.2f}" in rows["base128-fused-b128"]
  assert f"{fused['tokens_per_s']:.0f}" in rows["base128-fused-b128"]


def test_readme_offline_commands_parse():
  commands = [shlex.split(c)[3:] for c in _readme_commands()
              if "--smoke" not in c and "--ab" not in c]  # --ab: tests/test_ab.py
  assert len(commands) == 2, commands
  download, offline = (report._parser().parse_args(c) for c in commands)  # pylint: disable=protected-access
  assert download.download_wheels == ".gpu/wheels" and download.python_version == "3.12"
  assert offline.wheels == ".gpu/wheels" and offline.rows.split(",") == list(report.DEFAULT_ROWS)
  for label in report.DEFAULT_ROWS:
    report.parse_row(label)
  # BERT-large 512 x 32 and ModernBERT-base 1,024 x 64 and 8,192 x 4 among the first rows.
  assert report.DEFAULT_ROWS[:4] == ("base128-fused-b128", "large512-fused-b32",
                                     "modernbase1024-fused-b64", "modernbase8192-fused-b4")


def test_a_budget_too_small_for_a_row_skips_every_row_and_prints_the_table(tmp_path):
  out = _run(["-m", "bertjax.tools.accelerator_report", "--smoke", "--budget_s=1",
              "--rows=base128-fused-b128,large512-xla-b32", f"--json={tmp_path / 'r.json'}"],
             tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("row ") and out.stdout.count("skipped: ") == 2
  rows = json.loads((tmp_path / "r.json").read_text())["rows"]
  assert [r["status"] for r in rows] == ["skipped", "skipped"]


def test_a_row_past_the_budget_is_stopped_with_its_processes(tmp_path):
  pid_file = tmp_path / "child.pid"
  sleeper = textwrap.dedent(f"""
      import subprocess, sys, time
      child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
      open({str(pid_file)!r}, "w").write(str(child.pid))
      time.sleep(60)""")
  start = time.perf_counter()
  status, seconds = report.run_process([sys.executable, "-c", sleeper], dict(os.environ), 3,
                                       str(tmp_path / "log"))
  assert status == "timed out" and 3 <= seconds < 10 and time.perf_counter() - start < 10
  time.sleep(0.5)
  status_file = f"/proc/{int(pid_file.read_text())}/status"
  if os.path.exists(status_file):  # the row's own child went with it (at most unreaped)
    with open(status_file, encoding="ascii") as f:
      assert "State:\tZ" in f.read()
  status, _ = report.run_process([sys.executable, "-c", "raise SystemExit(3)"],
                                 dict(os.environ), 30, str(tmp_path / "log"))
  assert status == "failed"


def test_row_labels():
  assert report.parse_row("large512-fused-b32-pack2-dots-unsafe_rbg") == report.Row(
      "large512-fused-b32-pack2-dots-unsafe_rbg", "large", 512, attention="fused",
      batch_size=32, packing=2, remat="dots", prng="unsafe_rbg")
  assert report.parse_row("base128-reference-b128") == report.Row(
      "base128-reference-b128", "base", 128, attention="reference", batch_size=128)
  assert report.parse_row("unrolled_init-base128") == report.Row(
      "unrolled_init-base128", "base", 128)
  modern = report.parse_row("modernbase8192-fused-b1")
  assert modern == report.Row("modernbase8192-fused-b1", "base", 8192, attention="fused",
                              architecture="modernbert", batch_size=1)
  command = report.row_command(modern, "gpu", argparse.Namespace(
      dtype="bfloat16", steps=5, warmup=2, smoke=False), "out.json")
  assert {"--architecture=modernbert", "--attention=cudnn", "--max_predictions=2457",
          "--vocab_size=50368"} <= set(command)
  # The recipe's packing unless the label packs; at smoke sizes, the real rows' vocabulary.
  assert not [part for part in command if part.startswith(("--packing", "--rows_documents"))]
  packed = report.row_command(report.smoke(report.parse_row("base128-fused-b128-pack2")), "cpu",
                              argparse.Namespace(dtype="float32", steps=1, warmup=1, smoke=True),
                              "out.json")
  assert {"--packing=2", "--attention=xla", "--seq_len=16", "--rows_documents=8",
          f"--vocab_size={bench_rows.ROWS_VOCAB_SIZE}"} <= set(packed)
  assert report.ROWS_VOCAB_SIZE == bench_rows.ROWS_VOCAB_SIZE
  # The names the labels take are bertjax's.
  assert set(report.SIZES) == set(model_config.SIZES)
  assert set(report.MODERNBERT_SIZES) == set(model_config.MODERNBERT_SIZES)
  assert set(report.ATTENTIONS) - {"fused"} == set(model_config.ATTENTIONS) - {"auto"}
  assert set(report.FUSED.values()) < set(model_config.FUSED_ATTENTIONS)
  assert set(report.REMATS) | {"none"} == set(model_config.REMATS)
  assert set(report.PRNGS) | {"threefry"} == set(steps.PRNG_IMPLS)


@pytest.mark.parametrize("label, message", [
    ("huge128-fused-b32", "no MODELSEQ"),
    ("modernmini128-fused-b32", "no MODELSEQ"),
    ("base128-flash-b32", "write MODELSEQ-ATTENTION"),
    ("base128-fused-32", "write MODELSEQ-ATTENTION"),
    ("base128-fused-b0", "write MODELSEQ-ATTENTION"),
    ("unrolled_init", "no MODELSEQ"),
    ("unrolled_init-base128-b8", "write MODELSEQ-ATTENTION"),
    ("base128-fused-b32-pack2-pack3", "'pack3' is not packK, a remat or a prng"),
    ("base128-fused-b32-philox", "'philox' is not"),
])
def test_bad_row_labels_are_one_line_errors(label, message, capsys):
  with pytest.raises(UserError, match=re.escape(message)):
    report.parse_row(label)
  with pytest.raises(SystemExit) as exit_info:
    report.main([f"--rows={label}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("bertjax.tools.accelerator_report: error: row ") and err.count("\n") == 1


def _wheel(directory, name):
  """A wheel of the pure-Python distribution `name` (module `name`, VALUE = 42)."""
  path = directory / f"{name}-0.1-py3-none-any.whl"
  info = f"{name}-0.1.dist-info"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(f"{name}/__init__.py", "VALUE = 42\n")
    z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
               "Tag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", f"{name}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n"
               f"{info}/RECORD,,\n")
  return path.name


def test_wheels_install_only_what_is_missing_where_the_rows_find_it(tmp_path, monkeypatch):
  monkeypatch.setattr(sys, "path", list(sys.path))
  missing = _wheel(tmp_path, "bertjax_offline_probe")
  (tmp_path / "clu-0.0.12-py3-none-any.whl").write_bytes(b"installed here: never opened")
  assert report.install_missing(str(tmp_path)) == [missing]
  assert report.install_missing(str(tmp_path)) == []  # found in wheels/site now
  out = subprocess.run([sys.executable, "-c", "import bertjax_offline_probe as p; print(p.VALUE)"],
                       env=report.row_env(str(tmp_path)), capture_output=True, text=True,
                       check=False)
  assert out.stdout.strip() == "42", out.stderr
  with pytest.raises(UserError, match="--download_wheels="):
    report.install_missing(str(tmp_path / "absent"))


def test_missing_packages_are_one_line_saying_how_to_fetch_them(tmp_path):
  """As on a machine without ml_collections: the probe names the module and the fix."""
  (tmp_path / "ml_collections").mkdir()
  (tmp_path / "ml_collections" / "__init__.py").write_text(
      "raise ModuleNotFoundError(\"No module named 'ml_collections'\", name='ml_collections')\n")
  env = report.row_env("")
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
  with pytest.raises(UserError, match=r"ModuleNotFoundError: No module named 'ml_collections'"
                     r".*--download_wheels=DIR .*--wheels=DIR"):
    report.probe(env, str(tmp_path))


def test_an_uninstalled_checkout_finds_its_configs(tmp_path):
  """Without pip's editable install (as on a machine without a package registry), run from a
  copy of the checkout's bertjax/: bertjax.configs is a plain subpackage, found with no import
  hook of bertjax's on sys.meta_path but the old command names' (`bertjax.MOVED_COMMANDS`)."""
  shutil.copytree(os.path.join(ROOT, "bertjax"), tmp_path / "bertjax",
                  ignore=shutil.ignore_patterns("__pycache__", "data"))
  script = textwrap.dedent(f"""
      import sys
      sys.meta_path[:] = [f for f in sys.meta_path
                          if not getattr(f, "__module__", "").startswith("__editable__")]
      sys.path.insert(0, {str(tmp_path)!r})
      from bertjax.configs import tiny
      hooks = [type(f).__name__ for f in sys.meta_path
               if type(f).__module__.startswith("bertjax")]
      print(tiny.__file__, tiny.get_config().model.size, *hooks)""")
  out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, check=False)
  assert out.stdout.split() == [str(tmp_path / "bertjax" / "configs" / "tiny.py"), "tiny",
                                "_MovedCommandFinder"], \
      out.stderr


def test_init_compile_unrolled_restores_the_kernel_lowering(capsys):
  lowering = steps.jax_config
  result = init_compile.main(["--size=tiny", "--seq_len=16", "--unrolled"])
  assert steps.jax_config is lowering
  assert result["unrolled"] and result["init_compile_s"] > 0
  assert "unrolled threefry" in capsys.readouterr().out
