"""`--compile_for=tpu:SLICE`: the devices of a TPU slice that this machine does not have, to
compile programs for ahead of time, and the virtual environment with the libtpu that does it.

  python -m bertjax.tools.tpu_target --venv=.tpu-venv

makes that environment: a venv with bertjax installed as `pip install -e .` installs it (the
same pins) and libtpu, the version jax's `tpu` extra names (`libtpu_requirement`:
libtpu==0.0.42.* for jax 0.10.2), and pytest (to run tests/test_tpu_target.py there). The main
environment stays without libtpu. Then, in it:

  .tpu-venv/bin/python -m bertjax.tools.bench --compile_for=tpu:v5p-8 --memory_only ...
  .tpu-venv/bin/python -m bertjax.tools.audit --compile_for=tpu:v5p-64 --config=...

compile the train step (and the audit's eval step) with XLA's TPU compiler, on this CPU, for
the slice's chips (`jax.experimental.topologies.get_topology_desc`: libtpu's compile-only
devices, which run nothing), so their memory and collectives are the TPU program's.

SLICE is a Cloud TPU accelerator type of `SLICES` (v5e-8, v5litepod-8, v5p-8, v5p-64, v4-8,
v6e-8, ...; v5p and v4 count TensorCores, two a chip, and v5e and v6e chips) or a topology as
libtpu names it, passed as it is: `v5e:2x4` (chips x by y), `v5p:2x4x4`, `TPU v5 lite:2x2`. A
device is a chip either way (v5p's and v4's two cores work as one: megacore).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from typing import Sequence

from jax.experimental import topologies

from bertjax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTEST = "pytest==9.2.0"  # setup.py's [test] pin
GIB = 2**30
# HBM per chip by jax's device_kind (Cloud TPU's documentation: v4 32 GiB, v5e 16 GiB, v5p 95
# GiB, v6e 32 GiB).
HBM_BYTES = {"TPU v4": 32 * GIB, "TPU v5 lite": 16 * GIB, "TPU v5": 95 * GIB,
             "TPU v6 lite": 32 * GIB}


def _slices() -> dict[str, str]:
  """Cloud TPU accelerator types -> libtpu's topology names (x by y (by z) chips)."""
  flat = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
          256: "16x16"}  # v5e and v6e: chips
  cube = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
          256: "4x8x8"}  # v4 and v5p: chips (the names count cores, two a chip)
  slices = {}
  for chips, shape in flat.items():
    slices[f"v5e-{chips}"] = slices[f"v5litepod-{chips}"] = f"v5e:{shape}"
    slices[f"v6e-{chips}"] = f"v6e:{shape}"
  for chips, shape in cube.items():
    slices[f"v5p-{2 * chips}"] = f"v5p:{shape}"
    slices[f"v4-{2 * chips}"] = f"v4:{shape}"
  return slices


SLICES = _slices()


@dataclasses.dataclass(frozen=True)
class Target:
  """What `--compile_for` names."""
  spec: str  # as given: "tpu:v5p-8"
  topology: str  # libtpu's name: "v5p:2x2x1"


def parse(value: str) -> Target:
  """The target of `--compile_for=tpu:SLICE` (UserError naming the fix where it is not one)."""
  platform, _, name = value.partition(":")
  if platform != "tpu" or not name:
    raise UserError(f"--compile_for={value}: give tpu:SLICE, a Cloud TPU slice such as "
                    f"tpu:v5e-8, tpu:v5p-8 or tpu:v5p-64 (or a libtpu topology: tpu:v5e:2x4).")
  if ":" in name:
    return Target(value, name)
  if name not in SLICES:
    known = ", ".join(n for n in SLICES if not n.startswith("v5litepod"))
    raise UserError(f"--compile_for={value}: unknown TPU slice {name!r}; use one of {known} "
                    "(v5litepod-N is v5e-N), or a libtpu topology such as tpu:v5e:2x4.")
  return Target(value, SLICES[name])


def libtpu_requirement() -> str:
  """The libtpu that jax's `tpu` extra names (e.g. 'libtpu==0.0.42.*')."""
  for requirement in importlib.metadata.requires("jax") or []:
    name, _, marker = requirement.partition(";")
    if name.strip().startswith("libtpu") and "tpu" in marker:
      return name.strip()
  raise UserError("jax's metadata names no libtpu in its tpu extra; install jax[tpu] instead.")


def missing_libtpu(target: Target) -> str:
  """The one-line error where this Python has no libtpu."""
  return (f"--compile_for={target.spec} compiles with libtpu, which this Python "
          f"({sys.executable}) lacks; make an environment with it: python -m "
          "bertjax.tools.tpu_target --venv=.tpu-venv, then run this command with "
          ".tpu-venv/bin/python.")


def devices(target: Target) -> list:
  """The target's compile-only devices (one a chip), from libtpu; UserError where this Python
  has no libtpu or libtpu does not know the topology."""
  if importlib.util.find_spec("libtpu") is None:
    raise UserError(missing_libtpu(target))
  # libtpu looks for a Cloud TPU VM's description when it starts (and prints warnings where
  # there is none); these stand for it, and change nothing that it compiles. Its lock file
  # keeps a second process off a machine's chips; compile-only devices use none, so two
  # processes may compile at once.
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    found = topologies.get_topology_desc(target.topology, platform="tpu").devices
  except Exception as e:  # pylint: disable=broad-except
    # libtpu's own words, e.g. "Invalid TPU external name: TPU bogus", without its trace.
    reason = re.sub(r"\s+", " ", str(e).split("=== Source Location Trace")[0]).strip()
    raise UserError(f"--compile_for={target.spec}: libtpu made no topology "
                    f"{target.topology!r} ({reason}); use a slice such as tpu:v5e-8 or "
                    "tpu:v5p-8, or a topology such as tpu:v5e:2x4.") from None
  assert all(d.platform == "tpu" for d in found), found
  return list(found)


def hbm_bytes(device_kind: str) -> int | None:
  """A chip's HBM (`HBM_BYTES`), None where not known."""
  return HBM_BYTES.get(device_kind)


def venv_commands(venv: str) -> list[list[str]]:
  """The commands that make `venv`: the venv, bertjax with its pins, libtpu, pytest."""
  python = os.path.join(venv, "bin", "python")
  return [[sys.executable, "-m", "venv", venv],
          [python, "-m", "pip", "install", "-e", ROOT, libtpu_requirement(), PYTEST]]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.tpu_target",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--venv", required=True,
                      help="the virtual environment to make (e.g. .tpu-venv, git-ignored)")
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  for command in venv_commands(args.venv):
    print("+", " ".join(command), flush=True)
    if subprocess.run(command, check=False).returncode:
      print(f"bertjax.tools.tpu_target: error: {' '.join(command)} failed (above).",
            file=sys.stderr)
      sys.exit(1)
  print(f"{args.venv} has libtpu; run the TPU compiles with {args.venv}/bin/python -m "
        "bertjax.tools.bench|audit --compile_for=tpu:SLICE ...")


if __name__ == "__main__":
  main()
