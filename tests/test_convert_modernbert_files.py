"""ModernBERT checkpoints through `python -m bertjax.convert`: round trips bit for bit, the
command on a save_pretrained directory with a byte-level BPE tokenizer.json, and one UserError
for each config.json bertjax cannot represent.

  - Hugging Face -> bertjax -> Hugging Face gives every tensor back byte for byte, under the
    same names, for ModernBertModel, ModernBertForMaskedLM and the four task classes, and a
    config.json whose fields equal the original's;
  - bertjax -> Hugging Face -> bertjax gives the same parameters (padding rows included);
  - --from=hf then --to=hf on a directory: bert_config.json records the ModernBERT fields, the
    tokenizer files are copied, transformers loads the export with nothing missing or unexpected
    and the same logits as the original.
"""
import json
import os
import shlex
import sys

import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util
from safetensors.numpy import load_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.convert import __main__ as cli
from bertjax.convert import hf, hf_files, hf_modernbert, hf_rules
from bertjax.errors import UserError
from bertjax.modeldir import saved_params
from convert_modernbert_helpers import (HF_CLASSES, NUM_LABELS, SPECIALS, hf_config, hf_model,
                                        padded_batch, state_dict)
from test_readme import ROOT, _readme_commands

import warm_python

# config.json fields transformers writes that are not the model: provenance, the dtype it ran
# in, and runtime switches.
_NOT_THE_MODEL = {"transformers_version", "dtype", "_name_or_path", "output_attentions",
                  "output_hidden_states", "return_dict", "chunk_size_feed_forward",
                  "is_encoder_decoder", "problem_type", "sparse_prediction",
                  "sparse_pred_ignore_index", "deterministic_flash_attn"}


def _json(config: dict) -> dict:
  return json.loads(json.dumps(config))


def _assert_configs_equal(ours: dict, theirs: dict, labelled: bool):
  theirs = {k: v for k, v in _json(theirs).items() if k not in _NOT_THE_MODEL}
  if not labelled:
    theirs = {k: v for k, v in theirs.items() if k not in ("id2label", "label2id")}
  missing = sorted(set(theirs) - set(ours))
  assert not missing, missing
  differ = {k: (ours[k], theirs[k]) for k in theirs if ours[k] != theirs[k]}
  assert not differ, differ


@pytest.mark.parametrize("name", sorted(HF_CLASSES))
def test_hf_to_bertjax_to_hf_is_bitwise(name):
  span = dict(num_labels=2) if name == "ModernBertForQuestionAnswering" else {}  # start, end
  model = hf_model(name, seed=11, classifier_pooling="mean", **span)
  tensors = state_dict(model)
  hf_dict = _json({**model.config.to_dict(), "architectures": [name]})
  config = hf_files.hf_config_to_bert_config(hf_dict)
  task, labels = hf_files.hf_task(hf_dict)
  params, _ = hf.from_hf(tensors, config, task, labels)
  assert hf.hf_architecture(params, config) == name
  assert hf.params_task(params, config)[0] == task
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(tensors)
  for key, value in tensors.items():
    assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
    assert back[key].tobytes() == value.tobytes(), key
  labelled = bool(task) and hf_rules.MODERNBERT.task_heads[task].labelled
  token_ids = {k: hf_dict[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                                       "cls_token_id", "sep_token_id")}
  written = hf_files.bert_config_to_hf_config(config, [name], labels if labelled else None,
                                              token_ids)
  _assert_configs_equal(written, hf_dict, labelled)
  assert hf_files.hf_config_to_bert_config(written) == config


def _random_params(config, task=None, num_labels=2, bare=False):
  rng = np.random.RandomState(4)
  shapes = hf.expected_shapes(config, task, num_labels)
  flat = {p: rng.randn(*s).astype(np.float32) for p, s in shapes.items()
          if not (bare and (p.startswith("bert/head/") or p.startswith("masked_lm/")))}
  for path in saved_params.VOCAB_ROW_PARAMS:
    if path in flat:  # padding rows are zero in bertjax's init and in from_hf's output
      flat[path][config.vocab_size:] = 0
  return traverse_util.unflatten_dict(flat, sep="/")


