"""The paper's pretraining-task ablations (section 5.1, Table 5): No NSP and the left-to-right LM.

No NSP (`--config.pretraining.nsp=false`): contiguous single-segment spans of one document, the
masked LM alone, no NSP head, pooler, loss or metric. LTR (`--config.pretraining.objective=ltr`):
a causal encoder on every attention path, each real token predicted from those before it by the
tied MLM head, bert_config.json saying `causal`, so that fine-tuning keeps the mask and the
converters refuse the model. The README's commands run here as written, on a slice of the
bundled corpus.
"""
import dataclasses
import functools
import json
import os
import shlex
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from bertjax import model_files, tasks
from bertjax.convert import __main__ as convert_cli
from bertjax.convert import hf, hf_files
from bertjax.data import sources
from bertjax.data.finetuning import movie_reviews
from bertjax.data.pretraining import layout, loader, masking, pairs, preparation, shards
from bertjax.errors import UserError
from bertjax.models import attention, bert, heads
from bertjax.models.config import bert_config
from bertjax.tasks import finetuning, pretraining, pretraining_config, pretraining_data

from test_attention import cudnn_run_by_xla, packed_batch, unpacked_batch
from test_readme import _section_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As tests/test_attention.py: logits O(1), and XLA's quick compile.
CONFIG = bert_config("tiny", vocab_size=101, num_layers=2, max_position_embeddings=64,
                     dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.2,
                     hidden_act="gelu_tanh", causal=True)
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                                   "xla_llvm_disable_expensive_passes": True})


# ----------------------------------------------------------------------------------------------
# Contiguous spans.


def test_contiguous_spans_cut_each_document_and_each_pass_elsewhere():
  documents = [[[1, 2, 3], [4, 5, 6, 7]], [[8]], [[], []], [[9, 10], [11, 12, 13, 14, 15]]]
  spans = list(pairs.iter_contiguous_spans(documents, 7, np.random.default_rng(0)))
  assert [np.concatenate([a, b]).tolist() for a, b, _ in spans] == [
      [1, 2, 3, 4], [5, 6, 7], [8], [9, 10, 11, 12], [13, 14, 15]]
  # Cut into A and B at the sentence boundary inside the span; inside one sentence at a token.
  assert [(a.tolist(), b.tolist()) for a, b, _ in spans[:1] + spans[3:4]] == [
      ([1, 2, 3], [4]), ([9, 10], [11, 12])]
  assert all(len(a) and len(b) for a, b, _ in spans[:2] + spans[3:])
  assert spans[2][0].tolist() == [8] and not len(spans[2][1])  # one token: `[CLS] A [SEP]`
  assert not any(is_random for _, _, is_random in spans)
  # Pass 1 of 3 cuts first at 4 * 1 // 3 = 1, pass 2 at 2: every token once a pass.
  spans = [np.concatenate([a, b]).tolist()
           for a, b, _ in pairs.iter_contiguous_spans(documents, 7, np.random.default_rng(0), 3)]
  assert spans[5:11] == [[1], [2, 3, 4, 5], [6, 7], [8], [9], [10, 11, 12, 13]]
  assert spans[12:14] == [[1, 2], [3, 4, 5, 6]]
  assert sum(map(len, spans)) == 3 * 15
  with pytest.raises(UserError, match="no room"):
    list(pairs.iter_contiguous_spans(documents, 4, np.random.default_rng(0)))


