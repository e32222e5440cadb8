"""Tests of bertjax.convert.tf (Google's TF BERT checkpoints -> bertjax) against transformers.

A seeded random transformers BertForPreTraining is written as Google releases are laid out:
bert_config.json with Google's keys, vocab.txt, and bert_model.ckpt.{index,data-00000-of-00001}
written by TensorFlow under the variable names of google-research/bert (modeling.py,
run_pretraining.py), with global_step and AdamWeightDecayOptimizer slots as training leaves them.
The command line converts it, and bertjax and transformers then agree on every hidden state, the
pooler, the MLM logits at every position and the NSP logits within ATOL (float32) on a padded
segment-pair batch.
"""
import json
import os
import re
import sys

import numpy as np
import pytest
import torch
import transformers

from bertjax import tokenization
from bertjax.convert import __main__ as cli
from bertjax.convert import hf
from bertjax.convert import tf as tf_convert
from bertjax.errors import UserError
from bertjax.models import bert, heads

ATOL = 1e-5
VOCAB = 99
LAYERS = 2
# Google's keys. Weights 10x the usual init (0.2) put the feed-forward inputs where erf and tanh
# GELU differ by more than ATOL, so the parity test tells the two apart.
GOOGLE_CONFIG = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": LAYERS,
                 "num_attention_heads": 4, "intermediate_size": 37, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                 "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.2}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _google_variables(model):
  """A transformers BertForPreTraining's weights under Google's names and layouts.

  Written out by hand from google-research/bert (not from bertjax's table): tf.layers.dense
  kernels are [in, out], so torch's Linear weights [out, in] are transposed; the NSP weights
  `output_weights` are [2, hidden], like torch's.
  """
  w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  g = {"bert/embeddings/word_embeddings": w["bert.embeddings.word_embeddings.weight"],
       "bert/embeddings/token_type_embeddings": w["bert.embeddings.token_type_embeddings.weight"],
       "bert/embeddings/position_embeddings": w["bert.embeddings.position_embeddings.weight"],
       "bert/embeddings/LayerNorm/gamma": w["bert.embeddings.LayerNorm.weight"],
       "bert/embeddings/LayerNorm/beta": w["bert.embeddings.LayerNorm.bias"],
       "bert/pooler/dense/kernel": w["bert.pooler.dense.weight"].T,
       "bert/pooler/dense/bias": w["bert.pooler.dense.bias"],
       "cls/predictions/transform/dense/kernel": w["cls.predictions.transform.dense.weight"].T,
       "cls/predictions/transform/dense/bias": w["cls.predictions.transform.dense.bias"],
       "cls/predictions/transform/LayerNorm/gamma":
           w["cls.predictions.transform.LayerNorm.weight"],
       "cls/predictions/transform/LayerNorm/beta": w["cls.predictions.transform.LayerNorm.bias"],
       "cls/predictions/output_bias": w["cls.predictions.bias"],
       "cls/seq_relationship/output_weights": w["cls.seq_relationship.weight"],
       "cls/seq_relationship/output_bias": w["cls.seq_relationship.bias"]}
  for i in range(LAYERS):
    t, h = f"bert/encoder/layer_{i}/", f"bert.encoder.layer.{i}."
    for p in ("query", "key", "value"):
      g[f"{t}attention/self/{p}/kernel"] = w[f"{h}attention.self.{p}.weight"].T
      g[f"{t}attention/self/{p}/bias"] = w[f"{h}attention.self.{p}.bias"]
    for ours, theirs in (("attention/output", "attention.output"), ("intermediate",
                                                                    "intermediate"),
                         ("output", "output")):
      g[f"{t}{ours}/dense/kernel"] = w[f"{h}{theirs}.dense.weight"].T
      g[f"{t}{ours}/dense/bias"] = w[f"{h}{theirs}.dense.bias"]
    for ours, theirs in (("attention/output", "attention.output"), ("output", "output")):
      g[f"{t}{ours}/LayerNorm/gamma"] = w[f"{h}{theirs}.LayerNorm.weight"]
      g[f"{t}{ours}/LayerNorm/beta"] = w[f"{h}{theirs}.LayerNorm.bias"]
  return {name: np.ascontiguousarray(x, np.float32) for name, x in g.items()}


