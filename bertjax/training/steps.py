"""The step machinery: one jitted train step and one eval step over a mesh, and evaluation.

`make_checked_mesh` makes a run's mesh, checked against the batch sizes (the trainer does it
once, `bertjax.training.train.run_context`); `build` makes a run's `Setup` on it: the train
state's shardings and the jitted functions, with keys of the PRNG `config.train.prng_impl`
names. The train step is pure, `train_step(state, batch, learning_rate) -> (state, metrics)`,
with donated state, the step's rate an argument (the schedule's numbers are not in the program,
so runs of other lengths share it) and the dropout key folded from the step; the eval step is
one forward pass without dropout for a task's metric terms and predictions
(`bertjax.training.task`). `evaluate` runs it over the held-out batches; `compiled_ahead`
compiles the steps for the shapes a run will meet, side by side
(`bertjax.training.compile_ahead`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any, Callable, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics
from jax._src import config as jax_config  # the one flag below has no public context manager

from bertjax import run_config
from bertjax.errors import UserError
from bertjax.models import fp8, heads, modernbert
from bertjax.training import compile_ahead, optim, parallel, schedules
from bertjax.training import task as task_lib

Params = Any
# The train state: a plain dict so that checkpoints are readable without this code.
#   step [] int32, params (tree), opt_state (optax tree), rng uint32 (the dropout base key's
#   data: [2] for threefry, [4] for rbg and unsafe_rbg; orbax saves raw arrays, not typed keys),
#   and for an fp8 model (`bertjax.models.fp8`) fp8: its scaling state (tree, replicated).
TrainState = dict[str, Any]
# train.prng_impl -> jax's name. threefry (jax's default) keeps every result of earlier runs;
# rbg and unsafe_rbg (maxtext trains with unsafe_rbg) draw through XLA's RngBitGenerator, which
# compiles small and is fast on TPUs; unsafe_rbg's split and fold_in are cheaper, their keys not
# guaranteed independent.
PRNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def prng_impl(train_config: run_config.Train) -> str:
  """The config's `train.prng_impl`, checked."""
  name = train_config.prng_impl
  if name not in PRNG_IMPLS:
    raise UserError(f"train.prng_impl={name!r} is not one of {', '.join(PRNG_IMPLS)}; set "
                    "--config.train.prng_impl to one of them.")
  return name


def make_optimizer(train_config: run_config.Train, model_config=None,
                   schedule: task_lib.Schedule | None = None,
                   rate: optax.Schedule | None = None):
  """optax AdamW (or LAMB, or StableAdamW) with BERT's schedule (or warmup-stable-decay) from the
  `train` section of the config, over `schedule`'s steps (default: those the section states,
  `task.Schedule.of`): (tx, the learning-rate schedule). A ModernBERT `model_config` (a
  BertConfig) makes StableAdamW clip its query, key and value kernels as the one Wqkv tensor
  ModernBERT's trainer steps (`bertjax.models.modernbert.stored_tensor`). `rate`: the rates tx
  steps at instead of the schedule's (the train step's own argument, `make_train_step`)."""
  tr = train_config
  schedule = schedule or task_lib.Schedule.of(tr)
  return optim.make_optimizer(
      learning_rate=tr.learning_rate, num_train_steps=schedule.num_train_steps,
      warmup_steps=schedule.warmup_steps, b1=tr.b1, b2=tr.b2, eps=tr.eps,
      weight_decay=tr.weight_decay, decouple_lr=tr.decouple_lr, clip_norm=tr.clip_norm,
      optimizer=tr.optimizer, frozen=tr.frozen, lr_decay_power=tr.lr_decay_power,
      lr_decay_from_step_0=tr.lr_decay_from_step_0, lr_schedule=tr.lr_schedule,
      decay_steps=tr.decay_steps, decay_shape=tr.decay_shape, decay_floor=tr.decay_floor,
      changes=rate_changes(tr), mu_dtype=tr.mu_dtype, rate=rate,
      stored_tensor=(modernbert.stored_tensor
                     if model_config is not None and model_config.is_modernbert else None))


