"""Sequence packing: the plan (every pair once, rows that fit, best-fit decreasing), the plans
prepare writes, packed batches that hold exactly the unpacked examples, data prepared before
plans existed, and packed pretraining through the real trainer."""
import json
import os
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax import tasks
from bertjax.configs import tiny
from bertjax.data import packed_rows, pipeline, sources
from bertjax.data.pretraining import layout, loader, masking, packing, preparation, shards
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import pretraining, pretraining_data
from bertjax.training import train

SEQ, PREDICTIONS, K = 128, 20, 3


def _sequential_best_fit(lengths, max_seq_length, k):
  """The packs' (tokens, examples) of best-fit decreasing one example at a time (the rule
  plan_packs implements on a histogram): longest first, into the fitting pack with the least
  room left (more examples first on a tie), else a new one."""
  packs = []  # [tokens, examples]
  for length in sorted(lengths, reverse=True):
    fitting = [p for p in packs if p[0] + length <= max_seq_length and p[1] < k]
    if fitting:
      best = min(fitting, key=lambda p: (max_seq_length - p[0], -p[1]))
      best[0] += length
      best[1] += 1
    else:
      packs.append([length, 1])
  return sorted(map(tuple, packs))


def _check_plan(plan, lengths, max_seq_length, k):
  """Every index once, each pack within max_seq_length tokens and k examples, -1 only after
  the filled slots."""
  filled = plan >= 0
  assert plan.shape[1] == k and plan.dtype == np.int32
  assert sorted(plan[filled].tolist()) == list(range(len(lengths)))
  assert filled.any(axis=1).all()
  assert (np.sort(~filled, axis=1, kind="stable") == ~filled).all()  # empty slots last
  tokens = np.where(filled, np.asarray(lengths)[np.maximum(plan, 0)], 0).sum(axis=1)
  assert tokens.max(initial=0) <= max_seq_length


def test_plan_packs_every_example_once_in_rows_that_fit():
  rng = np.random.default_rng(0)
  # Skewed as BERT's pairs: most near the full length, the rest of any length.
  n, length = 20000, 128
  lengths = np.where(rng.random(n) < 0.3, rng.integers(5, length + 1, n),
                     rng.integers(length - 20, length + 1, n))
  plan = packing.plan_packs(lengths, length, K)
  _check_plan(plan, lengths, length, K)
  np.testing.assert_array_equal(plan, packing.plan_packs(lengths, length, K))  # deterministic
  unpacked = packing.efficiency(lengths.sum(), n, length)
  packed = packing.efficiency(lengths.sum(), len(plan), length)
  assert packed > unpacked + 0.1 and packed > 0.93, (unpacked, packed)  # 80% -> 94%
  assert (plan >= 0).sum(axis=1).max() == K
  # k = 1 is one example a row; nothing fits beside a full-length one.
  assert packing.plan_packs(lengths, length, 1).shape == (n, 1)
  full = packing.plan_packs([length] * 5 + [1] * 3, length, K)
  assert (full >= 0).sum(axis=1).tolist() == [1] * 5 + [3]


@pytest.mark.parametrize("seed", range(3))
def test_plan_packs_is_best_fit_decreasing(seed):
  """The histogram version packs exactly as placing the examples one at a time does."""
  rng = np.random.default_rng(seed)
  for _ in range(60):
    length, k = int(rng.integers(5, 40)), int(rng.integers(1, 5))
    lengths = rng.integers(1, length + 1, int(rng.integers(0, 60)))
    plan = packing.plan_packs(lengths, length, k)
    _check_plan(plan, lengths, length, k)
    filled = plan >= 0
    got = sorted(zip(np.where(filled, lengths[np.maximum(plan, 0)], 0).sum(axis=1).tolist(),
                     filled.sum(axis=1).tolist()))
    assert got == _sequential_best_fit(lengths.tolist(), length, k)


