"""ModernBERT pretraining (configs/modernbert.py): the masked LM alone on contiguous spans with
30% masking, StableAdamW and the warmup-stable-decay schedule, through the command line; the
context extension (a long phase with its own global rotary base, evaluated at its length, and
the model files of the model the run ends with); the config's refusals."""
import json
import os
import shlex
import sys
from unittest import mock

import jax
import numpy as np
import pytest

from bertjax import tasks
from bertjax.configs import modernbert as modernbert_configs
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import pretraining, pretraining_config
from bertjax.training import steps
from bertjax.training import task as task_lib
from bertjax.training import train

from test_pretraining import _metrics
from test_readme import ROOT, _section_commands, text_dir  # noqa: F401  (the fixture)

import warm_python

def _config(corpus, **data):
  text_file, vocab = corpus
  config = modernbert_configs.get_config()
  config.data.update(input_files=text_file, vocab_model=vocab, max_seq_length=32,
                     max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.1, **data)
  config.model.local_attention = 8
  config.train.update(batch_size=4, eval_batch_size=8)
  return config


def test_context_extension_runs_the_long_phase_with_its_own_global_base(corpus, tmp_path):
  config = _config(corpus, long_seq_length=64, long_max_predictions_per_seq=20)
  config.model.update(rope_theta_global=10_000.0, long_rope_theta_global=160_000.0)
  config.train.update(long_seq_from_step=2, long_batch_size=2)
  config = tasks.typed(config)
  task = pretraining.make_task(config, str(tmp_path), train.run_context(config))
  assert task.model.config.rope_theta_global == 10_000.0
  served = [b for _, (b, _) in zip(range(3), task.batches.train(None))]
  assert [b["input_ids"].shape for b in served] == [(4, 32), (4, 32), (2, 64)]  # its own rows
  assert task.model_for(served[0]) is task.model
  long_model = task.model_for(served[2])
  assert long_model.config.rope_theta_global == 160_000.0
  assert long_model.config == task.model.config.__class__(
      **{**vars(task.model.config), "rope_theta_global": 160_000.0})
  # evaluations before the switch read the first phase's length, after it the long one; each
  # batch holds its 8 held-out rows twice: masked at 30% (training's), then at 15%
  for step, length in ((2, 32), (3, 64)):
    held_out = next(iter(task.batches.eval_at(step)()))
    assert held_out["input_ids"].shape == (16, length)
    np.testing.assert_array_equal(held_out["eval_masking"], [0] * 8 + [1] * 8)
    masked = held_out["masked_lm_weights"].sum(axis=1)
    assert masked[:8].sum() > 1.5 * masked[8:].sum() > 0
  # the terms score each half apart: right at 30%, wrong at 15% (one-hot logits)
  ids = held_out["masked_lm_ids"]
  hot = (ids + held_out["eval_masking"][:, None]) % 8  # the label, or the next id at 15%
  logits = np.where(np.arange(8) == hot[..., None], 10.0, 0.0).astype(np.float32)
  held_out = {**held_out, "masked_lm_ids": ids % 8}
  means = task_lib.means(task_lib.averages(task.terms((logits, None), held_out)))
  assert means["mlm_accuracy"] == 1.0 and means["mlm_accuracy_at_15pct"] == 0.0
  assert means["mlm_loss"] < means["mlm_loss_at_15pct"] and "mlm_loss_at_15pct" in means
  assert json.loads(task.files["bert_config.json"])["rope_theta_global"] == 160_000.0

  # the long model is the same parameters with another rotation: other logits (a guard)
  params = heads.init_from_batch(task.model, jax.random.key(0), served[2])
  short_logits, _ = heads.apply_to_batch(task.model, params, served[2], deterministic=True)
  long_logits, _ = heads.apply_to_batch(long_model, params, served[2], deterministic=True)
  real = np.asarray(short_logits) > -1e30  # the vocabulary, not its padding
  assert np.abs(np.asarray(short_logits - long_logits))[real].max() > 1e-5  # float32 noise: 1e-7


@pytest.mark.parametrize("changes, message", [
    (dict(pretraining=dict(nsp=True)), "pretrains the masked LM alone"),
    (dict(model=dict(long_rope_theta_global=160_000.0)), "data.long_seq_length=0"),
    (dict(model=dict(architecture="bert", size="tiny", long_rope_theta_global=1e5)),
     "set it to 0 for architecture=bert"),
    (dict(model=dict(local_attention=7)), "must be even"),
])
def test_refusals(changes, message):
  config = modernbert_configs.get_config()
  for section, values in changes.items():
    config[section].update(values)
  with pytest.raises(UserError, match=message):
    pretraining_config.check_config(tasks.typed(config))


def test_paper_recipes_build():
  for size, layers in (("base", 22), ("large", 28)):
    config = tasks.typed(modernbert_configs.get_config(size))
    pretraining_config.check_config(config)
    model = pretraining_config.model_config(config, 50368)
    assert (model.num_layers, model.local_attention, model.rope_theta_global) == (
        layers, 128, 10_000.0)
    assert pretraining_config.long_phase_config(config, model).rope_theta_global == 160_000.0
    assert config.data.masked_lm_prob == 0.3 and config.train.lr_schedule == "wsd"
  with pytest.raises(UserError, match="takes no argument, base or large"):
    modernbert_configs.get_config("huge")


