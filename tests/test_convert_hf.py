"""Tests of bertjax.convert (Hugging Face <-> bertjax) against transformers itself.

Small randomly initialised transformers models are saved to temporary directories, converted,
and run side by side on the same padded segment-pair batch: every hidden state, the pooler, the
MLM and NSP logits agree within ATOL (float32, eval mode / deterministic=True).
"""
import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util
from safetensors.numpy import load_file, save_file

from bertjax import model_files
from bertjax.training import init_params
from bertjax.convert import __main__ as cli
from bertjax.convert import hf, hf_files, hf_rules
from bertjax.errors import UserError
from bertjax.models import bert, heads
from bertjax.models.config import BertConfig

ATOL = 1e-5
VOCAB = 99
MASK_ID = 4  # any id; the random model has no real [MASK]


def _hf_config(**overrides):
  return transformers.BertConfig(**{**dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37,
                                           max_position_embeddings=64), **overrides})


def _save_hf(cls, directory, seed=0, **config_overrides):
  """A seeded random transformers model `cls`, saved (safetensors) to `directory`."""
  torch.manual_seed(seed)
  model = cls(_hf_config(**config_overrides)).eval()
  model.save_pretrained(str(directory))
  return model, str(directory)


def _convert(directory):
  config = hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  params, report = hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  return params, config, report


def _batch():
  """[3, 12] ids, segment pairs (A then B) and padding of different lengths (0 = pad)."""
  rng = np.random.RandomState(0)
  lengths = [12, 9, 5]
  ids = rng.randint(5, VOCAB, (3, 12))
  mask = (np.arange(12)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
  segments = np.zeros_like(ids)
  for row, length in enumerate(lengths):
    segments[row, length // 2:length] = 1
  ids = ids * mask
  ids[:, 2] = MASK_ID
  ids[0, 7] = MASK_ID
  return ids, segments, mask


def _torch_out(model, ids, segments, mask):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(segments), output_hidden_states=True)


def _close(ours, theirs):
  np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), rtol=0, atol=ATOL)


def _close_mlm(ours, theirs, config):
  """bertjax's MLM logits [..., padded_vocab_size] = transformers' [..., vocab_size] within ATOL
  on the real columns; the padding columns are float32 min (never predicted)."""
  ours = np.asarray(ours)
  assert ours.shape == tuple(theirs.shape[:-1]) + (config.padded_vocab_size,)
  assert (ours[..., config.vocab_size:] == np.finfo(np.float32).min).all()
  _close(ours[..., :config.vocab_size], theirs)


def _assert_encoder_parity(params, config, torch_out, batch, pooler=True):
  ids, segments, mask = batch
  out = bert.BertEncoder(config, use_pooler=pooler).apply(
      {"params": params["bert"]}, ids, segments, mask, deterministic=True,
      output_hidden_states=True)
  assert len(out.hidden_states) == len(torch_out.hidden_states) == config.num_layers + 1
  for ours, theirs in zip(out.hidden_states, torch_out.hidden_states):
    _close(ours, theirs)
  _close(out.sequence_output, torch_out.hidden_states[-1])
  if pooler:
    _close(out.pooled_output, torch_out.pooler_output)


def _fresh_params(config, seed=1):
  ids = jnp.zeros((1, 4), jnp.int32)
  variables = heads.BertForPreTraining(config).init(jax.random.PRNGKey(seed), ids, ids, ids,
                                                    deterministic=True)
  return jax.tree.map(np.asarray, nn.unbox(variables)["params"])


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def _assert_trees_equal(a, b):
  fa, fb = _flat(a), _flat(b)
  assert sorted(fa) == sorted(fb)
  for path in fa:
    np.testing.assert_array_equal(np.asarray(fa[path]), np.asarray(fb[path]), err_msg=path)


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
  return _save_hf(transformers.BertForPreTraining, tmp_path_factory.mktemp("pretraining"))


# --- configs ------------------------------------------------------------------------------------

