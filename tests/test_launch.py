"""launch/: tpu.py's commands (--dry-run, exact), its remote shell scripts run here against a
fake worker, its failures; colab.ipynb's structure, code and bertjax commands; the README's."""
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_PY = os.path.join(REPO, "launch", "tpu.py")
NOTEBOOK = os.path.join(REPO, "launch", "colab.ipynb")
LAUNCH_README = os.path.join(REPO, "launch", "README.md")
ENV_VARS = ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "TPU_NAME")
COMMON = ["--project=proj", "--zone=us-central2-b", "--name=bert"]
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
WHERE = ["--project=proj", "--zone=us-central2-b"]


def tpu(*args, env=None, **kwargs):
  """Runs launch/tpu.py with `args`, none of its environment variables set unless in `env`."""
  base = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
  return subprocess.run([sys.executable, TPU_PY, *args], env={**base, **(env or {})},
                        capture_output=True, text=True, timeout=60, **kwargs)


def dry_run(*args, env=None):
  """The commands printed by --dry-run, each split into its argv."""
  result = tpu(*args, "--dry-run", env=env)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def remote_script(cmd):
  """The shell line an ssh command runs on the workers (its --command=)."""
  [script] = [a[len("--command="):] for a in cmd if a.startswith("--command=")]
  return script


def pinned_jax():
  with open(os.path.join(REPO, "setup.py")) as f:
    return re.search(r'"jax==([0-9.]+)"', f.read()).group(1)


