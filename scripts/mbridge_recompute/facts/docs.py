"""The card as the markdown the guide shows: labels by release, the rules that differ between
releases, every constraint with its exact message per release, and the known limitations.

SKILL.md and references/ hold these tables between `<!-- card:NAME -->` and
`<!-- /card:NAME -->` markers; tests/test_card.py fails when a block differs from what the card
renders, and `python3 -m mbridge_recompute.facts.docs --write` rewrites the blocks in place.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from mbridge_recompute import SKILL_ROOT
from mbridge_recompute.facts import card, releases

ROOT = SKILL_ROOT or Path(__file__).resolve().parents[3]   # the docs live in the skill's root
BLOCKS = {                       # block name -> the files that carry it
    "label-releases": ("SKILL.md",),
    "labels": ("references/labels.md",),
    "release-differences": ("references/constraints.md",),
    "constraints": ("references/constraints.md",),
    "limitations": ("references/memory-model.md",),
    "gpus": ("references/constraints.md",),
    "silent-skips": ("references/constraints.md",),
}
WIDTH = 100                      # SKILL.md's line limit
KIND_TITLES = {
    "config": "TransformerConfig / ModelParallelConfig `__post_init__` (raised when the config is built)",
    "training-args": "Megatron-LM training arguments (`megatron/training/arguments.py`)",
    "runtime": "At model build or in the first forward",
    "silent-no-op": "Accepted, but does nothing",
    "advice": "No upstream check: what the setting means",
    "bridge": "Megatron Bridge's own validation (`ConfigContainer.validate()`, the model provider)",
}


def _tick(holds: bool) -> str:
    return "yes" if holds else "–"


def label_matrix() -> str:
    """Labels × releases, with what each discards and whether it needs Transformer Engine."""
    keys = releases.keys()
    head = "| label | " + " | ".join(keys) + " | discards (boundary) | TE at runtime |"
    out = [head, "|---|" + "---|" * len(keys) + "---|---|"]
    for e in card.load()["labels"]:
        cells = [_tick(releases.in_range(k, e["releases"])) for k in keys]
        out.append(f"| `{e['label']}` | " + " | ".join(cells)
                   + f" | {e['boundary']} | {'yes' if e['needs_te'] else 'no'} |")
    return "\n".join(out)


def _span(spec: str) -> str:
    """A label's `releases` spec as a phrase: which releases have it."""
    numbered = [k for k in releases.keys() if k != "main"]
    lo, _, hi = spec.partition("-")
    hi = hi or lo
    if (lo, hi) == ("main", "main"):
        return "Megatron-LM main only, in no release"
    if hi == "main":
        if lo == numbered[0]:
            return f"every release ({numbered[0]} to {numbered[-1]}) and main"
        return f"from {lo} (and main)"
    return f"{lo} only" if lo == hi else f"{lo} to {hi}, not main"


def _bullet(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="- ", subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)


def label_releases() -> str:
    """Which releases accept which labels, and which labels need Transformer Engine, as bullets
    that fit SKILL.md's width (the full matrix is references/labels.md's)."""
    by_span: dict[str, list[str]] = {}
    for e in card.load()["labels"]:
        by_span.setdefault(e["releases"], []).append(f"`{e['label']}`")
    out = [_bullet(f"{_span(spec)[0].upper()}{_span(spec)[1:]}: {', '.join(names)}.")
           for spec, names in by_span.items()]
    te = [f"`{e['label']}`" for e in card.load()["labels"] if e["needs_te"]]
    out.append(_bullet(f"Transformer Engine needed at runtime, even in bf16: {', '.join(te)}."))
    return "\n".join(out)


def limitations() -> str:
    """The card's known limitations, one bullet each, in card order."""
    return "\n".join(_bullet(e["text"]) for e in card.load()["limitations"])


def _differs(c: dict) -> bool:
    return set(c["at"]) != set(releases.keys()) or bool(c.get("changes"))


def _cell(cid: str, key: str, previous) -> str:
    now = card.constraint_at(cid, key)
    if now is None:
        return "–"
    if previous is None:
        return "yes"
    changed = [f for f in ("message", "raises") if now.get(f) != previous.get(f)]
    if now.get("params") != previous.get("params"):
        changed.append("condition")
    return "yes, new " + " and ".join(changed) if changed else "yes"


