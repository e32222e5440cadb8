"""Fine-tuning's model selection as the paper makes it (section 4): one run per learning rate and
seed, the best picked on dev by the task's main metric.

  python -m bertjax.tools.sweep --config=configs/glue.py --config.task=rte \
      --learning_rates=5e-5,4e-5,3e-5,2e-5 --seeds=0,1,2 --workdir=DIR [--config.KEY=VALUE ...]

Each combination is the run `python -m bertjax.main` makes with the same flags plus
--config.train.learning_rate=X --config.seed=Y, in DIR/lr_X_seed_Y (X as %g writes it:
DIR/lr_5e-05_seed_0), through the same code (`bertjax.main.run_task`). The runs go one after
another in this process: no interpreter start-up and imports per run, and one error stops the
sweep at once; each run still builds its own model, data and compiled steps.

The sweep then writes
  DIR/sweep_results.json  the task, its main metric (`Spec.main_metric`, as each run recorded it
                          in its eval_results.json), every run (learning rate, seed, directory,
                          step, its dev metrics, its main metric's value as "score"), per
                          learning rate the mean, the sample standard deviation and the best
                          score over the seeds, and the best run;
  DIR/best                a relative symbolic link to the best run's directory, replaced
                          atomically;
and prints the same as a table. The best run has the highest score (every main metric is higher
is better); a tie goes to the first in the order of the flags, and NaN (the correlation of
constant predictions) never wins.

Rerunning the same command skips every finished run (its eval_results.json and its newest
checkpoint are both of the run's last step) without touching its files, resumes an interrupted
one from its checkpoint, and starts the rest. A run directory made with other settings (any
config field the run recorded in its config.json, but train.stop_after_steps and the fields a
run derives at its start) is refused before anything runs, rather than mixed in. SIGTERM or
SIGINT stops the run in progress with a checkpoint, as in bertjax.main, and the sweep with it;
--config.train.stop_after_steps=N stops every run at step N and goes on to the next (a
time-boxed sweep; rerun without it to finish).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging

from bertjax import tasks, workdir
from bertjax.training import checkpoint, distributed
from bertjax import main as bertjax_main
from bertjax.errors import UserError

_LEARNING_RATES = flags.DEFINE_list(
    "learning_rates", None, "Peak learning rates to try, e.g. 5e-5,4e-5,3e-5,2e-5 (the paper's).")
_SEEDS = flags.DEFINE_list(
    "seeds", ["0"], "Seeds (head initialisation, dropout, data order) to run each learning rate "
    "with, e.g. 0,1,2 (random restarts).")
flags.mark_flags_as_required(["learning_rates"])

RESULTS_FILE = "sweep_results.json"
BEST_LINK = "best"
# Config fields a run sets at its start when they are -1 (`finetuning.schedule`): the
# config.json of a run holds the derived value, not the -1 asked for.
DERIVED_FIELDS = ("train.num_train_steps", "train.warmup_steps", "train.eval_every_steps",
                  "train.checkpoint_every_steps")
# Config fields that may change between reruns of a sweep.
FREE_FIELDS = ("train.stop_after_steps",)
# Config fields the sweep sets itself, per run.
SWEPT_FIELDS = ("train.learning_rate", "seed")


def _parse_distinct(values: Sequence[str], flag: str, convert, valid, what: str,
                    example: str) -> list:
  """`values` converted, each checked by `valid` and given once (UserError naming `flag`)."""
  parsed = []
  for value in values:
    try:
      item = convert(value)
    except ValueError:
      item = None
    if item is None or not valid(item):
      raise UserError(f"{flag}: {value!r} is not {what}; give e.g. {flag}={example}.")
    if item in parsed:
      raise UserError(f"{flag}: {value} is given twice; give each once.")
    parsed.append(item)
  if not parsed:
    raise UserError(f"{flag} is empty; give e.g. {flag}={example}.")
  return parsed


def parse_learning_rates(values: Sequence[str]) -> list[float]:
  """--learning_rates' values as floats (UserError unless each is a positive number, once)."""
  return _parse_distinct(values, "--learning_rates", float,
                         lambda rate: math.isfinite(rate) and rate > 0, "a positive number",
                         "5e-5,4e-5,3e-5,2e-5")


