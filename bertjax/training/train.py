"""The trainer: train state, the pure jitted train and eval steps, and the loop.

The trainer knows nothing of MLM or SQuAD. A `Task` gives it a model (a `heads.BertFor*` module
called on the batch dict), the weighted terms its loss and metrics are made of, its batches and,
optionally, per-example predictions, their scoring and their files. The trainer owns the rest:
the mesh, the state, one jitted train step with donated state, one jitted eval step (one forward
pass for the metrics and the predictions), the logs (progress bar, metrics.jsonl, TensorBoard:
`bertjax.training.metric_logs`), checkpoints, an agreed stop on SIGTERM or SIGINT
(`bertjax.training.preemption`), WORKDIR/eval_results.json (the last evaluation) and, after the last
step, the task's prediction files.

Where a run starts from, in this order: the latest checkpoint in WORKDIR/checkpoints (resume:
parameters, optimizer state, step, rng and data position); else `config.init_checkpoint`
(parameters only; anything it lacks is freshly initialised, and a head of other shapes, e.g.
another number of labels, stays fresh with a message); else from scratch.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import itertools
import json
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from clu import metrics as clu_metrics
from etils import epath

from bertjax.training import (checkpoint, compile_ahead, curves, flops, metric_logs, model_options,
                              optim, parallel, preemption)
from bertjax.errors import UserError
from bertjax.models import heads

Batch = Mapping[str, np.ndarray]
Params = Any
# name -> (values, weights) of the same shape: a metric is sum(values * weights) / sum(weights).
Terms = dict[str, tuple[jax.Array, jax.Array]]
# The train state: a plain dict so that checkpoints are readable without this code.
#   step [] int32, params (tree), opt_state (optax tree), rng [2] uint32 (dropout base key).
TrainState = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Batches:
  """A task's data, as per-host numpy batches (`bertjax.data.pipeline`).

  Attributes:
    train: data position (None = the start) -> endless (batch, position after it).
    eval: () -> the held-out batches, once through, the last padded (example_weight 0); None:
      no evaluation.
    predict: {set name: () -> batches}, predicted once after the last step (e.g. a test split).
    samples: () -> (training, evaluation) batches, one of each shape the run's steps will meet
      (e.g. each length bucket of a fine-tuning run), compiled side by side before the first
      step (`bertjax.training.compile_ahead`); None: the first training batch's shape only.
  """
  train: Callable[[dict | None], Iterator[tuple[Batch, dict]]]
  eval: Callable[[], Iterable[Batch]] | None = None
  predict: Mapping[str, Callable[[], Iterable[Batch]]] = dataclasses.field(default_factory=dict)
  samples: Callable[[], tuple[list[Batch], list[Batch]]] | None = None


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
    predict: (outputs, batch) -> {name: [batch, ...]} per-example predictions, or None.
    score: (metric totals {name: clu Average} over the eval set, predictions {name: [N, ...]}
      numpy or None) -> the reported metrics; None reports `means(totals)`.
    write: (set name, predictions, workdir) -> None, the task's official files; called after
      the last step for "eval" (the last evaluation's predictions) and each predict set.
    files: workdir files that describe the model, {name: text or bytes} (bert_config.json,
      the tokenizer, labels.json), written next to config.json.
    main_metric: the reported metric that says how good the model is (higher is better; e.g.
      "mlm_accuracy", GLUE's "f1" for MRPC), recorded in eval_results.json as "main_metric" and
      plotted in WORKDIR/curves.png (`bertjax.training.curves`); "" for none.
  """
  model: nn.Module
  terms: Callable[[Any, Batch], Terms]
  batches: Batches
  predict: Callable[[Any, Batch], dict[str, jax.Array]] | None = None
  score: Callable[[dict[str, Any], dict[str, np.ndarray] | None], dict[str, float]] | None = None
  write: Callable[[str, dict[str, np.ndarray], epath.Path], None] | None = None
  files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
  main_metric: str = ""


