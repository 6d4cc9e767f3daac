"""core/ is the bottom floor: its modules import each other in one direction only (no circle).

Every import counts, also those under `if TYPE_CHECKING:` and inside functions: a lazy or
type-only import back is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

CORE = Path(__file__).resolve().parents[2] / "src" / "gpupool" / "core"


def core_imports(path: Path) -> Set[str]:
    """The core modules `path` imports, by module name (relative and absolute imports)."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and (node.module or "").startswith("gpupool.core."):
                found.add((node.module or "").split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("gpupool.core."))
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    return {p.stem: core_imports(p) & modules for p in CORE.glob("*.py") if p.stem != "__init__"}


def cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import circle in `graph` as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_a_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_core_has_no_import_cycle():
    graph = import_graph()
    assert "model" in graph and graph["placement"], graph  # the graph was read
    assert cycle(graph) == [], " -> ".join(cycle(graph))
