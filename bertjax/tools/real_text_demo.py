"""The real-text demo: pretrain on the bundled corpus, fine-tune on real movie reviews.

  python -m bertjax.tools.real_text_demo --workdir=DIR [--pretrain_steps=2000] [--epochs=3]
      [--learning_rate=3e-4] [--num_train=N] [--num_dev=1000]

Runs bertjax's own commands (`python -m bertjax.main`, each in a subprocess, each printed before
it runs) in DIR:

1. the bundled movie-review sentences as SST-2 files (`bertjax.data.finetuning.movie_reviews`: 9,568
   training and 1,000 dev sentences, labelled by the sign of their human rating) in
   DIR/movie_reviews;
2. three pretrainings of the tiny BERT (`configs/tiny.py`) on the bundled corpus, the paper's
   ablations of section 5.1 at demo scale: MLM + NSP (DIR/pretrain_full), MLM alone on
   contiguous text (No NSP, DIR/pretrain_no_nsp) and a left-to-right LM (LTR, DIR/pretrain_ltr);
   and the tiny ModernBERT (`configs/modernbert.py`: MLM alone, 30% masked; its decay over the
   last fifth of the steps) in DIR/pretrain_modernbert;
3. a randomly initialised model of the same shape and vocabulary (DIR/random_init);
4. the same fine-tuning (`configs/glue.py`, task sst2) from each of those, and from the LTR model
   with a randomly initialised BiLSTM on top (`model.bilstm_on_top`, Table 5's last row), in
   DIR/finetune_{full,no_nsp,ltr,ltr_bilstm,random}.

Then it writes DIR/demo_results.json (each fine-tuning's dev accuracy, its best and the held-out
metrics of its pretraining), prints them as a table, and draws DIR/demo.png: the dev accuracy of
each fine-tuning against its steps, and the last ones side by side. A rerun of the same command
resumes: each run's workdir resumes from its checkpoint, and a finished one ends at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np

from bertjax.modeldir import model_files
from bertjax.data.finetuning import movie_reviews
from bertjax.models import heads
from bertjax.training import curves
from bertjax.workdir import EVAL_RESULTS_FILE

RESULTS_FILE = "demo_results.json"
FIGURE_FILE = "demo.png"


@dataclasses.dataclass(frozen=True)
class Pretraining:
  """One pretraining of the ablation: its name and the flags that make it differ."""
  name: str
  label: str
  flags: tuple[str, ...]
  config: str = "configs/tiny.py"


PRETRAININGS = (
    Pretraining("full", "MLM + NSP (BERT)", ()),
    Pretraining("no_nsp", "No NSP", ("--config.pretraining.nsp=false",)),
    Pretraining("ltr", "LTR & No NSP", ("--config.pretraining.objective=ltr",)),
    Pretraining("modernbert", "ModernBERT", (), config="configs/modernbert.py"),
)


@dataclasses.dataclass(frozen=True)
class FineTuning:
  """One fine-tuning: its name, legend, the model it starts from and its extra flags."""
  name: str
  label: str
  start: str  # a pretraining's name, or "random"
  flags: tuple[str, ...] = ()


FINE_TUNINGS = (
    FineTuning("full", "MLM + NSP (BERT)", "full"),
    FineTuning("no_nsp", "No NSP", "no_nsp"),
    FineTuning("ltr", "LTR & No NSP", "ltr"),
    FineTuning("ltr_bilstm", "LTR & No NSP + BiLSTM", "ltr",
               ("--config.model.bilstm_on_top=true",)),
    FineTuning("modernbert", "ModernBERT (MLM alone)", "modernbert"),
    FineTuning("random", "no pretraining (random init)", "random"),
)


def run_command(args: Sequence[str]) -> None:
  """Runs `python -m bertjax.main ARGS` (printed first); stops the demo if it fails."""
  command = [sys.executable, "-m", "bertjax.main", *args]
  print("$ python -m bertjax.main " + " ".join(args), flush=True)
  if subprocess.run(command, check=False).returncode:
    raise SystemExit("bertjax.tools.real_text_demo: the command above failed; fix it and rerun the "
                     "same demo command (finished runs are kept).")


def make_random_init(pretrained: str, out_dir: str, seed: int = 0) -> None:
  """A model directory with the model and tokenizer of the pretraining workdir `pretrained`
  and randomly initialised parameters (the model's own initialiser; a ModernBERT without the
  NSP head it never has), as `init_checkpoint` takes."""
  if os.path.exists(os.path.join(out_dir, model_files.BERT_CONFIG_FILE)):
    return
  config = model_files.load_bert_config(pretrained)
  ids = np.zeros((1, 8), np.int32)
  model = heads.BertForPreTraining(config, next_sentence=not config.is_modernbert)
  params = model.init(jax.random.PRNGKey(seed), ids, ids, ids, deterministic=True)["params"]
  model_files.save_model_dir(out_dir, jax.tree.map(np.asarray, nn.unbox(params)), config,
                             model_files.tokenizer_files(pretrained))


def dev_accuracies(workdir: str) -> list[tuple[int, float]]:
  """(step, dev accuracy) of each evaluation of a fine-tuning workdir."""
  return [(r["step"], float(r["accuracy"])) for r in curves.read_records(workdir)
          if r.get("split") == "eval" and "accuracy" in r]


def held_out(workdir: str) -> dict[str, float]:
  """The last evaluation of a pretraining workdir (its eval_results.json without the step)."""
  with open(os.path.join(workdir, EVAL_RESULTS_FILE), encoding="utf-8") as f:
    results = json.load(f)
  return {k: v for k, v in results.items() if isinstance(v, (int, float)) and k != "step"}


def results_table(results: dict[str, dict]) -> str:
  """The fine-tunings' figures as a Markdown table."""
  lines = ["| fine-tuned from | dev accuracy (last) | best dev accuracy (step) |",
           "|---|---:|---:|"]
  for r in results.values():
    lines.append(f"| {r['label']} | {100 * r['dev_accuracy']:.1f}% | "
                 f"{100 * r['best_dev_accuracy']:.1f}% ({r['best_step']}) |")
  return "\n".join(lines)


