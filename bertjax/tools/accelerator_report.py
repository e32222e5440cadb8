"""One table of where bertjax's train step stands on a GPU or TPU, in one command within a time
budget (compiles included): attention path x batch x packing x remat x PRNG, for BERT-base at
seq 128, BERT-large at seq 512 and ModernBERT-base at 1,024 and 8,192, as users train them.

  python -m bertjax.tools.accelerator_report [--budget_s=500] [--rows=LABEL,...] [--json=OUT]
      [--steps=10] [--warmup=2] [--dtype=bfloat16] [--min_row_s=60] [--wheels=DIR] [--smoke]
  python -m bertjax.tools.accelerator_report --download_wheels=DIR [--python_version=3.12]
  python -m bertjax.tools.accelerator_report --wheels=DIR --ab [python -m bertjax.tools.ab's flags]

Rows. A label says what a row runs: MODELSEQ-ATTENTION-bBATCH[-packK][-REMAT][-PRNG], e.g.
`base128-fused-b128-pack2-dots-unsafe_rbg`: BERT-base at 128 tokens (max_predictions seq * 5 /
32: 20 at 128, 80 at 512; `modernbase1024` is ModernBERT-base at 1,024, masked LM alone on
contiguous spans, 30% of the tokens predicted, vocabulary 50,368), the attention path (`fused`
is the platform's kernel: cudnn on a GPU, splash on a TPU, xla elsewhere; `reference` keeps the
paper's attention dropout), the batch, up to K pairs packed a row (the recipe's 3 without packK),
remat full or dots, and train.prng_impl rbg or unsafe_rbg (threefry otherwise). Each is one
`python -m bertjax.tools.bench --peers=bertjax` process: the benchmark's default, the fast recipe
(configs/base.py:fast, configs/modernbert.py:base) on real rows of the bundled corpus
(`bertjax.tools.bench_rows`, prepared once a shape into bench's default --rows_dir), its own step
timed back to back, its figures of real work; so a row that fails or runs out of time is listed
as such and the others still run. `unrolled_init-MODELSEQ` rows time the parameter init's
compile the old way instead (`python -m bertjax.tools.init_compile --unrolled`); every other row
gives the init's compile with bertjax's kernel-lowered threefry (`init s`). `--rows` picks and
orders rows; the default ones (`DEFAULT_ROWS`) run in priority order.

Budget. Everything, the first probe of the machine included, fits in --budget_s: a row starts
only with --min_row_s left, is stopped when the budget ends (listed as timed out) and the rows
after it are listed as skipped; the table is printed whatever happens (and --json written:
{environment, budget_s, wall_s, rows}). Compilation caches are off, so compile times are real.

Columns: pk = pairs a row at most; fill = real tokens / the batch's slots; tokens/s counts real
tokens; MFU = `bertjax.training.flops.model_flops` of the batch's real work / step time / the
device's dense peak for --dtype; plan GiB = XLA's memory plan of the compiled train step per
device (`compiled.memory_analysis()`: arguments + outputs - donated + temporaries); peak GiB =
the device's peak bytes in use in the row's process (on CPU, the process's resident growth);
compile s = the train step's, init s = the init's.

Offline. The rows need bertjax's packages; a machine without a package registry may lack clu,
ml_collections, grain, array_record, tensorboardX and seqeval. On a machine with one,
`--download_wheels=DIR` fetches them (and what they need beyond jax, flax, orbax, torch and
transformers) as wheels for --python_version at the versions installed here (setup.py's pins),
building seqeval's (an sdist only) as a wheel here. Copy DIR with the checkout; `--wheels=DIR`
installs those of them that are missing into DIR/site with `pip install --no-index --no-deps
--target` and puts DIR/site on the rows' path. An uninstalled checkout finds `bertjax.configs`, a plain
subpackage, as any other. seqeval's NER metrics need scikit-learn, which is not fetched
(the rows do not use it).

`--smoke` runs the same rows at BERT-tiny, batch / 16, seq / 8, on real rows of the corpus's
first SMOKE_DOCUMENTS documents (the model's vocabulary that of the rows, 8,000): the command end
to end on a CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from bertjax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_ROWS = (
    "base128-fused-b128", "large512-fused-b32", "modernbase1024-fused-b64",
    "modernbase8192-fused-b4", "base128-reference-b128",
    "base128-fused-b128-pack2", "base128-xla-b128", "base128-fused-b128-unsafe_rbg",
    "base128-fused-b256", "base128-fused-b128-dots", "large512-fused-b32-pack2",
    "large512-reference-b32-full", "base128-fused-b32", "base128-fused-b128-rbg",
    "unrolled_init-base128")
SIZES = ("tiny", "mini", "small", "medium", "base", "large")  # bertjax.models.config.SIZES
MODERNBERT_SIZES = ("tiny", "base", "large")  # bertjax.models.config.MODERNBERT_SIZES
ATTENTIONS = ("fused", "reference", "xla", "cudnn", "splash")
FUSED = {"gpu": "cudnn", "tpu": "splash"}  # the platform's fused kernel; xla elsewhere
REMATS = ("full", "dots")  # model.remat other than none
PRNGS = ("rbg", "unsafe_rbg")  # train.prng_impl other than threefry
SMOKE_DOCUMENTS = 8  # of the bundled corpus, the real rows of --smoke (bench's --rows_documents)
ROWS_VOCAB_SIZE = 8000  # the real rows' vocabulary (bench_rows.ROWS_VOCAB_SIZE, which imports jax)
# Not on the GPU image this was written for (Python 3.12 with jax, flax, optax, orbax,
# sentencepiece, tokenizers, torch and transformers): bertjax's packages and what they need.
WHEELS = ("clu", "ml_collections", "grain", "array_record", "tensorboardX", "wrapt",
          "cloudpickle", "portpicker", "psutil")
BUILT_WHEELS = ("seqeval",)  # an sdist only; its build needs setuptools_scm, so built here
PROBE = """import json, platform, jax, jaxlib
import bertjax.tools.bench  # what the rows import
d = jax.devices()[0]
print(json.dumps(dict(platform=d.platform, device=d.device_kind, devices=jax.device_count(),
                      jax=jax.__version__, jaxlib=jaxlib.__version__,
                      python=platform.python_version())))
