"""bertjax.tools.real_text_demo: the runs it makes, the random-init model, its results and figure.

The runs themselves are bertjax's commands, each tested elsewhere (the ablations' README
commands in test_ablations_readme_runs, GLUE fine-tuning in test_glue, bilstm_on_top in
test_bilstm); here they are recorded instead of run, each leaving the files a finished run leaves.
"""
import json
import os
import re
import shlex

import numpy as np
import pytest

from bertjax.modeldir import model_files
from bertjax.tools import real_text_demo
from bertjax.modeldir import saved_params
from bertjax.models.config import BertConfig


def _finished_run(args, curves):
  """Writes what a finished run of `args` leaves that the demo reads."""
  workdir = next(a.split("=", 1)[1] for a in args if a.startswith("--workdir="))
  os.makedirs(workdir, exist_ok=True)
  name = os.path.basename(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
    for step, accuracy in curves.get(name, []):
      f.write(json.dumps({"step": step, "split": "eval", "accuracy": accuracy}) + "\n")
  results = {"step": 20, "mlm_accuracy": 0.15, "main_metric": "mlm_accuracy"}
  with open(os.path.join(workdir, "eval_results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f)
  if name == "pretrain_full":  # the model the random init copies
    config = BertConfig(vocab_size=40, hidden_size=16, num_layers=1,
                        num_heads=2, intermediate_size=32,
                        max_position_embeddings=32)
    with open(os.path.join(workdir, model_files.BERT_CONFIG_FILE), "w", encoding="utf-8") as f:
      f.write(model_files.bert_config_json(config))
    with open(os.path.join(workdir, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                        [f"w{i}" for i in range(35)]) + "\n")


def test_the_demo_runs_the_ablations_and_fine_tunings_and_reports_them(tmp_path, monkeypatch):
  curves = {"finetune_full": [(100, 0.6), (200, 0.7)],
            "finetune_no_nsp": [(100, 0.55), (200, 0.65)],
            "finetune_ltr": [(100, 0.5), (200, 0.52)],
            "finetune_ltr_bilstm": [(100, 0.51), (200, 0.56)],
            "finetune_modernbert": [(100, 0.52), (200, 0.6)],
            "finetune_random": [(100, 0.5), (200, 0.58), (300, 0.57)]}
  commands = []

  def run_command(args):
    commands.append(list(args))
    _finished_run(args, curves)

  monkeypatch.setattr(real_text_demo, "run_command", run_command)
  demo = tmp_path / "demo"
  assert real_text_demo.main([f"--workdir={demo}", "--pretrain_steps=20", "--epochs=1",
                              "--num_train=64", "--num_dev=32"]) == 0

  pretrain = [c for c in commands if "--config=configs/tiny.py" in c]
  assert [c[1] for c in pretrain] == [f"--workdir={demo}/pretrain_{n}"
                                      for n in ("full", "no_nsp", "ltr")]
  assert pretrain[1][-1] == "--config.pretraining.nsp=false"
  assert pretrain[2][-1] == "--config.pretraining.objective=ltr"
  assert all("--config.train.num_train_steps=20" in c for c in pretrain)
  [modern] = [c for c in commands if "--config=configs/modernbert.py" in c]
  assert modern[1] == f"--workdir={demo}/pretrain_modernbert"
  assert "--config.train.decay_steps=4" in modern  # the last fifth
  assert (f"--config.init_checkpoint={demo}/pretrain_modernbert"
          in [c for c in commands if "--config=configs/glue.py" in c][-2])
  finetune = {c[2].split("/")[-1]: c for c in commands if "--config=configs/glue.py" in c}
  assert sorted(finetune) == sorted(curves)
  assert f"--config.init_checkpoint={demo}/random_init" in finetune["finetune_random"]
  assert f"--config.init_checkpoint={demo}/pretrain_ltr" in finetune["finetune_ltr_bilstm"]
  assert "--config.model.bilstm_on_top=true" in finetune["finetune_ltr_bilstm"]
  assert f"--config.data.glue_dir={demo}/movie_reviews" in finetune["finetune_full"]
  lines = (demo / "movie_reviews" / "SST-2" / "dev.tsv").read_text().splitlines()
  assert len(lines) == 33  # header + --num_dev

  results = json.loads((demo / "demo_results.json").read_text())
  assert results["random"]["dev_accuracy"] == 0.57
  assert (results["random"]["best_dev_accuracy"], results["random"]["best_step"]) == (0.58, 200)
  assert results["random"]["pretraining"] is None
  assert results["full"]["pretraining"] == {"mlm_accuracy": 0.15}
  assert (demo / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  table = real_text_demo.results_table(results)
  assert "| no pretraining (random init) | 57.0% | 58.0% (200) |" in table


def test_the_random_init_has_the_pretrained_model_shape_and_vocabulary_but_fresh_weights(
    tmp_path):
  pretrained = tmp_path / "pretrain_full"
  _finished_run([f"--workdir={pretrained}"], {})
  out = tmp_path / "random_init"
  real_text_demo.make_random_init(str(pretrained), str(out))
  assert model_files.load_bert_config(str(out)) == model_files.load_bert_config(str(pretrained))
  assert (out / "vocab.txt").read_text() == (pretrained / "vocab.txt").read_text()
  params = saved_params.load_params(str(out), _abstract_params(out))[0]
  table = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
  assert table.shape[1] == 16 and 0.01 < table[:40].std() < 0.03  # BERT's init: N(0, 0.02)


def test_the_random_init_of_a_modernbert_run_is_a_modernbert_without_nsp(tmp_path, random_bert):
  """A ModernBERT run's random twin: its architecture and shape, no NSP head (ModernBERT
  never has one), every tensor freshly drawn."""
  pretrained = random_bert(str(tmp_path / "pretrain_modernbert"),
                           ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                           [f"w{i}" for i in range(35)], architecture="modernbert")
  out = tmp_path / "random_init"
  real_text_demo.make_random_init(pretrained, str(out), seed=3)
  config = model_files.load_bert_config(str(out))
  assert config == model_files.load_bert_config(pretrained) and config.is_modernbert
  fresh = saved_params.load_params(str(out), _abstract_params(out))[0]
  old = saved_params.load_params(pretrained, _abstract_params(out))[0]
  assert "next_sentence" not in fresh
  table = np.asarray(fresh["bert"]["embeddings"]["word_embeddings"]["embedding"])
  assert not np.array_equal(table, old["bert"]["embeddings"]["word_embeddings"]["embedding"])


def _abstract_params(model_dir):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel

  from bertjax.models import heads  # pylint: disable=import-outside-toplevel

  config = model_files.load_bert_config(str(model_dir))
  ids = np.zeros((1, 8), np.int32)
  model = heads.BertForPreTraining(config, next_sentence=not config.is_modernbert)
  return nn.unbox(jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(1), ids, ids, ids, deterministic=True))["params"])


@pytest.mark.parametrize("flag", ["--pretrain_steps=0", "--epochs=0"])
def test_bad_arguments_stop_before_any_run(tmp_path, flag, capsys):
  with pytest.raises(SystemExit) as stop:
    real_text_demo.main([f"--workdir={tmp_path}", flag])
  assert stop.value.code == 2
  assert "must be positive" in capsys.readouterr().err


def test_the_readme_command_parses():
  import docs_text  # pylint: disable=import-outside-toplevel
  text = re.sub(r"\\\n\s*", " ", docs_text.all_text())  # docs/pretraining.md
  [command] = [line for line in text.splitlines()
               if line.startswith("python -m bertjax.tools.real_text_demo")]
  args = real_text_demo.make_parser().parse_args(shlex.split(command)[3:])
  assert args.workdir == "demo" and args.pretrain_steps == 2000
