"""The trainer's entry point and its loop: from the start state to the last step, evaluating and
saving on the way.

A task's `run` calls `run_context` (the mesh, built once and checked against the batch sizes,
and this process's place: the `RunContext` it makes its `Task` with) and then
`train_and_evaluate`, which runs the `Task` (`bertjax.training.task`) with the trainer's
services: the jitted steps over the mesh (`bertjax.training.steps`), checkpoints
(`bertjax.training.checkpoint`), an agreed stop on SIGTERM or SIGINT
(`bertjax.training.preemption`), the divergence guard (`bertjax.training.divergence`: stop, or
roll back to the newest checkpoint and skip the batches that led to the divergence), and the run's
reports (`bertjax.training.reports`: progress bar aside, metrics.jsonl, TensorBoard,
eval_results.json, curves.png). It writes WORKDIR/config.json and the task's files at the start
and, after the last step, the task's prediction files.

Where a run starts from, in this order: the latest checkpoint in WORKDIR/checkpoints (resume:
parameters, optimizer state, step, rng and data position); else `config.init_checkpoint`
(parameters only; anything it lacks is freshly initialised, and a head of other shapes, e.g.
another number of labels, stays fresh with a message); else from scratch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
from typing import Any, Iterator, Mapping

import jax
import numpy as np
import tqdm
from etils import epath

from bertjax import run_config
from bertjax.errors import UserError
from bertjax.modeldir import checkpoint_faults, saved_params
from bertjax.training import (checkpoint, compile_ahead, divergence, parallel, preemption,
                              reports, steps)
from bertjax.training import task as task_lib
from bertjax.workdir import CHECKPOINTS_DIR, CONFIG_FILE


def _raise_full_disk(error: BaseException | None, checkpoints: checkpoint.Checkpoints,
                     workdir: epath.Path) -> None:
  """Turns `error`, if it is a write to a full disk (metrics.jsonl, TensorBoard, curves.png),
  into one UserError; other errors pass. A background checkpoint save that filled the disk is
  the likelier cause, and `checkpoints.wait` then raises its own message (partial save removed,
  steps kept); otherwise the message names the workdir's disk and the step a rerun resumes from.
  """
  if not isinstance(error, OSError) or not checkpoint_faults.is_disk_full(error):
    return
  checkpoints.wait()
  kept = checkpoints.all_steps()
  resume = f"it resumes from step {kept[-1]}" if kept else "with no checkpoint yet, it starts over"
  written = error.filename or "the run's reports"
  raise UserError(f"the disk holding {workdir} is full ({error.strerror}) while writing "
                  f"{written}. Free space on that disk, then rerun the same command: "
                  f"{resume}.") from error


def run_context(config: run_config.TrainingRun, devices: list[jax.Device] | None = None
                ) -> task_lib.RunContext:
  """The mesh of `config` (a typed run config) over `devices` (default: all), checked against
  its batch sizes (UserError), and this process's place: what a task is made with."""
  mesh = steps.make_checked_mesh(config, devices)
  shards = parallel.num_batch_shards(mesh) * config.train.grad_accum_steps
  return task_lib.RunContext(mesh=mesh, process_index=jax.process_index(),
                             process_count=jax.process_count(),
                             row_multiple=math.lcm(shards, jax.process_count()))


