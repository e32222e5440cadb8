"""Tests of bertjax.data.pipeline.FeatureBatches: batch contract, epochs and their orders, resume
from a position, per-host slices, the evaluation pass and the refused positions. (Pretraining
batches: tests/test_loader.py.)"""
import itertools
import json

import numpy as np
import pytest

from bertjax.data import pipeline
from bertjax.errors import UserError

SEQ = 6


def _features(n=50):
  """n examples whose row i is recognisable: input_ids [n, SEQ] = i + 1 (0 = padding), label i."""
  ids = np.repeat(np.arange(1, n + 1, dtype=np.int32)[:, None], SEQ, axis=1)
  return {"input_ids": ids, "segment_ids": np.zeros((n, SEQ), np.int32),
          "input_mask": np.ones((n, SEQ), np.int32), "label": np.arange(n, dtype=np.int32)}


def _batches(features=None, **kwargs):
  args = dict(batch_size=8, seed=3)
  args.update(kwargs)
  return pipeline.FeatureBatches(_features() if features is None else features, **args)


def _rows(batch):
  """[batch]: which example each row is (-1 for padding)."""
  return np.where(batch["example_weight"] > 0, batch["input_ids"][:, 0] - 1, -1)


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_keys_dtypes_shapes():
  features = _features()
  batches = _batches(features)
  assert (batches.num_examples, batches.steps_per_epoch, batches.num_eval_batches) == (50, 6, 7)
  batch, position = next(batches.iterate())
  assert position == {"examples": 8}
  expected = {"input_ids": ((8, SEQ), np.int32), "segment_ids": ((8, SEQ), np.int32),
              "input_mask": ((8, SEQ), np.int32), "label": ((8,), np.int32),
              "example_weight": ((8,), np.float32)}
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
  assert (batch["example_weight"] == 1).all()
  for key in features:
    np.testing.assert_array_equal(batch[key], features[key][_rows(batch)], err_msg=key)
  eval_batch = next(batches.eval_batches())
  assert {k: (v.shape, v.dtype) for k, v in eval_batch.items()} == expected


def test_epochs_visit_every_example_once_in_new_orders():
  batches = _batches(batch_size=10)  # 5 batches an epoch, no remainder
  run = [_rows(b) for b, _ in itertools.islice(batches.iterate(), 15)]
  epochs = [np.concatenate(run[e * 5:(e + 1) * 5]) for e in range(3)]
  for order in epochs:
    assert sorted(order) == list(range(50))
  assert all((a != b).any() for a, b in itertools.combinations(epochs, 2))
  assert (epochs[0] != np.arange(50)).any()
  other_seed = np.concatenate([_rows(b) for b, _ in
                               itertools.islice(_batches(batch_size=10, seed=4).iterate(), 5)])
  assert (other_seed != epochs[0]).any()


def test_a_remainder_carries_into_the_next_epoch():
  batches = _batches(batch_size=8)  # 50 = 6 * 8 + 2
  stream = np.concatenate([_rows(b) for b, _ in itertools.islice(batches.iterate(), 25)])
  for e in range(4):  # 200 elements: 4 whole epochs
    assert sorted(stream[e * 50:(e + 1) * 50]) == list(range(50))


def test_unshuffled_stream_is_in_order():
  run = itertools.islice(_batches(shuffle=False).iterate(), 8)
  stream = np.concatenate([_rows(b) for b, _ in run])
  np.testing.assert_array_equal(stream, np.arange(64) % 50)


def test_resume_from_position_replays_the_same_batches():
  run = list(itertools.islice(_batches().iterate(), 12))  # crosses an epoch at 50 elements
  assert [p["examples"] for _, p in run] == [8 * (j + 1) for j in range(12)]
  for cut in (2, 5, 6):
    saved = json.loads(json.dumps(run[cut][1]))  # as a checkpoint would store it
    resumed = _batches().iterate(saved)  # a new object, as after a restart
    for (expected, expected_pos), (got, got_pos) in zip(run[cut + 1:], resumed):
      _assert_same(got, expected)
      assert got_pos == expected_pos


