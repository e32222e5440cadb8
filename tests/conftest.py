"""Fixtures shared by several test modules: a random BERT directory, a tiny TFDS text dataset,
GLUE-format files; the session's XLA flags (quick compiles), glibc setting (huge pages) and one
XLA compilation cache; the workers' order of modules and their garbage collector's settings.

Many tests run the same tiny models, in this process and in the `python -m bertjax.main`
processes they start (which inherit the environment), so the session shares JAX's persistent
compilation cache in a temporary directory: each program is compiled once per session. The
directory is new every session, so nothing compiled by another version of the code is read.
"""
import atexit
import csv
import gc
import hashlib
import os
import shutil
import tempfile

import flax.linen as nn
import jax
import numpy as np
import pytest

# XLA's CPU backend compiles for speed of compiling in every process of the session (this one,
# and those it starts, which inherit the environment): most tests run tiny models, so compiling
# is most of their time. Without LLVM's optimizations, with the elemental emitters instead of the
# MLIR fusion emitters (half the compile time of a tiny train step: 1.25 s against 0.66 s), and in
# one piece (the other worker has the other core), and without the HLO verifier that XLA runs
# after its passes to check its own work (a tenth of a tiny train step's compile). The code
# computes the same functions. A flag the environment already sets keeps its value.
_FAST_COMPILE = {"--xla_backend_optimization_level": "0", "--xla_cpu_use_fusion_emitters": "false",
                 "--xla_cpu_parallel_codegen_split_count": "1",
                 "--xla_disable_hlo_passes": "hlo-verifier"}
# (the flags as the session was started with them, kept for the processes that xdist starts;
# a process that imports this module keeps the flags it was started with, its device count too)
_GIVEN_FLAGS = os.environ.setdefault("BERTJAX_TESTS_GIVEN_XLA_FLAGS",
                                     os.environ.get("XLA_FLAGS", ""))
_FLAGS = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(filter(None, [_FLAGS] + [
    f"{flag}={value}" for flag, value in _FAST_COMPILE.items() if flag not in _FLAGS]))

# glibc's malloc backs large blocks with transparent huge pages (2 MiB) in this process's
# children. XLA's CPU runtime allocates each execution's temporary buffer afresh (254 MiB for a
# step of command 1's tiny BERT), and glibc maps it and unmaps it again every time: with 4 KiB
# pages each step took some 60,000 page faults, a sixth of a tiny pretraining run's CPU seconds
# (50 steps of command 1's model: 3.5 million faults, 9 s of 48 in the kernel; with huge pages
# 0.17 million, 4 s of 42). Only where memory comes from changes; a setting given is kept.
if "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
  os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"),
                                                        "glibc.malloc.hugetlb=1"]))