def is_loss(name: str) -> bool:
  """Whether a term belongs to the training objective ("loss", "mlm_loss", ...)."""
  return name == "loss" or name.endswith("_loss")


def means(totals: Mapping[str, Any]) -> dict[str, float]:
  """{name: weighted mean} of metric totals, with "loss" the sum of the loss terms' means when
  there are several (pretraining: mlm_loss + nsp_loss)."""
  out = {name: float(metric.compute()) for name, metric in totals.items()}
  if "loss" not in out and any(is_loss(k) for k in out):
    out = {"loss": sum(v for k, v in out.items() if is_loss(k)), **out}
  return out


def _averages(terms: Terms) -> dict[str, clu_metrics.Average]:
  """Terms -> {name: clu Average of the weighted sum and the weight}."""
  return {name: clu_metrics.Average(total=jnp.sum(values * weights).astype(jnp.float32),
                                    count=jnp.sum(weights).astype(jnp.float32))
          for name, (values, weights) in terms.items()}


def make_optimizer(train_config: ml_collections.ConfigDict):
  """optax AdamW (or LAMB) with BERT's schedule from the `train` section of the config;
  train.frozen_params (where the config has it) names parameter groups left unchanged."""
  return optim.make_optimizer(
      learning_rate=train_config.learning_rate, num_train_steps=train_config.num_train_steps,
      warmup_steps=train_config.warmup_steps, b1=train_config.b1, b2=train_config.b2,
      eps=train_config.eps, weight_decay=train_config.weight_decay,
      clip_norm=train_config.clip_norm, optimizer=train_config.get("optimizer", "adamw"),
      frozen=optim.parse_frozen(train_config.get("frozen_params", "")))


