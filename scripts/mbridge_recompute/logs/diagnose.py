"""Classify what went wrong in a run: memory (and which kind) or a recompute constraint.

OOM rules, in the order the findings are reported (thresholds are constants below):

1. **fragmentation** -- PyTorch held, reserved but unallocated, at least as much
   memory as the failed request (it would have fit had the cached blocks been
   contiguous), or the rank's memory report shows max reserved >= 1.10 x max
   allocated with the gap at least the request. Fix the allocator first
   (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`) and re-measure before
   adding any recompute: recompute trades step time for memory the allocator
   may simply be wasting.
2. **static** -- the OOM happened while building the model/optimizer or in an
   optimizer step (the first one creates Adam's state; any step runs after
   backward has freed the activations): weights, gradients and optimizer state
   do not shrink with recompute.
3. **activations** -- the OOM happened in a forward or backward (a recompute
   replay runs in backward) and is not explained by fragmentation alone, or the
   run got past iteration 1 (static memory is all in place by then). Next: `plan`.

Memory the process holds outside PyTorch (NCCL buffers, other processes on the
GPU) is reported as evidence when it is at least 5% of capacity.

Error strings are matched through `signatures` (the card's constraint messages
first, then the runtime table). An exception from `transformer_config.py`,
`model_parallel_config.py` or `arguments.py` that no signature knows is still a
`config` finding (an unlisted constraint).

Exit status (commands/diagnose.py): 0 when at least one finding explains a
failure (an OOM classification, or an error-severity config/runtime match);
1 when nothing recognisable was found (warnings and `unknown` alone do not count).
"""

from __future__ import annotations

import re
from typing import Optional

from mbridge_recompute.logs import signatures
from mbridge_recompute.logs.oom import OOMEvent
from mbridge_recompute.logs.runlog import EXC_LINE, MAX_ERRORS, RunLog
from mbridge_recompute.output import quote_overrides
from mbridge_recompute.units import GB, GIB

RESERVED_OVER_ALLOCATED = 1.10      # "reserved >> allocated" in a memory report
NEAR_CAPACITY = 0.85                 # allocated by PyTorch / capacity
NON_PYTORCH_SHARE = 0.05             # memory outside PyTorch worth mentioning
# the optimizer step runs after backward has released the activations: an OOM there is
# weights, gradients, optimizer state and the step's own buffers
STATIC_STAGES = ("setup", "optimizer-state-init", "optimizer-step")
ACTIVATION_STAGES = ("first-forward", "forward", "backward")
EXPLAINING_KINDS = ("fragmentation", "activations", "static")

ACTION = {
    "fragmentation": ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the job environment and rerun "
                      "the same setting before adding any recompute; compare peaks with compare_runs.py"),
    "static": ("recompute will not help: this memory is weights, gradients and optimizer state. Shard or "
               "shrink it: use_distributed_optimizer=true, more data parallelism (shards optimizer state) "
               "or more PP/EP, a precision-aware optimizer (use_precision_aware_optimizer with bf16 "
               "exp_avg/exp_avg_sq), or optimizer_cpu_offload"),
    "activations": ("activations fill the GPU: run plan.py on this workload (--json) for the narrowest "
                    "recompute boundary that fits, then measure it against the `[]` control with "
                    "run_harness.py and compare_runs.py"),
    "unknown_oom": ("the stage is unknown (no traceback in the log): run plan.py on this workload for its "
                    "static/activation split (static memory that does not fit cannot be fixed by "
                    "recompute), and rerun with the full per-rank traceback; an OOM before the first "
                    "forward or in the first optimizer step is static memory"),
}


def _gib(x: Optional[float]) -> str:
    return "?" if x is None else f"{x / GIB:.2f} GiB"


def _report_for(run: RunLog, oom: OOMEvent):
    reports = [m for m in run.memory if oom.rank is None or m.rank == oom.rank]
    if not reports:
        return None
    return max(reports, key=lambda m: (m.after, m.max_allocated_gb or 0.0))


