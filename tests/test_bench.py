"""Tests of bertjax.tools.bench (with bench_peers, bench_measure, bench_tables, bench_rows,
bench_recipe): the peers run at tiny shapes, back-to-back timing, bad arguments, the real rows
(the loader's first batch of the bundled corpus, packed as the fast recipe packs, and the MFU of
their real work) (the FLOP formula: tests/test_flops.py).

The hf_flax peer needs transformers 4.57.6 (the last with Flax), which the [test] extra's
transformers 5 replaces; its real run is the one test here that skips without it.
"""
import dataclasses
import json
import math
import time

import flax
import jax
import numpy as np
import pytest

from bertjax.data.pretraining import loader, masking, packing
from bertjax.tools import bench, bench_measure, bench_peers, bench_rows
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.training import flops

TINY = dict(batch_size=4, seq_len=16, max_predictions=3, steps=2, warmup=1, vocab_size=128)


def _check_figures(rows, packing=0):
  """Every row's figures are positive, finite and consistent with TINY's shapes: FLOPs of the
  batch's real work (a packed row's attention per sequence), real tokens and sequences."""
  batch = bench.make_batch(128, 4, 16, 3, packing=packing)
  expected = flops.model_flops(bert_config("tiny", vocab_size=128), flops.work_of(batch))
  for r in rows:
    for key in ("step_ms", "tokens_per_s", "examples_per_s", "achieved_flops_per_s"):
      assert math.isfinite(r[key]) and r[key] > 0, (r["peer"], key, r[key])
    assert r["peak_memory_bytes"] >= 0
    assert r["model_flops"] == expected
    assert r["tokens_per_s"] == pytest.approx(r["examples_per_s"] * 16 / max(packing, 1))
    assert r["tokens_per_s"] == pytest.approx(4 * 16 * 1e3 / r["step_ms"])
    assert r["achieved_flops_per_s"] == pytest.approx(expected * 1e3 / r["step_ms"])
    assert r["platform"] != "cpu" or r["mfu"] is None  # no known peak for a CPU


def test_both_peers_report_positive_finite_figures(tmp_path, capsys):
  out = tmp_path / "bench.json"
  rows = bench.main(["--size=tiny", "--peers=bertjax,torch", "--batch_size=4", "--seq_len=16",
                     "--max_predictions=3", "--steps=2", "--warmup=1", "--vocab_size=128",
                     "--recipe=paper", "--rows=synthetic", f"--json={out}"])
  table = capsys.readouterr().out
  assert "jax/torch" in table and "tiny" in table and "gathers the masked ones" in table
  written = json.loads(out.read_text())
  assert written["rows"] == json.loads(json.dumps(rows))
  assert [(r["size"], r["peer"]) for r in rows] == [("tiny", "bertjax"), ("tiny", "torch")]
  _check_figures(rows)
  jax_row, torch_row = rows
  assert jax_row["speedup_vs_torch"] == pytest.approx(
      jax_row["tokens_per_s"] / torch_row["tokens_per_s"])
  assert "speedup_vs_torch" not in torch_row
  assert "jax/hf_flax" not in table and "speedup_vs_hf_flax" not in jax_row


@pytest.mark.skipif(bench_peers.flax_bert_for_pretraining() is None,
                    reason="this transformers has no FlaxBertForPreTraining (transformers 5 "
                    "removed Flax); run in a venv with transformers==4.57.6")
def test_hf_flax_peer_reports_positive_finite_figures(capsys):
  rows = bench.main(["--size=tiny", "--peers=bertjax,hf_flax", "--batch_size=4", "--seq_len=16",
                     "--max_predictions=3", "--steps=1", "--warmup=1", "--vocab_size=128",
                     "--recipe=paper", "--rows=synthetic"])
  table = capsys.readouterr().out
  assert "jax/hf_flax" in table and "jax/torch" not in table
  assert [(r["size"], r["peer"]) for r in rows] == [("tiny", "bertjax"), ("tiny", "hf_flax")]
  _check_figures(rows)
  jax_row, flax_row = rows
  assert jax_row["speedup_vs_hf_flax"] == pytest.approx(
      jax_row["tokens_per_s"] / flax_row["tokens_per_s"])
  assert "speedup_vs_hf_flax" not in flax_row and "speedup_vs_torch" not in jax_row


def test_flax_bert_found_only_before_transformers_5():
  transformers = pytest.importorskip("transformers")
  major = int(transformers.__version__.split(".")[0])
  assert (bench_peers.flax_bert_for_pretraining() is None) == (major >= 5)
  assert ("hf_flax" in bench_peers.default_peers()) == (major < 5)
  if major >= 5:  # the real unavailable path, not patched
    with pytest.raises(UserError, match="FlaxBertForPreTraining"):
      bench.run(**{**TINY, "peers": ["hf_flax"]})