def rate_changes(train: run_config.Train) -> tuple[schedules.RateChange, ...]:
  """The plateaus after the first that a pretraining run's wsd schedule holds: its restart
  (train.restart_*) and its long phase's own rate (train.long_*), where set, in the order they
  come, each with its weight decay (-1 keeps the one before); none for fine-tuning."""
  if not isinstance(train, run_config.PretrainingTrain):
    return ()
  entries = sorted(entry for entry in (
      (train.restart_from_step, train.restart_learning_rate, train.restart_weight_decay,
       "train.restart_from_step, restart_learning_rate and restart_weight_decay"),
      (train.long_seq_from_step if train.long_learning_rate else 0, train.long_learning_rate,
       train.long_weight_decay,
       "train.long_seq_from_step, long_learning_rate and long_weight_decay"))
      if entry[0] or entry[1])
  changes, decay = [], train.weight_decay
  for step, rate, weight_decay, fields in entries:
    decay = decay if weight_decay == -1 else weight_decay
    changes.append(schedules.RateChange(step, rate, decay, fields))
  return tuple(changes)


def make_train_step(task: task_lib.Task,
                    tx_at: Callable[[optax.Schedule], optax.GradientTransformation],
                    grad_accum_steps: int = 1, prng: str = "threefry"):
  """Returns the pure `train_step(state, batch, learning_rate) -> (state, clu Collection of
  metrics)`.

  `learning_rate` (a float32 scalar) is this step's rate, an argument rather than the
  schedule's numbers inside the program (`Setup.learning_rate` gives the schedule's, on the
  host): runs that differ only in their length, warmup or peak rate run one compiled program
  (the compilation cache's), and the divergence guard's lower rate after a rollback
  (`bertjax.training.divergence`) is the same program too. `tx_at(rate)` is the optimizer
  stepping at `rate`, a schedule of the update count (`make_optimizer`'s): its state is the
  same whatever the rate.

  The dropout key of a step is folded from the state's rng (key data of the PRNG `prng`, a
  PRNG_IMPLS name) and the step number, so a resumed run draws the same dropout masks as an
  uninterrupted one. With `grad_accum_steps` k > 1 the batch
  [B, ...] is split into k micro-batches [B/k, ...] (every k-th row, so each device keeps its
  own rows) whose gradients are summed before one update. Every loss term is divided by its
  weight over the whole batch B, so k micro-batches give exactly the gradient and metrics of
  one batch of B. A task with its own `gradient` (`task.Task`) gives its terms and gradient of
  the whole batch instead.
  """

  def outputs_of(params, fp8_state, batch, rng):
    return heads.apply_to_batch(task.model_for(batch), params, batch, deterministic=False,
                                rngs={"dropout": rng}, fp8_state=fp8_state)

  def weights_of(terms):
    """{loss term: its total weight}, at least 1e-5 (a batch may hold none)."""
    return {name: jnp.maximum(jnp.sum(weights), 1e-5)
            for name, (_, weights) in terms.items() if task_lib.is_loss(name)}

  def total_weights(params, fp8_state, batch):
    """{loss term: its weight over `batch`}, for micro-batches; the weights need no forward
    pass, so XLA drops the loss arithmetic run here on zero outputs."""
    shapes = jax.eval_shape(outputs_of, params, fp8_state, batch, jax.random.PRNGKey(0))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return weights_of(task.terms(zeros, batch))

  def objective(params, fp8_state, batch, rng, totals=None):
    """(the loss: each term's weighted sum over its total weight, `totals` or, for a whole
    batch, its own; the terms' averages)."""
    terms = task.terms(outputs_of(params, fp8_state, batch, rng), batch)
    totals = jax.lax.stop_gradient(weights_of(terms)) if totals is None else totals
    loss = sum(jnp.sum(terms[name][0] * terms[name][1]) / total
               for name, total in totals.items())
    return loss, task_lib.averages(terms)

  def train_step(state: TrainState, batch: task_lib.Batch,
                 learning_rate: jax.Array) -> tuple[TrainState, Any]:
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"], impl=PRNG_IMPLS[prng]),
                             state["step"])
    # An fp8 model's scaling state (`bertjax.models.fp8`): its "gradient" is its next value.
    fp8_state = state.get("fp8", {})
    gradient = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
    if task.gradient is not None:  # the task differentiates its own loss (one batch)
      terms, grads = task.gradient(state["params"], batch, rng)
      averages = task_lib.averages(terms)
      loss = sum(metric.compute() for name, metric in averages.items() if task_lib.is_loss(name))
    elif grad_accum_steps == 1:
      (loss, averages), (grads, fp8_state) = gradient(state["params"], fp8_state, batch, rng)
    else:
      # [B, ...] -> [B/k, k, ...] -> [k, B/k, ...]
      totals = total_weights(state["params"], fp8_state, batch)
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps,
                              *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(carry, inputs):  # gradients summed; the fp8 state from one to the next
        (summed, fp8_state), (index, micro_batch) = carry, inputs
        out, (grads, fp8_state) = gradient(state["params"], fp8_state, micro_batch,
                                           jax.random.fold_in(rng, index), totals)
        return (jax.tree.map(jnp.add, summed, (out, grads)), fp8_state), None

      out, (grads, _) = jax.eval_shape(gradient, state["params"], fp8_state,
                                       jax.tree.map(lambda x: x[0], micro), rng, totals)
      zeros = jax.tree.map(jnp.zeros_like, (out, grads))
      (((loss, averages), grads), fp8_state), _ = jax.lax.scan(
          accumulate, (zeros, fp8_state), (jnp.arange(grad_accum_steps), micro))

    tx = tx_at(lambda _: learning_rate)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    # Both norms are logged, and watched by the divergence guard (divergence.py), every step.
    # The gradient's is the clip's own (XLA computes it once: the metric adds nothing to the
    # compiled step); the parameters' is one read of them (BERT-base: 440 MB, 0.1% of the bytes
    # XLA counts in a 256 x 128 bfloat16 step), kept: skipping it on unlogged steps would take
    # a second compiled step, or a lax.cond, whose predicate XLA's GPU runtime may read on the
    # host (a sync every step).
    scalars = {"grad_norm": optax.global_norm(grads), "param_norm": optax.global_norm(params)}
    if "loss" not in averages:
      scalars["loss"] = loss
    metrics = clu_metrics.Collection.create_collection(
        **averages, **{k: clu_metrics.Average.from_model_output(v) for k, v in scalars.items()},
        learning_rate=clu_metrics.LastValue.from_model_output(learning_rate))
    new_state = dict(state, step=state["step"] + 1, params=params, opt_state=opt_state)
    if "fp8" in state:
      new_state["fp8"] = fp8_state
    return new_state, metrics

  return train_step