def test_config_both_ways(pretraining):
  _, directory = pretraining
  config = hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
          config.intermediate_size, config.max_position_embeddings) == (VOCAB, 32, 2, 4, 37, 64)
  assert config.hidden_act == "gelu"
  assert hf_files.hf_config_to_bert_config(hf_files.bert_config_to_hf_config(config)) == config
  # transformers reads what we write
  hf_config = transformers.BertConfig(**hf_files.bert_config_to_hf_config(config))
  assert hf_config.num_hidden_layers == 2 and hf_config.hidden_act == "gelu"


@pytest.mark.parametrize("act,ours", [("gelu", "gelu"), ("gelu_new", "gelu_tanh"),
                                      ("gelu_pytorch_tanh", "gelu_tanh")])
def test_config_activations(act, ours):
  assert hf_files.hf_config_to_bert_config(_hf_config(hidden_act=act).to_dict()).hidden_act == ours


@pytest.mark.parametrize("change,named", [
    (dict(hidden_act="relu"), "hidden_act='relu'"),
    (dict(model_type="roberta"), "model_type='roberta'"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(is_decoder=True), "is_decoder"),
    (dict(num_attention_heads=5), "num_heads"),
])
def test_config_errors(change, named):
  with pytest.raises(UserError, match=named):
    hf_files.hf_config_to_bert_config({**_hf_config().to_dict(), **change})


# --- parity -------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_bert_model_parity(tmp_path, act):
  """BertModel saves prefix-less names; no heads; exact and tanh GELU. Weights 10x the usual
  init (0.2) put the feed-forward inputs where erf and tanh GELU differ by more than ATOL."""
  model, directory = _save_hf(transformers.BertModel, tmp_path, hidden_act=act,
                              initializer_range=0.2)
  assert "embeddings.word_embeddings.weight" in load_file(
      os.path.join(directory, "model.safetensors"))
  params, config, report = _convert(directory)
  assert set(params) == {"bert"}
  assert report.missing and all(p.startswith(("masked_lm/", "next_sentence/"))
                                for p in report.missing)
  assert report.task is None
  batch = _batch()
  _assert_encoder_parity(params, config, _torch_out(model, *batch), batch)


def test_pretraining_parity(pretraining):
  model, directory = pretraining
  params, config, report = _convert(directory)
  assert report.missing == [] and report.task is None
  batch = _batch()
  theirs = _torch_out(model, *batch)
  _assert_encoder_parity(params, config, _torch_out(model.bert, *batch), batch)
  mlm, nsp = heads.BertForPreTraining(config).apply({"params": params}, *batch,
                                                    deterministic=True)
  _close_mlm(mlm, theirs.prediction_logits, config)
  _close(nsp, theirs.seq_relationship_logits)


def test_pretraining_top5_at_masked_positions(pretraining):
  """The gathered (masked_lm_positions) path predicts the same top-5 tokens as transformers."""
  model, directory = pretraining
  params, config, _ = _convert(directory)
  ids, segments, mask = _batch()
  positions = np.array([[2, 7], [2, 2], [2, 2]])  # the MASK_ID positions (row 1, 2 repeat)
  assert (np.take_along_axis(ids, positions, 1) == MASK_ID).all()
  mlm, _ = heads.BertForPreTraining(config).apply({"params": params}, ids, segments, mask,
                                                  positions, deterministic=True)
  theirs = np.take_along_axis(_torch_out(model, ids, segments, mask).prediction_logits.numpy(),
                              positions[..., None], 1)  # [batch, positions, vocab]
  _close_mlm(mlm, torch.tensor(theirs), config)  # [batch, positions, padded vocab]
  top5 = lambda x: np.argsort(-np.asarray(x), axis=-1, kind="stable")[..., :5]
  np.testing.assert_array_equal(top5(mlm), top5(theirs))


