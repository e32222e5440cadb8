"""The fine-tuning layer (bertjax.tasks.finetuning): a new task is one spec, the schedule the
config derives from epochs never overrides what the user set, and length buckets give the
outputs of full padding (packing: tests/test_finetuning_packing.py).

The spec below is the only code its task writes: a sentence classifier for "which animal does
the sentence name", read from a two-column TSV file, scored by accuracy, its predictions written
to a file of its own. It trains through `finetuning.run` with configs/finetuning.py plus a few
fields, as a new task's config would.
"""
import csv
import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import metrics, run_config
from bertjax.training import parallel, steps, train
from bertjax.training import task as task_lib
from bertjax.configs import finetuning as finetuning_config
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ANIMALS = ["cat", "dog", "bird"]
FILLER = [f"word{i}" for i in range(30)]


# ---- the throwaway task: everything a new task writes ----------------------------------------


def _read_tsv(path):
  with open(path, encoding="utf-8", newline="") as f:
    return [(int(label), text) for label, text in csv.reader(f, delimiter="\t")]


def _encode(rows, tokenizer, max_seq_length):
  ids = np.zeros((len(rows), max_seq_length), np.int32)
  for i, (_, text) in enumerate(rows):
    tokens = [tokenizer.cls_id, *tokenizer.encode(text)[:max_seq_length - 2], tokenizer.sep_id]
    ids[i, :len(tokens)] = tokens
  return {"input_ids": ids, "segment_ids": np.zeros_like(ids),
          "input_mask": (ids > 0).astype(np.int32),
          "label": np.array([label for label, _ in rows], np.int32)}


def read(config, tokenizer, workdir):
  del workdir
  rows = {split: _read_tsv(os.path.join(config.data.data_dir, f"{split}.tsv"))
          for split in ("train", "dev")}
  return finetuning.Data(
      train=_encode(rows["train"], tokenizer, config.data.max_seq_length),
      eval=_encode(rows["dev"], tokenizer, config.data.max_seq_length),
      num_labels=len(ANIMALS), context=rows["dev"], summary=f"animals: {len(rows['train'])}")


def terms(logits, batch):
  weight = batch["example_weight"]
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]), weight),
          "accuracy": (jnp.argmax(logits, -1) == batch["label"], weight)}


def predict(logits, batch):
  return {"prediction": jnp.argmax(logits, -1), "label": batch["label"]}


def score(data, predictions):
  del data
  return {"accuracy": metrics.accuracy(predictions["label"], predictions["prediction"])}


def write(data, name, predictions, directory):
  lines = [f"{text}\t{ANIMALS[p]}" for (_, text), p in zip(data.context, predictions["prediction"])]
  (directory / f"{name}_animals.tsv").write_text("\n".join(lines) + "\n")


@dataclasses.dataclass(frozen=True)
class AnimalData(run_config.FinetuningData):
  """The task's data section: the fields every fine-tuning task has, and its TSV files'."""
  data_dir: str = ""  # train.tsv and dev.tsv


@dataclasses.dataclass(frozen=True)
class AnimalRun(run_config.FinetuningRun):
  """The task's config schema."""
  task: str = "animals"
  data: AnimalData = dataclasses.field(default_factory=AnimalData)


ANIMAL_SPEC = finetuning.Spec(
    name="animal fine-tuning", read=read,
    model=lambda bert_config, data: heads.BertForSequenceClassification(bert_config,
                                                                        data.num_labels),
    terms=terms, predict=predict, score=score, write=write,
    main_metric=lambda config: "accuracy", schema=AnimalRun)

# ---- the test ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def animal_data(tmp_path_factory):
  directory = tmp_path_factory.mktemp("animals")
  rng = np.random.default_rng(0)
  for split, n in (("train", 384), ("dev", 64)):
    with open(directory / f"{split}.tsv", "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f, delimiter="\t", lineterminator="\n")
      for _ in range(n):
        label = int(rng.integers(len(ANIMALS)))
        words = list(rng.choice(FILLER, size=rng.integers(3, 8)))
        words.insert(int(rng.integers(len(words) + 1)), ANIMALS[label])
        writer.writerow([label, " ".join(words)])
  return directory


@pytest.fixture(scope="module")
def model_dir(random_bert, tmp_path_factory):
  """A random tiny BERT with the animal sentences' vocabulary, shared by this module's tests."""
  return random_bert(tmp_path_factory.mktemp("model"), SPECIALS + ANIMALS + FILLER)


def _config(model_dir, data_dir):
  """configs/finetuning.py (every field of AnimalRun at its default) plus what this task's
  config would say."""
  config = run_config.defaults(AnimalRun)
  config.init_checkpoint = model_dir
  config.data.data_dir = str(data_dir)
  config.data.max_seq_length = 16
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=2e-3, num_train_epochs=6.0)
  return config