def make_eval_step(task: task_lib.Task, *, with_terms: bool = True):
  """Returns the pure `eval_step(params, batch) -> (clu Collection of the terms, predictions)`:
  one forward pass without dropout; predictions ({} without `task.predict`) carry the batch's
  example_weight, so padding rows can be dropped. Without terms (for sets without labels) the
  Collection is empty. An fp8 model is evaluated in its compute dtype, as it exports
  (`bertjax.models.fp8.without_fp8`)."""

  def eval_step(params, batch):
    outputs = heads.apply_to_batch(fp8.without_fp8(task.model_for(batch)), params, batch,
                                   deterministic=True)
    weight = batch["example_weight"]
    # Padded rows or packed slots (example_weight [batch] or [batch, k], 0) count for no term.
    terms = {name: (values, weights * weight.reshape(weight.shape
                                                     + (1,) * (weights.ndim - weight.ndim)))
             for name, (values, weights) in task.terms(outputs, batch).items()
             } if with_terms else {}
    predictions = {}
    if task.predict is not None:
      predictions = dict(task.predict(outputs, batch), example_weight=weight)
    return clu_metrics.Collection.create_collection(**task_lib.averages(terms)), predictions

  return eval_step


@dataclasses.dataclass
class Setup:
  """The mesh, the jitted functions and the shardings of one run (see `build`)."""
  mesh: jax.sharding.Mesh
  abstract_state: TrainState  # ShapeDtypeStructs with .sharding
  init_state: Callable[[], TrainState]
  compile_init: Callable[[], Callable[[], TrainState]]  # init_state compiled (the fast way)
  # (state, batch, learning_rate) -> (state, metrics), jitted with donated state
  train_step: Callable[[TrainState, Any, Any], tuple[TrainState, Any]]
  eval_step: Callable[[Params, Any], tuple[Any, dict]]
  predict_step: Callable[[Params, Any], tuple[Any, dict]]  # eval_step without the terms
  # step n (0-based) -> the schedule's learning rate of the n-th update, a float32 numpy
  # scalar computed on the host's CPU: the train step's third argument
  learning_rate: Callable[[int], np.ndarray]