def test_bertjax_to_hf_to_bertjax_is_identical():
  config = hf_files.hf_config_to_bert_config(hf_config().to_dict())
  assert config.padded_vocab_size > config.vocab_size
  cases = [(None, 2, False), (None, 2, True)] + [
      (task, NUM_LABELS if head.labelled else 2, False)
      for task, head in hf_rules.MODERNBERT.task_heads.items()]
  for task, num_labels, bare in cases:
    params = _random_params(config, task, num_labels, bare)
    tensors = hf.to_hf(params, config)
    if bare:  # as ModernBertModel saves itself: no 'model.' prefix
      assert hf.hf_architecture(params, config) == "ModernBertModel"
      assert "embeddings.tok_embeddings.weight" in tensors
    back, report = hf.from_hf(tensors, config, task, num_labels)
    a, b = (traverse_util.flatten_dict(t, sep="/") for t in (params, back))
    assert sorted(a) == sorted(b), (task, bare)
    for path in a:
      assert a[path].tobytes() == b[path].tobytes(), (task, path)
    assert report.missing == ([] if not bare else
                              ["bert/head/dense/kernel", "bert/head/layer_norm/scale",
                               "masked_lm/output_bias"])


def _tokenizer_dir(directory):
  """A tiny byte-level BPE tokenizer.json ([UNK] [CLS] [SEP] [PAD] [MASK] = ids 0..4) and its
  companion files, as a ModernBERT download holds them; returns the vocabulary size."""
  text = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
          "all that glitters is not gold", "hello world, it's a test."] * 5
  tok = HFTokenizer(models.BPE(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=100, special_tokens=SPECIALS,
                                                    show_progress=False))
  tok.save(str(directory / "tokenizer.json"))
  specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
              "mask_token": "[MASK]", "unk_token": "[UNK]"}
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", **specials}))
  (directory / "special_tokens_map.json").write_text(json.dumps(specials))
  assert [tok.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3, 4]
  return tok.get_vocab_size()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.mark.parametrize("name", ["ModernBertForMaskedLM", "ModernBertForSequenceClassification"])