def _save_ckpt(prefix, variables):
  """Writes PREFIX.index and PREFIX.data-00000-of-00001 with TensorFlow's SaveV2 (imported
  here: importing TensorFlow takes seconds, which every pytest worker would pay collecting)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  names = sorted(variables)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[variables[n] for n in names])


def _write_release(directory, variables, vocab, config=None):
  """A Google release directory: bert_config.json, vocab.txt, bert_model.ckpt.*."""
  os.makedirs(directory)
  with open(os.path.join(directory, "bert_config.json"), "w") as f:
    json.dump(config or GOOGLE_CONFIG, f)
  with open(os.path.join(directory, "vocab.txt"), "w") as f:
    f.write("".join(t + "\n" for t in vocab))
  _save_ckpt(os.path.join(directory, "bert_model.ckpt"), variables)
  return str(directory)


def _with_training_state(variables):
  """The variables plus global_step and AdamWeightDecayOptimizer's adam_m / adam_v slots."""
  rng = np.random.RandomState(1)
  out = {"global_step": np.array(1000, np.int64), **variables}
  for name, x in variables.items():
    out[f"{name}/adam_m"] = rng.normal(size=x.shape).astype(np.float32)
    out[f"{name}/adam_v"] = rng.uniform(size=x.shape).astype(np.float32)
  return out


UNCASED = SPECIAL + [f"w{i}" for i in range(VOCAB - 5)]
CASED = SPECIAL + [f"W{i}" if i % 2 else f"w{i}" for i in range(VOCAB - 5)]


@pytest.fixture(scope="module")
def model():
  torch.manual_seed(0)
  # transformers reads Google's bert_config.json keys as they are.
  return transformers.BertForPreTraining(transformers.BertConfig(**GOOGLE_CONFIG)).eval()


@pytest.fixture(scope="module")
def variables(model):
  return _google_variables(model)


@pytest.fixture(scope="module")
def release(tmp_path_factory, variables):
  return _write_release(tmp_path_factory.mktemp("google") / "uncased_L-2_H-32_A-4",
                        _with_training_state(variables), UNCASED)


@pytest.fixture(scope="module")
def config():
  return tf_convert.google_config_to_bert_config(GOOGLE_CONFIG)


def _batch():
  """[3, 12] ids, segment pairs (A then B) and padding of different lengths (0 = pad)."""
  rng = np.random.RandomState(0)
  lengths = [12, 9, 5]
  ids = rng.randint(5, VOCAB, (3, 12))
  mask = (np.arange(12)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
  segments = np.zeros_like(ids)
  for row, length in enumerate(lengths):
    segments[row, length // 2:length] = 1
  return ids * mask, segments, mask


def _close(ours, theirs):
  np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), rtol=0, atol=ATOL)


# --- the command line, end to end ---------------------------------------------------------------

def test_cli_converts_with_parity(tmp_path, release, model, capsys):
  out = tmp_path / "out"
  assert cli.main(["--from=tf", f"--src={release}", f"--dst={out}"]) == 0
  printed = capsys.readouterr().out
  assert "converted 46 parameters from " + os.path.join(release, "bert_model.ckpt") in printed
  assert f"ignored {2 * 46 + 1} optimizer variables" in printed
  assert "do_lower_case=true (uncased), inferred from vocab.txt" in printed
  assert "not in the checkpoint" not in printed

  assert (out / "vocab.txt").read_text() == "".join(t + "\n" for t in UNCASED)
  assert json.loads((out / "tokenizer_config.json").read_text()) == {"do_lower_case": True}
  assert tokenization.load_tokenizer(str(out / "vocab.txt")).lowercase
  params, config = hf.load_bertjax_checkpoint(str(out))
  assert config == tf_convert.google_config_to_bert_config(GOOGLE_CONFIG)
  assert (config.num_layers, config.hidden_act, config.layer_norm_eps) == (2, "gelu", 1e-12)

  ids, segments, mask = batch = _batch()
  with torch.no_grad():
    theirs = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                   token_type_ids=torch.tensor(segments), output_hidden_states=True)
    pooled = model.bert(torch.tensor(ids), attention_mask=torch.tensor(mask),
                        token_type_ids=torch.tensor(segments)).pooler_output
  enc = bert.BertEncoder(config).apply({"params": params["bert"]}, *batch, deterministic=True,
                                       output_hidden_states=True)
  assert len(enc.hidden_states) == len(theirs.hidden_states) == LAYERS + 1
  for ours, their in zip(enc.hidden_states, theirs.hidden_states):
    _close(ours, their)
  _close(enc.pooled_output, pooled)
  mlm, nsp = heads.BertForPreTraining(config).apply({"params": params}, *batch,
                                                    deterministic=True)
  assert mlm.shape == (3, 12, config.padded_vocab_size)  # every position, 99 -> 128 columns
  assert (np.asarray(mlm)[..., VOCAB:] == np.finfo(np.float32).min).all()  # never predicted
  _close(mlm[..., :VOCAB], theirs.prediction_logits)
  _close(nsp, theirs.seq_relationship_logits)