# The ModernBERT repository's yamls/modernbert/*.yaml (commit 00220af) and the paper's large
# restart, per size: (rows at 1,024, warmup tokens, lr, wd, (restart tokens, lr, wd) or None,
# long-phase rows at 8,192, its lr, its wd).
YAMLS = {"base": (4608, 3e9, 8e-4, 1e-5, None, 576, 3e-4, 1e-5),
         "large": (4928, 2e9, 5e-4, 1e-5, (900e9, 5e-5, 1e-6), 616, 5e-5, 1e-6)}


@pytest.mark.parametrize("size", ["base", "large"])
def test_paper_recipes_are_the_authors_yamls(size):
  """configs/modernbert.py:base and :large give, step by step, the yamls' schedule in tokens:
  warmup, 1.719T tokens at 1,024, 250B at 8,192 at the extension's constant rate, then 50B
  decaying 1-sqrt to 0.001 of it (alpha_f); large's restart after 900B tokens; each plateau's
  weight decay a step at its rate (decoupled); held-out MLM also scored at 15%."""
  rows, warmup, lr, wd, restart, long_rows, long_lr, long_wd = YAMLS[size]
  config = tasks.typed(modernbert_configs.get_config(size))
  tr, data = config.train, config.data
  short, long = rows * 1024, long_rows * 8192  # tokens a step
  assert (tr.batch_size, tr.long_batch_size, data.max_seq_length, data.long_seq_length) == (
      rows, long_rows, 1024, 8192)
  assert abs(tr.warmup_steps * short - warmup) <= short / 2
  assert abs(tr.long_seq_from_step * short - 1.719e12) <= short / 2
  assert abs((tr.num_train_steps - tr.decay_steps - tr.long_seq_from_step) * long - 250e9) <= long
  assert abs(tr.decay_steps * long - 50e9) <= long / 2
  assert (data.masked_lm_prob, data.eval_masked_lm_prob, tr.decouple_lr) == (0.3, 0.15, True)
  _, schedule = steps.make_optimizer(tr)
  rate = lambda step: float(schedule(step))  # noqa: E731
  assert rate(tr.warmup_steps) == pytest.approx(lr)
  if restart:
    restart_step = round(restart[0] / short)
    assert rate(restart_step - 1) == pytest.approx(lr)
    assert (rate(restart_step), tr.restart_weight_decay) == (pytest.approx(restart[1]), restart[2])
  assert rate(tr.long_seq_from_step) == pytest.approx(long_lr)
  assert rate(tr.num_train_steps - tr.decay_steps) == pytest.approx(long_lr)
  assert rate(tr.num_train_steps) == pytest.approx(0.001 * long_lr)
  assert (tr.weight_decay, tr.long_weight_decay) == (wd, long_wd)
  assert steps.rate_changes(tr)[-1] == (tr.long_seq_from_step, long_lr, long_wd, mock.ANY)


def test_readme_modernbert_commands_run_as_written(text_dir):
  """docs/modernbert.md's "ModernBERT" commands, as written, in a directory holding
  bertjax/data/corpus/austen.txt (a slice of the bundled corpus: tests/test_readme.py): the
  demo config pretrains the masked LM alone (no NSP term), its rate warms up, holds and decays
  to 0 with 1-sqrt (wsd), the context extension evaluates at each phase's length and saves the
  base it ends with; then the conversion to a Hugging Face ModernBERT that transformers loads
  with no weight missing."""
  commands = _section_commands("ModernBERT")
  assert len(commands) == 2, commands
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  for command in commands:
    out = warm_python.run([sys.executable, *shlex.split(command)[1:]], cwd=text_dir, env=env,
                          timeout=600)
    assert out.returncode == 0, (command, out.stderr[-3000:])
  with open(text_dir / "run_modernbert" / "bert_config.json") as f:
    saved = json.load(f)
  assert (saved["architecture"], saved["rope_theta_global"]) == ("modernbert", 160_000.0)
  rows = _metrics(str(text_dir / "run_modernbert"))
  evals = [r for r in rows if "mlm_perplexity" in r]
  assert len(evals) == 2  # step 10 at 64 tokens, step 20 at 256
  assert not any("nsp" in key for r in rows for key in r)
  rates = [r["learning_rate"] for r in rows if "learning_rate" in r]
  peak = 2e-3  # warmup 2 steps, stable to step 16, 1-sqrt decay over the last 4
  np.testing.assert_allclose(rates, [0, peak / 2] + [peak] * 14 + [
      peak * (1 - np.sqrt(p)) for p in (0, 1 / 4, 2 / 4, 3 / 4)], rtol=1e-5)
  import transformers  # pylint: disable=import-outside-toplevel
  model, info = transformers.ModernBertForMaskedLM.from_pretrained(
      text_dir / "run_modernbert_hf", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert model.config.rope_parameters["full_attention"]["rope_theta"] == 160_000.0