# Every program compiled in the session is kept (not only those over JAX's 1 s and 0 bytes), so
# the next process or test that builds the same program reads it instead of compiling it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix="bertjax_tests_xla_cache_")
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
for _option, _variable in (("jax_persistent_cache_min_compile_time_secs",
                            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"),
                           ("jax_persistent_cache_min_entry_size_bytes",
                            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")):
  os.environ.setdefault(_variable, "0")
  jax.config.update(_option, float(os.environ[_variable]) if "secs" in _option
                    else int(os.environ[_variable]))

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.data import sources
from bertjax.models import heads
from bertjax.models.config import BertConfig, bert_config
import warm_python

# How `pytest -n N` shares the suite (about 1000 tests) among its workers. xdist's default (load)
# deals tests out one by one, so a module's tests land on both workers and each worker builds the
# module's fixtures (test_colab's notebook run, test_faults_workdir's killed run, a module's
# prepared corpus or fine-tuned model) again; and a long test dealt out last runs alone at the end.
# Here each module goes whole to one worker (xdist's loadfile), and the modules are handed out
# longest first (longest processing time first: the short ones fill the gaps at the end). COSTS:
# a module's seconds in its worker, its tests' with the processes they wait for (2026-12-02, a
# pytest hook's clock around each test of the whole suite under -n 2), for the modules over
# 12 s; only their order matters, and a module not listed runs after them, in collection order.
# `--dist` given on the command line is kept as given.
COSTS = {
    "test_divergence.py": 148,
    "test_pretraining.py": 137,
    "test_embeddings_training.py": 91,
    "test_transfer_study.py": 76,
    "test_multihost.py": 76,
    "test_colab.py": 71,
    "test_pretraining_parity.py": 70,
    "test_audit.py": 68,
    "test_modernbert_finetuning.py": 61,
    "test_docs.py": 55,
    "test_modernbert_paths.py": 54,
    "test_faults_workdir.py": 54,
    "test_modernbert_pretraining.py": 48,
    "test_train.py": 43,
    "test_fast_recipe.py": 43,
    "test_readme.py": 40,
    "test_prng.py": 39,
    "test_ablations_readme_runs.py": 36,
    "test_feature_based.py": 34,
    "test_bench.py": 32,
    "test_fp8.py": 28,
    "test_glue.py": 27,
    "test_accelerator_report.py": 27,
    "test_embed.py": 27,
    "test_faults_checkpoint.py": 25,
    "test_ab.py": 24,
    "test_convert_modernbert_parity.py": 23,
    "test_models.py": 21,
    "test_bilstm.py": 20,
    "test_faults_vocab.py": 19,
    "test_sweep.py": 19,
    "test_finetuning_packing.py": 18,
    "test_squad_finetuning.py": 17,
    "test_packing.py": 17,
    "test_warm_python.py": 16,
    "test_convert_hf_tokenizer.py": 16,
    "test_finetuning.py": 16,
    "test_attention_shards.py": 16,
    "test_prepare_beam.py": 15,
    "test_curves.py": 14,
    "test_distributed.py": 13,
    "test_grad_cache.py": 13,
    "test_finetune_bench.py": 13,
}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Python's garbage collector in a worker: tracing a model allocates millions of short-lived
# objects, and with the default thresholds (700, 10, 10) a worker that has run a few modules
# spent about 7% of its CPU in collections, most of it in full ones over everything its earlier
# tests left alive (test_train, test_glue and test_finetuning: 6.6 s of 90, against 1.4 s with
# this). So the young generation is collected every 50,000 allocations (warm_python's
# GC_THRESHOLDS, its commands' too), and at each new module what is still alive is collected
# once and frozen (gc.freeze: never scanned again; pytest_runtest_setup). Only cycles that are
# garbage wait longer to be freed; what a test computes is unchanged.
gc.set_threshold(*warm_python.GC_THRESHOLDS)


def cpu_env(num_devices: int = 1, optimized: bool = False, **variables: str) -> dict[str, str]:
  """The environment of a process a test starts: this one's (the session's XLA flags and
  compilation cache), on the CPU with `num_devices` simulated devices, the checkout first on
  PYTHONPATH, then `variables`. optimized=True: without the session's quick-compile flags, for
  a process that runs many steps at the tiny config's own sizes, where optimized code repays
  its compile (README command 1's model: 50 steps take 25 s optimized, 35 s quickly compiled)."""
  flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
           if not flag.startswith("--xla_force_host_platform_device_count")
           and not (optimized and flag.split("=")[0] in _FAST_COMPILE
                    and flag.split("=")[0] not in _GIVEN_FLAGS)]
  flags.append(f"--xla_force_host_platform_device_count={num_devices}")
  path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags), "PYTHONPATH": path,
          **variables}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
  given = any(arg == "-d" or arg.startswith("--dist") for arg in config.invocation_params.args)
  if getattr(config.option, "dist", "no") == "load" and not given:
    config.option.dist = "loadfile"
    config.option.loadscopereorder = False  # COSTS' order, not the number of tests


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """At a module's first test: what earlier modules left alive, collected once and frozen."""
  if item.path != getattr(pytest_runtest_setup, "module", None):
    pytest_runtest_setup.module = item.path
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items):
  """Modules by COSTS, longest first; a module's tests stay together, in file order."""
  items.sort(key=lambda item: -COSTS.get(item.path.name, 0))  # stable


def write_chapters(directory, num_documents: int, vocab_size: int = 600) -> tuple[str, str]:
  """(DIRECTORY/chapters.txt: the first `num_documents` chapters of the bundled corpus in
  google-research/bert's format, DIRECTORY/vocab.model: a sentencepiece model of them)."""
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:num_documents]
  text_file = os.path.join(directory, "chapters.txt")
  with open(text_file, "w") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  vocab = os.path.join(directory, "vocab.model")
  tokenization.load_or_train_sentencepiece(
      lambda: (s for doc in documents for s in doc), vocab, vocab_size)
  return text_file, vocab


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """(text file with 40 chapters of the bundled corpus, a sentencepiece model of it): the
  pretraining runs' text, shared (read only) by every module that does not define its own."""
  return write_chapters(str(tmp_path_factory.mktemp("corpus")), 40)


def tree_digest(path) -> str:
  """Names of the directories and names and bytes of the files under `path` (to show that
  nothing there changed)."""
  digest = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    digest.update(os.path.relpath(root, path).encode() + b"/")
    for name in sorted(files):
      full = os.path.join(root, name)
      digest.update(os.path.relpath(full, path).encode())
      with open(full, "rb") as f:
        digest.update(f.read())
  return digest.hexdigest()


