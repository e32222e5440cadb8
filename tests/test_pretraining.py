"""End-to-end tests of pretraining through the command line: a run on the tiny config, resume
after a fresh process, SIGTERM, and every kind of bad input (CPU, a small slice of the bundled
corpus, a 32-token sequence)."""
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.errors import UserError
from bertjax.modeldir import saved_params
from bertjax.models import heads
from bertjax import tasks, tokenization
from bertjax.tasks import pretraining, pretraining_config
from bertjax.training import train

from conftest import cpu_env, tree_digest
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags(corpus, *overrides):
  """Flags of a short tiny run on the test corpus, then `overrides`."""
  text_file, vocab = corpus
  return [f"--config.data.input_files={text_file}", f"--config.data.vocab_model={vocab}",
          "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
          "--config.data.dupe_factor=2", "--config.data.eval_fraction=0.1",
          "--config.model.dropout_rate=0.1", "--config.model.attention_dropout_rate=0.1",
          "--config.train.batch_size=8", "--config.train.eval_batch_size=16",
          "--config.train.num_train_steps=6", "--config.train.warmup_steps=2",
          "--config.train.log_every_steps=1", "--config.train.eval_every_steps=3",
          "--config.train.checkpoint_every_steps=2", "--config.train.eval_steps=2", *overrides]


def _command(workdir, flags, config="configs/tiny.py"):
  return [sys.executable, "-m", "bertjax.main", f"--config={config}",
          f"--workdir={workdir}", *flags]


def _env(num_devices=1, optimized=False):
  return cpu_env(num_devices, optimized=optimized)


def _run(workdir, flags, config="configs/tiny.py", num_devices=1, timeout=300, optimized=False):
  return warm_python.run(_command(workdir, flags, config), env=_env(num_devices, optimized),
                         cwd=ROOT, timeout=timeout)


def _saved_params(workdir, step=None):
  """The parameters of the checkpoint at `step` (default: the latest) as numpy arrays."""
  root = os.path.join(workdir, "checkpoints")
  step = step if step is not None else max(int(s) for s in os.listdir(root) if s.isdigit())
  state = ocp.PyTreeCheckpointer().restore(os.path.join(root, str(step), "state"))
  return jax.tree.map(np.asarray, state["params"]), state


