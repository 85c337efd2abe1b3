"""Recompute constraint checking: the public API other modules call.

    check_workload(w, validator="builtin", version=None) -> report dict
    errors_only(report) -> list of error findings

A report is `{"ok", "validator", "version", "findings": [{id, severity, message,
fix, source, upstream_message, citation, kind}]}`; `ok` is False iff some finding
is an error. `validator`:

- "builtin": the rule table in `builtin.py` (pure Python; never imports torch
  or megatron, so it is fast and works anywhere);
- "live": the installed megatron-core's own `TransformerConfig` decides what
  the config accepts; built-in findings the config cannot see (training
  arguments, runtime-only failures, silent no-ops) are added, so live is a
  superset;
- "auto": live when megatron-core is installed, else builtin.

The report's `validator` says which one answered. Finding ids are card
constraint ids, except three the live validator alone emits: `mcore-config-error`
(TransformerConfig raised something no card constraint describes),
`mcore-warning` (an unmapped config warning, info) and
`bridge-validation-unavailable` (Megatron Bridge not importable, info).
"""

from __future__ import annotations

from typing import Optional

VALIDATORS = ("auto", "live", "builtin")


def check_workload(w, validator: str = "builtin", version: Optional[str] = None,
                   te_version: Optional[str] = None) -> dict:
    """Check a Workload against every known recompute constraint.

    `version`: "0.16.1" / "main" / a release number; default: the installed
    megatron-core's, else 0.16.1. `te_version`: Transformer Engine on the
    training nodes if known (default: the workload's `te_version`).
    """
    from mbridge_recompute.facts import releases

    if validator not in VALIDATORS:
        from mbridge_recompute.errors import InputError

        raise InputError("--validator", f"must be one of {', '.join(VALIDATORS)}, got {validator!r}")
    if validator == "auto":
        from mbridge_recompute.rules.live import mcore_available

        installed = releases.installed_mcore_version()
        same = version is None or (installed is not None
                                   and releases.resolve_version(version) == releases.resolve_version(installed))
        # live answers only for the installed version; another target version gets the table
        validator = "live" if mcore_available() and same else "builtin"
    if validator == "live":
        from mbridge_recompute.rules import live

        return live.check(w, version=version, te_version=te_version)
    from mbridge_recompute.rules import builtin

    v = releases.resolve_version(version) if version else releases.target_version()
    return builtin.check(w, version=v, te_version=te_version)


def errors_only(report: dict) -> list[dict]:
    """The findings of a report that make it fail (severity "error")."""
    return [f for f in report["findings"] if f["severity"] == "error"]
