"""The feature-based approach (the paper, section 5.3, Table 7): bertjax.models.feature_based,
configs/ner.py:feature_based, and the frozen parameters of bertjax.training.optim.

Each layer combination feeds the BiLSTM the hidden states Table 7 names (checked on the values
the encoder computes, with ELMo's scalar mix against numpy); the encoder gets no gradient and no
dropout; the optimizer leaves frozen groups bitwise unchanged (their Adam moments stay zero). End to
end, the README's feature-based command (at the sizes of tests/test_ner.py) on the CoNLL-format
fixtures of tests/test_ner.py reaches the F1 the fine-tuned NER test asserts (> 0.9) with the
pretrained encoder bitwise unchanged.
"""
import dataclasses
import json
import os
import re
import shlex

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

import docs_text
import test_ner
from bertjax.modeldir import model_files
from bertjax.training import optim, train
from bertjax.modeldir import saved_params
from bertjax import run_config, tasks
from bertjax.errors import UserError
from bertjax.models import bert, bilstm, feature_based, heads
from bertjax.models.config import BertConfig
from bertjax.tasks import finetuning, ner
from test_bilstm import random_params
from test_ner import conll_dir  # noqa: F401  pylint: disable=unused-import  (the fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = BertConfig(vocab_size=40, hidden_size=8, num_layers=5, num_heads=2,
                  intermediate_size=16, max_position_embeddings=16, dropout_rate=0.5,
                  attention_dropout_rate=0.5)


def test_layer_indices_are_table_7s_rows():
  """Indices into the hidden states (0 = embeddings) of BERT-base's 12 layers."""
  expected = {"embeddings": (0,), "second_to_last": (11,), "last": (12,),
              "weighted_sum_last_four": (9, 10, 11, 12), "concat_last_four": (9, 10, 11, 12),
              "weighted_sum_all": tuple(range(1, 13))}
  assert {c: feature_based.layer_indices(c, 12) for c in feature_based.LAYER_COMBINATIONS} == (
      expected)
  with pytest.raises(ValueError, match="unknown layer combination 'sum_all'; use one of"):
    feature_based.layer_indices("sum_all", 12)
  with pytest.raises(ValueError, match="concat_last_four needs a model of at least 4 layers"):
    feature_based.layer_indices("concat_last_four", 2)


def _inputs():
  """ids and input_mask [2, 7]: one full row, one of 4 tokens."""
  ids = np.random.default_rng(0).integers(5, 40, size=(2, 7)).astype(np.int32)
  return ids, np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)


@pytest.mark.parametrize("combination", feature_based.LAYER_COMBINATIONS)
def test_each_combination_builds_with_the_shapes_it_should(combination):
  """Every parameter group's shapes and the logits' (from jax.eval_shape: nothing compiled)."""
  model = feature_based.BertForFeatureBasedTagging(TINY, 3, combination, bilstm_units=6)
  ids, mask = _inputs()
  params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, ids * 0, mask,
                                                      deterministic=True)["params"]))
  width = 4 * 8 if combination == "concat_last_four" else 8
  mixed = {"weighted_sum_last_four": 4, "weighted_sum_all": 5}.get(combination)
  assert sorted(params) == sorted(["bert", "bilstm", "token_tagging"]
                                  + (["scalar_mix"] if mixed else []))
  assert "pooler" not in params["bert"]
  if mixed:
    assert params["scalar_mix"]["weights"].shape == (mixed,)
    assert params["scalar_mix"]["scale"].shape == ()
  assert params["bilstm"]["layer_0"]["forward"]["ii"]["kernel"].shape == (width, 6)
  assert params["bilstm"]["layer_1"]["backward"]["ii"]["kernel"].shape == (12, 6)
  assert params["token_tagging"]["classifier"]["kernel"].shape == (12, 3)
  logits = jax.eval_shape(lambda p: model.apply({"params": p}, ids, ids * 0, mask,
                                               deterministic=True), params)
  assert logits.shape == (2, 7, 3)