def draw(results: dict[str, dict], path: str) -> None:
  """DIR/demo.png: dev accuracy against fine-tuning steps per run, and the last ones as bars."""
  # Imported here: matplotlib stays off the demo's path until the figure is drawn.
  # pylint: disable=import-outside-toplevel
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  figure = Figure(figsize=(11, 4.2), layout="constrained")
  curves_axes, bars = figure.subplots(1, 2, width_ratios=(3, 2))
  for r in results.values():
    steps, accuracies = zip(*r["curve"])
    curves_axes.plot(steps, [100 * a for a in accuracies], marker="o", label=r["label"])
  curves_axes.set(xlabel="fine-tuning step", ylabel="dev accuracy (%)",
                  title="Movie reviews (SST-2 format), dev accuracy")
  curves_axes.legend(fontsize="small")
  curves_axes.grid(alpha=0.3)
  labels = [r["label"] for r in results.values()]
  values = [100 * r["dev_accuracy"] for r in results.values()]
  bars.barh(range(len(values)), values, color=[f"C{i}" for i in range(len(values))])
  bars.set_yticks(range(len(values)), labels, fontsize="small")
  bars.invert_yaxis()
  for i, value in enumerate(values):
    bars.text(value, i, f" {value:.1f}", va="center", fontsize="small")
  bars.set(xlabel="dev accuracy after fine-tuning (%)", xlim=(0, 100), title="Last evaluation")
  FigureCanvasAgg(figure).print_png(path)


def run(args: argparse.Namespace) -> dict[str, dict]:
  """All the runs of the demo (module docstring), then its results, table and figure."""
  directory = os.path.abspath(args.workdir)
  glue_dir = os.path.join(directory, "movie_reviews")
  if not os.path.exists(os.path.join(glue_dir, "SST-2", "dev.tsv")):
    movie_reviews.write_sst2(glue_dir, num_dev=args.num_dev, num_train=args.num_train)
  for p in PRETRAININGS:
    decay = ([f"--config.train.decay_steps={args.pretrain_steps // 5}"]
             if p.config == "configs/modernbert.py" else [])  # warmup-stable-decay
    run_command([f"--config={p.config}", f"--workdir={directory}/pretrain_{p.name}",
                 f"--config.train.num_train_steps={args.pretrain_steps}",
                 f"--config.train.warmup_steps={max(1, args.pretrain_steps // 10)}", *decay,
                 *p.flags])
  make_random_init(os.path.join(directory, "pretrain_full"),
                   os.path.join(directory, "random_init"))
  results = {}
  for f in FINE_TUNINGS:
    start = (os.path.join(directory, "random_init") if f.start == "random"
             else os.path.join(directory, f"pretrain_{f.start}"))
    workdir = os.path.join(directory, f"finetune_{f.name}")
    run_command(["--config=configs/glue.py", "--config.task=sst2", f"--workdir={workdir}",
                 f"--config.init_checkpoint={start}", f"--config.data.glue_dir={glue_dir}",
                 f"--config.train.learning_rate={args.learning_rate}",
                 f"--config.train.num_train_epochs={args.epochs}",
                 f"--config.train.eval_every_steps={args.eval_every_steps}", *f.flags])
    curve = dev_accuracies(workdir)
    best_step, best = max(curve, key=lambda point: point[1])
    results[f.name] = dict(
        label=f.label, dev_accuracy=curve[-1][1], best_dev_accuracy=best, best_step=best_step,
        curve=curve, pretraining=None if f.start == "random" else held_out(
            os.path.join(directory, f"pretrain_{f.start}")))
  with open(os.path.join(directory, RESULTS_FILE), "w", encoding="utf-8") as out:
    json.dump(results, out, indent=2)
  draw(results, os.path.join(directory, FIGURE_FILE))
  print(results_table(results))
  return results


def make_parser() -> argparse.ArgumentParser:
  """The command line of the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.real_text_demo",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="where every run goes")
  parser.add_argument("--pretrain_steps", type=int, default=2000,
                      help="steps of each pretraining (configs/tiny.py's)")
  parser.add_argument("--epochs", type=float, default=3.0, help="fine-tuning epochs")
  parser.add_argument("--learning_rate", type=float, default=3e-4,
                      help="fine-tuning peak learning rate")
  parser.add_argument("--eval_every_steps", type=int, default=100,
                      help="fine-tuning steps between dev evaluations")
  parser.add_argument("--num_train", type=int, default=None,
                      help="training sentences (default: all 9,568)")
  parser.add_argument("--num_dev", type=int, default=movie_reviews.NUM_DEV,
                      help="dev sentences")
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = make_parser()
  args = parser.parse_args(argv)
  for name in ("pretrain_steps", "epochs", "learning_rate", "eval_every_steps", "num_dev"):
    if getattr(args, name) <= 0:
      parser.error(f"--{name}={getattr(args, name)} must be positive")
  run(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