def test_hf_flax_without_flax_bert_is_a_user_error(monkeypatch, capsys):
  monkeypatch.setattr(bench_peers, "flax_bert_for_pretraining", lambda: None)
  assert bench_peers.default_peers() == ("bertjax", "torch")
  with pytest.raises(UserError, match=r"FlaxBertForPreTraining.*transformers==4\.57\.6"):
    bench.run(**{**TINY, "peers": ["bertjax", "hf_flax"]})
  with pytest.raises(SystemExit) as exit_info:
    bench.main(["--size=tiny", "--peers=hf_flax"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("bertjax.tools.bench: error: --peers=hf_flax needs") and err.count("\n") == 1


def test_steps_are_timed_back_to_back():
  """time_steps blocks once after the warmup and once after the timed steps, not per step:
  a sync that takes 0.2 s adds 0.2 s / 10 to a step."""
  calls = []
  seconds = bench_measure.time_steps(
      lambda: calls.append("step"), lambda: (calls.append("sync"), time.sleep(0.2)),
      steps=10, warmup=2, after_warmup=lambda: calls.append("reset"))
  assert calls == ["step"] * 2 + ["sync", "reset"] + ["step"] * 10 + ["sync"]
  assert 0.02 <= seconds < 0.1


def test_make_batch_keys_and_positions():
  batch = bench.make_batch(vocab_size=128, batch_size=4, seq_len=16, max_predictions=3)
  assert set(batch) == {"input_ids", "segment_ids", "input_mask", "masked_lm_positions",
                        "masked_lm_ids", "masked_lm_weights", "next_sentence_label",
                        "example_weight"}
  positions = batch["masked_lm_positions"]
  assert positions.shape == (4, 3) and positions.min() >= 1 and positions.max() < 16
  assert all(len(set(row)) == 3 for row in positions.tolist())
  assert batch["input_ids"].max() < 128


@pytest.mark.parametrize("overrides, message", [
    (dict(sizes=["huge"]), "unknown --size 'huge'"),
    (dict(peers=["tensorflow"]), "unknown --peers entry 'tensorflow'"),
    (dict(dtype="float16"), "unknown --dtype 'float16'"),
    (dict(steps=0), "--steps=0"),
    (dict(max_predictions=16), "--max_predictions=16 must be below --seq_len=16"),
])
def test_bad_arguments_raise_user_error(overrides, message):
  with pytest.raises(UserError, match=message.replace("-", r"\-").replace("(", r"\(")):
    bench.run(**{**TINY, **overrides})


def test_cli_reports_bad_size_in_one_line(capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench.main(["--size=tiny,huge", "--peers=torch"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("bertjax.tools.bench: error: unknown --size 'huge'") and err.count("\n") == 1


def test_make_batch_packed_layout():
  batch = bench.make_batch(128, 2, 16, 3, packing=2)
  assert batch["sequence_ids"][0].tolist() == [1] * 8 + [2] * 8
  assert batch["position_ids"][0].tolist() == list(range(8)) * 2
  assert batch["cls_positions"].tolist() == [[0, 8]] * 2
  assert batch["next_sentence_label"].shape == batch["example_weight"].shape == (2, 2)
  assert not set(batch["masked_lm_positions"].ravel()) & {0, 8}  # no [CLS] is masked


def test_compiled_memory_without_running(capsys):
  """--memory_only compiles the step and reads XLA's plan: the arguments hold the parameters
  and AdamW's two moments (float32), and full remat keeps fewer activations."""
  args = ["--size=tiny", "--peers=bertjax", "--batch_size=8", "--seq_len=128",
          "--max_predictions=20", "--vocab_size=128", "--memory_only", "--rows=synthetic",
          "--recipe=paper"]
  [none] = bench.main(args)
  [full] = bench.main(args + ["--remat=full"])
  assert "total GiB" in capsys.readouterr().out and none["step_ms"] is None
  model = heads.BertForPreTraining(bert_config("tiny", vocab_size=128))
  shapes = jax.eval_shape(lambda rng, batch: heads.init_from_batch(model, rng, batch),
                          jax.random.PRNGKey(0), bench.make_batch(128, 8, 128, 20))
  params = sum(math.prod(x.shape) for x in jax.tree.leaves(flax.linen.unbox(shapes)))
  assert none["compiled_memory"]["arguments"] >= 3 * 4 * params
  # What the backward keeps: full remat keeps each layer's input only.
  assert full["compiled_memory"]["activations"] < none["compiled_memory"]["activations"] / 3


def test_bertjax_only_options_are_refused_with_other_peers():
  with pytest.raises(UserError, match="--peers=bertjax"):
    bench.run(sizes=["tiny"], peers=["bertjax", "torch"], **{**TINY},
              options=bench.BertjaxOptions(packing=2))
  with pytest.raises(UserError, match="unknown --remat 'most'"):
    bench.run(sizes=["tiny"], peers=["bertjax"], **TINY,
              options=bench.BertjaxOptions(remat="most"))
  with pytest.raises(UserError, match="unknown --prng 'philox'"):
    bench.run(sizes=["tiny"], peers=["bertjax"], **TINY,
              options=bench.BertjaxOptions(prng="philox"))


def test_modernbert_rows_time_its_step_and_count_its_flops(capsys):
  """--architecture=modernbert times bertjax's ModernBERT step (masked LM alone), counts its
  FLOPs by its formula (GeGLU, windowed layers), and is refused with BERT's peers or sizes."""
  rows = bench.main(["--architecture=modernbert", "--size=tiny", "--peers=bertjax",
                     "--batch_size=2", "--seq_len=32", "--max_predictions=8", "--steps=2",
                     "--warmup=1", "--vocab_size=128", "--attention=xla", "--packing=2",
                     "--rows=synthetic"])
  [row] = rows
  assert row["step_ms"] > 0 and row["attention"] == "xla"
  config = bert_config("tiny", "modernbert", vocab_size=128)
  batch = bench.make_batch(128, 2, 32, 8, packing=2)
  assert row["model_flops"] == flops.model_flops(config, flops.work_of(batch))
  with pytest.raises(UserError, match="--peers=bertjax"):
    bench.run(sizes=["tiny"], peers=["bertjax", "torch"], **TINY,
              options=bench.BertjaxOptions(architecture="modernbert"))
  with pytest.raises(UserError, match="unknown --size 'mini'"):
    bench.run(sizes=["mini"], peers=["bertjax"], **TINY,
              options=bench.BertjaxOptions(architecture="modernbert"))


# Real rows: the bundled corpus's first 12 documents at 128 tokens, prepared once for the module
# (its first batch of 16 packed rows holds rows of two pairs).
REAL = dict(batch_size=16, seq_len=128, max_predictions=20, steps=1, warmup=1, vocab_size=8000,
            rows_documents=12)


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("bench_rows"))


def _real_config():
  return bench.row_config("tiny", 16, 128, 20, "float32", 1, 1, bench.FAST)


def test_real_rows_are_the_loaders_first_batch_packed_as_the_fast_recipe(rows_dir):
  real = bench_rows.real_batch(_real_config(), rows_dir, documents=12)
  batch = real.batch
  data = loader.PreparedData(real.directory)
  assert data.flags["input"].endswith("bundled_corpus_first12.txt")
  assert (data.flags["max_seq_length"], data.flags["dupe_factor"]) == ([128], 1)
  # The loader itself, as configs/base.py:fast reads it: packed, dynamic masks, seed 0.
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  stream = loader.PairBatches(data, 128, loader.Masking(special, 0.15, 20, True, 0, None),
                              batch_size=16, packing=True).iterate()
  expected, _ = next(stream)
  stream.close()
  assert set(batch) == set(expected) == set(loader.PACKED_BATCH_KEYS)
  for key, value in expected.items():
    np.testing.assert_array_equal(batch[key], value, err_msg=key)
  # Up to 3 pairs a row, two in some rows; the slots a packed row can fill (21, not 60).
  assert batch["input_ids"].shape == (16, 128) and batch["cls_positions"].shape == (16, 3)
  assert (batch["sequence_ids"].max(axis=1) == 2).sum() >= 2
  assert batch["masked_lm_positions"].shape[1] == packing.predictions_per_row(128, 3, 20, 0.15)
  work = flops.work_of(batch)
  assert work.tokens == batch["input_mask"].sum() and 0 < work.tokens <= 16 * 128
  assert work.sequences == np.count_nonzero(batch["example_weight"]) > 16
  assert work.predictions == np.count_nonzero(batch["masked_lm_weights"])
  assert real.vocab_size <= bench_rows.ROWS_VOCAB_SIZE
  # Kept: the same directory and batch the second time.
  again = bench_rows.real_batch(_real_config(), rows_dir, documents=12)
  assert again.directory == real.directory
  np.testing.assert_array_equal(again.batch["input_ids"], batch["input_ids"])


def test_bench_on_real_rows_reports_the_mfu_of_their_real_work(rows_dir, tmp_path, monkeypatch,
                                                              capsys):
  monkeypatch.setattr(flops, "peak_flops", lambda device, dtype: 1e12)  # a CPU has none
  out = tmp_path / "real.json"
  [row] = bench.main(["--size=tiny", "--batch_size=16", "--seq_len=128", "--steps=1",
                      "--warmup=1", "--vocab_size=8000", "--rows_documents=12",
                      f"--rows_dir={rows_dir}", f"--json={out}", "--remat=full",
                      "--optimizer=lamb", "--prng=rbg"])
  real = bench_rows.real_batch(_real_config(), rows_dir, documents=12)
  work = flops.work_of(real.batch)
  expected = flops.model_flops(bert_config("tiny", vocab_size=8000), work)
  assert row["model_flops"] == expected
  assert row["mfu"] == pytest.approx(expected * 1e3 / row["step_ms"] / 1e12)
  assert row["tokens_per_s"] == pytest.approx(work.tokens * 1e3 / row["step_ms"])
  assert row["examples_per_s"] == pytest.approx(work.sequences * 1e3 / row["step_ms"])
  assert (row["rows"], row["recipe"], row["rows_source"], row["packing"]) == (
      "real", "fast", real.directory, 3)
  assert (row["fill"], row["sequences"], row["predictions"]) == (
      work.tokens / (16 * 128), work.sequences, work.predictions)
  # The fast recipe: no attention dropout, so the fused path (xla on a CPU); bertjax's options.
  assert (row["attention"], row["dtype"], row["remat"], row["optimizer"], row["prng"]) == (
      "xla", "float32", "full", "lamb", "rbg")
  assert row["step_compile_s"] > 0 and row["init_compile_s"] > 0
  table = capsys.readouterr().out
  assert "fast recipe, attention xla, packing 3, remat full, lamb, rbg" in table
  assert f"real rows of the bundled corpus ({real.directory}), up to 3 sequences a row" in table
  assert f"fill {100 * row['fill']:.1f}%" in table
  assert json.loads(out.read_text())["rows"] == json.loads(json.dumps([row]))


def test_recipes_are_the_config_files():
  """The fast recipe is configs/base.py:fast (configs/modernbert.py for ModernBERT), the paper's
  configs/base.py, with the row's shapes; bertjax's choices apply on top."""
  fast = bench.row_config("base", 8, 128, 20, "auto", 1, 1, bench.FAST)
  assert (fast.model.attention_dropout_rate, fast.model.mlm_logits_dtype, fast.data.packing,
          fast.data.max_sequences_per_row, fast.train.optimizer) == (0.0, "auto", True, 3, "adamw")
  paper = bench.row_config("base", 8, 128, 20, "auto", 1, 1, bench.BertjaxOptions())
  assert (paper.model.attention_dropout_rate, paper.model.mlm_logits_dtype,
          paper.data.packing) == (0.1, "float32", False)
  modern = bench.row_config("base", 8, 1024, 307, "auto", 1, 1,
                            dataclasses.replace(bench.FAST, architecture="modernbert"))
  assert (modern.train.optimizer, modern.train.clip_norm, modern.data.masked_lm_prob,
          modern.pretraining.nsp, modern.data.long_seq_length) == (
              "stable_adamw", 0.0, 0.3, False, 0)
  reference = bench.row_config("base", 8, 128, 20, "auto", 1, 1,
                               dataclasses.replace(bench.FAST, attention="reference"))
  assert reference.model.attention_dropout_rate == 0.1


def test_real_rows_refusals(rows_dir):
  with pytest.raises(UserError, match=r"--recipe=paper to compare with transformers"):
    bench.run(**TINY, peers=["bertjax", "torch"])
  with pytest.raises(UserError, match="unknown --rows 'fake'"):
    bench.run(**TINY, peers=["bertjax"], rows="fake")
  with pytest.raises(UserError, match="contiguous spans, which fill their rows"):
    bench.run(**TINY, options=dataclasses.replace(bench.FAST, architecture="modernbert",
                                                  packing=2))
  shapes = {**REAL, "rows_dir": rows_dir}
  with pytest.raises(UserError, match=r"--vocab_size=128 is smaller than the real rows' "):
    bench.run(**{**shapes, "vocab_size": 128})
  with pytest.raises(UserError, match=r"fewer than one global batch of 4096.*--rows_documents"):
    bench.run(**{**shapes, "batch_size": 4096})
