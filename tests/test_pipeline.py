"""Tests of bertjax.data.pipeline: batch contract, resumable order, masking per epoch, per-host
slices and the evaluation pass."""
import itertools
import json
import time

import numpy as np
import pytest

from bertjax.data import pipeline
from bertjax.data import pretraining_examples as pe
from bertjax.errors import UserError

SEQ, MAX_PRED = 16, 3
SPECIAL = pe.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=1000,
                           ids_never_masked=frozenset({1}))


def _examples(n=50, seed=0):
  """n unmasked pairs of random tokens (distinct rows) and random lengths; label = i % 2."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 1000, size=(n, SEQ)).astype(np.int32)
  lengths = rng.integers(6, SEQ + 1, size=n)
  input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
  ids *= input_mask
  ids[:, 0] = SPECIAL.cls
  ids[:, 3] = SPECIAL.sep
  ids[np.arange(n), lengths - 1] = SPECIAL.sep
  segment_ids = ((np.arange(SEQ)[None, :] > 3) * input_mask).astype(np.int32)
  return {"input_ids": ids, "segment_ids": segment_ids, "input_mask": input_mask,
          "next_sentence_label": (np.arange(n) % 2).astype(np.int32)}


def _example_index(batch, examples):
  """[batch]: which example each row is (-1 for padding), matched on the unmasked tokens."""
  restored = pe.unmask(batch)
  keys = {row.tobytes(): i for i, row in enumerate(examples["input_ids"])}
  return np.array([keys.get(row.tobytes(), -1) if w else -1
                   for row, w in zip(restored, batch["example_weight"])])


def _batches(**kwargs):
  args = dict(batch_size=8, seed=3, special=SPECIAL, max_predictions_per_seq=MAX_PRED)
  args.update(kwargs)
  examples = args.pop("examples", None) or _examples()
  return pipeline.PretrainingBatches(examples, **args)


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_keys_dtypes_shapes():
  batches = _batches()
  assert batches.steps_per_epoch == 6  # 50 // 8
  batch, position = next(batches.iterate())
  assert position == {"epoch": 0, "index": 1}
  expected = {"input_ids": ((8, SEQ), np.int32), "segment_ids": ((8, SEQ), np.int32),
              "input_mask": ((8, SEQ), np.int32),
              "masked_lm_positions": ((8, MAX_PRED), np.int32),
              "masked_lm_ids": ((8, MAX_PRED), np.int32),
              "masked_lm_weights": ((8, MAX_PRED), np.float32),
              "next_sentence_label": ((8,), np.int32), "example_weight": ((8,), np.float32)}
  assert list(batch) == list(pipeline.BATCH_KEYS)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
  assert (batch["example_weight"] == 1).all()
  assert (batch["masked_lm_weights"].sum(1) >= 1).all()
  eval_batch = next(batches.eval_batches())
  assert {k: (v.shape, v.dtype) for k, v in eval_batch.items()} == expected


def test_epochs_visit_every_example_in_new_orders():
  examples = _examples()
  batches = _batches(examples=examples)
  seen = {}
  for batch, position in itertools.islice(batches.iterate(), 12):  # 2 epochs of 6
    epoch = position["epoch"] - (position["index"] == 0)
    seen.setdefault(epoch, []).extend(_example_index(batch, examples))
  assert len(set(seen[0])) == len(seen[0]) == 48  # 2 of 50 dropped
  assert seen[0] != seen[1]
  unshuffled = _batches(examples=examples, shuffle=False)
  first, _ = next(unshuffled.iterate())
  np.testing.assert_array_equal(_example_index(first, examples), np.arange(8))


def test_resume_from_position_replays_the_same_batches():
  batches = _batches()
  run = list(itertools.islice(batches.iterate(), 10))  # crosses the epoch boundary at 6
  assert [p for _, p in run][4:7] == [{"epoch": 0, "index": 5}, {"epoch": 1, "index": 0},
                                       {"epoch": 1, "index": 1}]
  for cut in (3, 5, 6):
    saved = json.loads(json.dumps(run[cut][1]))  # as a checkpoint would store it
    resumed = _batches().iterate(saved)  # a new object, as after a restart
    for (expected, expected_pos), (got, got_pos) in zip(run[cut + 1:], resumed):
      _assert_same(got, expected)
      assert got_pos == expected_pos


def test_dynamic_masks_change_per_epoch_and_reproduce():
  examples = _examples()
  batches = _batches(examples=examples)

  def masks_by_example(run):
    out = {}
    for batch, position in run:
      epoch = position["epoch"] - (position["index"] == 0)
      for i, row in zip(_example_index(batch, examples), batch["masked_lm_positions"]):
        out[(epoch, i)] = tuple(row)
    return out

  first = masks_by_example(itertools.islice(batches.iterate(), 12))
  again = masks_by_example(itertools.islice(_batches(examples=examples).iterate(), 12))
  assert first == again
  both = [i for i in range(50) if (0, i) in first and (1, i) in first]
  assert len(both) > 40
  differ = sum(first[(0, i)] != first[(1, i)] for i in both)
  assert differ > 0.8 * len(both)
  other_seed = masks_by_example(itertools.islice(_batches(examples=examples, seed=4).iterate(),
                                                 6))
  assert other_seed != {k: v for k, v in first.items() if k[0] == 0}


def test_static_masks_are_fixed():
  examples = _examples()
  batches = _batches(examples=examples, dynamic_masking=False)
  masks = {}
  for batch, _ in itertools.islice(batches.iterate(), 12):
    for i, row, ids in zip(_example_index(batch, examples), batch["masked_lm_positions"],
                           batch["input_ids"]):
      masks.setdefault(i, set()).add((tuple(row), tuple(ids)))
  assert all(len(v) == 1 for v in masks.values())


def test_masks_from_disk():
  examples = _examples()
  masked = dict(examples, **pe.mask_batch(examples["input_ids"], examples["input_mask"],
                                         np.random.default_rng(0), SPECIAL, 0.15, MAX_PRED))
  static = _batches(examples=masked, dynamic_masking=False, shuffle=False)
  batch, _ = next(static.iterate())
  for key in pe.MASK_KEYS + ("input_ids",):
    np.testing.assert_array_equal(batch[key], masked[key][:8])
  # Dynamic masking starts again from the original tokens.
  dynamic = _batches(examples=masked, dynamic_masking=True, shuffle=False)
  batch, _ = next(dynamic.iterate())
  np.testing.assert_array_equal(pe.unmask(batch), examples["input_ids"][:8])
  assert (batch["masked_lm_positions"] != masked["masked_lm_positions"][:8]).any()
  with pytest.raises(UserError, match="max_predictions_per_seq"):
    _batches(examples=masked, max_predictions_per_seq=MAX_PRED + 1)


def test_whole_word_masking():
  examples = _examples()
  table = np.arange(SPECIAL.vocab_size) % 3 == 0  # ids divisible by 3 start words
  batches = _batches(examples=examples, whole_word_masking=True, word_start_table=table,
                     max_predictions_per_seq=6)
  batch, _ = next(batches.iterate())
  expected = pe.apply_masks(
      pe.unmask(batch), batch["input_mask"],
      pe.stack_mask_randoms([pe.draw_mask_randoms(
          np.random.default_rng([3, pipeline._DYNAMIC_MASKS, 0, int(i)]), (SEQ,), SPECIAL)
          for i in _example_index(batch, examples)], SEQ),
      SPECIAL, 0.15, 6, table[pe.unmask(batch)])
  for key, value in expected.items():
    np.testing.assert_array_equal(batch[key], value)


def test_host_slices_partition_the_global_batch():
  examples = _examples(n=100)
  one_host = _batches(examples=examples, batch_size=12)
  hosts = [_batches(examples=examples, batch_size=4, process_index=p, process_count=3)
           for p in range(3)]
  assert one_host.steps_per_epoch == hosts[0].steps_per_epoch == 8
  runs = [itertools.islice(h.iterate(), 10) for h in hosts]
  for (whole, position), *parts in zip(itertools.islice(one_host.iterate(), 10), *runs):
    for key in whole:
      np.testing.assert_array_equal(np.concatenate([b[key] for b, _ in parts]), whole[key])
    assert all(p == position for _, p in parts)


def test_eval_pass_covers_every_example_once():
  examples = _examples(n=50)
  hosts = [_batches(examples=examples, batch_size=4, process_index=p, process_count=3)
           for p in range(3)]
  assert hosts[0].num_eval_batches == 5  # ceil(50 / 12)
  seen = []
  for p, host in enumerate(hosts):
    run = list(host.eval_batches())
    assert len(run) == 5
    for batch in run:
      index = _example_index(batch, examples)
      pad = batch["example_weight"] == 0
      assert (index[pad] == -1).all() and (index[~pad] >= 0).all()
      assert not batch["masked_lm_weights"][pad].any() and not batch["input_mask"][pad].any()
      seen.extend(index[~pad])
  assert sorted(seen) == list(range(50))
  # In order, and the same masks every time.
  first = next(hosts[0].eval_batches())
  np.testing.assert_array_equal(_example_index(first, examples), [0, 1, 2, 3])
  _assert_same(first, next(hosts[0].eval_batches()))


def test_too_few_examples_and_bad_positions():
  batches = _batches(examples=_examples(n=20), batch_size=8, process_count=3)
  with pytest.raises(UserError, match=r"only 20 .* 24 .*smaller batch size"):
    batches.iterate()
  assert len(list(batches.eval_batches())) == 1  # evaluation pads instead
  with pytest.raises(UserError, match="does not fit"):
    _batches().iterate({"epoch": 0, "index": 6})
  with pytest.raises(UserError, match="damaged"):
    _batches().iterate({"step": 3})


def test_speed_of_dynamic_masking():
  rng = np.random.default_rng(0)
  n, seq = 256, 128
  examples = {"input_ids": rng.integers(5, 1000, (n, seq)).astype(np.int32),
              "segment_ids": np.zeros((n, seq), np.int32),
              "input_mask": np.ones((n, seq), np.int32),
              "next_sentence_label": np.zeros(n, np.int32)}
  run = _batches(examples=examples, batch_size=64, max_predictions_per_seq=20).iterate()
  next(run)
  start = time.perf_counter()
  for _ in range(3):
    next(run)
  assert (time.perf_counter() - start) / 3 < 0.05  # a few ms; generous for a loaded machine
