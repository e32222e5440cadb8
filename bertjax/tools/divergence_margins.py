"""How close a run came to the divergence guard's spike tests, from what it logged: its training
lines replayed through `bertjax.training.divergence.Guard`.

  python -m bertjax.tools.divergence_margins --workdir=WORKDIR [--window=N] [--loss_zscore=Z]
      [--loss_ratio=R] [--grad_norm_zscore=Z] [--grad_norm_ratio=R]

The tests' settings are the run's (its config.json's divergence section; the defaults for a
run that predates it), each replaced by the flag of its name. A run logged every step
(train.log_every_steps=1) replays exactly the values the guard checked; a line of a longer
interval is that interval's mean, which spikes less. For the loss and for the gradient norm it
prints the steps tested, the margin (the largest value / spike threshold over them: below 1,
nothing fired) and its step, and the first step that would have diverged, if one would.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Mapping, Sequence

from etils import epath

from bertjax import run_config, tasks
from bertjax.errors import UserError
from bertjax.training import curves, divergence
from bertjax.workdir import CONFIG_FILE, METRICS_FILE

SETTINGS = ("window", "loss_zscore", "loss_ratio", "grad_norm_zscore", "grad_norm_ratio")


def margins(records: Sequence[Mapping[str, Any]], config: run_config.Divergence
            ) -> dict[str, Any]:
  """Replays the training `records` (metrics.jsonl lines) in step order: {name: {"tested",
  "margin", "at_step"}} for each spiking value, and "diverged": the first divergence's
  describe() (None if none)."""
  guard = divergence.Guard(config)
  found: dict[str, dict[str, Any]] = {name: {"tested": 0, "margin": 0.0, "at_step": None}
                                      for name in divergence.SPIKING}
  diverged = None
  for record in records:
    if record.get("split") != "train" or not all(k in record for k in divergence.WATCHED):
      continue
    values = {name: float(record[name]) for name in divergence.WATCHED}
    for name in divergence.SPIKING:
      spike = guard.threshold(name)
      if spike is not None and spike[1] > 0:
        found[name]["tested"] += 1
        if values[name] / spike[1] > found[name]["margin"]:
          found[name].update(margin=values[name] / spike[1], at_step=record["step"])
    event = guard.check_values(record["step"], values)
    if event is not None and diverged is None:
      diverged = event.describe()
  return {**found, "diverged": diverged}


def run_settings(workdir: epath.Path) -> run_config.Divergence:
  """The divergence section of the run in `workdir`, typed by its task's schema (that schema's
  defaults where config.json has none, e.g. a run that predates it)."""
  try:
    run = json.loads((workdir / CONFIG_FILE).read_text())
  except (OSError, ValueError):
    run = {}
  task = run.get("task") if isinstance(run, dict) else None
  schema = tasks.REGISTRY[task].schema if task in tasks.REGISTRY else run_config.PretrainingRun
  section = {"divergence": run.get("divergence", {})} if isinstance(run, dict) else {}
  return run_config.typed(section, schema).divergence


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.divergence_margins",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a run's workdir")
  for name in SETTINGS:
    kind = type(getattr(run_config.Divergence(), name))
    parser.add_argument(f"--{name}", type=kind, default=None,
                        help=f"divergence.{name} (default: the run's)")
  args = parser.parse_args(argv)
  try:
    workdir = epath.Path(args.workdir)
    if not (workdir / METRICS_FILE).exists():
      raise UserError(f"{workdir} holds no {METRICS_FILE}; give the --workdir of a run that has "
                      "logged training steps.")
    config = dataclasses.replace(run_settings(workdir), **{
        name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None})
    divergence.check_config(config, num_train_steps=1, checkpoint_every_steps=0)
    result = margins(curves.read_records(workdir), config)
  except UserError as e:
    print(f"bertjax: error: {e}", file=sys.stderr)
    sys.exit(2)
  print("settings: " + ", ".join(f"{name}={getattr(config, name):g}" for name in SETTINGS))
  for name in divergence.SPIKING:
    found = result[name]
    print(f"{name}: {found['tested']} steps tested, margin {found['margin']:.3f}"
          + (f" at step {found['at_step']}" if found["at_step"] is not None else ""))
  print(f"diverged: {result['diverged'] or 'never'}")


if __name__ == "__main__":
  main()
