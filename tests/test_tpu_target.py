"""`--compile_for=tpu:SLICE` (bertjax.tools.tpu_target) on bench and audit, and the TPU table
(bertjax.tools.tpu_table): the flag's parsing and its one-line errors in-process, the docs'
commands parsed; the TPU compile for real only where libtpu is importable (the environment
`python -m bertjax.tools.tpu_target --venv=.tpu-venv` makes; CI has none, and skips it)."""
import importlib.metadata
import importlib.util
import os
import re
import shlex
import sys

import pytest

from bertjax import tasks
from bertjax.configs import large, tiny
from bertjax.errors import UserError
from bertjax.tools import audit, bench, tpu_table, tpu_target

import docs_text

ROOT = docs_text.ROOT
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
NEEDS_LIBTPU = pytest.mark.skipif(
    not HAS_LIBTPU, reason="no libtpu in this Python; run in the environment that "
    "`python -m bertjax.tools.tpu_target --venv=.tpu-venv` makes")
BENCH = ["--size=tiny", "--batch_size=32", "--seq_len=128", "--rows=synthetic", "--memory_only"]


@pytest.mark.parametrize("value, topology", [
    ("tpu:v5p-8", "v5p:2x2x1"), ("tpu:v5p-64", "v5p:2x4x4"), ("tpu:v5e-8", "v5e:2x4"),
    ("tpu:v5litepod-4", "v5e:2x2"), ("tpu:v4-8", "v4:2x2x1"), ("tpu:v6e-1", "v6e:1x1"),
    ("tpu:v5e:2x4", "v5e:2x4"), ("tpu:TPU v5 lite:2x2", "TPU v5 lite:2x2")])
def test_slices_and_libtpu_topologies_parse(value, topology):
  assert tpu_target.parse(value) == tpu_target.Target(value, topology)


@pytest.mark.parametrize("argv, message", [
    (["--compile_for=gpu:h100"], "--compile_for=gpu:h100: give tpu:SLICE, a Cloud TPU slice"),
    (["--compile_for=tpu:v5p-7"], "--compile_for=tpu:v5p-7: unknown TPU slice 'v5p-7'; use one"),
    (["--compile_for=tpu:"], "--compile_for=tpu:: give tpu:SLICE"),
])
def test_a_bad_target_is_one_line_from_bench_and_audit(argv, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench.main(BENCH + argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"bertjax.tools.bench: error: {message}") and err.count("\n") == 1, err
  with pytest.raises(SystemExit) as exit_info:
    audit.main(audit._parse(["audit", "--config=configs/tiny.py", *argv]))  # pylint: disable=protected-access
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"bertjax: error: {message}") and err.count("\n") == 1, err