@pytest.mark.parametrize("hf_cls,head", [
    (transformers.BertForSequenceClassification, "output_"),  # run_classifier.py, 3 labels
    (transformers.BertForQuestionAnswering, "cls/squad/"),    # run_squad.py
])
def test_cli_converts_fine_tuned_checkpoints_with_their_head(tmp_path, hf_cls, head, capsys):
  """A checkpoint as Google's fine-tuning scripts leave it (model.ckpt-STEP, BertModel's
  variables plus the script's head, Adam slots) converts with its head; logits agree."""
  torch.manual_seed(2)
  num_labels = 3 if head == "output_" else 2  # start, end
  task_model = hf_cls(transformers.BertConfig(**GOOGLE_CONFIG, num_labels=num_labels)).eval()
  pretraining = transformers.BertForPreTraining(transformers.BertConfig(**GOOGLE_CONFIG))
  pretraining.bert.load_state_dict(task_model.bert.state_dict(), strict=False)
  variables = {k: v for k, v in _google_variables(pretraining).items() if k.startswith("bert/")}
  w = {k: v.detach().numpy() for k, v in task_model.state_dict().items()}
  if head == "output_":  # run_classifier.py: [num_labels, hidden] at the root
    variables.update(output_weights=w["classifier.weight"], output_bias=w["classifier.bias"])
  else:  # run_squad.py: [2, hidden] under cls/squad
    variables.update({"cls/squad/output_weights": w["qa_outputs.weight"],
                      "cls/squad/output_bias": w["qa_outputs.bias"]})
  src = tmp_path / "fine_tuned"
  os.makedirs(src)
  (src / "bert_config.json").write_text(json.dumps(GOOGLE_CONFIG))
  (src / "vocab.txt").write_text("".join(t + "\n" for t in UNCASED))
  _save_ckpt(str(src / "model.ckpt-100"), _with_training_state(variables))

  assert cli.main(["--from=tf", f"--src={src}", f"--dst={tmp_path / 'out'}"]) == 0
  assert f"with the task head of {hf_cls.__name__}" in capsys.readouterr().out
  params, config = hf.load_bertjax_checkpoint(str(tmp_path / "out"))
  ids, segments, mask = batch = _batch()
  with torch.no_grad():
    theirs = task_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                        token_type_ids=torch.tensor(segments))
  if head == "output_":
    logits = heads.BertForSequenceClassification(config, 3).apply(
        {"params": params}, *batch, deterministic=True)
    assert logits.shape == (3, 3)
    _close(logits, theirs.logits)
  else:
    start, end = heads.BertForQuestionAnswering(config).apply({"params": params}, *batch,
                                                              deterministic=True)
    _close(start, theirs.start_logits)
    _close(end, theirs.end_logits)


def test_cli_cased_inferred_and_overridden(tmp_path, variables, capsys):
  cased = _write_release(tmp_path / "cased", variables, CASED)
  assert cli.main(["--from=tf", f"--src={cased}", f"--dst={tmp_path / 'a'}"]) == 0
  assert "do_lower_case=false (cased), inferred from vocab.txt" in capsys.readouterr().out
  assert json.loads((tmp_path / "a" / "tokenizer_config.json").read_text()) == {
      "do_lower_case": False}
  assert not tokenization.load_tokenizer(str(tmp_path / "a" / "vocab.txt")).lowercase

  assert cli.main(["--from=tf", f"--src={cased}", f"--dst={tmp_path / 'b'}",
                   "--do_lower_case=true"]) == 0
  printed = capsys.readouterr().out
  assert "do_lower_case=true (uncased), --do_lower_case" in printed
  assert "ignored" not in printed  # no optimizer variables in this checkpoint
  assert tokenization.load_tokenizer(str(tmp_path / "b")).lowercase


