"""`check`: a workload's recompute setting against every known constraint.

The installed megatron-core's own TransformerConfig decides what the config
accepts (`--validator live`); the built-in rule table covers what a config cannot
see and stands in when megatron-core is not installed. The report says which
validator answered.
"""

from __future__ import annotations

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM
from mbridge_recompute.inputs.loading import add_workload_arguments, load_workload
from mbridge_recompute.rules.findings import errors

DESCRIPTION = ("Check a workload's recompute setting against every known constraint: "
               "megatron-core's own TransformerConfig when installed (live), else the built-in "
               "rule table; plus training-argument rules, runtime-only failures and silent no-ops.")
EPILOG = """examples:
  check_config.py                                   # the embedded default workload
  check_config.py examples/llama3_70b_fp8.yaml --json
  check_config.py w.yaml --set model.recompute_modules=[moe_act] --validator builtin
  check_config.py w.yaml --set cluster.te_version=2.8.0 # decide Transformer Engine gated rules

exit codes: 0 no error finding, 1 at least one error finding, 2 unusable input"""

_ORDER = ("error", "warning", "info")


def add_arguments(parser) -> None:
    add_workload_arguments(parser)
    parser.add_argument("--validator", choices=("auto", "live", "builtin"), default="auto",
                        help="live: the installed megatron-core's TransformerConfig; builtin: the rule "
                             "table (no torch); auto (default): live when megatron-core is installed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from mbridge_recompute.facts import releases
    from mbridge_recompute.rules import check_workload

    release = releases.target(args.mcore_version)
    workload = load_workload(args.workload, args.sets, args.model, args.hf_config, release.requested,
                             default=True)
    report = check_workload(workload, validator=args.validator,
                            version=release if args.mcore_version else None)
    from mbridge_recompute.output import emit

    emit(report, args.json, render)
    return EXIT_OK if report["ok"] else EXIT_PROBLEM


def render(report: dict) -> str:
    rel = report["release"]
    facts = "" if rel["requested"] == rel["key"] else f", the {rel['key']} facts"
    lines = [f"validator: {report['validator']} (megatron-core {rel['requested']}{facts}; {rel['how']})"]
    findings = report["findings"]
    for severity in _ORDER:
        group = [f for f in findings if f["severity"] == severity]
        if not group:
            continue
        lines.append("")
        lines.append(f"{severity.upper()}S ({len(group)})")
        for f in group:
            lines.append(f"  [{f['id']}] {f['message']}")
            upstream = f.get("upstream_message")
            if upstream and upstream != f["message"] and upstream not in ("runtime only", "silent no-op"):
                lines.append(f"      upstream: {upstream}")
            if f.get("fix"):
                lines.append(f"      fix: {f['fix']}")
            if f.get("citation"):
                lines.append(f"      source: {f['citation']} ({f['source']})")
    lines.append("")
    n_err = len(errors(findings))
    lines.append("ok: no error findings" if report["ok"] else f"FAILED: {n_err} error finding(s)")
    return "\n".join(lines)
