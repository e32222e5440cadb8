"""`python -m bertjax.tools.tpu_table`: docs/accelerators.md's TPU table, each recipe's train step
compiled ahead of time by XLA's TPU compiler for v5e and v5p slices, on this CPU.

  .tpu-venv/bin/python -m bertjax.tools.tpu_table [--rows=LABEL,...] [--json=OUT.json]

(a Python with libtpu: `python -m bertjax.tools.tpu_target --venv=.tpu-venv` makes one). Each
row is a recipe's config as a run trains it (`bertjax.tools.audit.audit`: the trainer's own
train step, a random batch of the config's shapes, the config's mesh) on a slice's chips, with
the recipe's global batch split over them (and over `train.grad_accum_steps` micro-batches where
a chip would not hold its whole share); it prints, per chip, the memory XLA's TPU compiler plans
against the chip's HBM, the bytes each kind of collective moves, and the compile's seconds.
The rows are `ROWS`; compiles take minutes each on two cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Sequence

from bertjax.configs import base, large, modernbert
from bertjax.errors import UserError
from bertjax.tools import audit, tpu_target


@dataclasses.dataclass(frozen=True)
class Row:
  """One recipe on one slice."""
  label: str
  recipe: str  # the --config it is
  slice: str  # tpu_target.SLICES
  fsdp: int = 1  # config.mesh.fsdp (the rest is data)
  grad_accum_steps: int = 1
  long: bool = False  # the recipe's long phase (data.long_seq_length), not its first


_CONFIGS = {"configs/base.py:fast": lambda: base.get_config("fast"),
            "configs/large.py:fast": lambda: large.get_config("fast"),
            "configs/modernbert.py:base": lambda: modernbert.get_config("base")}

ROWS = (
    Row("base-v5e8", "configs/base.py:fast", "v5e-8"),
    Row("base-v5p8", "configs/base.py:fast", "v5p-8"),
    Row("large-v5e8", "configs/large.py:fast", "v5e-8"),
    Row("large-v5p8", "configs/large.py:fast", "v5p-8"),
    Row("large-v5p64-fsdp", "configs/large.py:fast", "v5p-64", fsdp=32),
    Row("large512-v5e8", "configs/large.py:fast", "v5e-8", grad_accum_steps=4, long=True),
    Row("large512-v5p8", "configs/large.py:fast", "v5p-8", long=True),
    Row("modernbase-v5e8", "configs/modernbert.py:base", "v5e-8", grad_accum_steps=36),
    Row("modernbase-v5p8", "configs/modernbert.py:base", "v5p-8", grad_accum_steps=18),
    Row("modernbase-v5p64-fsdp", "configs/modernbert.py:base", "v5p-64", fsdp=32,
        grad_accum_steps=2),
)


def config_of(row: Row):
  """The row's ConfigDict: its recipe's first phase, or its long one (its length, predictions
  and rows as the first), on the row's mesh and micro-batches."""
  config = _CONFIGS[row.recipe]()
  data, tr = config.data, config.train
  if row.long:
    data.max_seq_length, data.max_predictions_per_seq = (data.long_seq_length,
                                                         data.long_max_predictions_per_seq)
    tr.batch_size = tr.long_batch_size or tr.batch_size
  data.long_seq_length = 0
  config.mesh.fsdp = row.fsdp
  config.train.grad_accum_steps = row.grad_accum_steps
  return config


def measure(row: Row) -> dict[str, Any]:
  """The row's train step compiled for its slice: audit's report and the row's shapes."""
  config = config_of(row)
  devices = tpu_target.devices(tpu_target.parse(f"tpu:{row.slice}"))
  result = audit.audit(config, devices, ("train",))
  chips = len(devices)
  tr = config.train
  return dict(dataclasses.asdict(row), chips=chips, device=result["device"],
              seq_len=config.data.max_seq_length, batch_size=tr.batch_size,
              rows_per_chip=tr.batch_size // chips // tr.grad_accum_steps,
              hbm_bytes=result["hbm_bytes"], parameter_bytes=result["parameter_bytes"],
              mesh=result["mesh"], **result["train"])


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
  """The rows as docs/accelerators.md's markdown table."""
  lines = ["| recipe | slice (mesh) | seq | rows a chip (x micro-batches) | memory a chip, GiB "
           "| of HBM | collectives a step, MB a chip | compile s |",
           "|---|---|---:|---|---:|---:|---|---:|"]
  for r in rows:
    mesh = " x ".join(f"{axis} {size}" for axis, size in r["mesh"].items() if size > 1)
    rows_per_chip = f"{r['rows_per_chip']}" + (
        f" x {r['grad_accum_steps']}" if r["grad_accum_steps"] > 1 else "")
    moved = ", ".join(f"{c['kind']} {c['nbytes'] / 1e6:,.0f}" for c in r["collectives"]
                      if c["nbytes"] >= 1e6) or "none over 1 MB"
    total = r["memory"]["total"]
    lines.append(f"| `{r['recipe']}` | {r['slice']} ({mesh}) | {r['seq_len']:,} | "
                 f"{rows_per_chip} | {total / 2**30:.2f} | {total / r['hbm_bytes']:.0%} | "
                 f"{moved} | {r['compile_s']:.0f} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.tpu_table", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", default=",".join(r.label for r in ROWS),
                      help="comma-separated labels of ROWS (default: all)")
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  args = parser.parse_args(argv)
  by_label = {r.label: r for r in ROWS}
  labels = [part for part in args.rows.split(",") if part]
  results = []
  try:
    for label in labels:
      if label not in by_label:
        raise UserError(f"unknown --rows entry {label!r}; use one or more of "
                        f"{','.join(by_label)}.")
    for label in labels:
      results.append(measure(by_label[label]))
      print(format_rows(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
  except UserError as e:
    print(f"bertjax.tools.tpu_table: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(format_rows(results))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)
  return results


if __name__ == "__main__":
  main()
