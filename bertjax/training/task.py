"""The contract between the trainer and a task: what the trainer hands the task (`RunContext`)
and what the task hands back (`Task`).

The trainer knows nothing of MLM or SQuAD. It builds the mesh once and hands the task a
`RunContext` (the mesh, this process's place among the hosts, the multiple every batch's rows
must come in). The task gives back a `Task`: a model (a `heads.BertFor*` module called on the
batch dict), the weighted terms its loss and metrics are made of, its batches (`Batches`), its
`Schedule` (the steps, known to a fine-tuning task only once it has read its data) and,
optionally, per-example predictions, their scoring and their files. The arithmetic of the terms
is here too: which terms are the training objective (`is_loss`), their sums and weights as clu
metrics (`averages`) and the reported means (`means`). The trainer (`bertjax.training.steps`,
`bertjax.training.train`) owns the rest.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from etils import epath

Batch = Mapping[str, np.ndarray]
# name -> (values, weights) of the same shape: a metric is sum(values * weights) / sum(weights).
Terms = dict[str, tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What the trainer hands a task before the task reads its data.

  Attributes:
    mesh: the run's device mesh (`bertjax.training.parallel`), built once and checked against
      the batch sizes.
    process_index, process_count: this host's index and the number of hosts; each host reads
      batch_size // process_count rows of every global batch.
    row_multiple: what the rows of a global batch must come in multiples of: the mesh's batch
      shards times train.grad_accum_steps, and the hosts (a packed batch of k examples a row
      has batch_size // k rows).
  """
  mesh: jax.sharding.Mesh
  process_index: int
  process_count: int
  row_multiple: int


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The steps of a run and its intervals, all known (none -1).

  Attributes:
    num_train_steps: optimizer updates in all.
    warmup_steps: of them, the linear warmup.
    log_every_steps, eval_every_steps, checkpoint_every_steps: the loop's intervals.
  """
  num_train_steps: int
  warmup_steps: int
  log_every_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int

  @classmethod
  def of(cls, train: Any) -> "Schedule":
    """The schedule a config's train section states outright (pretraining's)."""
    return cls(**{f.name: getattr(train, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Batches:
  """A task's data, as per-host numpy batches (`bertjax.data.pipeline`).

  Attributes:
    train: data position (None = the start) -> endless (batch, position after it).
    eval: () -> the held-out batches, once through, the last padded (example_weight 0); None:
      no evaluation.
    predict: {set name: () -> batches}, predicted once after the last step (e.g. a test split).
    samples: () -> (training, evaluation) batches among which are the shapes the run's steps
      will meet (e.g. each length bucket of a fine-tuning run), a batch of each compiled side
      by side before the first step (`bertjax.training.compile_ahead`); None: the first
      training batch's shape only.
    long_eval, long_eval_after_step: the held-out batches of a long sequence-length phase that
      evaluates at its own length, read by evaluations after a step beyond
      long_eval_after_step (`eval_at`); None: `eval` always.
    skip: (data position, count) -> the position `count` batches further on, for a rollback
      that skips them (`bertjax.training.divergence`) where drawing them through `train` would
      not do (a stream whose phases follow the steps it served); None: the trainer draws and
      drops them.
  """
  train: Callable[[dict | None], Iterator[tuple[Batch, dict]]]
  eval: Callable[[], Iterable[Batch]] | None = None
  predict: Mapping[str, Callable[[], Iterable[Batch]]] = dataclasses.field(default_factory=dict)
  samples: Callable[[], tuple[Iterable[Batch], Iterable[Batch]]] | None = None
  long_eval: Callable[[], Iterable[Batch]] | None = None
  long_eval_after_step: int = 0
  skip: Callable[[dict | None, int], dict] | None = None

  def eval_at(self, step: int) -> Callable[[], Iterable[Batch]] | None:
    """The held-out batches an evaluation after `step` reads: `long_eval` (a run's long
    sequence-length phase that evaluates at its own length, e.g. ModernBERT's context
    extension) once `step` trained in that phase (step > long_eval_after_step, the phase's
    first step being long_eval_after_step + 1), else `eval`."""
    if self.long_eval is not None and step > self.long_eval_after_step:
      return self.long_eval
    return self.eval


@dataclasses.dataclass(frozen=True)
class Task:
  """What a task hands the trainer.

  Attributes:
    model: a `heads.BertFor*` module (called by `heads.apply_to_batch`).
    terms: (model outputs, batch) -> Terms, traced inside jit. Each term is averaged over its
      weights; the terms named "loss" or "*_loss" are the training objective (their weighted
      means, summed). Weights must depend on the batch alone (masks, example_weight), never on
      the outputs: gradient accumulation divides every micro-batch by the whole batch's weight.
      A batch without labels (e.g. SQuAD's eval windows) may give no terms.
    batches: the data.
    schedule: the run's steps and intervals.
    predict: (outputs, batch) -> {name: [batch, ...]} per-example predictions, or None.
    score: (metric totals {name: clu Average} over the eval set, predictions {name: [N, ...]}
      numpy or None) -> the reported metrics; None reports `means(totals)`.
    write: (set name, predictions, workdir) -> None, the task's official files; called after
      the last step for "eval" (the last evaluation's predictions) and each predict set.
    files: workdir files that describe the model, {name: text or bytes} (bert_config.json,
      the tokenizer, labels.json), written next to config.json.
    main_metric: the reported metric that says how good the model is (higher is better; e.g.
      "mlm_accuracy", GLUE's "f1" for MRPC), recorded in eval_results.json as "main_metric" and
      plotted in WORKDIR/curves.png (`bertjax.training.reports`); "" for none.
    models_by_length: {sequence length: the module to run on batches of that length instead
      of `model`}, with the same parameters: a phase that changes a choice fixed at trace time
      (ModernBERT's context extension, which changes the global rotary base with the length).
    gradient: (params, batch, dropout key) -> (the batch's Terms, the gradient of the objective
      (the loss terms' weighted means, summed) with respect to params), traced inside jit: a
      task that differentiates its own loss (a contrastive task's GradCache,
      `bertjax.embedding.grad_cache`); None: the trainer differentiates `terms` of the model's
      outputs.
    init_params: the freshly initialised params -> the params the run starts from, for a task
      that reads its own starting model (an embedding task from a Hugging Face or
      sentence-transformers directory); None: config.init_checkpoint's, if any.
  """
  model: nn.Module
  terms: Callable[[Any, Batch], Terms]
  batches: Batches
  schedule: Schedule
  predict: Callable[[Any, Batch], dict[str, jax.Array]] | None = None
  score: Callable[[dict[str, Any], dict[str, np.ndarray] | None], dict[str, float]] | None = None
  write: Callable[[str, dict[str, np.ndarray], epath.Path], None] | None = None
  files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
  main_metric: str = ""
  models_by_length: Mapping[int, nn.Module] = dataclasses.field(default_factory=dict)
  gradient: Callable[[Any, Batch, jax.Array], tuple[Terms, Any]] | None = None
  init_params: Callable[[Any], Any] | None = None

  def model_for(self, batch: Batch) -> nn.Module:
    """The module that runs `batch`: models_by_length's for its sequence length, else model."""
    return self.models_by_length.get(batch["input_ids"].shape[-1], self.model)


def is_loss(name: str) -> bool:
  """Whether a term belongs to the training objective ("loss", "mlm_loss", ...)."""
  return name == "loss" or name.endswith("_loss")


def averages(terms: Terms) -> dict[str, clu_metrics.Average]:
  """Terms -> {name: clu Average of the weighted sum and the weight}, float32 scalars."""
  return {name: clu_metrics.Average(total=jnp.sum(values * weights).astype(jnp.float32),
                                    count=jnp.sum(weights).astype(jnp.float32))
          for name, (values, weights) in terms.items()}


def means(totals: Mapping[str, Any]) -> dict[str, float]:
  """{name: weighted mean} of metric totals, with "loss" the sum of the loss terms' means when
  there are several (pretraining: mlm_loss + nsp_loss)."""
  out = {name: float(metric.compute()) for name, metric in totals.items()}
  if "loss" not in out and any(is_loss(k) for k in out):
    out = {"loss": sum(v for k, v in out.items() if is_loss(k)), **out}
  return out