def test_masked_lm_parity_reports_nsp_and_pooler_missing(tmp_path):
  model, directory = _save_hf(transformers.BertForMaskedLM, tmp_path, seed=3)
  params, config, report = _convert(directory)
  assert set(params) == {"bert", "masked_lm"} and "pooler" not in params["bert"]
  assert report.missing == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel",
                            "next_sentence/classifier/bias", "next_sentence/classifier/kernel"]
  full = _fresh_params(config)  # what load_params gives: fresh pooler and NSP head
  full = traverse_util.unflatten_dict({**_flat(full), **_flat(params)}, sep="/")
  batch = _batch()
  theirs = _torch_out(model, *batch)
  _assert_encoder_parity(full, config, theirs, batch, pooler=False)
  mlm, _ = heads.BertForPreTraining(config).apply({"params": full}, *batch, deterministic=True)
  _close_mlm(mlm, theirs.logits, config)


# (transformers class, num_labels, bertjax model class, the bertjax head's name).
TASK_MODELS = [
    (transformers.BertForSequenceClassification, 3, heads.BertForSequenceClassification,
     "sequence_classification"),
    (transformers.BertForSequenceClassification, 1, heads.BertForSequenceClassification,
     "sequence_classification"),  # regression (STS-B)
    (transformers.BertForTokenClassification, 5, heads.BertForTokenClassification,
     "token_tagging"),
    (transformers.BertForQuestionAnswering, 2, heads.BertForQuestionAnswering, "span"),
    (transformers.BertForMultipleChoice, 2, heads.BertForMultipleChoice, "multiple_choice"),
]
TASK_IDS = ["sequence_classification", "regression", "token_tagging", "span", "multiple_choice"]


def _task_logits(cls, num_labels, params, config, model, batch):
  """(bertjax's logits, transformers' logits) of a task model on `batch`; multiple choice takes
  the batch's 3 rows as 3 choices of one example, so padding differs between choices."""
  ours_model = cls(config, num_labels) if "num_labels" in cls.__dataclass_fields__ else cls(config)
  if cls is heads.BertForMultipleChoice:
    batch = tuple(x[None] for x in batch)  # [1 example, 3 choices, seq]
  ours = ours_model.apply({"params": params}, *batch, deterministic=True)
  with torch.no_grad():
    theirs = model(torch.tensor(batch[0]), attention_mask=torch.tensor(batch[2]),
                   token_type_ids=torch.tensor(batch[1]))
  if cls is heads.BertForQuestionAnswering:
    return ours, (theirs.start_logits, theirs.end_logits)
  return (ours,), (theirs.logits,)


@pytest.mark.parametrize("hf_cls,num_labels,cls,head", TASK_MODELS, ids=TASK_IDS)
def test_task_model_parity(tmp_path, hf_cls, num_labels, cls, head):
  """Each Hugging Face task class converts whole (encoder and head); the logits agree."""
  model, directory = _save_hf(hf_cls, tmp_path, seed=4, num_labels=num_labels)
  hf_config = hf_files.load_hf_config(directory)
  task, labels = hf_files.hf_task(hf_config)
  assert (task, labels) == (hf_cls.__name__, num_labels)
  config = hf_files.hf_config_to_bert_config(hf_config)
  params, report = hf.from_hf(hf_files.load_hf_state_dict(directory), config, task, labels)
  assert report.task == task and set(params) == {"bert", head}
  assert sorted(_flat(params[head])) == ["classifier/bias", "classifier/kernel"]
  has_pooler = head in ("sequence_classification", "multiple_choice")
  assert ("pooler" in params["bert"]) == has_pooler
  assert all(p.startswith(("masked_lm/", "next_sentence/", "bert/pooler/"))
             for p in report.missing)  # the pretraining heads (and pooler) it lacks
  batch = _batch()
  _assert_encoder_parity(params, config, _torch_out(model.bert, *batch), batch,
                         pooler=has_pooler)
  ours, theirs = _task_logits(cls, num_labels, params, config, model, batch)
  for o, t in zip(ours, theirs):
    assert o.shape == tuple(t.shape)
    _close(o, t)