def test_plan_packs_refuses_what_cannot_fit():
  with pytest.raises(ValueError, match="do not all lie in"):
    packing.plan_packs([10, 33], 32, 3)
  with pytest.raises(ValueError, match="max_sequences_per_row=0"):
    packing.plan_packs([10], 32, 0)


@pytest.mark.parametrize("length,k,predictions,prob", [
    (24, 3, 4, 0.15), (40, 3, 5, 0.15), (40, 2, 3, 0.3), (33, 4, 20, 0.15), (30, 1, 2, 0.15)])
def test_predictions_per_row_is_the_most_a_row_can_have(length, k, predictions, prob):
  """W against every way of filling a row: 1 to k examples of >= 1 tokens, at most L in all."""

  def most(tokens_left, examples_left):
    if not examples_left:
      return 0
    return max([0] + [int(masking.num_to_predict(n, prob, predictions))
                      + most(tokens_left - n, examples_left - 1)
                      for n in range(1, tokens_left + 1)])

  assert packing.predictions_per_row(length, k, predictions, prob) == most(length, k)


def test_predictions_per_row_of_the_paper_lengths():
  """The fast recipe's rows (k = 3): 21 slots at 128 tokens (not 60), 78 at 512 (not 240); one
  example alone never reaches 20 at 128 (round(0.15 * 128) = 19)."""
  assert packing.predictions_per_row(128, 3, 20, 0.15) == 21
  assert packing.predictions_per_row(512, 3, 80, 0.15) == 78
  assert packing.predictions_per_row(128, 1, 20, 0.15) == 19


def test_pack_examples_lays_predictions_out_row_by_row():
  """Each row's real predictions, example by example, positions shifted to the row; a row with
  more predictions than its slots is refused."""
  real_tokens = np.arange(8) < 4  # [seq = 8]: 4 real tokens an example
  examples = {"input_ids": np.pad(np.arange(1, 13).reshape(3, 4), ((0, 0), (0, 4))),
              "input_mask": np.tile(real_tokens, (3, 1)).astype(int),
              "segment_ids": np.zeros((3, 8), int),
              "masked_lm_positions": np.array([[1, 3, 0], [2, 0, 0], [1, 2, 3]], np.int32),
              "masked_lm_ids": np.array([[2, 4, 0], [7, 0, 0], [10, 11, 12]], np.int32),
              "masked_lm_weights": np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32)}
  slots = np.array([[True, True], [True, False]])  # examples 0, 1 in row 0; 2 in row 1
  batch = packed_rows.pack_examples(examples, slots, predictions=4)
  np.testing.assert_array_equal(batch["input_ids"][0], [1, 2, 3, 4, 5, 6, 7, 8])
  np.testing.assert_array_equal(batch["masked_lm_positions"], [[1, 3, 6, 0], [1, 2, 3, 0]])
  np.testing.assert_array_equal(batch["masked_lm_ids"], [[2, 4, 7, 0], [10, 11, 12, 0]])
  np.testing.assert_array_equal(batch["masked_lm_weights"], [[1, 1, 1, 0], [1, 1, 1, 0]])
  assert packed_rows.pack_examples(examples, slots)["masked_lm_ids"].shape == (2, 6)  # k * P
  with pytest.raises(ValueError, match="3 predictions, more than its 2 slots"):
    packed_rows.pack_examples(examples, slots, predictions=2)


# ----------------------------------------------------------------------------------------------
# Plans in prepared data, and packed batches.


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """8 chapters cut into documents of 2 sentences, so that many pairs are short, prepared at
  128 tokens in 3 text shards: 310 training pairs in 226 rows."""
  directory = str(tmp_path_factory.mktemp("packing"))
  sentences = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[:8] for s in doc]
  text = os.path.join(directory, "text.txt")
  with open(text, "w") as f:
    f.write("\n\n".join("\n".join(sentences[i:i + 2]) for i in range(0, len(sentences), 2)))
  options = layout.Options(input=text, vocab_size=1000, max_seq_length=(SEQ,),
                           max_predictions_per_seq=(PREDICTIONS,), dupe_factor=1,
                           eval_fraction=0.2, shard_size_mb=0.03)
  preparation.prepare(options, os.path.join(directory, "data"), workers=1, progress=False)
  return loader.PreparedData(os.path.join(directory, "data"))