def test_host_slices_partition_the_global_batch():
  features = _features(n=100)
  one_host = _batches(features, batch_size=12)
  hosts = [_batches(features, batch_size=6, process_index=p, process_count=2) for p in range(2)]
  assert one_host.steps_per_epoch == hosts[0].steps_per_epoch == 8
  runs = [itertools.islice(h.iterate(), 12) for h in hosts]
  for (whole, position), *parts in zip(itertools.islice(one_host.iterate(), 12), *runs):
    for p, (part, part_position) in enumerate(parts):
      assert part_position == position
      for key in whole:
        np.testing.assert_array_equal(part[key], whole[key][6 * p:6 * (p + 1)], err_msg=key)
  # A position of one host resumes on two, and the other way round.
  position = {"examples": 36}
  resumed_one = next(_batches(features, batch_size=12).iterate(position))[0]
  resumed_two = [next(h.iterate(position))[0] for h in hosts]
  np.testing.assert_array_equal(np.concatenate([_rows(b) for b in resumed_two]),
                                _rows(resumed_one))


def test_eval_pass_covers_every_example_once_in_order():
  features = _features(n=50)
  hosts = [_batches(features, batch_size=4, process_index=p, process_count=3) for p in range(3)]
  assert hosts[0].num_eval_batches == 5  # ceil(50 / 12)
  runs = [list(h.eval_batches()) for h in hosts]
  assert all(len(run) == 5 for run in runs)
  global_order = []
  for parts in zip(*runs):  # the global batch: the hosts' rows in host order
    for batch in parts:
      rows = _rows(batch)
      pad = batch["example_weight"] == 0
      assert (rows[~pad] >= 0).all()
      assert not batch["input_ids"][pad].any() and not batch["input_mask"][pad].any()
      global_order.extend(rows[~pad])
  np.testing.assert_array_equal(global_order, np.arange(50))  # predictions in example order
  _assert_same(runs[0][0], next(hosts[0].eval_batches()))


def test_too_few_or_no_examples():
  batches = _batches(_features(n=20), batch_size=8, process_count=3)
  with pytest.raises(UserError, match=r"only 20 .* 24 .*smaller train.batch_size"):
    batches.iterate()
  assert len(list(batches.eval_batches())) == 1  # evaluation pads instead
  with pytest.raises(UserError, match="empty"):
    _batches({"input_ids": np.zeros((0, SEQ), np.int32)})
  with pytest.raises(UserError, match="batch_size=0"):
    _batches(batch_size=0)


@pytest.mark.parametrize("position, message", [
    ({"epoch": 1, "index": 3}, "older bertjax.*fresh workdir"),
    ({"step": 3}, "damaged"),
    ({"examples": -8}, "damaged"),
    ({"examples": 2.5}, "damaged"),
    ({"examples": "8"}, "damaged"),
    ([8], "damaged"),
])
def test_bad_positions_are_refused(position, message):
  with pytest.raises(UserError, match=message):
    _batches().iterate(position)


def test_any_host_count_resumes_a_position():
  """A global position need not divide by the host count: the host rows are blocks."""
  features = _features(n=60)
  one = next(_batches(features, batch_size=8).iterate({"examples": 9}))[0]
  two = [next(_batches(features, batch_size=4, process_index=p, process_count=2).iterate(
      {"examples": 9}))[0] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate([_rows(b) for b in two]), _rows(one))


# ---- length buckets --------------------------------------------------------------------------

BUCKET_SEQ = 16


def _varied(n=40, seed=0):
  """n examples in [n, 16] rows, most of 2-6 tokens, 15% of 9-16 (input_ids = i + 1 on real
  tokens, 0 after), with a per-position label_ids like NER's; and their lengths."""
  rng = np.random.default_rng(seed)
  lengths = np.where(rng.random(n) < 0.15, rng.integers(9, BUCKET_SEQ + 1, n),
                     rng.integers(2, 7, n))
  mask = (np.arange(BUCKET_SEQ)[None] < lengths[:, None]).astype(np.int32)
  ids = mask * np.arange(1, n + 1, dtype=np.int32)[:, None]
  return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
          "label_ids": ids % 5, "label": np.arange(n, dtype=np.int32)}, lengths


