"""The trainer: train state, the pure jitted train/eval steps, and the loop.

The trainer knows nothing of MLM or SQuAD: a `Task` supplies the model's parameter init, the loss,
the evaluation sums, per-example predictions and their scoring (for metrics such as F1 that do not
add up over batches), and the batches. The trainer owns the rest: the mesh, the state, one jitted
step with donated state, logging (progress bar, metrics.jsonl, TensorBoard), checkpoints,
preemption, WORKDIR/eval_results.json (the last evaluation) and, at the end, predicting the
task's prediction sets (e.g. a test split), which the task writes in its own format.

Where a run starts from, in this order: the latest checkpoint in WORKDIR/checkpoints (resume:
parameters, optimizer state, step, rng and data position); else `config.init_checkpoint`
(parameters only; anything it lacks is freshly initialised); else from scratch.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from etils import epath

from bertjax import checkpoint, optim, parallel
from bertjax.errors import UserError

Batch = Mapping[str, np.ndarray]
Params = Any
# The train state: a plain dict so that checkpoints are readable without this code.
#   step [] int32, params (tree), opt_state (optax tree), rng [2] uint32 (dropout base key).
TrainState = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Task:
  """What a task hands the trainer.

  Attributes:
    init_params: (rng, batch) -> the model's "params" collection, with logical axis boxes.
    loss_fn: (params, batch, dropout_rng) -> (scalar loss, {name: scalar}) for a batch, with
      dropout on. Metrics are means over the batch.
    eval_fn: (params, batch) -> {name: scalar sum over the batch}; dropout off.
    summarize_eval: sums over the whole evaluation -> the reported metrics.
    train_batches: data position (None = start) -> iterator of (per-host batch, position after it).
    eval_batches: () -> per-host batches of the held-out set, once through (None: no evaluation).
    init_batch: a per-host batch with the shapes of training, for initialisation.
    files: workdir files the task describes itself by, {name: text or bytes}, e.g.
      bert_config.json and the tokenizer (written next to config.json).
    predict_fn: (params, batch) -> {name: [batch, ...] array}, per example, dropout off (e.g.
      logits or predicted labels); None for a task scored by sums alone.
    score_predictions: {name: [N, ...] numpy array} over the whole eval set, padding rows
      dropped, in the order of `eval_batches` -> metrics, reported with summarize_eval's.
    predict_sets: {set name: () -> per-host batches}: sets (e.g. a test split without labels)
      predicted once after the last step and handed to write_predictions.
    write_predictions: (set name, {name: [N, ...] numpy array}, workdir) -> None: writes
      predictions in the task's official format. Called after the last step for each of
      predict_sets and for "eval" with the last evaluation's predictions.
    head: the name of the task's head in the parameters (e.g. "sequence_classification"): an
      init_checkpoint whose head has other shapes (another number of labels) leaves it freshly
      initialised, with a message, instead of stopping.
  """
  init_params: Callable[[jax.Array, Batch], Params]
  loss_fn: Callable[[Params, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]
  eval_fn: Callable[[Params, Batch], dict[str, jax.Array]]
  summarize_eval: Callable[[dict[str, float]], dict[str, float]]
  train_batches: Callable[[dict | None], Iterator[tuple[Batch, dict]]]
  eval_batches: Callable[[], Iterable[Batch]] | None
  init_batch: Batch
  files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
  predict_fn: Callable[[Params, Batch], dict[str, jax.Array]] | None = None
  score_predictions: Callable[[dict[str, np.ndarray]], dict[str, float]] | None = None
  predict_sets: Mapping[str, Callable[[], Iterable[Batch]]] = dataclasses.field(
      default_factory=dict)
  write_predictions: Callable[[str, dict[str, np.ndarray], epath.Path], None] | None = None
  head: str = ""


def make_optimizer(train_config: ml_collections.ConfigDict):
  """optax AdamW with BERT's schedule from the `train` section of the config."""
  return optim.make_optimizer(
      learning_rate=train_config.learning_rate, num_train_steps=train_config.num_train_steps,
      warmup_steps=train_config.warmup_steps, b1=train_config.b1, b2=train_config.b2,
      eps=train_config.eps, weight_decay=train_config.weight_decay,
      clip_norm=train_config.clip_norm)


