"""The reference pretraining (bertjax.tools.torch_pretraining) and the transfer study
(bertjax.tools.transfer_study) end to end on a short run: transformers' twin pretrained on the
run's own batches, converted, and fine-tuned beside bertjax's model and a random one."""
import json
import os
import sys

import pytest

from bertjax.tools import transfer_study

from conftest import cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")


def _python(*args, cwd=ROOT):
  return warm_python.run([sys.executable, *args], env=ENV, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def pretrained(corpus, tmp_path_factory):
  """A finished 10-step tiny pretraining workdir (32 tokens, batch 8) on the test corpus."""
  text_file, vocab = corpus
  workdir = str(tmp_path_factory.mktemp("pretrained") / "run")
  out = _python("-m", "bertjax.main", "--config=configs/tiny.py", f"--workdir={workdir}",
                f"--config.data.input_files={text_file}", f"--config.data.vocab_model={vocab}",
                "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=10",
                "--config.data.dupe_factor=1", "--config.data.eval_fraction=0.1",
                "--config.train.batch_size=8", "--config.train.eval_batch_size=16",
                "--config.train.num_train_steps=10", "--config.train.warmup_steps=2",
                "--config.train.log_every_steps=5", "--config.data.eval_masked_lm_prob=0.3")
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def test_the_runs_held_out_scores_at_both_rates_are_transformers_on_its_weights(pretrained,
                                                                              tmp_path):
  """The run's last evaluation (its eval_results.json: the masked LM at training's 15% and, from
  data.eval_masked_lm_prob, at 30%; NSP) is what transformers' BertForPreTraining scores with
  the same weights (exported by convert --to=hf) on the same held-out batches, each rate's rows
  apart (`torch_pretraining.evaluate`)."""
  import transformers  # pylint: disable=import-outside-toplevel
  from bertjax.tasks import pretraining  # pylint: disable=import-outside-toplevel
  from bertjax.tools import torch_pretraining  # pylint: disable=import-outside-toplevel
  from bertjax.training import train  # pylint: disable=import-outside-toplevel
  out = _python("-m", "bertjax.convert", "--to=hf", f"--src={pretrained}", f"--dst={tmp_path}/hf")
  assert out.returncode == 0, out.stderr[-3000:]
  with open(os.path.join(pretrained, "config.json"), encoding="utf-8") as f:
    config = torch_pretraining.read_config(json.load(f))
  task = pretraining.make_task(config, pretrained, train.run_context(config))
  model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")
  theirs = torch_pretraining.evaluate(model, task.batches.eval(), nsp=True,
                                      second_masking=pretraining.second_masking(config.data))
  with open(os.path.join(pretrained, "eval_results.json"), encoding="utf-8") as f:
    ours = json.load(f)
  assert set(theirs) == {"mlm_accuracy", "mlm_loss", "mlm_accuracy_at_30pct",
                         "mlm_loss_at_30pct", "nsp_accuracy"}
  for name, value in theirs.items():
    assert ours[name] == pytest.approx(value, rel=1e-4, abs=2e-3 if "accuracy" in name else 0)
  held_out = next(iter(task.batches.eval()))  # the rows at 15%, then the same rows at 30%
  masked = held_out["masked_lm_weights"].reshape(2, -1).sum(axis=1)
  assert masked[1] > 1.5 * masked[0]


@pytest.mark.parametrize("train, named", [
    (dict(lr_schedule="wsd", restart_from_step=5, restart_learning_rate=1e-4),
     "train.restart_from_step"),
    (dict(lr_schedule="wsd", decay_floor=0.001), "train.decay_floor=0.001")])
def test_the_reference_refuses_a_second_plateau_and_a_floor(train, named):
  """transformers' get_wsd_schedule has one plateau, and starts its warmup at the floor."""
  from bertjax import tasks  # pylint: disable=import-outside-toplevel
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  from bertjax.errors import UserError  # pylint: disable=import-outside-toplevel
  from bertjax.tools import torch_pretraining  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.train.update(train)
  with pytest.raises(UserError, match=named):
    torch_pretraining.check_recipe(tasks.typed(config))


def test_study_pretrains_the_twin_and_fine_tunes_all_three(pretrained, tmp_path, monkeypatch):
  """The study's commands run (as processes it starts with this environment) with XLA's
  optimizations: each of its three fine-tunings scores 1,000 dev sentences, and the second and
  third read the first one's compiled steps from the session's cache."""
  monkeypatch.setenv("XLA_FLAGS", cpu_env(optimized=True)["XLA_FLAGS"])
  out = tmp_path / "study"
  assert transfer_study.main([f"--pretrained={pretrained}", f"--out={out}", "--labels=40",
                              "--seeds=0", "--epochs=1", "--learning_rate=1e-3"]) == 0
  reference = json.loads((out / "reference" / "eval_results.json").read_text())
  assert 0 < reference["mlm_accuracy"] < 1 and 0 < reference["nsp_accuracy"] < 1
  assert 0 < reference["mlm_accuracy_at_30pct"] < 1
  assert reference["step"] == 10
  # The twin is a transformers directory with the run's vocabulary, and converts to bertjax.
  assert {"config.json", "model.safetensors", "vocab.model"} <= set(os.listdir(out / "reference"))
  assert "bert_config.json" in os.listdir(out / "reference_model")
  results = json.loads((out / transfer_study.RESULTS_FILE).read_text())
  assert set(results["runs"]) == {"bertjax", "transformers", "random"}
  for runs in results["runs"].values():
    assert 0.0 < runs["40"]["0"] <= 1.0
  table = transfer_study.table(results)
  assert table.splitlines()[0] == "| model | 40 labels |"
  assert f"**{100 * results['runs']['random']['40']['0']:.1f}%**" in table
  # A rerun finds every run done and starts none.
  before = {p: os.path.getmtime(out / p / "eval_results.json")
            for p in os.listdir(out) if p.startswith("ft_")}
  assert transfer_study.main([f"--pretrained={pretrained}", f"--out={out}", "--labels=40",
                              "--seeds=0", "--epochs=1", "--learning_rate=1e-3"]) == 0
  assert before == {p: os.path.getmtime(out / p / "eval_results.json") for p in before}


def test_reference_refuses_what_it_cannot_run(pretrained, tmp_path, capsys):
  """A directory that is no pretraining run, an --out that holds files, and a recipe the
  reference does not run: one line each, exit 2, nothing written. The first through the command
  (`python -m bertjax.tools.torch_pretraining`), the others through its main in this process."""
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "keep.txt").write_text("mine")
  cases = [([f"--workdir={tmp_path}", f"--out={tmp_path}/a"], "has no config.json"),
           ([f"--workdir={pretrained}", f"--out={tmp_path}/full"], "is not empty")]
  lamb = tmp_path / "lamb"
  lamb.mkdir()
  config = json.loads(open(os.path.join(pretrained, "config.json")).read())
  config["train"]["optimizer"] = "lamb"
  (lamb / "config.json").write_text(json.dumps(config))
  cases.append(([f"--workdir={lamb}", f"--out={tmp_path}/b"], "train.optimizer=lamb"))
  from bertjax.tools import torch_pretraining  # pylint: disable=import-outside-toplevel
  for i, (args, message) in enumerate(cases):
    if i == 0:
      out = _python("-m", "bertjax.tools.torch_pretraining", *args)
      returncode, stderr = out.returncode, out.stderr
    else:
      returncode, stderr = torch_pretraining.main(args), capsys.readouterr().err
    assert returncode == 2, stderr[-2000:]
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
  assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
  assert os.listdir(tmp_path / "full") == ["keep.txt"]


