"""Contrastive training (`config.task="embeddings"`, bertjax.tasks.embeddings) against
sentence-transformers: a run from a sentence-transformers directory follows its
MultipleNegativesRankingLoss training step for step (the same weights, pairs, optimizer and
schedule), ends with the same embeddings and held-out retrieval, and exports a directory
sentence-transformers loads; GradCache's loss and gradients equal its
CachedMultipleNegativesRankingLoss's; on 8 simulated devices (negatives from every device), and with
GradCache, the run equals one device's; SimCSE on the bundled corpus, hard negatives, SigLIP's
loss, Matryoshka and prompts train; bad settings are refused in one line."""
import json
import os
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from bertjax import tasks
from bertjax.configs import embeddings as embeddings_config
from bertjax.data import sources
from bertjax.embedding import embedder, evaluation, st_export
from bertjax.errors import UserError

from conftest import GLUE_VOCAB, ROOT, cpu_env, save_random_bert
import warm_python
from embedding_helpers import TEXTS, WORDS, hf_bert_dir, modernbert_dir, sentence_transformer_dir

STEPS, BATCH, RATE, WARMUP = 6, 16, 2e-3, 2


def _pairs(rng, n, words=WORDS):
  """n (anchor, positive) pairs of random words, each positive sharing words with its anchor
  (and no two positives alike)."""
  rows = []
  for _ in range(n):
    anchor = list(rng.choice(words, size=int(rng.integers(3, 9))))
    positive = anchor[:2] + list(rng.choice(words, size=3))
    rows.append((" ".join(anchor), " ".join(positive)))
  return rows


def _write_tsv(path, rows, header=("anchor", "positive")):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
  return str(path)


def _config(model, train_file, **values):
  config = embeddings_config.get_config()
  config.init_checkpoint = str(model)
  config.data.train_file = train_file
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  for key, value in values.items():
    section, name = key.split("__") if "__" in key else (None, key)
    setattr(config[section] if section else config, name, value)
  return config


def _logged_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return [r["loss"] for r in rows if "loss" in r and r.get("split", "train") == "train"]


def _torch_training(st_dir, pairs):
  """sentence-transformers' MultipleNegativesRankingLoss trained as bertjax's run is: the same
  full batch each step, AdamW (decay off biases and LayerNorm, eps 1e-6), clipped at 1.0,
  linear warmup and decay (transformers' schedule); no dropout. Returns (losses, model)."""
  from sentence_transformers import SentenceTransformer, losses  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  model = SentenceTransformer(st_dir, device="cpu")
  model.eval()  # no dropout (bertjax's run sets it to 0), gradients still flow
  named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
  no_decay = lambda n: n.endswith("bias") or "LayerNorm" in n
  optimizer = torch.optim.AdamW(
      [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": 0.01},
       {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}],
      lr=RATE, betas=(0.9, 0.999), eps=1e-6)
  schedule = transformers.get_linear_schedule_with_warmup(optimizer, WARMUP, STEPS)
  loss_fn = losses.MultipleNegativesRankingLoss(model)
  features = [model.tokenize([p[i] for p in pairs]) for i in (0, 1)]
  out = []
  for _ in range(STEPS):
    loss = loss_fn(features, None)
    out.append(float(loss.detach()))
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for _, p in named], 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
  return out, model


