"""Which accepted keys the memory model reads, and which of a workload's settings it does not.

`data/coverage.yaml` sorts every key the loader accepts into modelled, no_memory_effect and
not_modelled (with what each changes and the values under which it is inert). `unmodelled(w)`
lists the not-modelled settings of a workload whose value matters, so a plan names each one
instead of silently planning without it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from mbridge_recompute import DATA_DIR

CATEGORIES = ("modelled", "no_memory_effect", "not_modelled")
_MISSING = object()


class Unmodelled(NamedTuple):
    key: str
    value: object
    changes: str

    def sentence(self) -> str:
        if self.value == "":
            return f"not modelled: {self.key} ({self.changes})"
        return f"not modelled: {self.key}={_show(self.value)} ({self.changes})"


@lru_cache(maxsize=1)
def load() -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((DATA_DIR / "coverage.yaml").read_text(encoding="utf-8"), Loader=loader)


def category(key: str):
    """'modelled', 'no_memory_effect', 'not_modelled', or None for a key the file does not know."""
    data = load()
    return next((c for c in CATEGORIES if key in data[c]), None)


def _norm(value):
    """Bridge dumps write dtypes and callables as {_target_: NAME}: compare NAME's last part."""
    if isinstance(value, dict) and "_target_" in value:
        value = str(value["_target_"])
    if isinstance(value, str) and value.startswith("torch."):
        value = value[len("torch."):]
    return value


def _show(value) -> str:
    value = _norm(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def lookup(w, key: str):
    """A key's value in `w`: a Workload field or a model key kept in extra_model; _MISSING when
    the workload does not hold it."""
    from mbridge_recompute.workload import FIELDS

    if key in FIELDS:
        return getattr(w, key)
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    if key in extra:
        return extra[key]
    return _MISSING


def _value_of(w, name: str, own):
    if name == "value":
        return own
    for key in (name, f"ddp.{name}", f"optimizer.{name}", f"model.{name}"):
        v = lookup(w, key)
        if v is not _MISSING:
            return v
    return None


_TERM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(==|!=|=|>)\s*(.+?)\s*$")


def _literal(text: str):
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return float(t) if "." in t else int(t)
    except ValueError:
        return t


def _term(w, text: str, own) -> bool:
    text = text.strip()
    if text.endswith(" set"):
        return _value_of(w, text[:-4].strip(), own) is not None
    m = _TERM.match(text)
    if m:
        name, op, rhs = m.groups()
        left = _norm(_value_of(w, name, own))
        if op == "==":
            return left == _norm(_value_of(w, rhs, own))
        if op == ">":
            try:
                return float(left) > float(rhs)
            except (TypeError, ValueError):
                return True
        options = [_literal(x) for x in rhs.split("/")]
        hit = any(left == o or (isinstance(left, str) and str(o) == left) for o in options)
        return hit if op == "=" else not hit
    if re.fullmatch(r"[A-Za-z_][\w.]*", text):
        return bool(_value_of(w, text, own))
    return True            # a condition in words: assume it holds, so the key is reported


def holds(w, condition: str, own=None) -> bool:
    """Evaluate a coverage condition (see data/coverage.yaml) on workload `w`."""
    return any(all(_term(w, t, own) for t in alt.split(" and ")) for alt in condition.split(" or "))


def _inert(value, inert: list) -> bool:
    v = _norm(value)
    for x in inert:
        if v == x or (isinstance(v, list) and isinstance(x, list) and list(v) == x):
            return True
        if isinstance(v, float) and isinstance(x, (int, float)) and not isinstance(x, bool) and v == x:
            return True
    return False


def unmodelled(w) -> list[Unmodelled]:
    """The not-modelled settings of `w` whose value matters: its Workload fields judged here, in
    the file's order, then the input's other keys the loader judged (`w.not_modelled`,
    inputs/fields.py: 'section.field=value', or a sentence of its own)."""
    from mbridge_recompute.workload import FIELDS

    out = []
    for key, entry in load()["not_modelled"].items():
        if key not in FIELDS:
            continue
        value = lookup(w, key)
        if value is _MISSING or _inert(value, entry.get("inert", [])):
            continue
        if entry.get("requires") and not holds(w, entry["requires"]):
            continue
        if entry.get("inert_when") and holds(w, entry["inert_when"], value):
            continue
        out.append(Unmodelled(key, value, entry["changes"]))
    data = load()["not_modelled"]
    seen = {u.key for u in out}
    for note in getattr(w, "not_modelled", None) or []:
        head, eq, value = note.partition("=")
        key = head[len("model."):] if head.startswith("model.") else head
        if not eq or " " in head:
            out.append(Unmodelled(note, "", "as read from the input"))
        elif key not in seen:
            entry = data.get(key) or data.get(head) or {}
            out.append(Unmodelled(key, value, entry.get("changes", "can change memory; not modelled")))
            seen.add(key)
    return out


def findings(w, settings: list | None = None) -> list[dict]:
    """Warning findings, one per not-modelled setting (`settings`, else `unmodelled(w)`), in the
    findings' shape."""
    return [{"id": "not-modelled", "severity": "warning", "kind": "model-coverage",
             "message": u.sentence(), "field": u.key, "value": _show(u.value),
             "fix": "the plan does not account for it: compare with a measured run",
             "source": "memory-model", "citation": "", "upstream_message": ""}
            for u in (unmodelled(w) if settings is None else settings)]
