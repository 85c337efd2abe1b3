"""A finding: one constraint that a workload violates or should know about.

Findings are plain dicts (they go straight into the JSON report). The fact
behind a finding -- its upstream message, severity, fix and citation -- lives
once in card.yaml (`constraints:`); `finding()` reads it from there by id.
"""

from __future__ import annotations

from typing import Optional

from mbridge_recompute.facts import card

SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def finding(cid: str, source: str, version: str, detail: Optional[str] = None,
            severity: Optional[str] = None, upstream: Optional[str] = None) -> dict:
    """Build a finding for card constraint `cid` as release `version` has it.

    `detail` is the workload-specific sentence (what was seen); without it the
    card's plain-words condition is used. `upstream` overrides the card's
    message with the text megatron-core actually raised (live validator), so the
    report shows the real string, f-string parts filled in.
    """
    c = card.constraint_at(cid, version) or {**card.constraint(cid), "citation": "", "at": ""}
    out = {
        "id": cid,
        "severity": severity or c["severity"],
        "message": detail or c["condition"],
        "fix": c["fix"],
        "source": source,
        "upstream_message": upstream if upstream is not None else c["message"],
        # a rule Transformer Engine decides names TE's line too (megatron-core's call site first)
        "citation": c["citation"] + (f"; {c['te_source']}" if c.get("te_source") else ""),
        "kind": c["kind"],
    }
    return out


def errors(findings: list[dict]) -> list[dict]:
    """The findings that make a check fail (severity "error")."""
    return [f for f in findings if f["severity"] == "error"]


def sort_findings(findings: list[dict]) -> list[dict]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: _RANK.get(f["severity"], 99))


def dedupe(findings: list[dict]) -> list[dict]:
    """Keep the first finding per id (the live one when live runs first)."""
    seen: set = set()
    out = []
    for f in findings:
        if f["id"] in seen:
            continue
        seen.add(f["id"])
        out.append(f)
    return out


def report(findings: list[dict], validator: str, version: str, **extra) -> dict:
    findings = sort_findings(dedupe(findings))
    out = {"ok": not errors(findings),
           "validator": validator, "version": version, "findings": findings}
    out.update(extra)
    return out


def disabled_by(findings: list) -> tuple:
    """The (label, block) pairs the findings' silent no-ops switch off, in a stable order."""
    return tuple(sorted({tuple(d) for f in findings for d in f.get("disables", ())}))
