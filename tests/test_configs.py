"""The configs (bertjax/configs/, the package bertjax.configs) and their schemas
(bertjax/run_config/): each config builds with every field of its schema, each task's config
is one of the two defaults plus the listed fields, derived values follow the final ones, and
`--config=configs/NAME.py` is found from any directory."""
import filecmp
import importlib
import os
import pathlib
import re
import sys

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax import run_config, tasks
from bertjax.configs import base, finetuning, modernbert, squad, tiny
from bertjax.errors import UserError
from bertjax.training import steps

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "bertjax", "configs")
NAMES = sorted(n[:-3] for n in os.listdir(CONFIGS) if n.endswith(".py") and n != "__init__.py")

# Each config: the default it starts from, and every field whose value (or type) differs from it.
DELTAS = {
    "base": (tiny.get_config, {
        "model.size": "base", "model.dropout_rate": 0.1, "model.attention_dropout_rate": 0.1,
        "data.vocab_size": 30522, "data.long_seq_length": 512,
        "data.dupe_factor": 10, "data.eval_fraction": 0.01, "train.batch_size": 256,
        "train.eval_batch_size": 256, "train.num_train_steps": 1_000_000,
        "train.warmup_steps": 10_000, "train.long_seq_from_step": 900_000,
        "train.learning_rate": 1e-4, "train.log_every_steps": 1000,
        "train.eval_every_steps": 50_000, "train.eval_steps": 100,
        "train.checkpoint_every_steps": 10_000, "train.keep_checkpoints": 3}),
    "large": (base.get_config, {"model.size": "large"}),
    "glue": (finetuning.get_config, {
        "task": "mrpc", "data.glue_dir": "", "data.tfds_data_dir": "", "data.eval_split": "",
        "data.predict_splits": ""}),
    "ner": (finetuning.get_config, {
        "task": "ner", "data.data_dir": "", "data.train_file": "train.txt", "data.eval_file": "",
        "data.predict_file": "", "data.label_column": -1, "train.learning_rate": 5e-5}),
    "swag": (finetuning.get_config, {
        "task": "swag", "data.train_file": "", "data.eval_file": "", "data.predict_file": "",
        "train.batch_size": 16}),
    "squad": (finetuning.get_config, {
        "task": "squad", "data.train_file": "", "data.predict_file": "",
        "data.version_2_with_negative": False, "data.max_seq_length": 384,
        "data.doc_stride": 128, "data.max_query_length": 64, "data.n_best_size": 20,
        "data.max_answer_length": 30, "data.null_score_diff_threshold": 0.0,
        "train.num_train_epochs": 2.0, "train.learning_rate": 3e-5}),
}


def _flat(config, prefix=""):
  """{"train.batch_size": 32, ...}: every field of a ConfigDict."""
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def _delta(config, default):
  """The fields of `config` that `default` lacks or holds with another value or type."""
  config, default = _flat(config), _flat(default)
  assert set(default) <= set(config), f"fields the default has and the config lost: " \
                                      f"{sorted(set(default) - set(config))}"
  return {k: v for k, v in config.items()
          if k not in default or (type(v), v) != (type(default[k]), default[k])}


@pytest.mark.parametrize("name", NAMES)
def test_every_config_builds_without_sys_path(name):
  module = importlib.import_module(f"bertjax.configs.{name}")
  for arg in ("v1.1", "v2.0") if name == "squad" else (None,):
    config = module.get_config(arg)
    assert isinstance(config.task, str) and (config.task or name == "finetuning")
  with open(os.path.join(CONFIGS, f"{name}.py"), encoding="utf-8") as f:
    text = f.read()
  assert "sys.path" not in text
  assert "python -m bertjax.main" in text or name == "finetuning"  # its command, but a default's


@pytest.mark.parametrize("name", sorted(DELTAS))
def test_configs_are_their_default_plus_the_listed_fields(name):
  default, expected = DELTAS[name]
  config = importlib.import_module(f"bertjax.configs.{name}").get_config()
  assert _delta(config, default()) == expected


def test_squad_v2_changes_two_fields():
  assert _delta(squad.get_config("v2.0"), squad.get_config()) == {
      "data.version_2_with_negative": True, "train.learning_rate": 5e-5}
  assert squad.get_config("v1.1").to_dict() == squad.get_config().to_dict()


def test_every_field_of_the_schemas_is_commented():
  """Each field of bertjax/run_config/ is commented where it is first defined (a subclass may
  give it another default without repeating the comment; a section is its class's docstring)."""
  package = pathlib.Path(run_config.__file__).parent
  # The modules in the order their schemas build on each other (a section before its subclasses).
  order = ["common", "pretraining", "finetuning", "embeddings", "features", "boundary"]
  assert sorted(order) == sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
  lines = [line for path in (package / f"{name}.py" for name in order)
           for line in path.read_text(encoding="utf-8").splitlines()
           if re.match(r"  \w+: [\w\[\]. |]+ = ", line) and "default_factory" not in line]
  seen, uncommented = set(), []
  for line in lines:
    name = line.split(":")[0].strip()
    if name not in seen and "  # " not in line:
      uncommented.append(line.strip())
    seen.add(name)
  assert len(seen) > 90 and uncommented == []