def _where(oom: OOMEvent) -> str:
    """Where the OOM happened, saying only what the log shows (no invented iteration or rank)."""
    text = f"OOM at line {oom.line}"
    if oom.rank is not None:
        text += f" on rank {oom.rank}"
    if oom.gpu is not None:
        text += f" (GPU {oom.gpu})"
    when = f"iteration {oom.iteration}" if oom.iteration is not None else "before any logged iteration"
    if oom.stage != "unknown":
        return f"{text}, {oom.stage}, {when}"
    return f"{text}, {when} (stage unknown)"


def _numbers(oom: OOMEvent) -> str:
    """The sizes the message gave, and only those."""
    parts = [(f"requested {_gib(oom.requested)}", oom.requested),
             (f"capacity {_gib(oom.capacity)}"
              + (f" (this process is capped at {_gib(oom.allowed)})" if oom.allowed is not None else ""),
              oom.capacity),
             (f"free {_gib(oom.free)}", oom.free),
             (f"allocated by PyTorch {_gib(oom.allocated)}", oom.allocated),
             (f"reserved but unallocated {_gib(oom.reserved_unallocated)}", oom.reserved_unallocated)]
    known = [text for text, value in parts if value is not None]
    return ", ".join(known) if known else "the message gives no sizes"


def classify_oom(run: RunLog, oom: OOMEvent) -> list:
    """The kinds (in report order) and their evidence for one OOM event."""
    out = []
    cap = oom.limit
    extra = []
    # memory outside the caching allocator is not under a per-process cap: compare with the device
    if oom.capacity and oom.process_in_use is not None and oom.allocated is not None \
            and oom.reserved_unallocated is not None:
        outside = oom.process_in_use - oom.allocated - oom.reserved_unallocated
        if outside >= NON_PYTORCH_SHARE * oom.capacity:
            extra.append(f"{_gib(outside)} of this process is outside PyTorch (NCCL/communication buffers, "
                         "CUDA context)")
    if oom.capacity and oom.other_processes >= NON_PYTORCH_SHARE * oom.capacity:
        extra.append(f"other processes hold {_gib(oom.other_processes)} on this GPU")
    base = f"{_where(oom)}: {_numbers(oom)}" + ("; " + "; ".join(extra) if extra else "")

    frag = []
    if oom.requested is not None and oom.reserved_unallocated is not None \
            and oom.reserved_unallocated >= oom.requested > 0:
        frag.append(f"reserved-but-unallocated {_gib(oom.reserved_unallocated)} >= the "
                    f"{_gib(oom.requested)} request")
    rep = _report_for(run, oom)
    if rep and rep.max_allocated_gb and rep.max_reserved_gb:
        gap_bytes = (rep.max_reserved_gb - rep.max_allocated_gb) * GB
        if rep.max_reserved_gb >= RESERVED_OVER_ALLOCATED * rep.max_allocated_gb and \
                (oom.requested is None or gap_bytes >= oom.requested):
            frag.append(f"rank {rep.rank} after {rep.after} iterations: max reserved "
                        f"{rep.max_reserved_gb:.3f} GB vs max allocated {rep.max_allocated_gb:.3f} GB")
    if frag:
        out.append(("fragmentation", base + "; " + "; ".join(frag)))
    elif oom.requested is not None and oom.reserved_unallocated is not None:
        # the cached-but-free blocks could not have held the request even if contiguous
        base += (f"; not fragmentation: only {_gib(oom.reserved_unallocated)} is reserved but unallocated, "
                 f"less than the {_gib(oom.requested)} request")

    near = (oom.allocated is not None and cap and oom.allocated >= NEAR_CAPACITY * cap)
    share = "" if not (oom.allocated and cap) else \
        (f"; PyTorch holds {100 * oom.allocated / cap:.0f}% of "
         f"{'its cap' if oom.allowed else 'capacity'} in live tensors")
    if oom.requested is not None and cap and oom.requested > cap:
        share += f"; the single {_gib(oom.requested)} request exceeds all the memory this process may use"
    after_first = oom.iteration is not None and oom.iteration >= 2
    if oom.stage in STATIC_STAGES:
        out.append(("static", base + f"; failed in {oom.stage}, before activations matter" + share))
    elif oom.stage in ACTIVATION_STAGES or after_first:
        if not frag or near:
            why = f"failed in the {oom.stage}" if oom.stage != "unknown" else \
                f"failed after iteration {oom.iteration - 1} completed (static memory was in place)"
            out.append(("activations", base + "; " + why + share))
    elif not frag:
        out.append(("unknown", base + "; no traceback to tell the stage" + share))
    return out


