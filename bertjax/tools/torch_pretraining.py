"""The reference pretraining: transformers' model, trained by torch on bertjax's own batches.

  python -m bertjax.tools.torch_pretraining --workdir=BERTJAX_WORKDIR --out=HF_DIR [--seed=0]

A bertjax pretraining run's recipe (its WORKDIR/config.json) and prepared data (WORKDIR/data, or
the run's data.prepared) are run again by transformers and torch: `BertForPreTraining` (MLM +
NSP; MLM alone for No NSP) or `ModernBertForMaskedLM`, from transformers' own initialisation,
trained on the batches bertjax's trainer reads (`bertjax.tasks.pretraining.make_task`: the same
examples, masks and order) with the run's optimizer and schedule written with the libraries of
the torch world:
  - adamw: `torch.optim.AdamW` (bias-corrected, eps outside the root, decay lr * wd * p);
  - stable_adamw: optimi's `StableAdamW` (ModernBERT's own optimizer; decouple_lr off, so its
    decay is lr * wd * p as bertjax's);
  - weight decay off every bias and every LayerNorm parameter (transformers' Trainer's rule);
  - linear warmup then linear decay (`transformers.get_linear_schedule_with_warmup`), or
    warmup-stable-decay (`transformers.get_wsd_schedule`, 1-sqrt or linear);
  - gradients clipped to train.clip_norm (`torch.nn.utils.clip_grad_norm_`), where set.
HF_DIR gets the model (`save_pretrained`) and the run's tokenizer files, so that
`python -m bertjax.convert --from=hf --src=HF_DIR --dst=DIR` makes it a bertjax model directory
that fine-tunes as bertjax's own; its held-out MLM (and NSP) accuracy, on the run's held-out
batches, is printed and written to HF_DIR/eval_results.json.

The same pieces (`hf_model`, `torch_batch`, `make_optimizer`, `train_step`) let
tests/test_pretraining_parity.py follow bertjax's train step, step for step, from the same
initial weights. Recipes the reference cannot run (LAMB, the TF code's decay from step 0, a
decay power other than 1, gradient accumulation, packing, the left-to-right LM, a second phase
or plateau, a decay to a floor: transformers' get_wsd_schedule would start its warmup at the
floor) are refused.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

import numpy as np
import torch
import transformers

from bertjax import run_config
from bertjax.convert import hf, hf_files
from bertjax.errors import UserError
from bertjax.modeldir import model_files
from bertjax.models.config import BertConfig
from bertjax.tasks import pretraining
from bertjax.training.train import run_context
from bertjax.workdir import CONFIG_FILE

EVAL_FILE = "eval_results.json"


def hf_model(config: BertConfig, params: dict[str, Any] | None = None, nsp: bool = True,
             seed: int = 0) -> torch.nn.Module:
  """transformers' pretraining model of `config` in float32, in training mode:
  `BertForPreTraining` (`BertForMaskedLM` without `nsp`) or `ModernBertForMaskedLM` (eager
  attention). With `params` (bertjax's pretraining parameters) it holds them
  (`bertjax.convert.hf.to_hf`); without, transformers' own initialisation under
  torch.manual_seed(seed)."""
  if config.is_modernbert:
    cls = transformers.ModernBertForMaskedLM
  else:
    cls = transformers.BertForPreTraining if nsp else transformers.BertForMaskedLM
  fields = hf_files.bert_config_to_hf_config(config, [cls.__name__])
  hf_config = transformers.AutoConfig.for_model(**fields)
  if config.is_modernbert:
    hf_config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  model = cls(hf_config).float().train()
  if params is not None:
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf.to_hf(params, config).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "decoder.weight"}
    if unexpected or set(missing) - tied:
      raise ValueError(f"parameters that do not fit {cls.__name__}: missing "
                       f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
  return model


def torch_batch(batch: dict[str, np.ndarray], nsp: bool) -> dict[str, torch.Tensor]:
  """A bertjax pretraining batch -> the keyword arguments of transformers' model.

  Args:
    batch: input_ids, segment_ids, input_mask [B, S]; masked_lm_positions, masked_lm_ids,
      masked_lm_weights [B, P]; next_sentence_label [B] (with `nsp`).
  Returns:
    input_ids, token_type_ids, attention_mask [B, S] int64; labels [B, S] (the original token
    at each predicted position, -100 elsewhere); next_sentence_label [B] with `nsp`.
  """
  ids = np.asarray(batch["input_ids"], np.int64)
  labels = np.full_like(ids, -100)
  rows, slots = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
  labels[rows, np.asarray(batch["masked_lm_positions"])[rows, slots]] = (
      np.asarray(batch["masked_lm_ids"])[rows, slots])
  out = dict(input_ids=ids, token_type_ids=np.asarray(batch["segment_ids"], np.int64),
             attention_mask=np.asarray(batch["input_mask"], np.int64), labels=labels)
  if nsp:
    out["next_sentence_label"] = np.asarray(batch["next_sentence_label"], np.int64)
  return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
  """Parameter groups: weight decay on all but biases and LayerNorm parameters (transformers'
  Trainer's rule), each tied parameter once."""
  no_decay = {id(p) for module in model.modules() if isinstance(module, torch.nn.LayerNorm)
              for p in module.parameters(recurse=False)}
  decay, rest = [], []
  for name, param in model.named_parameters():  # tied parameters are listed once
    (rest if name.endswith("bias") or id(param) in no_decay else decay).append(param)
  return [dict(params=decay, weight_decay=weight_decay), dict(params=rest, weight_decay=0.0)]


def read_config(saved: dict[str, Any]) -> run_config.PretrainingRun:
  """A run's config.json (`saved`) as a typed pretraining config: the fields an earlier bertjax
  did not write yet read as their defaults (`bertjax.run_config.typed`)."""
  return run_config.typed(saved, run_config.PretrainingRun)


def check_recipe(config: run_config.PretrainingRun) -> None:
  """UserError for what the reference does not run (module docstring)."""
  tr = config.train
  refused = [(tr.optimizer not in ("adamw", "stable_adamw"), f"train.optimizer={tr.optimizer}"),
             (tr.lr_decay_from_step_0, "train.lr_decay_from_step_0=true"),
             (tr.lr_decay_power != 1.0, f"train.lr_decay_power={tr.lr_decay_power}"),
             (tr.grad_accum_steps != 1, f"train.grad_accum_steps={tr.grad_accum_steps}"),
             (config.data.packing, "data.packing=true"),
             (config.pretraining.left_to_right, "pretraining.objective=ltr"),
             (config.data.long_seq_length, "data.long_seq_length (a second phase)"),
             (tr.restart_from_step, "train.restart_from_step (a second plateau)"),
             (tr.decay_floor, f"train.decay_floor={tr.decay_floor}")]
  named = [what for bad, what in refused if bad]
  if named:
    raise UserError(f"the reference pretraining does not run {', '.join(named)}: it runs AdamW "
                    "or StableAdamW, BERT's linear or the wsd schedule (one plateau, decaying to "
                    "0), one phase, unpacked.")


def make_optimizer(model: torch.nn.Module, train: run_config.PretrainingTrain):
  """(optimizer, scheduler) of the `train` section: torch AdamW or optimi StableAdamW, stepped
  once a batch; the scheduler's rate at update n (0-based) is bertjax's schedule(n). With
  train.decouple_lr, StableAdamW is optimi's decouple_lr (its max_lr the peak), and AdamW's
  decay is weight_decay / learning_rate (the same decay a step)."""
  betas = (train.b1, train.b2)
  if train.optimizer == "stable_adamw":
    import optimi  # pylint: disable=import-outside-toplevel
    optimizer = optimi.StableAdamW(decay_groups(model, train.weight_decay),
                                   lr=train.learning_rate, betas=betas, eps=train.eps,
                                   decouple_lr=train.decouple_lr, max_lr=train.learning_rate,
                                   foreach=False)
  else:
    decay = train.weight_decay / train.learning_rate if train.decouple_lr else train.weight_decay
    optimizer = torch.optim.AdamW(decay_groups(model, decay), lr=train.learning_rate,
                                  betas=betas, eps=train.eps, foreach=False)
  if train.lr_schedule == "wsd":
    scheduler = transformers.get_wsd_schedule(
        optimizer, num_warmup_steps=train.warmup_steps, num_decay_steps=train.decay_steps,
        num_training_steps=train.num_train_steps, decay_type=train.decay_shape)
  else:
    scheduler = transformers.get_linear_schedule_with_warmup(
        optimizer, train.warmup_steps, train.num_train_steps)
  return optimizer, scheduler


def losses(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
  """{'mlm_loss': mean cross-entropy over the predicted positions, 'nsp_loss' (BERT with NSP):
  mean over the examples}, with 'mlm_logits' [predictions, V] (the predicted positions in
  row-major order) and 'nsp_logits' [B, 2]: transformers' modules, the MLM head run on the
  predicted positions alone (as bertjax's and ModernBERT's sparse prediction do; the same
  numbers as on every position, a sixth of the head's work at 15% masking)."""
  labels = inputs["labels"]
  scored = labels != -100
  if isinstance(model, transformers.ModernBertPreTrainedModel):
    hidden = model.model(input_ids=inputs["input_ids"],
                         attention_mask=inputs["attention_mask"]).last_hidden_state
    mlm_logits = model.decoder(model.head(hidden[scored]))
    pooled = None
  else:
    hidden, pooled = model.bert(input_ids=inputs["input_ids"],
                                attention_mask=inputs["attention_mask"],
                                token_type_ids=inputs["token_type_ids"], return_dict=False)[:2]
    mlm_logits = model.cls.predictions(hidden[scored])
  result = dict(mlm_logits=mlm_logits,
                mlm_loss=torch.nn.functional.cross_entropy(mlm_logits, labels[scored]))
  if "next_sentence_label" in inputs:
    result["nsp_logits"] = model.cls.seq_relationship(pooled)
    result["nsp_loss"] = torch.nn.functional.cross_entropy(result["nsp_logits"],
                                                           inputs["next_sentence_label"])
  return result


def train_step(model, optimizer, scheduler, inputs: dict[str, torch.Tensor],
               clip_norm: float) -> dict[str, float]:
  """One update on one batch (the sum of the losses, as BERT's); returns the losses."""
  optimizer.zero_grad(set_to_none=True)
  out = losses(model, inputs)
  loss = out["mlm_loss"] + out.get("nsp_loss", 0.0)
  loss.backward()
  if clip_norm:
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
  optimizer.step()
  scheduler.step()
  return {k: float(v.detach()) for k, v in out.items() if k.endswith("_loss")}


@torch.no_grad()
def evaluate(model, batches, nsp: bool, second_masking: str = "") -> dict[str, float]:
  """Held-out MLM (and NSP) accuracy and loss over `batches` (bertjax's eval batches; rows of
  example_weight 0 are padding); rows masked at the second rate (eval_masking 1,
  data.eval_masked_lm_prob) scored apart as mlm_accuracy`second_masking` and
  mlm_loss`second_masking`, as bertjax scores them (`pretraining.make_terms`)."""
  model.eval()
  sums = [dict(mlm_correct=0.0, mlm_count=0.0, mlm_loss=0.0, nsp_correct=0.0, nsp_count=0.0)
          for _ in range(2)]
  for batch in batches:
    rate = np.asarray(batch.get("eval_masking", np.zeros(len(batch["input_ids"]), np.int32)))
    for group in np.unique(rate):
      rows = {k: np.asarray(v)[rate == group] for k, v in batch.items()}
      _add_scores(sums[group], model, rows, nsp)
  model.train()
  metrics = {}
  for group, suffix in ((0, ""), (1, second_masking)):
    if sums[group]["mlm_count"]:
      metrics[f"mlm_accuracy{suffix}"] = sums[group]["mlm_correct"] / sums[group]["mlm_count"]
      metrics[f"mlm_loss{suffix}"] = sums[group]["mlm_loss"] / sums[group]["mlm_count"]
  if nsp:
    metrics["nsp_accuracy"] = sums[0]["nsp_correct"] / sums[0]["nsp_count"]
  return metrics


def _add_scores(sums: dict[str, float], model, batch, nsp: bool) -> None:
  """Adds `batch`'s correct predictions, losses and counts to `sums` (`evaluate`)."""
  real = torch.from_numpy(np.asarray(batch["example_weight"]) > 0)
  inputs = torch_batch(batch, nsp)
  inputs["labels"][~real] = -100
  out = losses(model, inputs)
  scored = inputs["labels"] != -100
  sums["mlm_correct"] += float((out["mlm_logits"].argmax(-1) == inputs["labels"][scored]).sum())
  sums["mlm_loss"] += float(out["mlm_loss"]) * float(scored.sum())
  sums["mlm_count"] += float(scored.sum())
  if nsp:
    correct = out["nsp_logits"].argmax(-1) == inputs["next_sentence_label"]
    sums["nsp_correct"] += float(correct[real].sum())
    sums["nsp_count"] += float(real.sum())


def run(workdir: str, out: str, seed: int = 0) -> dict[str, float]:
  """Pretrains the reference as the bertjax run in `workdir` was (module docstring)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise UserError(f"{workdir} has no {CONFIG_FILE}: give --workdir a bertjax pretraining "
                    "run's directory (python -m bertjax.main --config=configs/tiny.py ...).")
  if os.path.exists(out) and os.listdir(out):
    raise UserError(f"--out={out} is not empty; name a new directory.")
  with open(path, encoding="utf-8") as f:
    config = read_config(json.load(f))
  if config.task != "pretraining":
    raise UserError(f"{workdir} is a {config.task} run, not a pretraining one.")
  check_recipe(config)
  task = pretraining.make_task(config, workdir, run_context(config))
  nsp = config.pretraining.uses_nsp
  model = hf_model(task.model.config, nsp=nsp, seed=seed)
  optimizer, scheduler = make_optimizer(model, config.train)
  for step, (batch, _) in enumerate(task.batches.train(None), start=1):
    terms = train_step(model, optimizer, scheduler, torch_batch(batch, nsp),
                       config.train.clip_norm)
    if step % config.train.log_every_steps == 0 or step == config.train.num_train_steps:
      print(f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in terms.items()), flush=True)
    if step == config.train.num_train_steps:
      break
  metrics = (evaluate(model, task.batches.eval(), nsp, pretraining.second_masking(config.data))
             if task.batches.eval else {})
  os.makedirs(out, exist_ok=True)
  model.save_pretrained(out)
  for name in model_files.tokenizer_files(workdir):
    shutil.copy(name, os.path.join(out, os.path.basename(name)))
  with open(os.path.join(out, EVAL_FILE), "w", encoding="utf-8") as f:
    json.dump(dict(metrics, step=config.train.num_train_steps), f, indent=2)
  print("held-out: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
  return metrics


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.torch_pretraining",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a bertjax pretraining run's workdir")
  parser.add_argument("--out", required=True, help="a new directory for the transformers model")
  parser.add_argument("--seed", type=int, default=0, help="transformers' initialisation")
  args = parser.parse_args(argv)
  try:
    run(args.workdir, args.out, args.seed)
  except UserError as e:
    print(f"torch_pretraining: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
