"""The README's "Pretraining ablations" commands run as written, on a slice of the bundled
corpus (one module-scoped run that every test here reads): the prepared spans are contiguous text
of one document, the No NSP and LTR runs train without NSP (no NSP head, pooler, loss or metric;
bert_config.json saying `causal` for LTR), and fine-tuning from the LTR workdir keeps the causal
mask while the converters refuse the model.
"""
import json
import os
import shlex
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from bertjax import tasks
from bertjax.modeldir import model_files
from bertjax.convert import __main__ as convert_cli
from bertjax.convert import hf
from bertjax.data.finetuning import movie_reviews
from bertjax.data.pretraining import loader, masking, shards
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

from ablations_helpers import CONFIG, jit
from conftest import cpu_env
import warm_python
from test_readme import _section_commands, write_corpus_slice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
  """docs/pretraining.md's "Pretraining ablations" commands run as written in a directory
  holding bertjax/data/corpus/austen.txt (60 chapters of the bundled corpus); returns it."""
  root = write_corpus_slice(tmp_path_factory.mktemp("ablations"))
  commands = _section_commands("Pretraining ablations")
  assert len(commands) == 3, commands
  env = cpu_env(optimized=True)  # the tiny config's sizes: XLA's optimized code repays it
  for command in commands:
    args = shlex.split(command)
    out = warm_python.run([sys.executable, *args[1:]], cwd=root, env=env, timeout=600)
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
  pretrained = finetuning.load_pretrained(tasks.typed(config), "GLUE fine-tuning")
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