def _oom_findings(run: RunLog) -> list:
    grouped: dict = {}
    for oom in run.ooms:
        for kind, evidence in classify_oom(run, oom):
            grouped.setdefault(kind, []).append((oom, evidence))
    order = ("fragmentation", "static", "activations", "unknown")
    out = []
    for kind in order:
        if kind not in grouped:
            continue
        events = grouped[kind]
        # the most loaded rank is the clearest evidence
        oom, evidence = max(events, key=lambda e: (e[0].allocated or 0.0))
        if len(events) > 1:
            evidence += f" (and {len(events) - 1} more OOM event(s) of this kind)"
        action = ACTION["unknown_oom"] if kind == "unknown" else ACTION[kind]
        out.append({"kind": kind, "evidence": evidence, "next_action": action, "severity": "error",
                    "stage": oom.stage, "iteration": oom.iteration, "line": oom.line,
                    "oom": oom.as_dict()})
    return out


def _sig_finding(sig, evidence: str, line: int) -> dict:
    f = {"kind": sig.kind, "evidence": evidence, "next_action": sig.fix, "severity": sig.severity,
         "source": sig.source, "id": sig.id, "line": line}
    if sig.constraint_id:
        f["constraint_id"] = sig.constraint_id
    if sig.cause:
        f["cause"] = sig.cause
    return f


_CONFIG_FILES = ("transformer_config.py", "model_parallel_config.py", "training/arguments.py")
_WRAPPER_EXC = ("ChildFailedError", "CalledProcessError", "SystemExit")


class LineScan:
    """What diagnose reads from a log's lines, gathered while the log is parsed: one pass, and
    memory bounded whatever the log's size (runlog's `watch`).

    Kept: the first line each known signature matches and how many lines matched it, the line
    numbers that matched (at most MAX_MATCHED: the exception records they spare from a second
    classification are the first runlog.MAX_ERRORS), the line right after a Hydra parse error
    (Hydra prints its reason there), and at most MAX_COMMAND_LINES lines that show a harness
    command line.
    """

    MAX_MATCHED = 4 * MAX_ERRORS
    MAX_COMMAND_LINES = 20

    def __init__(self):
        self.sigs = signatures.all_signatures()
        self._match = signatures.line_matcher(self.sigs)
        self.found: dict = {}
        self.matched_lines: set = set()
        self.command_lines: list = []
        self.after: dict = {}            # line number -> the text of the line after it
        self._waiting: Optional[int] = None

    def __call__(self, no: int, line: str) -> None:
        if self._waiting is not None:
            if no == self._waiting + 1:
                self.after[self._waiting] = line[:300]
            self._waiting = None
        if not line:
            return
        if len(self.command_lines) < self.MAX_COMMAND_LINES and "-r" in line and _COMMAND_HINT.search(line):
            self.command_lines.append((no, line[:2000]))
        sig = self._match(line)
        if sig is None:
            return
        if len(self.matched_lines) < self.MAX_MATCHED:
            self.matched_lines.add(no)
        if sig.id == "hydra-override-parse-error":
            self._waiting = no
        if sig.id in self.found:
            self.found[sig.id]["count"] += 1
            return
        finding = _sig_finding(sig, f"line {no}: {line.strip()[:300]}", no)
        if EXC_LINE.match(line.strip()):
            # raised, not warned: whatever the card's severity for a config check, the run failed here
            finding["severity"] = "error"
        self.found[sig.id] = dict(finding, count=1)

    @classmethod
    def of_lines(cls, lines) -> "LineScan":
        scan = cls()
        for no, line in enumerate(lines, start=1):
            scan(no, line)
        return scan