def test_example_lengths():
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
  np.testing.assert_array_equal(pipeline.example_lengths(mask), [2, 4, 0, 3])
  choices = np.stack([mask, mask[::-1]], axis=1)  # [4, 2, 4]: the longer choice counts
  np.testing.assert_array_equal(pipeline.example_lengths(choices), [3, 4, 4, 3])


def test_batches_are_cut_to_the_bucket_of_their_longest_example():
  features, lengths = _varied()
  plain = _batches(features, batch_size=8)
  cut = _batches(features, batch_size=8, length_buckets=(4, 8, 99))
  assert cut.buckets == (4, 8, BUCKET_SEQ)  # longer than the features: dropped; 16 added
  for (whole, p1), (part, p2) in itertools.islice(zip(plain.iterate(), cut.iterate()), 12):
    assert p1 == p2
    rows = _rows(whole)
    width = min(b for b in cut.buckets if b >= lengths[rows].max())
    assert part["input_ids"].shape == (8, width) and part["label"].shape == (8,)
    for key in ("input_ids", "segment_ids", "input_mask", "label_ids"):
      np.testing.assert_array_equal(part[key], whole[key][:, :width], err_msg=key)
      assert not whole[key][:, width:].any()  # only padding was cut
    np.testing.assert_array_equal(part["label"], whole["label"])
  widths = {b["input_ids"].shape[1] for b in cut.eval_batches()}
  assert widths <= set(cut.buckets) and len(widths) > 1
  for whole, part in zip(plain.eval_batches(), cut.eval_batches()):
    width = part["input_ids"].shape[1]
    np.testing.assert_array_equal(part["input_mask"], whole["input_mask"][:, :width])
    assert not whole["input_mask"][:, width:].any()


def test_hosts_cut_each_global_batch_to_one_shape():
  """The bucket is the global batch's: the two hosts' blocks have the same width, the one a
  single host gives the whole global batch, though each host's own rows may be shorter."""
  features, lengths = _varied(n=64, seed=1)
  buckets = (4, 8, 12)
  one = _batches(features, batch_size=16, length_buckets=buckets)
  hosts = [_batches(features, batch_size=8, process_index=p, process_count=2,
                    length_buckets=buckets) for p in range(2)]
  own_widths_differ = False
  for (whole, _), *parts in itertools.islice(zip(one.iterate(), *(h.iterate() for h in hosts)),
                                             10):
    assert {part["input_ids"].shape for part, _ in parts} == {(8, whole["input_ids"].shape[1])}
    np.testing.assert_array_equal(
        np.concatenate([part["input_ids"] for part, _ in parts]), whole["input_ids"])
    own = [min(b for b in (4, 8, 12, 16) if b >= lengths[_rows(part)].max()) for part, _ in parts]
    own_widths_differ |= len(set(own)) > 1
  assert own_widths_differ  # so the test shows the hosts agreeing, not their rows alike
  evals = [list(h.eval_batches()) for h in hosts]
  for whole, *parts in zip(one.eval_batches(), *evals):
    assert {part["input_mask"].shape for part in parts} == {(8, whole["input_mask"].shape[1])}


def test_multiple_choice_features_are_cut_on_their_last_axis():
  features, _ = _varied(n=16)
  mask = np.stack([features["input_mask"], np.roll(features["input_mask"], 8, axis=0)], axis=1)
  choices = {"input_ids": mask * 7, "input_mask": mask, "label": np.zeros(16, np.int32)}
  batch = next(_batches(choices, batch_size=8, shuffle=False, length_buckets=(4, 8, 12)
                        ).iterate())[0]
  width = batch["input_ids"].shape[-1]
  assert batch["input_mask"].shape == (8, 2, width)
  assert width == min(b for b in (4, 8, 12, 16)
                      if b >= pipeline.example_lengths(mask[:8]).max())
  np.testing.assert_array_equal(batch["input_mask"], mask[:8, :, :width])