def make_train_step(task: Task, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    grad_accum_steps: int = 1):
  """Returns the pure `train_step(state, batch) -> (state, clu Collection of metrics)`.

  The dropout key of a step is folded from the state's rng and the step number, so a resumed run
  draws the same dropout masks as an uninterrupted one. With `grad_accum_steps` k > 1 the batch
  [B, ...] is split into k micro-batches [B/k, ...] (every k-th row, so each device keeps its
  own rows) whose gradients are summed before one update. Every loss term is divided by its
  weight over the whole batch B, so k micro-batches give exactly the gradient and metrics of
  one batch of B.
  """

  def outputs_of(params, batch, rng):
    return heads.apply_to_batch(task.model, params, batch, deterministic=False,
                                rngs={"dropout": rng})

  def total_weights(params, batch):
    """{loss term: its weight over `batch`}; the weights need no forward pass, so XLA drops
    the loss arithmetic run here on zero outputs."""
    shapes = jax.eval_shape(outputs_of, params, batch, jax.random.PRNGKey(0))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return {name: jnp.maximum(jnp.sum(weights), 1e-5)
            for name, (_, weights) in task.terms(zeros, batch).items() if is_loss(name)}

  def objective(params, batch, rng, totals):
    terms = task.terms(outputs_of(params, batch, rng), batch)
    loss = sum(jnp.sum(terms[name][0] * terms[name][1]) / total
               for name, total in totals.items())
    return loss, _averages(terms)

  def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Any]:
    rng = jax.random.fold_in(state["rng"], state["step"])
    totals = total_weights(state["params"], batch)
    gradient = jax.value_and_grad(objective, has_aux=True)
    if grad_accum_steps == 1:
      (loss, averages), grads = gradient(state["params"], batch, rng, totals)
    else:
      # [B, ...] -> [B/k, k, ...] -> [k, B/k, ...]
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps,
                              *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(carry, inputs):
        index, micro_batch = inputs
        out = gradient(state["params"], micro_batch, jax.random.fold_in(rng, index), totals)
        return jax.tree.map(jnp.add, carry, out), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          gradient, state["params"], jax.tree.map(lambda x: x[0], micro), rng, totals))
      ((loss, averages), grads), _ = jax.lax.scan(
          accumulate, zeros, (jnp.arange(grad_accum_steps), micro))

    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    scalars = {"grad_norm": optax.global_norm(grads), "param_norm": optax.global_norm(params)}
    if "loss" not in averages:
      scalars["loss"] = loss
    metrics = clu_metrics.Collection.create_collection(
        **averages, **{k: clu_metrics.Average.from_model_output(v) for k, v in scalars.items()},
        learning_rate=clu_metrics.LastValue.from_model_output(schedule(state["step"])))
    new_state = dict(state, step=state["step"] + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


def make_eval_step(task: Task, *, with_terms: bool = True):
  """Returns the pure `eval_step(params, batch) -> (clu Collection of the terms, predictions)`:
  one forward pass without dropout; predictions ({} without `task.predict`) carry the batch's
  example_weight, so padding rows can be dropped. Without terms (for sets without labels) the
  Collection is empty."""

  def eval_step(params, batch):
    outputs = heads.apply_to_batch(task.model, params, batch, deterministic=True)
    weight = batch["example_weight"]
    # Padded rows or packed slots (example_weight [batch] or [batch, k], 0) count for no term.
    terms = {name: (values, weights * weight.reshape(weight.shape
                                                     + (1,) * (weights.ndim - weight.ndim)))
             for name, (values, weights) in task.terms(outputs, batch).items()
             } if with_terms else {}
    predictions = {}
    if task.predict is not None:
      predictions = dict(task.predict(outputs, batch), example_weight=weight)
    return clu_metrics.Collection.create_collection(**_averages(terms)), predictions

  return eval_step


@dataclasses.dataclass
class Setup:
  """The mesh, the jitted functions and the shardings of one run (see `build`)."""
  mesh: jax.sharding.Mesh
  abstract_state: TrainState  # ShapeDtypeStructs with .sharding
  init_state: Callable[[], TrainState]
  train_step: Callable[[TrainState, Any], tuple[TrainState, Any]]
  eval_step: Callable[[Params, Any], tuple[Any, dict]]
  predict_step: Callable[[Params, Any], tuple[Any, dict]]  # eval_step without the terms


def make_checked_mesh(config: ml_collections.ConfigDict,
                      devices: list[jax.Device] | None = None) -> jax.sharding.Mesh:
  """The config's mesh, after checking that its batch sizes split over it (UserError if not)."""
  mesh = parallel.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)
  parallel.check_batch_size(config.train.batch_size, mesh, "train.batch_size")
  parallel.check_batch_size(config.train.eval_batch_size, mesh, "train.eval_batch_size")
  if config.train.grad_accum_steps < 1 or (
      config.train.batch_size % (config.train.grad_accum_steps * parallel.num_batch_shards(mesh))):
    raise UserError(
        f"train.batch_size={config.train.batch_size} must split into "
        f"train.grad_accum_steps={config.train.grad_accum_steps} micro-batches that each divide "
        f"over {parallel.num_batch_shards(mesh)} devices; change either.")
  tr, hosts = config.train, jax.process_count()
  if tr.batch_size % hosts or tr.eval_batch_size % hosts:
    raise UserError(f"train.batch_size={tr.batch_size} and train.eval_batch_size="
                    f"{tr.eval_batch_size} must divide over {hosts} hosts.")
  return mesh


