"""Packing fine-tuning rows (bertjax.tasks.finetuning with bertjax.data.finetuning.batching):
several examples a row give the outputs of one a row, "auto" packs where this is exact, and bad
packing is refused. The animal task and its helpers are tests/test_finetuning.py's.
"""
import dataclasses

import numpy as np
import pytest

from bertjax import run_config
from bertjax.configs import finetuning as finetuning_config
from bertjax.errors import UserError
from bertjax.tasks import finetuning, glue
from bertjax.tasks import ner as ner_task
from bertjax.tasks import squad as squad_task
from bertjax.tasks import swag as swag_task
from test_finetuning import (ANIMAL_SPEC, ANIMALS, FILLER, SPECIALS, _build, _config, _context,
                             _eval_and_step, _logits, _make_task, _typed, animal_data, model_dir)

# model_dir and animal_data: test_finetuning's module fixtures, used here as they are.
__all__ = ["animal_data", "model_dir"]


def test_packing_gives_the_outputs_of_unpacked_batches(model_dir, animal_data, tmp_path):
  """Four examples a row, each pooled from its own [CLS]: per-example logits (back in the
  examples' order), the eval metrics and a train step's loss and gradient norm are those of one
  example a row."""
  spec = dataclasses.replace(ANIMAL_SPEC, predict=_logits, padding_invariant=True, packable=True)
  tasks = {}
  for packing, buckets in ((0, ""), (4, "40,48")):  # rows of 4 sentences of 6-10 tokens
    config = _config(model_dir, animal_data)
    config.data.packing, config.data.length_buckets = str(packing), buckets
    config.train.eval_batch_size = 8
    tasks[packing] = _make_task(spec, config, str(tmp_path))
  setup = _build(config, tasks[4], next(tasks[4].batches.train(None))[0])
  full, full_means, _, _, _, full_step = _eval_and_step(setup, tasks[0], True)
  packed, means, _, widths, train_width, step = _eval_and_step(setup, tasks[4], True)
  batch = next(tasks[4].batches.train(None))[0]
  assert batch["input_ids"].shape == (4, train_width) and batch["label"].shape == (4, 4)
  assert train_width in (40, 48) and set(widths) <= {40, 48, 64}
  np.testing.assert_allclose(packed["logits"], full["logits"], rtol=1e-5, atol=1e-5)
  assert means.keys() == full_means.keys() == {"loss", "accuracy"}
  for name in full_means:
    np.testing.assert_allclose(means[name], full_means[name], rtol=1e-5, err_msg=name)
  for name in ("loss", "grad_norm"):
    np.testing.assert_allclose(step[name], full_step[name], rtol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def short_model_dir(random_bert, tmp_path_factory):
  """model_dir's kind of model with 16 positions, max_seq_length's."""
  return random_bert(tmp_path_factory.mktemp("short_model"), SPECIALS + ANIMALS + FILLER,
                     max_position_embeddings=16)


def test_packed_rows_may_be_longer_than_the_position_table(short_model_dir, animal_data,
                                                           tmp_path):
  """data.packing=4 at max_seq_length 16 on a model of 16 positions: rows of 64 tokens whose
  positions restart at each example train and give the logits and the loss of unpacked batches
  (the row's length was checked against the table: "sequence length 64 exceeds 16")."""
  spec = dataclasses.replace(ANIMAL_SPEC, predict=_logits, padding_invariant=True, packable=True)
  tasks = {}
  for packing in (0, 4):
    config = _config(short_model_dir, animal_data)
    config.data.packing, config.data.length_buckets = str(packing), ""
    config.train.eval_batch_size = 8
    tasks[packing] = _make_task(spec, config, str(tmp_path))
  setup = _build(config, tasks[4], next(tasks[4].batches.train(None))[0])
  full, _, _, _, _, full_step = _eval_and_step(setup, tasks[0], True)
  packed, _, _, widths, train_width, step = _eval_and_step(setup, tasks[4], True)
  assert train_width == 64 and set(widths) == {64}
  np.testing.assert_allclose(packed["logits"], full["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(step["loss"], full_step["loss"], rtol=1e-5)


def test_the_default_packs_where_it_is_exact(model_dir, animal_data, tmp_path, capsys):
  """configs/finetuning.py's data.packing="auto" packs a task that can pack: as many sentences a
  row as fit in max_seq_length on average (6-10 tokens, 8.02 on average, in 32: 3), lowered to
  2 so that batch 16 makes whole rows. The steps are the paper's, counted in examples; the
  logits, the eval metrics and a train step's loss and gradient norm those of one sentence a
  row, and the run's first line says 2. A task that cannot pack stays unpacked."""
  spec = dataclasses.replace(ANIMAL_SPEC, predict=_logits, padding_invariant=True, packable=True)
  assert finetuning_config.get_config().data.packing == "auto"
  tasks, configs = {}, {}
  for packing in ("0", "auto"):
    config = configs[packing] = _config(model_dir, animal_data)
    config.data.max_seq_length, config.train.eval_batch_size = 32, 8
    config.data.packing = packing
    tasks[packing] = _make_task(spec, config, str(tmp_path))
  printed = capsys.readouterr().out.splitlines()
  assert "animals: 384 (24 steps per epoch, 144 steps)" in printed  # "0"
  assert "animals: 384 (24 steps per epoch, 144 steps, 2 examples a row)" in printed  # "auto"
  assert tasks["auto"].schedule.num_train_steps == 144  # int(384 / 16 * 6), as unpacked
  batch = next(tasks["auto"].batches.train(None))[0]
  assert batch["label"].shape == (8, 2) and "cls_positions" in batch  # 16 examples, 2 a row
  setup = _build(configs["auto"], tasks["auto"], batch)
  full, full_means, _, _, _, full_step = _eval_and_step(setup, tasks["0"], True)
  packed, means, _, _, _, step = _eval_and_step(setup, tasks["auto"], True)
  np.testing.assert_allclose(packed["logits"], full["logits"], rtol=1e-5, atol=1e-5)
  for name in full_means:
    np.testing.assert_allclose(means[name], full_means[name], rtol=1e-5, err_msg=name)
  for name in ("loss", "grad_norm"):
    np.testing.assert_allclose(step[name], full_step[name], rtol=1e-5, err_msg=name)
  config = _config(model_dir, animal_data)
  config.data.max_seq_length = 32
  task = _make_task(ANIMAL_SPEC, config, str(tmp_path))  # packable=False
  assert "animals: 384 (24 steps per epoch, 144 steps)" in capsys.readouterr().out.splitlines()
  assert "cls_positions" not in next(task.batches.train(None))[0]


def _lengths(*lengths):
  """Training features of examples of these lengths (only input_mask is read)."""
  mask = np.zeros((len(lengths), 128), np.int32)
  for i, n in enumerate(lengths):
    mask[i, :n] = 1
  return {"input_mask": mask}


@pytest.mark.parametrize("change, lengths, expected", [
    ({}, (30, 28), 4),  # 128 // 29
    ({}, (20, 30), 4),  # 128 // 25 = 5, lowered to 4: 32 and 64 examples make whole rows
    (dict(batch_size=12, eval_batch_size=18), (20, 30), 3),  # 5 and 4 leave a row part-filled
    ({}, (60, 62), 2),
    ({}, (70, 70), 0),  # one a row fits
    (dict(batch_size=33), (20, 30), 0),  # no k >= 2 makes whole rows of 33
    (dict(length_buckets=""), (20, 30), 0),  # rows would not be cut: k x 128 wide
    (dict(bilstm_on_top=True), (20, 30), 0),  # one LSTM would run across the row
    (dict(packing="0"), (20, 30), 0),
    (dict(packing=" 8 "), (20, 30), 8),  # explicit k as ever
])
def test_auto_packing_picks_as_many_as_fit_on_average(change, lengths, expected):
  config = finetuning_config.get_config()
  for name, value in change.items():
    section = config.model if name == "bilstm_on_top" else (
        config.train if name.endswith("batch_size") else config.data)
    section[name] = value
  typed = _typed(config, run_config.FinetuningRun)
  assert finetuning.packing(typed, glue.SPEC, _context(config), _lengths(*lengths)) == expected


def test_only_glue_packs_by_default():
  """GLUE is pooled from each example's own [CLS]; NER (per token), SQuAD (spans, padded
  windows) and SWAG (four choices a row) cannot pack, so "auto" leaves them unpacked."""
  config, short = finetuning_config.get_config(), _lengths(10, 12)
  typed, context = _typed(config, run_config.FinetuningRun), _context(config)
  assert finetuning.packing(typed, glue.SPEC, context, short) == 8
  for spec in (ner_task.SPEC, squad_task.SPEC, swag_task.SPEC):
    assert not spec.packable
    assert finetuning.packing(typed, spec, context, short) == 0


@pytest.mark.parametrize("change, message", [
    (dict(packing=-1), "data.packing=-1; give the examples a row"),
    (dict(packing="four"), "data.packing=four; give the examples a row"),
    (dict(packing=3), r"with data.packing=3, train.batch_size=16 makes 5.33333 rows and "
                      r"train.eval_batch_size=32 makes 10.6667 rows; .* make train.batch_size "
                      r"and train.eval_batch_size multiples of 3\."),  # both at once
    (dict(packing=4, eval_batch_size=6), r"with data.packing=4, train.eval_batch_size=6 makes "
                                         r"1.5 rows; .* make train.eval_batch_size multiples"),
])
def test_bad_packing_is_refused(change, message, model_dir, animal_data, tmp_path):
  config = _config(model_dir, animal_data)
  config.data.packing = str(change["packing"])
  config.train.eval_batch_size = change.get("eval_batch_size", 32)
  spec = dataclasses.replace(ANIMAL_SPEC, packable=True)
  with pytest.raises(UserError, match=message):
    _make_task(spec, config, str(tmp_path))
  config.data.packing = "4"
  with pytest.raises(UserError, match="cannot pack"):
    _make_task(ANIMAL_SPEC, config, str(tmp_path))


def test_packed_rows_take_buckets_up_to_k_sequences():
  config = finetuning_config.get_config()
  typed = lambda: _typed(config, run_config.FinetuningRun)
  assert finetuning.length_buckets(typed(), 4) == tuple(range(32, 513, 32))
  config.data.length_buckets = "200"
  assert finetuning.length_buckets(typed(), 4) == (200, 512)
  config.data.length_buckets = "600"
  with pytest.raises(UserError, match="from 1 to data.max_seq_length=128 x data.packing=4"):
    finetuning.length_buckets(typed(), 4)


@pytest.mark.parametrize("num_labels", [1, 3])  # STS-B's score, a classifier
def test_glue_terms_and_predictions_of_packed_batches(num_labels):
  """GLUE's loss terms and predictions on [rows, k] examples are those of the same examples
  unpacked ([rows * k])."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 4, num_labels)).astype(np.float32)
  label = (rng.normal(size=(2, 4)) if num_labels == 1 else rng.integers(0, 3, (2, 4))
           ).astype(np.float32 if num_labels == 1 else np.int32)
  packed = {"label": label, "example_weight": np.ones((2, 4), np.float32)}
  flat = {key: value.reshape(8) for key, value in packed.items()}
  for name, (values, weights) in glue.terms(logits, packed).items():
    flat_values, flat_weights = glue.terms(logits.reshape(8, num_labels), flat)[name]
    np.testing.assert_allclose(np.reshape(values, 8), flat_values, rtol=1e-6, err_msg=name)
    np.testing.assert_array_equal(np.reshape(weights, 8), flat_weights)
  for name, value in glue.predict(logits, packed).items():
    np.testing.assert_array_equal(np.reshape(value, 8),
                                  glue.predict(logits.reshape(8, num_labels), flat)[name])
