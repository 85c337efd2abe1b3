"""The package's imports form no circle: not between two modules, and not between two stages
(`inputs/`, `memory/`, `rules/`, `plan/`, `runs/`, `logs/`, ... and the top-level modules), so
that each stage can be read, and tested, with only what lies below it. Imports inside functions
count too: a deferred import is still a dependency."""

from __future__ import annotations

import ast

from conftest import SCRIPTS

PACKAGE = SCRIPTS / "mbridge_recompute"


def _module(path) -> str:
    rel = path.relative_to(SCRIPTS).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path) -> set:
    """The package modules `path` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from mbridge_recompute.x import y`: y is a module when such a file exists
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != "mbridge_recompute":      # the package's face is no dependency
                out.add(name)
    return out


def _cycles(graph: dict) -> list:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _stage(module: str) -> str:
    """`mbridge_recompute.plan.report` -> `plan`; a top-level module is its own stage."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py"):
        return parts[1]
    return module


GRAPH = {m: {d for d in _imports(p) if d != m} for m, p in MODULES.items()}


def test_the_reader_of_the_graph_sees_deferred_and_from_imports():
    # a deferred import inside a function, and a `from PACKAGE import MODULE`, are both edges
    # render_text imports plan.report (CAVEAT) inside the function, commands/plan.py nowhere else
    assert "mbridge_recompute.plan.report" in GRAPH["mbridge_recompute.commands.plan"]
    assert "mbridge_recompute.memory.lora" in GRAPH["mbridge_recompute.memory.shape"]
    assert "mbridge_recompute.yamlio" in GRAPH["mbridge_recompute.files"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other_through_any_chain():
    assert _cycles(GRAPH) == []


def test_no_two_stages_import_each_other_through_any_chain():
    stages = {}
    for module, deps in GRAPH.items():
        stages.setdefault(_stage(module), set()).update(
            _stage(d) for d in deps if _stage(d) != _stage(module))
    assert len(stages) > 15
    assert _cycles(stages) == []
