"""Tests of bertjax.data.pretraining.loader: batches from prepared shards, epochs, a global
position that resumes on any host count, masks per example and epoch, stored masks, evaluation,
bad shards, contiguous spans (two segments, and one as data prepared before held them)."""
import json
import os

import numpy as np
import pytest

from bertjax import tokenization
from bertjax.data import pipeline, sources
from bertjax.data.pretraining import layout, loader, masking, preparation, shards
from bertjax.errors import UserError

SEQ, PREDICTIONS = 32, 5


def _prepare(directory, **flags):
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:12]
  text = os.path.join(directory, "text.txt")
  with open(text, "w") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  data = os.path.join(directory, "data")
  preparation.prepare(layout.Options(input=text, vocab_size=400, max_seq_length=(SEQ,),
                                     max_predictions_per_seq=(PREDICTIONS,), dupe_factor=1,
                                     eval_fraction=0.2, **flags), data, workers=1, progress=False)
  return loader.PreparedData(data)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return _prepare(str(tmp_path_factory.mktemp("loader")))


def _batches(data, batch_size=8, process_index=0, process_count=1, dynamic=True, seed=0,
             whole_word=False):
  tok = data.tokenizer()
  rules = loader.Masking(masking.SpecialTokens.from_tokenizer(tok), 0.15, PREDICTIONS, dynamic,
                         seed, tok.word_boundary_tables() if whole_word else None)
  return loader.PairBatches(data, SEQ, rules, batch_size=batch_size,
                            process_index=process_index, process_count=process_count)


def _take(iterator, k):
  return [next(iterator) for _ in range(k)]


def _records(batches, examples, k):
  """The record indices of the next k batches from `examples`: the stream PairBatches.iterate
  reads, with each batch made of its row indices."""
  rows = pipeline.host_batches(batches.num_examples(), batches.order_seed, examples,
                               lambda rows, epochs: rows, batch_size=batches.batch_size,
                               process_index=0, process_count=1, threads=1)
  return np.concatenate([r for r, _ in _take(rows, k)])


def test_batch_keys_shapes_and_masks(data):
  batch, position = next(_batches(data).iterate())
  assert position == 8
  assert set(batch) == set(loader.BATCH_KEYS)
  for key in ("input_ids", "segment_ids", "input_mask"):
    assert batch[key].shape == (8, SEQ) and batch[key].dtype == np.int32, key
  assert batch["masked_lm_positions"].shape == (8, PREDICTIONS)
  assert batch["masked_lm_weights"].dtype == np.float32
  np.testing.assert_array_equal(batch["example_weight"], np.ones(8, np.float32))
  tok = data.tokenizer()
  real = batch["masked_lm_weights"] > 0
  rows = np.broadcast_to(np.arange(8)[:, None], real.shape)
  positions = batch["masked_lm_positions"][real]
  assert (batch["input_mask"][rows[real], positions] == 1).all()
  assert not np.isin(batch["masked_lm_ids"][real], list(tok.special_ids)).any()
  assert (batch["input_ids"] == tok.mask_id).sum() > 0
  assert (batch["input_ids"][:, 0] == tok.cls_id).all()


def test_epochs_visit_every_example_once_in_new_orders(data):
  batches = _batches(data)
  n = batches.num_examples()
  records = _records(batches, 0, -(-2 * n // 8))
  first, second = records[:n], records[n:2 * n]
  assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
  assert not np.array_equal(first, second)


def test_resume_from_a_position_replays_the_same_batches(data):
  batches = _batches(data)
  served = _take(batches.iterate(), 6)
  for i in (0, 3):
    resumed = _take(batches.iterate(served[i][1]), 5 - i)
    for (expected, position), (batch, again) in zip(served[i + 1:], resumed):
      assert position == again
      for key in expected:
        np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)


def test_host_slices_make_the_same_global_batches_on_any_host_count(data):
  """Hosts' batches stacked in host order are the one-host global batch; a position taken on 2
  hosts resumes on 4 with the batches 1 host would have served."""
  one = _take(_batches(data, 8).iterate(), 4)
  two = [_take(_batches(data, 4, p, 2).iterate(), 2) for p in range(2)]
  for j in range(2):
    for key in one[j][0]:
      stacked = np.concatenate([two[p][j][0][key] for p in range(2)])
      np.testing.assert_array_equal(stacked, one[j][0][key], err_msg=key)
    assert two[0][j][1] == two[1][j][1] == one[j][1]
  position = two[0][1][1]  # after 2 global batches
  four = [_take(_batches(data, 2, p, 4).iterate(position), 2) for p in range(4)]
  for j in range(2):
    for key in one[2 + j][0]:
      stacked = np.concatenate([four[p][j][0][key] for p in range(4)])
      np.testing.assert_array_equal(stacked, one[2 + j][0][key], err_msg=key)


def test_dynamic_masks_change_per_epoch_and_static_ones_do_not(data):
  """A record's masks depend on (seed, epoch, record) with dynamic masking, on (seed, record)
  with static masking, and never on the batch it lands in."""
  def masks(dynamic, epoch, records=(0,), seed=0):
    batch = _batches(data, dynamic=dynamic, seed=seed)._batch(  # pylint: disable=protected-access
        "train", np.array(records), np.full(len(records), epoch))
    return batch["masked_lm_positions"][list(records).index(0)]

  assert not np.array_equal(masks(True, 0), masks(True, 1))
  np.testing.assert_array_equal(masks(True, 1), masks(True, 1, records=(3, 0, 7)))
  assert not np.array_equal(masks(True, 1), masks(True, 1, seed=1))
  np.testing.assert_array_equal(masks(False, 0), masks(False, 1))


def test_stored_static_masks(tmp_path):
  data = _prepare(str(tmp_path), static_masks=True)
  with pytest.raises(UserError, match="dynamic_masking=false"):
    _batches(data, dynamic=True)
  batches = _batches(data, dynamic=False)
  first = [b for b, _ in _take(batches.iterate(), 2)]
  again = [b for b, _ in _take(batches.iterate(), 2)]
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  batch = first[0]
  assert batch["masked_lm_weights"].sum() > 0
  restored = masking.unmask(batch)
  assert (restored != batch["input_ids"]).any()  # the stored ids are the masked ones
  assert (batch["input_ids"] == data.tokenizer().mask_id).any()


def test_whole_word_masking_masks_whole_words(data):
  tok = data.tokenizer()
  starts_table = tok.word_boundary_tables()
  batch, _ = next(_batches(data, whole_word=True).iterate())
  original = masking.unmask(batch)
  starts = tokenization.word_starts(original, *starts_table)
  for row in range(len(original)):
    chosen = set(batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0].tolist())
    length = int(batch["input_mask"][row].sum())
    for i in chosen:  # the word a masked token belongs to is masked whole
      start = i
      while start > 1 and not starts[row, start]:
        start -= 1
      end = i + 1
      while end < length - 1 and not starts[row, end] and original[row, end] != tok.sep_id:
        end += 1
      word = set(range(start, end)) - {j for j in range(start, end)
                                       if original[row, j] in tok.special_ids}
      assert word <= chosen, (row, i, sorted(word), sorted(chosen))


