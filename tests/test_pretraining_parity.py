"""Pretraining, step for step, against transformers and torch (bertjax.tools.torch_pretraining).

From the same initial weights, on the same batches (bertjax's own pretraining batches, masks
included) and with the same recipe, dropout off: bertjax's jitted train step and transformers'
model stepped by torch's AdamW (BERT: BertForPreTraining, MLM + NSP, linear warmup and decay,
clipping) or by optimi's StableAdamW (ModernBERT: ModernBertForMaskedLM, warmup-stable-decay
with a 1-sqrt decay, no clipping) give the same losses at every one of 300 steps and the same
parameters at the end, within float32 drift.
"""
import jax
import numpy as np
import pytest
import torch

from bertjax import tasks
from bertjax.convert import hf
from bertjax.tasks import pretraining
from bertjax.tools import torch_pretraining
from bertjax.training import parallel, steps, train

STEPS = 300


def _config(corpus, modern: bool):
  text_file, vocab = corpus
  if modern:
    from bertjax.configs import modernbert  # pylint: disable=import-outside-toplevel
    config = modernbert.get_config()
    config.model.local_attention = 16
    config.data.max_predictions_per_seq = 10
    config.train.update(lr_schedule="wsd", decay_steps=100, learning_rate=1e-3)
  else:
    from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
    config = tiny.get_config()
    config.data.max_predictions_per_seq = 5
    config.train.learning_rate = 1e-3
  config.model.pad_vocab_to_multiple = 1
  config.data.update(input_files=text_file, vocab_model=vocab, max_seq_length=32, dupe_factor=1)
  config.train.update(batch_size=8, num_train_steps=STEPS, warmup_steps=30)
  return config


def _run_both(config, workdir):
  """(bertjax's losses [STEPS, terms], torch's, bertjax's final params, torch's as bertjax
  params, the names of the terms)."""
  config = tasks.typed(config)
  context = train.run_context(config)
  task = pretraining.make_task(config, workdir, context)
  nsp = config.pretraining.nsp
  batches = [b for _, (b, _) in zip(range(STEPS), task.batches.train(None))]
  setup = steps.build(config, task, batches[0], context.mesh)
  state = setup.init_state()
  model = torch_pretraining.hf_model(task.model.config, jax.device_get(state["params"]), nsp)
  optimizer, scheduler = torch_pretraining.make_optimizer(model, config.train)
  names = ["mlm_loss", "nsp_loss"] if nsp else ["mlm_loss"]
  ours, theirs = [], []
  for step, batch in enumerate(batches):
    state, metrics = setup.train_step(state, parallel.global_batch(batch, setup.mesh),
                                      setup.learning_rate(step))
    computed = metrics.compute()
    ours.append([float(computed[n]) for n in names])
    terms = torch_pretraining.train_step(model, optimizer, scheduler,
                                         torch_pretraining.torch_batch(batch, nsp),
                                         config.train.clip_norm)
    theirs.append([terms[n] for n in names])
  tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  reference, _ = hf.from_hf(tensors, task.model.config)
  return (np.array(ours), np.array(theirs), jax.device_get(state["params"]), reference, names)


def _assert_same_run(ours, theirs, params, reference, loss_tol, param_tol):
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=loss_tol)
  assert ours[-1, 0] < ours[0, 0] - 1.0  # it learned: the MLM loss fell
  flat_ours = dict(jax.tree_util.tree_leaves_with_path(params))
  flat_ref = dict(jax.tree_util.tree_leaves_with_path(reference))
  assert flat_ours.keys() == flat_ref.keys()
  worst = max(float(np.max(np.abs(np.asarray(flat_ours[k]) - flat_ref[k]))) for k in flat_ours)
  print("max parameter diff", worst)
  assert worst < param_tol


@pytest.mark.parametrize("modern", [False, True], ids=["bert", "modernbert"])
def test_pretraining_follows_transformers_step_for_step(modern, corpus, tmp_path):
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # the xdist worker's core; torch's default would take both
  try:
    ours, theirs, params, reference, names = _run_both(_config(corpus, modern), str(tmp_path))
  finally:
    torch.set_num_threads(threads)
  diff = np.abs(ours - theirs)
  print(names, "max loss diff", diff.max(axis=0), "at steps", diff.argmax(axis=0))
  _assert_same_run(ours, theirs, params, reference, loss_tol=1e-4, param_tol=2e-4)