"""


@dataclasses.dataclass(frozen=True)
class Row:
  """What one row runs (its label, parsed; see the module docstring)."""
  label: str
  size: str
  seq_len: int
  attention: str = ""  # "" for an unrolled_init row
  architecture: str = "bert"  # "modernbert" for a MODELSEQ written modernSIZESEQ
  batch_size: int = 0
  packing: int = 0
  remat: str = "none"
  prng: str = "threefry"


def parse_row(label: str) -> Row:
  """The Row a label names; UserError saying how to write one if it names none."""
  how = ("write MODELSEQ-ATTENTION-bBATCH[-packK][-REMAT][-PRNG] (e.g. base128-fused-b128-pack2"
         f"-dots-rbg; attention of {', '.join(ATTENTIONS)}; remat of {', '.join(REMATS)}; prng "
         f"of {', '.join(PRNGS)}) or unrolled_init-MODELSEQ, MODEL of {', '.join(SIZES)}.")
  parts = label.split("-")
  init = parts[0] == "unrolled_init"
  model = re.fullmatch(r"(modern)?([a-z]+)(\d+)", parts[init] if len(parts) > init else "")
  if not model or model[2] not in (MODERNBERT_SIZES if model[1] else SIZES):
    raise UserError(f"row {label!r}: no MODELSEQ such as base128; {how}")
  size, seq_len = model[2], int(model[3])
  architecture = "modernbert" if model[1] else "bert"
  if init:
    if len(parts) != 2 or model[1]:
      raise UserError(f"row {label!r}: {how}")
    return Row(label, size, seq_len)
  if (len(parts) < 3 or parts[1] not in ATTENTIONS or not re.fullmatch(r"b\d+", parts[2])
      or int(parts[2][1:]) < 1):
    raise UserError(f"row {label!r}: {how}")
  options = dict(attention=parts[1], batch_size=int(parts[2][1:]))
  for part in parts[3:]:
    if re.fullmatch(r"pack\d+", part) and "packing" not in options:
      options["packing"] = int(part[4:])
    elif part in REMATS and "remat" not in options:
      options["remat"] = part
    elif part in PRNGS and "prng" not in options:
      options["prng"] = part
    else:
      raise UserError(f"row {label!r}: {part!r} is not packK, a remat or a prng (once each); "
                      f"{how}")
  return Row(label, size, seq_len, architecture=architecture, **options)


def smoke(row: Row) -> Row:
  """The row at CPU sizes: BERT-tiny, seq / 8, batch / 16 (at least 2)."""
  return dataclasses.replace(row, size="tiny", seq_len=max(16, row.seq_len // 8),
                             batch_size=max(2, row.batch_size // 16) if row.batch_size else 0)


def row_attention(row: Row, platform: str) -> str:
  """The attention path a row runs on `platform` (`fused`: the platform's kernel)."""
  return FUSED.get(platform, "xla") if row.attention == "fused" else row.attention


def row_batch_shape(row: Row, smoke_sizes: bool) -> tuple[int, int]:
  """(masked positions a sequence at most, vocabulary size) of a row: BERT predicts seq * 5 / 32
  with 30,522 tokens, ModernBERT 30% with 50,368; 128 tokens at smoke sizes (bertjax.tools.ab's
  synthetic rows; the report's real rows take ROWS_VOCAB_SIZE there)."""
  modern = row.architecture == "modernbert"
  predictions = row.seq_len * 3 // 10 if modern else row.seq_len * 5 // 32
  return max(1, predictions), 128 if smoke_sizes else 50368 if modern else 30522


def row_command(row: Row, platform: str, args: argparse.Namespace, out: str) -> list[str]:
  """The row's process: bench (or init_compile for an unrolled_init row), writing JSON to out."""
  if not row.attention:
    return [sys.executable, "-m", "bertjax.tools.init_compile", f"--size={row.size}",
            f"--seq_len={row.seq_len}", "--unrolled", f"--json={out}"]
  predictions, vocab_size = row_batch_shape(row, args.smoke)
  vocab_size = ROWS_VOCAB_SIZE if args.smoke else vocab_size  # real rows' ids at BERT-tiny
  return [sys.executable, "-m", "bertjax.tools.bench", "--peers=bertjax", f"--size={row.size}",
          f"--batch_size={row.batch_size}", f"--seq_len={row.seq_len}",
          f"--max_predictions={predictions}", f"--dtype={args.dtype}",
          f"--steps={args.steps}", f"--warmup={args.warmup}",
          f"--attention={row_attention(row, platform)}", f"--remat={row.remat}",
          f"--prng={row.prng}", f"--architecture={row.architecture}",
          f"--vocab_size={vocab_size}", f"--json={out}"] + (
              [f"--packing={row.packing}"] if row.packing else []) + (
              [f"--rows_documents={SMOKE_DOCUMENTS}"] if args.smoke else [])


def run_process(command: Sequence[str], env: dict[str, str], limit_s: float,
                log_path: str) -> tuple[str, float]:
  """Runs `command` (its output to log_path) for at most limit_s seconds, in a process group of
  its own that is killed whole at the limit; returns ("ok" | "failed" | "timed out", seconds)."""
  start = time.perf_counter()
  with open(log_path, "w", encoding="utf-8") as log:
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
      code = process.wait(timeout=max(limit_s, 0.1))
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      return "timed out", time.perf_counter() - start
  return ("ok" if code == 0 else "failed"), time.perf_counter() - start


def error_line(log_path: str) -> str:
  """The line of a failed process's log that says why: its last `error:` line or exception,
  else its last line."""
  with open(log_path, encoding="utf-8", errors="replace") as f:
    lines = [line.strip() for line in f if line.strip()]
  for line in reversed(lines):
    if "error:" in line or re.match(r"[\w.]+(Error|Exception):", line):
      return line
  return lines[-1] if lines else "no output"


def pip(*arguments: str) -> None:
  """Runs this Python's pip; UserError (pip has printed why) if it fails."""
  if subprocess.run([sys.executable, "-m", "pip", *arguments], check=False).returncode:
    raise UserError(f"pip {arguments[0]} failed (its message is above).")


def install_missing(wheels: str) -> list[str]:
  """Installs the wheels in `wheels` whose distributions this Python lacks into wheels/site
  (`pip install --no-index --no-deps --target`), which is put first on sys.path; returns the
  file names installed."""
  if not os.path.isdir(wheels):
    raise UserError(f"--wheels={wheels} is not a directory; make it with --download_wheels="
                    f"{wheels} on a machine with a package registry and copy it here.")
  site = os.path.join(wheels, "site")
  if site not in sys.path:
    sys.path.insert(0, site)
  missing = []
  for name in sorted(os.listdir(wheels)):
    if not name.endswith(".whl"):
      continue
    try:
      importlib.metadata.distribution(name.split("-")[0])
    except importlib.metadata.PackageNotFoundError:
      missing.append(name)
  if missing:
    pip("install", "--quiet", "--no-index", "--no-deps", f"--target={site}",
        *(os.path.join(wheels, name) for name in missing))
  return missing


def download_wheels(directory: str, python_version: str) -> None:
  """Fetches WHEELS (built and pure-Python wheels for Linux x86-64 and `python_version`) and
  builds BUILT_WHEELS into `directory`, each at the version this Python has installed."""
  pins = []
  for name in WHEELS + BUILT_WHEELS:
    try:
      pins.append(f"{name}=={importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
      raise UserError(f"{name} is not installed here, so its version is unknown; install "
                      "bertjax here first (pip install -e .).") from None
  os.makedirs(directory, exist_ok=True)
  platforms = [f"--platform={p}" for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64",
                                           "manylinux_2_28_x86_64", "any")]
  pip("download", "--quiet", "--no-deps", "--only-binary=:all:",
      f"--python-version={python_version}", "--implementation=cp", *platforms,
      f"--dest={directory}", *pins[:len(WHEELS)])
  pip("wheel", "--quiet", "--no-deps", f"--wheel-dir={directory}", *pins[len(WHEELS):])
  print("\n".join(sorted(name for name in os.listdir(directory) if name.endswith(".whl"))))


def row_env(wheels: str) -> dict[str, str]:
  """The rows' environment: the checkout (and wheels/site) on the path, no compilation cache,
  jax not taking the GPU's memory up front (so its peak is the row's own)."""
  path = [ROOT] + ([os.path.join(wheels, "site")] if wheels else [])
  return dict(os.environ, PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]),
              JAX_ENABLE_COMPILATION_CACHE="false", XLA_PYTHON_CLIENT_PREALLOCATE="false")