@pytest.mark.parametrize("hf_cls,num_labels,cls,head", TASK_MODELS[::2], ids=TASK_IDS[::2])
def test_task_model_round_trips_through_the_cli(tmp_path, hf_cls, num_labels, cls, head, capsys):
  """HF task model -> bertjax -> HF: the same tensors, config and logits; transformers loads it."""
  model, directory = _save_hf(hf_cls, tmp_path / "hf", seed=6, num_labels=num_labels)
  assert cli.main(["--from=hf", f"--src={directory}", f"--dst={tmp_path / 'out'}"]) == 0
  assert f"with the task head of {hf_cls.__name__}" in capsys.readouterr().out
  assert cli.main(["--to=hf", f"--src={tmp_path / 'out'}", f"--dst={tmp_path / 'back'}"]) == 0
  state, back = hf_files.load_hf_state_dict(directory), hf_files.load_hf_state_dict(str(tmp_path / "back"))
  assert sorted(back) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)
  reloaded, info = hf_cls.from_pretrained(str(tmp_path / "back"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  if hf_rules.TASK_HEADS[hf_cls.__name__].labelled:
    assert reloaded.config.num_labels == num_labels
  ids, _, mask = (torch.tensor(x[None] if head == "multiple_choice" else x) for x in _batch())
  with torch.no_grad():
    a, b = model(ids, attention_mask=mask), reloaded.eval()(ids, attention_mask=mask)
  key = "start_logits" if head == "span" else "logits"
  np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


def test_task_head_needs_the_architecture(tmp_path):
  """classifier.* is one of three heads: without `architectures` it is named, not guessed."""
  _, directory = _save_hf(transformers.BertForSequenceClassification, tmp_path, num_labels=3)
  hf_config = hf_files.load_hf_config(directory)
  config = hf_files.hf_config_to_bert_config(hf_config)
  with pytest.raises(UserError, match=r"classifier\.weight \(3, 32\) belongs to a task head, "
                     "but config.json's architectures does not name one"):
    hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  assert hf_files.hf_task({**hf_config, "architectures": None}) == (None, 3)
  with pytest.raises(UserError, match=r"classifier\.weight \(3, 32\) -> "
                     r"sequence_classification/classifier/kernel \(32, 3\) \(transpose\), the "
                     r"model expects \(32, 4\)"):
    hf.from_hf(hf_files.load_hf_state_dict(directory), config, "BertForSequenceClassification", 4)


def test_old_names_tied_decoder_and_buffers(pretraining):
  """LayerNorm.gamma/beta, a stored (tied) decoder and the position_ids buffer convert."""
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  expected, config, _ = _convert(directory)
  old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                   "LayerNorm.beta"): v
         for k, v in state.items()}
  old["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  old["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  old["bert.embeddings.position_ids"] = np.arange(64)[None].astype(np.float32)
  params, report = hf.from_hf(old, config)
  _assert_trees_equal(params, expected)
  assert sorted(report.ignored) == ["bert.embeddings.position_ids",
                                    "cls.predictions.decoder.bias",
                                    "cls.predictions.decoder.weight"]
  # Only the decoder's copy of the output bias: read as the output bias.
  only_decoder = dict(state)
  only_decoder["cls.predictions.decoder.bias"] = only_decoder.pop("cls.predictions.bias")
  _assert_trees_equal(hf.from_hf(only_decoder, config)[0], expected)


def test_pytorch_bin_loads_like_safetensors(tmp_path, pretraining):
  model, directory = pretraining
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  (tmp_path / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  ours = hf_files.load_hf_state_dict(str(tmp_path))
  safe = hf_files.load_hf_state_dict(directory)
  assert set(safe) <= set(ours)  # the bin also holds the tied decoder
  for name in safe:
    np.testing.assert_array_equal(ours[name], safe[name])
  _assert_trees_equal(_convert(str(tmp_path))[0], _convert(directory)[0])


class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
  marker = tmp_path / "pwned"
  (tmp_path / "hf").mkdir()
  torch.save({"bert.embeddings.word_embeddings.weight": _Payload(marker)},
             tmp_path / "hf" / "pytorch_model.bin")
  with pytest.raises(UserError, match="pytorch_model.bin could not be read as plain weights"):
    hf_files.load_hf_state_dict(str(tmp_path / "hf"))
  assert not marker.exists()
  # Control: the file is live; an unsafe load of it runs the payload.
  torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=False)
  assert marker.exists()


def test_sharded_safetensors_load_whole(tmp_path, pretraining):
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  names = sorted(state)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for shard, shard_names in shards.items():
    save_file({n: state[n] for n in shard_names}, str(tmp_path / shard))
  index = {"weight_map": {n: shard for shard, ns in shards.items() for n in ns}}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  loaded = hf_files.load_hf_state_dict(str(tmp_path))
  assert sorted(loaded) == names
  for name in names:
    np.testing.assert_array_equal(loaded[name], state[name])


def test_no_weights_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="no model.safetensors or pytorch_model.bin"):
    hf_files.load_hf_state_dict(str(tmp_path))