def build(config: ml_collections.ConfigDict, task: Task, init_batch: Batch,
          devices: list[jax.Device] | None = None) -> Setup:
  """Builds the mesh, the state's shardings and the jitted init / train / eval functions;
  `init_batch` (a per-host batch) gives the shapes the parameters are initialised with."""
  mesh = make_checked_mesh(config, devices)
  tx, schedule = make_optimizer(config.train)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)

  init_params = functools.partial(heads.init_from_batch, task.model)
  boxed = jax.eval_shape(init_params, init_rng, init_batch)
  params_sharding = parallel.param_shardings(boxed, mesh)
  abstract_params = nn.unbox(boxed)
  state_sharding = dict(
      step=parallel.replicated(mesh), params=params_sharding,
      opt_state=parallel.optimizer_state_shardings(tx, abstract_params, params_sharding, mesh),
      rng=parallel.replicated(mesh))

  def init_state() -> TrainState:
    params = nn.unbox(init_params(init_rng, init_batch))
    return dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                rng=dropout_rng)

  abstract_state = jax.tree.map(
      lambda shape, sharding: jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
      jax.eval_shape(init_state), state_sharding)
  batch_sharding = parallel.batch_sharding(mesh)
  train_step = jax.jit(
      make_train_step(task, tx, schedule, config.train.grad_accum_steps),
      in_shardings=(state_sharding, batch_sharding),
      out_shardings=(state_sharding, parallel.replicated(mesh)), donate_argnums=0)
  # Replicated outputs: every host gets the metrics and predictions of the whole global batch.
  eval_step, predict_step = (
      jax.jit(make_eval_step(task, with_terms=with_terms),
              in_shardings=(params_sharding, batch_sharding),
              out_shardings=parallel.replicated(mesh)) for with_terms in (True, False))
  return Setup(mesh=mesh, abstract_state=abstract_state,
               init_state=jax.jit(init_state, out_shardings=state_sharding),
               train_step=train_step, eval_step=eval_step, predict_step=predict_step)


