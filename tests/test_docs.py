"""The README and the pages under docs/: every command of their ```bash blocks is one that a
test runs or parses (COVERED says which); the commands that no other test runs run here as
written: the short first run of docs/pretraining.md (and docs/reliability.md's replay of its
metrics), feature extraction from a 2-layer model, and the conversions of docs/weights.md.
Every page links back to the README, and the README links to every page."""
import json
import os
import re
import shlex
import shutil
import sys

import torch
import transformers

import docs_text
from conftest import GLUE_VOCAB, cpu_env
import warm_python

ROOT = docs_text.ROOT
ENV = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")

# (page, a piece of the command that picks it): the test that runs or parses it, as
# tests/FILE.py::NAME. "parses": paths of a cluster, a GPU or hours of work; the test checks
# every flag and --config field of the command as written.
PARSE = "test_readme.py::test_every_readme_command_names_real_flags_and_config_fields"
COVERED = {
    ("README.md", "pip install -e . && python -m bertjax.main"):
        "test_docs.py::test_the_short_first_run_runs_as_written",  # command 1, 50 steps
    ("README.md", "pytest -q -n 2 tests"): "test_docs.py::test_command_2_is_what_ci_runs",
    ("docs/pretraining.md", "--workdir=/tmp/bertjax_tiny_short"):
        "test_docs.py::test_the_short_first_run_runs_as_written",
    ("docs/reliability.md", "bertjax.tools.divergence_margins"):
        "test_docs.py::test_the_short_first_run_runs_as_written",
    ("docs/pretraining.md", "--output_dir=data_128_512"):
        "test_readme.py::test_pretraining_data_commands_run_as_written",
    ("docs/pretraining.md", "--workdir=run_prepared"):
        "test_readme.py::test_pretraining_data_commands_run_as_written",
    ("docs/pretraining.md", "--output_dir=data_static"):
        "test_readme.py::test_pretraining_data_commands_run_as_written",
    ("docs/pretraining.md", "--workdir=run_static"):
        "test_readme.py::test_pretraining_data_commands_run_as_written",
    ("docs/pretraining.md", "--output_dir=data_ablations"):
        "test_ablations_readme_runs.py::test_ablation_runs_train_without_nsp",
    ("docs/pretraining.md", "--workdir=run_no_nsp"):
        "test_ablations_readme_runs.py::test_ablation_runs_train_without_nsp",
    ("docs/pretraining.md", "--workdir=run_ltr"):
        "test_ablations_readme_runs.py::test_ablation_runs_train_without_nsp",
    ("docs/pretraining.md", "bertjax.tools.real_text_demo"):
        "test_real_text_demo.py::test_the_readme_command_parses",
    ("docs/pretraining.md", "bertjax.tools.transfer_study"):
        "test_transfer_study.py::test_the_readme_command_parses",
    ("docs/pretraining.md", "--output_dir=/mnt/bucket/bert_data"): PARSE,
    ("docs/pretraining.md", "--workdir=/mnt/bucket/bert_base "): PARSE,
    ("docs/finetuning.md", "--config=configs/glue.py --workdir=DIR"): PARSE,
    ("docs/finetuning.md", "--config=configs/squad.py"): PARSE,
    ("docs/finetuning.md", "--config=configs/ner.py --workdir"): PARSE,
    ("docs/finetuning.md", "--config=configs/ner.py:feature_based"):
        "test_feature_based.py::test_feature_based_ner_learns_with_the_encoder_unchanged",
    ("docs/finetuning.md", "--config=configs/swag.py"): PARSE,
    ("docs/finetuning.md", "bertjax.tools.sweep"):
        "test_sweep.py::test_the_readme_command_resumes_picks_by_the_main_metric_and_skips_what_is_done",
    ("docs/finetuning.md", "--config=configs/features.py"):
        "test_docs.py::test_feature_extraction_runs_as_written_on_a_two_layer_model",
    ("docs/modernbert.md", "--workdir=run_modernbert"):
        "test_modernbert_pretraining.py::test_readme_modernbert_commands_run_as_written",
    ("docs/modernbert.md", "--src=run_modernbert"):
        "test_modernbert_pretraining.py::test_readme_modernbert_commands_run_as_written",
    ("docs/accelerators.md", "bertjax.tools.bench"): PARSE,
    ("docs/accelerators.md", "--config=configs/base.py:fast"): PARSE,
    ("docs/accelerators.md", "--config=configs/large.py --workdir"): PARSE,
    ("docs/accelerators.md", "audit --config=configs/tiny.py"):
        "test_audit.py::test_the_readme_audit_command_runs_as_written",
    # libtpu's environment (minutes of installing) and the TPU compiles (minutes each) are
    # parsed; tests/test_tpu_target.py compiles a small step for a TPU where libtpu is.
    ("docs/accelerators.md", "tpu_target --venv"):
        "test_tpu_target.py::test_the_docs_venv_command_makes_a_venv_with_jaxs_libtpu",
    ("docs/accelerators.md", "bertjax.tools.tpu_table"):
        "test_tpu_target.py::test_the_docs_tpu_commands_parse",
    ("docs/accelerators.md", "--compile_for=tpu:v5p-64"):
        "test_tpu_target.py::test_the_docs_tpu_commands_parse",
    ("docs/accelerators.md", "accelerator_report --wheels=.gpu/wheels --ab"):
        "test_ab.py::test_the_docs_commands_run_as_written",
    ("docs/accelerators.md", "bertjax.tools.ab --smoke"):
        "test_ab.py::test_the_docs_commands_run_as_written",
    ("docs/accelerators.md", "accelerator_report --smoke"):
        "test_accelerator_report.py::test_readme_smoke_command_runs_as_written",
    ("docs/accelerators.md", "accelerator_report --download_wheels"):
        "test_accelerator_report.py::test_readme_offline_commands_parse",
    ("docs/accelerators.md", "accelerator_report --wheels=.gpu/wheels --json"):
        "test_accelerator_report.py::test_readme_offline_commands_parse",
    ("docs/weights.md", "--src=bert-base-uncased"):
        "test_docs.py::test_the_weights_commands_run_as_written",
    ("docs/weights.md", "--src=HF_DIR "): "test_docs.py::test_the_weights_commands_run_as_written",
    ("docs/weights.md", "--config.init_checkpoint=OUT"): PARSE,
    ("docs/weights.md", "--src=OUT_OR_WORKDIR"):
        "test_docs.py::test_the_weights_commands_run_as_written",
    ("docs/weights.md", "--src=MODERNBERT_DIR"):
        "test_convert_modernbert_files.py::test_the_readme_modernbert_command_runs_as_written",
    # Google's release needs TensorFlow and the release; the test writes a checkpoint under
    # Google's names and runs this CLI with the same flags on it.
    ("docs/weights.md", "--from=tf"): "test_convert_tf.py::test_cli_converts_with_parity",
    ("docs/embeddings.md", "--output=vectors.npy"):
        "test_embed.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--output=queries.npy"):
        "test_embed.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--output=mean.npy"):
        "test_embed.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--dst=ST_EXPORT"):
        "test_embed.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--retrieval=BEIR_DIR"):
        "test_embedding_evaluation.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--sts=STS-B/dev.tsv"):
        "test_embedding_evaluation.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--transfer=mr"):
        "test_embedding_evaluation.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--workdir=EMB "):
        "test_embeddings_training.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--workdir=SIMCSE"):
        "test_embeddings_training.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--output=trained.npy"):
        "test_embeddings_training.py::test_the_docs_commands_run_as_written",
    ("docs/embeddings.md", "--dst=EMB_ST"):
        "test_embeddings_training.py::test_the_docs_commands_run_as_written",
}