# --- round trips --------------------------------------------------------------------------------

def test_round_trip_hf_bertjax_hf(pretraining):
  _, directory = pretraining
  state = hf_files.load_hf_state_dict(directory)
  params, config, _ = _convert(directory)
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)


def test_round_trip_bertjax_hf_bertjax():
  config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position_embeddings=64)
  params = _fresh_params(config, seed=7)
  tensors = hf.to_hf(params, config)
  assert "cls.predictions.decoder.weight" not in tensors  # tied
  back, report = hf.from_hf(tensors, config)
  _assert_trees_equal(back, params)
  assert report.missing == [] and report.ignored == [] and report.task is None


ODD_VOCAB = 1001  # odd like BERT's 30522: no pad multiple divides it


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory):
  """A BertForPreTraining with 1001 tokens whose MLM bias is random (transformers starts it at
  zero), saved; and its tensors."""
  torch.manual_seed(8)
  model = transformers.BertForPreTraining(_hf_config(vocab_size=ODD_VOCAB)).eval()
  with torch.no_grad():
    model.cls.predictions.bias.normal_()
  directory = str(tmp_path_factory.mktemp("odd_vocab"))
  model.save_pretrained(directory)
  return directory, hf_files.load_hf_state_dict(directory)


@pytest.mark.parametrize("multiple,rows", [(128, 1024), (8, 1008), (1, 1001)])
def test_odd_vocab_pads_on_import_and_strips_on_export(odd_vocab, multiple, rows):
  """The word embeddings and the MLM bias gain zero rows up to padded_vocab_size on import and
  lose them on export: the round trip gives back every tensor bitwise."""
  directory, state = odd_vocab
  config = dataclasses.replace(
      hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)),
      pad_vocab_to_multiple=multiple)
  assert (config.vocab_size, config.padded_vocab_size) == (ODD_VOCAB, rows)
  params, _ = hf.from_hf(state, config)
  for path, name in (("bert/embeddings/word_embeddings/embedding",
                      "bert.embeddings.word_embeddings.weight"),
                     ("masked_lm/output_bias", "cls.predictions.bias")):
    padded = _flat(params)[path]
    assert padded.shape[0] == rows
    np.testing.assert_array_equal(padded[:ODD_VOCAB], state[name])
    assert not padded[ODD_VOCAB:].any()
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(state)
  for name in state:
    assert back[name].dtype == state[name].dtype
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)