def make_train_step(task: Task, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    grad_accum_steps: int = 1):
  """Returns the pure `train_step(state, batch) -> (state, metrics)`.

  The dropout key of a step is folded from the state's rng and the step number, so a resumed run
  draws the same dropout masks as an uninterrupted one. With `grad_accum_steps` k > 1 the batch
  [B, ...] is split into k micro-batches [B/k, ...] whose gradients are averaged before one
  update; the split takes every k-th row so each device keeps its own rows (no communication).
  """

  def grads_and_metrics(params, batch, rng):
    (loss, metrics), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(params, batch, rng)
    return grads, dict(metrics, loss=loss)

  def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
    rng = jax.random.fold_in(state["rng"], state["step"])
    if grad_accum_steps == 1:
      grads, metrics = grads_and_metrics(state["params"], batch, rng)
    else:
      # [B, ...] -> [B/k, k, ...] -> [k, B/k, ...]
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps,
                              *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(carry, inputs):
        index, micro_batch = inputs
        grads, metrics = grads_and_metrics(state["params"], micro_batch,
                                           jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, carry, (grads, metrics)), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          grads_and_metrics, state["params"], jax.tree.map(lambda x: x[0], micro), rng))
      total, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
      grads, metrics = jax.tree.map(lambda x: x / grad_accum_steps, total)

    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics.update(grad_norm=optax.global_norm(grads), param_norm=optax.global_norm(params),
                   learning_rate=schedule(state["step"]))
    new_state = dict(state, step=state["step"] + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


@dataclasses.dataclass
class Setup:
  """The mesh, the jitted functions and the shardings of one run (see `build`)."""
  mesh: jax.sharding.Mesh
  abstract_state: TrainState  # ShapeDtypeStructs with .sharding
  init_state: Callable[[], TrainState]
  train_step: Callable[[TrainState, Any], tuple[TrainState, dict]]
  eval_step: Callable[[Params, Any], dict]
  predict_step: Callable[[Params, Any], dict] | None  # the task's predict_fn + example_weight


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
  return mesh


def build(config: ml_collections.ConfigDict, task: Task,
          devices: list[jax.Device] | None = None) -> Setup:
  """Builds the mesh, the state's shardings and the jitted init / train / eval functions."""
  mesh = make_checked_mesh(config, devices)
  tx, schedule = make_optimizer(config.train)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)

  boxed = jax.eval_shape(task.init_params, init_rng, task.init_batch)
  params_sharding = parallel.param_shardings(boxed, mesh)
  abstract_params = nn.unbox(boxed)
  state_sharding = dict(
      step=parallel.replicated(mesh), params=params_sharding,
      opt_state=parallel.optimizer_state_shardings(tx, abstract_params, params_sharding, mesh),
      rng=parallel.replicated(mesh))

  def init_state() -> TrainState:
    params = nn.unbox(task.init_params(init_rng, task.init_batch))
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
  eval_step = jax.jit(task.eval_fn, in_shardings=(params_sharding, batch_sharding),
                      out_shardings=parallel.replicated(mesh))
  predict_step = None
  if task.predict_fn is not None:
    def predict_with_weights(params, batch):
      return dict(task.predict_fn(params, batch), example_weight=batch["example_weight"])
    # Replicated outputs: every host gets the predictions of the whole global batch.
    predict_step = jax.jit(predict_with_weights, in_shardings=(params_sharding, batch_sharding),
                           out_shardings=parallel.replicated(mesh))
  return Setup(mesh=mesh, abstract_state=abstract_state,
               init_state=jax.jit(init_state, out_shardings=state_sharding),
               train_step=train_step, eval_step=eval_step, predict_step=predict_step)


