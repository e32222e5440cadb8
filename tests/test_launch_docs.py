"""launch/colab.ipynb and launch/README.md: the notebook's structure (nbformat 4, no outputs)
and code, and the bertjax commands of both, which name real configs and fields and parse."""
import importlib.util
import json
import os
import re
import shlex

from launch_helpers import REPO, slurm, tpu

NOTEBOOK = os.path.join(REPO, "launch", "colab.ipynb")
LAUNCH_README = os.path.join(REPO, "launch", "README.md")


def load_notebook():
  with open(NOTEBOOK, encoding="utf-8") as f:
    return json.load(f)


def cell_source(cell):
  source = cell["source"]
  return source if isinstance(source, str) else "".join(source)


def test_notebook_is_nbformat_4_without_outputs():
  nb = load_notebook()
  assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
  assert isinstance(nb["metadata"], dict) and nb["metadata"]["kernelspec"]["language"] == "python"
  kinds = [cell["cell_type"] for cell in nb["cells"]]
  assert set(kinds) <= {"code", "markdown", "raw"} and kinds.count("code") >= 5
  if nb["nbformat_minor"] >= 5:
    ids = [cell["id"] for cell in nb["cells"]]
    assert len(set(ids)) == len(ids)
  for cell in nb["cells"]:
    assert isinstance(cell["metadata"], dict)
    assert isinstance(cell["source"], (str, list))
    if cell["cell_type"] == "code":
      assert cell["outputs"] == [] and cell["execution_count"] is None


def test_notebook_code_compiles():
  for i, cell in enumerate(load_notebook()["cells"]):
    if cell["cell_type"] == "code":
      python = "\n".join(line for line in cell_source(cell).split("\n")
                         if not line.lstrip().startswith(("!", "%")))
      compile(python, f"colab.ipynb cell {i}", "exec")


def bertjax_commands(text, prefixes):
  """Argument lists of the commands in `text` (backslash-continued lines joined) that start with
  one of `prefixes`, such as "python -m bertjax.main"."""
  text = re.sub(r"\\\n\s*", " ", text)
  found = []
  for line in text.split("\n"):
    line = line.strip().lstrip("!").replace("nohup ", "")
    for prefix in prefixes:
      if line.startswith(prefix):
        found.append(shlex.split(line.split(" > ")[0], comments=True)[len(prefix.split()):])
  return found


def load_config(spec):
  """get_config() of a config file spec, e.g. configs/squad.py:v2.0."""
  path, _, arg = spec.partition(":")
  full = os.path.join(REPO, path)
  if not os.path.isfile(full) and path.startswith("configs/"):  # as bertjax.main finds it
    full = os.path.join(REPO, "bertjax", path)
  assert os.path.isfile(full), f"{spec}: no such config"
  module_spec = importlib.util.spec_from_file_location(f"_config_{os.path.basename(path)}", full)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def check_command(args):
  """--config names a config file and every --config.KEY=VALUE a field of it. Returns it."""
  [config_spec] = [a[len("--config="):] for a in args if a.startswith("--config=")]
  config = load_config(config_spec)
  for arg in args:
    if arg.startswith("--config."):
      key, _, value = arg[len("--config."):].partition("=")
      assert value, arg
      node = config
      for part in key.split("."):
        assert part in node, f"{config_spec} has no field {key} ({arg})"
        node = node[part]
  return config_spec


def test_notebook_commands_name_real_configs_and_fields():
  text = "\n".join(cell_source(c) for c in load_notebook()["cells"] if c["cell_type"] == "code")
  commands = bertjax_commands(text, ["python -m bertjax.main"])
  assert {check_command(args) for args in commands} == {
      "configs/tiny.py", "configs/features.py", "configs/glue.py"}
  assert "--config.train.num_train_steps={STEPS}" in commands[0]  # BERTJAX_NOTEBOOK_STEPS
  assert 'STEPS = int(os.environ.get("BERTJAX_NOTEBOOK_STEPS", "300"))' in text
  assert "REPO_URL = " in text and '!pip install -q -e . "{JAX}"' in text
  assert "snapshot_download" in text and "python -m bertjax.convert --from=hf" in text


def test_readme_commands_name_real_configs_and_fields_and_parse():
  with open(LAUNCH_README, encoding="utf-8") as f:
    text = f.read()
  runs = bertjax_commands(text, ["python launch/tpu.py run", "python launch/slurm.py submit",
                                 "python -m bertjax.main"])
  assert {check_command(args) for args in runs} == {"configs/base.py", "configs/glue.py"}
  env = {"CLOUDSDK_CORE_PROJECT": "p", "CLOUDSDK_COMPUTE_ZONE": "z", "TPU_NAME": "n"}
  launches = bertjax_commands(text, ["python launch/tpu.py"])
  assert {args[0] for args in launches} == {
      "create", "queue", "queue-status", "setup", "run", "logs", "stop", "delete",
      "queue-delete"}
  for args in launches:
    result = tpu(*args, "--dry-run", env=env)
    assert result.returncode == 0, (args, result.stderr)
  launches = bertjax_commands(text, ["python launch/slurm.py"])
  assert [args[0] for args in launches] == ["submit", "submit", "logs", "stop"]
  for args in launches:
    result = slurm(*args, "--dry-run")
    assert result.returncode == 0, (args, result.stderr)