def test_training_follows_sentence_transformers_step_for_step(tmp_path):
  """16 pairs, the whole set a batch: bertjax's loss at each of 6 steps equals
  sentence-transformers' (rel 2e-4), and so do the trained model's embeddings of held-out texts
  and its held-out retrieval (nDCG@10 within 1 point); the workdir exports a directory
  sentence-transformers loads, whose embeddings are bertjax's."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    encoder = hf_bert_dir(str(tmp_path / "hf"))
    sentence_transformer_dir(str(tmp_path / "st"), encoder, ["mean"], max_seq_length=16)
  rng = np.random.default_rng(0)
  pairs, held_out = _pairs(rng, BATCH), _pairs(rng, 12)
  config = _config(tmp_path / "st", _write_tsv(tmp_path / "pairs.tsv", pairs),
                   data__eval_fraction=0.0, train__batch_size=BATCH,
                   train__num_train_steps=STEPS, train__warmup_steps=WARMUP,
                   train__learning_rate=RATE, train__log_every_steps=1,
                   train__checkpoint_every_steps=STEPS)
  workdir = str(tmp_path / "run")
  tasks.run(config, workdir)
  theirs, model = _torch_training(str(tmp_path / "st"), pairs)
  np.testing.assert_allclose(_logged_losses(workdir), theirs, rtol=2e-4)
  assert theirs[-1] < 0.5 * theirs[0]  # it learned

  texts = [t for pair in held_out for t in pair]
  ours = embedder.Embedder.load(workdir).encode(texts)
  with torch.no_grad():
    reference = model.encode(texts, convert_to_numpy=True)
  cosine = np.sum(ours * reference, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(
      reference, axis=-1)
  assert cosine.min() > 0.9999, cosine
  qrels = {i: {i: 1} for i in range(len(held_out))}
  ndcg = [evaluation.retrieval(e[0::2], e[1::2], qrels, ks=(10,))["ndcg_at_10"]
          for e in (ours, reference)]
  assert abs(ndcg[0] - ndcg[1]) < 0.01, ndcg

  exported = str(tmp_path / "exported")
  assert st_export.main([f"--src={workdir}", f"--dst={exported}"]) == 0
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
  loaded = SentenceTransformer(exported, device="cpu").encode(texts, convert_to_numpy=True)
  assert np.abs(loaded - ours).max() < 1e-4


MESH_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from bertjax import run_config
    from bertjax.configs import embeddings as embeddings_config
    from bertjax.tasks import embeddings
    from bertjax.training import train
    model, pairs, root = sys.argv[1:4]
    losses = {}
    for name, devices, chunk in (("one", 1, 0), ("eight", 8, 0), ("grad_cache", 8, 8)):
      config = embeddings_config.get_config()
      config.init_checkpoint, config.data.train_file = model, pairs
      config.embedding.pooling, config.embedding.grad_cache_chunk = "mean", chunk
      config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
      config.data.eval_fraction = 0.0
      config.train.batch_size, config.train.num_train_steps = 16, 3
      config.train.learning_rate, config.train.log_every_steps = 1e-3, 1
      config = run_config.typed(config, run_config.EmbeddingsRun)
      context = train.run_context(config, jax.devices()[:devices])
      workdir = f"{root}/{name}"
      train.train_and_evaluate(config, workdir, embeddings.make_task(config, workdir, context),
                               context)
      with open(f"{workdir}/metrics.jsonl") as f:
        losses[name] = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    print(json.dumps(losses))
""")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
  """save_random_bert's smallest (one-layer H16) BERT with GLUE_VOCAB: the cheapest model a run
  starts from (the docs' 100 SimCSE steps, 8 simulated devices)."""
  return save_random_bert(tmp_path_factory.mktemp("model"), GLUE_VOCAB, smallest=True)