def _typed(config, schema=AnimalRun):
  """The typed config (the library's) of a test's ConfigDict."""
  return run_config.typed(config, schema)


def _make_task(spec, config, workdir):
  """finetuning.make_task on the typed `config` (a ConfigDict), with its run context."""
  typed = _typed(config)
  return finetuning.make_task(spec, typed, workdir, train.run_context(typed))


def _build(config, task, init_batch):
  """steps.build on the typed `config` (a ConfigDict) and its mesh."""
  typed = _typed(config)
  return steps.build(typed, task, init_batch, train.run_context(typed).mesh)


def _context(config, schema=run_config.FinetuningRun):
  """The run context of `config` (a ConfigDict), as the trainer makes it."""
  return train.run_context(_typed(config, schema))


def test_a_task_from_a_spec_trains(model_dir, animal_data, tmp_path):
  workdir = tmp_path / "run"
  config = _config(model_dir, animal_data)
  result = finetuning.run(ANIMAL_SPEC, _typed(config), str(workdir))
  assert set(result) == {"loss", "accuracy"}
  assert result["accuracy"] > 0.9, result  # chance is 1/3
  as_run = json.loads((workdir / "config.json").read_text())["train"]  # the derived schedule
  assert as_run["num_train_steps"] == 6 * (384 // 16)
  assert as_run["warmup_steps"] == int(0.1 * 144)
  rows = (workdir / "eval_animals.tsv").read_text().splitlines()
  assert len(rows) == 64
  assert np.mean([row.split("\t")[1] in row.split("\t")[0].split() for row in rows]) > 0.9
  # The workdir is a model directory: bert_config.json and the tokenizer came along.
  assert {"bert_config.json", "vocab.txt", "eval_results.json"} <= set(os.listdir(workdir))


def test_user_set_steps_and_warmup_are_kept():
  config = finetuning_config.get_config()
  ten_batches = 10 * config.train.batch_size
  schedule, per_epoch = finetuning.schedule(_typed(config, run_config.FinetuningRun).train,
                                            num_examples=ten_batches)
  assert per_epoch == 10
  assert (schedule.num_train_steps, schedule.warmup_steps) == (30, 3)
  assert schedule.eval_every_steps == schedule.checkpoint_every_steps == 10
  config = finetuning_config.get_config()
  config.train.num_train_steps, config.train.warmup_steps = 7, 0
  config.train.eval_every_steps = 5
  schedule, _ = finetuning.schedule(_typed(config, run_config.FinetuningRun).train,
                                    num_examples=ten_batches)
  assert (schedule.num_train_steps, schedule.warmup_steps) == (7, 0)
  assert schedule.eval_every_steps == 5
  config = finetuning_config.get_config()
  config.train.num_train_steps = 50  # warmup left at -1: 10% of the steps the user set
  schedule, _ = finetuning.schedule(_typed(config, run_config.FinetuningRun).train,
                                    num_examples=ten_batches)
  assert (schedule.num_train_steps, schedule.warmup_steps) == (50, 5)


@pytest.mark.parametrize("num_examples, epochs, steps, per_epoch", [
    (3668, 3.0, 343, 114),  # MRPC: run_classifier.py's int(3668 / 32 * 3); not 3 * 114 = 342
    (2490, 3.0, 233, 77),  # RTE: int(2490 / 32 * 3); not 3 * 77 = 231
    (320, 3.0, 30, 10),  # whole batches: the same either way
    (87599, 2.0, 5474, 2737),  # SQuAD v1.1's questions at 32, run_squad's configs/squad.py
    (100, 0.1, 1, 3),  # at least one step
])
def test_steps_follow_google_research_bert(num_examples, epochs, steps, per_epoch):
  """num_train_steps = int(N / B * epochs), as run_classifier.py and run_squad.py count them
  (the partial batch of each epoch counts towards them), whatever the task: GLUE, SWAG and NER
  give N = their training rows, SQuAD its questions (Data.examples_per_epoch), all through
  finetuning.schedule."""
  config = finetuning_config.get_config()
  config.train.batch_size, config.train.num_train_epochs = 32, epochs
  schedule, steps_per_epoch = finetuning.schedule(
      _typed(config, run_config.FinetuningRun).train, num_examples)
  assert steps_per_epoch == per_epoch
  assert schedule.num_train_steps == steps
  assert schedule.warmup_steps == int(config.train.warmup_proportion * steps)
  assert schedule.eval_every_steps == schedule.checkpoint_every_steps == per_epoch


# ---- length buckets ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, max_seq_length, expected", [
    ("auto", 128, (32, 64, 96, 128)),
    ("auto", 100, (32, 64, 96, 100)),
    ("auto", 32, (32,)),
    ("auto", 20, (20,)),
    ("", 128, ()),
    (" 64, 16,64 ", 128, (16, 64, 128)),
    ("128", 128, (128,)),
])
def test_length_buckets_of_the_config(value, max_seq_length, expected):
  config = finetuning_config.get_config()
  config.data.length_buckets, config.data.max_seq_length = value, max_seq_length
  assert finetuning.length_buckets(_typed(config, run_config.FinetuningRun)) == expected


