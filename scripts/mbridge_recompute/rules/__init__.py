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
constraint ids, except four the live validator alone emits: `mcore-config-error`
(TransformerConfig raised something no card constraint describes),
`mcore-warning` (an unmapped config warning, info), `bridge-validation-unavailable`
(Megatron Bridge not importable, info) and `bridge-validation-not-decided` (Bridge's own
validation raised something no card rule describes, or needed a GPU).
"""

from __future__ import annotations

from typing import Optional

VALIDATORS = ("auto", "live", "builtin")


def check_workload(w, validator: str = "builtin", version=None,
                   te_version: Optional[str] = None) -> dict:
    """Check a Workload against every known recompute constraint.

    `version`: a `releases.Release`, a release number, card key or pinned commit; default:
    the installed megatron-core's, else the newest release the card covers. `te_version`:
    Transformer Engine on the training nodes if known (default: the workload's `te_version`).
    The report names the release (`version`), the facts used (`facts`) and how it was chosen
    (`release.how`).
    """
    from mbridge_recompute.facts import releases

    if validator not in VALIDATORS:
        from mbridge_recompute.errors import InputError

        raise InputError("--validator", f"must be one of {', '.join(VALIDATORS)}, got {validator!r}")
    release = releases.resolve(version)
    if validator == "auto":
        installed = releases.installed_mcore_version()
        same = installed is not None and (not release.asked or release.key == releases.resolve_version(
            installed, "installed megatron-core"))
        # live answers only for the installed release; another target release gets the table
        validator = "live" if same else "builtin"
    if validator == "live":
        from mbridge_recompute.rules import live

        installed = releases.installed_mcore_version()
        report = live.check(w, version=release.key if release.asked else None, te_version=te_version)
        release = releases.Release(report["version"], installed,
                                   f"the installed megatron-core {installed} (its TransformerConfig decided)")
    else:
        from mbridge_recompute.rules import builtin

        report = builtin.check(w, version=release, te_version=te_version)
    report.update(version=release.requested, facts=release.key, release=release.to_dict())
    return report


def errors_only(report: dict) -> list[dict]:
    """The findings of a report that make it fail (severity "error")."""
    from mbridge_recompute.rules.findings import errors

    return errors(report["findings"])