def release_differences() -> str:
    """The rules that do not hold alike in every release, one column per release."""
    keys = releases.keys()
    out = ["| rule | kind | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for c in card.constraints():
        if not _differs(c):
            continue
        cells, previous = [], None
        for k in keys:
            cells.append(_cell(c["id"], k, previous))
            previous = card.constraint_at(c["id"], k) or previous
        out.append(f"| `{c['id']}` | {c['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _table_text(text: str) -> str:
    """Text for a markdown table cell: a `|` is escaped, never rewritten (a hybrid pattern's
    `|` and an MTP `/` mean different things)."""
    return text.replace("|", "\\|")


def _message_cell(text: str) -> str:
    if not text:
        return "(bare `assert`, no message)"
    if text in ("runtime only", "silent no-op"):
        return text
    return "`" + _table_text(text).replace("`", "'") + "`"


def constraint_tables() -> str:
    """Every constraint, grouped by where it bites: condition, exact message(s) with the
    releases and lines they hold for, exception, fix."""
    out = []
    for kind, title in KIND_TITLES.items():
        rows = [c for c in card.constraints() if c["kind"] == kind]
        if not rows:
            continue
        out += [f"### {title}", "", "| id | condition | message (releases: lines) | raises | fix |",
                "|---|---|---|---|---|"]
        for c in rows:
            parts = []
            for message, keys in card.message_variants(c["id"]):
                where = "; ".join(f"{k}: {c['at'][k]}" for k in keys)
                parts.append(f"{_message_cell(message)} ({where})")
            raises = sorted({card.constraint_at(c["id"], k).get("raises") or "" for k in c["at"]} - {""})
            out.append(f"| `{c['id']}` | {_table_text(c['condition'])} | " + "<br>".join(parts)
                       + f" | {', '.join(raises) or '–'} | {_table_text(c['fix'])} |")
        out.append("")
    return "\n".join(out).rstrip()


def silent_skip_table() -> str:
    """What upstream accepts and then skips or overrides without an error, per release: the
    card's silent no-ops, each with the line that decides it in every release it holds for."""
    keys = releases.keys()
    out = ["| skip (`check` warning id) | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for c in card.constraints():
        if c["kind"] != "silent-no-op":
            continue
        out.append(f"| `{c['id']}` | " + " | ".join(c["at"].get(k, "–") for k in keys) + " |")
    return "\n".join(out)


def gpu_table() -> str:
    """Each GPU: what PyTorch reports, its architecture and compute capability, and the FP8 / FP4
    recipes Transformer Engine runs on it (card `gpus:` and `precision_recipes:`)."""
    from mbridge_recompute.facts import gpus

    order = list(gpus.recipes_table())
    out = ["| GPU (`cluster.gpu`) | PyTorch reports | architecture | compute capability | "
           + " | ".join(f"`{r}`" for r in order) + " |",
           "|---|---|---|---|" + "---|" * len(order)]
    for name, e in gpus.table().items():
        runs = gpus.recipes_for(name)
        cells = ["not decided" if runs is None else ("yes" if r in runs else "no") for r in order]
        out.append(f"| `{name}` ({e['title']}) | {e['total_gib']:.2f} GiB ({e['capacity']}) | "
                   f"{e['architecture']} | {e['compute_capability'] or '–'} | " + " | ".join(cells) + " |")
    notes = [f"`{r}`: {e['note']}" for r, e in gpus.recipes_table().items() if e.get("note")]
    return "\n".join(out + ([""] + notes if notes else []))


RENDER = {"label-releases": label_releases, "labels": label_matrix,
          "release-differences": release_differences, "constraints": constraint_tables,
          "limitations": limitations, "gpus": gpu_table,
          "silent-skips": silent_skip_table}


def block(name: str) -> str:
    return f"<!-- card:{name} -->\n{RENDER[name]()}\n<!-- /card:{name} -->"


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"<!-- card:{name} -->\n(?:.*?\n)?<!-- /card:{name} -->", re.S)


def stale_blocks(root: Path = ROOT) -> list[str]:
    """'FILE: block NAME' for every block that is missing or differs from the card."""
    problems = []
    for name, files in BLOCKS.items():
        want = block(name)
        for f in files:
            text = (root / f).read_text(encoding="utf-8")
            m = _pattern(name).search(text)
            if m is None:
                problems.append(f"{f}: no <!-- card:{name} --> block")
            elif m.group(0) != want:
                problems.append(f"{f}: block {name} differs from the card")
    return problems


def write(root: Path = ROOT) -> list[str]:
    """Rewrite every block from the card; returns the files changed."""
    changed = []
    for name, files in BLOCKS.items():
        rendered = block(name)
        for f in files:
            path = root / f
            text = path.read_text(encoding="utf-8")
            new = _pattern(name).sub(lambda _m, r=rendered: r, text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                changed.append(f)
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        for f in write():
            print(f"rewrote {f}")
        return 0
    problems = stale_blocks()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
