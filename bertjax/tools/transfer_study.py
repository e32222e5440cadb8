"""Does pretraining help? One pretraining run, its transformers twin and a random model, each
fine-tuned on the movie reviews at several label counts and seeds.

  python -m bertjax.tools.transfer_study --pretrained=WORKDIR --out=DIR [--labels=250,1000,0]
      [--seeds=0,1,2] [--learning_rate=3e-4] [--epochs=10] [--all_epochs=3] [--reference=true]
      [--pooling=mean]

WORKDIR is a bertjax pretraining run (README command 1's /tmp/bertjax_tiny). In DIR:
1. `reference/`: transformers' model pretrained by torch on the same batches with the same recipe
   (`python -m bertjax.tools.torch_pretraining`), then `reference_model/`, converted to bertjax
   (`python -m bertjax.convert --from=hf`); skipped with --reference=false;
2. `random_init/`: the same shape and vocabulary, randomly initialised
   (`real_text_demo.make_random_init`);
3. `sst2_N/`: the bundled movie reviews with N training sentences (0: all 9,568) and the same
   1,000 dev sentences;
4. `ft_MODEL_N_sSEED/`: `configs/glue.py --config.task=sst2` from each model, at
   --learning_rate for --epochs epochs (--all_epochs with every label), seed SEED; a ModernBERT
   run's heads read --pooling ('cls' or 'mean'; unset: what the model was pretrained with).
Each command is printed before it runs, and a rerun skips what is done. DIR/transfer.json holds
every dev accuracy, and the table printed last gives each model's mean (and each seed's) per
label count, with the held-out pretraining metrics of both pretrained models.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from bertjax.modeldir import model_files
from bertjax.data.finetuning import movie_reviews
from bertjax.tools import real_text_demo, torch_pretraining

RESULTS_FILE = "transfer.json"


def _python(module: str, args: list[str]) -> None:
  """Runs `python -m MODULE ARGS` (printed first); stops the study if it fails."""
  print(f"$ python -m {module} " + " ".join(args), flush=True)
  if subprocess.run([sys.executable, "-m", module, *args], check=False).returncode:
    raise SystemExit("transfer_study: the command above failed; fix it and rerun.")


def models(pretrained: str, out: str, reference: bool) -> dict[str, str]:
  """{name: model directory}: bertjax's run, transformers' twin (with `reference`), random."""
  found = {"bertjax": pretrained}
  if reference:
    hf_dir, converted = os.path.join(out, "reference"), os.path.join(out, "reference_model")
    if not os.path.exists(os.path.join(hf_dir, torch_pretraining.EVAL_FILE)):
      _python("bertjax.tools.torch_pretraining", [f"--workdir={pretrained}", f"--out={hf_dir}"])
    if not os.path.exists(converted):
      _python("bertjax.convert", ["--from=hf", f"--src={hf_dir}", f"--dst={converted}"])
    found["transformers"] = converted
  random_dir = os.path.join(out, "random_init")
  real_text_demo.make_random_init(pretrained, random_dir)
  found["random"] = random_dir
  return found


def fine_tune(model_dir: str, glue_dir: str, workdir: str, seed: int, learning_rate: float,
              epochs: float, pooling: str = "") -> float:
  """The last dev accuracy of one sst2 fine-tuning (run unless `workdir` has one); `pooling`
  ("": the model's) is what a ModernBERT head reads."""
  if not real_text_demo.dev_accuracies(workdir):
    _python("bertjax.main", [
        "--config=configs/glue.py", "--config.task=sst2", f"--workdir={workdir}",
        f"--config.init_checkpoint={model_dir}", f"--config.data.glue_dir={glue_dir}",
        f"--config.seed={seed}", f"--config.train.learning_rate={learning_rate}",
        f"--config.train.num_train_epochs={epochs}", "--config.train.eval_every_steps=1000000",
        *([f"--config.model.pooling={pooling}"] if pooling else [])])
  return real_text_demo.dev_accuracies(workdir)[-1][1]


def table(results: dict) -> str:
  """Markdown: a row per model, a column per label count: mean dev accuracy (each seed's)."""
  counts = sorted({int(n) for r in results["runs"].values() for n in r}, key=lambda n: n or 1e9)
  lines = ["| model | " + " | ".join(f"{n or 'all'} labels" for n in counts) + " |",
           "|---|" + "---:|" * len(counts)]
  for name, runs in results["runs"].items():
    cells = []
    for n in counts:
      accuracies = [100 * a for a in runs.get(str(n), {}).values()]
      cells.append(f"**{np.mean(accuracies):.1f}%** ("
                   + ", ".join(f"{a:.1f}" for a in accuracies) + ")" if accuracies else "")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  found = models(os.path.abspath(args.pretrained), out, args.reference)
  results = {"held_out": {"bertjax": real_text_demo.held_out(args.pretrained)}, "runs": {}}
  if args.reference:
    with open(os.path.join(out, "reference", torch_pretraining.EVAL_FILE), encoding="utf-8") as f:
      results["held_out"]["transformers"] = json.load(f)
  for n in args.labels:
    glue_dir = os.path.join(out, f"sst2_{n}")
    if not os.path.exists(os.path.join(glue_dir, "SST-2", "dev.tsv")):
      movie_reviews.write_sst2(glue_dir, num_train=n or None)
    for name, model_dir in found.items():
      for seed in args.seeds:
        accuracy = fine_tune(model_dir, glue_dir, os.path.join(out, f"ft_{name}_{n}_s{seed}"),
                             seed, args.learning_rate, args.epochs if n else args.all_epochs,
                             args.pooling)
        results["runs"].setdefault(name, {}).setdefault(str(n), {})[str(seed)] = accuracy
        with open(os.path.join(out, RESULTS_FILE), "w", encoding="utf-8") as f:
          json.dump(results, f, indent=2)
  print(table(results))
  print("held-out pretraining metrics: " + json.dumps(results["held_out"]))
  return results


def _ints(value: str) -> list[int]:
  return [int(v) for v in value.split(",") if v.strip()]


def make_parser() -> argparse.ArgumentParser:
  """The command line of the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.transfer_study",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--pretrained", required=True, help="a bertjax pretraining workdir")
  parser.add_argument("--out", required=True, help="where every run goes")
  parser.add_argument("--labels", type=_ints, default=[250, 1000, 0],
                      help="training sentences per fine-tuning (0: all)")
  parser.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="fine-tuning seeds")
  parser.add_argument("--learning_rate", type=float, default=3e-4)
  parser.add_argument("--epochs", type=float, default=10.0, help="epochs with fewer labels")
  parser.add_argument("--all_epochs", type=float, default=3.0, help="epochs with every label")
  parser.add_argument("--reference", type=lambda v: v.lower() == "true", default=True,
                      help="also pretrain transformers' twin (true/false)")
  parser.add_argument("--pooling", default="", choices=["", "cls", "mean"],
                      help="what a ModernBERT model's classifier reads ('': as pretrained)")
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = make_parser()
  args = parser.parse_args(argv)
  if not os.path.isfile(os.path.join(args.pretrained, "eval_results.json")):
    parser.error(f"--pretrained={args.pretrained} has no eval_results.json: give a finished "
                 "bertjax pretraining workdir")
  if args.pooling == "mean" and not model_files.load_bert_config(args.pretrained).is_modernbert:
    parser.error(f"--pooling=mean: {args.pretrained} is a BERT run, whose heads read [CLS] "
                 "through its pooler; leave --pooling out")
  run(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