def test_eight_devices_and_grad_cache_equal_one_device(tmp_path, small_model):
  """3 steps of a batch of 16 on 8 simulated devices (each anchor against all 16 positives,
  every device's), and on 8 with GradCache chunks of 8, give one device's losses (1e-5)."""
  model = small_model
  pairs = _write_tsv(tmp_path / "pairs.tsv", _pairs(np.random.default_rng(1), 48,
                                                    GLUE_VOCAB[5:]))
  out = warm_python.run([sys.executable, "-c", MESH_SCRIPT, model, pairs, str(tmp_path)],
                        env=cpu_env(8), cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  losses = json.loads(out.stdout.strip().splitlines()[-1])
  assert len(losses["one"]) == 3
  np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
  np.testing.assert_allclose(losses["grad_cache"], losses["one"], rtol=1e-5)


def test_simcse_hard_negatives_sigmoid_matryoshka_and_prompts(tmp_path):
  """Unsupervised SimCSE on a text file of the bundled corpus's first 64 sentences (dropout the
  noise: the two copies differ; the docs' command below trains on the whole corpus), and JSONL
  triplets with SigLIP's loss (its scale and bias trained), Matryoshka dimensions and prompts:
  each trains, evaluates and leaves a workdir bertjax.embed reads."""
  model = save_random_bert(tmp_path / "model", GLUE_VOCAB)
  sentences = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS) for s in doc][:64]
  (tmp_path / "sentences.txt").write_text("".join(s + "\n" for s in sentences))
  config = embeddings_config.get_config("simcse")
  config.init_checkpoint, config.embedding.pooling = model, "cls"
  config.data.train_file = str(tmp_path / "sentences.txt")
  config.train.batch_size, config.train.num_train_steps = 8, 2
  simcse = str(tmp_path / "simcse")
  tasks.run(config, simcse)
  assert _logged_losses(simcse)[-1] > 0.0  # dropout: a copy is not trivially itself
  assert embedder.Embedder.load(simcse).encode(["good words"]).shape == (1, 64)

  rng = np.random.default_rng(2)
  rows = [(a, p, _pairs(rng, 1, GLUE_VOCAB[5:])[0][0])
          for a, p in _pairs(rng, 40, GLUE_VOCAB[5:])]
  path = tmp_path / "triplets.jsonl"
  path.write_text("".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n"
                          for a, p, n in rows))
  config = _config(model, str(path), train__batch_size=8, train__num_train_steps=4,
                   embedding__pooling="mean", embedding__loss="sigmoid",
                   embedding__matryoshka_dims="64,16", data__eval_fraction=0.2,
                   data__query_prompt="query: ", data__document_prompt="passage: ",
                   train__learning_rate=1e-3)
  workdir = str(tmp_path / "triplets")
  metrics = tasks.run(config, workdir)
  assert 0.0 <= metrics["ndcg_at_10"] <= 1.0 and metrics["loss"] > 0.0
  with open(os.path.join(workdir, "eval_results.json"), encoding="utf-8") as f:
    assert json.load(f)["main_metric"] == "ndcg_at_10"
  loaded = embedder.Embedder.load(workdir)
  assert loaded.recipe.prompts == {"query": "query: ", "document": "passage: "}