def _real_rows(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Concatenates per-batch predictions and drops the padding rows (example_weight 0)."""
  if not outputs or not outputs[0]:
    return {}
  joined = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  real = joined.pop("example_weight") > 0
  return {k: v[real] for k, v in joined.items()}


def run_eval_step(setup: Setup, params: Params, batches: Iterable[Batch], max_batches: int = -1,
                  *, with_terms: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """One pass of the eval step (or, without terms, the predict step): (metric totals {name:
  clu Average}, predictions of the real examples {name: [N, ...]} in the order of `batches`, {}
  without task.predict)."""
  step = setup.eval_step if with_terms else setup.predict_step
  totals, outputs = None, []
  for i, batch in enumerate(batches):
    if 0 <= max_batches <= i:
      break
    collection, predictions = jax.device_get(
        step(params, parallel.global_batch(batch, setup.mesh)))
    totals = collection if totals is None else totals.merge(collection)
    outputs.append(predictions)
  metrics = {} if totals is None else {
      name: metric for name, metric in vars(totals).items() if not name.startswith("_")}
  return metrics, _real_rows(outputs)


def evaluate(setup: Setup, task: Task, params: Params, max_batches: int = -1
             ) -> tuple[dict[str, float], dict[str, np.ndarray] | None]:
  """One pass over the held-out batches: (the task's metrics, its predictions or None)."""
  totals, predictions = run_eval_step(setup, params, task.batches.eval(), max_batches)
  predictions = predictions if task.predict is not None else None
  metrics = task.score(totals, predictions) if task.score else means(totals)
  return metrics, predictions


def compiled_ahead(setup: Setup, task: Task, first_batch: Batch, *, init: bool,
                   executor: concurrent.futures.Executor) -> Setup:
  """`setup` whose init (when `init`), train step and eval step are compiled in `executor`,
  side by side, for `first_batch`'s shape and those of `task.batches.samples`
  (`bertjax.training.compile_ahead`); first what the run needs first."""
  if init:
    compiled_init = executor.submit(lambda: setup.init_state.lower().compile())
    setup = dataclasses.replace(setup, init_state=lambda: compiled_init.result()())
  train_step = compile_ahead.PerShape(setup.train_step, setup.abstract_state, setup.mesh,
                                      executor)
  train_step.prepare([first_batch])
  eval_step = compile_ahead.PerShape(setup.eval_step, setup.abstract_state["params"],
                                     setup.mesh, executor)
  if task.batches.samples is not None:
    train_samples, eval_samples = task.batches.samples()
    train_step.prepare(train_samples)
    eval_step.prepare(eval_samples if task.batches.eval is not None else [])
  return dataclasses.replace(setup, train_step=train_step, eval_step=eval_step)


def restore_or_init(config: ml_collections.ConfigDict, setup: Setup,
                    checkpoints: checkpoint.Checkpoints,
                    vocab_size: int | None = None) -> tuple[TrainState, dict | None]:
  """The start state: latest checkpoint, else init_checkpoint's parameters, else fresh.

  The task's head (every top-level parameter but the encoder 'bert') stays fresh, with a
  message, where init_checkpoint's has other shapes (another task or number of labels). The
  vocabulary rows of init_checkpoint's embedding and MLM bias are adapted to this model's
  padding when `vocab_size` (the real vocabulary) is given. A latest checkpoint that does not
  read back whole is moved aside, with a warning, and the newest that does is resumed
  (`checkpoint.Checkpoints.resume`).
  """
  if checkpoints.latest_step() is not None:
    return checkpoints.resume(setup.abstract_state)
  state = setup.init_state()
  if config.init_checkpoint:
    head = [name for name in state["params"] if name != "bert"]
    params, report = checkpoint.load_params(config.init_checkpoint, state["params"],
                                            fresh_on_mismatch=tuple(f"{h}/" for h in head),
                                            vocab_size=vocab_size)
    print(f"init_checkpoint: {len(report.loaded)} parameters from {report.step_dir}")
    if report.resized:
      print(f"init_checkpoint: vocabulary rows padded to this model's for "
            f"{', '.join(report.resized)}")
    if report.replaced:
      print(f"init_checkpoint: its {' and '.join(head)} has other shapes (another task or number "
            f"of labels); freshly initialised {', '.join(report.replaced)}")
    if report.missing:
      print(f"init_checkpoint: freshly initialised {len(report.missing)} parameters it lacks: "
            f"{', '.join(report.missing[:8])}{' ...' if len(report.missing) > 8 else ''}")
    state = dict(state, params=params)
  return state, None


_WATCHED = ("loss", "grad_norm", "param_norm")  # train_step metrics that show a divergence


def first_nonfinite(steps: list[tuple[int, Any]]) -> tuple[int, dict[str, float]] | None:
  """The first of `steps`, (step, metrics Collection of `train_step`), whose loss, gradient norm
  or parameter norm (after the step's update) is NaN or infinite, as (step, {name: value}); None
  if all are finite. One transfer of the three averages of each step, which a log step fetches
  anyway."""
  fetched = jax.device_get([{name: getattr(metrics, name) for name in _WATCHED}
                            for _, metrics in steps])
  for (step, _), averages in zip(steps, fetched):
    if not all(np.isfinite(average.total) for average in averages.values()):
      return step, {name: float(average.total / max(float(average.count), 1e-9))
                    for name, average in averages.items()}
  return None


def divergence_message(step: int, values: Mapping[str, float],
                       train_config: ml_collections.ConfigDict, kept: list[int],
                       directory: epath.Path) -> str:
  """The UserError of a run whose loss became NaN or infinite at `step` (`values`: the watched
  metrics then; `kept`: the steps saved in `directory`, all from before `step`)."""
  tr = train_config
  saved = (f"the checkpoints in {directory} (steps {', '.join(map(str, kept))}) are all from "
           "before it" if kept else "no checkpoint was saved before it")
  clipping_off = not tr.clip_norm or tr.clip_norm <= 0
  clipping = ("no gradient clipping (train.clip_norm=0), " if clipping_off
              else f"(gradients are clipped at train.clip_norm={tr.clip_norm:g}) ")
  return (
      f"the loss is NaN or infinite at step {step} "
      f"({', '.join(f'{k}={values[k]:.4g}' for k in _WATCHED)}): training diverged and stopped "
      f"there without saving; {saved}. Likely causes: a learning rate too high "
      f"(train.learning_rate={tr.learning_rate:g}), too short a warmup (train.warmup_steps="
      f"{tr.warmup_steps}), {clipping}or bad input data. Lower --config.train.learning_rate or "
      "raise --config.train.warmup_steps"
      f"{' or set --config.train.clip_norm=1.0' if clipping_off else ''}, then rerun ("
      f"{f'it resumes from step {kept[-1]}' if kept else 'it starts over'}) or start over with a "
      "new --workdir.")


def examples_in(batch: Batch) -> int:
  """The real examples of a host's batch: its rows, or with packing ([batch, k] example
  weights) the sequences packed into them."""
  weights = batch.get("example_weight")
  if weights is None or np.ndim(weights) < 2:
    return len(batch["input_ids"])
  return int(np.count_nonzero(weights))


def step_flops(bert_config, batch: Batch) -> int:
  """`flops.model_flops` of one step on this per-host batch, over all hosts: the sequences are
  input_ids' rows ([batch, seq] or, for multiple choice, [batch, choices, seq])."""
  input_ids = batch["input_ids"]
  predictions = batch["masked_lm_positions"].shape[-1] if "masked_lm_positions" in batch else 0
  return flops.model_flops(bert_config, batch_size=input_ids[..., 0].size * jax.process_count(),
                           seq_len=input_ids.shape[-1], max_predictions=predictions)


def _write_workdir_files(config: ml_collections.ConfigDict, workdir: epath.Path,
                         files: Mapping[str, str | bytes]) -> None:
  """config.json and the task's files, from host 0."""
  if jax.process_index() != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
  for name, data in files.items():
    if isinstance(data, bytes):
      (workdir / name).write_bytes(data)
    else:
      (workdir / name).write_text(data)


def _first_drawn(batches: Iterator[Any]) -> Iterator[Any]:
  """`batches` with its first item drawn now (a bad data position raises here), then served
  in order as before."""
  first = next(batches)
  return itertools.chain([first], batches)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, task: Task,
                       devices: list[jax.Device] | None = None) -> dict[str, float]:
  """Trains to `config.train.num_train_steps`, evaluating and checkpointing on the way.

  A loss, gradient norm or parameter norm that becomes NaN or infinite stops the run with a
  UserError naming the step; it is checked at every log, eval and checkpoint step (a divergence
  at step k stops it by the next of these), and always before a checkpoint is written, so no
  checkpoint ever holds a step from after it and none of the earlier ones is rotated out.

  Returns the last evaluation's metrics (empty without held-out data). Checks every input that
  can be wrong (shapes, batch sizes, an incompatible checkpoint or data position) before writing
  to the workdir.
  """
  workdir = epath.Path(workdir)
  tr = config.train
  # tensorboardX takes a second to import: MetricLog's import then finds it done.
  threading.Thread(target=importlib.import_module, args=("tensorboardX",), daemon=True).start()
  with contextlib.ExitStack() as stack:
    # Entered first: a signal while the run starts (restoring, compiling) stops it after its
    # first step instead of killing one host.
    stop_signal = stack.enter_context(preemption.StopSignal())
    executor = stack.enter_context(compile_ahead.pool())
    first_batch = next(task.batches.train(None))[0]
    setup = build(config, task, first_batch, devices)
    # On an error, its background writes are waited for before the error leaves (abandon).
    checkpoints = stack.enter_context(checkpoint.Checkpoints(
        workdir / "checkpoints", save_every_steps=tr.checkpoint_every_steps,
        keep=tr.keep_checkpoints))
    setup = compiled_ahead(setup, task, first_batch, executor=executor,
                           init=checkpoints.latest_step() is None)
    state, position = restore_or_init(config, setup, checkpoints,
                                      getattr(task.model.config, "vocab_size", None))
    start_step = int(state["step"])
    total = tr.num_train_steps
    # Where this process stops: the end of the run, or earlier for a time-boxed job.
    stop = total if tr.stop_after_steps < 0 else min(total, tr.stop_after_steps)
    if start_step:
      print(f"resuming from step {start_step} of {workdir / 'checkpoints'}")
    # The first batch is drawn before anything is written: a data position that this data
    # cannot serve (a checkpoint of other data) is refused with the workdir as it was.
    batches = _first_drawn(task.batches.train(position))
    _write_workdir_files(config, workdir, task.files)
    dtype = model_options.resolve_dtype(config.model.dtype)
    log = metric_logs.MetricLog(workdir, dtype=dtype,
                                devices=list(setup.mesh.devices.flat), start_step=start_step)
    eval_metrics: dict[str, float] = {}
    eval_predictions: dict[str, np.ndarray] | None = None

    def run_eval(step: int) -> dict[str, float]:
      nonlocal eval_predictions
      if task.batches.eval is None:
        return {}
      metrics, eval_predictions = evaluate(setup, task, state["params"], tr.eval_steps)
      log.write_eval(step, metrics)
      if jax.process_index() == 0:
        main = {"main_metric": task.main_metric} if task.main_metric else {}
        (workdir / "eval_results.json").write_text(
            json.dumps({"step": step, **metrics, **main}, indent=2) + "\n")
        curves.draw(workdir, task.main_metric)
      return metrics

    bar = tqdm.tqdm(total=total, initial=start_step, desc="train", unit="step",
                    disable=jax.process_index() != 0, dynamic_ncols=True, mininterval=1.0)
    step = start_step
    unchecked: list[tuple[int, Any]] = []  # (step, metrics) not yet checked for NaN / Inf

    def check_finite() -> None:
      """Stops the run (UserError) if a step since the last check was not finite, after the
      saves already started (all from before it) are written."""
      diverged = first_nonfinite(unchecked) if unchecked else None
      unchecked.clear()
      if diverged is not None:
        bar.close()
        checkpoints.close()
        raise UserError(divergence_message(*diverged, tr, checkpoints.all_steps(),
                                           checkpoints.directory))

    while step < stop:
      batch, position = next(batches)
      state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh))
      log.add(metrics, examples=examples_in(batch) * jax.process_count(),
              tokens=batch["input_ids"].size * jax.process_count(),
              flops=step_flops(task.model.config, batch))
      step += 1
      unchecked.append((step, metrics))
      bar.update(1)
      if step % tr.log_every_steps == 0 or step == total:
        check_finite()
        bar.set_postfix(log.write_train(step), refresh=False)
      if step % tr.eval_every_steps == 0 or step == total:
        check_finite()
        eval_metrics = run_eval(step)
        log.restart_clock()
      stopping = stop_signal.should_stop(step)
      if checkpoints.due(step, force=step == stop or stopping):
        check_finite()
      checkpoints.save(step, state, position, force=step == stop or stopping)
      if stopping:
        tqdm.tqdm.write(f"{stop_signal.received or 'SIGTERM or SIGINT on some host'}: saved a "
                        f"checkpoint at step {step}; rerun the same command to resume.")
        break
    bar.close()
    evaluated = task.batches.eval is not None and (step % tr.eval_every_steps == 0
                                                   or step == total)
    if jax.process_index() == 0 and step > start_step and not evaluated:
      curves.draw(workdir, task.main_metric)  # the training steps after the last evaluation
    if step == total and task.write is not None:
      write = task.write if jax.process_index() == 0 else lambda *_: None
      if eval_predictions is not None:
        write("eval", eval_predictions, workdir)
      for name, make_batches in task.batches.predict.items():
        write(name, run_eval_step(setup, state["params"], make_batches(), with_terms=False)[1],
              workdir)
    checkpoints.close()
    log.close()
    return eval_metrics
