"""`tune.json`: the one record of a tune, in its run root.

It holds what the command was (a fingerprint of the workload and every option that decides
what runs), each step's calibration and decision, each run (its directory, whether it finished,
its measurement and verdict) and the stop. Re-running the same command reads it back: a run that
finished is never repeated, one that was interrupted (or never ended: the tool itself was
killed) runs again, and the decisions go on from the last step. A different command pointed at
the same root is refused rather than mixed in. The file is replaced atomically after every
change (`files.write`), so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from mbridge_recompute.errors import InputError, Rejected

FILE = "tune.json"
FORMAT = "mbridge-recompute tune 1"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def digest(value) -> str:
    """A stable hash of a JSON-able value (dataclasses and paths as text)."""
    blob = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class RunRecord:
    candidate: str
    name: str                         # the run directory's name (the setting's slug)
    run_dir: str
    step: int
    role: str                         # baseline / candidate / neighbour
    state: str = "pending"            # pending / finished / interrupted
    measurement: Optional[dict] = None
    verdict: Optional[dict] = None


@dataclass
class TuneState:
    fingerprint: dict
    root: str
    baseline: str
    budget_bytes: int
    need_bytes: Optional[int]
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    plan: dict = field(default_factory=dict)        # the uncalibrated plan, in short
    steps: list = field(default_factory=list)       # {step, at, calibration, decision}
    runs: list = field(default_factory=list)        # RunRecord, in the order they were chosen
    stop: Optional[dict] = None                     # {reason, why, at}
    answer: Optional[dict] = None

    # ---- queries
    def run(self, candidate: str) -> Optional[RunRecord]:
        return next((r for r in self.runs if r.candidate == candidate), None)

    def finished(self) -> list:
        return [r for r in self.runs if r.state == "finished"]

    def pending(self) -> list:
        """Runs chosen but not finished (never started, or interrupted): they run next."""
        return [r for r in self.runs if r.state != "finished"]

    @property
    def runs_started(self) -> int:
        """Runs that count against --max-runs: every run chosen (an interrupted one once)."""
        return len(self.runs)

    # ---- file
    def to_dict(self) -> dict:
        d = {"format": FORMAT, **asdict(self)}
        return d

    def save(self, root: Path) -> Path:
        from mbridge_recompute import files

        self.updated_at = now()
        path = Path(root) / FILE
        files.write(path, json.dumps(self.to_dict(), indent=2, default=str) + "\n", force=True, field="--out")
        return path


def load(path: Path, field_name: str = "--from") -> TuneState:
    """A tune.json read back; InputError naming `field_name` when it is not one."""
    from mbridge_recompute.files import read_json

    data = read_json(path, field_name, "tune record")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(field_name, f"{path} is not a tune record (no \"format\": {FORMAT!r})")
    try:
        runs = [RunRecord(**r) for r in data.get("runs") or []]
        return TuneState(fingerprint=data["fingerprint"], root=data["root"], baseline=data["baseline"],
                         budget_bytes=int(data["budget_bytes"]), need_bytes=data.get("need_bytes"),
                         created_at=data.get("created_at", ""), updated_at=data.get("updated_at", ""),
                         plan=data.get("plan") or {}, steps=list(data.get("steps") or []), runs=runs,
                         stop=data.get("stop"), answer=data.get("answer"))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(field_name, f"{path}: a tune record missing or mistyping {exc}") from None


def check_same_command(state: TuneState, fingerprint: dict, path: Path) -> None:
    """Refuse to resume a record another command wrote (exit 1, naming what differs)."""
    for key in sorted(set(state.fingerprint) | set(fingerprint)):
        if state.fingerprint.get(key) != fingerprint.get(key):
            raise Rejected("--out", f"{path} was written by another tune command ({key} differs: "
                                    f"{str(state.fingerprint.get(key))[:80]!r} there, "
                                    f"{str(fingerprint.get(key))[:80]!r} now); give another --out, or "
                                    "read it with --from")