def _metrics(workdir):
  import json  # pylint: disable=import-outside-toplevel
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_cli_end_to_end(corpus, tmp_path):
  workdir = tmp_path / "run"
  out = _run(workdir, _flags(corpus))
  assert out.returncode == 0, out.stderr[-3000:]
  assert sorted(os.listdir(workdir)) == ["bert_config.json", "checkpoints", "config.json",
                                         "curves.png", "data", "eval_results.json",
                                         "metrics.jsonl", "tensorboard", "vocab.model"]
  assert sorted(int(s) for s in os.listdir(workdir / "checkpoints")) == [4, 6]  # keep 2
  records = _metrics(workdir)
  train_records = [r for r in records if r["split"] == "train"]
  eval_records = [r for r in records if r["split"] == "eval"]
  assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in eval_records] == [3, 6]
  for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
              "grad_norm", "param_norm", "examples_per_second", "tokens_per_second"):
    assert np.isfinite(train_records[-1][key]), key
  assert train_records[1]["learning_rate"] == pytest.approx(2e-3 * 1 / 2)  # warmup step 1 of 2
  assert eval_records[-1]["examples"] == 32  # eval_steps=2 batches of 16
  assert 0 <= eval_records[-1]["frequency_baseline_mlm_accuracy"] < 0.5
  last = json.loads((workdir / "eval_results.json").read_text())  # the last evaluation
  assert last == {**{k: v for k, v in eval_records[-1].items() if k != "split"},
                  "main_metric": "mlm_accuracy"}
  assert os.listdir(workdir / "tensorboard")
  config = (workdir / "config.json").read_text()
  assert '"max_seq_length": 32' in config

  # The workdir converts to a Hugging Face directory that transformers loads completely.
  hf_dir = tmp_path / "hf"
  out = warm_python.run([sys.executable, "-m", "bertjax.convert", "--to=hf", f"--src={workdir}",
                         f"--dst={hf_dir}"], env=_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  import transformers  # pylint: disable=import-outside-toplevel
  _, info = transformers.BertForPreTraining.from_pretrained(hf_dir, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  # ... and its tokenizer with AutoTokenizer, which gives the run's ids.
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
  ours = tokenization.load_tokenizer(str(workdir / "vocab.model"))
  text = "It is a truth universally acknowledged, that a single man must be in want of a wife."
  assert theirs(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id]


def test_kill_9_and_rerun_continue_bitwise_in_the_long_phase(corpus, tmp_path):
  """A run killed with SIGKILL in its second phase (48 tokens from step 5, in 4 rows a batch at
  a rate and weight decay of its own) and rerun ends with the parameters and losses of a run
  never stopped (dropout on): the data position in each checkpoint is exact, and so is the
  optimizer's count of its weight-decay schedule. (A clean stop and rerun:
  tests/test_multihost.py.)"""
  flags = ["--config.train.num_train_steps=100000", "--config.train.eval_every_steps=100000",
           "--config.data.long_seq_length=48", "--config.data.long_max_predictions_per_seq=7",
           "--config.train.long_seq_from_step=5", "--config.train.lr_schedule=wsd",
           "--config.train.long_batch_size=4", "--config.train.long_learning_rate=1e-3",
           "--config.train.long_weight_decay=0.001"]
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  out = _run(straight, _flags(corpus, *flags, "--config.train.stop_after_steps=16"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert ("after 5 steps (train.long_seq_from_step): sequences of 48 tokens "
          "(data.long_seq_length) from here, 4 rows a batch") in out.stdout
  rates = {r["step"]: r["learning_rate"] for r in _metrics(straight) if r["split"] == "train"}
  assert (rates[5], rates[6], rates[16]) == (pytest.approx(2e-3), pytest.approx(1e-3),
                                             pytest.approx(1e-3))
  process = warm_python.popen(_command(killed, _flags(corpus, *flags)), env=_env(), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and process.poll() is None:
    if (killed / "metrics.jsonl").exists() and len(_metrics(killed)) >= 12:
      break  # the save at step 10 waited for step 8's: 8 is committed
    time.sleep(0.05)
  process.kill()
  assert process.wait(timeout=60) == -signal.SIGKILL
  out = _run(killed, _flags(corpus, *flags, "--config.train.stop_after_steps=16"))
  assert out.returncode == 0, out.stderr[-3000:]
  resumed_from = int(re.search(r"resuming from step (\d+)", out.stdout + out.stderr).group(1))
  assert 8 <= resumed_from < 16
  jax.tree.map(np.testing.assert_array_equal, _saved_params(straight, 16)[0],
               _saved_params(killed, 16)[0])
  losses = {r["step"]: r["loss"] for r in _metrics(straight) if r["split"] == "train"}
  assert all(losses[r["step"]] == r["loss"] for r in _metrics(killed) if r["split"] == "train")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_saves_a_checkpoint_and_the_run_resumes(sig, corpus, tmp_path):
  """SIGTERM (a preemption) or SIGINT (Ctrl-C) in a single-process run: a checkpoint at the next
  step, exit 0, and the rerun resumes from it."""
  workdir = tmp_path / "run"
  flags = _flags(corpus, "--config.train.num_train_steps=100000",
                 "--config.train.checkpoint_every_steps=100000",
                 "--config.train.eval_every_steps=100000")
  process = warm_python.popen(_command(workdir, flags), env=_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  while time.time() < deadline and process.poll() is None:
    if (workdir / "metrics.jsonl").exists() and len(_metrics(workdir)) >= 3:
      break
    time.sleep(0.5)
  process.send_signal(sig)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  assert f"{sig.name}: saved a checkpoint" in stdout
  steps = [int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()]
  assert len(steps) == 1 and steps[0] >= 3
  saved = steps[0]
  out = _run(workdir, _flags(corpus, f"--config.train.num_train_steps={saved + 2}",
                             "--config.train.eval_every_steps=100000"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"resuming from step {saved}" in out.stdout + out.stderr
  records = [r for r in _metrics(workdir) if r["split"] == "train"]
  assert [r["step"] for r in records][-2:] == [saved + 1, saved + 2]


def test_init_checkpoint_takes_parameters_only(corpus, tmp_path):
  # The first model's vocabulary is unpadded (as a checkpoint from before padding); the second
  # pads it to a multiple of 128: its real rows are loaded, the padding rows are added.
  first, second = tmp_path / "first", tmp_path / "second"
  out = _run(first, _flags(corpus, "--config.train.num_train_steps=2",
                           "--config.model.pad_vocab_to_multiple=1"))
  assert out.returncode == 0, out.stderr[-3000:]
  out = _run(second, _flags(corpus, "--config.train.num_train_steps=2",
                            f"--config.init_checkpoint={first}"))
  assert out.returncode == 0, out.stderr[-3000:]
  params, _ = _saved_params(first)
  assert f"init_checkpoint: {len(jax.tree.leaves(params))} parameters from" in out.stdout
  assert ("vocabulary rows padded to this model's for bert/embeddings/word_embeddings/embedding, "
          "masked_lm/output_bias") in out.stdout
  # The step, optimizer state and schedule start afresh: the first step has learning rate 0.
  records = [r for r in _metrics(second) if r["split"] == "train"]
  assert [r["step"] for r in records] == [1, 2] and records[0]["learning_rate"] == 0.0


# ----------------------------------------------------------------------------------------------
# Bad input: one clear message, exit status 2, the workdir untouched.


def _assert_fails_cleanly(workdir, flags, *expected, num_devices=1, config="configs/tiny.py"):
  workdir.mkdir(exist_ok=True)
  (workdir / "notes.txt").write_text("the user's file\n")
  before = tree_digest(workdir)
  out = _run(workdir, flags, config=config, num_devices=num_devices)
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  message = [line for line in out.stderr.splitlines() if line.startswith("bertjax: error:")]
  assert len(message) == 1, out.stderr[-3000:]
  for text in expected:
    assert text in message[0], message[0]
  assert "Traceback" not in out.stderr
  assert tree_digest(workdir) == before
  return message[0]


def test_missing_corpus(corpus, tmp_path):
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, "--config.data.input_files=/no/such/*.txt"),
                        "/no/such/*.txt")


def test_empty_corpus(corpus, tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n  \n")
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, f"--config.data.input_files={empty}"),
                        "empty.txt")


def test_corpus_not_utf8(corpus, tmp_path):
  latin = tmp_path / "latin1.txt"
  latin.write_bytes("First line.\nSecond line, caf\u00e9.\n".encode("latin-1"))
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, f"--config.data.input_files={latin}"),
                        "latin1.txt", "UTF-8", "line 2")


def test_unknown_config_key(corpus, tmp_path):
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, "--config.train.batchsize=8"),
                        "train.batchsize")


def test_bad_config_value(corpus, tmp_path):
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, "--config.train.batch_size=eight"),
                        "eight")
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, "--config.data.masked_lm_prob=1.5"),
                        "masked_lm_prob=1.5")


