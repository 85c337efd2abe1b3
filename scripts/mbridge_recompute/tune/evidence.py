"""What one finished run showed, as the tune loop reads it.

From the run's log (and its manifest): the peak allocated per memory-reporting rank after
iteration 1 and in the steady state (after iteration 2 or later), the OOM point (iteration,
stage, what was allocated and what was asked for), the mean steady step time, the diagnosis of
a failure (`logs/diagnose.py`), and the comparison with the baseline run under the measurement
contract (`logs/compare.py`: status, matched or not, peak delta at the matched point, step-time
delta). Sizes are decimal GB as Bridge prints them; OOM sizes are converted from the bytes
PyTorch's message gives.

Where the training log is: a local run writes it to the run directory's `log.txt`. A Slurm run
started through Bridge's `setup_experiment.py` leaves there only what the login-node process
printed; with `--detach false` that process waits for the job, and nemo-run keeps the job's log
under the log directory (`-l`, NEMORUN_HOME) as
`experiments/{exp}/{exp}_{timestamp}/{exp}/log*.out`, `exp` being the `-wdj` name
(`setup_experiment.py:122-139,820,864 @ 067f987`): that file is read when it exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from mbridge_recompute.units import GB


@dataclass
class Peak:
    """The peak allocated one memory-reporting rank printed (Bridge: DP rank 0's model-parallel ranks)."""
    rank: int
    pp_rank: int
    after: int                 # "(after K iterations)"
    allocated_gb: float        # mem-max-allocated-gigabytes


@dataclass
class OOMPoint:
    """Where a run ran out of memory, and what it held then."""
    rank: Optional[int]        # global rank, when a launcher prefix names it
    gpu: Optional[int]         # "GPU N" of the message (a local device index)
    pp_rank: Optional[int]     # from the global rank; None when the log does not say
    iteration: int             # the iteration in progress (1 when nothing was logged before it)
    stage: str                 # oom.py's stage: first-forward, forward, backward, optimizer-step, ...
    allocated_gb: Optional[float]
    requested_gb: Optional[float]

    @property
    def demand_gb(self) -> Optional[float]:
        """What the rank needed at that moment: allocated plus the request that failed (a floor
        of its peak: the step would have gone on allocating)."""
        if self.allocated_gb is None or self.requested_gb is None:
            return None
        return self.allocated_gb + self.requested_gb


@dataclass
class Measurement:
    name: str
    candidate: str                       # the setting in candidate syntax
    launch_status: str                   # the manifest's: ok, failed, timed-out, interrupted, not-started
    returncode: Optional[int]
    status: str                          # compare's pass / oom / nan / incomplete; "no-log" without one
    log: Optional[str] = None            # the file read
    first_iteration: list = field(default_factory=list)   # Peak after iteration 1
    steady: list = field(default_factory=list)            # Peak after iteration >= 2 (the latest)
    survived: int = 0                    # the last iteration the log shows completed
    ooms: list = field(default_factory=list)              # OOMPoint
    step_time_ms: Optional[float] = None
    tflops_per_gpu: Optional[float] = None
    delta_at: Optional[int] = None       # the matched point of the peak delta
    delta_peak_gb: Optional[float] = None
    delta_time_pct: Optional[float] = None
    matched: bool = True
    unmatched: list = field(default_factory=list)          # why not, when not
    diagnosis: Optional[dict] = None     # {kind, evidence, next_action} of the failure
    last_line: str = ""                  # the log's last line, for a failure nothing explains
    notes: list = field(default_factory=list)

    @property
    def steady_peak_gb(self) -> Optional[float]:
        return max((p.allocated_gb for p in self.steady), default=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steady_peak_gb"] = self.steady_peak_gb
        for o, raw in zip(d["ooms"], self.ooms):
            o["demand_gb"] = raw.demand_gb
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        d = dict(d)
        d.pop("steady_peak_gb", None)
        d["first_iteration"] = [Peak(**p) for p in d.get("first_iteration") or []]
        d["steady"] = [Peak(**p) for p in d.get("steady") or []]
        d["ooms"] = [OOMPoint(**{k: v for k, v in o.items() if k != "demand_gb"})
                     for o in d.get("ooms") or []]
        return cls(**d)


# ---------------------------------------------------------------- finding the log

def nemo_run_log(log_dir: Path, exp: str) -> Optional[Path]:
    """The newest `experiments/{exp}/{exp}_*/{exp}/log*.out` under nemo-run's home, or None."""
    base = Path(log_dir) / "experiments" / exp
    if not base.is_dir():
        return None
    found = [p for p in base.glob(f"{exp}_*/{exp}/log*.out") if p.is_file() and not p.is_symlink()]
    return max(found, key=lambda p: (p.stat().st_mtime, str(p)), default=None)


def training_log(run_dir: Path, manifest: Optional[dict]) -> Optional[Path]:
    """The file that holds the run's training output (module docstring)."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv
    from mbridge_recompute.logs.runlog import LOG

    argv = HarnessArgv.of_command((manifest or {}).get("argv") or [], (manifest or {}).get("bridge_release"))
    log_dir, exp = argv.value("--log_dir"), argv.value("--wandb_experiment_name")
    if (manifest or {}).get("launcher") == "slurm" and log_dir and exp:
        job = nemo_run_log(Path(log_dir), exp)
        if job is not None:
            return job
    own = Path(run_dir) / LOG
    return own if own.is_file() else None


def read_run(run_dir: Path):
    """(RunLog or None, manifest) of one run directory, read through the tools' one reader
    (`logs/rundir.py`); the training log is the run's own or, on Slurm, the job's."""
    from mbridge_recompute import files
    from mbridge_recompute.logs import runlog
    from mbridge_recompute.logs.rundir import RunDir

    run_dir = Path(run_dir)
    if not files.exists(run_dir / runlog.LOG):
        mpath = run_dir / runlog.MANIFEST
        manifest = runlog.check_manifest(files.read_json(mpath, str(mpath), "manifest"), str(mpath)) \
            if files.exists(mpath) else None
        return None, manifest
    rd = RunDir(str(run_dir))
    manifest = rd.manifest
    job = training_log(run_dir, manifest)
    log = job or rd.log_path
    name = runlog.run_name(rd.log_path, manifest)
    if log.stat().st_size == 0:          # the run printed nothing: a record with no lines
        run = runlog.parse_text("\n", name=name, path=str(log))
    elif log != rd.log_path:
        run = runlog.parse_path(log, str(log), name)
    else:
        return rd.parse(), manifest
    run.manifest, run.setting = manifest, runlog.manifest_setting(manifest)
    return run, manifest


# ---------------------------------------------------------------- reading it

def _peaks(run, w, first: bool) -> list:
    from mbridge_recompute.plan.measured import pp_rank_of

    best: dict = {}
    for m in run.memory:
        if m.max_allocated_gb is None or (m.after == 1) != first or m.after < 1:
            continue
        prev = best.get(m.rank)
        if prev is None or (m.after, m.max_allocated_gb) > (prev.after, prev.allocated_gb):
            best[m.rank] = Peak(m.rank, pp_rank_of(m.rank, w), m.after, m.max_allocated_gb)
    return [best[r] for r in sorted(best)]


def _oom_points(run, w) -> list:
    from mbridge_recompute.plan.measured import pp_rank_of

    out = []
    for o in run.ooms:
        rank = o.rank if isinstance(o.rank, int) else None
        out.append(OOMPoint(rank=rank, gpu=o.gpu, pp_rank=pp_rank_of(rank, w) if rank is not None else None,
                            iteration=o.iteration or 1, stage=o.stage,
                            allocated_gb=None if o.allocated is None else o.allocated / GB,
                            requested_gb=None if o.requested is None else o.requested / GB))
    return out


def _diagnosis(run) -> Optional[dict]:
    from mbridge_recompute.logs import diagnose

    report = diagnose.diagnose(run)
    for f in report["findings"]:
        if f["kind"] in diagnose.EXPLAINING_KINDS or (f["kind"] in ("config", "runtime")
                                                      and f.get("severity") == "error"):
            return {"kind": f["kind"], "evidence": f["evidence"], "next_action": f["next_action"]}
    return None


def measure(run, manifest: Optional[dict], baseline, w, candidate: str) -> Measurement:
    """The measurement of one run; `baseline` is the RunLog the deltas are taken against (None:
    this run is the baseline)."""
    from mbridge_recompute.logs import compare

    launch_status = (manifest or {}).get("status") or "unknown"
    returncode = (manifest or {}).get("returncode")
    name = (manifest or {}).get("name") or (run.name if run is not None else candidate)
    if run is None:
        return Measurement(name, candidate, launch_status, returncode, status="no-log",
                           notes=["the run left no log to read"])
    runs = [run] if baseline is None or baseline is run else [baseline, run]
    report = compare.compare(runs, control_name=runs[0].name)
    row = next(r for r in report["runs"] if r["name"] == run.name)
    m = Measurement(name, candidate, launch_status, returncode, status=row["status"], log=run.path,
                    first_iteration=_peaks(run, w, True), steady=_peaks(run, w, False),
                    survived=run.last_iteration, ooms=_oom_points(run, w),
                    step_time_ms=row["step_time_ms"], tflops_per_gpu=row["tflops_per_gpu"],
                    delta_at=row["delta_at"], delta_peak_gb=row["delta_peak_gb"],
                    delta_time_pct=row["delta_time_pct"], matched=row["matched"],
                    unmatched=list(row["reasons"]), notes=list(row["notes"]))
    if m.status != "pass":
        m.diagnosis = _diagnosis(run)
    m.last_line = next((ln.strip() for ln in reversed(run.lines) if ln.strip()), "")[:300] or \
        str((manifest or {}).get("error") or "")[:300]
    return m