@pytest.mark.parametrize("name", NAMES)
def test_every_config_knows_every_field_of_its_schema(name):
  """A config holds every field of its task's schema (so `--config.model.architecture=...` is a
  field of configs/tiny.py and configs/glue.py alike, and a wrong value is named as a value), and
  reads into it unchanged."""
  config = importlib.import_module(f"bertjax.configs.{name}").get_config()
  schema = tasks.REGISTRY[config.task or "mrpc"].schema if name != "finetuning" else \
      run_config.FinetuningRun
  assert set(_flat(config)) == set(_flat(ml_collections.ConfigDict(
      dataclasses.asdict(schema()))))
  if name != "finetuning":
    assert type(tasks.typed(config)) is schema
  if name != "features":  # feature extraction reads the model as it is
    assert "architecture" in config.model


def test_a_key_of_no_field_is_refused_at_the_boundary():
  config = tiny.get_config()
  with config.unlocked():
    config.data.doc_stride = 128  # a SQuAD field, not pretraining's
  with pytest.raises(UserError, match=r"unknown config key\(s\) data.doc_stride for a "
                                      r"PretrainingData"):
    tasks.typed(config)


def test_a_fine_tuning_architecture_other_than_the_models_is_a_bad_value(tmp_path, random_bert):
  from bertjax.tasks import finetuning as finetuning_task  # pylint: disable=import-outside-toplevel
  model_dir = random_bert(tmp_path / "model", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
  config = run_config.defaults(run_config.GlueRun)
  config.init_checkpoint = str(model_dir)
  config.data.max_seq_length = 32
  config.model.architecture = "modernbert"
  with pytest.raises(UserError, match="model.architecture=modernbert but .* holds a bert model"):
    finetuning_task.load_pretrained(tasks.typed(config), "GLUE fine-tuning")
  config.model.architecture = "bert"
  assert finetuning_task.load_pretrained(tasks.typed(config), "GLUE").bert_config.architecture \
      == "bert"


@pytest.mark.parametrize("steps_asked,warmup", [(2000, 200), (50, 5), (7, 0)])
def test_the_tiny_warmup_follows_the_final_steps(steps_asked, warmup):
  config = tiny.get_config()
  config.train.num_train_steps = steps_asked
  assert tasks.typed(config).train.warmup_steps == warmup
  config.train.warmup_steps = 3  # set, it is kept
  assert tasks.typed(config).train.warmup_steps == 3


@pytest.mark.parametrize("learning_rate", [8e-4, 2e-3])
def test_modernberts_decoupled_decay_follows_the_final_rate(learning_rate):
  """ModernBERT's weight decay is 1e-5 a step at the peak (optimi's decouple_lr) whatever rate
  the command line gives: one AdamW update on zero gradients shrinks a kernel by exactly 1e-5
  of itself."""
  config = modernbert.get_config()
  config.train.learning_rate = learning_rate
  config.train.optimizer = "adamw"
  config.train.warmup_steps = 0
  config.train.decay_steps = 0  # wsd: the peak rate from the first step
  train = tasks.typed(config).train
  assert (train.weight_decay, train.decouple_lr) == (1e-5, True)
  tx, _ = steps.make_optimizer(train)
  params = {"dense": {"kernel": jnp.ones((2, 2))}}
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  np.testing.assert_allclose(updates["dense"]["kernel"], -1e-5, rtol=1e-5)


def test_config_file_resolves_to_the_packaged_configs_outside_the_repository(tmp_path,
                                                                            monkeypatch):
  from bertjax import main  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(ROOT)  # a checkout: configs/ is the package's, bertjax/configs/
  assert main._config_file("configs/squad.py:v2.0") == os.path.join(CONFIGS, "squad.py:v2.0")
  monkeypatch.chdir(tmp_path)
  packaged = main._config_file("configs/squad.py:v2.0")
  assert packaged.endswith(":v2.0")
  assert filecmp.cmp(packaged[:-len(":v2.0")], os.path.join(CONFIGS, "squad.py"), shallow=False)
  assert filecmp.cmp(main._config_file("configs/tiny.py"), os.path.join(CONFIGS, "tiny.py"),
                     shallow=False)
  assert main.find_config(["main", "--config", "configs/tiny.py", "--workdir=w"]) == [
      "main", "--config", main._config_file("configs/tiny.py"), "--workdir=w"]
  assert main.find_config(["main", "--config=configs/tiny.py:x"]) == [
      "main", "--config=" + main._config_file("configs/tiny.py") + ":x"]
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "tiny.py").write_text("")
  assert main._config_file("configs/tiny.py") == "configs/tiny.py"  # the cwd's own comes first


@pytest.mark.parametrize("spec", ["configs/nope.py", "configs/nope.py:v2.0", "nope.py"])
def test_a_config_file_found_nowhere_stops_with_one_line(spec, tmp_path, monkeypatch, capsys):
  from bertjax import main  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as exit_info:
    main._config_file(spec)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"bertjax: error: no config file {spec.split(':')[0]}, ")
  assert "tiny.py" in err and err.count("\n") == 1


@pytest.mark.parametrize("config, message", [
    ("configs/tiny.py", "unknown task 'nope'"),  # found and loaded: the override reached the task
    ("configs/nope.py", "no config file configs/nope.py")])
def test_main_finds_configs_from_another_directory(config, message, tmp_path):
  """The installed bertjax runs --config=configs/... from a directory without configs/."""
  result = warm_python.run(
      [sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={tmp_path}/w",
       "--config.task=nope"], cwd=tmp_path, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith("bertjax: error: ") and message in result.stderr
  assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
  assert not (tmp_path / "w").exists()