def test_batch_not_divisible_by_devices(corpus, tmp_path):
  _assert_fails_cleanly(tmp_path / "w", _flags(corpus, "--config.train.batch_size=7"),
                        "train.batch_size=7", "2 devices", num_devices=2)


def test_checkpoint_of_another_model_shape(corpus, tmp_path):
  workdir = tmp_path / "w"
  out = _run(workdir, _flags(corpus, "--config.train.num_train_steps=2"))
  assert out.returncode == 0, out.stderr[-3000:]
  _assert_fails_cleanly(workdir, _flags(corpus, "--config.train.num_train_steps=4",
                                        "--config.model.size=mini"),
                        "does not match the model", "(128,) in the checkpoint", "--workdir")


def _prepare(args, timeout=300):
  return warm_python.run([sys.executable, "-m", "bertjax.data.prepare", *args], env=_env(),
                         cwd=ROOT, timeout=timeout)


def test_prepared_data_with_static_masks(corpus, tmp_path):
  """bertjax.data.prepare --static_masks=true stores masks; a run on --config.data.prepared
  trains on them with dynamic_masking=false, and asks for it otherwise."""
  text_file, vocab = corpus
  data = tmp_path / "data"
  out = _prepare([f"--input={text_file}", f"--vocab={vocab}", f"--output_dir={data}",
                  "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=1",
                  "--eval_fraction=0.1", "--static_masks=true"])
  assert out.returncode == 0, out.stderr[-3000:]
  flags = [f for f in _flags(corpus, "--config.train.num_train_steps=2")
           if not f.startswith("--config.data.input_files")] + [f"--config.data.prepared={data}"]
  _assert_fails_cleanly(tmp_path / "refused", flags, "static masks",
                        "--config.data.dynamic_masking=false")
  workdir = tmp_path / "run"
  out = _run(workdir, flags + ["--config.data.dynamic_masking=false"])
  assert out.returncode == 0, out.stderr[-3000:]
  assert [r["step"] for r in _metrics(workdir) if r["split"] == "train"] == [1, 2]
  assert "data" not in os.listdir(workdir)  # the prepared directory is used where it is


