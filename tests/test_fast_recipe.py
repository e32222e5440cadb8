"""The fast recipe's model options (configs/base.py:fast): MLM logits in bfloat16 (the loss equal
to float32 logits' within bfloat16 tolerance, the vocabulary matmuls bfloat16 both ways), fused
QKV (the same parameters and outputs, one matmul a layer), and how the configs set them. The
packed rows' prediction slots are tests/test_packing.py's."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import run_config
from bertjax.configs import base, large, tiny
from bertjax.modeldir import model_files, model_options
from bertjax.models import heads
from bertjax.models.config import BertConfig
from bertjax.tasks import pretraining

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Vocabulary 1000, padded to 1024: the only dimension of that size.
CONFIG = BertConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                    intermediate_size=128, max_position_embeddings=64, dropout_rate=0.0,
                    attention_dropout_rate=0.0)
VOCAB = CONFIG.padded_vocab_size
BATCH, SEQ, PREDICTIONS = 4, 32, 6


def _batch():
  rng = np.random.default_rng(0)
  positions = np.sort(np.stack([rng.choice(np.arange(1, SEQ), PREDICTIONS, replace=False)
                                for _ in range(BATCH)]), axis=1)
  return dict(input_ids=rng.integers(5, 1000, (BATCH, SEQ)).astype(np.int32),
              segment_ids=np.zeros((BATCH, SEQ), np.int32),
              input_mask=np.ones((BATCH, SEQ), np.int32),
              masked_lm_positions=positions.astype(np.int32),
              masked_lm_ids=rng.integers(5, 1000, (BATCH, PREDICTIONS)).astype(np.int32),
              masked_lm_weights=np.ones((BATCH, PREDICTIONS), np.float32),
              next_sentence_label=rng.integers(0, 2, BATCH).astype(np.int32),
              example_weight=np.ones(BATCH, np.float32))


def _loss_fn(config: BertConfig):
  """params -> the MLM loss (mean over the predictions) of BertForPreTraining(config)."""
  model = heads.BertForPreTraining(config)
  terms = pretraining.make_terms(5)
  batch = _batch()

  def loss(params):
    values, weights = terms(heads.apply_to_batch(model, params, batch, deterministic=True),
                            batch)["mlm_loss"]
    return jnp.sum(values * weights) / jnp.sum(weights)

  return loss


def _params(config: BertConfig):
  return heads.init_from_batch(heads.BertForPreTraining(config), jax.random.PRNGKey(0), _batch())


def _dots(fn, *args) -> list[tuple[str, str, str]]:
  """The dot_generals jax emits for fn(*args) (StableHLO, before XLA's passes): (lhs, rhs,
  result) tensor types, e.g. ('4x6x64xbf16', '1024x64xbf16', '4x6x1024xbf16')."""
  text = jax.jit(fn).lower(*args).as_text()
  return re.findall(r"stablehlo\.dot_general .*: \(tensor<([^>]*)>, tensor<([^>]*)>\) -> "
                    r"tensor<([^>]*)>", text)


def _vocab_dots(fn, *args) -> list[tuple[str, str, str]]:
  return [dot for dot in _dots(fn, *args) if any(f"{VOCAB}x" in t or f"x{VOCAB}x" in t
                                                  for t in dot)]


# ----------------------------------------------------------------------------------------------
# MLM logits in bfloat16.


def test_bfloat16_logits_give_the_float32_loss_and_gradient_within_bfloat16_tolerance():
  """Same weights, bfloat16 compute: the MLM loss with bfloat16 logits is the float32 logits'
  within bfloat16's rounding (2^-8 relative on each logit), but not bitwise (the option acts);
  so is the gradient."""
  f32 = dataclasses.replace(CONFIG, dtype="bfloat16")
  bf16 = dataclasses.replace(f32, mlm_logits_dtype="bfloat16")
  params = nn.unbox(_params(f32))
  loss32, grad32 = jax.value_and_grad(_loss_fn(f32))(params)
  loss16, grad16 = jax.value_and_grad(_loss_fn(bf16))(params)
  assert float(loss32) > 6.0  # about ln(1000) at init
  assert float(loss16) != float(loss32)
  assert abs(float(loss16) - float(loss32)) < 2e-3 * float(loss32)
  flat32, flat16 = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
                    for g in (grad32, grad16))
  assert np.linalg.norm(flat16 - flat32) < 2e-2 * np.linalg.norm(flat32)


def test_bfloat16_logits_make_the_vocabulary_matmuls_bfloat16_both_ways():
  """The forward projection writes bfloat16 logits, and the two matmuls of its gradient take
  bfloat16 operands; with float32 logits (the default) the gradient's matmuls take the float32
  cotangent, and logits leave the head as float32 in both."""
  f32 = dataclasses.replace(CONFIG, dtype="bfloat16")
  bf16 = dataclasses.replace(f32, mlm_logits_dtype="bfloat16")
  params = nn.unbox(_params(f32))
  model = heads.BertForPreTraining(bf16)
  logits, _ = heads.apply_to_batch(model, params, _batch(), deterministic=True)
  assert logits.dtype == jnp.float32
  for config, dtype in ((bf16, "bf16"), (f32, "f32")):
    forward = _vocab_dots(_loss_fn(config), params)
    assert forward == [("4x6x64xbf16", f"{VOCAB}x64xbf16", f"4x6x{VOCAB}x{dtype}")]
    backward = _vocab_dots(jax.grad(_loss_fn(config)), params)
    assert len(backward) == 3  # the forward one, then d(hidden) and d(table)
    assert all(f"{VOCAB}x{dtype}" in lhs + rhs for lhs, rhs, _ in backward[1:]), backward


# ----------------------------------------------------------------------------------------------
# Fused QKV.


def test_fused_qkv_has_the_same_parameters_and_outputs_in_one_matmul_a_layer():
  """The same parameter tree (paths, logical axes, initial values), the same logits and
  gradients (float32, to rounding), and two dot_generals fewer a layer: q, k and v are one."""
  fused = dataclasses.replace(CONFIG, fused_qkv=True)
  boxed, boxed_fused = _params(CONFIG), _params(fused)
  assert nn.get_partition_spec(boxed) == nn.get_partition_spec(boxed_fused)
  params = nn.unbox(boxed)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(nn.unbox(boxed_fused))):
    np.testing.assert_array_equal(a, b)
  outputs = [heads.apply_to_batch(heads.BertForPreTraining(c), params, _batch(),
                                  deterministic=True) for c in (CONFIG, fused)]
  for a, b in zip(*outputs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  grads = [jax.grad(_loss_fn(c))(params) for c in (CONFIG, fused)]
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  plain, one = (_dots(_loss_fn(c), params) for c in (CONFIG, fused))
  assert len(plain) - len(one) == 2 * CONFIG.num_layers
  assert sum(result == f"{BATCH}x{SEQ}x3x64xf32" for _, _, result in one) == CONFIG.num_layers


def _audit(tmp_path, *flags) -> dict:
  """`python -m bertjax.tools.audit`'s report of configs/tiny.py's train step in bfloat16 on 8
  simulated devices: {'collectives': {(kind, axes): bytes}, 'matmuls', 'memory'}."""
  out = tmp_path / f"audit{len(list(tmp_path.iterdir()))}.json"
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.audit", "--config=configs/tiny.py", "--devices=8",
       "--config.model.dtype=bfloat16", *flags, f"--json={out}"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  train = json.loads(out.read_text())["train"]
  collectives = {}
  for row in train["collectives"]:
    key = (row["kind"], tuple(row["axes"]))
    collectives[key] = collectives.get(key, 0) + row["nbytes"]
  return dict(collectives=collectives, matmuls=train["matmuls"], memory=train["memory"])


def test_fused_qkv_on_a_tensor_mesh_adds_no_collective_and_saves_two_all_reduces(tmp_path):
  """The kernels are stacked, not concatenated, so each device keeps its heads: the same
  collectives, but the backward pass reduces d(input) of q, k and v as one ([batch, seq, H]
  over `tensor`, not three), and 6 dot_generals fewer a layer (2 forward, 4 backward)."""
  plain = _audit(tmp_path, "--config.mesh.tensor=2")
  fused = _audit(tmp_path, "--config.mesh.tensor=2", "--config.model.fused_qkv=true")
  assert set(fused["collectives"]) == set(plain["collectives"])
  tensor = ("all-reduce", ("tensor",))
  assert fused["collectives"][tensor] < plain["collectives"][tensor]
  assert {k: v for k, v in fused["collectives"].items() if k != tensor} == {
      k: v for k, v in plain["collectives"].items() if k != tensor}
  assert sum(plain["matmuls"].values()) - sum(fused["matmuls"].values()) == 6 * 2  # 2 layers


def test_bfloat16_logits_in_the_compiled_step(tmp_path):
  """After XLA's passes too: the vocabulary projection and its gradient's two matmuls are
  bf16 x bf16 -> bf16, and the step plans fewer bytes of temporaries."""
  f32 = _audit(tmp_path)
  bf16 = _audit(tmp_path, "--config.model.mlm_logits_dtype=bfloat16")
  key = "bf16 x bf16 -> bf16"
  assert bf16["matmuls"][key] - f32["matmuls"][key] == 3
  assert sum(bf16["matmuls"].values()) == sum(f32["matmuls"].values())
  assert bf16["memory"]["temporaries"] < f32["memory"]["temporaries"]


# ----------------------------------------------------------------------------------------------
# The configs.


def test_the_fast_configs_set_the_options_and_the_paper_ones_do_not():
  for module in (base, large):
    paper, fast = module.get_config(), module.get_config("fast")
    assert paper.model.mlm_logits_dtype == "float32" and not paper.model.fused_qkv
    assert fast.model.mlm_logits_dtype == "auto"


@pytest.mark.parametrize("logits, platform, expected", [
    ("auto", "cpu", "float32"), ("auto", "gpu", "bfloat16"), ("bfloat16", "cpu", "bfloat16"),
    ("float32", "gpu", "float32")])
def test_mlm_logits_dtype_auto_is_the_compute_dtype(logits, platform, expected, monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: platform)
  model = run_config.PretrainingModel(dtype="auto", mlm_logits_dtype=logits, fused_qkv=True)
  overrides = model_options.pretraining_overrides(model)
  assert overrides["mlm_logits_dtype"] == expected and overrides["fused_qkv"] is True


def test_the_options_are_run_choices_not_written_to_bert_config_json():
  config = dataclasses.replace(CONFIG, mlm_logits_dtype="bfloat16", fused_qkv=True)
  fields = json.loads(model_files.bert_config_json(config))
  assert "mlm_logits_dtype" not in fields and "fused_qkv" not in fields
  assert tiny.get_config().model.mlm_logits_dtype == "float32"


@pytest.mark.parametrize("fields, message", [
    (dict(mlm_logits_dtype="float16"), "BertConfig.mlm_logits_dtype='float16'"),
    (dict(fused_qkv="yes"), "BertConfig.fused_qkv='yes'; it must be true or false")])
def test_bad_options_are_refused(fields, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    BertConfig(**fields)
