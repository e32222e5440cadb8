"""The BiLSTM over BERT's hidden states (bertjax.models.bilstm) and `model.bilstm_on_top`.

The BiLSTM is checked against an LSTM written here in numpy from the textbook equations (not
flax's code), per row within its length, the backward direction from the row's last real token;
outputs at real tokens do not depend on padding. `--config.model.bilstm_on_top=true` then trains
every fine-tuning head kind (GLUE, NER, SQuAD, SWAG) on synthetic files in each task's official
format, with the pretrained encoder loaded unchanged under bert/ and the BiLSTM fresh under
bilstm/; packing, and exporting such a model to Hugging Face, are refused.
"""
import csv
import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import squad_helpers
import test_ner
import test_swag
from bertjax.modeldir import model_files
from bertjax.training import parallel, steps, train
from bertjax.modeldir import saved_params
from bertjax.convert import hf
from bertjax.errors import UserError
from bertjax.models import bert, bilstm, heads
from bertjax.models.config import BertConfig
from bertjax import tasks
from bertjax.tasks import FINETUNING, finetuning


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def numpy_lstm(cell, x, length, reverse):
  """One direction of an LSTM over x[:length] ([seq, D] float64), from the equations:
  i, f, o = sigmoid(x W_i* + h W_h* + b_h*), g = tanh(...), c = f c + i g, h = o tanh(c); the
  backward direction reads x[length-1] first. Returns [seq, U] with zeros after length."""
  units = cell["hi"]["kernel"].shape[0]
  h, c = np.zeros(units), np.zeros(units)
  out = np.zeros((len(x), units))
  for t in (range(length - 1, -1, -1) if reverse else range(length)):
    gate = {g: x[t] @ cell[f"i{g}"]["kernel"] + h @ cell[f"h{g}"]["kernel"] + cell[f"h{g}"]["bias"]
            for g in "ifgo"}
    c = _sigmoid(gate["f"]) * c + _sigmoid(gate["i"]) * np.tanh(gate["g"])
    h = _sigmoid(gate["o"]) * np.tanh(c)
    out[t] = h
  return out


def random_params(model, *args, scale=0.3, seed=0, **kwargs):
  """Parameters of `model` for these call arguments, drawn from a normal of stddev `scale`
  (biases too), float32. Their shapes come from jax.eval_shape of model.init, which compiles
  nothing: the tests need any values, not the initialisers' (whose compiling costs seconds)."""
  rng = np.random.default_rng(seed)
  shapes = nn.unbox(jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), *args, **kwargs)["params"]))
  return jax.tree.map(lambda s: (scale * rng.normal(size=s.shape)).astype(np.float32), shapes)


def test_bilstm_matches_a_numpy_lstm_within_each_rows_length():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 6, 5))  # [batch, seq, D]
  lengths = np.array([6, 4, 1])
  mask = (np.arange(6)[None] < lengths[:, None]).astype(np.int32)
  x[mask == 0] = 7.0  # padding values that would show if they were read
  model = bilstm.BiLSTM(units=4, num_layers=2)
  params = random_params(model, x, mask, scale=0.5)
  with jax.default_matmul_precision("float32"):
    out = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(x, jnp.float32), mask))
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
  assert out.shape == (3, 6, 8)
  for row in range(3):
    layer_input = x[row]
    for layer in ("layer_0", "layer_1"):
      cells = params[layer]
      layer_input = np.concatenate(
          [numpy_lstm(cells["forward"], layer_input, lengths[row], reverse=False),
           numpy_lstm(cells["backward"], layer_input, lengths[row], reverse=True)], axis=-1)
    np.testing.assert_allclose(out[row], layer_input, rtol=1e-4, atol=1e-5)
  assert not out[mask == 0].any()  # zero at padding