def test_prepared_data_that_cannot_serve_the_run(corpus, tmp_path):
  """Another vocabulary, a length not prepared, or no 512 phase: refused before any step."""
  text_file, vocab = corpus
  data = tmp_path / "data"
  out = _prepare([f"--input={text_file}", f"--output_dir={data}", "--vocab_size=500",
                  "--max_seq_length=32", "--dupe_factor=1", "--eval_fraction=0.1"])
  assert out.returncode == 0, out.stderr[-3000:]
  flags = [f for f in _flags(corpus) if not f.startswith("--config.data.input_files")] + [
      f"--config.data.prepared={data}"]
  _assert_fails_cleanly(tmp_path / "w1", flags, "another vocabulary", vocab)
  flags = [f for f in flags if not f.startswith("--config.data.vocab_model")]
  _assert_fails_cleanly(tmp_path / "w2", flags + ["--config.data.max_seq_length=64"],
                        "not the 64 of data.max_seq_length", "--max_seq_length=32,64")
  _assert_fails_cleanly(tmp_path / "w3", flags + ["--config.data.long_seq_length=128",
                                                  "--config.train.long_seq_from_step=3"],
                        "not the 128 of data.long_seq_length", "--max_seq_length=32,128")
  _assert_fails_cleanly(tmp_path / "w4", flags + ["--config.data.max_predictions_per_seq=40"],
                        "max_predictions_per_seq=40", "at most 32")


def test_large_config_is_the_papers_model():
  """configs/large.py builds BERT-large: 24 layers of 1024 with 16 heads, 335M parameters with
  the pretraining heads (shapes only; configs/base.py runs a step end to end below, and saving
  BERT-large's 4 GB of state would take this machine over a minute)."""
  from bertjax.configs import large  # pylint: disable=import-outside-toplevel
  config = pretraining_config.model_config(tasks.typed(large.get_config()), 30522)
  assert (config.num_layers, config.hidden_size, config.num_heads) == (24, 1024, 16)
  ids = jax.ShapeDtypeStruct((1, 8), np.int32)
  shapes = jax.eval_shape(lambda i: heads.BertForPreTraining(config).init(
      jax.random.PRNGKey(0), i, i, i, deterministic=True), ids)
  count = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))
  assert 334e6 < count < 337e6, count


@pytest.mark.parametrize("config", ["configs/base.py"])
def test_paper_configs_build_and_run_one_step(config, corpus, tmp_path):
  """BERT-base as configured, at batch 2 and sequence 32, for one step on the CPU (the text made
  into pairs once, not the config's 10 times: the model is what is tested). The saved
  parameters' shapes are read from the checkpoint's metadata (restoring its 0.9 GB of state
  would take seconds). With XLA's optimized code: BERT-base's init and step run slower quickly
  compiled than optimized code takes to compile (30 against 24 CPU seconds)."""
  text_file, vocab = corpus
  workdir = tmp_path / "run"
  out = _run(workdir, [f"--config.data.input_files={text_file}",
                       f"--config.data.vocab_model={vocab}", "--config.data.max_seq_length=32",
                       "--config.data.max_predictions_per_seq=5", "--config.data.dupe_factor=1",
                       "--config.train.batch_size=2", "--config.train.eval_batch_size=2",
                       "--config.train.num_train_steps=1", "--config.train.warmup_steps=0",
                       "--config.train.eval_steps=1", "--config.data.long_seq_length=0"],
             config=config, timeout=600, optimized=True)
  assert out.returncode == 0, out.stderr[-3000:]
  shapes = saved_params.saved_param_shapes(workdir / "checkpoints" / "1")  # the last step's
  encoder = {path.split("/")[2] for path in shapes if path.startswith("bert/encoder/")}
  layers = {"configs/base.py": 12, "configs/large.py": 24}[config]
  assert f"layer_{layers - 1}" in encoder
  assert f"layer_{layers}" not in encoder
  hidden = {"configs/base.py": 768, "configs/large.py": 1024}[config]
  assert shapes["bert/embeddings/word_embeddings/embedding"][1] == hidden
  assert [r["step"] for r in _metrics(workdir) if r["split"] == "train"] == [1]


# ----------------------------------------------------------------------------------------------
# In-process pieces of the task.


