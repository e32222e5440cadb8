"""The configs (configs/, installed as the package bertjax.configs): each builds, each task's
config is one of the two defaults plus the listed fields, and `--config=configs/NAME.py` is
found from any directory."""
import filecmp
import importlib
import os
import re
import subprocess
import sys

import pytest

from bertjax.configs import base, finetuning, squad, tiny

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
        "data.predict_file": "", "data.label_column": -1, "train.learning_rate": 5e-5,
        "model.feature_layers": "", "model.feature_bilstm_units": 768}),
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


@pytest.mark.parametrize("module", [tiny, finetuning])
def test_every_field_of_the_defaults_is_commented(module):
  with open(module.__file__, encoding="utf-8") as f:
    fields = [line for line in f if re.match(r"\s+config\.[\w.]+ = (?!ml_collections)", line)]
  assert len(fields) > 20 and [line for line in fields if "  # " not in line] == []


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
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={tmp_path}/w",
       "--config.task=nope"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
      check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith("bertjax: error: ") and message in result.stderr
  assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
  assert not (tmp_path / "w").exists()
