"""No Python literal in the package names a release: which megatron-core or Megatron Bridge
releases exist, what each holds and which one is the default are the card's (and the generated
data files'), so that adding a release is a data change (CONTRIBUTING.md, "Add a release").

Scanned: every string constant of the package that is not a docstring, and every tuple of
integers shaped like a version. A literal is a release name when it equals a name the card
gives a release: a key, a patch, a tag or commit, a Bridge tag, a package_info version.
Citations inside longer text (`file:line @ core_v0.16.1`) are citations, not names, and stay.
"""

from __future__ import annotations

import ast

from mbridge_recompute.facts import card

from conftest import SCRIPTS

PACKAGE = SCRIPTS / "mbridge_recompute"


def release_names() -> set[str]:
    data = card.load()
    names = set()
    for key, meta in data["releases"].items():
        names |= {key, str(meta.get("tag")), str(meta.get("commit")), str(meta.get("newest") or key)}
        names |= {str(p) for p in meta.get("patches") or []}
        if meta.get("package_version"):
            names.add(str(meta["package_version"]))
    for key, meta in data["bridge_releases"].items():
        names |= {key, str(meta["read_at"]), str(meta["package_info"]), *map(str, meta.get("tags") or [])}
    for pin in data.get("bridge_pins") or []:
        names.add(str(pin["bridge"]))
    names.discard("main")          # the development head is a concept the code names, not a release
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def release_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) for every literal of `source` that names a release."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    minors = {tuple(int(x) for x in n.split(".")[:2]) for n in names
              if n.replace(".", "").isdigit() and n.count(".") >= 1}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value.strip() in names:
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.Tuple) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
            value = tuple(e.value for e in node.elts)
            if len(value) == 3 and value[:2] in minors:     # (0, 7, 0): a version compared
                out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def test_no_python_literal_in_the_package_names_a_release():
    names = release_names()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = release_literals(path.read_text(encoding="utf-8"), names)
        if hits:
            found[str(path.relative_to(PACKAGE))] = hits
    assert found == {}


def test_the_literal_scan_catches_a_silent_fallback_and_a_version_tuple():
    names = release_names()
    source = '''"""A docstring may say 0.19."""
key = release if release in defs else "0.19"
tag = "core_v0.16.1"
if vt >= (0, 7, 0):
    pass
where = "tc:1208 @ core_v0.16.1"
exit_codes = (0, 5)
'''
    hits = release_literals(source, names)
    assert [line for line, _ in hits] == [2, 3, 4], hits
    assert {"0.19", "0.6", "core_v0.16.1", "0.19.2", "v0.5.1"} <= names
