"""conftest.COSTS, the order in which `pytest -n N` hands modules to its workers, names modules
that exist (a renamed module would silently lose its place at the front)."""
import os

from conftest import COSTS

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_every_costed_module_exists_and_the_order_is_longest_first():
  assert sorted(n for n in COSTS if not os.path.isfile(os.path.join(TESTS, n))) == []
  assert all(n.startswith("test_") and n.endswith(".py") for n in COSTS)
  assert list(COSTS.values()) == sorted(COSTS.values(), reverse=True)