def test_spans_pad_as_one_segment():
  """A span without B (of one token, or any span of data prepared before the spans were cut in
  two) is `[CLS] span [SEP]`, one segment; a left-to-right LM predicts each next token."""
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=20)
  padded = pairs.pad_pairs([(np.array([7, 8, 9]), np.zeros(0, np.int32), False)], 7, special)
  np.testing.assert_array_equal(padded["input_ids"], [[2, 7, 8, 9, 3, 0, 0]])
  np.testing.assert_array_equal(padded["segment_ids"], np.zeros((1, 7)))
  np.testing.assert_array_equal(padded["input_mask"], [[1, 1, 1, 1, 1, 0, 0]])
  record = shards.encode_pair(np.array([7, 8, 9]), np.zeros(0), False, np.dtype(np.uint16))
  decoded = shards.decode_pairs([record], np.dtype(np.uint16), 5, cls=2, sep=3)
  np.testing.assert_array_equal(decoded["input_ids"], [[2, 7, 8, 9, 3]])
  np.testing.assert_array_equal(decoded["input_mask"], [[1, 1, 1, 1, 1]])
  targets = loader.NextTokens(special, seed=0).apply(padded, np.array([0]), None)
  np.testing.assert_array_equal(targets["masked_lm_positions"], [[0, 1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(targets["masked_lm_ids"], [[7, 8, 9, 3, 0, 0]])
  np.testing.assert_array_equal(targets["masked_lm_weights"], [[1, 1, 1, 1, 0, 0]])


# ----------------------------------------------------------------------------------------------
# The README's commands, and what they made.


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
  """The README's "Pretraining ablations" commands run as written in a directory holding
  text/a.txt and text/b.txt (30 chapters of the bundled corpus each); returns that directory."""
  root = tmp_path_factory.mktemp("ablations")
  (root / "text").mkdir()
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:60]
  for name, docs in (("a.txt", documents[:30]), ("b.txt", documents[30:])):
    (root / "text" / name).write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
  commands = _section_commands("Pretraining ablations")
  assert len(commands) == 3, commands
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  for command in commands:
    args = shlex.split(command)
    out = subprocess.run([sys.executable, *args[1:]], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, (command, out.stderr[-3000:])
  return root


def _document_streams(data, split):
  """Each `split` document of prepared data as one token stream (its sentences joined)."""
  info = data.info["documents"][split]
  records = shards.Records([os.path.join(data.directory, n) for n, _ in info], [n for _, n in info])
  return [np.concatenate(shards.decode_document(r, data.dtype))
          for r in records.read(np.arange(len(records)))]


def _contains(stream, span):
  """Whether `span` occurs in `stream` as a contiguous run of tokens."""
  starts = np.flatnonzero(stream[:len(stream) - len(span) + 1] == span[0])
  return any((stream[s:s + len(span)] == span).all() for s in starts)


def test_prepared_spans_are_contiguous_text_of_one_document(readme_runs):
  data = loader.PreparedData(str(readme_runs / "data_ablations"))
  assert data.has_contiguous(128) and data.info["flags"]["contiguous"]
  tok = data.tokenizer()
  special = masking.SpecialTokens.from_tokenizer(tok)
  for split in ("train", "heldout"):
    streams = _document_streams(data, split)
    batches = loader.PairBatches(data, 128, loader.NextTokens(special, 0), batch_size=64,
                                 contiguous=True)
    records = batches.records(split)
    rows = shards.decode_pairs(records.read(np.arange(0, len(records), 97)), data.dtype, 128,
                               special.cls, special.sep)
    lengths = rows["input_mask"].sum(axis=1)
    assert (rows["next_sentence_label"] == 0).all()
    assert (rows["segment_ids"] == 1).any(axis=1).mean() > 0.9  # cut into A and B
    assert (lengths == 128).mean() > 0.6  # most spans fill the row
    for ids, segments, n in zip(rows["input_ids"], rows["segment_ids"], lengths):
      assert ids[0] == special.cls and ids[n - 1] == special.sep
      len_a = int((segments[:n] == 0).sum()) - 2  # [CLS] A [SEP]
      span = np.concatenate([ids[1:1 + len_a], ids[2 + len_a:n - 1]])  # A then B: the text
      assert sum(_contains(s, span) for s in streams) >= 1, (split, tok.decode(span.tolist()))
    # Every token of the documents is in one span of each pass.
    passes = data.flags["dupe_factor"] if split == "train" else 1
    span_tokens = sum(int(np.frombuffer(r, data.dtype, count=2).astype(np.int64).sum())
                      for r in records.read(np.arange(len(records))))
    assert span_tokens == passes * sum(len(s) for s in streams)


def _saved_params(workdir):
  root = os.path.join(workdir, "checkpoints")
  step = max(int(s) for s in os.listdir(root) if s.isdigit())
  state = ocp.PyTreeCheckpointer().restore(os.path.join(root, str(step), "state"))
  return set(traverse_util.flatten_dict(state["params"], sep="/"))


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("run, lm", [("run_no_nsp", "mlm"), ("run_ltr", "next_token")])
def test_ablation_runs_train_without_nsp(readme_runs, run, lm):
  workdir = readme_runs / run
  names = _saved_params(workdir)
  assert names and not [n for n in names if n.startswith(("next_sentence/", "bert/pooler/"))]
  assert "masked_lm/output_bias" in names
  records = _records(workdir)
  eval_record = [r for r in records if r["split"] == "eval"][-1]
  assert not [k for r in records for k in r if "nsp" in k]
  assert eval_record["loss"] == eval_record[f"{lm}_loss"]
  assert eval_record[f"{lm}_perplexity"] == pytest.approx(np.exp(eval_record[f"{lm}_loss"]))
  # 20 steps take the loss well below a uniform guess over the 8000 pieces (ln 8000 = 9.0).
  assert eval_record[f"{lm}_loss"] < np.log(8000) - 1.5, eval_record
  config = json.loads((workdir / model_files.BERT_CONFIG_FILE).read_text())
  assert config["causal"] is (run == "run_ltr")


# ----------------------------------------------------------------------------------------------
# The causal model.


def _lm_logits(config, params, ids, mask):
  """Logits at every position of BertForPreTraining without NSP (the LTR model)."""
  model = heads.BertForPreTraining(config, next_sentence=False)
  return model.apply({"params": params}, ids, jnp.zeros_like(ids), mask,
                     deterministic=True)[0][..., :config.vocab_size]


@functools.cache
def _ltr_params():
  ids = jnp.zeros((1, 8), jnp.int32)
  return nn.unbox(heads.BertForPreTraining(CONFIG, next_sentence=False).init(
      jax.random.key(0), ids, ids, ids, deterministic=True)["params"])


def test_the_output_at_i_does_not_see_later_tokens_on_every_path():
  """Changing the tokens after position i leaves the logits at 0..i unchanged, on the
  reference and xla paths and with the cudnn path's arguments (run by xla); a bidirectional
  model with the same weights sees them."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, CONFIG.vocab_size, (2, 12)).astype(np.int32)
  changed = ids.copy()
  changed[:, 7:] = rng.integers(5, CONFIG.vocab_size, (2, 5))
  mask = np.ones_like(ids)
  mask[1, 10:] = 0  # padding after 10 real tokens
  both = jnp.asarray(np.concatenate([ids, changed])), jnp.asarray(np.concatenate([mask, mask]))
  configs = {path: dataclasses.replace(CONFIG, attention=path) for path in ("reference", "xla")}
  configs["bidirectional"] = dataclasses.replace(CONFIG, causal=False, attention="xla")
  outputs = jit(lambda params, ids, mask: {name: _lm_logits(config, params, ids, mask)
                                           for name, config in configs.items()})(
      _ltr_params(), *both)
  with cudnn_run_by_xla() as seen:
    outputs["cudnn"] = jit(functools.partial(_lm_logits, configs["xla"]))(_ltr_params(), *both)
  assert seen == [["is_causal", "key_value_seq_lengths"]] * CONFIG.num_layers
  real = np.concatenate([mask, mask]).astype(bool)
  for path in ("reference", "xla", "cudnn"):
    before, after = np.split(np.asarray(outputs[path]), 2)
    np.testing.assert_allclose(after[:, :7], before[:, :7], atol=1e-6, err_msg=path)
    # The test can fail: the logits from position 7 on change.
    assert np.abs(after[:, 7:10] - before[:, 7:10]).max(axis=-1).min() > 1e-4, path
    np.testing.assert_allclose(np.asarray(outputs[path])[real],
                               np.asarray(outputs["reference"])[real], atol=2e-5, err_msg=path)
  before, after = np.split(np.asarray(outputs["bidirectional"]), 2)  # sees the later tokens
  assert np.abs(after[:, :7] - before[:, :7]).max() > 1e-3


def test_the_ltr_model_equals_transformers_causal_bert(tmp_path):
  """The LTR model's logits at every real position equal those of transformers'
  BertLMHeadModel with is_decoder=True (a causal BERT with the same tied head) on the same
  weights and a padded batch: the causal mask and the head, against code we did not write."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

  both_ways = dataclasses.replace(CONFIG, causal=False)  # to_hf refuses causal models
  save_file(hf.to_hf(jax.tree.map(np.asarray, _ltr_params()), both_ways),
            str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  hf_config = hf_files.bert_config_to_hf_config(both_ways, ["BertLMHeadModel"])
  (tmp_path / "config.json").write_text(json.dumps({**hf_config, "is_decoder": True}))
  theirs_model = transformers.BertLMHeadModel.from_pretrained(str(tmp_path)).eval()
  rng = np.random.default_rng(1)
  ids = rng.integers(5, CONFIG.vocab_size, (3, 12)).astype(np.int32)
  mask = (np.arange(12)[None, :] < np.array([[12], [9], [5]])).astype(np.int32)
  with torch.no_grad():
    theirs = theirs_model(torch.tensor(ids * mask, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  xla = dataclasses.replace(CONFIG, attention="xla")
  ours = np.asarray(jit(functools.partial(_lm_logits, xla))(
      _ltr_params(), jnp.asarray(ids * mask), jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4 * np.abs(theirs).max())


def test_splash_causal_mask_equals_the_causal_reference_in_the_interpreter():
  batch, seq, heads_, head_dim = 2, 128, 2, 16
  q, k, v = (jax.random.normal(jax.random.key(i), (batch, seq, heads_, head_dim))
             for i in range(3))
  real = np.arange(seq)[None, :] < np.array([[128], [90]])
  mask = attention.AttentionMask(jnp.asarray(real, jnp.int32))

  def reference(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    probs = jax.nn.softmax(jnp.where(mask.dense(causal=True), scores, -np.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

  splash = functools.partial(attention.splash_attention, causal=True, interpret=True)
  out, expected = jit(lambda: (splash(q, k, v, mask), reference(q, k, v)))()
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(expected)[real], atol=1e-5)
  dense = np.asarray(mask.dense(causal=True))[1, 0]
  assert dense[5, :6].all() and not dense[5, 6:].any() and dense[100, :90].all()


def test_next_token_loss_equals_the_loss_by_hand():
  """The LTR task's loss on a fixed example (loader.NextTokens targets, the task's terms) is
  the mean over real positions i < n - 1 of -log softmax(logits_i)[token_{i+1}], computed here
  in numpy from the logits at every position."""
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=CONFIG.vocab_size)
  spans = [(np.array([17, 42, 9, 63, 8]), np.zeros(0, np.int32), False),
           (np.array([77, 5, 31]), np.zeros(0, np.int32), False)]
  batch = pairs.pad_pairs(spans, 9, special)  # [CLS] span [SEP], rows of 7 and 5 tokens
  batch.update(loader.NextTokens(special, 0).apply(batch, np.arange(2), None))
  batch["example_weight"] = np.ones(2, np.float32)
  model = heads.BertForPreTraining(CONFIG, next_sentence=False)
  terms_fn = pretraining.make_terms(baseline_token=42, nsp=False, left_to_right=True)

  @jit
  def task_loss_and_logits(params, batch):
    terms = terms_fn(heads.apply_to_batch(model, params, batch, deterministic=True), batch)
    values, weights = terms["next_token_loss"]
    assert sorted(terms) == ["frequency_baseline_next_token_accuracy", "next_token_accuracy",
                             "next_token_loss"]
    every = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                        batch["input_mask"], deterministic=True)[0]
    return jnp.sum(values * weights) / jnp.sum(weights), every

  loss, logits = task_loss_and_logits(_ltr_params(), batch)
  logits = np.asarray(logits, np.float64)[..., :CONFIG.vocab_size]  # [2, 9, vocab]
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  by_hand = []
  for row, n in enumerate(batch["input_mask"].sum(axis=1)):
    tokens = batch["input_ids"][row]
    by_hand += [-log_probs[row, i, tokens[i + 1]] for i in range(n - 1)]
  assert len(by_hand) == 6 + 4
  assert float(loss) == pytest.approx(np.mean(by_hand), rel=1e-5)


def test_a_causal_model_pools_each_sequences_last_token_packed_or_not():
  ids = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(bert.last_token_positions(jnp.array([[1, 1, 1, 0], [0, 0, 0, 0]])),
                                [2, 0])
  np.testing.assert_array_equal(bert.last_token_positions(ids > 0, ids, 3), [[2, 4, 0], [5, 0, 0]])
  config = dataclasses.replace(CONFIG, attention="xla")
  model = heads.BertForSequenceClassification(config, 3)
  unpacked, (packed, where) = unpacked_batch(), packed_batch()

  @jit
  def logits(batches):
    params = heads.init_from_batch(model, jax.random.key(0), batches[0])
    return [heads.apply_to_batch(model, nn.unbox(params), b, deterministic=True)
            for b in batches]

  expected, packed_logits = logits([unpacked, packed])
  for example, (row, slot) in where.items():
    np.testing.assert_allclose(packed_logits[row, slot], expected[example], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Fine-tuning from a causal model, converting it, and the refusals.


def test_fine_tuning_from_the_ltr_workdir_is_causal_and_conversion_is_refused(readme_runs,
                                                                              tmp_path):
  """configs/glue.py --config.task=sst2 on the bundled movie-review sentences (a slice) from the
  README's LTR workdir: the model is causal, the fine-tuned workdir says so, and neither
  converts to Hugging Face."""
  from bertjax.configs import glue as glue_config  # pylint: disable=import-outside-toplevel
  config = glue_config.get_config()
  config.task, config.init_checkpoint = "sst2", str(readme_runs / "run_ltr")
  config.data.glue_dir = movie_reviews.write_sst2(str(tmp_path / "glue"), num_dev=32,
                                                  num_train=64)
  config.data.max_seq_length = 32
  config.train.update(batch_size=16, eval_batch_size=32, num_train_steps=3, warmup_steps=1,
                      eval_steps=1)
  pretrained = finetuning.load_pretrained(config, "GLUE fine-tuning")
  assert pretrained.bert_config.causal
  model = heads.BertForTokenClassification(pretrained.bert_config, 3)
  ids = np.tile(np.arange(5, 17, dtype=np.int32), (2, 1))
  ids[1, 6:] = 99

  @jit
  def tags(ids):  # [2, 12] -> [2, 12, 3]: the tagger's logits, freshly initialised
    params = model.init(jax.random.key(0), ids, ids * 0, ids * 0 + 1, deterministic=True)
    return model.apply(params, ids, ids * 0, ids * 0 + 1, deterministic=True)

  out = np.asarray(tags(ids))
  np.testing.assert_allclose(out[1, :6], out[0, :6], atol=1e-6)
  assert np.abs(out[1, 6:] - out[0, 6:]).max(axis=-1).min() > 1e-4

  workdir = tmp_path / "sst2"
  result = tasks.run(config, str(workdir))
  assert 0 <= result["accuracy"] <= 1
  assert json.loads((workdir / model_files.BERT_CONFIG_FILE).read_text())["causal"] is True

  for src in (readme_runs / "run_ltr", workdir):
    assert convert_cli.main(["--to=hf", f"--src={src}", f"--dst={tmp_path / 'hf'}"]) == 2
    assert not (tmp_path / "hf").exists()
  with pytest.raises(UserError, match="causal .*cannot be converted"):
    hf.to_hf({}, CONFIG)


def test_ablation_batches_train_both_segment_embeddings(corpus, tmp_path):
  """The No NSP and LTR batches of contiguous spans hold segment ids 0 and 1 (each span cut into
  A and B), so the segment-B row of the token type embeddings gets a gradient from both
  objectives, as BERT's pairs give it; spans of one segment (data prepared before the cut)
  would leave that row untrained for fine-tuning on pairs."""
  text_file, vocab = corpus
  data_dir = str(tmp_path / "data")
  preparation.prepare(layout.Options(input=text_file, vocab=vocab, max_seq_length=(32,),
                                     dupe_factor=1, contiguous=True), data_dir, workers=1,
                      progress=False)
  data = loader.PreparedData(data_dir)
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  for left_to_right in (False, True):
    targets = (loader.NextTokens(special, 0) if left_to_right else
               loader.Masking(special, 0.15, 5, True, 0, None))
    batch, _ = next(loader.PairBatches(data, 32, targets, batch_size=16, threads=1,
                                       contiguous=True).iterate())
    assert (batch["segment_ids"] == 1).any(axis=1).all(), left_to_right
    config = bert_config("tiny", vocab_size=special.vocab_size, num_layers=1,
                         max_position_embeddings=32, dropout_rate=0.0,
                         attention_dropout_rate=0.0, causal=left_to_right)
    model = heads.BertForPreTraining(config, next_sentence=False)
    terms_fn = pretraining.make_terms(baseline_token=5, nsp=False, left_to_right=left_to_right)
    loss_name = "next_token_loss" if left_to_right else "mlm_loss"

    def loss(params, batch):
      values, weights = terms_fn(heads.apply_to_batch(model, params, batch, deterministic=True),
                                 batch)[loss_name]  # pylint: disable=cell-var-from-loop
      return jnp.sum(values * weights) / jnp.sum(weights)

    def segment_rows_grad(params, batch):
      grads = traverse_util.flatten_dict(jax.grad(loss)(params, batch), sep="/")
      [name] = [n for n in grads if "token_type_embeddings" in n]
      return jnp.abs(grads[name]).sum(axis=-1)  # [type_vocab_size]

    params = nn.unbox(heads.init_from_batch(model, jax.random.key(0), batch))
    one_segment = {**batch, "segment_ids": np.zeros_like(batch["segment_ids"])}
    rows_grad = jit(segment_rows_grad)  # one compilation for both batches
    cut, uncut = rows_grad(params, batch), rows_grad(params, one_segment)
    assert cut[0] > 0 and cut[1] > 0, (left_to_right, cut)
    assert uncut[1] == 0, (left_to_right, uncut)  # what the spans without a cut trained


def test_ablation_configs_and_data_that_cannot_work_are_refused(corpus, tmp_path):
  """An unknown objective and packing with either ablation are refused at the config; data
  prepared without --contiguous is refused naming that flag; a left-to-right LM on data with
  static ([MASK]ed) tokens is refused."""
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  text_file, vocab = corpus
  data_dir = str(tmp_path / "data")
  preparation.prepare(layout.Options(input=text_file, vocab=vocab, max_seq_length=(32,),
                                     max_predictions_per_seq=(5,), dupe_factor=1,
                                     static_masks=True), data_dir, workers=1, progress=False)
  data = loader.PreparedData(data_dir)

  def config(**ablation):
    c = tiny.get_config()
    c.data.prepared, c.data.max_seq_length, c.data.max_predictions_per_seq = data_dir, 32, 5
    c.data.dynamic_masking = False
    c.pretraining.update(ablation)
    return c

  with pytest.raises(UserError, match="pretraining.objective='bert'; use mlm .* or ltr"):
    pretraining_config.check_config(config(objective="bert"))
  for ablation in (dict(nsp=False), dict(objective="ltr")):
    packed = config(**ablation)
    packed.data.packing = True
    with pytest.raises(UserError, match="are not packed; set data.packing=false"):
      pretraining_config.check_config(packed)
    with pytest.raises(UserError, match="lacks at 32 tokens; prepare the text with "
                                        "--contiguous=true"):
      pretraining_data.check_prepared(data, config(**ablation))
  pretraining_data.check_prepared(data, config())  # the paper's BERT reads this data
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  with pytest.raises(UserError, match="static masks .* Prepare it without --static_masks"):
    loader.PairBatches(data, 32, loader.NextTokens(special, 0), batch_size=8)