def test_eval_covers_every_held_out_example_once(data):
  one = list(_batches(data, 8).eval_batches())
  n = _batches(data).num_examples("heldout")
  weights = np.concatenate([b["example_weight"] for b in one])
  assert weights.sum() == n and len(weights) == -(-n // 8) * 8
  assert (weights[n:] == 0).all()
  two = [list(_batches(data, 4, p, 2).eval_batches()) for p in range(2)]
  for j, batch in enumerate(one):
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([two[p][j][key] for p in range(2)]),
                                    batch[key], err_msg=key)
  assert list(_batches(data, 8).eval_batches())[0]["input_ids"].tolist() == \
      one[0]["input_ids"].tolist()  # fixed masks


def test_bad_shards_and_too_few_examples(tmp_path):
  data = _prepare(str(tmp_path))
  with pytest.raises(UserError, match="fewer than one global batch"):
    next(_batches(data, 100000).iterate())
  path = os.path.join(data.directory, data.info["phases"][str(SEQ)]["train"][0][0])
  with open(path, "rb") as f:
    content = f.read()
  with open(path, "wb") as f:
    f.write(content[:len(content) // 2])
  with pytest.raises(UserError, match=os.path.basename(path)):
    _batches(loader.PreparedData(data.directory)).iterate().__next__()
  os.remove(os.path.join(data.directory, "info.json"))
  with pytest.raises(UserError, match="holds no prepared data"):
    loader.PreparedData(data.directory)


def test_contiguous_spans_are_two_segments_and_one_segment_spans_still_load(tmp_path):
  """Spans (prepare --contiguous=true) load as `[CLS] A [SEP] B [SEP]` rows, segment ids 0 then
  1; spans of one segment, as data prepared before the cut (layout.FORMAT 1) holds them, still
  load, as `[CLS] span [SEP]` with the same text and segment ids 0."""
  data = _prepare(str(tmp_path), contiguous=True)
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  rules = loader.Masking(special, 0.15, PREDICTIONS, True, 0, None)

  def rows(prepared):
    batches = loader.PairBatches(prepared, SEQ, rules, batch_size=8, threads=1, contiguous=True)
    return batches.num_examples(), next(batches.iterate())[0], next(batches.eval_batches())

  count, batch, eval_batch = rows(data)
  for b in (batch, eval_batch):
    assert (b["segment_ids"] == 1).any(axis=1).all() and b["masked_lm_weights"].sum() > 0
  assert (batch["next_sentence_label"] == 0).all()

  # Rewrite every span as one segment: A and B joined, B empty (len_b = 0).
  for split in ("train", "heldout"):
    for name, n in data.info[layout.CONTIGUOUS][str(SEQ)][split]:
      path = os.path.join(data.directory, name)
      records = shards.Records([path], [n]).read(np.arange(n))
      joined = []
      for record in records:
        values = np.frombuffer(record, data.dtype)
        la, lb = int(values[0]), int(values[1])
        joined.append(shards.encode_pair(values[4:4 + la + lb], values[:0], False, data.dtype))
      assert shards.write_shard(path, joined) == n
  info_path = os.path.join(data.directory, layout.INFO_FILE)
  with open(info_path) as f:
    info = json.load(f)
  with open(info_path, "w") as f:
    json.dump({**info, "format": 1}, f)
  old_count, old_batch, old_eval = rows(loader.PreparedData(data.directory))
  assert old_count == count
  for new, old in ((batch, old_batch), (eval_batch, old_eval)):
    assert (old["segment_ids"] == 0).all() and old["masked_lm_weights"].sum() > 0
    np.testing.assert_array_equal(old["input_mask"].sum(axis=1),
                                  new["input_mask"].sum(axis=1) - 1)
    for new_ids, old_ids, segments, real, n in zip(
        masking.unmask(new), masking.unmask(old), new["segment_ids"], new["input_mask"],
        old["input_mask"].sum(axis=1)):
      len_a = int(((segments == 0) & (real == 1)).sum()) - 2  # [CLS] A [SEP]
      text = np.concatenate([new_ids[1:1 + len_a], new_ids[2 + len_a:n]])
      np.testing.assert_array_equal(old_ids[:n], [special.cls, *text, special.sep])