def parse_seeds(values: Sequence[str]) -> list[int]:
  """--seeds' values as ints (UserError unless each is an integer >= 0, once)."""
  return _parse_distinct(values, "--seeds", int, lambda seed: seed >= 0, "an integer >= 0",
                         "0,1,2")


def run_name(learning_rate: float, seed: int) -> str:
  """The directory of a run in the sweep's workdir, e.g. lr_5e-05_seed_0."""
  return f"lr_{learning_rate:g}_seed_{seed}"


def run_config(config: ml_collections.ConfigDict, learning_rate: float,
               seed: int) -> ml_collections.ConfigDict:
  """A copy of the sweep's config for one run: its learning rate and seed set."""
  config = copy.deepcopy(config)
  config.train.learning_rate = learning_rate
  config.seed = seed
  return config


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{"train.learning_rate": value, ...} of a nested dict."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for key, value in tree.items():
    out.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
  return out


def _read_json(path: str) -> Any:
  """A JSON file's content; None if it is missing or does not parse (a crash mid-write)."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def settings_differences(directory: str, config: ml_collections.ConfigDict) -> list[str]:
  """"field: was A, now B" for each config field the run in `directory` recorded (config.json)
  with another value than `config` asks; [] for a run not started yet. Fields the run derives
  (DERIVED_FIELDS, when asked as -1) and FREE_FIELDS are not compared."""
  recorded = _read_json(os.path.join(directory, workdir.CONFIG_FILE))
  if not isinstance(recorded, dict):
    return []
  recorded = _leaves(recorded)
  asked = _leaves(json.loads(config.to_json_best_effort()))
  return [f"{key}: was {recorded[key]!r}, now {value!r}" for key, value in asked.items()
          if key in recorded and recorded[key] != value and key not in FREE_FIELDS
          and not (key in DERIVED_FIELDS and value == -1)]


@dataclasses.dataclass(frozen=True)
class Progress:
  """How far a run directory got.

  Attributes:
    num_train_steps: the run's last step (its config.json); None if it never started.
    checkpoint_step: its newest checkpoint's step; None if none.
    eval_results: its eval_results.json (the last evaluation); None if none.
  """
  num_train_steps: int | None
  checkpoint_step: int | None
  eval_results: dict[str, Any] | None

  @property
  def finished(self) -> bool:
    """The last step was evaluated and saved. (eval_results.json is written before the last
    checkpoint, so a run stopped between the two has the evaluation but not the checkpoint: it
    resumes and evaluates again.)"""
    return (self.num_train_steps is not None
            and self.checkpoint_step == self.num_train_steps
            and isinstance(self.eval_results, dict)
            and self.eval_results.get("step") == self.num_train_steps)


def progress(directory: str) -> Progress:
  """The Progress of the run in `directory` (which may not exist)."""
  recorded = _read_json(os.path.join(directory, workdir.CONFIG_FILE))
  steps = recorded.get("train", {}).get("num_train_steps") if isinstance(recorded, dict) else None
  checkpoints = checkpoint.Checkpoints(os.path.join(directory, workdir.CHECKPOINTS_DIR),
                                       save_every_steps=1, keep=None)
  try:
    step = checkpoints.latest_step()
  finally:
    checkpoints.close()
  results = _read_json(os.path.join(directory, workdir.EVAL_RESULTS_FILE))
  return Progress(steps, step, results if isinstance(results, dict) else None)


def _check_best_link(directory: str) -> None:
  """UserError if DIR/best is something else than a symbolic link (it would not be replaced)."""
  path = os.path.join(directory, BEST_LINK)
  if os.path.lexists(path) and not os.path.islink(path):
    raise UserError(f"{path} exists and is not a symbolic link; the sweep links its best run "
                    "there: move it away, or give another --workdir.")


def link_best(directory: str, name: str) -> None:
  """Points DIR/best at DIR/name (a relative link, so DIR may move), replacing an old link in
  one rename."""
  temporary = os.path.join(directory, f".{BEST_LINK}.tmp{os.getpid()}")
  if os.path.lexists(temporary):
    os.remove(temporary)
  os.symlink(name, temporary)
  os.replace(temporary, os.path.join(directory, BEST_LINK))


def _score(value: Any) -> float | None:
  """A metric's value as a float, None if missing or not finite."""
  if isinstance(value, (int, float)) and math.isfinite(value):
    return float(value)
  return None