def save_random_bert(directory, vocab: list[str], max_position_embeddings: int = 64,
                     architecture: str = "bert", smallest: bool = False) -> str:
  """A random (untrained) small BERT (L2 H64 A2, 64 positions unless told) with WordPiece
  vocabulary `vocab`, saved as a bertjax checkpoint directory (DIRECTORY/bert, with
  bert_config.json and vocab.txt), the form `--config.init_checkpoint` takes. Returns its
  path. architecture="modernbert": a ModernBERT (L4 H64 A2, GeGLU 96, layers 0 and 3 global,
  1 and 2 local with a window of 8 tokens) instead, as its pretraining saves it (no NSP).
  smallest=True: a BERT of one layer (H16 A2, feed-forward 32), for tests where the model's
  size is beside the point and compiling its steps is most of their time."""
  os.makedirs(directory, exist_ok=True)
  vocab_file = os.path.join(directory, "vocab.txt")
  with open(vocab_file, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in vocab))
  hidden, layers = (16, 1) if smallest else (64, 2)
  config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=layers, num_heads=2,
                      intermediate_size=2 * hidden, max_position_embeddings=max_position_embeddings)
  if architecture == "modernbert":
    config = bert_config("tiny", "modernbert", vocab_size=len(vocab), hidden_size=64,
                         num_layers=4, num_heads=2, intermediate_size=96, local_attention=8,
                         max_position_embeddings=max_position_embeddings)
  ids = np.zeros((1, 4), np.int32)
  params = heads.BertForPreTraining(config, next_sentence=not config.is_modernbert).init(
      jax.random.PRNGKey(0), ids, ids, ids, deterministic=True)["params"]
  out = os.path.join(directory, "bert")
  model_files.save_model_dir(out, jax.tree.map(np.asarray, nn.unbox(params)), config,
                             [vocab_file])
  return out


@pytest.fixture(scope="session")
def random_bert():
  """save_random_bert, for a module's model_dir fixture."""
  return save_random_bert


# GLUE-format files whose labels follow from the words (tests/test_glue.py, tests/test_sweep.py),
# and the vocabulary of a model that reads them.
GLUE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
GLUE_FILLER = [f"word{i}" for i in range(40)]
GLUE_VOCAB = GLUE_SPECIALS + ["good", "bad", "great", "awful"] + GLUE_FILLER


def glue_sentences(rng, n):
  """(sentence, number of positive words - negative words) pairs."""
  rows = []
  for _ in range(n):
    words = list(rng.choice(GLUE_FILLER, size=rng.integers(3, 8)))
    sentiment = rng.choice(["good", "bad", "great", "awful"], size=rng.integers(1, 3))
    for word in sentiment:
      words.insert(rng.integers(0, len(words) + 1), word)
    score = sum(1 if w in ("good", "great") else -1 for w in sentiment)
    rows.append((" ".join(words), score))
  return rows


def write_tsv(path, header, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory):
  """SST-2 (label 1 when the sentence is positive on balance) and STS-B (score from the words of
  both sentences) in GLUE's download layout, shared (read only)."""
  directory = tmp_path_factory.mktemp("glue")
  rng = np.random.default_rng(0)
  sst = {split: [(s, score) for s, score in glue_sentences(rng, n) if score != 0]
         for split, n in (("train", 480), ("dev", 96), ("test", 40))}
  for split in ("train", "dev"):
    write_tsv(directory / "SST-2" / f"{split}.tsv", ["sentence", "label"],
              [(s, int(score > 0)) for s, score in sst[split]])
  write_tsv(directory / "SST-2" / "test.tsv", ["index", "sentence"],
            [(i, s) for i, (s, _) in enumerate(sst["test"])])
  header = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
            "sentence1", "sentence2", "score"]
  for split, n in (("train", 320), ("dev", 64)):
    pairs = zip(glue_sentences(rng, n), glue_sentences(rng, n))
    write_tsv(directory / "STS-B" / f"{split}.tsv", header,
              [(i, "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b,
                f"{2.5 + 0.6 * (sa + sb):.3f}")
               for i, ((a, sa), (b, sb)) in enumerate(pairs)])
  return str(directory)


def _tiny_builder_class():
  import tensorflow_datasets as tfds

  class BertjaxTinyText(tfds.core.GeneratorBasedBuilder):
    """Three documents; one of them empty."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager  # nothing is downloaded
      return {"train": self._generate_examples(), "test": self._generate_examples(1)}

    def _generate_examples(self, n=3):
      texts = ["Mr. Darcy bowed. She smiled!", "First line.\nSecond line. Third one.", "  "]
      for i in range(n):
        yield i, {"text": texts[i], "title": f"doc {i}"}

  return BertjaxTinyText


@pytest.fixture(scope="session")
def tiny_tfds(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  builder = _tiny_builder_class()(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  return data_dir
