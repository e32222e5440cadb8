"""ModernBERT pretraining (configs/modernbert.py): the masked LM alone on contiguous spans with
30% masking, StableAdamW and the warmup-stable-decay schedule, through the command line; the
context extension (a long phase with its own global rotary base, evaluated at its length, and
the model files of the model the run ends with); the config's refusals."""
import json
import os
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax import tasks
from bertjax.configs import modernbert as modernbert_configs
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import pretraining, pretraining_config
from bertjax.training import train

from test_pretraining import _metrics
from test_readme import ROOT, _section_commands, text_dir  # noqa: F401  (the fixture)

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
  config.train.long_seq_from_step = 2
  config = tasks.typed(config)
  task = pretraining.make_task(config, str(tmp_path), train.run_context(config))
  assert task.model.config.rope_theta_global == 10_000.0
  served = [b for _, (b, _) in zip(range(3), task.batches.train(None))]
  assert [b["input_ids"].shape[1] for b in served] == [32, 32, 64]
  assert task.model_for(served[0]) is task.model
  long_model = task.model_for(served[2])
  assert long_model.config.rope_theta_global == 160_000.0
  assert long_model.config == task.model.config.__class__(
      **{**vars(task.model.config), "rope_theta_global": 160_000.0})
  # evaluations before the switch read the first phase's length, after it the long one
  assert next(iter(task.batches.eval_at(2)()))["input_ids"].shape[1] == 32
  assert next(iter(task.batches.eval_at(3)()))["input_ids"].shape[1] == 64
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
    out = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=text_dir, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
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
