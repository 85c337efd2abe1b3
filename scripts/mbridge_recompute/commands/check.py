"""`check`: a workload's recompute setting against every known constraint.

The installed megatron-core's own TransformerConfig decides what the config
accepts (`--validator live`); the built-in rule table covers what a config cannot
see and stands in when megatron-core is not installed. The report says which
validator answered, whose defaults the unset fields took, and which input fields
the tools do not model.

`check --run RUN_DIR` reads a finished (or failed) run instead: the recompute setting
it actually had, next to what its command asked for, with every difference and its
cause (logs/effective.py), then checks the workload that ran.
"""

from __future__ import annotations

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mbridge_recompute.inputs.loading import add_workload_arguments, has_workload, load_from_args
from mbridge_recompute.rules.findings import errors

DESCRIPTION = ("Check a workload's recompute setting against every known constraint: "
               "megatron-core's own TransformerConfig when installed (live), else the built-in "
               "rule table; plus training-argument rules, runtime-only failures and silent no-ops. "
               "With --run, the setting a run actually had and why it differs from its command.")
EPILOG = """examples:
  check_config.py                                   # the embedded default workload
  check_config.py examples/llama3_70b_fp8.yaml --json
  check_config.py ConfigContainer.yaml              # a Bridge dump (logger.save_config_filepath)
  check_config.py --recipe llama3_8b_pretrain_2gpu_h100_bf16_config --set 'model.recompute_modules=[mlp]'
  check_config.py --mlm-args model_config.yaml      # a Megatron-LM argument list
  check_config.py w.yaml --set 'model.recompute_modules=[moe_act]' --validator builtin
  check_config.py w.yaml --set cluster.te_version=2.8.0 # decide Transformer Engine gated rules
  check_config.py --run runs/moe_act                # what a harness run really had

exit codes: 0 no error finding, 1 at least one error finding (or a run that did not have the
setting its command asked for), 2 unusable input"""

_ORDER = ("error", "warning", "info")


def add_arguments(parser) -> None:
    parser.add_argument("--validator", choices=("auto", "live", "builtin"), default="auto",
                        help="live: the installed megatron-core's TransformerConfig; builtin: the rule "
                             "table (no torch); auto (default): live when megatron-core is installed")
    parser.add_argument("--run", metavar="RUN_DIR",
                        help="a harness run directory (log.txt, manifest.json, ConfigContainer.yaml) or a "
                             "log file: report the recompute setting that actually ran")
    parser.add_argument("--run-config", metavar="DUMP.yaml",
                        help="with --run LOG: the ConfigContainer the run dumped, when it is not "
                             "beside the log")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_workload_arguments(parser)


def run(args) -> int:
    from mbridge_recompute.rules import check_workload

    if args.run_config and not args.run:
        raise InputError("--run-config", "needs --run")
    release = args.release
    effective = None
    parsed = None
    if args.run:
        workload, effective, parsed = _run_workload(args, release)
    else:
        workload = load_from_args(args, release, default=True)
    report = {"ok": True, "findings": []}
    if workload is not None:
        import contextlib
        import sys

        # stdout holds the report alone: what megatron-core or Bridge print while the live
        # validator imports and builds them (Bridge logs INFO lines to stdout) goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            report = check_workload(workload, validator=args.validator, version=release)
        report["findings"] += _input_findings(workload, report)
        report["input"] = {"defaults_source": workload.defaults_source,
                           "not_modelled": list(workload.not_modelled)}
    if effective is not None:
        from mbridge_recompute.logs.effective import add_ignored_labels

        add_ignored_labels(effective, report)
        report["run"] = effective.to_dict()
        report["findings"] += _run_findings(effective, parsed)
        report.setdefault("validator", "none (the run's dump is not a whole workload)")
        report.setdefault("release", release.to_dict())
    report["ok"] = not errors(report["findings"])
    from mbridge_recompute.output import emit

    emit(report, args.json, render)
    return EXIT_OK if report["ok"] else EXIT_PROBLEM


def _run_workload(args, release):
    """(the workload that ran, or None when the dump is partial and none was given; the setting;
    the parsed log). The run's files are read once each (logs/rundir.py)."""
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.logs import diagnose
    from mbridge_recompute.logs import effective as eff
    from mbridge_recompute.setting import RecomputeSetting

    setting, dump, parsed = eff.read(args.run, args.run_config, watch=diagnose.LineScan())
    workload = None
    if has_workload(args):
        workload = load_from_args(args, release)
    elif isinstance(dump, dict) and isinstance(dump.get("model"), dict) and "num_layers" in dump["model"]:
        workload = load_workload(setting.ran_from, args.sets, mcore_version=release, document=dump)
    if workload is not None and setting.ran is not None:
        ran = setting.ran
        mods = ran.get("recompute_modules")
        workload = RecomputeSetting(ran.get("recompute_granularity"),
                                    tuple(mods) if isinstance(mods, list) else None,
                                    ran.get("recompute_method"), ran.get("recompute_num_layers"),
                                    workload.distribute_saved_activations).apply(workload)
    return workload, setting, parsed


def _finding(fid: str, severity: str, message: str, fix: str, citation: str, kind: str,
             upstream: str = "") -> dict:
    return {"id": fid, "severity": severity, "message": message, "fix": fix, "source": "builtin",
            "upstream_message": upstream, "citation": citation, "kind": kind}