# ---- packing -----------------------------------------------------------------------------------


def test_balanced_rows():
  plan = pipeline.balanced_rows(np.array([5, 9, 2, 7, 3, 8]), num_rows=3, k=2)
  # longest first, each into the open row with the fewest tokens: 9 | 8 | 7, then 5 -> row 2,
  # 3 -> row 1, 2 -> row 0
  np.testing.assert_array_equal(plan, [[1, 2], [5, 4], [3, 0]])
  lengths = np.random.default_rng(0).integers(1, 40, 30)
  plan = pipeline.balanced_rows(lengths, num_rows=8, k=4)
  assert sorted(plan[plan >= 0]) == list(range(30)) and (plan >= 0).sum(1).max() <= 4
  tokens = np.where(plan >= 0, lengths[plan], 0).sum(1)
  assert tokens.max() - tokens.min() <= lengths.max()


def _unpacked_rows(packed, features):
  """{example index: (row, its tokens, its label)} of a packed batch, read back from its layout
  (cls_positions, sequence_ids, position_ids), with `features`' example ids (input_ids = i + 1)."""
  out = {}
  for r in range(len(packed["input_ids"])):
    for slot in np.flatnonzero(packed["example_weight"][r] > 0):
      tokens = packed["sequence_ids"][r] == slot + 1
      ids = packed["input_ids"][r][tokens]
      assert packed["cls_positions"][r, slot] == np.flatnonzero(tokens)[0]
      np.testing.assert_array_equal(packed["position_ids"][r][tokens], np.arange(tokens.sum()))
      example = int(ids[0]) - 1
      np.testing.assert_array_equal(ids, features["input_ids"][example][
          features["input_mask"][example] > 0])
      assert packed["label"][r, slot] == features["label"][example]
      out[example] = r
  return out


def test_packed_batches_hold_the_global_batch_k_a_row_on_every_host():
  features, _ = _varied(n=64, seed=2)
  features.pop("label_ids")  # packing takes tokens and per-example keys
  plain = _batches(features, batch_size=16)
  hosts = [_batches(features, batch_size=8, process_index=p, process_count=2, packing=4,
                    length_buckets=(8, 16, 24, 32)) for p in range(2)]
  for (whole, position), *parts in itertools.islice(
      zip(plain.iterate(), *(h.iterate() for h in hosts)), 6):
    assert {part["input_ids"].shape for part, _ in parts} == {parts[0][0]["input_ids"].shape}
    assert all(part_position == position for _, part_position in parts)
    rows, width = parts[0][0]["input_ids"].shape
    assert rows == 2 and width in (8, 16, 24, 32, 64)  # 4 examples of 2-16 tokens a row
    seen = {}
    for p, (part, _) in enumerate(parts):
      assert part["label"].shape == part["example_weight"].shape == (2, 4)
      seen.update({e: p * 2 + r for e, r in _unpacked_rows(part, features).items()})
    assert sorted(seen) == sorted(_rows(whole))  # the same 16 examples, each once
  evals = [list(h.eval_batches()) for h in hosts]
  order = []
  for parts in zip(*evals):
    for part in parts:
      real = part["example_weight"] > 0
      order.extend(part["example_index"][real])
      assert set(_unpacked_rows(part, features)) == set(part["example_index"][real])
  assert sorted(order) == list(range(64))


def test_a_last_small_eval_batch_fills_rows_k_at_a_time():
  features, _ = _varied(n=20, seed=3)
  features.pop("label_ids")
  batches = _batches(features, batch_size=16, packing=4)
  last = list(batches.eval_batches())[-1]  # 4 examples: one full row, three empty
  np.testing.assert_array_equal((last["example_weight"] > 0).sum(1), [4, 0, 0, 0])
  assert not last["input_mask"][1:].any()