def test_combinations_compute_the_papers_features():
  """`combine` on six given hidden states (embeddings, layers 1..5), against numpy: the one
  layer, the last four concatenated, and ELMo's scalar mix (eq. 1: gamma * sum_j softmax(w)_j
  h_j) with weights and scale away from their initial values."""
  rng = np.random.default_rng(0)
  hidden = [rng.normal(size=(2, 3, 4)).astype(np.float32) for _ in range(6)]
  weights, scale = np.array([0.3, -1.2, 0.8, 0.1, 2.0]), 1.7

  class Combine(nn.Module):
    combination: str

    @nn.compact
    def __call__(self, layers):
      return feature_based.combine(self.combination, layers)

  for combination in feature_based.LAYER_COMBINATIONS:
    layers = [hidden[i] for i in feature_based.layer_indices(combination, 5)]
    mix = {"scalar_mix": {"weights": weights[:len(layers)], "scale": scale}}
    out = Combine(combination).apply({"params": mix} if len(layers) > 1 else {}, layers)
    if combination == "concat_last_four":
      expected = np.concatenate(hidden[2:], axis=-1)
    elif combination in feature_based.WEIGHTED_SUMS:
      w = np.exp(weights[:len(layers)]) / np.exp(weights[:len(layers)]).sum()
      expected = scale * sum(wj * h for wj, h in zip(w, hidden[-len(layers):]))
    else:
      expected = hidden[{"embeddings": 0, "second_to_last": 4, "last": 5}[combination]]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6, err_msg=combination)


def _traced(model, params, ids, mask, **kwargs):
  """Traced inside jit: (logits, the input the BiLSTM is called with, the hidden states the
  encoder returns: embedding output, then each layer's)."""
  seen = {}

  def record(next_fun, args, kw, context):
    out = next_fun(*args, **kw)
    if context.method_name == "__call__" and isinstance(context.module, bilstm.BiLSTM):
      seen["features"] = args[0]
    if context.method_name == "__call__" and isinstance(context.module, bert.BertEncoder):
      seen["hidden"] = out.hidden_states
    return out

  with nn.intercept_methods(record):
    logits = model.apply({"params": params}, ids, ids * 0, mask, **kwargs)
  return logits, seen["features"], seen["hidden"]


def test_the_encoder_feeds_its_layers_without_gradient_or_dropout():
  """The model feeds the BiLSTM the scalar mix of its encoder's layers (1..2); with dropout 0.5
  in the config, those features are the same under a dropout rng as without dropout; the
  gradient of the loss (through dropout) is zero on every encoder parameter and not on the
  others."""
  two_layers = dataclasses.replace(TINY, num_layers=2)  # a smaller graph to compile
  model = feature_based.BertForFeatureBasedTagging(two_layers, 3, "weighted_sum_all",
                                                   bilstm_units=6)
  ids, mask = _inputs()
  params = random_params(model, ids, ids * 0, mask, deterministic=True, scale=0.2)

  def loss(params):
    out = model.apply({"params": params}, ids, ids * 0, mask, deterministic=False,
                      rngs={"dropout": jax.random.PRNGKey(0)})
    return optax.softmax_cross_entropy_with_integer_labels(out, ids % 3).mean()

  @jax.jit
  def run(params):
    _, reference, hidden = _traced(model, params, ids, mask, deterministic=True)
    dropped = _traced(model, params, ids, mask, deterministic=False,
                      rngs={"dropout": jax.random.PRNGKey(1)})[1]
    return reference, hidden, dropped, jax.grad(loss)(params)

  reference, hidden, dropped, grads = run(params)
  assert len(hidden) == 3
  w = np.exp(params["scalar_mix"]["weights"]) / np.exp(params["scalar_mix"]["weights"]).sum()
  expected = params["scalar_mix"]["scale"] * sum(wj * h for wj, h in zip(w, hidden[1:]))
  np.testing.assert_allclose(reference, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(dropped, reference)
  grads = traverse_util.flatten_dict(grads, sep="/")
  encoder = [g for path, g in grads.items() if path.startswith("bert/")]
  assert len(encoder) > 20 and not any(np.any(g) for g in encoder)
  for group in ("scalar_mix/", "bilstm/", "token_tagging/"):
    assert any(np.any(g) for path, g in grads.items() if path.startswith(group)), group


def test_frozen_groups_stay_bitwise_with_zero_moments():
  rng = np.random.default_rng(0)
  params = {"bert": {"dense": {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=3)}},
            "head": {"kernel": rng.normal(size=(3, 2)), "bias": rng.normal(size=2)}}
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  tx, _ = optim.make_optimizer(learning_rate=1e-2, num_train_steps=10, warmup_steps=0,
                               weight_decay=0.1, frozen=("bert",))
  @jax.jit
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state, new = jax.jit(tx.init)(params), params
  for _ in range(3):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    new, state = step(grads, state, new)
  for a, b in zip(jax.tree.leaves(params["bert"]), jax.tree.leaves(new["bert"])):
    np.testing.assert_array_equal(a, b)
  assert not any(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params["head"]),
                                                      jax.tree.leaves(new["head"])))
  # Adam's moments: zero for the encoder's 15 numbers, moving for the head's 8.
  moments = [x for x in jax.tree.leaves(state) if np.ndim(x) > 0]
  assert sorted(np.count_nonzero(x) for x in moments) == [0] * 4 + [2, 2, 6, 6]
  assert run_config.Train(frozen_params=" bert, bilstm ,").frozen == ("bert", "bilstm")
  tx, _ = optim.make_optimizer(num_train_steps=10, warmup_steps=0, frozen=("encoder",))
  with pytest.raises(UserError, match="train.frozen_params names encoder, which the model does "
                                      "not have; its parameter groups are bert, head"):
    tx.init(params)


