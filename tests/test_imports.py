"""No import circle between the files of a package (issue 33): read from the source, nothing imported.

NOTE [import graph]: a file imports the module its ``import``/``from`` statement names,
wherever the statement stands (module level or inside a function: a lazy import is a
dependency too, it only moves the moment it is paid). ``from pkg.mod import name`` is an
edge to ``pkg/mod/name.py`` when that file exists (a submodule), else to ``pkg/mod``
(its ``.py`` or ``__init__.py``); ``import pkg.mod`` is an edge to ``pkg.mod`` alone: the
package ``__init__`` files Python runs on the way are not counted, or every package that
re-exports its modules would be a circle with each of them. Only the project's own
packages are nodes; imports of anything else are ignored.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cachepipe", "loaders", "trainer", "comm", "tools")

def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of the project's modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports (NOTE [import graph])."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        out.update(m for m in (_resolve(n, modules) for n in names) if m is not None and m != module)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted tuples."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(tuple(sorted(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _describe(group: tuple[str, ...], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
    return f"{', '.join(group)} ({'; '.join(edges)})"


def test_the_graph_sees_absolute_relative_and_lazy_imports():
    graph = import_graph()
    assert "tools.cli" in graph["tools.bench.harness.runner"]  # module level, from-import of a module
    assert "tools.cache_flags" in graph["tools.warmup"]  # inside a function
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]


def test_no_import_circle_between_files():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(_describe(c, graph) for c in cycles)