def _command(page, piece):
  """The one command of `page` that holds `piece` (continued lines joined), as arguments."""
  [command] = [c for c in docs_text.bash_commands(docs_text.read(page)) if piece in c]
  return shlex.split(command, comments=True)


def test_every_command_on_every_page_is_covered_by_a_test():
  pages = docs_text.pages()
  assert {"docs/pretraining.md", "docs/finetuning.md", "docs/modernbert.md",
          "docs/accelerators.md", "docs/weights.md", "docs/reliability.md"} <= set(pages)
  used = set()
  for page in pages:
    for command in docs_text.bash_commands(docs_text.read(page)):
      keys = [(p, piece) for p, piece in COVERED if p == page and piece in command]
      assert len(keys) == 1, (page, command, keys)
      used.add(keys[0])
  assert used == set(COVERED), set(COVERED) - used
  for test in set(COVERED.values()):
    path, name = test.split("::")
    with open(os.path.join(ROOT, "tests", path), encoding="utf-8") as f:
      assert re.search(rf"^def {name}\(", f.read(), re.M), test


def test_every_page_links_back_and_the_readme_links_to_every_page():
  readme = docs_text.read("README.md")
  for page in docs_text.pages()[1:]:
    assert f"({page})" in readme, page
    assert "(../README.md)" in docs_text.read(page).split("\n## ")[0], page
  for page in docs_text.pages():  # each link to a page names one that exists
    for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", docs_text.read(page)):
      assert os.path.isfile(os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))), (
          page, target)


