"""The package's shape: imports point down only (no circle, not even through a function-level
import), the pure core imports nothing of the shell, and no module grows past ~400 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rmmjax"
MAX_LINES = 420


def _module_name(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
  """module -> the rmmjax modules it imports anywhere in its body (functions included)."""
  modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  graph = {}
  for name, path in modules.items():
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        # `from rmmjax.x import y` imports rmmjax.x.y when y is a module, else rmmjax.x.
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                   else node.module for a in node.names]
      edges |= {t for t in targets if t in modules and t != name}
    # A package's __init__ runs on import of any submodule; rmmjax's own are empty but core's.
    graph[name] = edges
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


def test_find_cycle_finds_a_planted_circle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
  cycle = find_cycle(import_graph())
  assert cycle is None, " -> ".join(cycle)


def test_core_imports_nothing_of_the_shell():
  graph = import_graph()
  for name, edges in graph.items():
    if name.startswith("rmmjax.core"):
      outside = {e for e in edges if not e.startswith("rmmjax.core")}
      assert not outside, f"{name} imports {outside}"


def test_modules_stay_small():
  long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
          if (n := len(p.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines: {long}"