# ---- feature-based NER end to end ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """A random small BERT of 4 layers (concat_last_four needs four) with test_ner's vocabulary,
  saved as a bertjax model directory."""
  directory = tmp_path_factory.mktemp("model4")
  vocab_file = directory / "vocab.txt"
  vocab_file.write_text("".join(t + "\n" for t in test_ner.VOCAB))
  config = BertConfig(vocab_size=len(test_ner.VOCAB), hidden_size=32, num_layers=4,
                      num_heads=2, intermediate_size=64, max_position_embeddings=64)
  ids = np.zeros((1, 4), np.int32)
  params = heads.BertForPreTraining(config).init(jax.random.PRNGKey(0), ids, ids, ids,
                                                 deterministic=True)["params"]
  out = str(directory / "bert")
  model_files.save_model_dir(out, jax.tree.map(np.asarray, nn.unbox(params)), config,
                             [str(vocab_file)])
  return out


def _config(model_dir, data_dir, arg="feature_based"):
  """configs/ner.py:feature_based at the sizes of tests/test_ner.py, BiLSTM of 64 units. A
  tagger trained from scratch needs more steps than fine-tuning (test_ner: 60 steps at 40 times
  fine-tuning's learning rate): 120 steps at 20 times the config's (measured: F1 0.99 at step
  100, 0.97 at 120 with these fixtures; 0 at step 60 with test_ner's 60 steps at 10 times)."""
  from bertjax.configs import ner as ner_config  # pylint: disable=import-outside-toplevel
  config = ner_config.get_config(arg)
  config.init_checkpoint = model_dir
  config.data.data_dir = str(data_dir)
  config.data.max_seq_length = 32
  config.model.feature_bilstm_units = 64
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=2e-2,
                      num_train_epochs=8.0, log_every_steps=1000,
                      eval_every_steps=10**6)  # evaluate at the end only
  return config


def _readme_config(model_dir, data_dir):
  """The config of the README's feature-based command (its --config file:ARG and every
  --config.KEY=VALUE, with CKPT and CONLL_DIR the fixtures'), then _config's test sizes."""
  text = re.sub(r"\\\n\s*", " ", docs_text.all_text())  # docs/finetuning.md
  [command] = [line for line in text.splitlines()
               if line.startswith("python -m bertjax.main --config=configs/ner.py:feature_based")]
  args = dict(arg.split("=", 1) for arg in shlex.split(command)[3:])
  values = {"CKPT": model_dir, "CONLL_DIR": str(data_dir)}
  config = _config(model_dir, data_dir, args.pop("--config").split(":")[1])
  from_readme = {}
  for key, value in args.items():
    if key.startswith("--config."):
      from_readme[key[len("--config."):]] = values.get(value, value)
  config.update_from_flattened_dict(from_readme)
  assert from_readme["init_checkpoint"] == model_dir and "model.feature_layers" in from_readme
  return config


def test_feature_based_ner_learns_with_the_encoder_unchanged(model_dir, conll_dir, tmp_path):
  workdir = tmp_path / "ner"
  config = _readme_config(model_dir, conll_dir)
  assert (config.model.feature_layers, config.train.frozen_params) == ("concat_last_four", "bert")
  result = tasks.run(config, str(workdir))
  assert result["f1"] > 0.9, result  # the threshold of test_ner's fine-tuning test
  assert json.loads((workdir / "eval_results.json").read_text())["f1"] == result["f1"]
  assert (workdir / ner.EVAL_PREDICTIONS_FILE).is_file()

  pretrained = traverse_util.flatten_dict(
      saved_params.load_params(model_dir, {"bert": _zeros_of(model_dir)})[0], sep="/")
  trained, report = saved_params.load_params(str(workdir), traverse_util.unflatten_dict(
      {p: jnp.zeros_like(x) for p, x in pretrained.items()}, sep="/"))
  trained = traverse_util.flatten_dict(trained, sep="/")
  assert sorted(report.missing) == sorted(p for p in pretrained if "/pooler/" in p)
  assert len(report.loaded) > 30
  for path in report.loaded:
    np.testing.assert_array_equal(trained[path], pretrained[path], err_msg=path)
  saved = saved_params.saved_param_shapes(str(workdir))
  assert {p.split("/")[0] for p in saved} == {"bert", "bilstm", "token_tagging"}
  assert saved["bilstm/layer_0/forward/ii/kernel"] == (4 * 32, 64)  # the last four, 4 H wide


def _zeros_of(model_dir):
  """Zeros shaped as the encoder ('bert') saved in model_dir."""
  shapes = {p[len("bert/"):]: s for p, s in saved_params.saved_param_shapes(model_dir).items()
            if p.startswith("bert/")}
  return traverse_util.unflatten_dict({p: jnp.zeros(s) for p, s in shapes.items()}, sep="/")


def test_feature_based_refusals(model_dir, conll_dir, tmp_path):
  cases = [
      (dict(feature_layers="sum_all"), "model.feature_layers='sum_all'; use one of embeddings,"),
      (dict(feature_bilstm_units=0), "model.feature_bilstm_units=0; give the BiLSTM's units"),
      (dict(frozen_params=""), "lets the optimizer change the encoder.*frozen_params=bert"),
      (dict(bilstm_on_top=True), "has its own two-layer BiLSTM; set --config.model.bilstm_on_top"),
  ]
  for change, message in cases:
    config = _config(model_dir, conll_dir)
    for name, value in change.items():
      (config.train if name == "frozen_params" else config.model)[name] = value
    config = tasks.typed(config)
    with pytest.raises(UserError, match=message):
      finetuning.make_task(ner.SPEC, config, str(tmp_path / "a"), train.run_context(config))
  assert not (tmp_path / "a").exists()
  two_layers = finetuning.Data(train={}, eval={}, num_labels=3, context=ner.Context(
      {}, ["O", "B-PER", "I-PER"], "concat_last_four", 64))
  with pytest.raises(UserError, match="concat_last_four needs a model of at least 4 layers; this "
                                      "one has 2. Choose another combination"):
    ner.model(BertConfig(num_layers=2), two_layers)
  with pytest.raises(UserError, match="configs/ner.py takes feature_based"):
    _config(model_dir, conll_dir, arg="features")


def test_feature_based_config_changes_three_fields():
  from bertjax.configs import ner as ner_config  # pylint: disable=import-outside-toplevel
  base, variant = ner_config.get_config().to_dict(), ner_config.get_config("feature_based")
  assert variant.model.feature_layers == "concat_last_four"
  assert variant.train.frozen_params == "bert" and variant.train.learning_rate == 1e-3
  variant.model.feature_layers, variant.train.frozen_params = "", ""
  variant.train.learning_rate = base["train"]["learning_rate"]
  assert variant.to_dict() == base