def _input_findings(w, report: dict) -> list:
    out = []
    from mbridge_recompute.facts import releases
    from mbridge_recompute.inputs import fields

    key = report["facts"]
    later = _fields_of_other_releases(w, key)
    if later:
        out.append(_finding(
            "input-fields-of-another-release", "info",
            f"the input has TransformerConfig fields megatron-core {key} does not have "
            f"({', '.join(later[:6])}{', ...' if len(later) > 6 else ''}): it was written for another "
            "release",
            "pass --mcore-version for the release the job runs (a megatron-bridge "
            f"{fields.bridge_release()} dump: {releases.bridge_pin_facts(fields.bridge_release())})",
            "data/upstream_fields.json", "input"))
    from mbridge_recompute.memory import bounds, coverage

    named = coverage.unmodelled(w)       # only what can change memory, largest possible effect first
    if named:
        out.append(_finding(
            "input-not-modelled", "info",
            "read but not modelled (they can change memory; plan does not account for them): "
            + "; ".join(f"{u.setting} ({bounds.up_to(u.effect_bytes)})" for u in named),
            "measure with the harness (run_harness.py --launch) before trusting the predicted peak",
            "data/coverage.yaml", "input"))
    return out


def _fields_of_other_releases(w, key: str) -> list:
    """Model fields of the workload that release `key` lacks and another release has."""
    from mbridge_recompute.inputs import fields

    mine = fields.transformer_config_fields(key)
    others = fields.all_transformer_config_fields() - mine
    given = [n for n, v in w.extra_model.items() if v is not None]
    given += [n for n in ("cuda_graph_modules",) if getattr(w, n, None) is not None]
    return sorted({n for n in given if n not in mine and n in others})


def _run_findings(s, parsed=None) -> list:
    from mbridge_recompute.logs.effective import FIXES

    out = []
    for d in s.differences:
        severity = "warning" if d["cause"] in ("none-promoted", "ignored-label") else "error"
        asked = d.get("token") or d["asked"]
        out.append(_finding(
            f"run-{d['cause']}", severity,
            f"{d['field']}: asked {asked!r}, ran {d['ran']!r} -- {d['why']}",
            FIXES[d["cause"]], "logs/effective.py", "run"))
    if s.differences or parsed is None:
        return out
    # no difference to explain: what the log itself says about why the run failed (diagnose's
    # reading of the same lines, gathered while the log was parsed)
    from mbridge_recompute.logs import diagnose

    report = diagnose.diagnose(parsed)
    for f in report["findings"]:
        explains = f["kind"] in diagnose.EXPLAINING_KINDS or (
            f["kind"] in ("config", "runtime") and f["severity"] == "error")
        if not explains:
            continue
        ident = f.get("constraint_id") or f.get("id") or f["kind"]
        out.append(_finding(f"run-failed-{f['kind']}", "error", f"the run failed ({ident}): {f['evidence']}",
                            f["next_action"], f.get("source") or "logs/diagnose.py", "run"))
    if s.error and not out:
        out.append(_finding("run-failed", "error", f"the run failed: {s.error}",
                            "diagnose.py on its log names the cause when it is one it knows; read the "
                            "traceback it ends", "logs/runlog.py", "run"))
    if s.ran is None and not out:
        out.append(_finding("run-setting-unknown", "info",
                            "the run left no config dump (ConfigContainer.yaml), so what ran is not known; "
                            "its log shows no failure",
                            "give the dump with --run-config, or run through run_harness.py, which has the "
                            "rank write it (--save_config_filepath)", "logs/effective.py", "run"))
    return out


def render(report: dict) -> str:
    rel = report.get("release") or {}
    facts = "" if rel.get("requested") == rel.get("key") else f", the {rel.get('key')} facts"
    lines = [f"validator: {report.get('validator')} (megatron-core {rel.get('requested')}{facts}; "
             f"{rel.get('how')})"]
    inp = report.get("input")
    if inp:
        lines.append(f"defaults: {inp['defaults_source']} (whose defaults the unset fields took)")
    run = report.get("run")
    if run:
        lines += ["", f"run: {run['run']}",
                  f"  asked ({run['asked_from']}): {_asked_text(run)}",
                  f"  ran ({run['ran_from']}): {_setting_text(run['ran']) if run['ran'] else 'unknown'}"]
        if run.get("error"):
            lines.append(f"  error: {run['error']}")
        if not run["differences"]:
            lines.append("  no difference" if run["ran"] else
                         "  what ran is unknown (no config dump): no difference can be looked for")
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
    from mbridge_recompute.output import wrap_all

    return "\n".join(wrap_all(lines))


def _asked_text(run: dict) -> str:
    """What the command asked, as it said it: its recompute tokens in order (a Hydra override and
    the flag that overrides it both show), else the candidate's fields."""
    tokens = list(dict.fromkeys(r["token"] for r in run.get("requests") or []))
    if run["asked_from"] == "argv" and tokens:
        return "; ".join(tokens)
    return _setting_text(run["asked"])


def _setting_text(s) -> str:
    if not s:
        return "nothing"
    return ", ".join(f"{k.removeprefix('recompute_')}={v!r}" for k, v in s.items() if k in s)