def check_syntax(script):
  for shell in ("bash", "sh"):
    result = subprocess.run([shell, "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, (shell, result.stderr)


# ----------------------------------------------------------------------------------------------
# tpu.py --dry-run


@pytest.mark.parametrize("accelerator,version", [
    ("v4-8", "tpu-ubuntu2204-base"),  # one host
    ("v4-32", "tpu-ubuntu2204-base"),  # a pod slice of 4 hosts
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_create(accelerator, version):
  assert dry_run("create", *COMMON, f"--accelerator-type={accelerator}") == [
      GCLOUD_TPU + ["create", "bert", *WHERE, f"--accelerator-type={accelerator}",
                    f"--version={version}"]]


def test_create_spot_version_and_environment():
  env = {"CLOUDSDK_CORE_PROJECT": "proj", "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
         "TPU_NAME": "bert"}
  assert dry_run("create", "--accelerator-type=v4-32", "--version=tpu-vm-base", "--spot",
                 env=env) == [
      GCLOUD_TPU + ["create", "bert", *WHERE, "--accelerator-type=v4-32",
                    "--version=tpu-vm-base", "--spot"]]


def test_setup_copies_the_working_tree_to_all_workers(tmp_path):
  commands = dry_run("setup", *COMMON, env={"TMPDIR": str(tmp_path)})
  tarball = str(tmp_path / "bertjax-bert.tar.gz")
  assert commands[0] == ["tar", "-czf", tarball, "--exclude=.git", "--exclude=.venv",
                         "--exclude=__pycache__", "--exclude=*.egg-info",
                         "--exclude=.pytest_cache", "--exclude=build", "--exclude=dist",
                         "-C", REPO, "."]
  assert commands[1] == GCLOUD_TPU + ["scp", tarball, "bert:bertjax-src.tar.gz", *WHERE,
                                      "--worker=all"]
  assert commands[2][:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  assert len(commands) == 3
  script = remote_script(commands[2])
  check_syntax(script)
  steps = ["set -e",
           "tar -xzf $HOME/bertjax-src.tar.gz -C $HOME/bertjax",
           '"$PY" -m venv $HOME/bertjax-venv',
           f"$HOME/bertjax-venv/bin/pip install -q -e $HOME/bertjax 'jax[tpu]=={pinned_jax()}'"]
  positions = [script.find(step) for step in steps]
  assert -1 not in positions and positions == sorted(positions), positions


def test_setup_clones_a_repo_at_a_ref():
  [ssh] = dry_run("setup", *COMMON, "--repo=https://example.org/me/bertjax.git", "--ref=v1")
  assert ssh[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  script = remote_script(ssh)
  check_syntax(script)
  assert ("git clone --quiet https://example.org/me/bertjax.git $HOME/bertjax; "
          "git -C $HOME/bertjax checkout --quiet v1; ") in script
  assert f"'jax[tpu]=={pinned_jax()}'" in script


RUN_ARGS = ["--config=configs/base.py", "--config.train.batch_size=512",
            "--config.data.input_files=/mnt/my-bucket/text/*.txt",
            "--config.data.vocab_model=/mnt/my-bucket/vocab file.txt"]
OVERRIDES_QUOTED = ("--config.train.batch_size=512 '--config.data.input_files=/mnt/my-bucket/"
                    "text/*.txt' '--config.data.vocab_model=/mnt/my-bucket/vocab file.txt'")


def test_run_with_a_bucket():
  [ssh] = dry_run("run", *COMMON, "--bucket=gs://my-bucket", "--workdir=runs/base", *RUN_ARGS)
  assert ssh[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  script = remote_script(ssh)
  check_syntax(script)
  mount = ('if ! mountpoint -q /mnt/my-bucket; then sudo mkdir -p /mnt/my-bucket; '
           'sudo chown "$(id -u):$(id -g)" /mnt/my-bucket; gcsfuse --implicit-dirs '
           "--rename-dir-limit=200000 my-bucket /mnt/my-bucket; fi; ")
  main = ("setsid nohup python -m bertjax.main --config=configs/base.py "
          f"--workdir=/mnt/my-bucket/runs/base {OVERRIDES_QUOTED} > $HOME/bertjax-run.log "
          "2>&1 < /dev/null & echo $! > $HOME/bertjax-run.pid; ")
  assert mount in script and main in script
  assert script.index(mount) < script.index(main)


def test_run_without_a_bucket():
  [ssh] = dry_run("run", *COMMON, "--workdir=/home/me/run", *RUN_ARGS)
  script = remote_script(ssh)
  assert "gcsfuse" not in script
  assert (f"python -m bertjax.main --config=configs/base.py --workdir=/home/me/run "
          f"{OVERRIDES_QUOTED} > ") in script


@pytest.mark.parametrize("endpoints,coordinator", [
    ("t1v-n-0-w-0:0:10.130.0.5", None),  # v4-8: one host, no jax.distributed coordinator
    ("t1v-n-0-w-0:0:10.130.0.5,t1v-n-0-w-1:1:10.130.0.6,t1v-n-0-w-2:2:10.130.0.7,"
     "t1v-n-0-w-3:3:10.130.0.8", "10.130.0.5:8482"),  # v4-32: worker 0 coordinates
    ("host-0,host-1", "host-0:8482"),  # the metadata's newer form, host names only
])
def test_run_script_on_a_fake_worker(tmp_path, endpoints, coordinator):
  """The run command's script, run here: curl answers the metadata query, `python` (from the
  venv's activate) records its arguments and environment; then a second run is refused."""
  home, fake_bin = tmp_path / "home", tmp_path / "bin"
  (home / "bertjax").mkdir(parents=True)
  (home / "bertjax-venv" / "bin").mkdir(parents=True)
  fake_bin.mkdir()
  (fake_bin / "curl").write_text(f"#!/bin/sh\necho '{endpoints}'\n")
  (fake_bin / "python").write_text(
      "#!/bin/sh\n"
      'printf "%s\\n" "$PWD" "${JAX_COORDINATOR_ADDRESS-unset}" "$@" END > "$HOME/called"\n'
      "exec sleep 30\n")
  for f in fake_bin.iterdir():
    f.chmod(0o755)
  (home / "bertjax-venv" / "bin" / "activate").write_text(f'PATH="{fake_bin}:$PATH"\n')
  [ssh] = dry_run("run", *COMMON, "--workdir=/data/run", *RUN_ARGS)
  env = {"HOME": str(home), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
  try:
    first = subprocess.run(["bash", "-c", remote_script(ssh)], env=env, capture_output=True,
                           text=True, timeout=20)
    assert first.returncode == 0, first.stderr
    for _ in range(100):
      if (home / "called").exists() and (home / "called").read_text().endswith("END\n"):
        break
      time.sleep(0.05)
    cwd, address, *argv, _ = (home / "called").read_text().split("\n")[:-1]
    assert cwd == str(home / "bertjax")
    assert address == (coordinator or "unset")
    assert argv == ["-m", "bertjax.main", "--config=configs/base.py", "--workdir=/data/run",
                    *RUN_ARGS[1:]]
    second = subprocess.run(["bash", "-c", remote_script(ssh)], env=env, capture_output=True,
                            text=True, timeout=20)
    assert second.returncode == 1 and "a run is going on" in second.stderr
  finally:
    if (home / "bertjax-run.pid").exists():
      subprocess.run(["kill", (home / "bertjax-run.pid").read_text().strip()])


def test_logs_stop_delete():
  assert dry_run("logs", *COMMON) == [
      GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=0",
                    "--command=tail -n 50 $HOME/bertjax-run.log"]]
  assert dry_run("logs", *COMMON, "--worker=2", "--lines=10", "--follow") == [
      GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=2",
                    "--command=tail -n 10 -F $HOME/bertjax-run.log"]]
  [stop] = dry_run("stop", *COMMON)
  assert stop[:-1] == GCLOUD_TPU + ["ssh", "bert", *WHERE, "--worker=all"]
  assert 'kill -TERM "$(cat $HOME/bertjax-run.pid)"' in remote_script(stop)
  check_syntax(remote_script(stop))
  assert dry_run("delete", *COMMON) == [GCLOUD_TPU + ["delete", "bert", *WHERE]]
  assert dry_run("delete", *COMMON, "--yes") == [
      GCLOUD_TPU + ["delete", "bert", *WHERE, "--quiet"]]


# ----------------------------------------------------------------------------------------------
# tpu.py: bad input and failures.


@pytest.mark.parametrize("args,named", [
    (["create", "--zone=z", "--name=n", "--accelerator-type=v4-8"], "--project"),
    (["create", "--project=p", "--name=n", "--accelerator-type=v4-8"], "--zone"),
    (["create", "--project=p", "--zone=z", "--accelerator-type=v4-8"], "--name"),
    (["create", *COMMON], "--accelerator-type"),
    (["run", *COMMON, "--workdir=w"], "--config"),
    (["run", *COMMON, "--config=configs/base.py"], "--workdir"),
])
def test_a_missing_flag_is_named(args, named):
  result = tpu(*args, "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert named in result.stderr.splitlines()[-1], result.stderr


@pytest.mark.parametrize("args,message", [
    (["run", "--config=c", "--workdir=gs://b/run"], "mount the bucket instead"),
    (["run", "--config=c", "--workdir=/abs", "--bucket=bkt"], "is a path inside the bucket"),
    (["run", "--config=c", "--workdir=w", "--bucket=Bad Bucket"], "is not a bucket name"),
    (["run", "--config=c", "--workdir=w", "--lr=1"], "unrecognized argument '--lr=1'"),
    (["run", "--config=c", "--workdir=w", "--config.seed"], "--config.KEY=VALUE"),
    (["create", "--accelerator-type=tpu8"], "not of the form"),
    (["create", "--accelerator-type=v9x-8"], "pass --version"),
    (["setup", "--ref=main"], "--ref needs --repo"),
])
def test_bad_input_is_one_clear_error(args, message):
  result = tpu(*args[:1], *COMMON, *args[1:], "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert message in result.stderr, result.stderr


def test_without_gcloud_on_path_nothing_runs(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  result = tpu("create", *COMMON, "--accelerator-type=v4-8", env={"PATH": str(empty)})
  assert result.returncode == 2
  assert "gcloud is not on PATH" in result.stderr and "--dry-run" in result.stderr


def test_runs_the_commands_and_stops_at_the_first_failure(tmp_path):
  """A fake gcloud logs its calls and fails on scp: tar runs, scp fails, ssh never runs."""
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  log = tmp_path / "calls"
  (fake_bin / "gcloud").write_text(
      f'#!/bin/sh\necho "$4" >> {log}\n[ "$4" = scp ] && exit 7\nexit 0\n')
  (fake_bin / "gcloud").chmod(0o755)
  env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
  result = tpu("create", *COMMON, "--accelerator-type=v4-8", env=env)
  assert result.returncode == 0, result.stderr
  result = tpu("setup", *COMMON, env=env)
  assert result.returncode == 7
  assert "command failed (exit status 7): gcloud compute tpus tpu-vm scp" in result.stderr
  assert log.read_text().split() == ["create", "scp"]
  assert (tmp_path / "bertjax-bert.tar.gz").stat().st_size > 10_000  # tar ran first


# ----------------------------------------------------------------------------------------------
# colab.ipynb and the README's commands.


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
  assert "--config.train.num_train_steps=300" in commands[0]
  assert "REPO_URL = " in text and '!pip install -q -e . "{JAX}"' in text
  assert "snapshot_download" in text and "python -m bertjax.convert --from=hf" in text


def test_readme_commands_name_real_configs_and_fields_and_parse():
  with open(LAUNCH_README, encoding="utf-8") as f:
    text = f.read()
  runs = bertjax_commands(text, ["python launch/tpu.py run", "python -m bertjax.main"])
  assert {check_command(args) for args in runs} == {"configs/base.py", "configs/glue.py"}
  env = {"CLOUDSDK_CORE_PROJECT": "p", "CLOUDSDK_COMPUTE_ZONE": "z", "TPU_NAME": "n"}
  launches = bertjax_commands(text, ["python launch/tpu.py"])
  assert len(launches) >= 8
  for args in launches:
    result = tpu(*args, "--dry-run", env=env)
    assert result.returncode == 0, (args, result.stderr)