class _OnTop(nn.Module):
  """The encoder and `bilstm.on_top`, as the heads call them (their parameter names)."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask):
    out = bert.BertEncoder(self.config, use_pooler=False, name="bert")(
        input_ids, input_ids * 0, input_mask, deterministic=True)
    return bilstm.on_top(self.config, out, input_mask)


def test_outputs_at_real_tokens_do_not_depend_on_padding():
  """A 5-token row alone, then padded to 9 with other tokens behind it: the same BiLSTM outputs
  at its 5 tokens and the same pooled output (its forward state at token 4, its backward
  state at token 0), through `on_top` over a real encoder."""
  config = BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                      intermediate_size=32, max_position_embeddings=16)
  model = heads.BertForTokenClassification(config, 3, bilstm_on_top=True)
  ids = np.array([[2, 7, 8, 9, 3]], np.int32)
  padded = np.array([[2, 7, 8, 9, 3, 11, 12, 13, 14]], np.int32)
  padded_mask = np.array([[1] * 5 + [0] * 4], np.int32)
  params = random_params(model, ids, ids * 0, np.ones_like(ids), deterministic=True)
  encoder = {"params": {name: params[name] for name in ("bert", "bilstm")}}
  on_top = jax.jit(_OnTop(config).apply)
  alone, padded_out = on_top(encoder, ids, np.ones_like(ids)), on_top(encoder, padded, padded_mask)
  np.testing.assert_allclose(padded_out.sequence_output[:, :5], alone.sequence_output,
                             rtol=1e-5, atol=1e-6)
  assert not np.asarray(padded_out.sequence_output[:, 5:]).any()
  np.testing.assert_allclose(padded_out.pooled_output, alone.pooled_output, rtol=1e-5, atol=1e-6)
  seq = np.asarray(alone.sequence_output[0])
  np.testing.assert_array_equal(alone.pooled_output[0], np.concatenate([seq[4, :8], seq[0, 8:]]))
  # The head's logits at real tokens, too.
  apply = jax.jit(lambda i, m: model.apply({"params": params}, i, i * 0, m, deterministic=True))
  logits = [apply(i, m) for i, m in ((ids, np.ones_like(ids)), (padded, padded_mask))]
  np.testing.assert_allclose(logits[1][:, :5], logits[0], rtol=1e-5, atol=1e-6)


# ---- bilstm_on_top on every head kind -----------------------------------------------------------

SST_WORDS = ["good", "bad"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, random_bert):
  """A random small BERT whose vocabulary covers the four tasks' synthetic files."""
  vocab = list(dict.fromkeys(test_ner.VOCAB + squad_helpers.VOCAB + test_swag.VOCAB + SST_WORDS))
  return random_bert(tmp_path_factory.mktemp("model"), vocab)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """SST-2 (GLUE), CoNLL (NER), SQuAD v1.1 and SWAG files whose labels follow from the words."""
  directory = tmp_path_factory.mktemp("data")
  rng = np.random.default_rng(0)
  os.makedirs(directory / "SST-2")
  for split, n in (("train", 256), ("dev", 32)):
    with open(directory / "SST-2" / f"{split}.tsv", "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f, delimiter="\t", lineterminator="\n")
      writer.writerow(["sentence", "label"])
      for _ in range(n):
        words = [str(w) for w in rng.choice(test_ner.FILLER, size=rng.integers(3, 8))]
        label = int(rng.integers(2))
        words.insert(int(rng.integers(len(words) + 1)), SST_WORDS[label])
        writer.writerow([" ".join(words), 1 - label])
  # pylint: disable=protected-access  (the other tests' file writers)
  os.makedirs(directory / "conll")
  for name, n in (("train.txt", 256), ("valid.txt", 32)):
    test_ner._write_conll(directory / "conll" / name,
                          [test_ner._sentence(rng, 5) for _ in range(n)])
  for name, n in (("train", 256), ("dev", 32)):
    squad_helpers._write_squad(directory / f"{name}.json", rng, n, 0.0)
    test_swag._write_csv(directory / f"{name}.csv", test_swag.HEADER,
                         test_swag._questions(rng, n))
  return directory


def _config(kind, model_dir, data_dir):
  """The task's config with bilstm_on_top, at the tests' small sizes."""
  from bertjax.configs import glue, ner, squad, swag  # pylint: disable=import-outside-toplevel
  config = {"glue": glue, "ner": ner, "squad": squad, "swag": swag}[kind].get_config()
  config.init_checkpoint = model_dir
  files = {"glue": dict(glue_dir=str(data_dir), max_seq_length=32),
           "ner": dict(data_dir=str(data_dir / "conll"), max_seq_length=32),
           "squad": dict(train_file=str(data_dir / "train.json"), max_seq_length=48,
                         predict_file=str(data_dir / "dev.json"), doc_stride=16,
                         max_query_length=8),
           "swag": dict(train_file=str(data_dir / "train.csv"),
                        eval_file=str(data_dir / "dev.csv"), max_seq_length=24)}[kind]
  config.data.update(files)
  config.task = "sst2" if kind == "glue" else config.task
  config.model.bilstm_on_top = True
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.train.update(batch_size=16, eval_batch_size=32, learning_rate=2e-3,
                      num_train_steps=100, warmup_steps=0)
  return config


HEAD_KINDS = {"glue": "sequence_classification", "ner": "token_tagging", "squad": "span",
              "swag": "multiple_choice"}


@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_bilstm_on_top_trains_every_head_kind(kind, model_dir, data_dir, tmp_path):
  """The pretrained encoder loads into bert/ as saved, the BiLSTM (H/2 units a direction) is
  fresh under bilstm/, no pooler, and 12 steps on one batch lower its loss by a fifth or more."""
  config = tasks.typed(_config(kind, model_dir, data_dir))
  context = train.run_context(config)
  task = finetuning.make_task(FINETUNING[config.task], config, str(tmp_path), context)
  assert task.model.bilstm_on_top
  first = next(task.batches.train(None))[0]
  setup = steps.build(config, task, first, context.mesh)
  batch = parallel.global_batch(first, setup.mesh)
  fresh = random_params(task.model, *(first[k] for k in task.model.batch_keys),
                        deterministic=True, scale=0.1)
  params, report = saved_params.load_params(model_dir, fresh,
                                          vocab_size=task.model.config.vocab_size)
  assert sorted(params) == ["bert", "bilstm", HEAD_KINDS[kind]]
  assert "pooler" not in params["bert"]
  assert all(p.startswith("bert/") for p in report.loaded)
  # every encoder parameter as saved; the BiLSTM and the head fresh
  assert sorted({p.split("/")[0] for p in report.missing}) == ["bilstm", HEAD_KINDS[kind]]
  kernel = params["bilstm"]["layer_0"]["forward"]["ii"]["kernel"]
  assert kernel.shape == (64, 32)  # [H, H/2]
  state = dict(step=jnp.zeros((), jnp.int32), params=params, rng=jax.random.PRNGKey(0),
               opt_state=steps.make_optimizer(config.train, schedule=task.schedule)[0].init(params))
  # placed as the trainer places it (unplaced arrays would compile the step a second time)
  state = jax.device_put(state, jax.tree.map(lambda a: a.sharding, setup.abstract_state))
  losses = []
  for step in range(12):
    state, metrics = setup.train_step(state, batch, setup.learning_rate(step))
    losses.append(float(metrics.loss.compute()))
  assert losses[-1] < 0.8 * losses[0], losses  # measured: 0.35 (glue) to 0.75 (squad)
  assert not np.array_equal(state["params"]["bilstm"]["layer_0"]["forward"]["ii"]["kernel"],
                            kernel)


def test_bilstm_on_top_refuses_packing_and_hf_export(model_dir, data_dir, tmp_path):
  config = _config("glue", model_dir, data_dir)
  config.data.packing = "4"
  config = tasks.typed(config)
  with pytest.raises(UserError, match="data.packing=4 with model.bilstm_on_top.*packing=0"):
    finetuning.make_task(FINETUNING["sst2"], config, str(tmp_path),
                         train.run_context(config))
  spec = dataclasses.replace(FINETUNING["sst2"],
                             model=lambda bert_config, data: heads.BertForPreTraining(bert_config))
  with pytest.raises(UserError, match=r"\(BertForPreTraining\) takes no BiLSTM on top; set "
                                      "--config.model.bilstm_on_top=false"):
    finetuning.model_of(spec, config, BertConfig(), None)
  assert not os.listdir(tmp_path)
  model = heads.BertForSequenceClassification(BertConfig(
      vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32), 2,
                                               bilstm_on_top=True)
  ids = np.ones((1, 8), np.int32)
  with pytest.raises(ValueError, match="bilstm_on_top runs one LSTM over each row"):
    random_params(model, ids, ids, ids, deterministic=True, sequence_ids=ids, position_ids=ids,
                  cls_positions=np.zeros((1, 1), np.int32))
  params = random_params(model, ids, ids, ids, deterministic=True)
  with pytest.raises(UserError, match="BiLSTM between the encoder and its head.*cannot be"):
    hf.to_hf(params, model.config)
  saved = tmp_path / "saved"
  model_files.save_model_dir(str(saved), params, model.config)
  with pytest.raises(UserError, match="BiLSTM between the encoder and its head"):
    hf.load_bertjax_checkpoint(str(saved))