def _batches(data, packing_on=True, batch_size=8, process_index=0, process_count=1):
  tok = data.tokenizer()
  rules = loader.Masking(masking.SpecialTokens.from_tokenizer(tok), 0.15, PREDICTIONS, True, 0,
                         None)
  return loader.PairBatches(data, SEQ, rules, batch_size=batch_size, threads=1,
                            process_index=process_index, process_count=process_count,
                            packing=packing_on)


def test_prepare_writes_each_shards_plan(data):
  phase = data.info["phases"][str(SEQ)]
  assert len(phase["packs"]) == len(phase["train"]) >= 2
  lengths_all = []
  for (pairs_name, count), (plan_name, packs) in zip(phase["train"], phase["packs"]):
    assert plan_name == packing.plan_name(pairs_name)
    assert plan_name.startswith(f"seq{SEQ}/packs-train-") and plan_name.endswith(".npy")
    records = shards.Records([os.path.join(data.directory, pairs_name)], [count])
    lengths = [packing.pair_length(r, data.dtype) for r in records.read(np.arange(count))]
    plan = np.load(os.path.join(data.directory, plan_name))
    np.testing.assert_array_equal(plan, packing.plan_packs(lengths, SEQ, K))
    assert len(plan) == packs
    lengths_all += lengths
  assert phase["packed_rows"] == sum(n for _, n in phase["packs"]) < phase["examples"]
  tokens = sum(lengths_all)
  assert phase["unpacked_efficiency"] == pytest.approx(tokens / (phase["examples"] * SEQ))
  assert phase["packing_efficiency"] == pytest.approx(tokens / (phase["packed_rows"] * SEQ))
  assert phase["packing_efficiency"] > phase["unpacked_efficiency"] + 0.1
  assert not any("heldout" in name for name, _ in phase["packs"])  # evaluation is not packed
  line = preparation.packing_summary(SEQ, phase)
  assert f"{phase['packed_rows']} rows" in line and "unpacked" in line