@pytest.mark.parametrize("value", ["0,64", "32,256", "short", "32;64", ","])
def test_bad_length_buckets_are_refused(value):
  config = finetuning_config.get_config()
  config.data.length_buckets = value
  with pytest.raises(UserError, match="data.length_buckets=.*comma-separated"):
    finetuning.length_buckets(_typed(config, run_config.FinetuningRun))


def _logits(outputs, batch):
  del batch
  return {"logits": outputs}


def _token_terms(logits, batch):
  """Every real token labelled with its sentence's animal, weighted off padding (as NER)."""
  labels = jnp.broadcast_to(batch["label"][:, None], logits.shape[:2])
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, labels),
                   batch["input_mask"])}


TOKEN_SPEC = dataclasses.replace(  # every position's logits, as NER's per-token predictions
    ANIMAL_SPEC, model=lambda bert_config, data: heads.BertForTokenClassification(
        bert_config, data.num_labels), terms=_token_terms, predict=_logits)


def _eval_and_step(setup, task, with_step):
  """The eval pass and (`with_step`) one train step of `task` from the initial state (drawn
  anew each time: the step takes it over): (eval predictions,
  eval metric means, each eval example's input_mask as batched and its batch's width, the
  first train batch's width, the first train step's loss and gradient norm)."""
  state = setup.init_state()
  totals, predictions = steps.run_eval_step(setup, state["params"], task.batches.eval())
  predictions = finetuning.in_example_order(predictions)  # packed: back in the examples' order
  masks, widths = [], []
  for batch in task.batches.eval():
    real = batch["example_weight"] > 0  # [batch], or [batch, k] packed (no mask per example)
    masks += list(batch["input_mask"][real]) if real.ndim == 1 else []
    widths += [batch["input_mask"].shape[1]] * int(real.sum())
  first = next(task.batches.train(None))[0]
  step = {}
  if with_step:
    _, step_metrics = setup.train_step(state, parallel.global_batch(first, setup.mesh),
                                       setup.learning_rate(0))
    step = {name: float(getattr(step_metrics, name).compute()) for name in ("loss", "grad_norm")}
  width = first["input_ids"].shape[1]
  return predictions, task_lib.means(totals), masks, np.array(widths), width, step


@pytest.mark.parametrize("spec, with_step", [
    (dataclasses.replace(ANIMAL_SPEC, predict=_logits, padding_invariant=True), False),
    (dataclasses.replace(TOKEN_SPEC, padding_invariant=True), True)], ids=["sequence", "token"])
def test_length_buckets_give_the_outputs_of_full_padding(spec, with_step, model_dir,
                                                         animal_data, tmp_path):
  """Per-example logits (per token: at every real position; zeros where the batch was cut),
  the eval loss and (for the per-token loss, weighted off padding) a train step's loss and
  gradient norm are those of batches padded to max_seq_length, from the same parameters
  through the same jitted steps (which compile once per width)."""
  tasks = {}
  for buckets in ("", "8,9,10"):  # sentences of 6-10 tokens with [CLS] and [SEP]
    config = _config(model_dir, animal_data)
    config.data.length_buckets, config.train.eval_batch_size = buckets, 4
    tasks[buckets] = _make_task(spec, config, str(tmp_path))
  setup = _build(config, tasks[buckets], next(tasks[buckets].batches.train(None))[0])
  full, full_means, masks, full_widths, full_train_width, full_step = _eval_and_step(
      setup, tasks[""], with_step)
  cut, cut_means, _, widths, train_width, step = _eval_and_step(setup, tasks["8,9,10"], with_step)
  assert set(full_widths) == {full_train_width} == {16}
  assert set(widths) == {8, 9, 10} and train_width == 10  # of 16 columns
  assert full["logits"].shape == cut["logits"].shape  # per-token logits padded back to 16
  if full["logits"].ndim == 3:  # [N, seq, labels]
    real = np.array(masks) > 0
    np.testing.assert_allclose(cut["logits"][real], full["logits"][real], rtol=1e-5, atol=1e-5)
    for width in (8, 9):
      assert not cut["logits"][widths == width, width:].any()
  else:
    np.testing.assert_allclose(cut["logits"], full["logits"], rtol=1e-5, atol=1e-5)
  for name in full_means:
    np.testing.assert_allclose(cut_means[name], full_means[name], rtol=1e-5, err_msg=name)
  assert step.keys() == full_step.keys() == ({"loss", "grad_norm"} if with_step else set())
  for name in step:
    np.testing.assert_allclose(step[name], full_step[name], rtol=1e-5, err_msg=name)
