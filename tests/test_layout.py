"""The package's shape: one folder per job, and at the root only the cross-cutting leaves;
imports point down a rank table of the folders (no circle, not even through a function-level
import); the pure core imports nothing of the shell; private modules stay in their folder; and no
module grows past 400 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rmmjax"
MAX_LINES = 400
# The modules at the package root: its face, the cross-cutting device leaf and the one
# supervised fit loop every learner's fit runs in (the config is a folder of its own: the keys,
# their checks and the named configurations).
ROOT_MODULES = {"__init__", "distributed", "fit"}
# Each folder (or root module) may import only from folders of a lower rank, and from itself:
# the entry point, then the agents and the training and evaluation shells, the learners (each
# family's model, how it trains, its inputs, export and load), the replay of data, the layered
# memory above the bank, the files of runs and exports, the one
# supervised fit loop (above the data-parallel helpers it uses), the config,
# retrieval, the leaves (encoder, data, LLM) and the pure core at the bottom.
# One tier of learners/ ranks below the config: each learner's section of the config (its keys,
# defaults and checks: rmmjax.learners.<name>.config), the base they share (learners.section)
# and their table (learners.sections). A learner's keys live in its folder and the config
# assembles them, so the config imports these, and they import only each other and retrieval.
RANKS = {"cli": 11, "bench": 10, "agent": 9, "train": 9, "eval": 8, "learners": 7.5, "replay": 7,
         "memory.lace": 6, "memory": 5, "io": 4, "fit": 3.5, "config": 3,
         "distributed": 3, "learners.config": 2.9,
         "retrieve": 2, "encode": 1, "data": 1, "llm": 1, "core": 0}


def _module_name(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(packages: bool = False) -> dict[str, set[str]]:
  """module -> the rmmjax modules it imports anywhere in its body (functions included); with
  `packages`, also the packages whose __init__ such an import runs first (those of the imported
  module the importer is not inside: importing rmmjax.config.choices from elsewhere runs
  rmmjax/config/__init__.py)."""
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
    graph[name] = edges
  return with_packages(graph) if packages else graph


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The graph with each import's packages added: those above the imported module (below rmmjax
  itself) that the importer is not inside, whose __init__ the import runs first."""
  return {name: edges | {parent for t in edges for parent in _packages(t)
                         if parent in graph and parent != name
                         and not name.startswith(parent + ".")}
          for name, edges in graph.items()}


def _packages(module: str) -> list[str]:
  """The packages above `module` below rmmjax itself (a.b.c -> a.b)."""
  parts = module.split(".")
  return [".".join(parts[:i]) for i in range(2, len(parts))]


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


def test_a_circle_through_a_package_s_init_is_found():
  # A learner's section importing a leaf of the config package runs the config's __init__,
  # which imports the section: a circle the imports alone do not show.
  graph = {"rmmjax.config": {"rmmjax.learners.x.config"}, "rmmjax.config.choices": set(),
           "rmmjax.learners.x.config": {"rmmjax.config.choices"}}
  assert find_cycle(graph) is None
  assert find_cycle(with_packages(graph)) == ["rmmjax.config", "rmmjax.learners.x.config",
                                              "rmmjax.config"]


def test_no_import_circle():
  cycle = find_cycle(import_graph(packages=True))
  assert cycle is None, " -> ".join(cycle)


def test_core_imports_nothing_of_the_shell():
  graph = import_graph()
  for name, edges in graph.items():
    if name.startswith("rmmjax.core"):
      outside = {e for e in edges if not e.startswith("rmmjax.core")}
      assert not outside, f"{name} imports {outside}"


def folder(module: str) -> str:
  """The rank table's name of a module's folder (a root module is its own)."""
  parts = module.split(".")[1:]
  if parts[:2] == ["memory", "lace"]:
    return "memory.lace"
  if parts[0] == "learners" and parts[-1] in ("config", "section", "sections"):
    return "learners.config"
  return parts[0] if parts else "__init__"


def test_only_the_face_and_the_cross_cutting_leaves_sit_at_the_root():
  root = {p.stem for p in PACKAGE.glob("*.py")}
  assert root == ROOT_MODULES, f"modules at the package root: {sorted(root - ROOT_MODULES)}"
  folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
  assert {f for f in folders} | {"memory.lace", "learners.config"} | ROOT_MODULES - {"__init__"} >= set(RANKS)
  assert folders <= set(RANKS), f"folders without a rank: {sorted(folders - set(RANKS))}"


def test_imports_point_down_the_rank_table():
  upward = sorted(f"{a} -> {b}" for a, edges in import_graph().items() for b in edges
                  if folder(a) != folder(b) and folder(a) != "__init__"
                  and RANKS[folder(b)] >= RANKS[folder(a)])
  assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_private_modules_are_imported_only_from_their_own_folder():
  leaked = sorted(f"{a} -> {b}" for a, edges in import_graph().items() for b in edges
                  if b.rsplit(".", 1)[-1].startswith("_") and not b.endswith("__init__")
                  and b.rsplit(".", 1)[0] not in (a, a.rsplit(".", 1)[0]))  # (a: its package)
  assert not leaked, "private modules imported from elsewhere:\n" + "\n".join(leaked)


def test_modules_stay_small():
  long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
          if (n := len(p.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines: {long}"


def _strings(node: ast.AST) -> set[str]:
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return {node.value}
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return set().union(*map(_strings, node.elts)) if node.elts else set()
  return set()


def names_compared(source: str, names: set[str]) -> list[str]:
  """The comparisons in `source` with one of `names` spelled out (`cfg.learner == "iris"`,
  `variant in ("linear", "mlp")`), as the code writes them."""
  return [ast.unparse(node) for node in ast.walk(ast.parse(source))
          if isinstance(node, ast.Compare)
          and set().union(*map(_strings, [node.left, *node.comparators])) & names]


def learner_names() -> set[str]:
  """Every name a learner goes by: the registry's (the `learner` key's) and its sections'."""
  # (the rest of this file imports nothing)
  from rmmjax.learners.registry import LEARNERS  # noqa: PLC0415
  from rmmjax.learners.sections import SECTIONS  # noqa: PLC0415
  return set(LEARNERS) | set(SECTIONS)


def test_names_compared_finds_a_planted_comparison():
  names = {"iris", "linear"}
  assert names_compared('if cfg.learner == "iris" or v in ("a", "linear"): pass', names) == [
      "cfg.learner == 'iris'", "v in ('a', 'linear')"]
  assert names_compared('x = "iris"\nif cfg.learner == other: pass', names) == []


def test_no_learner_name_is_compared_outside_learners():
  names = learner_names()
  found = sorted((str(p.relative_to(PACKAGE.parent)), text) for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).parts[0] != "learners"
                 for text in names_compared(p.read_text(), names))
  assert not found, ("a learner's name compared outside learners/ (ask the registry, or the "
                     "learner's section):\n" + "\n".join(f"{p}: {t}" for p, t in found))
