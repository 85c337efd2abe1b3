"""The live validator: the installed megatron-core decides what the config accepts.

Builds the installed `TransformerConfig` (or `MLATransformerConfig`) from the
workload, records the exception and every warning `__post_init__` emits (Python
warnings and logger warnings), and maps each back to a card constraint by its
message and, where messages are ambiguous or absent, by the source line that
raised it. Built-in findings that a config cannot see (training arguments,
runtime-only failures, silent no-ops, and config rules masked by the first
error) are added, so `live` is a superset of `builtin`.

Transformer Engine: when the workload states `te_version`, megatron-core is told
that version through its own version cache (`megatron.core.utils._te_version`),
so the TE-gated checks (tc:1248, 1601, 1607 @ core_v0.16.1) decide as on the
training nodes. Without it, 0.16.1 on a machine without TE raises TypeError at
the first such check; that is reported as "could not be decided here" (warning)
and the checks after it come from the built-in table.

Everything heavy (torch, megatron) is imported inside functions: importing this
module is cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import traceback
import warnings
from functools import lru_cache
from pathlib import PurePath
from typing import Optional

from mbridge_recompute.facts import card, releases
from mbridge_recompute.rules import bridge_live, builtin
from mbridge_recompute.rules.findings import finding, report
from mbridge_recompute.rules.mcore_config import config_kwargs, te_importable
from mbridge_recompute.workload import TE_ABSENT

# The files whose raise/warn sites __post_init__ runs, by the card's abbreviations.
CONFIG_FILES = {a: PurePath(card.load()["abbreviations"][a]).name for a in ("tc", "mpc", "cgc")}


def mcore_available() -> bool:
    """Is megatron-core installed (without importing it: that pulls torch)."""
    return releases.installed_mcore_version() is not None


# ------------------------------------------------------------------ building the config
@dataclasses.dataclass
class Outcome:
    """What constructing the config did."""
    exc_type: Optional[str] = None
    exc_message: Optional[str] = None
    exc_file: Optional[str] = None      # basename of the innermost config-file frame
    exc_line: Optional[int] = None
    warnings: list = dataclasses.field(default_factory=list)   # (message, file basename, line)
    config: object = None


class _LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list = []

    def emit(self, record):
        self.records.append(record)


def build(w, te_version: Optional[str] = None) -> Outcome:
    """Construct the installed config for `w`; never raises for config errors."""
    cls, kwargs = config_kwargs(w)   # imports megatron-core quietly first
    import megatron.core.utils as mcore_utils

    out = Outcome()
    te = te_version if te_version is not None else w.te_version
    saved_te = mcore_utils._te_version
    if te is not None and str(te).strip().lower() not in TE_ABSENT:
        from packaging.version import Version

        mcore_utils._te_version = Version(str(te))
    handler = _LogCapture()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out.config = cls(**kwargs)
            except Exception as exc:   # noqa: BLE001 - every config failure is a finding
                out.exc_type = type(exc).__name__
                out.exc_message = str(exc)
                for frame, line in traceback.walk_tb(exc.__traceback__):
                    base = PurePath(frame.f_code.co_filename).name
                    if base in CONFIG_FILES.values():
                        out.exc_file, out.exc_line = base, line
    finally:
        root.removeHandler(handler)
        mcore_utils._te_version = saved_te
    for wm in caught:
        out.warnings.append((str(wm.message), PurePath(wm.filename).name, wm.lineno))
    for rec in handler.records:
        out.warnings.append((rec.getMessage(), PurePath(rec.pathname).name, rec.lineno))
    return out


# ------------------------------------------------------------------ mapping messages to card ids
@lru_cache(maxsize=None)
def _message_regex(message: str):
    parts = re.split(r"\{[^}]*\}", message)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.DOTALL)


def _site(cid: str, key: str) -> Optional[tuple]:
    """(file basename, first line, last line) of `cid` in release `key` (card `at`)."""
    s = card.site_of(cid, key)
    if s is None:
        return None
    return CONFIG_FILES.get(s.file, s.file), s.start, s.end


def map_message(message: str, version: str, file: Optional[str] = None, line: Optional[int] = None,
                warning: bool = False) -> Optional[str]:
    """The card constraint id megatron-core's `message` (raised at file:line) stands for in
    release `version`."""
    pool = [c["id"] for c in card.constraints() if c["kind"] == "config" and card.holds(c["id"], version)
            and (c["severity"] != "error") == warning]
    texts = {cid: card.constraint_at(cid, version)["message"] for cid in pool}
    by_message = [cid for cid, text in texts.items()
                  if text and (_message_regex(text).fullmatch(message.strip())
                               or _message_regex(text).fullmatch(message))]
    by_line = []
    if file and line:
        for cid in pool:
            site = _site(cid, version)
            # the card cites the statement; a multi-line guard starts a few lines above it
            if site and site[0] == file and site[1] - 6 <= line <= site[2]:
                by_line.append(cid)
    both = [cid for cid in by_message if cid in by_line]
    if both:
        return both[0]
    if len(by_message) >= 1 and (not by_line or len(by_message) == 1):
        return by_message[0]
    if by_line:
        return by_line[0]
    return None


# ------------------------------------------------------------------ the check
def _other(cid: str, severity: str, message: str, upstream: str, where: str) -> dict:
    return {"id": cid, "severity": severity, "message": message,
            "fix": "see the upstream message", "source": "live", "upstream_message": upstream,
            "citation": where, "kind": "config"}


def check(w, version: Optional[str] = None, te_version: Optional[str] = None) -> dict:
    installed = releases.installed_mcore_version()
    if installed is None:
        from mbridge_recompute.errors import InputError

        raise InputError("--validator", "live needs megatron-core installed "
                         "(pip install megatron-core); use --validator builtin")
    target = releases.resolve_version(installed, "installed megatron-core")
    if version is not None and releases.resolve_version(version) != target:
        from mbridge_recompute.errors import InputError

        raise InputError("--mcore-version", f"the live validator runs the installed megatron-core "
                         f"{installed}; for {version} use --validator builtin")
    ev = builtin.evaluate(w, target, te_version)
    out = build(w, te_version)
    findings: list = []
    by_id = {f["id"]: f for f in ev.findings}
    live_ids: set = set()
    raised_at: Optional[tuple] = None          # where __post_init__ stopped (card.order_in terms)

    # warnings emitted before the exception (or all of them when it passed)
    for message, file, line in out.warnings:
        cid = map_message(message, target, file, line, warning=True)
        if cid == "cuda-graph-full-scope-deprecated" and w.cuda_graph_impl in (None, "none"):
            continue   # emitted for every default config; says nothing when graphs are off
        if cid is None:
            if file not in CONFIG_FILES.values():
                continue
            findings.append(_other("mcore-warning", "info", message, message, f"{file}:{line} (installed)"))
            continue
        if cid in live_ids:
            continue
        live_ids.add(cid)
        base = by_id.get(cid)
        findings.append(finding(cid, "live", target, base["message"] if base else message,
                                severity=base["severity"] if base else None, upstream=message))

    if out.exc_type is not None:
        cid = map_message(out.exc_message, target, out.exc_file, out.exc_line)
        where = f"{out.exc_file}:{out.exc_line} (installed megatron-core {installed})"
        said = f"megatron-core {installed} TransformerConfig raised {out.exc_type}: {out.exc_message}"
        if cid is None:
            findings.append(_other("mcore-config-error", "error", said, out.exc_message, where))
            # checks above the raising line of transformer_config.py passed
            if out.exc_file == "transformer_config.py":
                raised_at = (1, out.exc_line)
        else:
            raised_at = card.order_in(cid, target)
            live_ids.add(cid)
            f = finding(cid, "live", target, said, upstream=out.exc_message)
            f["raises"] = out.exc_type
            f["first"] = True
            te_stated = te_version if te_version is not None else w.te_version
            if out.exc_type == "TypeError" and cid in TE_GATED and te_stated is None:
                # no TE on this machine and no te_version given: megatron-core could not decide
                f["severity"] = "warning"
                f["message"] = (f"{by_id[cid]['message'] if cid in by_id else f['message']} - "
                                "megatron-core could not evaluate this check here (Transformer Engine "
                                f"is not installed on this machine; {target} raises TypeError). "
                                "Set cluster.te_version to decide it.")
            findings.append(f)

    bridge_live_runs = bridge_live.available() and w.defaults_source != "megatron-lm"
    for f in ev.findings:
        if f["id"] in live_ids or (bridge_live_runs and f["kind"] == "bridge"):
            continue           # Bridge's own checks are decided by Bridge below
        if f["kind"] == "config":
            order = card.order_in(f["id"], target)
            masked = out.exc_type is not None and (raised_at is None or order is None or order > raised_at)
            if not masked:
                continue   # the live config got past this check: it decided it
            f = dict(f, message=f["message"] + " (from the built-in table: megatron-core stopped "
                     "before this check)")
        findings.append(f)

    if w.extra_model.get("apply_rope_fusion") and not te_importable():
        findings.append(_other(
            "rope-fusion-not-decided-here", "info",
            "apply_rope_fusion was not checked: it needs Transformer Engine's fused RoPE kernel, "
            "which is not installed on this machine (megatron-core would raise 'apply_rope_fusion "
            "is not available. Please install TE >= 1.4.' here; on the training nodes it passes "
            "with TE >= 1.4)",
            "apply_rope_fusion is not available. Please install TE >= 1.4.",
            "transformer_config.py:1544-1552 @ core_v0.16.1"))

    extra = {"mcore_version": installed}
    if bridge_live_runs:
        findings.extend(_bridge_findings(w, target, ev))
    elif w.defaults_source == "megatron-lm":
        pass                   # Megatron-LM's training script: Bridge's checks do not apply
    else:
        findings.append({"id": "bridge-validation-unavailable", "severity": "info",
                         "message": "Megatron Bridge is not importable here, so ConfigContainer "
                                    "validation did not run; megatron-core's TransformerConfig did, "
                                    "and Bridge's own checks come from the built-in table.",
                         "fix": "run the check where Megatron Bridge (and Transformer Engine) is "
                                "installed to add Bridge's own validation",
                         "source": "live", "upstream_message": "", "citation": "", "kind": "bridge"})
    return report(findings, "live", target, **extra)


TE_GATED = frozenset({"fp8-moe-act-layernorm-needs-te-2-6", "moe-fp8-needs-te-1-7",
                      "moe-fp8-grouped-gemm-needs-te-1-11"})


def _bridge_findings(w, key: str, ev) -> list:
    """Megatron Bridge's own validation, run for real (rules/bridge_live.py): the check Bridge
    raised is decided by Bridge, the Bridge checks after it come from the built-in table (Bridge
    stopped before them), the ones before it passed."""
    try:
        out = bridge_live.run(w)
    except Exception as exc:   # noqa: BLE001 - Bridge import or build failures are environment facts
        return [{"id": "bridge-validation-unavailable", "severity": "info",
                 "message": f"Megatron Bridge's validation could not run: {type(exc).__name__}: {exc}",
                 "fix": "", "source": "live", "upstream_message": "", "citation": "", "kind": "bridge"}]
    state, cid, exc_type = bridge_live.verdict(out, key)
    builtin_bridge = [f for f in ev.findings if f["kind"] == "bridge"]
    order = bridge_live.bridge_ids(key)
    if state != "reject":
        # accepted (or stopped by megatron-core's own config, reported above): Bridge's checks
        # that come before the config's finalize ran; the built-in table has the rest
        if state == "mcore":
            return [dict(f, message=f["message"] + " (from the built-in table: megatron-core's config "
                         "stopped Bridge's validation first)") for f in builtin_bridge]
        return []
    said = (f"Megatron Bridge's {'validation' if out.stage == 'validate' else 'model provider'} raised "
            f"{exc_type}: {out.exc_message}")
    if cid is None:
        # a check no card rule describes, of a container whose other sections the checker wrote
        # itself, or one that needs the GPU stack (the flex dispatcher asks the CUDA driver,
        # training/flex_dispatcher_backend.py:88-109 @ megatron-bridge 0.6.2): not decided here
        gpu = bool(re.search(r"NVIDIA driver|CUDA|cuda", out.exc_message or ""))
        note = {"id": "bridge-validation-not-decided", "severity": "info" if gpu else "warning",
                "message": f"{said} - {'it needs a GPU here' if gpu else 'no card rule describes it'}; "
                           "Bridge's checks after it come from the built-in table",
                "fix": "run the check on a training node" if gpu else "see the upstream message",
                "source": "live", "upstream_message": out.exc_message,
                "citation": f"{out.where} (installed megatron-bridge)", "kind": "bridge"}
        return [note, *[dict(b, message=b["message"] + " (from the built-in table)") for b in builtin_bridge]]
    base = next((f for f in builtin_bridge if f["id"] == cid), None)
    f = finding(cid, "live", key, base["message"] if base else said, upstream=out.exc_message)
    f["raises"] = exc_type
    f["first"] = True
    after = [dict(b, message=b["message"] + " (from the built-in table: Bridge stopped before this check)")
             for b in builtin_bridge if b["id"] in order and order.index(b["id"]) > order.index(cid)]
    return [f, *after]