def test_odd_vocab_round_trips_through_the_cli(tmp_path, odd_vocab):
  """--from=hf writes padded weights and a bert_config.json with the real vocab_size and the
  pad multiple; --to=hf writes config.json with the real vocab_size and the tensors bitwise."""
  directory, state = odd_vocab
  out, back = tmp_path / "out", tmp_path / "back"
  cli.from_hf_dir(directory, str(out))
  saved = json.loads((out / "bert_config.json").read_text())
  assert (saved["vocab_size"], saved["pad_vocab_to_multiple"]) == (ODD_VOCAB, 128)
  shapes = init_params.saved_param_shapes(str(out))
  assert shapes["bert/embeddings/word_embeddings/embedding"] == (1024, 32)
  assert shapes["masked_lm/output_bias"] == (1024,)
  assert cli.to_hf_dir(str(out), str(back)) == "BertForPreTraining"
  assert json.loads((back / "config.json").read_text())["vocab_size"] == ODD_VOCAB
  exported = hf_files.load_hf_state_dict(str(back))
  assert sorted(exported) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(exported[name], state[name], err_msg=name)


def test_unpadded_bertjax_checkpoint_exports(tmp_path, odd_vocab):
  """A model directory saved before bertjax padded the vocabulary (1001 rows, no
  pad_vocab_to_multiple in bert_config.json) reads padded to 1024 rows and exports bitwise."""
  directory, state = odd_vocab
  unpadded = dataclasses.replace(
      hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)),
      pad_vocab_to_multiple=1)
  params, _ = hf.from_hf(state, unpadded)
  model_files.save_model_dir(str(tmp_path / "old"), params, unpadded)
  old_json = json.loads((tmp_path / "old" / "bert_config.json").read_text())
  del old_json["pad_vocab_to_multiple"]
  (tmp_path / "old" / "bert_config.json").write_text(json.dumps(old_json))

  loaded, config = hf.load_bertjax_checkpoint(str(tmp_path / "old"))
  assert config.pad_vocab_to_multiple == 128 and config.vocab_size == ODD_VOCAB
  embedding = loaded["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert embedding.shape == (1024, 32) and not embedding[ODD_VOCAB:].any()
  cli.to_hf_dir(str(tmp_path / "old"), str(tmp_path / "back"))
  exported = hf_files.load_hf_state_dict(str(tmp_path / "back"))
  for name in state:
    np.testing.assert_array_equal(exported[name], state[name], err_msg=name)


def test_bert_config_json_keeps_the_model_not_the_run(tmp_path):
  """bert_config.json records pad_vocab_to_multiple (it shapes the weights) but not attention
  or remat (how a run computes); reading ignores those, and a file without the pad multiple
  (Google's fields, an older bertjax) gets BertConfig's default."""
  config = BertConfig(vocab_size=ODD_VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=37, attention="xla", attention_dropout_rate=0.0,
                      remat="full", pad_vocab_to_multiple=64)
  written = json.loads(model_files.bert_config_json(config))
  assert "attention" not in written and "remat" not in written
  assert (written["vocab_size"], written["pad_vocab_to_multiple"]) == (ODD_VOCAB, 64)
  (tmp_path / "bert_config.json").write_text(json.dumps(
      {**written, "attention": "splash", "remat": "dots"}))  # as a run's own choices were once
  assert model_files.load_bert_config(str(tmp_path)) == dataclasses.replace(
      config, attention="reference", remat="none")
  del written["pad_vocab_to_multiple"]
  (tmp_path / "bert_config.json").write_text(json.dumps(written))
  assert model_files.load_bert_config(str(tmp_path)).pad_vocab_to_multiple == 128


def test_every_bertjax_parameter_has_a_rule():
  config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=37, max_position_embeddings=64)
  assert len(hf.to_hf(_fresh_params(config), config)) == len(hf.expected_shapes(config))
  for task, head in hf_rules.TASK_HEADS.items():
    ids = jnp.zeros((1, 2, 4) if head.choices else (1, 4), jnp.int32)
    variables = head.model(config, 3).init(jax.random.PRNGKey(0), ids, ids, ids,
                                           deterministic=True)
    params = jax.tree.map(np.asarray, nn.unbox(variables)["params"])
    assert hf.params_task(params)[0] == task
    tensors = hf.to_hf(params, config)
    assert len(tensors) == len(_flat(params))
    assert {f"{head.hf_prefix}.weight", f"{head.hf_prefix}.bias"} <= set(tensors)