def test_an_earlier_runs_config_reads_the_fields_it_lacks_as_their_defaults(pretrained):
  """A config.json written before some fields existed: those read as configs/tiny.py's, the
  others keep the run's values, and the recipe check passes it."""
  from bertjax.tools import torch_pretraining  # pylint: disable=import-outside-toplevel
  saved = json.loads(open(os.path.join(pretrained, "config.json")).read())
  for field in ("optimizer", "lr_decay_power", "lr_decay_from_step_0", "grad_accum_steps",
                "lr_schedule"):
    del saved["train"][field]
  del saved["data"]["packing"]
  config = torch_pretraining.read_config(saved)
  assert (config.train.optimizer, config.train.lr_decay_power, config.train.lr_schedule,
          config.data.packing) == ("adamw", 1.0, "linear", False)
  assert config.train.num_train_steps == 10 and config.data.max_seq_length == 32
  torch_pretraining.check_recipe(config)


def test_mean_pooling_is_refused_for_a_bert_run(pretrained, tmp_path, capsys):
  """A BERT run pools [CLS] through its pooler: --pooling=mean stops before any run."""
  with pytest.raises(SystemExit) as stop:
    transfer_study.main([f"--pretrained={pretrained}", f"--out={tmp_path}/study",
                         "--pooling=mean", "--reference=false"])
  assert stop.value.code == 2
  assert "is a BERT run" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "study")


def test_pooling_reaches_every_fine_tuning_of_a_modernbert_run(random_bert, tmp_path,
                                                             monkeypatch):
  """--pooling=mean on a ModernBERT run: each fine-tuning command carries it (the commands are
  recorded, each leaving the dev accuracy a finished run leaves)."""
  run = random_bert(str(tmp_path / "run"), ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                    [f"w{i}" for i in range(35)], architecture="modernbert")
  (tmp_path / "run" / "bert" / "eval_results.json").write_text(
      json.dumps({"step": 10, "mlm_accuracy": 0.2}))
  commands = []

  def record(module, args):
    commands.append((module, args))
    workdir = next(a.split("=", 1)[1] for a in args if a.startswith("--workdir="))
    os.makedirs(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
      f.write(json.dumps({"step": 1, "split": "eval", "accuracy": 0.6}) + "\n")

  monkeypatch.setattr(transfer_study, "_python", record)
  assert transfer_study.main([f"--pretrained={run}", f"--out={tmp_path}/study", "--labels=40",
                              "--seeds=0,1", "--reference=false", "--pooling=mean"]) == 0
  assert len(commands) == 4  # bertjax's run and the random twin, two seeds each
  assert all(module == "bertjax.main" and "--config.model.pooling=mean" in args
             for module, args in commands)
  results = json.loads((tmp_path / "study" / transfer_study.RESULTS_FILE).read_text())
  assert results["runs"]["random"]["40"] == {"0": 0.6, "1": 0.6}


def test_the_readme_command_parses():
  """The README's study command names the tool's real flags (its full run takes an hour)."""
  import re  # pylint: disable=import-outside-toplevel
  import shlex  # pylint: disable=import-outside-toplevel
  import docs_text  # pylint: disable=import-outside-toplevel
  lines = [line for block in re.findall(r"```bash\n(.*?)```", docs_text.all_text(), re.S)
           for line in block.splitlines()  # docs/pretraining.md's
           if line.startswith("python -m bertjax.tools.transfer_study")]
  assert len(lines) == 1, lines
  args = transfer_study.make_parser().parse_args(shlex.split(lines[0])[3:])
  assert (args.pretrained, args.labels, args.seeds) == ("/tmp/bertjax_tiny", [250, 1000, 0],
                                                         [0, 1, 2])