def test_modernbert_from_a_hugging_face_directory(tmp_path):
  """A transformers ModernBERT directory (byte-level BPE tokenizer.json) trains with mean
  pooling; its workdir embeds what the export embeds in sentence-transformers."""
  encoder = modernbert_dir(str(tmp_path / "hf"))
  rng = np.random.default_rng(4)
  pairs = [(TEXTS[i % 10], " ".join(rng.choice(WORDS, size=4))) for i in range(24)]
  config = _config(encoder, _write_tsv(tmp_path / "pairs.tsv", pairs), train__batch_size=8,
                   train__num_train_steps=3, embedding__pooling="mean",
                   data__eval_fraction=0.0, embedding__mask_duplicates=True)
  workdir = str(tmp_path / "run")
  tasks.run(config, workdir)
  ours = embedder.Embedder.load(workdir).encode(TEXTS)
  assert st_export.main([f"--src={workdir}", f"--dst={tmp_path / 'st'}"]) == 0
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
  theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
  assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize("rows, values, message", [
    ([("only one column",)], {}, "has one text"),
    ([("a", "  ")], {}, "empty text"),
    ([("a", "b"), ("a", "b", "c")], {}, "same number of hard negatives"),
    ([("a", "b")], {"embedding__pooling": ""}, "says nothing of pooling"),
    ([("a", "b")], {"embedding__matryoshka_dims": "128,64"}, "128, but the model's embeddings"),
    ([("a", "b")], {"embedding__grad_cache_chunk": 3}, "grad_cache_chunk=3 must divide"),
    ([("a", "b")], {"train__grad_accum_steps": 2}, "grad_accum_steps splits the batch"),
    ([("a", "b")], {"embedding__loss": "triplet"}, "embedding.loss='triplet'"),
])
def test_bad_settings_are_refused(tmp_path, small_model, rows, values, message):
  values = {"embedding__pooling": "mean", **values}
  config = _config(small_model, _write_tsv(tmp_path / "pairs.tsv", rows, header=()), **values)
  with pytest.raises(UserError, match=message):
    tasks.run(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_the_command_refuses_in_one_line(tmp_path, small_model):
  """Through `python -m bertjax.main`: one line, exit 2, no traceback."""
  pairs = _write_tsv(tmp_path / "pairs.tsv", [("one column",)], header=())
  out = warm_python.run(
      [sys.executable, "-m", "bertjax.main", "--config=bertjax/configs/embeddings.py",
       f"--workdir={tmp_path / 'run'}", f"--config.init_checkpoint={small_model}",
       "--config.embedding.pooling=mean", f"--config.data.train_file={pairs}"],
      env=cpu_env(), cwd=ROOT, timeout=300)
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert "has one text" in out.stderr.strip().splitlines()[-1]


def test_module_files_are_what_sentence_transformers_reads(tmp_path):
  """st_export.module_files (what a contrastive workdir holds) reads back as its recipe."""
  from bertjax.embedding import st_files  # pylint: disable=import-outside-toplevel
  for name, text in st_export.module_files(64, ("mean", "max"), normalize=True,
                                           max_seq_length=40, include_prompt=False,
                                           prompts={"query": "q: "}).items():
    os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
    (tmp_path / name).write_text(text)
  recipe = st_files.read_recipe(str(tmp_path))
  assert (recipe.pooling, recipe.normalize, recipe.max_seq_length, recipe.include_prompt,
          recipe.prompts) == (("max", "mean"), True, 40, False, {"query": "q: "})


def test_the_docs_commands_run_as_written(tmp_path, monkeypatch, small_model):
  """docs/embeddings.md's "Train embeddings" commands, as written, in a directory holding
  ST_DIR (a sentence-transformers model), PAIRS.tsv, MODEL_DIR (a random bertjax model) and
  texts.txt: the pairs run, 100 SimCSE steps on the bundled corpus, embedding with the pairs
  run's workdir and its export (which sentence-transformers loads, embedding alike)."""
  import shlex  # pylint: disable=import-outside-toplevel
  import docs_text  # pylint: disable=import-outside-toplevel
  from bertjax import embed  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    sentence_transformer_dir("ST_DIR", hf_bert_dir(str(tmp_path / "hf")), ["mean"])
  rng = np.random.default_rng(3)
  _write_tsv(tmp_path / "PAIRS.tsv", _pairs(rng, 80))
  os.symlink(small_model, "MODEL_DIR")
  texts = [" ".join(pair) for pair in _pairs(rng, 5)]
  (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
  commands = docs_text.bash_commands(docs_text.section("Train embeddings"))
  assert len(commands) == 4
  for command in commands:
    args = shlex.split(command)
    if args[2] == "bertjax.main":  # absl flags: a process of its own
      out = warm_python.run([sys.executable, *args[1:]], env=cpu_env(), timeout=600)
      assert out.returncode == 0, (command, out.stderr[-2000:])
    else:
      module = {"bertjax.embed": embed, "bertjax.embedding.st_export": st_export}[args[2]]
      assert module.main(args[3:]) == 0, command
  assert _logged_losses("SIMCSE") and os.path.isfile("EMB/eval_results.json")
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
  exported = SentenceTransformer("EMB_ST", device="cpu").encode(texts, convert_to_numpy=True)
  assert np.abs(exported - np.load("trained.npy")).max() < 1e-4


def test_the_training_benchmark_runs_both_engines(tmp_path):
  """bertjax.tools.embed_bench train on a tiny model: both engines train and give a rate, whole
  and with GradCache (sentence-transformers' CachedMultipleNegativesRankingLoss)."""
  from bertjax.tools import embed_bench  # pylint: disable=import-outside-toplevel
  assert embed_bench.main(["prepare", f"--dir={tmp_path}", "--sentences=40", "--size=tiny"]) == 0
  for engine in ("bertjax", "sentence-transformers"):
    assert embed_bench.train(str(tmp_path), engine, batch_size=4, steps=3) > 0
    assert embed_bench.train(str(tmp_path), engine, batch_size=4, steps=2, chunk=2) > 0


def test_grad_cache_equals_cached_multiple_negatives_ranking_loss(tmp_path):
  """GradCache (chunks of 2 of a batch of 8, with a hard negative) against
  sentence-transformers' CachedMultipleNegativesRankingLoss (mini-batches of 2) on the same
  weights: the loss and the gradients of the word embeddings, a query kernel and the last
  feed-forward output kernel within 1e-5."""
  import jax  # pylint: disable=import-outside-toplevel
  from sentence_transformers import SentenceTransformer, losses as st_losses  # pylint: disable=import-outside-toplevel
  from bertjax.embedding import grad_cache, losses  # pylint: disable=import-outside-toplevel
  from bertjax.embedding.model import BertForEmbedding  # pylint: disable=import-outside-toplevel
  from bertjax.models import heads  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    sentence_transformer_dir(str(tmp_path / "st"), hf_bert_dir(str(tmp_path / "hf")),
                             ["mean"], max_seq_length=16)
  rng = np.random.default_rng(5)
  rows = [(a, p, _pairs(rng, 1)[0][1]) for a, p in _pairs(rng, 8)]
  model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
  model.eval()
  loss_fn = st_losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=2)
  theirs = loss_fn([model.tokenize([r[i] for r in rows]) for i in range(3)], None)
  theirs.backward()
  grads = {name.split("embeddings.", 1)[-1] if "word_embeddings" in name else
           name[name.index("encoder."):] if "encoder." in name else name: p.grad
           for name, p in model.named_parameters()}

  ours_model = embedder.Embedder.load(str(tmp_path / "st"))
  network = BertForEmbedding(ours_model.config, pooling=("mean",))
  features = {"input_ids": [], "input_mask": []}
  for row in rows:
    encoded = [ours_model.tokenizer.encode(t) for t in row]
    ids = np.zeros((3, 16), np.int32)
    for j, tokens in enumerate(encoded):
      ids[j, :len(tokens)] = tokens
    features["input_ids"].append(ids)
    features["input_mask"].append((ids > 0).astype(np.int32))
  inputs = {k: np.stack(v) for k, v in features.items()}
  encoder = {k: v for k, v in ours_model.weights["encoder"].items() if k != "pooler"}
  params = {"bert": jax.tree.map(np.asarray, encoder)}

  def embed(p, chunk, key):
    return heads.apply_to_batch(network, p, chunk, deterministic=True)["embeddings"]

  def mean_loss(_, e):
    return losses.in_batch_softmax(e[:, 0], [e[:, 1], e[:, 2]])

  value, ours = grad_cache.value_and_grad(embed, mean_loss, params, inputs,
                                          jax.random.key(0), 2)
  assert float(value) == pytest.approx(float(theirs.detach()), rel=1e-5)
  bert = ours["bert"]
  pairs = [(bert["embeddings"]["word_embeddings"]["embedding"][:100],
            grads["word_embeddings.weight"]),
           (bert["encoder"]["layer_0"]["attention"]["query"]["kernel"].T,
            grads["encoder.layer.0.attention.self.query.weight"]),
           (bert["encoder"]["layer_1"]["feed_forward"]["output"]["kernel"].T,
            grads["encoder.layer.1.output.dense.weight"])]
  for a, b in pairs:
    np.testing.assert_allclose(np.asarray(a), b.numpy(), atol=1e-5)
  assert max(float(np.abs(b.numpy()).max()) for _, b in pairs) > 1e-3  # real gradients