def probe(env: dict[str, str], scratch: str, limit_s: float = 180) -> dict[str, Any]:
  """The machine as the rows see it ({platform, device, devices, jax, jaxlib, python}), or a
  UserError saying why the rows cannot run. It runs whatever the budget (it takes seconds)."""
  log = os.path.join(scratch, "probe.log")
  status, _ = run_process([sys.executable, "-c", PROBE], env, limit_s, log)
  if status != "ok":
    line = error_line(log)
    fix = (" Run python -m bertjax.tools.accelerator_report --download_wheels=DIR on a machine "
           "with a package registry, copy DIR here and pass --wheels=DIR."
           if "ModuleNotFoundError" in line else "")
    raise UserError(f"the rows cannot run here ({status}: {line}).{fix}")
  with open(log, encoding="utf-8") as f:
    return json.loads([line for line in f if line.startswith("{")][-1])


def run_rows(rows: Sequence[Row], args: argparse.Namespace, env: dict[str, str],
             platform: str, deadline: float, scratch: str) -> list[dict[str, Any]]:
  """Runs the rows one after another until the deadline (time.perf_counter()); returns one
  result each: its Row fields, status, wall_s, error, and the fields of its JSON."""
  results = []
  for i, row in enumerate(rows):
    left = deadline - time.perf_counter()
    result = dict(dataclasses.asdict(row), status="skipped", wall_s=0.0, error="")
    if left < args.min_row_s:
      result["error"] = f"{max(left, 0):.0f} s of the budget left"
    else:
      out, log = (os.path.join(scratch, f"row{i}.{ext}") for ext in ("json", "log"))
      result["status"], result["wall_s"] = run_process(
          row_command(row, platform, args, out), env, left, log)
      if result["status"] == "ok":
        with open(out, encoding="utf-8") as f:
          written = json.load(f)
        result.update(written["rows"][0] if "rows" in written else written)
      else:
        result["error"] = (error_line(log) if result["status"] == "failed" else
                           f"stopped at the end of the budget after {result['wall_s']:.0f} s")
        with open(log, encoding="utf-8", errors="replace") as f:
          result["log_tail"] = f.read()[-3000:]
    print(f"{row.label}: {result['status']} ({result['wall_s']:.0f} s) {result['error']}"[:200],
          file=sys.stderr, flush=True)
    results.append(result)
  return results