def test_cli_from_hf_and_back_on_a_save_pretrained_directory(tmp_path, capsys, name):
  src, out, back = tmp_path / "hf", tmp_path / "out", tmp_path / "back"
  src.mkdir()
  vocab = _tokenizer_dir(src)
  model = hf_model(name, seed=12, vocab_size=vocab, classifier_pooling="mean",
                   global_rope_theta=20_000.0, local_rope_theta=500.0)
  model.save_pretrained(str(src))

  assert cli.main(["--from=hf", f"--src={src}", f"--dst={out}"]) == 0
  printed = capsys.readouterr().out
  assert f"from {src} to {out}" in printed
  config = model_files.load_bert_config(str(out))
  assert (config.architecture, config.pooling, config.global_attention_every,
          config.local_attention, config.rope_theta_global, config.rope_theta_local) == (
              "modernbert", "mean", 3, 8, 20_000.0, 500.0)
  saved = json.loads((out / model_files.BERT_CONFIG_FILE).read_text())
  assert saved["architecture"] == "modernbert" and saved["rope_theta_local"] == 500.0
  for file in TOKENIZER_FILES:
    assert (out / file).read_bytes() == (src / file).read_bytes()
  tokenizer = model_files.load_tokenizer(str(out))
  assert isinstance(tokenizer, tokenization.ByteLevelBPETokenizer)
  assert (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id) == (3, 1, 2)
  params, loaded_config = hf.load_bertjax_checkpoint(str(out))
  assert loaded_config == config
  expected, _ = hf.from_hf(state_dict(model), config, *hf_files.hf_task(
      hf_files.load_hf_config(str(src))))
  a, b = (traverse_util.flatten_dict(t, sep="/") for t in (params, expected))
  assert sorted(a) == sorted(b) and all(np.array_equal(a[p], b[p]) for p in a)

  assert cli.main(["--to=hf", f"--src={out}", f"--dst={back}"]) == 0
  assert f"wrote {name} weights" in capsys.readouterr().out
  for file in TOKENIZER_FILES:
    assert (back / file).read_bytes() == (src / file).read_bytes()
  original, exported = (load_file(str(d / "model.safetensors")) for d in (src, back))
  assert sorted(original) == sorted(exported)
  assert all(original[k].tobytes() == exported[k].tobytes() for k in original)
  labelled = name != "ModernBertForMaskedLM"
  _assert_configs_equal(json.loads((back / "config.json").read_text()),
                        json.loads((src / "config.json").read_text()), labelled)

  reloaded, info = HF_CLASSES[name].from_pretrained(str(back), output_loading_info=True,
                                                    attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"]
  assert not info["mismatched_keys"]
  ids, mask = padded_batch(seed=2)
  ids = ids % vocab
  with torch.no_grad():
    ours, theirs = (m.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
                    for m in (reloaded, model))
  np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_special_token_ids_without_a_tokenizer_stay_inside_the_vocabulary(tmp_path):
  assert hf_modernbert.special_token_ids(str(tmp_path), 100) == dict.fromkeys(
      ("pad_token_id", "eos_token_id", "bos_token_id", "cls_token_id", "sep_token_id"))
  assert hf_modernbert.special_token_ids(None, 50368)["pad_token_id"] == 50283


def test_bert_config_json_keeps_the_modernbert_fields_and_old_files_read_as_bert(tmp_path):
  config = hf_files.hf_config_to_bert_config(hf_config(classifier_pooling="mean").to_dict())
  path = tmp_path / model_files.BERT_CONFIG_FILE
  path.write_text(model_files.bert_config_json(config))
  assert model_files.load_bert_config(str(tmp_path)) == config
  new_fields = ("architecture", "local_attention", "global_attention_every", "rope_theta_global",
                "rope_theta_local", "pooling")
  old = {k: v for k, v in json.loads(path.read_text()).items() if k not in new_fields}
  path.write_text(json.dumps(old))
  assert model_files.load_bert_config(str(tmp_path)).architecture == "bert"


def test_older_config_fields_and_layer_types_are_read():
  old = {k: v for k, v in hf_config().to_dict().items()
         if k not in ("layer_types", "rope_parameters")}
  old.update(global_attn_every_n_layers=2, global_rope_theta=1e5, local_rope_theta=1e3,
             hidden_activation="gelu_pytorch_tanh", classifier_activation="gelu_new")
  config = hf_files.hf_config_to_bert_config(old)
  assert (config.global_attention_every, config.rope_theta_global, config.rope_theta_local,
          config.hidden_act) == (2, 1e5, 1e3, "gelu_tanh")
  new = transformers.ModernBertConfig(**hf_files.bert_config_to_hf_config(config)).to_dict()
  assert new["layer_types"] == ["full_attention", "sliding_attention"] * 2
  assert hf_files.hf_config_to_bert_config(new) == config
  one_global = {**new, "layer_types": ["full_attention"] + ["sliding_attention"] * 3}
  assert hf_files.hf_config_to_bert_config(one_global).window(3) == 4
  all_global = {**new, "layer_types": ["full_attention"] * 4}
  assert hf_files.hf_config_to_bert_config(all_global).global_attention_every == 1


REFUSED = [
    (dict(norm_bias=True), "norm_bias=True"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(mlp_bias=True), "mlp_bias=True"),
    (dict(classifier_bias=True), "classifier_bias=True"),
    (dict(decoder_bias=False), "decoder_bias=False"),
    (dict(classifier_activation="silu"), "classifier_activation='silu'"),
    (dict(hidden_activation="silu", classifier_activation="silu"), "hidden_activation='silu'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                              "rope_theta": 1e4},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "rope_type"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling"),
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention",
                       "full_attention"]), "layer_types="),
    (dict(layer_types=["sliding_attention", "full_attention", "sliding_attention",
                       "full_attention"]), "layer_types="),
    (dict(local_attention=7), "local_attention=7"),
    (dict(classifier_pooling="max"), "pooling='max'"),
]


@pytest.mark.parametrize("change,named", REFUSED, ids=[n for _, n in REFUSED])
def test_configs_bertjax_cannot_represent_are_refused(change, named):
  with pytest.raises(UserError, match=named.replace("[", r"\[").replace("(", r"\(")):
    hf_files.hf_config_to_bert_config({**_json(hf_config().to_dict()), **change})