def _real_rows(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Concatenates per-batch predictions and drops the padding rows (example_weight 0)."""
  if not outputs:
    return {}
  joined = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  real = joined.pop("example_weight") > 0
  return {k: v[real] for k, v in joined.items()}


def predict(setup: Setup, batches: Iterable[Batch], params: Params) -> dict[str, np.ndarray]:
  """The task's predictions for every real example of `batches` (in their order), on the host:
  {name: [N, ...] numpy array}."""
  outputs = [jax.device_get(setup.predict_step(params, parallel.global_batch(b, setup.mesh)))
             for b in batches]
  return _real_rows(outputs)


def evaluate_with_predictions(setup: Setup, task: Task, params: Params, max_batches: int = -1
                              ) -> tuple[dict[str, float], dict[str, np.ndarray] | None]:
  """One pass over the held-out batches: (the task's metrics, its predictions or None).

  The metrics are summarize_eval of the eval step's sums, and, for a task with predict_fn,
  score_predictions of the per-example predictions over the whole set.
  """
  sums: dict[str, float] = {}
  outputs = []
  for i, batch in enumerate(task.eval_batches()):
    if 0 <= max_batches <= i:
      break
    batch = parallel.global_batch(batch, setup.mesh)
    for k, v in jax.device_get(setup.eval_step(params, batch)).items():
      sums[k] = sums.get(k, 0.0) + float(v)
    if setup.predict_step is not None:
      outputs.append(jax.device_get(setup.predict_step(params, batch)))
  metrics = task.summarize_eval(sums)
  if setup.predict_step is None:
    return metrics, None
  predictions = _real_rows(outputs)
  if task.score_predictions is not None:
    metrics = {**metrics, **task.score_predictions(predictions)}
  return metrics, predictions


def evaluate(setup: Setup, task: Task, params: Params, max_batches: int = -1) -> dict[str, float]:
  """Runs the eval step over the held-out batches and returns the task's metrics."""
  return evaluate_with_predictions(setup, task, params, max_batches)[0]


class MetricsLog:
  """metrics.jsonl (one JSON object per line with `step` and `split`) and TensorBoard, host 0."""

  def __init__(self, workdir: epath.Path):
    self.enabled = jax.process_index() == 0
    if self.enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._jsonl = (workdir / "metrics.jsonl").open("a")
      self._tb = SummaryWriter(str(workdir / "tensorboard"))

  def write(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
    self._jsonl.flush()
    for k, v in metrics.items():
      self._tb.add_scalar(f"{split}/{k}", v, step)
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


class _Preemption:
  """Turns SIGTERM (how Cloud TPU preempts a VM) into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = threading.Event()
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self.requested.set())
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def restore_or_init(config: ml_collections.ConfigDict, setup: Setup,
                    checkpoints: checkpoint.Checkpoints,
                    head: str = "") -> tuple[TrainState, dict | None]:
  """The start state: latest checkpoint, else init_checkpoint's parameters, else fresh.

  `head` (Task.head) names parameters that stay fresh when init_checkpoint's differ in shape.
  """
  if checkpoints.latest_step() is not None:
    return checkpoints.restore(setup.abstract_state)
  state = setup.init_state()
  if config.init_checkpoint:
    params, report = checkpoint.load_params(config.init_checkpoint, state["params"],
                                            fresh_on_mismatch=(head + "/",) if head else ())
    print(f"init_checkpoint: {len(report.loaded)} parameters from {report.step_dir}")
    if report.replaced:
      print(f"init_checkpoint: its {head} has other shapes (another task or number of labels); "
            f"freshly initialised {', '.join(report.replaced)}")
    if report.missing:
      print(f"init_checkpoint: freshly initialised {len(report.missing)} parameters it lacks: "
            f"{', '.join(report.missing[:8])}{' ...' if len(report.missing) > 8 else ''}")
    state = dict(state, params=params)
  return state, None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, task: Task,
                       devices: list[jax.Device] | None = None) -> dict[str, float]:
  """Trains to `config.train.num_train_steps`, evaluating and checkpointing on the way.

  Returns the last evaluation's metrics (empty without held-out data). Checks every input that
  can be wrong (shapes, batch sizes, an incompatible checkpoint) before writing to the workdir.
  """
  workdir = epath.Path(workdir)
  setup = build(config, task, devices)
  checkpoints = checkpoint.Checkpoints(
      workdir / "checkpoints", save_every_steps=config.train.checkpoint_every_steps,
      keep=config.train.keep_checkpoints)
  state, position = restore_or_init(config, setup, checkpoints, task.head)
  start_step = int(state["step"])
  total = config.train.num_train_steps
  # Where this process stops: the end of the run, or earlier for a time-boxed job.
  stop = total if config.train.stop_after_steps < 0 else min(total, config.train.stop_after_steps)
  if position is not None or start_step:
    print(f"resuming from step {start_step} of {workdir / 'checkpoints'}")

  if jax.process_index() == 0:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
    for name, data in task.files.items():
      if isinstance(data, bytes):
        (workdir / name).write_bytes(data)
      else:
        (workdir / name).write_text(data)
  log = MetricsLog(workdir)
  train_cfg = config.train
  eval_metrics: dict[str, float] = {}
  eval_predictions: dict[str, np.ndarray] | None = None

  def run_eval(step: int) -> dict[str, float]:
    nonlocal eval_predictions
    if task.eval_batches is None:
      return {}
    metrics, eval_predictions = evaluate_with_predictions(setup, task, state["params"],
                                                          train_cfg.eval_steps)
    log.write(step, "eval", metrics)
    tqdm.tqdm.write(f"step {step} eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    if jax.process_index() == 0:
      (workdir / "eval_results.json").write_text(
          json.dumps({"step": step, **metrics}, indent=2) + "\n")
    return metrics

  batches = task.train_batches(position)
  pending: list[dict[str, jax.Array]] = []
  pending_tokens = 0  # tokens (padding included) of the global batches since the last log
  bar = tqdm.tqdm(total=total, initial=start_step, desc="train", unit="step",
                  disable=jax.process_index() != 0, dynamic_ncols=True, mininterval=1.0)
  interval_start = time.perf_counter()
  step = start_step
  with _Preemption() as preemption:
    while step < stop:
      batch, position = next(batches)
      state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh))
      pending.append(metrics)
      pending_tokens += batch["input_ids"].size * jax.process_count()
      step += 1
      bar.update(1)
      if step % train_cfg.log_every_steps == 0 or step == total:
        fetched = jax.device_get(pending)
        elapsed = time.perf_counter() - interval_start
        summary = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
        summary["examples_per_second"] = len(fetched) * train_cfg.batch_size / elapsed
        summary["tokens_per_second"] = pending_tokens / elapsed
        log.write(step, "train", summary)
        accuracies = {k.replace("accuracy", "acc"): f"{v:.3f}" for k, v in summary.items()
                      if k.endswith("accuracy")}  # mlm_acc, nsp_acc; acc when fine-tuning
        bar.set_postfix(loss=f"{summary['loss']:.3f}", **accuracies,
                        tok_s=f"{summary['tokens_per_second']:.0f}", refresh=False)
        pending, pending_tokens, interval_start = [], 0, time.perf_counter()
      if step % train_cfg.eval_every_steps == 0 or step == total:
        eval_metrics = run_eval(step)
        interval_start = time.perf_counter()
      checkpoints.save(step, state, position, force=step == stop)
      if preemption.requested.is_set():
        checkpoints.save(step, state, position, force=True)
        tqdm.tqdm.write(f"SIGTERM: saved a checkpoint at step {step}; rerun the same command "
                        "to resume.")
        break
  bar.close()
  if step == total and task.write_predictions is not None:
    write = task.write_predictions if jax.process_index() == 0 else lambda *_: None
    if eval_predictions is not None:
      write("eval", eval_predictions, workdir)
    for name, batches in task.predict_sets.items():
      write(name, predict(setup, batches(), state["params"]), workdir)
  checkpoints.close()
  log.close()
  return eval_metrics