COLUMNS = (("attention", 9), ("B", 4), ("pk", 2), ("fill", 4), ("remat", 5), ("prng", 10),
           ("step ms", 8), ("tokens/s", 9), ("MFU", 6), ("plan GiB", 8), ("peak GiB", 8),
           ("compile s", 9), ("init s", 6), ("wall s", 6))


def _cells(r: dict[str, Any]) -> dict[str, str]:
  """A result's table cells by column title ("" where it has no figure)."""
  cells = {"prng": r["prng"], "wall s": f"{r['wall_s']:.0f}"}
  if r["attention"]:  # not an unrolled_init row
    cells.update(attention=r["attention"], B=str(r["batch_size"]), remat=r["remat"],
                 pk=str(r["packing"]) if r["packing"] or r["status"] == "ok" else "")
  if r["status"] == "ok" and r.get("init_compile_s") is not None:
    cells["init s"] = f"{r['init_compile_s']:.1f}"
  if r["status"] == "ok" and r["attention"]:
    cells.update({
        "fill": f"{100 * r['fill']:.0f}%",
        "step ms": f"{r['step_ms']:.2f}", "tokens/s": f"{r['tokens_per_s']:.0f}",
        "MFU": "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
        "plan GiB": f"{r['compiled_memory']['total'] / 2**30:.2f}",
        "peak GiB": f"{r['peak_memory_bytes'] / 2**30:.2f}",
        "compile s": f"{r['step_compile_s']:.1f}"})
  return cells


