"""tests/FAULTS.md, the catalogue of bad inputs and faults, names only tests that exist."""
import ast
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _test_names(path):
  """The names of the test functions defined in a test file."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  return {node.name for node in ast.walk(tree)
          if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_catalogued_test_exists():
  with open(os.path.join(HERE, "FAULTS.md"), encoding="utf-8") as f:
    text = f.read()
  rows = [line for line in text.splitlines() if line.startswith("| ") and "::" in line]
  assert len(rows) >= 40, len(rows)
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 3 and all(cells), row
    for reference in re.findall(r"tests/[\w/]+\.py::\w+", cells[2]):
      path, name = reference.split("::")
      assert os.path.isfile(os.path.join(ROOT, path)), reference
      assert name in _test_names(os.path.join(ROOT, path)), reference
