"""Which accepted keys the memory model reads, and which of a workload's settings it does not.

`data/coverage.yaml` sorts every key the loader accepts into modelled, no_memory_effect and
not_modelled (with what each changes, the values and conditions under which it is inert, and a
bound on how far it can move the peak). `unmodelled(w)` lists the not-modelled settings of a
workload whose value matters, so a plan names each one instead of silently planning without it;
a setting at a value that changes nothing (null, its inert values, an unmet condition, a bound
of 0) is not named. They come largest possible effect first (memory/bounds.py), the ones the
model cannot size last.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple, Optional

from mbridge_recompute import DATA_DIR
from mbridge_recompute.memory import bounds

CATEGORIES = ("modelled", "no_memory_effect", "not_modelled")
_MISSING = object()


class Unmodelled(NamedTuple):
    key: str
    value: object
    changes: str
    bound: object = bounds.UNKNOWN        # the entry's bound expression
    effect_bytes: Optional[float] = None  # what it comes to on this workload (None: not sized)

    @property
    def setting(self) -> str:
        return self.key if self.value == "" else f"{self.key}={_show(self.value)}"

    def sentence(self) -> str:
        return (f"not modelled: {self.setting} ({self.changes}; "
                f"{bounds.words(self.bound, self.effect_bytes)})")


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


def _value_of(w, name: str, own, siblings=None):
    """A condition's name: the key's own value, a key of the judged key's own section the loader
    named (comm_overlap.tp_comm_overlap=true beside comm_overlap.tp_comm_overlap_cfg, before the
    model's own tp_comm_overlap), a Workload field or model key, or another noted key; a key the
    loader did not name sits at an inert value (None here)."""
    if name == "value":
        return own
    same, noted = siblings or ({}, {})
    if name in same:
        return same[name]
    for key in (name, f"ddp.{name}", f"optimizer.{name}", f"model.{name}"):
        v = lookup(w, key)
        if v is not _MISSING:
            return v
    return next((v for k, v in noted.items() if k == name or k.endswith("." + name)), None)


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


def _term(w, text: str, own, siblings=None) -> bool:
    text = text.strip()
    if text.endswith(" set"):
        return _value_of(w, text[:-4].strip(), own, siblings) is not None
    m = _TERM.match(text)
    if m:
        name, op, rhs = m.groups()
        left = _norm(_value_of(w, name, own, siblings))
        if op == "==":
            return left == _norm(_value_of(w, rhs, own, siblings))
        if op == ">":
            try:
                return float(left) > float(rhs)
            except (TypeError, ValueError):
                return True
        # the text itself too: 'none' is cuda_graph_impl's value "none", not null
        options = [(_literal(x), x.strip()) for x in rhs.split("/")]
        hit = any(left == o or (isinstance(left, str) and left in (str(o), raw)) for o, raw in options)
        return hit if op == "=" else not hit
    if re.fullmatch(r"[A-Za-z_][\w.]*", text):
        return bool(_value_of(w, text, own, siblings))
    return True            # a condition in words: assume it holds, so the key is reported


def holds(w, condition: str, own=None, siblings: Optional[tuple] = None) -> bool:
    """Evaluate a coverage condition (see data/coverage.yaml) on workload `w`; `siblings` is
    (the judged key's own section's noted keys by bare name, every noted key): what the loader
    named of the sections no Workload field holds (comm_overlap.tp_comm_overlap=true)."""
    return any(all(_term(w, t, own, siblings) for t in alt.split(" and "))
               for alt in condition.split(" or "))


def _inert(value, inert: list) -> bool:
    v = _norm(value)
    for x in inert:
        if v == x or (isinstance(v, list) and isinstance(x, list) and list(v) == x):
            return True
        if isinstance(v, float) and isinstance(x, (int, float)) and not isinstance(x, bool) and v == x:
            return True
    return False


def _matters(w, entry: dict, value, siblings: tuple) -> bool:
    """Whether `value` of a not-modelled entry can change memory on `w`: not null (unset: the
    default applies), not one of its inert values, its condition met and no inert_when."""
    if value is None or _inert(value, entry.get("inert", [])):
        return False
    if entry.get("requires") and not holds(w, entry["requires"], siblings=siblings):
        return False
    return not (entry.get("inert_when") and holds(w, entry["inert_when"], value, siblings))


def unmodelled(w, estimate=None) -> list[Unmodelled]:
    """The not-modelled settings of `w` whose value matters, largest possible effect on the peak
    first (sized on `estimate`, the current setting's memory.estimate; computed here when not
    given): its Workload fields judged here, then the input's other keys the loader named
    (`w.not_modelled`, inputs/fields.py: 'section.field=value', or a sentence of its own)."""
    from mbridge_recompute.workload import FIELDS

    data = load()
    entries = dict(data.get("notes") or {}, **data["not_modelled"])
    found: list = []
    for key, entry in data["not_modelled"].items():
        value = lookup(w, key) if key in FIELDS else _MISSING
        if value is not _MISSING and _matters(w, entry, value, ({}, {})):
            found.append((key, value, entry))
    seen = {k for k, _, _ in found}
    notes = [n.partition("=") for n in getattr(w, "not_modelled", None) or []]
    # the loader names a section's other keys only away from their inert values: a key it did
    # not name is at one (what a condition on it reads)
    siblings = {head: _note_value(w, head, text) for head, eq, text in notes if eq and " " not in head}
    for head, eq, text in notes:
        key = head[len("model."):] if head.startswith("model.") else head
        if not eq or " " in head:
            found.append((head + eq + text, "", {"changes": "as read from the input"}))
            continue
        if key in seen:
            continue
        seen.add(key)
        entry = entries.get(key) or entries.get(head)
        value = siblings[head]
        if entry is None:
            found.append((key, value, {"changes": "can change memory; not modelled"}))
        else:
            section = head.split(".", 1)[0] if "." in head else "model"
            same = {k.split(".", 1)[1]: v for k, v in siblings.items()
                    if "." in k and k.split(".", 1)[0] == section}
            if _matters(w, entry, value, (same, siblings)):
                found.append((key, value, entry))
    sized = _sized(w, estimate, found)
    out = [u for u in sized if u.effect_bytes is None or u.effect_bytes > 0]
    return sorted(out, key=lambda u: (u.effect_bytes is None, -(u.effect_bytes or 0)))


def _note_value(w, head: str, text: str):
    """A loader note's value: the workload's own where it keeps it (model keys), else read back
    (a note's own explanation, `peft=TARGET (why)`, is not part of it)."""
    key = head[len("model."):] if head.startswith("model.") else head
    value = lookup(w, key)
    if value is not _MISSING:
        return value
    m = re.fullmatch(r"(\S+) \((.*)\)", text, re.S)
    return _literal(m.group(1) if m else text)


def _sized(w, estimate, found: list) -> list:
    """Each found setting with what its bound comes to on `w` (bound 0 needs no estimate)."""
    exprs = [e.get("bound", bounds.UNKNOWN) for _, _, e in found]
    if estimate is None and any(x not in (0, bounds.UNKNOWN) for x in exprs):
        estimate = estimate_or_none(w)
    values = bounds.figures(w, estimate) if estimate is not None else None
    out = []
    for (key, value, entry), expr in zip(found, exprs):
        nbytes = 0.0 if expr == 0 else (bounds.evaluate(expr, values, value) if values else None)
        out.append(Unmodelled(key, value, entry["changes"], expr, nbytes))
    return out


def estimate_or_none(w):
    """The current setting's estimate, or None where the memory model cannot lay `w` out."""
    from mbridge_recompute import memory
    from mbridge_recompute.errors import InputError

    try:
        return memory.estimate(w)
    except (InputError, ValueError, ZeroDivisionError):
        return None


def findings(w, settings: list | None = None) -> list[dict]:
    """Warning findings, one per not-modelled setting (`settings`, else `unmodelled(w)`), in the
    findings' shape."""
    return [{"id": "not-modelled", "severity": "warning", "kind": "model-coverage",
             "message": u.sentence(), "field": u.key, "value": _show(u.value),
             "changes": u.changes, "effect_bytes": None if u.effect_bytes is None else int(u.effect_bytes),
             "effect_bound": str(u.bound),
             "fix": "the plan does not account for it: compare with a measured run",
             "source": "memory-model", "citation": "", "upstream_message": ""}
            for u in (unmodelled(w) if settings is None else settings)]