def make_checked_mesh(config: run_config.TrainingRun,
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


def under_mesh(mesh: jax.sharding.Mesh, fn: Callable) -> Callable:
  """`fn`, traced with `mesh` as the context mesh (`jax.sharding.get_abstract_mesh()` inside
  it, in whichever thread jit traces it) and with bertjax's logical axis rules
  (`parallel.LOGICAL_RULES`): the model's fused attention kernels read the mesh to run on each
  device's shard of the batch and the heads (`bertjax.models.attention.attend`), and its
  activation constraints (`bertjax.models.layers.constrain`) the rules."""

  @functools.wraps(fn)
  def traced_under_mesh(*args):
    with (jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
          nn.logical_axis_rules(parallel.LOGICAL_RULES)):
      return fn(*args)

  return traced_under_mesh


def build(config: run_config.TrainingRun, task: task_lib.Task, init_batch: task_lib.Batch,
          mesh: jax.sharding.Mesh) -> Setup:
  """Builds the state's shardings over `mesh` and the jitted init / train / eval functions;
  `init_batch` (a per-host batch) gives the shapes the parameters are initialised with. `config`
  is a typed run config (`bertjax.run_config`): its seed and train section."""
  model_config = getattr(task.model, "config", None)
  tx, schedule = make_optimizer(config.train, model_config, task.schedule)
  prng = prng_impl(config.train)
  rng = jax.random.key(config.seed, impl=PRNG_IMPLS[prng])
  init_rng, dropout_rng = jax.random.split(rng)

  init_variables = functools.partial(heads.init_variables_from_batch, task.model)
  boxed = jax.eval_shape(init_variables, init_rng, init_batch)
  params_sharding = parallel.param_shardings(boxed["params"], mesh)
  abstract_params = nn.unbox(boxed["params"])
  state_sharding = dict(
      step=parallel.replicated(mesh), params=params_sharding,
      opt_state=parallel.optimizer_state_shardings(tx, abstract_params, params_sharding, mesh),
      rng=parallel.replicated(mesh))
  # An fp8 model's scaling state (a few kB a matmul), replicated, beside the parameters: no
  # optimizer, clip or norm sees it; a model without fp8 has no "fp8" entry.
  fp8_shapes = boxed.get(fp8.COLLECTION)
  if fp8_shapes is not None:
    check_fp8(config, task)
    state_sharding["fp8"] = jax.tree.map(lambda _: parallel.replicated(mesh), fp8_shapes)

  # The init sees the batch's shapes, not its values (zeros in their place): its program holds
  # no batch as constants (at BERT-base's pretraining batch, megabytes of them), so runs that
  # differ only in their data compile it once (the compilation cache).
  batch_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), init_batch)

  def init_state() -> TrainState:
    batch = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), batch_shapes)
    variables = nn.unbox(init_variables(init_rng, batch))
    params = variables["params"]
    state = dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                 rng=jax.random.key_data(dropout_rng))
    return dict(state, fp8=variables[fp8.COLLECTION]) if fp8_shapes is not None else state

  jitted_init = jax.jit(under_mesh(mesh, init_state), out_shardings=state_sharding)

  @functools.cache
  def compile_init() -> Callable[[], TrainState]:
    # On a GPU, threefry's default lowering unrolls its 20 rounds inline at each of the
    # init's hash calls (a fold_in per module, a draw per random parameter): BERT-base's init
    # took 3 min 47 s to compile on an H100. The kernel lowering makes each call one CUDA
    # kernel instead and compiled fast on an H200; it computes the same bits, and changes
    # nothing on CPU or TPU, nor for rbg. Only the init, which runs once, is lowered so: the
    # train step keeps XLA's dropout draws fused into their consumers.
    with jax_config.threefry_gpu_kernel_lowering(True):
      return jitted_init.lower().compile()

  # init_state's shapes, without tracing the model's init again: the optimizer's state and the
  # key data follow from the parameters' shapes.
  state_shapes = dict(
      step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
      opt_state=jax.eval_shape(tx.init, abstract_params),
      rng=jax.eval_shape(jax.random.key_data, dropout_rng),
      **({} if fp8_shapes is None else {"fp8": fp8_shapes}))
  abstract_state = jax.tree.map(
      lambda shape, sharding: jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
      state_shapes, state_sharding)
  batch_sharding = parallel.batch_sharding(mesh)

  train_step = jax.jit(
      under_mesh(mesh, make_train_step(
          task, lambda rate: make_optimizer(config.train, model_config, task.schedule, rate)[0],
          config.train.grad_accum_steps, prng)),
      in_shardings=(state_sharding, batch_sharding, parallel.replicated(mesh)),
      out_shardings=(state_sharding, parallel.replicated(mesh)), donate_argnums=0)

  # Replicated outputs: every host gets the metrics and predictions of the whole global batch.
  eval_step, predict_step = (
      jax.jit(under_mesh(mesh, make_eval_step(task, with_terms=with_terms)),
              in_shardings=(params_sharding, batch_sharding),
              out_shardings=parallel.replicated(mesh)) for with_terms in (True, False))
  return Setup(mesh=mesh, abstract_state=abstract_state,
               init_state=lambda: compile_init()(), compile_init=compile_init,
               train_step=train_step, eval_step=eval_step, predict_step=predict_step,
               learning_rate=host_schedule(schedule))