def test_without_libtpu_the_error_names_the_command_that_makes_its_environment(monkeypatch,
                                                                               capsys):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  command = "python -m bertjax.tools.tpu_target --venv=.tpu-venv"
  with pytest.raises(SystemExit) as exit_info:
    bench.main(BENCH + ["--compile_for=tpu:v5p-8"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("bertjax.tools.bench: error: --compile_for=tpu:v5p-8 compiles with "
                        "libtpu, which this Python") and command in err and err.count("\n") == 1
  with pytest.raises(SystemExit):
    audit.main(audit._parse(["audit", "--config=configs/tiny.py",  # pylint: disable=protected-access
                             "--compile_for=tpu:v5p-8"]))
  err = capsys.readouterr().err
  assert command in err and "Traceback" not in err and err.count("\n") == 1


def test_compile_for_needs_memory_only_and_not_simulated_devices(capsys):
  with pytest.raises(SystemExit):
    bench.main([a for a in BENCH if a != "--memory_only"] + ["--compile_for=tpu:v5e-4"])
  assert "nothing can run there: add --memory_only." in capsys.readouterr().err
  with pytest.raises(SystemExit):
    audit.main(audit._parse(["audit", "--config=configs/tiny.py", "--devices=4",  # pylint: disable=protected-access
                             "--compile_for=tpu:v5e-4"]))
  assert "give one of them." in capsys.readouterr().err


def _command(piece):
  [command] = [c for c in docs_text.bash_commands(docs_text.read("docs/accelerators.md"))
               if piece in c]
  return shlex.split(command)


def test_the_docs_venv_command_makes_a_venv_with_jaxs_libtpu():
  """docs/accelerators.md's command, parsed (it installs for minutes): a venv, bertjax with its
  pins, the libtpu that jax's tpu extra names, and setup.py's pytest."""
  args = _command("tpu_target --venv")
  assert args[:3] == ["python", "-m", "bertjax.tools.tpu_target"]
  venv = tpu_target._parser().parse_args(args[3:]).venv  # pylint: disable=protected-access
  libtpu = [r.split(";")[0] for r in importlib.metadata.requires("jax")
            if r.startswith("libtpu") and "tpu" in r.split(";")[1]]
  assert libtpu == ["libtpu==0.0.42.*"]  # jax 0.10.2's
  assert tpu_target.venv_commands(venv) == [
      [sys.executable, "-m", "venv", ".tpu-venv"],
      [".tpu-venv/bin/python", "-m", "pip", "install", "-e", ROOT, libtpu[0], "pytest==9.2.0"]]
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
    assert f'"{tpu_target.PYTEST}"' in f.read()
  with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as f:
    assert "/.tpu-venv/" in f.read().split()


def test_the_docs_tpu_commands_parse():
  """The TPU table's command and the audit's (minutes of compiling each, with libtpu): their
  flags exist, every row's config types with its batch split over its slice's chips and
  micro-batches, and the audit's mesh is its slice's."""
  args = _command("bertjax.tools.tpu_table")
  assert args[:3] == [".tpu-venv/bin/python", "-m", "bertjax.tools.tpu_table"]
  assert all(a.startswith("--json=") for a in args[3:])
  for row in tpu_table.ROWS:
    config = tasks.typed(tpu_table.config_of(row))
    chips = int(re.search(r"-(\d+)$", row.slice).group(1)) // (2 if "v5p" in row.slice else 1)
    assert config.train.batch_size % (chips * row.grad_accum_steps) == 0, row
    assert chips % row.fsdp == 0
  args = _command("--compile_for=tpu:v5p-64")
  assert args[:3] == [".tpu-venv/bin/python", "-m", "bertjax.tools.audit"]
  assert args[3:] == ["--config=configs/large.py:fast", "--compile_for=tpu:v5p-64",
                      "--config.mesh.fsdp=32"]
  assert "compile_for" in audit._FLAGS  # pylint: disable=protected-access
  assert tpu_target.parse("tpu:v5p-64").topology == "v5p:2x4x4"  # 32 chips, fsdp over them
  assert tasks.typed(large.get_config("fast")).mesh.fsdp == 1  # a field the flag sets


@NEEDS_LIBTPU
def test_bench_and_audit_compile_for_a_tpu_slice(capsys):
  """The tiny model's train step for the 4 chips of a v5e-4, compiled by libtpu on this CPU: the
  TPU's dtype and attention (bfloat16, splash), memory per chip within its 16 GiB; FSDP's
  parameter all-gathers and gradient reduce-scatters (the TPU's all-reduce-scatter) over fsdp."""
  [row] = bench.main(BENCH + ["--compile_for=tpu:v5e-4"])
  assert (row["platform"], row["device"], row["devices"]) == ("tpu", "TPU v5 lite", 4)
  assert (row["dtype"], row["attention"], row["hbm_bytes"]) == ("bfloat16", "splash", 16 * 2**30)
  assert 0 < row["compiled_memory"]["total"] < 0.01 * row["hbm_bytes"]
  assert "4 x TPU v5 lite (batch 32 split over them), 16 GiB of HBM a chip" in (
      capsys.readouterr().out)
  config = tiny.get_config()
  config.mesh.fsdp = 4
  result = audit.audit(config, tpu_target.devices(tpu_target.parse("tpu:v5e-4")), ("train",))
  params = result["parameter_bytes"]
  kinds = {row["kind"]: row for row in result["train"]["collectives"]}
  assert {tuple(row["axes"]) for row in kinds.values()} == {("fsdp",)}
  assert 0.9 * params <= kinds["all-gather"]["nbytes"] <= 2.1 * params
  assert 0.4 * params <= kinds["all-reduce-scatter"]["nbytes"] <= 1.7 * params
  assert result["train"]["memory"]["total"] < result["hbm_bytes"]


@NEEDS_LIBTPU
def test_a_topology_libtpu_does_not_know_is_one_line(capsys):
  with pytest.raises(UserError, match=r"--compile_for=tpu:v5e:3x3: libtpu made no topology "
                     r"'v5e:3x3' \(.*not divisible.*\); use a slice"):
    tpu_target.devices(tpu_target.parse("tpu:v5e:3x3"))
  with pytest.raises(SystemExit):
    bench.main(BENCH + ["--compile_for=tpu:bogus:1x1"])
  err = capsys.readouterr().err
  assert "libtpu made no topology 'bogus:1x1' (INVALID_ARGUMENT: Invalid TPU external name" in (
      err) and err.count("\n") == 1, err