def restore_or_init(config: run_config.TrainingRun, setup: steps.Setup,
                    checkpoints: checkpoint.Checkpoints,
                    vocab_size: int | None = None, init_params=None
                    ) -> tuple[steps.TrainState, dict | None]:
  """The start state: latest checkpoint, else the task's own starting parameters
  (`init_params`: `task.Task.init_params`), else init_checkpoint's parameters, else fresh.

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
  if init_params is not None:
    return dict(state, params=init_params(state["params"])), None
  if config.init_checkpoint:
    head = [name for name in state["params"] if name != "bert"]
    params, report = saved_params.load_params(config.init_checkpoint, state["params"],
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


def _write_workdir_files(config: run_config.TrainingRun, workdir: epath.Path,
                         files: Mapping[str, str | bytes]) -> None:
  """WORKDIR/config.json (the typed config as run) and the task's files (`Task.files`), from
  host 0."""
  if jax.process_index() != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
  for name, data in files.items():
    (workdir / name).parent.mkdir(parents=True, exist_ok=True)  # e.g. 1_Pooling/config.json
    if isinstance(data, bytes):
      (workdir / name).write_bytes(data)
    else:
      (workdir / name).write_text(data)


def _first_drawn(batches: Iterator[Any]) -> Iterator[Any]:
  """`batches` with its first item drawn now (a bad data position raises here), then served
  in order as before."""
  first = next(batches)
  return itertools.chain([first], batches)


def train_and_evaluate(config: run_config.TrainingRun, workdir: str, task: task_lib.Task,
                       context: task_lib.RunContext) -> dict[str, float]:
  """Trains `task` (made with `context`) to its schedule's last step, evaluating and
  checkpointing on the way; `config` is the typed run config (`bertjax.run_config`).

  Every log, eval and checkpoint step checks the steps since the last check for a divergence
  (a loss, gradient norm or parameter norm that is NaN or infinite, or a loss or gradient-norm
  spike: `bertjax.training.divergence`), always before a checkpoint is written, so no
  checkpoint ever holds a step from after one and the newest is always from before it. Under
  config.divergence.policy=stop it stops the run with a UserError naming the step; under
  rollback the run restores the newest checkpoint, skips the batches that the abandoned steps
  trained on (and divergence.skip_batches more), logs the rollback and goes on, up to
  divergence.max_rollbacks times. A run with the rollback policy and no checkpoint yet first
  saves its start as step 0, to return to.

  Returns the last evaluation's metrics (empty without held-out data). Checks every input that
  can be wrong (shapes, batch sizes, an incompatible checkpoint or data position) before writing
  to the workdir.
  """
  workdir = epath.Path(workdir)
  schedule = task.schedule
  divergence.check_config(config.divergence, schedule.num_train_steps,
                          schedule.checkpoint_every_steps)
  # The config as run: its train section with the task's steps and intervals (a fine-tuning
  # config leaves them at -1 until its data is read), as config.json and messages show them.
  config = dataclasses.replace(config, train=dataclasses.replace(
      config.train, **dataclasses.asdict(schedule)))
  tr = config.train
  with contextlib.ExitStack() as stack:
    # Entered first: a signal while the run starts (restoring, compiling) stops it after its
    # first step instead of killing one host.
    stop_signal = stack.enter_context(preemption.StopSignal())
    executor = stack.enter_context(compile_ahead.pool())
    first_batch = next(task.batches.train(None))[0]
    setup = steps.build(config, task, first_batch, context.mesh)
    # On an error, its background writes are waited for before the error leaves (abandon).
    checkpoints = stack.enter_context(checkpoint.Checkpoints(
        workdir / CHECKPOINTS_DIR, save_every_steps=schedule.checkpoint_every_steps,
        keep=tr.keep_checkpoints, prng_impl=steps.prng_impl(tr)))
    stack.push(lambda _, error, __: _raise_full_disk(error, checkpoints, workdir))
    setup = steps.compiled_ahead(setup, task, first_batch, executor=executor,
                                 init=checkpoints.latest_step() is None)
    state, position = restore_or_init(config, setup, checkpoints,
                                      getattr(task.model.config, "vocab_size", None),
                                      task.init_params)
    start_step = int(state["step"])
    guard = divergence.Guard(config.divergence, start_step and checkpoints.guard_record(
        start_step), start_step)
    total = schedule.num_train_steps
    # Where this process stops: the end of the run, or earlier for a time-boxed job.
    stop = total if tr.stop_after_steps < 0 else min(total, tr.stop_after_steps)
    if start_step:
      print(f"resuming from step {start_step} of {workdir / CHECKPOINTS_DIR}")
    # The first batch is drawn before anything is written: a data position that this data
    # cannot serve (a checkpoint of other data) is refused with the workdir as it was.
    batches = _first_drawn(task.batches.train(position))
    _write_workdir_files(config, workdir, task.files)
    log = reports.Reports(workdir, bert_config=task.model.config, dtype=task.model.config.dtype,
                          devices=list(setup.mesh.devices.flat), main_metric=task.main_metric,
                          start_step=start_step)
    stack.callback(log.close)
    eval_metrics: dict[str, float] = {}
    eval_predictions: dict[str, np.ndarray] | None = None

    def run_eval(step: int) -> dict[str, float]:
      nonlocal eval_predictions
      if task.batches.eval is None:
        return {}
      metrics, eval_predictions = steps.evaluate(setup, task, state["params"], tr.eval_steps,
                                                 step)
      log.write_eval(step, metrics)
      return metrics

    # Closed on the way out, an error's too: the error's line then starts on a line of its own.
    bar = stack.enter_context(tqdm.tqdm(
        total=total, initial=start_step, desc="train", unit="step",
        disable=jax.process_index() != 0, dynamic_ncols=True, mininterval=1.0))
    step = start_step
    unchecked: list[tuple[int, Any]] = []  # (step, metrics) not yet checked for a divergence

    def check() -> dict[str, Any] | None:
      """Checks the steps since the last check; after a divergence, rolls back (returns the
      rollback's entry) or stops the run (UserError), after the saves already started (all from
      before it) are written."""
      nonlocal state, position, batches, step
      diverged = guard.check(unchecked)
      unchecked.clear()
      if diverged is None:
        return None
      if not guard.can_roll_back():
        bar.close()
        checkpoints.close()
        raise UserError(divergence.message(diverged, tr, guard, checkpoints.all_steps(),
                                           checkpoints.directory))
      checkpoints.wait()
      restored_step = checkpoints.latest_step()
      state = None  # its buffers go before the checkpoint's are read
      state, position = checkpoints.restore(setup.abstract_state, restored_step)
      skipped = guard.batches_to_skip(diverged, restored_step)
      if task.batches.skip is not None:
        position = task.batches.skip(position, skipped)
        batches = task.batches.train(position)
      else:  # the stream goes on from after the dropped batches
        batches = task.batches.train(position)
        for _ in range(skipped):
          _, position = next(batches)
      entry = guard.rolled_back(diverged, restored_step, checkpoints.guard_record(restored_step),
                                skipped, position)
      step = restored_step
      log.rewind(step, entry)
      bar.reset(total)
      bar.update(step)
      tqdm.tqdm.write(guard.rollback_line(entry))
      return entry

    if guard.config.policy == "rollback" and checkpoints.latest_step() is None:
      # A start to return to.
      checkpoints.save(0, state, position, force=True, guard=guard.record())
    while step < stop:
      batch, position = next(batches)
      # The rate is an argument of the step (after a rollback, maybe the guard's lower one).
      learning_rate = np.float32(setup.learning_rate(step) * guard.lr_factor(step))
      state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh),
                                        learning_rate)
      log.add(metrics, batch)
      step += 1
      unchecked.append((step, metrics))
      bar.update(1)
      logging = step % schedule.log_every_steps == 0 or step == total
      evaluating = step % schedule.eval_every_steps == 0 or step == total
      stopping = stop_signal.should_stop(step)
      saving = checkpoints.due(step, force=step == stop or stopping)
      if (logging or evaluating or saving) and check() is not None:
        if stopping:  # the checkpoint rolled back to is this stop's: a rerun goes on from it
          tqdm.tqdm.write(f"{stop_signal.received or 'SIGTERM or SIGINT on some host'}: "
                          f"stopped at the checkpoint of step {step} just rolled back to; rerun "
                          "the same command to resume.")
          break
        continue
      if logging:
        bar.set_postfix(log.write_train(step), refresh=False)
      if evaluating:
        eval_metrics = run_eval(step)
        log.restart_clock()
      checkpoints.save(step, state, position, force=step == stop or stopping,
                       guard=guard.record() if saving else None)
      if stopping:
        tqdm.tqdm.write(f"{stop_signal.received or 'SIGTERM or SIGINT on some host'}: saved a "
                        f"checkpoint at step {step}; rerun the same command to resume.")
        break
    bar.close()
    log.finish(step)  # curves.png: with the training steps after the last evaluation
    if step == total and task.write is not None:
      write = task.write if jax.process_index() == 0 else lambda *_: None
      if eval_predictions is not None:
        write("eval", eval_predictions, workdir)
      for name, make_batches in task.batches.predict.items():
        write(name, steps.run_eval_step(setup, state["params"], make_batches(),
                                        with_terms=False)[1], workdir)
    checkpoints.close()
    return eval_metrics