def check_fp8(config: run_config.TrainingRun, task: task_lib.Task) -> None:
  """Raises UserError where an fp8 model (config.model.fp8) meets what cannot carry its
  scaling state: a task that differentiates its own loss (`task.Task.gradient`)."""
  if task.gradient is not None:
    raise UserError(f"model.fp8=true: task {config.task!r} computes its own gradient, which "
                    "does not carry fp8's scaling state; set --config.model.fp8=false.")


def host_schedule(schedule: optax.Schedule) -> Callable[[int], np.ndarray]:
  """`schedule` as a function of the step on the host: step -> float32 numpy scalar, computed by
  one small program on the CPU (in a GPU or TPU run too: no transfer from the accelerator, so
  the loop never waits for its steps), the same on every host."""
  cpu = jax.local_devices(backend="cpu")[0]
  rate = jax.jit(schedule)

  def learning_rate(step: int) -> np.ndarray:
    with jax.default_device(cpu):
      return np.asarray(rate(np.int32(step)), np.float32)

  return learning_rate


def _real_rows(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Concatenates per-batch predictions and drops the padding rows (example_weight 0)."""
  if not outputs or not outputs[0]:
    return {}
  joined = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  real = joined.pop("example_weight") > 0
  return {k: v[real] for k, v in joined.items()}


def run_eval_step(setup: Setup, params: Params, batches: Iterable[task_lib.Batch],
                  max_batches: int = -1, *, with_terms: bool = True
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
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


def evaluate(setup: Setup, task: task_lib.Task, params: Params, max_batches: int = -1,
             step: int = 0) -> tuple[dict[str, float], dict[str, np.ndarray] | None]:
  """One pass over the held-out batches an evaluation after `step` reads
  (`Batches.eval_at`): (the task's metrics, its predictions or None)."""
  totals, predictions = run_eval_step(setup, params, task.batches.eval_at(step)(), max_batches)
  predictions = predictions if task.predict is not None else None
  metrics = task.score(totals, predictions) if task.score else task_lib.means(totals)
  return metrics, predictions


def compiled_ahead(setup: Setup, task: task_lib.Task, first_batch: task_lib.Batch, *,
                   init: bool, executor: concurrent.futures.Executor) -> Setup:
  """`setup` whose init (when `init`), train step and eval step are compiled in `executor`,
  side by side, for `first_batch`'s shape and those of `task.batches.samples`
  (`bertjax.training.compile_ahead`); first what the run needs first."""
  if init:
    compiled_init = executor.submit(setup.compile_init)
    setup = dataclasses.replace(setup, init_state=lambda: compiled_init.result()())
  train_step = compile_ahead.PerShape(setup.train_step, setup.abstract_state, setup.mesh,
                                      executor, trailing=[setup.learning_rate(0)])
  train_step.prepare([first_batch])
  eval_step = compile_ahead.PerShape(setup.eval_step, setup.abstract_state["params"],
                                     setup.mesh, executor)
  if task.batches.samples is not None:
    train_samples, eval_samples = task.batches.samples()
    train_step.prepare(compile_ahead.distinct_shapes(train_samples))
    if task.batches.eval is not None:
      eval_step.prepare(compile_ahead.distinct_shapes(eval_samples))
  return dataclasses.replace(setup, train_step=train_step, eval_step=eval_step)
