"""One fine-tuning task for every dataset: a pretrained BERT, a head, and a `Spec` that says what
differs (GLUE, SQuAD, NER and SWAG are each one spec module, bertjax/tasks/{glue,squad,ner,
swag}.py).

A new fine-tuning task is a spec plus a config of a few lines over configs/finetuning.py:

  SPEC = finetuning.Spec(
      name="my task", read=read,
      model=lambda bert_config, data: heads.BertForSequenceClassification(
          bert_config, data.num_labels),
      terms=terms, predict=predict, score=score, write=write,
      main_metric=lambda config: "accuracy", schema=MyTaskRun)
  finetuning.run(SPEC, config, workdir)     # or a line in bertjax/tasks/__init__.py's REGISTRY

where MyTaskRun is a `run_config.FinetuningRun` whose data section adds the task's fields.

What this module does for every spec: it loads `config.init_checkpoint`'s model directory (its
bert_config.json with this run's dropout and dtype, and its tokenizer), reads the data through
the spec, batches the features (shuffled for training, in order and padded for evaluation; each
batch cut to a length bucket where the spec allows it, below), measures the run in epochs
(train.num_train_epochs; num_train_steps and warmup_steps are derived only when left at -1, and
returned in the Task's `Schedule`), reports the eval loss next to the spec's scores, and hands
the trainer one `task.Task`, made with the trainer's `RunContext` (the hosts and the multiple the
batches' rows come in). The
fine-tuned workdir gets bert_config.json and the tokenizer, so it is a model directory in turn.
With `model.bilstm_on_top` the spec's model gets the paper's BiLSTM between encoder and head
(`model_of`; every heads.BertFor* fine-tuning model takes it; not with packing).

Length buckets (`data.length_buckets`): sentences are mostly far shorter than max_seq_length, so
padding every batch to it wastes most of the work. With buckets, each training and evaluation
batch is cut to the smallest bucket that holds the longest example of its global batch
(`bertjax.data.pipeline`); the jitted steps compile once per bucket used (a batch's longest
example varies little, so a run uses two or three). "auto" (the default) is every multiple of 32
up to max_seq_length; "32,64,128" names them (max_seq_length is always added); "" pads every
batch to max_seq_length (the policy: `bertjax.data.finetuning.batching`). With
model.attention=splash, every bucket is rounded up to a multiple of 128, as splash needs. Only a
spec whose loss and predictions ignore padding (`Spec.padding_invariant`: GLUE, NER, SWAG) is
cut, so per-example outputs are those of full padding; SQuAD keeps max_seq_length (run_squad's
softmax spans the padding too).

Packing (`data.packing=k`, sequence classification: `Spec.packable`, GLUE): each global batch of
train.batch_size examples is laid out k to a row (`bertjax.data.pipeline`), each example pooled
from its own [CLS] and attending only to itself, with the rows cut to the length buckets (up to
k * max_seq_length). The batch is still the same examples, so the loss, the steps and the data
positions are those of unpacked batches; evaluation predictions are put back in the examples'
order. Short sentences then cost their own tokens, not a bucket's padding. The default,
data.packing="auto" (`batching.auto_packing`), packs where this is exact and pays: a packable
spec with length buckets, as many examples a row as fit in max_seq_length on average (the
bundled movie reviews at 128: 4); every other task, and model.bilstm_on_top, stays unpacked. The
run's first line says how many examples a row it took.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from etils import epath

from bertjax import run_config, tokenization
from bertjax.data.finetuning import batching
from bertjax.data.pipeline import FeatureBatches
from bertjax.errors import UserError
from bertjax.modeldir import model_files, model_options
from bertjax.models import attention
from bertjax.models.config import BertConfig
from bertjax.training import task as task_lib
from bertjax.training import train

Features = Mapping[str, np.ndarray]  # {key: [N, ...]}, every key with the same N
# Batches whose widths are compiled ahead (`Batches.samples`); rarer widths compile when met.
SAMPLED_TRAIN_BATCHES, SAMPLED_EVAL_BATCHES = 200, 1000


@dataclasses.dataclass(frozen=True)
class Data:
  """What a spec's `read` returns.

  Attributes:
    train: the training features with their labels (input_ids, segment_ids, input_mask
      [N, seq] int32 or [N, choices, seq], and the label keys the spec's terms read).
    eval: the features scored at every evaluation.
    predict: {set name: features} predicted after the last step (e.g. a test split).
    num_labels: the head's outputs, for `Spec.model`.
    examples_per_epoch: what an epoch counts (SQuAD: questions, not windows); None: the rows
      of `train`.
    files: workdir files of the task (e.g. labels.json), written with bert_config.json.
    context: whatever `score` and `write` need (the examples, their windows, the label names).
    summary: one line that describes the data, printed at the start.
  """
  train: Features
  eval: Features
  predict: Mapping[str, Features] = dataclasses.field(default_factory=dict)
  num_labels: int = 0
  examples_per_epoch: int | None = None
  files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
  context: Any = None
  summary: str = ""


@dataclasses.dataclass(frozen=True)
class Spec:
  """A fine-tuning task: everything that differs between two of them.

  Attributes:
    name: the task in words, for messages (e.g. "GLUE fine-tuning").
    read: (config, tokenizer, workdir) -> Data; raises UserError on bad files or fields.
    model: (bert_config, data) -> a heads.BertFor* model.
    terms: (model outputs, batch) -> task.Terms, traced in jit: "loss" is the objective; e.g.
      {"loss": (cross-entropy [batch], batch["example_weight"]), "accuracy": (hits, weights)}.
      A batch without labels (predict sets, SQuAD's eval windows) may give {}.
    predict: (model outputs, batch) -> {name: [batch, ...]} per-example predictions.
    score: (data, predictions {name: [N, ...]} of the eval set) -> the task's metrics (e.g.
      GLUE's, SQuAD's official scores). The eval loss is reported beside them when the eval
      batches have labels.
    write: (data, set name, predictions, workdir) -> None: the official output files; "eval" is
      the last evaluation's set, the others are Data.predict's.
    main_metric: config -> the name, among `score`'s metrics, of the one the paper reports for
      the task (higher is better; e.g. "f1" for SQuAD): recorded in eval_results.json, plotted
      in curves.png, and what `bertjax.tools.sweep` picks the best run by.
    padding_invariant: the loss and the predictions at real tokens do not depend on padding
      positions (attention masks them, loss weights are 0 there), so batches may be cut to
      data.length_buckets. Predictions shaped like the batch's input_mask ([batch, seq, ...],
      e.g. NER's tags) are padded back with zeros to the features' length, so `score` and
      `write` see the shapes of full padding.
    packable: the model takes packed batches and gives one output per packed sequence
      (heads.BertForSequenceClassification: [batch, k, ...] with cls_positions), and `terms`
      and `predict` work on labels and example weights of shape [batch, k]: data.packing may
      lay out several examples a row.
    schema: the task's config schema (`bertjax.run_config`): a FinetuningRun whose data section
      has the fields `read` reads.
  """
  name: str
  read: Callable[[Any, tokenization.Tokenizer, str], Data]
  model: Callable[[BertConfig, Data], nn.Module]
  terms: Callable[[Any, Mapping[str, Any]], task_lib.Terms]
  predict: Callable[[Any, Mapping[str, Any]], dict[str, Any]]
  score: Callable[[Data, dict[str, np.ndarray]], dict[str, float]]
  write: Callable[[Data, str, dict[str, np.ndarray], epath.Path], None]
  main_metric: Callable[[Any], str]
  padding_invariant: bool = False
  packable: bool = False
  schema: type = run_config.FinetuningRun


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """The model a fine-tuning run starts from.

  Attributes:
    model_dir: the directory of init_checkpoint's bert_config.json and tokenizer.
    bert_config: its BertConfig with this run's dropout and compute dtype.
    tokenizer: its tokenizer.
    files: bert_config.json and the tokenizer files, for the run's workdir (`task.Task.files`),
      so that a fine-tuned workdir is itself a model directory.
  """
  model_dir: str
  bert_config: BertConfig
  tokenizer: tokenization.Tokenizer
  files: Mapping[str, str | bytes]


def load_pretrained(config: run_config.FinetuningRun, what: str) -> Pretrained:
  """The pretrained model of `config.init_checkpoint`, checked against the config.

  Args:
    config: a fine-tuning config.
    what: the task in words, for the errors (e.g. "GLUE fine-tuning").
  Raises:
    UserError: no init_checkpoint, no model directory there, a model.architecture that is not
      the model's, or a model that does not fit the run (`model_options.check_fits`).
  """
  if not config.init_checkpoint:
    raise UserError(f"{what} starts from a pretrained model: set --config.init_checkpoint to a "
                    "pretraining workdir or a directory from `python -m bertjax.convert "
                    "--from=hf|tf`.")
  model_dir = model_files.find_model_dir(config.init_checkpoint)
  saved = model_files.load_bert_config(model_dir)
  if config.model.architecture and config.model.architecture != saved.architecture:
    raise UserError(f"model.architecture={config.model.architecture} but {model_dir} holds a "
                    f"{saved.architecture} model; leave --config.model.architecture unset (the "
                    "model's own) or name a model of that architecture.")
  try:
    bert_config = dataclasses.replace(saved, **model_options.bert_overrides(config.model))
  except ValueError as e:
    raise UserError(f"bad model config: {e}".rstrip(".") + ". Check the config.model fields.") \
        from None
  tokenizer = model_files.load_tokenizer(model_dir)
  model_options.check_fits(bert_config, tokenizer.vocab_size, [config.data.max_seq_length],
                           model_dir)
  files = {model_files.BERT_CONFIG_FILE: model_files.bert_config_json(bert_config),
           **model_files.tokenizer_file_contents(model_dir)}
  return Pretrained(model_dir, bert_config, tokenizer, files)


def length_buckets(config: run_config.FinetuningRun, examples_a_row: int = 0
                   ) -> tuple[int, ...]:
  """The bucket lengths of the config's data.length_buckets (`batching.length_buckets`), rounded
  up to splash attention's multiple where model.attention=splash."""
  multiple = attention.SPLASH_MULTIPLE if config.model.attention == "splash" else 1
  return batching.length_buckets(config.data.length_buckets, config.data.max_seq_length,
                                 examples_a_row, multiple)


def packing(config: run_config.FinetuningRun, spec: Spec, context: task_lib.RunContext,
            train: Features | None = None) -> int:
  """The examples a row of the config's data.packing (`batching.packing`), for `spec`'s model,
  the batch sizes and `context`'s row multiple; "auto" measures the training features `train`."""
  auto = str(config.data.packing).strip().lower() == "auto"
  rows = batching.Packable(
      task=spec.name, packable=spec.packable,
      # Asked of "auto" alone; a packed row is k x max_seq_length wide without buckets.
      exact=(auto and spec.padding_invariant and not config.model.bilstm_on_top
             and bool(length_buckets(config))),
      bilstm_on_top=config.model.bilstm_on_top, max_seq_length=config.data.max_seq_length,
      batch_sizes={"batch_size": config.train.batch_size,
                   "eval_batch_size": config.train.eval_batch_size},
      row_multiple=context.row_multiple)
  return batching.packing(config.data.packing, rows, None if train is None
                          else train["input_mask"])


def feature_batches(config: run_config.FinetuningRun, context: task_lib.RunContext,
                    features: Features, *, training: bool, buckets: tuple[int, ...] = (),
                    examples_a_row: int = 0) -> FeatureBatches:
  """This host's batches of `features`: train.batch_size, shuffled, for training; else
  train.eval_batch_size in order (for evaluation and prediction); cut to `buckets`, packed
  `examples_a_row` to a row (0: unpacked)."""
  size = config.train.batch_size if training else config.train.eval_batch_size
  return FeatureBatches(features, batch_size=size // context.process_count, seed=config.seed,
                        process_index=context.process_index,
                        process_count=context.process_count, shuffle=training,
                        length_buckets=buckets, packing=examples_a_row)


def in_example_order(predictions: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Predictions of packed batches ([N] each, in packed order, with example_index) in the
  examples' order, without example_index; others as they are."""
  predictions = dict(predictions)
  if "example_index" not in predictions:
    return predictions
  order = np.argsort(predictions.pop("example_index"), kind="stable")
  return {name: value[order] for name, value in predictions.items()}


def full_length(predictions: Mapping[str, jax.Array], input_mask_shape: tuple[int, ...],
                seq: int) -> dict[str, jax.Array]:
  """`predictions` with every array shaped like the batch's input_mask ([batch, ..., cut] or
  [batch, ..., cut, ...]) padded with zeros on that axis to `seq` (traced in jit)."""
  axis, cut = len(input_mask_shape) - 1, input_mask_shape[-1]
  if cut == seq:
    return dict(predictions)

  def pad(x):
    if tuple(x.shape[:axis + 1]) != tuple(input_mask_shape):
      return x
    return jax.numpy.pad(x, [(0, seq - cut) if i == axis else (0, 0) for i in range(x.ndim)])

  return {name: pad(x) for name, x in predictions.items()}


def schedule(train: run_config.FinetuningTrain, num_examples: int
             ) -> tuple[task_lib.Schedule, int]:
  """The run's schedule, with what the config leaves at -1 derived: num_train_steps from
  num_train_epochs, warmup_steps from warmup_proportion, the eval and checkpoint intervals as one
  epoch. Values the user set are kept.

  The steps are google-research/bert's: `int(num_examples / batch_size * num_train_epochs)`
  (run_classifier.py and run_squad.py), so the last epoch's partial batch counts towards them
  (MRPC, 3,668 examples at batch 32 for 3 epochs: 343 steps; RTE, 2,490: 233), at least 1.

  Args:
    train: the config's train section.
    num_examples: the examples of one epoch (SQuAD: questions, not windows).
  Returns:
    (the schedule, the steps of one epoch: whole global batches, num_examples // batch_size, at
    least 1).
  """
  steps_per_epoch = max(1, num_examples // train.batch_size)
  steps = train.num_train_steps
  if steps < 0:
    steps = max(1, int(num_examples / train.batch_size * train.num_train_epochs))
  warmup = train.warmup_steps
  if warmup < 0:
    warmup = int(train.warmup_proportion * steps)
  every_epoch = lambda value: value if value >= 1 else steps_per_epoch
  return task_lib.Schedule(
      num_train_steps=steps, warmup_steps=warmup, log_every_steps=train.log_every_steps,
      eval_every_steps=every_epoch(train.eval_every_steps),
      checkpoint_every_steps=every_epoch(train.checkpoint_every_steps)), steps_per_epoch


def model_of(spec: Spec, config: run_config.FinetuningRun, bert_config: BertConfig,
             data: Data) -> nn.Module:
  """The spec's model, with the paper's BiLSTM on top (`heads`, bilstm_on_top) when
  config.model.bilstm_on_top says so.

  Raises:
    UserError: bilstm_on_top for a model that does not take it.
  """
  model = spec.model(bert_config, data)
  if not config.model.bilstm_on_top:
    return model
  if not hasattr(model, "bilstm_on_top"):
    raise UserError(f"model.bilstm_on_top: the model of {spec.name} ({type(model).__name__}) "
                    "takes no BiLSTM on top; set --config.model.bilstm_on_top=false.")
  return model.clone(bilstm_on_top=True)


def make_task(spec: Spec, config: run_config.FinetuningRun, workdir: str,
              context: task_lib.RunContext) -> task_lib.Task:
  """Reads the data through `spec` and builds the trainer's Task, its schedule counted from the
  data (`schedule`), this host's batches as `context` says."""
  pretrained = load_pretrained(config, spec.name)
  data = spec.read(config, pretrained.tokenizer, workdir)
  k = packing(config, spec, context, data.train)
  buckets = length_buckets(config, k) if spec.padding_invariant else ()
  train_batches = feature_batches(config, context, data.train, training=True, buckets=buckets,
                                  examples_a_row=k)
  eval_batches = feature_batches(config, context, data.eval, training=False, buckets=buckets,
                                 examples_a_row=k)
  run_schedule, steps_per_epoch = schedule(
      config.train, train_batches.num_examples if data.examples_per_epoch is None
      else data.examples_per_epoch)
  predict_sets = {name: feature_batches(config, context, features, training=False,
                                       buckets=buckets, examples_a_row=k).eval_batches
                  for name, features in data.predict.items()}

  def predict(outputs, batch):
    if "example_index" in batch:  # packed: [batch, k], with each example's index (to reorder)
      return dict(spec.predict(outputs, batch), example_index=batch["example_index"])
    seq = data.eval["input_mask"].shape[-1]  # the features' length, before any cut
    return full_length(spec.predict(outputs, batch), batch["input_mask"].shape, seq)

  def score(totals, predictions):
    loss = {"loss": float(totals["loss"].compute())} if "loss" in totals else {}
    return {**loss, **spec.score(data, in_example_order(predictions))}

  def write(name, predictions, directory):
    spec.write(data, name, in_example_order(predictions), directory)

  def samples():  # the batches whose widths the first training steps and the evaluation meet
    if not buckets:  # every batch at max_seq_length (or k of it)
      return [], []
    training = (batch for batch, _ in train_batches.iterate(None))
    steps = min(SAMPLED_TRAIN_BATCHES, steps_per_epoch, run_schedule.num_train_steps)
    return (itertools.islice(training, steps),
            itertools.islice(eval_batches.eval_batches(), SAMPLED_EVAL_BATCHES))

  print(f"{data.summary} ({steps_per_epoch} steps per epoch, {run_schedule.num_train_steps} "
        f"steps{f', {k} examples a row' if k else ''})")
  return task_lib.Task(
      model=model_of(spec, config, pretrained.bert_config, data), terms=spec.terms,
      batches=task_lib.Batches(train=train_batches.iterate, eval=eval_batches.eval_batches,
                               predict=predict_sets, samples=samples),
      schedule=run_schedule, predict=predict if buckets or k else spec.predict, score=score,
      write=write, files={**pretrained.files, **data.files}, main_metric=spec.main_metric(config))


def run(spec: Spec, config: run_config.FinetuningRun, workdir: str) -> dict[str, float]:
  """Fine-tunes as `spec` and the config say; returns the last evaluation's metrics."""
  context = train.run_context(config)  # the mesh, once: bad batch sizes fail before any data
  return train.train_and_evaluate(config, workdir, make_task(spec, config, workdir, context),
                                  context)