def scan_of(run: RunLog) -> LineScan:
    """The scan made while `run` was parsed, else one over the lines it kept."""
    if not isinstance(run.scan, LineScan):
        run.scan = LineScan.of_lines(run.lines)
    return run.scan


def _error_findings(run: RunLog) -> list:
    scan = scan_of(run)
    sigs = scan.sigs
    found = {k: dict(v) for k, v in scan.found.items()}
    matched_lines = scan.matched_lines
    unknown = []
    for err in run.errors:
        if err.line in matched_lines:
            continue
        sig = signatures.match_exception(err.exc_type, err.message, err.frames, sigs)
        if sig is not None:
            text = f"{err.exc_type}: {err.message}".strip()
            if sig.id in found:
                found[sig.id]["count"] += 1
            else:
                where = f" (in {err.frames[-1].func}, {err.frames[-1].file}:{err.frames[-1].lineno})" \
                    if err.frames else ""
                evidence = f"line {err.line}: {text[:300]}{where}"
                found[sig.id] = dict(_sig_finding(sig, evidence, err.line), count=1)
            continue
        if err.exc_type.rsplit(".", 1)[-1] in _WRAPPER_EXC or err.exc_type.endswith("Warning"):
            continue
        cfg = next((f for f in reversed(err.frames)
                    if f.file.replace("\\", "/").endswith(_CONFIG_FILES)), None)
        text = f"{err.exc_type}: {err.message}".strip()
        if cfg is not None:
            key = f"config:{text[:120]}"
            if key not in found:
                found[key] = {"kind": "config", "evidence": f"line {err.line}: {text[:300]}",
                              "next_action": ("a configuration rule this tool does not list: run "
                                              "check_config.py on the workload (--validator live) and "
                                              "read the rule at the source"),
                              "severity": "error", "source": f"{cfg.file}:{cfg.lineno}", "line": err.line,
                              "count": 1}
            continue
        if len(unknown) < 3 and all(u["evidence"].split(": ", 1)[-1] != text[:300] for u in unknown):
            unknown.append({"kind": "unknown", "evidence": f"line {err.line}: {text[:300]}",
                            "next_action": ("not a known memory or recompute failure; read the traceback "
                                            f"ending at line {err.line}"),
                            "severity": "info", "line": err.line})
    rank = {"error": 0, "warning": 1}
    ordered = sorted(found.values(), key=lambda f: (rank.get(f["severity"], 2), f["line"]))
    return ordered + unknown


# a harness command line as a log or manifest shows it, read as the rank reads it
# (inputs/harness_argv.py): an abbreviation (--recompute_mod) is the flag it abbreviates
_COMMAND_HINT = re.compile(r"--recompute_|(?<!\S)-r(?:l|\s|=|\d)")
_RL_FIX = ("drop -rl: the harness applies the argparse flags after the Hydra overrides (run_script.py:76-79, "
           "overrides.py:174-177 @ 067f987; run_script.py:86-87, overrides.py:150-153 @ v0.5.1), so "
           "model.recompute_method=null model.recompute_num_layers=null cannot undo -rl in the same run. "
           "Hydra nulls only undo a full recompute the recipe itself carries; for full recompute use -rl N "
           "alone (or block:N in run_harness.py), for selective use --recompute_modules alone")


def _tokens(line: str) -> list:
    import shlex

    try:
        return shlex.split(line)
    except ValueError:            # an unbalanced quote in a log line
        return line.split()