@pytest.mark.parametrize("lowercase,vocab", [(None, UNCASED), (False, UNCASED), (None, CASED),
                                             (True, CASED)])
def test_choose_lowercase(tmp_path, config, lowercase, vocab):
  (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
  chosen, source = tf_convert.choose_lowercase(str(tmp_path / "vocab.txt"), lowercase, config)
  assert chosen == (vocab is UNCASED if lowercase is None else lowercase)
  assert source.startswith("inferred" if lowercase is None else "--do_lower_case")
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  if lowercase is None:
    chosen, source = tf_convert.choose_lowercase(str(tmp_path / "vocab.txt"), None, config)
    assert not chosen and source.startswith("do_lower_case in ")


def test_vocab_larger_than_embeddings_is_refused(tmp_path, config):
  (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in UNCASED + ["extra"]))
  with pytest.raises(UserError, match=r"has 100 pieces, more than vocab_size=99"):
    tf_convert.choose_lowercase(str(tmp_path / "vocab.txt"), None, config)


def _refused(tmp_path, src, capsys, *needles):
  """The CLI exits 2 with one error line holding every needle, and writes nothing."""
  dst = tmp_path / "dst"
  assert cli.main(["--from=tf", f"--src={src}", f"--dst={dst}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("convert: error: ") and err.count("\n") == 1
  for needle in needles:
    assert needle in err
  assert not dst.exists()


def test_cli_missing_files(tmp_path, variables, capsys):
  src = _write_release(tmp_path / "a", variables, UNCASED)
  os.remove(os.path.join(src, "bert_model.ckpt.data-00000-of-00001"))
  _refused(tmp_path, src, capsys, "bert_model.ckpt.index has no data file beside it")
  os.remove(os.path.join(src, "bert_model.ckpt.index"))
  _refused(tmp_path, src, capsys, "no bert_model.ckpt.index in", "(.index files: none)")

  src = _write_release(tmp_path / "b", variables, UNCASED)
  os.remove(os.path.join(src, "bert_config.json"))
  _refused(tmp_path, src, capsys, "no bert_config.json in")

  src = _write_release(tmp_path / "c", variables, UNCASED)
  os.remove(os.path.join(src, "vocab.txt"))
  _refused(tmp_path, src, capsys, "no vocab.txt in")


def test_cli_garbled_files(tmp_path, variables, capsys):
  src = _write_release(tmp_path / "a", variables, UNCASED)
  with open(os.path.join(src, "bert_model.ckpt.index"), "wb") as f:
    f.write(b"not a checkpoint" * 8)
  _refused(tmp_path, src, capsys, "bert_model.ckpt could not be read as a TensorFlow checkpoint")

  src = _write_release(tmp_path / "b", variables, UNCASED)
  with open(os.path.join(src, "bert_config.json"), "w") as f:
    f.write("{vocab_size: 99")
  _refused(tmp_path, src, capsys, "bert_config.json is not valid JSON")


def test_cli_unmapped_and_wrong_shape_name_the_google_variables(tmp_path, variables, capsys):
  bad = {**variables,
         "bert/encoder/layer_0/attention/self/gate/kernel": np.zeros((32, 32), np.float32),
         "cls/ner/output_weights": np.zeros((3, 32), np.float32),  # no such head in BERT
         "bert/encoder/layer_1/intermediate/dense/kernel": np.zeros((37, 32), np.float32)}
  src = _write_release(tmp_path / "a", _with_training_state(bad), UNCASED)
  _refused(tmp_path, src, capsys,
           "2 variables match no rule: bert/encoder/layer_0/attention/self/gate/kernel (32, 32), "
           "cls/ner/output_weights (3, 32)",
           "bert/encoder/layer_1/intermediate/dense/kernel (37, 32) does not fit "
           "bert_config.json, which gives (32, 37) (hidden_size, intermediate_size)")


def test_no_tensorflow_says_what_to_install(monkeypatch, release):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` raises ImportError
  with pytest.raises(UserError, match=r"needs TensorFlow; pip install 'bertjax\[tf\]'"):
    tf_convert.load_tf_checkpoint(os.path.join(release, "bert_model.ckpt"))


# --- the table ----------------------------------------------------------------------------------

def test_checkpoint_reads_without_optimizer_variables(release, variables):
  read, ignored = tf_convert.load_tf_checkpoint(os.path.join(release, "bert_model.ckpt"))
  assert sorted(read) == sorted(variables)
  for name in variables:
    np.testing.assert_array_equal(read[name], variables[name])
  assert ignored[0] == "bert/embeddings/LayerNorm/beta/adam_m" and "global_step" in ignored
  assert len(ignored) == 2 * len(variables) + 1


def test_to_hf_names_match_transformers(model, variables, config):
  """Google names map to exactly the tensors transformers' BertForPreTraining holds."""
  state = tf_convert.to_hf_state_dict(variables, config)
  theirs = {k: v.numpy() for k, v in model.state_dict().items()
            if k != "cls.predictions.decoder.weight"}  # tied to the word embeddings
  theirs.pop("cls.predictions.decoder.bias", None)  # tied to cls.predictions.bias
  assert sorted(state) == sorted(theirs)
  for name, x in state.items():
    np.testing.assert_array_equal(x, theirs[name], err_msg=name)


def test_round_trip_google_bertjax_hf(variables, config):
  """Google's 99-row word embeddings and MLM bias gain zero rows up to 128 on import and lose
  them on export: every tensor comes back bitwise, under Hugging Face's names."""
  params, _ = tf_convert.from_tf(variables, config)
  embedding = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert embedding.shape == (config.padded_vocab_size, 32) == (128, 32)
  assert not embedding[VOCAB:].any() and not params["masked_lm"]["output_bias"][VOCAB:].any()
  state = tf_convert.to_hf_state_dict(variables, config)
  back = hf.to_hf(params, config)
  assert sorted(back) == sorted(state)
  for name, x in state.items():
    np.testing.assert_array_equal(back[name], x, err_msg=name)
  np.testing.assert_array_equal(back["bert.embeddings.word_embeddings.weight"],
                                variables["bert/embeddings/word_embeddings"])


def test_bare_encoder_reports_heads_missing(variables, config):
  encoder = {k: v for k, v in variables.items() if k.startswith("bert/")
             and not k.startswith("bert/pooler/")}
  params, report = tf_convert.from_tf(encoder, config)
  assert set(params) == {"bert"}
  assert report.missing == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel",
                            "masked_lm/layer_norm/bias", "masked_lm/layer_norm/scale",
                            "masked_lm/output_bias", "masked_lm/transform/bias",
                            "masked_lm/transform/kernel", "next_sentence/classifier/bias",
                            "next_sentence/classifier/kernel"]


def test_missing_partial_and_extra_layers_are_named(variables, config):
  wrong = {k: v for k, v in variables.items()
           if k not in ("bert/encoder/layer_1/attention/self/key/bias",
                        "cls/seq_relationship/output_bias")}
  wrong["bert/encoder/layer_2/output/dense/bias"] = np.zeros(32, np.float32)
  with pytest.raises(UserError) as e:
    tf_convert.to_hf_state_dict(wrong, config)
  message = str(e.value)
  assert "(3 problems)" in message
  assert ("bert/encoder/layer_2/output/dense/bias is a layer beyond num_hidden_layers=2 of "
          "bert_config.json") in message
  assert "bert/encoder/layer_1/attention/self/key/bias is not in the checkpoint;" in message
  assert ("cls/seq_relationship/output_bias is not in the checkpoint, though other variables "
          "of cls/seq_relationship/ are") in message


@pytest.mark.parametrize("change,named", [
    (dict(hidden_act="relu"), "hidden_act='relu'"),
    (dict(num_attention_heads=5), "num_heads"),
    (dict(type_vocab_size=None), "['type_vocab_size']"),
])
def test_config_errors(change, named):
  google = {k: v for k, v in {**GOOGLE_CONFIG, **change}.items() if v is not None}
  with pytest.raises(UserError, match=re.escape(named)):
    tf_convert.google_config_to_bert_config(google)


def test_wrong_hidden_size_lists_the_first_problems(variables):
  config = tf_convert.google_config_to_bert_config({**GOOGLE_CONFIG, "hidden_size": 16})
  with pytest.raises(UserError, match=r"\(\d\d problems\): bert/embeddings/LayerNorm/beta "
                     r"\(32,\) does not fit bert_config.json, which gives \(16,\) \(hidden_size\);"
                     r".*; and \d\d more\. Check that bert_config.json belongs"):
    tf_convert.to_hf_state_dict(variables, config)
