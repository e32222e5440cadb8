"""The house rules of docs/DESIGN.md, checked on the code: no import cycle, first-party imports at
the top of a module, dependencies one way, modules of one screenful of ideas, every module on the
map, and the commands that moved still running under their old names."""
import ast
import importlib.util
import os
import re
import subprocess
import sys

import bertjax

import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "bertjax")
MAX_LINES = 450
# (module, what it imports inside a function): only to keep a heavy optional dependency off the
# common path, each with a comment there.
LAZY_FIRST_PARTY = {("bertjax.data.pretraining.preparation", "bertjax.data.pretraining.beam")}


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  found = {}
  for directory, dirs, files in os.walk(PACKAGE):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        dotted = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
        found[dotted.removesuffix(".__init__")] = path
  return found


def _imports(modules: dict[str, str]) -> dict[str, list[tuple[str, bool]]]:
  """{module: [(first-party module it imports, whether at the top level)]}."""
  graph = {}
  for name, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    top = {id(node) for node in tree.body}
    edges = []
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertjax"):
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                   else node.module for a in node.names]
      elif isinstance(node, ast.Import):
        targets = [a.name for a in node.names if a.name.startswith("bertjax")]
      else:
        continue
      for target in targets:
        while target not in modules and "." in target:
          target = target.rsplit(".", 1)[0]
        if target != name:
          edges.append((target, id(node) in top))
    graph[name] = edges
  return graph


def test_no_import_cycle_and_first_party_imports_at_the_top():
  modules = _modules()
  graph = _imports(modules)
  inside = {(name, target) for name, edges in graph.items() for target, at_top in edges
            if not at_top}
  assert inside == LAZY_FIRST_PARTY
  # A cycle is a module that reaches itself (imports inside functions counted).
  for start in graph:
    seen, todo = set(), [t for t, _ in graph[start]]
    while todo:
      module = todo.pop()
      assert module != start, f"{start} imports itself through {sorted(seen)}"
      if module not in seen:
        seen.add(module)
        todo.extend(t for t, _ in graph[module])


def test_dependencies_point_one_way():
  graph = _imports(_modules())
  for name, edges in graph.items():
    targets = {t for t, _ in edges}
    if not name.startswith("bertjax.tools"):
      assert not {t for t in targets if t.startswith("bertjax.tools")}, name
    if name.startswith("bertjax.models"):
      assert not {t for t in targets if t.split(".")[1] in ("configs", "data", "training", "tasks")
                  }, name
    if name.startswith(("bertjax.data", "bertjax.tokenization")):
      assert not {t for t in targets if t.split(".")[1] in ("training", "tasks", "models")}, name
  # Data and tokenization import no jax: preparing data is a CPU job that needs no accelerator.
  data = sorted(m for m in _modules() if m.startswith(("bertjax.data", "bertjax.tokenization"))
                and not m.endswith(".beam"))
  code = f"import sys\nfor m in {data!r}: __import__(m)\nprint('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "False"


def test_modules_are_small_and_say_what_they_own():
  for name, path in _modules().items():
    with open(path, encoding="utf-8") as f:
      source = f.read()
    assert source.count("\n") <= MAX_LINES, f"{path}: {source.count(chr(10))} lines"
    if source.strip():
      assert ast.get_docstring(ast.parse(source)), f"{path} has no docstring"


def test_the_design_map_names_every_module():
  with open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8") as f:
    design = f.read()
  for path in _modules().values():
    name = os.path.basename(path)
    if name != "__init__.py" or os.path.getsize(path):
      assert re.search(rf"[`/ ]{re.escape(name)}[` ,]", design), f"docs/DESIGN.md lacks {path}"
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    assert "docs/DESIGN.md" in f.read()


def test_moved_commands_run_under_their_old_names():
  for old, new in bertjax.MOVED_COMMANDS.items():
    assert importlib.util.find_spec(old).origin == importlib.util.find_spec(new).origin, old
  out = warm_python.run([sys.executable, "-m", "bertjax.curves", "--help"], cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "usage: python -m bertjax.training.curves" in out.stdout
  assert "bertjax.curves is now bertjax.training.curves" in out.stderr