def test_command_2_is_what_ci_runs():
  [command] = [c for c in docs_text.bash_commands(docs_text.read("README.md")) if "pytest" in c]
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read()
  assert command.split(" && ")[-2:] == ci.strip().splitlines()[-1].split(" && "), (command, ci)


def test_the_short_first_run_runs_as_written(tmp_path):
  """docs/pretraining.md's 50-step run of the tiny BERT on the whole bundled corpus, its
  --workdir moved under the test's directory (so that runs of the suite share no /tmp path)."""
  args = _command("docs/pretraining.md", "--workdir=/tmp/bertjax_tiny_short")
  assert args[:3] == ["python", "-m", "bertjax.main"]
  assert "--config.train.num_train_steps=50" in args
  workdir = tmp_path / "bertjax_tiny_short"
  args = [f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in args]
  out = warm_python.run([sys.executable, *args[1:]], cwd=ROOT, env=cpu_env(optimized=True),
                        timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert (workdir / "checkpoints" / "50").is_dir()
  assert (workdir / "eval_results.json").is_file() and (workdir / "bert_config.json").is_file()
  # docs/reliability.md's replay of its metrics through the divergence guard's spike tests.
  args = _command("docs/reliability.md", "bertjax.tools.divergence_margins")
  assert args[:3] == ["python", "-m", "bertjax.tools.divergence_margins"]
  args = [f"--workdir={workdir}" if a == "--workdir=/tmp/bertjax_tiny_short" else a
          for a in args]
  out = warm_python.run([sys.executable, *args[1:]], cwd=ROOT, env=ENV, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "settings: window=200, loss_zscore=6" in out.stdout, out.stdout
  assert "loss: 0 steps tested" in out.stdout  # 50 steps logged every 10: the window not full
  assert "diverged: never" in out.stdout


def test_feature_extraction_runs_as_written_on_a_two_layer_model(tmp_path, random_bert):
  """docs/finetuning.md's command, as written, where CKPT is a 2-layer model (as README
  command 1's) and FILE two inputs: it writes the two layers it asks for."""
  random_bert(tmp_path / "model", GLUE_VOCAB, max_position_embeddings=128)
  os.rename(tmp_path / "model" / "bert", tmp_path / "CKPT")
  (tmp_path / "FILE").write_text("good great\nbad ||| awful word1\n")
  args = _command("docs/finetuning.md", "--config=configs/features.py")
  out = warm_python.run([sys.executable, *args[1:]], cwd=tmp_path, env=ENV, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = (tmp_path / "DIR" / "features.jsonl").read_text().splitlines()
  assert len(lines) == 2
  first_token = json.loads(lines[0])["features"][0]
  assert [layer["index"] for layer in first_token["layers"]] == [-1, -2]


def _save_hf_bert(directory):
  """A small random transformers BertForPreTraining with its vocab.txt, saved to `directory`."""
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=len(GLUE_VOCAB), hidden_size=32,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=128)
  transformers.BertForPreTraining(config).eval().save_pretrained(str(directory))
  (directory / "vocab.txt").write_text("".join(t + "\n" for t in GLUE_VOCAB))


def test_the_weights_commands_run_as_written(tmp_path):
  """docs/weights.md's conversions, as written, where bert-base-uncased and HF_DIR are small
  save_pretrained BERTs (the download is the one step not run) and OUT_OR_WORKDIR the OUT
  that the command before it wrote; the exports load in transformers."""
  for name in ("bert-base-uncased", "HF_DIR"):
    _save_hf_bert(tmp_path / name)
  for piece in ("--src=bert-base-uncased", "--src=HF_DIR ", "--src=OUT_OR_WORKDIR"):
    if piece == "--src=OUT_OR_WORKDIR":
      shutil.copytree(tmp_path / "OUT", tmp_path / "OUT_OR_WORKDIR")
    args = _command("docs/weights.md", piece)
    out = warm_python.run([sys.executable, *args[1:]], cwd=tmp_path, env=ENV,
                          timeout=300)
    assert out.returncode == 0, (args, out.stderr[-3000:])
  assert os.path.isfile(tmp_path / "bert_base_uncased" / "bert_config.json")
  transformers.BertForPreTraining.from_pretrained(str(tmp_path / "HF_DIR2"))