def test_a_packed_batch_holds_the_unpacked_examples(data):
  """Each example of a packed row is its record's unpacked example (same tokens, segments, NSP
  label and masks, drawn from the record's own generator for the pack's epoch), shifted to its
  place in the row; the stream resumes from a position like the unpacked one."""
  packed = _batches(data)
  unpacked = _batches(data, packing_on=False)
  stream = pipeline.host_batches(packed.num_rows(), packed.order_seed, 0,
                                 lambda rows, epochs: (rows, epochs), batch_size=8,
                                 process_index=0, process_count=1, threads=1)
  rows_epochs = [item for item, _ in zip(stream, range(packed.num_rows() // 8 + 2))]
  # A batch from the second epoch, so the masks' epoch is the pack's.
  j = len(rows_epochs) - 1
  (packs, epochs), position = rows_epochs[j]
  assert epochs.max() >= 1
  batch, after = next(packed.iterate(position - 8))
  assert after == position and set(batch) == set(loader.PACKED_BATCH_KEYS)
  records = data.packs(SEQ).read(packs)  # [8, k]
  filled = records >= 0
  assert filled.sum() > 8  # rows hold several examples
  for key in ("input_ids", "segment_ids", "input_mask", "position_ids", "sequence_ids"):
    assert batch[key].shape == (8, SEQ) and batch[key].dtype == np.int32, key
  width = packing.predictions_per_row(SEQ, K, PREDICTIONS, 0.15)
  assert width == 21 and packed.row_predictions == width  # not K * PREDICTIONS = 60
  assert batch["masked_lm_positions"].shape == (8, width)
  assert batch["next_sentence_label"].shape == batch["example_weight"].shape == (8, K)
  np.testing.assert_array_equal(batch["example_weight"], filled.astype(np.float32))
  for row in range(8):
    offset = first = 0  # the example's first token, and its first prediction slot
    for slot in range(K):
      if not filled[row, slot]:
        assert batch["cls_positions"][row, slot] == 0
        continue
      alone = unpacked._batch(  # pylint: disable=protected-access
          "train", records[row, slot:slot + 1], epochs[row:row + 1])
      n = int(alone["input_mask"].sum())
      span = slice(offset, offset + n)
      assert batch["cls_positions"][row, slot] == offset
      for key in ("input_ids", "segment_ids", "input_mask"):
        np.testing.assert_array_equal(batch[key][row, span], alone[key][0, :n], err_msg=key)
      np.testing.assert_array_equal(batch["position_ids"][row, span], np.arange(n))
      assert (batch["sequence_ids"][row, span] == slot + 1).all()
      assert batch["next_sentence_label"][row, slot] == alone["next_sentence_label"][0]
      real = alone["masked_lm_weights"][0] > 0  # the example's predictions, then the row's next
      m = int(real.sum())
      predictions = slice(first, first + m)
      assert batch["masked_lm_weights"][row, predictions].tolist() == [1.0] * m
      np.testing.assert_array_equal(batch["masked_lm_ids"][row, predictions],
                                    alone["masked_lm_ids"][0][real])
      np.testing.assert_array_equal(batch["masked_lm_positions"][row, predictions],
                                    alone["masked_lm_positions"][0][real] + offset)
      offset += n
      first += m
    for key in ("input_ids", "input_mask", "position_ids", "sequence_ids"):
      assert not batch[key][row, offset:].any(), key  # padding after the last example
    for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
      assert not batch[key][row, first:].any(), key  # empty prediction slots after the last
  # Resumed from the position after batch 0, the stream serves what followed it.
  fresh = packed.iterate(0)
  _, first = next(fresh)
  resumed, again = next(packed.iterate(first))
  expected, position = next(fresh)
  assert again == position == 16
  for key in expected:
    np.testing.assert_array_equal(resumed[key], expected[key], err_msg=key)


def test_packed_host_slices_make_the_global_batch(data):
  one = next(_batches(data, batch_size=8).iterate())[0]
  two = [next(_batches(data, batch_size=4, process_index=p, process_count=2).iterate())[0]
         for p in range(2)]
  for key in one:
    np.testing.assert_array_equal(np.concatenate([two[0][key], two[1][key]]), one[key],
                                  err_msg=key)


def test_data_prepared_before_plans(data, tmp_path):
  """Data without plans (an older bertjax's) trains unpacked as before; packing asks to prepare
  it again; prepare reuses it as finished (the new flag at its default)."""
  old = str(tmp_path / "old")
  shutil.copytree(data.directory, old)
  info_path = os.path.join(old, layout.INFO_FILE)
  with open(info_path) as f:
    info = json.load(f)
  del info["flags"]["max_sequences_per_row"]
  for phase in info["phases"].values():
    for key in ("packs", "packed_rows", "unpacked_efficiency", "packing_efficiency"):
      del phase[key]
  with open(info_path, "w") as f:
    json.dump(info, f)
  for name in os.listdir(os.path.join(old, f"seq{SEQ}")):
    if name.endswith(".npy"):
      os.remove(os.path.join(old, f"seq{SEQ}", name))
  prepared = loader.PreparedData(old)
  assert next(_batches(prepared, packing_on=False).iterate())[0]["input_ids"].shape == (8, SEQ)
  with pytest.raises(UserError, match="no packing plans at 128 tokens.*prepare it again"):
    next(_batches(prepared).iterate())

  config = tiny.get_config()
  config.data.update(prepared=old, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS)
  pretraining_data.check_prepared(prepared, tasks.typed(config))
  config.data.packing = True
  with pytest.raises(UserError, match="lacks at 128 tokens.*--max_sequences_per_row=3"):
    pretraining_data.check_prepared(prepared, tasks.typed(config))
  config.data.prepared = ""  # WORKDIR/data: it is prepared again by a rerun
  with pytest.raises(UserError, match=f"delete {old} and rerun"):
    pretraining_data.check_prepared(prepared, tasks.typed(config))

  options = layout.Options.from_json(info["flags"])
  assert preparation.prepare(options, old, progress=False) == info  # reused, not refused


def test_plans_of_another_k_are_refused(data):
  config = tiny.get_config()
  config.data.update(prepared=data.directory, max_seq_length=SEQ,
                     max_predictions_per_seq=PREDICTIONS, packing=True, max_sequences_per_row=4)
  with pytest.raises(UserError, match="at most 3 pairs, not the 4 of data.max_sequences_per_row"):
    pretraining_data.check_prepared(data, tasks.typed(config))
  config.data.max_sequences_per_row = 3
  pretraining_data.check_prepared(data, tasks.typed(config))


# ----------------------------------------------------------------------------------------------
# Through the trainer.


def _config(data, packing_on):
  config = tiny.get_config()
  config.model.update(size="tiny", dtype="float32", max_position_embeddings=SEQ)
  config.data.update(prepared=data.directory, max_seq_length=SEQ,
                     max_predictions_per_seq=PREDICTIONS, packing=packing_on, loader_threads=1)
  config.train.update(batch_size=8, eval_batch_size=8, num_train_steps=3, warmup_steps=1,
                      log_every_steps=1, eval_every_steps=3, eval_steps=1,
                      checkpoint_every_steps=1, keep_checkpoints=3)
  return config


def test_packed_pretraining_trains_with_the_unpacked_losses(data, tmp_path):
  """`pretraining.run` trains 3 packed steps through the real trainer, evaluates (unpacked) and
  checkpoints; its first step's losses and accuracies are those of the unpacked model on the
  same examples (1e-5, float32). The learning rate of step 1 is 0 (warmup), so checkpoint 1
  holds the parameters step 1 was computed with."""
  workdir = tmp_path / "run"
  result = pretraining.run(tasks.typed(_config(data, True)), str(workdir))
  assert result["examples"] == 8 and np.isfinite(result["loss"])
  with open(workdir / "metrics.jsonl") as f:
    logged = [json.loads(line) for line in f]
  train_records = [r for r in logged if r["split"] == "train"]
  assert [r["step"] for r in train_records] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) for r in logged)
  assert train_records[0]["learning_rate"] == 0.0
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2", "3"]

  # Step 1's examples, unpacked, one a row, through the unpacked model and terms.
  stream = pipeline.host_batches(len(data.packs(SEQ)), _batches(data).order_seed, 0,
                                 lambda rows, epochs: rows, batch_size=8, process_index=0,
                                 process_count=1, threads=1)
  records = data.packs(SEQ).read(next(stream)[0])  # [8, k]: the first batch's (epoch 0)
  records = records[records >= 0]
  assert len(records) > 8
  plain = _batches(data, packing_on=False)._batch(  # pylint: disable=protected-access
      "train", records, np.zeros(len(records), int))
  plain_config = tasks.typed(_config(data, False))
  task = pretraining.make_task(plain_config, str(tmp_path / "plain"),
                               train.run_context(plain_config))
  state = ocp.PyTreeCheckpointer().restore(str(workdir / "checkpoints" / "1" / "state"))
  outputs = heads.apply_to_batch(task.model, state["params"], plain, deterministic=True)
  for name, (values, weights) in task.terms(outputs, plain).items():
    expected = float(np.sum(values * weights) / np.sum(weights))
    assert train_records[0][name] == pytest.approx(expected, rel=1e-5, abs=1e-6), name
  # The checkpoint's data position counts packed rows: resuming it unpacked is refused.
  # (A UserError from inside run: main turns it into one line and exit 2.)
  with pytest.raises(UserError, match=r"trained with data.packing=True .* --config.data.packing="
                                      r"True"):
    config = _config(data, False)
    config.train.num_train_steps = 4
    pretraining.run(tasks.typed(config), str(workdir))