def format_table(results: Sequence[dict[str, Any]], environment: dict[str, Any],
                 args: argparse.Namespace) -> str:
  """The results as one fixed-width table, then what the columns mean."""
  width = max(len("row"), *(len(r["label"]) for r in results))
  header = " ".join([f"{'row':<{width}}"] + [
      f"{title:<{size}}" if title in ("attention", "remat", "prng") else f"{title:>{size}}"
      for title, size in COLUMNS]) + "  status"
  lines = [header, "-" * len(header)]
  for r in results:
    cells = _cells(r)
    lines.append(" ".join([f"{r['label']:<{width}}"] + [
        f"{cells.get(title, ''):<{size}}" if title in ("attention", "remat", "prng")
        else f"{cells.get(title, ''):>{size}}" for title, size in COLUMNS])
        + f"  {r['status']}{': ' + r['error'] if r['error'] else ''}"[:len(header) + 160])
  e = environment
  lines.append(f"{e['devices']} x {e['device']} ({e['platform']}); jax {e['jax']}, jaxlib "
               f"{e['jaxlib']}, Python {e['python']}; {args.dtype}, the fast recipe (BERT: "
               "AdamW, hidden dropout 0.1; ModernBERT: StableAdamW) on real rows of the bundled "
               f"corpus{'; BERT-tiny sizes (--smoke)' if args.smoke else ''}; {args.steps} steps "
               "a row.")
  lines.append("pk: pairs a row at most; fill: real tokens / slots; tokens/s: real tokens, steps "
               "back to back; MFU: model FLOPs of the real work / step / the device's dense "
               "peak; plan: XLA's memory plan of the train step; "
               "peak: the row process's peak; compile s: the train step's; init s: the "
               "parameter init's (kernel-lowered threefry; unrolled_init rows: unrolled).")
  return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.accelerator_report",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--budget_s", type=float, default=500,
                      help="seconds for everything, compiles included")
  parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                      help="comma-separated row labels, in the order to run them")
  parser.add_argument("--json", default="", help="also write the results to this JSON file")
  parser.add_argument("--steps", type=int, default=10, help="timed steps a row")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps a row first")
  parser.add_argument("--dtype", default="bfloat16", help="compute dtype: bfloat16 or float32")
  parser.add_argument("--min_row_s", type=float, default=None,
                      help="a row starts only with this many seconds of the budget left "
                      "(default 60; 5 with --smoke)")
  parser.add_argument("--wheels", default="",
                      help="install the missing packages from this directory (offline)")
  parser.add_argument("--smoke", action="store_true",
                      help="every row at BERT-tiny sizes: the command end to end on a CPU")
  parser.add_argument("--download_wheels", default="", metavar="DIR",
                      help="only fetch the wheels an offline machine needs into DIR")
  parser.add_argument("--python_version", default="3.12",
                      help="the offline machine's Python, for --download_wheels")
  parser.add_argument("--ab", nargs=argparse.REMAINDER, default=None, metavar="AB_FLAGS",
                      help="instead of the table, run `python -m bertjax.tools.ab AB_FLAGS` with "
                      "the --wheels on its path (the flags after --ab are its own)")
  return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Parses the flags, runs the rows within the budget, prints the table (and writes --json)."""
  start = time.perf_counter()
  args = _parser().parse_args(argv)
  try:
    if args.download_wheels:
      download_wheels(args.download_wheels, args.python_version)
      return []
    if args.ab is not None:  # one process: the A/B, on this machine's packages and the wheels
      if args.wheels:
        install_missing(args.wheels)
      os.execve(sys.executable, [sys.executable, "-m", "bertjax.tools.ab", *args.ab],
                row_env(args.wheels))
    rows = [parse_row(label) for label in args.rows.split(",") if label.strip()]
    if not rows:
      raise UserError("--rows is empty; give row labels, e.g. base128-fused-b128.")
    if args.dtype not in ("bfloat16", "float32"):
      raise UserError(f"unknown --dtype {args.dtype!r}; use bfloat16 or float32.")
    if args.steps < 1 or args.warmup < 1:
      raise UserError(f"--steps={args.steps} --warmup={args.warmup}; use 1 or more of each.")
    if args.min_row_s is None:
      args.min_row_s = 5 if args.smoke else 60
    if args.smoke:
      rows = [smoke(row) for row in rows]
    installed = install_missing(args.wheels) if args.wheels else []
    if installed:
      print(f"installed into {args.wheels}/site: {', '.join(installed)}", file=sys.stderr)
    env = row_env(args.wheels)
    with tempfile.TemporaryDirectory(prefix="accelerator_report") as scratch:
      environment = probe(env, scratch)
      results = run_rows(rows, args, env, environment["platform"], start + args.budget_s,
                         scratch)
  except UserError as e:
    print(f"bertjax.tools.accelerator_report: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(format_table(results, environment, args))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(dict(environment=environment, budget_s=args.budget_s,
                     wall_s=time.perf_counter() - start, rows=results), f, indent=2)
      f.write("\n")
  return results


if __name__ == "__main__":
  main()