# --- planted errors -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def state_and_config(pretraining):
  _, directory = pretraining
  return (hf_files.load_hf_state_dict(directory),
          hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory)))


def test_unmapped_tensor_is_named(state_and_config):
  state, config = state_and_config
  extra = {**state, "bert.encoder.layer.0.attention.self.gate.weight": np.zeros((32, 32))}
  with pytest.raises(UserError, match=r"bert\.encoder\.layer\.0\.attention\.self\.gate\.weight "
                     r"\(32, 32\) matches no rule"):
    hf.from_hf(extra, config)
  with pytest.raises(UserError, match=r"foo\.weight"):
    hf.from_hf({**state, "foo.weight": np.zeros(3)}, config)


def test_layer_beyond_config_is_named(state_and_config):
  state, config = state_and_config
  extra = {**state, "bert.encoder.layer.2.output.dense.bias": np.zeros(32)}
  with pytest.raises(UserError, match=r"layer\.2\.output\.dense\.bias maps to "
                     r"bert/encoder/layer_2/feed_forward/output/bias"):
    hf.from_hf(extra, config)


def test_missing_tensor_is_named(state_and_config):
  state, config = state_and_config
  fewer = {k: v for k, v in state.items() if k != "bert.encoder.layer.1.attention.self.key.bias"}
  with pytest.raises(UserError, match=r"bert/encoder/layer_1/attention/key/bias \(32,\) is not "
                     "in the checkpoint"):
    hf.from_hf(fewer, config)


def test_partial_head_is_named(state_and_config):
  state, config = state_and_config
  fewer = {k: v for k, v in state.items() if k != "cls.seq_relationship.bias"}
  with pytest.raises(UserError, match=r"next_sentence/classifier/bias \(2,\) is not in the "
                     "checkpoint, though other parameters of next_sentence/ are"):
    hf.from_hf(fewer, config)


def test_wrong_shape_is_named(state_and_config):
  state, config = state_and_config
  wrong = {**state, "bert.encoder.layer.0.intermediate.dense.weight": np.zeros((36, 32))}
  with pytest.raises(UserError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight "
                     r"\(36, 32\) -> bert/encoder/layer_0/feed_forward/intermediate/kernel "
                     r"\(32, 36\) \(transpose\), the model expects \(32, 37\)"):
    hf.from_hf(wrong, config)


def test_untied_decoder_is_refused(state_and_config):
  state, config = state_and_config
  untied = {**state, "cls.predictions.decoder.weight":
            state["bert.embeddings.word_embeddings.weight"] + 1.0}
  with pytest.raises(UserError, match="cls.predictions.decoder.weight differs from the word "
                     "embeddings"):
    hf.from_hf(untied, config)


def test_to_hf_errors_name_the_parameter(state_and_config):
  state, config = state_and_config
  params, _ = hf.from_hf(state, config)
  flat = _flat(params)
  flat["bert/pooler/dense/kernel"] = np.zeros((32, 31), np.float32)
  del flat["bert/encoder/layer_0/attention/query/bias"]
  with pytest.raises(UserError, match=r"bert/pooler/dense/kernel \(32, 31\), the config "
                     r"expects \(32, 32\).*layer_0/attention/query/bias \(32,\) is missing"):
    hf.to_hf(traverse_util.unflatten_dict(flat, sep="/"), config)


# --- checkpoint files and the command line ------------------------------------------------------