def test_cli_refusal_is_one_line_and_writes_nothing(tmp_path, capsys):
  src = tmp_path / "hf"
  hf_model("ModernBertForMaskedLM").save_pretrained(str(src))
  config = json.loads((src / "config.json").read_text())
  (src / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
  capsys.readouterr()  # save_pretrained's progress bar
  assert cli.main(["--from=hf", f"--src={src}", f"--dst={tmp_path / 'out'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("convert: error: config.json sets attention_bias=True")
  assert len(err.strip().splitlines()) == 1
  assert not (tmp_path / "out").exists()


def test_modernbert_weights_under_a_bert_config_are_named():
  model = hf_model("ModernBertForMaskedLM")
  bert_config = hf_files.hf_config_to_bert_config(transformers.BertConfig(
      vocab_size=100, hidden_size=64, num_hidden_layers=4, num_attention_heads=4).to_dict())
  with pytest.raises(UserError, match=r"model\.layers\.0\.attn\.Wqkv\.weight .* matches no rule"):
    hf.from_hf(state_dict(model), bert_config)
  config = hf_files.hf_config_to_bert_config(model.config.to_dict())
  wrong = {**state_dict(model), "model.layers.1.mlp.Wi.weight": np.zeros((190, 64), np.float32)}
  with pytest.raises(UserError, match=r"Wi\.weight \(190, 64\) -> \S+/feed_forward/intermediate "
                                      r"\(64, 2, 95\) \(geglu\), the model expects \(64, 2, 96\)"):
    hf.from_hf(wrong, config)


def test_the_readme_modernbert_command_runs_as_written(tmp_path):
  """The README's `python -m bertjax.convert --from=hf --src=MODERNBERT_DIR --dst=OUT`, as
  written, in a directory holding MODERNBERT_DIR (a save_pretrained ModernBertForMaskedLM with
  its tokenizer.json)."""
  [args] = [a for a in _readme_commands("python -m bertjax.convert")
            if "--src=MODERNBERT_DIR" in a]
  src = tmp_path / "MODERNBERT_DIR"
  src.mkdir()
  hf_model("ModernBertForMaskedLM", vocab_size=_tokenizer_dir(src)).save_pretrained(str(src))
  out = warm_python.run([sys.executable, "-m", "bertjax.convert", *args], cwd=tmp_path,
                        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"),
                        timeout=300)
  assert out.returncode == 0, (shlex.join(args), out.stderr[-3000:])
  assert model_files.load_bert_config(str(tmp_path / "OUT")).architecture == "modernbert"


@pytest.mark.parametrize("output, probabilities", [(0.1, 0.1), (0.0, 0.0), (0.1, 0.0)])
def test_dropout_means_in_transformers_what_it_meant(output, probabilities):
  """transformers' one attention_dropout drops the attention probabilities and the attention
  output (ModernBertAttention's dropout_p and out_drop): equal rates are written as it; unequal
  ones (ModernBERT's recipe: 0.1 on the output only) as 0.0, the released configs' value, with
  both under bertjax_dropout, read back exactly and named by the export's note."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  config = dataclasses.replace(hf_files.hf_config_to_bert_config(hf_config().to_dict()),
                               dropout_rate=output, attention_dropout_rate=probabilities)
  written = _json(hf_files.bert_config_to_hf_config(config))
  back = hf_files.hf_config_to_bert_config(written)
  assert (back.dropout_rate, back.attention_dropout_rate) == (output, probabilities)
  attention = transformers.ModernBertModel(transformers.ModernBertConfig(**written)).layers[0].attn
  if output == probabilities:
    assert written["attention_dropout"] == output and "bertjax_dropout" not in written
    assert attention.attention_dropout == output
    assert getattr(attention.out_drop, "p", 0.0) == output
    assert hf_modernbert.dropout_note(config) is None
  else:
    assert written["attention_dropout"] == 0.0 and attention.attention_dropout == 0.0
    assert written["bertjax_dropout"] == {"attention_output": output,
                                          "attention_probabilities": probabilities}
    assert "0.1 on the output and 0.0 on the probabilities" in hf_modernbert.dropout_note(config)
  # A Hugging Face config without bertjax's key means transformers' one rate for both.
  plain = dict(written, attention_dropout=0.2)
  plain.pop("bertjax_dropout", None)
  back = hf_files.hf_config_to_bert_config(plain)
  assert (back.dropout_rate, back.attention_dropout_rate) == (0.2, 0.2)
  with pytest.raises(UserError, match="bertjax_dropout=.* is not"):
    hf_files.hf_config_to_bert_config(dict(written, bertjax_dropout={"output": 0.1}))
