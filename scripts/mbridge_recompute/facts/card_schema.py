"""Schema of `card.yaml`: field names and types, checked without extra dependencies.

The card is read by code (labels, rules), by the guide's generated blocks and by people, so
a typo there is a bug everywhere. `validate(card)` returns a list of problems
(empty when the card is well-formed); each names the path of the bad field, e.g.
`evidence[1].rows[3].peak_allocated_gb: expected a number, got 'n/a'`.

Run on a file: `python3 -m mbridge_recompute.facts.card_schema card.yaml` (exit 0 when
valid, 1 with one problem per line otherwise).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

TOP_LEVEL = {
    "schema_version": "int", "name": "str", "title": "str", "releases": "map", "bridge_pins": "list",
    "bridge_releases": "map", "bridge_tests": "map", "abbreviations": "map", "enums": "map",
    "gpus": "map", "precision_recipes": "map", "labels": "list", "constraints": "list",
    "evidence": "list", "limitations": "list", "memory_bugs": "list",
}
EXCEPTIONS = {"ValueError", "AssertionError", "TypeError", "NotImplementedError", "KeyError",
              "IndexError", "NameError", "RuntimeError", "ImportError"}
SEVERITIES = {"error", "warning", "info"}
# where a rule bites: TransformerConfig, Megatron-LM training arguments, the first forward,
# nowhere (a label that silently does nothing), Megatron Bridge's own validation, or guidance
CONSTRAINT_KINDS = {"config", "training-args", "runtime", "silent-no-op", "advice", "bridge"}
EVIDENCE_KINDS = {"matched_sweep", "capacity_sweep", "historical"}
CAPACITY_KINDS = {"cited", "derived"}
_CC = re.compile(r"^\d+\.\d+$")
# Conditions every evidence entry states, so that no number travels without its workload.
EVIDENCE_CONDITIONS = ("model", "hardware", "precision", "parallelism", "seq_length",
                       "micro_batch_size", "global_batch_size", "revisions", "steps",
                       "memory_point", "time_window")
ROW_NUMBERS = ("peak_allocated_gb", "peak_memory_gb", "step_time_ms", "tflops_per_gpu",
               "delta_peak_pct", "delta_time_pct")


def _not_bool(kinds):
    return lambda v: isinstance(v, kinds) and not isinstance(v, bool)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str) and v.strip() != "",
    "text": lambda v: isinstance(v, str),
    "int": _not_bool(int),
    "number": _not_bool((int, float)),
    "bool": lambda v: isinstance(v, bool),
    "map": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "strlist": lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
}


def _type_ok(value: Any, kind: str) -> bool:
    if kind not in _TYPES:
        raise ValueError(kind)
    return _TYPES[kind](value)


_NAMES = {"str": "a non-empty string", "text": "a string", "int": "an integer", "number": "a number",
          "bool": "true or false", "map": "a mapping", "list": "a list",
          "strlist": "a list of non-empty strings"}


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, path: str, reason: str) -> None:
        self.problems.append(f"{path}: {reason}")

    def field(self, obj: dict, key: str, kind: str, path: str, required: bool = True) -> bool:
        """True when the field is present and of the right type."""
        if key not in obj or obj[key] is None:
            if required:
                self.bad(f"{path}.{key}", "missing")
            return False
        if not _type_ok(obj[key], kind):
            self.bad(f"{path}.{key}", f"expected {_NAMES[kind]}, got {obj[key]!r}")
            return False
        return True

    def entries(self, card: dict, key: str, check: Callable[[dict, str], None]) -> None:
        seen: set = set()
        for i, entry in enumerate(card.get(key) or []):
            path = f"{key}[{i}]"
            if not isinstance(entry, dict):
                self.bad(path, f"expected a mapping, got {entry!r}")
                continue
            ident = entry.get("label" if key == "labels" else "id")
            if ident in seen:
                self.bad(path, f"duplicate {ident!r}")
            seen.add(ident)
            check(entry, path)


def validate(card: Any) -> list[str]:
    """Every problem in `card` (a parsed card.yaml), or [] when it is well-formed."""
    c = _Checker()
    if not isinstance(card, dict):
        return [f"card: expected a mapping at the top level, got {type(card).__name__}"]
    for key in sorted(set(card) - set(TOP_LEVEL)):
        c.bad(key, f"unknown top-level key (known: {', '.join(TOP_LEVEL)})")
    for key, kind in TOP_LEVEL.items():
        c.field(card, key, kind, "card")
    release_map = card.get("releases") if isinstance(card.get("releases"), dict) else {}
    order = list(release_map)
    for v, meta in release_map.items():
        if not isinstance(meta, dict) or not _type_ok(meta.get("tag"), "str"):
            c.bad(f"releases.{v}", "needs a 'tag' naming the git tag or commit its citations refer to")
    abbreviations = card.get("abbreviations") if isinstance(card.get("abbreviations"), dict) else {}

    def release_range(value, p: str) -> None:
        if not _type_ok(value, "str"):
            c.bad(p, "expected a release range such as 0.16-main or 0.19")
            return
        lo, _, hi = value.partition("-")
        for end in (lo, hi or lo):
            if end not in order:
                c.bad(p, f"{end!r} is not one of the card's releases ({', '.join(order)})")
        if lo in order and (hi or lo) in order and order.index(lo) > order.index(hi or lo):
            c.bad(p, f"{value!r} runs backwards")

    def location(value, p: str) -> None:
        from mbridge_recompute.facts.card import site

        try:
            where = site(value)
        except ValueError as e:
            c.bad(p, str(e))
            return
        for s in (where, where.caller):
            # a bare name must be an abbreviation: nothing else says which directory it is in
            if s and s.file not in abbreviations and "/" not in s.file:
                c.bad(p, f"{s.file!r} is neither a path nor a card abbreviation")

    def label(e: dict, p: str) -> None:
        c.field(e, "label", "str", p)
        release_range(e.get("releases"), f"{p}.releases")
        for key in ("boundary", "mechanism", "replay_cost", "source"):
            c.field(e, key, "str", p)
        c.field(e, "applies_to", "strlist", p)
        c.field(e, "needs_te", "bool", p)
        c.field(e, "caveats", "strlist", p, required=False)
        c.field(e, "contains", "strlist", p, required=False)
        c.field(e, "baseline", "map", p, required=False)
        # what the memory model says of it: no terms at all, or what it drops (per attention core
        # or `any`) and the layer blocks it needs
        if c.field(e, "memory", "map", p):
            mem = e["memory"]
            if "not_modelled" in mem:
                c.field(mem, "not_modelled", "str", f"{p}.memory")
            elif c.field(mem, "drops", "map", f"{p}.memory"):
                for key, text in mem["drops"].items():
                    if not _type_ok(text, "str"):
                        c.bad(f"{p}.memory.drops.{key}", "expected a non-empty string")
            c.field(mem, "needs_layers", "map", f"{p}.memory", required=False)

    def constraint(e: dict, p: str) -> None:
        for key in ("id", "condition", "fix"):
            c.field(e, key, "str", p)
        # an upstream assert without a message is a real case, so '' is allowed here
        c.field(e, "message", "text", p)
        if c.field(e, "severity", "str", p) and e["severity"] not in SEVERITIES:
            c.bad(f"{p}.severity", f"{e['severity']!r} is not one of {sorted(SEVERITIES)}")
        if c.field(e, "kind", "str", p) and e["kind"] not in CONSTRAINT_KINDS:
            c.bad(f"{p}.kind", f"{e['kind']!r} is not one of {sorted(CONSTRAINT_KINDS)}")
        if "raises" in e and e["raises"] not in EXCEPTIONS:
            c.bad(f"{p}.raises", f"{e['raises']!r} is not one of {sorted(EXCEPTIONS)}")
        if e.get("kind") == "config" and e.get("severity") == "error" and "raises" not in e:
            c.bad(f"{p}.raises", "a config error names the exception megatron-core raises")
        if c.field(e, "at", "map", p):
            if not e["at"]:
                c.bad(f"{p}.at", "empty: name every release it holds for")
            for key, loc in e["at"].items():
                if key not in order:
                    c.bad(f"{p}.at", f"{key!r} is not one of the card's releases")
                location(loc, f"{p}.at.{key}")
        c.field(e, "params", "map", p, required=False)
        # where Transformer Engine raises it, for a rule TE decides (file:line @ TE tag)
        c.field(e, "te_source", "str", p, required=False)
        # a Bridge rule: the Megatron Bridge release whose line each `at` entry cites
        if e.get("kind") == "bridge" and c.field(e, "bridge", "map", p):
            if set(e["bridge"]) != set(e.get("at") or {}):
                c.bad(f"{p}.bridge", "needs one Bridge release for every release in `at`")
            for key, rel in e["bridge"].items():
                if not _type_ok(rel, "str"):
                    c.bad(f"{p}.bridge.{key}", f"expected a Bridge release, got {rel!r}")
        if c.field(e, "changes", "list", p, required=False):
            for j, ch in enumerate(e["changes"]):
                cp = f"{p}.changes[{j}]"
                if not isinstance(ch, dict) or ch.get("since") not in order:
                    c.bad(cp, "needs since: one of the card's releases")
                    continue
                for key in set(ch) - {"since", "message", "raises", "params"}:
                    c.bad(f"{cp}.{key}", "unknown change field (message, raises, params)")

    def enum(name: str, rows) -> None:
        if not isinstance(rows, list) or not rows:
            c.bad(f"enums.{name}", "expected a list of {releases, values, source}")
            return
        for j, row in enumerate(rows):
            ep = f"enums.{name}[{j}]"
            if not isinstance(row, dict):
                c.bad(ep, "expected a mapping")
                continue
            release_range(row.get("releases"), f"{ep}.releases")
            c.field(row, "values", "strlist", ep)
            c.field(row, "source", "str", ep)
            if "raised_at" in row:       # where a value outside the list is refused, per release
                location(row["raised_at"], f"{ep}.raised_at")

    for name, rows in (card.get("enums") or {}).items():
        enum(name, rows)

    def gpu(name: str, e) -> None:
        p = f"gpus.{name}"
        if not isinstance(e, dict):
            c.bad(p, "expected a mapping")
            return
        for key in ("title", "source", "architecture", "cc_source"):
            c.field(e, key, "str", p)
        c.field(e, "aliases", "list", p)
        for key in ("marketed_gb", "total_gib"):
            c.field(e, key, "number", p)
        if c.field(e, "capacity", "str", p) and e["capacity"] not in CAPACITY_KINDS:
            c.bad(f"{p}.capacity", f"{e['capacity']!r} is not one of {sorted(CAPACITY_KINDS)}")
        cc = e.get("compute_capability", "missing")
        if cc == "missing":
            c.bad(f"{p}.compute_capability", "missing (null for a GPU Transformer Engine does not check)")
        elif cc is not None and not (isinstance(cc, str) and _CC.match(cc)):
            c.bad(f"{p}.compute_capability", f"expected 'major.minor' as text, got {cc!r}")

    for name, entry in (card.get("gpus") or {}).items():
        gpu(name, entry)
    constraint_ids = {e.get("id") for e in card.get("constraints") or [] if isinstance(e, dict)}
    for name, e in (card.get("precision_recipes") or {}).items():
        p = f"precision_recipes.{name}"
        if not isinstance(e, dict):
            c.bad(p, "expected a mapping")
            continue
        for key in ("min_cc", "below_cc"):
            if key in e and not (isinstance(e[key], str) and _CC.match(e[key])):
                c.bad(f"{p}.{key}", f"expected 'major.minor' as text, got {e[key]!r}")
        if c.field(e, "constraints", "strlist", p):
            for cid in set(e["constraints"]) - constraint_ids:
                c.bad(f"{p}.constraints", f"{cid!r} is not a constraint id")
    tests = card.get("bridge_tests") if isinstance(card.get("bridge_tests"), dict) else {}
    for key, b in (card.get("bridge_releases") or {}).items():
        bp = f"bridge_releases.{key}"
        if not isinstance(b, dict):
            c.bad(bp, "expected a mapping")
            continue
        for name in ("read_at", "package_info", "local_entry", "local_entry_recipes", "seq_length_why",
                     "dryrun_why", "core_why"):
            c.field(b, name, "str", bp)
        c.field(b, "local_env_note", "text", bp)
        for name in ("seq_length_sets_model", "dryrun_validates"):
            c.field(b, name, "bool", bp)
        for name in ("task_choices", "core_tests"):
            c.field(b, name, "strlist", bp)
        for name in b.get("core_tests") or []:
            if name not in tests:
                c.bad(f"{bp}.core_tests", f"{name!r} is not one of bridge_tests")

    def evidence(e: dict, p: str) -> None:
        for key in ("id", "title", "source", "reading", "control"):
            c.field(e, key, "str", p)
        if c.field(e, "kind", "str", p) and e["kind"] not in EVIDENCE_KINDS:
            c.bad(f"{p}.kind", f"{e['kind']!r} is not one of {sorted(EVIDENCE_KINDS)}")
        if c.field(e, "conditions", "map", p):
            for key in EVIDENCE_CONDITIONS:
                if key in ("seq_length", "micro_batch_size", "global_batch_size"):
                    c.field(e["conditions"], key, "int", f"{p}.conditions")
                elif key == "steps":
                    cond = e["conditions"]
                    if key not in cond or not (_type_ok(cond[key], "int") or _type_ok(cond[key], "str")):
                        c.bad(f"{p}.conditions.steps", "missing (an integer, or 'not stated')")
                else:
                    c.field(e["conditions"], key, "str", f"{p}.conditions")
        c.field(e, "limits", "strlist", p)
        # the example workload that states the study's conditions (a path in the skill)
        c.field(e, "workload", "str", p, required=False)
        if c.field(e, "rows", "list", p):
            if not e["rows"]:
                c.bad(f"{p}.rows", "empty")
            for j, row in enumerate(e["rows"]):
                rp = f"{p}.rows[{j}]"
                if not isinstance(row, dict):
                    c.bad(rp, f"expected a mapping, got {row!r}")
                    continue
                if "modules" not in row or not _type_ok(row["modules"], "strlist"):
                    c.bad(f"{rp}.modules", "expected a list of labels ([] for the control)")
                c.field(row, "outcome", "str", rp)
                for key in ROW_NUMBERS:
                    c.field(row, key, "number", rp, required=False)
                c.field(row, "peak_after_iteration", "int", rp, required=False)
                # names of this row's values that the source gives only approximately ("≈ 704")
                if c.field(row, "approximate", "strlist", rp, required=False):
                    for key in set(row["approximate"]) - set(ROW_NUMBERS):
                        c.bad(f"{rp}.approximate", f"{key!r} is not a numeric row field")
                c.field(row, "note", "str", rp, required=False)
                for key in set(row) - {"modules", "outcome", "peak_after_iteration",
                                       "approximate", "note", *ROW_NUMBERS}:
                    c.bad(f"{rp}.{key}", "unknown row field")

    def limitation(e: dict, p: str) -> None:
        c.field(e, "id", "str", p)
        c.field(e, "text", "str", p)

    def memory_bug(e: dict, p: str) -> None:
        for key in ("id", "condition", "size", "issue", "fix"):
            c.field(e, key, "str", p)
        if c.field(e, "releases", "str", p):
            release_range(e["releases"], f"{p}.releases")
        if c.field(e, "at", "map", p):
            for v, where in e["at"].items():
                if v not in order:
                    c.bad(f"{p}.at.{v}", f"{v!r} is not one of the card's releases")
                location(where, f"{p}.at.{v}")
        c.field(e, "note", "str", p, required=False)

    c.entries(card, "labels", label)
    c.entries(card, "constraints", constraint)
    c.entries(card, "evidence", evidence)
    c.entries(card, "limitations", limitation)
    c.entries(card, "memory_bugs", memory_bug)
    return c.problems


def check_file(path: str | Path) -> list[str]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        return [f"{path}: {exc}".splitlines()[0]]
    return validate(data)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: python3 -m mbridge_recompute.facts.card_schema CARD.yaml\n")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    problems = check_file(argv[0])
    for line in problems:
        sys.stderr.write(line + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
