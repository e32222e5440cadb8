"""python -m bertjax.tools.ab, the A/B of the train step in one process (model variants x XLA
flag sets, timed in bursts), end to end at BERT-tiny sizes on the CPU: docs/accelerators.md's
commands as written, a compile that fails, the budget, bad flags."""
import json
import os
import shlex
import sys

import pytest

import docs_text
from bertjax.tools import ab
from conftest import cpu_env
import warm_python

ROOT = docs_text.ROOT


def _docs_command(piece):
  [command] = [c for c in docs_text.bash_commands(docs_text.read("docs/accelerators.md"))
               if piece in c]
  return shlex.split(command)


def _lines(out):
  with open(os.path.join(out, "ab.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_the_docs_commands_run_as_written(tmp_path):
  """The CPU command (its --out moved under the test's directory): 2 variants x 2 flag sets
  compiled, 2 bursts each round robin and the first once more, one winner, its trace. The GPU
  command's flags after --ab are the A/B's defaults and its --out."""
  args = _docs_command("bertjax.tools.ab --smoke")
  out = tmp_path / "ab"
  args = [f"--out={out}" if a.startswith("--out=") else a for a in args]
  run = warm_python.run([sys.executable, *args[1:]], cwd=ROOT, env=cpu_env(), timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  lines = _lines(out)
  expected = [(v, f) for v in ("base", "fused_qkv") for f in ("default", "cpu_o1")]
  compiles = [line for line in lines if "compile_s" in line and "split" not in line]
  assert [(c["variant"], c["flag_set"]) for c in compiles] == expected
  assert all(c["compile_s"] > 0 and c["memory_bytes"] > 0 and not c["error"] for c in compiles)
  bursts = [line for line in lines if "burst" in line]
  assert [(b["variant"], b["flag_set"]) for b in bursts] == expected * 2 + expected[:1]
  assert [b["drift"] for b in bursts] == [False] * 8 + [True]
  summaries = [line for line in lines if line.get("split") == "summary"]
  assert [(s["variant"], s["flag_set"], s["bursts"]) for s in summaries] == [
      e + (2,) for e in expected]
  assert sum(s["winner"] for s in summaries) == 1 and summaries[0]["speedup"] == 1.0
  assert summaries[0]["drift"] is not None and all(s["mfu"] is None for s in summaries)  # CPU
  assert "base128-fused-b32 (" in run.stdout and "vs first" in run.stdout
  assert sum(line.startswith("* ") for line in run.stdout.splitlines()) == 1
  traces = [name for _, _, names in os.walk(out / "trace" / "base128-fused-b32")
            for name in names if name.endswith(".xplane.pb")]
  assert len(traces) == 1
  gpu = _docs_command("accelerator_report --wheels=.gpu/wheels --ab")
  assert gpu[:4] == ["python", "-m", "bertjax.tools.accelerator_report", "--wheels=.gpu/wheels"]
  flags = ab._parser().parse_args(gpu[gpu.index("--ab") + 1:])  # pylint: disable=protected-access
  assert flags.out == "ab_h200" and not flags.smoke
  assert flags.rows.split(",") == list(ab.DEFAULT_ROWS)


def test_a_failing_compile_is_recorded_and_the_rest_run(monkeypatch, tmp_path, capsys):
  monkeypatch.setitem(ab.FLAG_SETS, "bogus", {"xla_no_such_option_here": True})
  summaries = ab.main(["--smoke", "--rows=base128-xla-b32", "--variants=base",
                       "--flag_sets=bogus,default", "--bursts=1", "--burst_steps=1",
                       f"--out={tmp_path}"])
  bogus, default = summaries
  assert bogus["error"] and bogus["step_s"] is None and not bogus["winner"]
  assert default["step_s"] > 0 and default["winner"] and default["speedup"] == 1.0
  assert "bogus" in capsys.readouterr().out


def test_the_accelerator_report_hands_ab_its_flags_and_the_budget_stops_it(tmp_path):
  """--ab through the report (no wheels here); a budget of 0 starts nothing, and says so."""
  run = warm_python.run([sys.executable, "-m", "bertjax.tools.accelerator_report", "--ab",
                         "--smoke", "--rows=base128-xla-b32", "--budget_s=0",
                         f"--out={tmp_path}"], cwd=ROOT, env=cpu_env(), timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert [line.get("skipped") for line in _lines(tmp_path)] == ["budget"] * 3
  assert "base128-xla-b32 (" in run.stdout


@pytest.mark.parametrize("flag, expected", [
    ("--variants=base,fast_everything", "fast_everything not among base, fused_qkv"),
    ("--flag_sets=", "none given not among default"),
    ("--rows=unrolled_init-base128", "give train-step rows"),
    ("--bursts=0", "--bursts=0 --burst_steps=10; use 1 or more"),
])
def test_bad_flags_are_refused(flag, expected, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_:
    ab.main([flag, f"--out={tmp_path}"])
  assert exit_.value.code == 2
  assert expected in capsys.readouterr().err