def test_check_config_names_the_field():
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.data.input_files = "a.txt"
  config.data.tfds_name = "wikipedia"
  with pytest.raises(UserError, match="data.input_files and data.tfds_name"):
    pretraining_config.check_config(tasks.typed(config))
  config = tiny.get_config()
  config.data.max_seq_length = 1024
  with pytest.raises(UserError, match="max_position_embeddings"):
    pretraining_config.check_config(tasks.typed(config))
  # Context extension: the long phase longer than the first, the switch within the run.
  config = tiny.get_config()
  config.data.update(max_seq_length=128, long_seq_length=128)
  config.train.update(num_train_steps=100, long_seq_from_step=90)
  with pytest.raises(UserError, match="data.long_seq_length=128 is not longer than "
                     "data.max_seq_length=128"):
    pretraining_config.check_config(tasks.typed(config))
  config.data.long_seq_length = 256
  for step in (0, 100, 150):
    config.train.long_seq_from_step = step
    with pytest.raises(UserError, match=f"within the run, from 1 to train.num_train_steps - 1 "
                       rf"\(99; the paper: 90% of the steps\); it is {step}"):
      pretraining_config.check_config(tasks.typed(config))
  config.train.long_seq_from_step = 99
  pretraining_config.check_config(tasks.typed(config))
  # The long phase's own rows, rate and decay need a long phase; each decay its rate.
  for data, train_fields, message in [
      (dict(long_seq_length=0), dict(long_batch_size=8),
       "train.long_batch_size=8 set the long phase, but data.long_seq_length=0"),
      (dict(), dict(long_batch_size=-8), "train.long_batch_size=-8; use 1 or more rows"),
      (dict(), dict(long_weight_decay=0.0), "train.long_weight_decay=0.0 goes with the long "
       "phase's own rate; set train.long_learning_rate too"),
      (dict(), dict(restart_weight_decay=0.0), "train.restart_weight_decay=0.0 goes with a "
       "restart"),
      (dict(eval_masked_lm_prob=0.15), dict(), r"data.eval_masked_lm_prob=0.15: a second "
       r"masking rate for the held-out MLM must lie in \(0, 1\) and differ from "
       "data.masked_lm_prob=0.15"),
      (dict(eval_masked_lm_prob=1.5), dict(), "data.eval_masked_lm_prob=1.5")]:
    bad = tiny.get_config()
    bad.data.update(dict(max_seq_length=128, long_seq_length=256), **data)
    bad.train.update(dict(num_train_steps=100, long_seq_from_step=90), **train_fields)
    with pytest.raises(UserError, match=message):
      pretraining_config.check_config(tasks.typed(bad))
  bad = tiny.get_config()
  bad.update(dict(pretraining=dict(objective="ltr", nsp=False),
                  data=dict(eval_masked_lm_prob=0.3)))
  with pytest.raises(UserError, match="pretraining.objective=ltr masks nothing"):
    pretraining_config.check_config(tasks.typed(bad))


def test_sequence_length_phases_and_their_position(corpus, tmp_path):
  """Batches switch from data.max_seq_length to data.long_seq_length at long_seq_from_step, and
  a position taken in either phase resumes the same batches."""
  text_file, vocab = corpus
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.data.update(input_files=text_file, vocab_model=vocab, max_seq_length=32,
                     max_predictions_per_seq=5, long_seq_length=64,
                     long_max_predictions_per_seq=10, dupe_factor=1)
  config.train.update(batch_size=4, long_seq_from_step=3)
  typed = tasks.typed(config)
  task = pretraining.make_task(typed, str(tmp_path), train.run_context(typed))
  assert os.listdir(tmp_path) == ["data"]  # the text, prepared
  served = list(zip(range(6), task.batches.train(None)))
  shapes = [(b["input_ids"].shape, b["masked_lm_positions"].shape) for _, (b, _) in served]
  assert shapes == [((4, 32), (4, 5))] * 3 + [((4, 64), (4, 10))] * 3
  assert [p["phase"] for _, (_, p) in served] == [0, 0, 0, 1, 1, 1]  # the phase of each batch
  assert [p["batches"] for _, (_, p) in served] == [1, 2, 3, 4, 5, 6]
  bad = copy.deepcopy(config)
  bad.train.update(long_batch_size=3, grad_accum_steps=2)
  bad = tasks.typed(bad)
  with pytest.raises(UserError, match="train.long_batch_size=3 must be a multiple of 2"):
    pretraining.make_task(bad, str(tmp_path), train.run_context(bad))
  for i in (1, 2, 4):  # resume after batch i (i = 2: right before the switch)
    position = served[i][1][1]
    resumed = [b for _, (b, _) in zip(range(5 - i), task.batches.train(position))]
    for (_, (expected, _)), batch in zip(served[i + 1:], resumed):
      for key in expected:
        np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