def _command_lines(run: RunLog) -> list:
    """(line number or None, text, HarnessArgv) for each command line the run shows: its
    manifest's argv, and log lines that hold harness recompute flags."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv

    manifest = run.manifest or {}
    release = manifest.get("bridge_release") if isinstance(manifest.get("bridge_release"), str) else None
    out = []
    argv = manifest.get("argv")
    if isinstance(argv, list):
        out.append((None, " ".join(map(str, argv)), HarnessArgv.of_command(argv, release)))
    for no, line in scan_of(run).command_lines:
        out.append((no, line, HarnessArgv.of_command(_tokens(line), release)))
    return out


def _argv_findings(run: RunLog, found: list) -> list:
    """What a harness command line in the log shows: `-rl` next to labels, a list flag given twice."""
    from mbridge_recompute.inputs.harness_argv import LAYERS_FLAG, MODULES_FLAG

    out = []
    lines = _command_lines(run)
    with_rl = [no for no, _, h in lines if h.given(LAYERS_FLAG) and h.given(MODULES_FLAG)]
    any_rl = [no for no, _, h in lines if h.given(LAYERS_FLAG)]
    for f in found:
        if f.get("id") != "selective-with-num-layers":
            continue
        if with_rl or any_rl:
            f["next_action"] = _RL_FIX
            f["evidence"] += "; the command line has -rl" + (" beside --recompute_modules" if with_rl else "")
        else:
            # the text does not show the command line: the nulls fix a recipe's leftover full
            # recompute, and are no fix at all for -rl given with the labels
            f["next_action"] += ("; if the run was given -rl N together with --recompute_modules, drop "
                                 "-rl instead (the harness applies -rl after the Hydra overrides, so nulls "
                                 "cannot undo it)")
    for no, text, h in lines:
        given = h.given(MODULES_FLAG)
        if len(given) >= 2:
            where = f"line {no}" if no else "the manifest's argv"
            out.append({"kind": "config", "id": "list-flag-given-twice", "severity": "warning",
                        "line": no or 0,
                        "evidence": (f"{where}: --recompute_modules is given more than once ("
                                     + ", ".join(repr(g.text) for g in given[:4])
                                     + f"): {text.strip()[:300]}"),
                        "next_action": ("argparse keeps only the last --recompute_modules (its earlier "
                                        "labels are dropped without an error): give every label in one "
                                        "comma-separated token, --recompute_modules a,b"),
                        "source": "argument_parser.py:41-43 @ 067f987 (list_of_strings, no nargs); "
                                  "Lib/argparse.py store action @ CPython 3.11"})
            break
    return out


def _hydra_detail(run: RunLog, found: list) -> None:
    """Hydra prints the reason on the next line ("missing EQUAL at '<EOF>'"): a bare word."""
    after = scan_of(run).after
    for f in found:
        if f.get("id") == "hydra-override-parse-error" and f.get("line"):
            nxt = after.get(f["line"], "")
            if "missing EQUAL" in nxt:
                f["evidence"] += f"; next line: {nxt.strip()[:120]} (a bare word, not key=value)"


def diagnose(run: RunLog) -> dict:
    errors = _error_findings(run)
    _hydra_detail(run, errors)
    findings = _oom_findings(run) + errors + _argv_findings(run, errors)
    explained = any(f["kind"] in EXPLAINING_KINDS or
                    (f["kind"] in ("config", "runtime") and f["severity"] == "error") for f in findings)
    report = {"source": run.path or run.name, "findings": findings, "explained": explained,
              "ooms": len(run.ooms), "last_iteration": run.last_iteration,
              "memory_reports": len(run.memory)}
    note = run.bounds_note()
    if note:
        report["notes"] = [note]
    return report


def render_text(report: dict) -> str:
    notes = [f"note: {n}" for n in report.get("notes", [])]
    if not report["findings"]:
        from mbridge_recompute.output import wrap_all

        return "\n".join(wrap_all([f"{report['source']}: nothing recognisable (no OOM, no known "
                                    "recompute error)", *notes]))
    lines = [f"{report['source']}:", *notes]
    for i, f in enumerate(report["findings"], 1):
        ident = f.get("constraint_id") or f.get("id")
        tag = f["kind"] + (f" [{ident}]" if ident else "") \
            + ("" if f["severity"] == "error" else f" ({f['severity']})")
        lines.append(f"{i}. {tag}")
        lines.append(f"   evidence: {f['evidence']}")
        lines.append(f"   next:     {quote_overrides(f['next_action'])}")
        if f.get("source"):
            lines.append(f"   source:   {f['source']}")
    from mbridge_recompute.output import wrap_all

    return "\n".join(wrap_all(lines, more=" " * 10))     # continuations under "evidence: "'s text