def test_cli_from_hf_then_load_params_then_to_hf(tmp_path, pretraining, capsys):
  model, directory = pretraining
  (tmp_path / "hf").mkdir()
  for name in os.listdir(directory):
    (tmp_path / "hf" / name).write_bytes(open(os.path.join(directory, name), "rb").read())
  vocab = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                    + [f"w{i}" for i in range(VOCAB - 5)]) + "\n"
  (tmp_path / "hf" / "vocab.txt").write_text(vocab)
  out, back = tmp_path / "out", tmp_path / "back"

  assert cli.main(["--from=hf", f"--src={tmp_path / 'hf'}", f"--dst={out}"]) == 0
  assert "converted 46 parameters" in capsys.readouterr().out
  assert (out / "vocab.txt").read_text() == vocab
  config = model_files.load_bert_config(str(out))
  assert config == hf_files.hf_config_to_bert_config(hf_files.load_hf_config(directory))
  converted, _ = hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  loaded, report = init_params.load_params(str(out), jax.tree.map(jnp.asarray,
                                                                 _fresh_params(config)))
  assert report.missing == [] and report.unused == []
  _assert_trees_equal(loaded, converted)

  assert cli.main(["--to=hf", f"--src={out}", f"--dst={back}"]) == 0
  assert (back / "vocab.txt").read_text() == vocab
  reloaded, info = transformers.BertForPreTraining.from_pretrained(str(back),
                                                                   output_loading_info=True)
  assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set())
  assert info["mismatched_keys"] in ([], set())
  batch = _batch()
  ours, theirs = _torch_out(reloaded.eval(), *batch), _torch_out(model, *batch)
  np.testing.assert_array_equal(ours.prediction_logits.numpy(), theirs.prediction_logits.numpy())
  np.testing.assert_array_equal(ours.seq_relationship_logits.numpy(),
                                theirs.seq_relationship_logits.numpy())
  assert json.loads((back / "config.json").read_text())["architectures"] == ["BertForPreTraining"]


def test_masked_lm_checkpoint_loads_with_fresh_nsp_and_pooler(tmp_path):
  _, directory = _save_hf(transformers.BertForMaskedLM, tmp_path / "hf", seed=5)
  cli.from_hf_dir(directory, str(tmp_path / "out"))
  config = model_files.load_bert_config(str(tmp_path / "out"))
  fresh = jax.tree.map(jnp.asarray, _fresh_params(config))
  loaded, report = init_params.load_params(str(tmp_path / "out"), fresh)
  assert report.missing == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel",
                            "next_sentence/classifier/bias", "next_sentence/classifier/kernel"]
  np.testing.assert_array_equal(loaded["next_sentence"]["classifier"]["kernel"],
                                fresh["next_sentence"]["classifier"]["kernel"])
  assert cli.to_hf_dir(str(tmp_path / "out"), str(tmp_path / "back")) == "BertForMaskedLM"
  _, info = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "back"),
                                                         output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_cli_refuses_non_empty_dst(tmp_path, pretraining, capsys):
  _, directory = pretraining
  (tmp_path / "dst").mkdir()
  (tmp_path / "dst" / "keep.txt").write_text("mine")
  assert cli.main(["--from=hf", f"--src={directory}", f"--dst={tmp_path / 'dst'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("convert: error: --dst=") and "not an empty directory" in err
  assert os.listdir(tmp_path / "dst") == ["keep.txt"]
  assert (tmp_path / "dst" / "keep.txt").read_text() == "mine"


def test_cli_as_module_errors_and_choices(tmp_path):
  run = lambda *args: subprocess.run([sys.executable, "-m", "bertjax.convert", *args],
                                     capture_output=True, text=True, timeout=120)
  result = run("--to=hf", f"--src={tmp_path / 'absent'}", f"--dst={tmp_path / 'out'}")
  assert result.returncode == 2 and "is not a directory" in result.stderr
  assert result.stderr.startswith("convert: error: --src=")
  assert not (tmp_path / "out").exists()
  result = run("--from=onnx", f"--src={tmp_path}", f"--dst={tmp_path / 'out'}")
  assert result.returncode == 2 and "invalid choice: 'onnx'" in result.stderr
