"""No import cycles among docqueue's packages, function-local imports included.

The graph is built from the source with `ast`: every `import` and `from ... import` anywhere in a module (at module
level or inside a function, relative ones resolved) is an edge to the deepest docqueue module it names. A
function-local import is an edge like any other: hiding one side of a cycle inside a function leaves the cycle.
A package's `__init__` and one of its own submodules importing each other is not counted (the package re-exports).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("queue_db", "processing", "resources", "orchestration")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the docqueue modules it imports (anywhere in its body)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                # `from package import name` names a submodule when `name` is one
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


class _Tarjan:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""

    def __init__(self, graph: dict[str, set[str]]):
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.components: list[frozenset[str]] = []

    def _enter(self, node: str, work: list) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)
        work.append((node, iter(sorted(self.graph[node]))))

    def _next_unvisited(self, node: str, edges) -> str | None:
        """The next target of `node` not visited yet; targets still on the stack lower `node`'s link."""
        for target in edges:
            if target not in self.index:
                return target
            if target in self.on_stack:
                self.low[node] = min(self.low[node], self.index[target])
        return None

    def _close(self, node: str) -> None:
        """`node` is done: when it is its component's root, the component leaves the stack."""
        if self.low[node] != self.index[node]:
            return
        component = set()
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            component.add(member)
            if member == node:
                break
        if len(component) > 1:
            self.components.append(frozenset(component))

    def components_of_more_than_one(self) -> list[frozenset[str]]:
        for root in sorted(self.graph):
            if root in self.index:
                continue
            work: list = []
            self._enter(root, work)
            while work:
                node, edges = work[-1]
                target = self._next_unvisited(node, edges)
                if target is not None:
                    self._enter(target, work)
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    self.low[parent] = min(self.low[parent], self.low[node])
                self._close(node)
        return self.components


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit)."""
    return _Tarjan(graph).components_of_more_than_one()


def _package_and_own_submodule(component: frozenset[str]) -> bool:
    if len(component) != 2:
        return False
    first, second = sorted(component)
    return second.startswith(first + ".")


def import_cycles() -> list[frozenset[str]]:
    return [c for c in strongly_connected(import_graph()) if not _package_and_own_submodule(c)]


def cycle_path(graph: dict[str, set[str]], component: frozenset[str]) -> str:
    """One concrete cycle through the component, as `a -> b -> a`, for the failure message."""
    start = min(component)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & component):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return " -> ".join([start, *reversed(path[:-1]), start]) if len(path) > 1 else f"{start} -> {start}"
            if target not in previous:
                previous[target] = node
                queue.append(target)
    return " <-> ".join(sorted(component))


def test_no_import_cycles_beyond_the_known_ones():
    graph = import_graph()
    found = [cycle_path(graph, c) for c in import_cycles()]
    assert not found, "import cycles (function-local imports count):\n" + "\n".join(found)


def test_the_graph_sees_function_local_and_relative_imports():
    graph = import_graph()
    # queue_db/database_urls.py: `from .embedded_postgres import EmbeddedPostgres` (relative)
    assert "queue_db.embedded_postgres" in graph["queue_db.database_urls"]
    # orchestration/cli/administration.py imports the store cleanup inside `delete` (function-local)
    assert "orchestration.store_cleanup" in graph["orchestration.cli.administration"]
    cyclic = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    [component] = strongly_connected(cyclic)
    assert component == {"a", "b", "c"}
    assert cycle_path(cyclic, component) == "a -> b -> c -> a"