def summarize(runs: list[dict[str, Any]], learning_rates: Sequence[float]
              ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  """(per learning rate: finished runs, mean, sample std (None below two scores), best score and
  its seed; the best finished run, None if no run has a score). `runs` are the sweep's records
  in flag order, with "score" (None where unscored) and "finished"."""
  rows = []
  for rate in learning_rates:
    scored = [r for r in runs if r["learning_rate"] == rate and r["finished"]
              and r["score"] is not None]
    values = np.array([r["score"] for r in scored], np.float64)
    best = max(scored, key=lambda r: r["score"], default=None)  # first of equal scores
    rows.append({
        "learning_rate": rate,
        "runs": sum(1 for r in runs if r["learning_rate"] == rate and r["finished"]),
        "mean": float(values.mean()) if len(values) else None,
        "std": float(values.std(ddof=1)) if len(values) > 1 else None,
        "best": best["score"] if best else None,
        "best_seed": best["seed"] if best else None})
  scored = [r for r in runs if r["finished"] and r["score"] is not None]
  return rows, max(scored, key=lambda r: r["score"], default=None)


def table(results: dict[str, Any]) -> str:
  """The per-learning-rate lines of sweep_results.json, and the best run, as text."""
  def number(x):
    return "-" if x is None else f"{x:.4f}"

  lines = [f"{results['task']}: {results['main_metric']} on dev, "
           f"{len(results['per_learning_rate'])} learning rates x {len(results['seeds'])} seeds",
           f"{'learning rate':>13} {'runs':>5} {'mean':>8} {'std':>8} {'best':>8}  seed"]
  for row in results["per_learning_rate"]:
    lines.append(f"{row['learning_rate']:>13g} {row['runs']:>5} {number(row['mean']):>8} "
                 f"{number(row['std']):>8} {number(row['best']):>8}  "
                 f"{'-' if row['best_seed'] is None else row['best_seed']}")
  unfinished = [r["directory"] for r in results["runs"] if not r["finished"]]
  if unfinished:
    lines.append(f"unfinished (stopped by train.stop_after_steps; rerun without it): "
                 f"{', '.join(unfinished)}")
  best = results["best"]
  lines.append(f"best: {best['directory']}, {results['main_metric']} {best['score']:.4f}"
               if best else "best: none (no finished run has a score)")
  return "\n".join(lines)


def _write_json(path: str, content: Any) -> None:
  """Writes `content` to `path` whole (a temporary file renamed over it)."""
  temporary = f"{path}.tmp{os.getpid()}"
  with open(temporary, "w", encoding="utf-8") as f:
    f.write(json.dumps(content, indent=2) + "\n")
  os.replace(temporary, path)


def sweep(config: ml_collections.ConfigDict, directory: str, learning_rates: Sequence[float],
          seeds: Sequence[int]) -> dict[str, Any] | None:
  """Runs (or skips, or resumes) every learning rate x seed in `directory` and writes the
  results; returns them (what sweep_results.json holds), or None when a signal stopped a run.

  Raises:
    UserError: a config that is not a fine-tuning one, run directories made with other
      settings or finished without their evaluation, DIR/best not a link, or a run's own error
      (named with the run).
  """
  if config.task not in tasks.FINETUNING:
    raise UserError(f"bertjax.tools.sweep fine-tunes, and config.task={config.task!r} is not a "
                    f"fine-tuning task; give a fine-tuning config (configs/glue.py, ner.py, "
                    f"squad.py, swag.py) or --config.task among {sorted(tasks.FINETUNING)}.")
  grid = [(rate, seed, run_config(config, rate, seed)) for rate in learning_rates
          for seed in seeds]
  for rate, seed, cfg in grid:
    run_dir = os.path.join(directory, run_name(rate, seed))
    differences = settings_differences(run_dir, cfg)
    if differences:
      raise UserError(f"{run_dir} was run with other settings ({'; '.join(differences)}); rerun "
                      "with the settings it was made with, or give another --workdir.")
    done = progress(run_dir)
    if (not done.finished and done.num_train_steps is not None
        and done.checkpoint_step == done.num_train_steps):
      raise UserError(f"{run_dir} holds the checkpoint of its last step but no evaluation of "
                      f"it (eval_results.json); move {os.path.join(run_dir, 'checkpoints')} "
                      "aside to run it again.")
  _check_best_link(directory)
  with workdir.held(directory):  # one sweep at a time on DIR; each run holds its own directory
    records = _run_all(grid, directory, config.train.stop_after_steps)
    if records is None:
      return None
    per_rate, best = summarize(records, learning_rates)
    results = {"task": config.task, "main_metric": records[0]["main_metric"],
               "learning_rates": list(learning_rates), "seeds": list(seeds),
               "per_learning_rate": per_rate, "best": best, "runs": records}
    if jax.process_index() == 0:
      _write_json(os.path.join(directory, RESULTS_FILE), results)
      if best is not None:
        link_best(directory, best["directory"])
  return results


def _run_all(grid: list[tuple[float, int, ml_collections.ConfigDict]], directory: str,
             stop_after: int) -> list[dict[str, Any]] | None:
  """Runs, resumes or skips each (learning rate, seed, config) of `grid`; returns a record
  per run (sweep_results.json's "runs"), or None when a signal stopped a run."""
  records = []
  for i, (rate, seed, cfg) in enumerate(grid):
    name = run_name(rate, seed)
    run_dir = os.path.join(directory, name)
    before = progress(run_dir)
    label = f"[{i + 1}/{len(grid)}] {name}"
    if before.finished:
      print(f"{label}: finished (step {before.num_train_steps}), skipped", flush=True)
    else:
      print(f"{label}: " + (f"resuming from step {before.checkpoint_step}"
                            if before.checkpoint_step else "starting"), flush=True)
      try:
        bertjax_main.run_task(cfg, run_dir)
      except UserError as e:
        raise UserError(f"run {name} ({run_dir}): {e}") from None
    after = progress(run_dir)
    if not after.finished and not (0 <= stop_after <= (after.checkpoint_step or 0)):
      print(f"{name} stopped at step {after.checkpoint_step} of {after.num_train_steps}; "
            "rerun the same command to resume the sweep.", flush=True)
      return None
    results = after.eval_results or {}
    main_metric = (results.get("main_metric")
                   or tasks.FINETUNING[cfg.task].main_metric(tasks.typed(cfg)))
    records.append({
        "learning_rate": rate, "seed": seed, "directory": name, "finished": after.finished,
        "step": results.get("step"), "main_metric": main_metric,
        "score": _score(results.get(main_metric)),
        "metrics": {k: v for k, v in results.items() if k not in ("step", "main_metric")}})
  return records


def _swept_overrides(argv: Sequence[str]) -> list[str]:
  """The --config.KEY overrides in `argv` of fields the sweep sets per run."""
  return [arg.split("=")[0] for arg in argv
          if arg.split("=")[0] in {f"--config.{field}" for field in SWEPT_FIELDS}]


def main(argv: list[str]) -> None:
  config = bertjax_main.parsed_config(argv)
  directory = os.path.abspath(os.path.expanduser(flags.FLAGS.workdir))
  try:
    swept = _swept_overrides(sys.argv[1:])
    if swept:
      raise UserError(f"{', '.join(swept)}: the sweep sets train.learning_rate and seed per run "
                      "from --learning_rates and --seeds; drop the override.")
    learning_rates = parse_learning_rates(_LEARNING_RATES.value)
    seeds = parse_seeds(_SEEDS.value)
    distributed.maybe_initialize_distributed()
    results = sweep(config, directory, learning_rates, seeds)
  except UserError as e:
    bertjax_main.fail(str(e))
  if results is not None and jax.process_index() == 0:
    print(table(results))
    print(f"wrote {os.path.join(directory, RESULTS_FILE)}"
          + (f" and {os.path.join(directory, BEST_LINK)}" if results["best"] else ""))


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main, flags_parser=bertjax_main.parse_flags)
