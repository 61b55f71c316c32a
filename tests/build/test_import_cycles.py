"""No import cycle among fastenc's modules.

The graph: module A -> module B when A's source imports B, read with ast (nothing is imported). What counts:
  - every `import` / `from ... import` that runs when the module is imported: module level, inside module-level
    `if` / `try` / `with` blocks and class bodies (not under `if TYPE_CHECKING:`, which never runs);
  - the imports inside functions as well: a deferred import that closes a loop hides the cycle instead of removing
    it (the two modules still need each other, and which one finishes loading first decides what the other
    sees), except a function's import of the root package `fastenc` itself, the public facade that Python has
    loaded before any of its submodules;
  - `from pkg import name` is an edge to pkg.name when that is a module of the tree, else to pkg;
  - a module's parent packages, which Python initialises before it, are not edges of their own (a package's
    __init__ importing its submodules is the ordinary layout, not a cycle).
Each cycle found is named, module by module.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "fastenc"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], deferred: bool = False):
    """(import statement, whether it runs only when a function is called) for every import of `body`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse, deferred)
        else:
            inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child], inner)
                elif isinstance(child, ast.excepthandler):
                    yield from _imports(child.body, inner)


def _targets(module: str, path: Path, node, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        if sub in known:
            out.append(sub)
        elif base in known:
            out.append(base)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {t for node, deferred in _imports(tree.body)
                         for t in _targets(module, path, node, known)
                         if t != module and not (deferred and t == PACKAGE)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(comp)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "fastenc.registry" in graph["fastenc.ops.gelu"]
    assert "fastenc.ops.gelu" in graph["fastenc.ops"]
    assert "fastenc.models.architecture" in graph["fastenc.lora_files"]  # imported inside a function


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles among fastenc's modules:\n" + "\n".join(" -> ".join(c) for c in found)
