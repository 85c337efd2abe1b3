"""Read a Megatron Bridge or Megatron-LM training log into a `RunLog` record.

The log contract (formats and the regexes below) comes from Bridge's
`train_utils.py` and Megatron-LM's `training.py`; every regex names its line.
What this module tolerates, on purpose:

* interleaved ranks: each line may carry a launcher prefix (`[default3]:` from
  torchrun, `[rank3]:` from PyTorch's per-rank tracebacks, `3: ` from `srun
  --label`, `[1,3]<stdout>:` from mpirun); prefixes are stripped and kept as the
  line's *stream* so a traceback is read from one rank's lines only;
* truncation: a log cut mid-line is read up to the cut; an iteration line that
  lacks its last field (`number of nan iterations`) is kept but marked
  incomplete, so a cut is never mistaken for a non-finite loss;
* broken bytes: the file is read as bytes and decoded with errors="replace".

Units: Bridge's runtime memory report is decimal GB (bytes / 1e9,
train_utils.py:1203-1209); Megatron-LM's is MiB (common_utils.py:313-334), which
is converted to decimal GB here so every peak in a `RunLog` is decimal GB;
theoretical lines are MiB (theoretical_memory_utils.py:340-353) and stay MiB.
OOM sizes are kept in bytes.

OOM events (numbers and stage) are read by `oom.py`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.logs.oom import Frame, OOMEvent, finite_or_none, oom_stage, parse_oom  # noqa: F401 (OOMEvent, parse_oom re-exported)
from mbridge_recompute.units import GB, MIB

# --- line prefixes added by launchers (torchrun --tee, PyTorch, srun --label, mpirun)
# (PyTorch's `[rankN]: ` carries one space of its own; torchrun's `[defaultN]:` none)
_PREFIX = re.compile(r"^(?:\s*(?:\[default\d+\]:|\[rank\d+\]: ?|\[1,\d+\]<std(?:out|err)>:|\d{1,5}: ))+")
_PREFIX_RANK = re.compile(r"\[(?:default|rank)(\d+)\]|\[1,(\d+)\]|^\s*(\d{1,5}): ")

# --- Bridge iteration line: train_utils.py:1088-1140 (MLM: training.py:3567-3653)
ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
TIME = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
TPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
LOSS = re.compile(r"\blm loss:\s*([-+\d.Ee]+|nan|NAN|NaN|inf|INF|-inf|-INF)")
GNORM = re.compile(r"grad norm:\s*([-+\d.Ee]+|nan|NAN|NaN|inf|INF)")
GBS = re.compile(r"global batch size:\s*(\d+)")
SKIP = re.compile(r"number of skipped iterations:\s*(\d+)")
NANS = re.compile(r"number of nan iterations:\s*(\d+)")
# --- Bridge throughput line, rank 0: train_utils.py:1036-1051
STEP = re.compile(r"Step Time :\s*([\d.]+)s GPU utilization:\s*([\d.]+)\s*MODEL_TFLOP/s/GPU")
# --- Bridge memory report: train_utils.py:1160-1213 (decimal GB)
MEM = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)(.*)")
MEM_KEY = re.compile(r"(mem-[\w-]+):\s*([\d.eE+-]+)")
# --- Megatron-LM memory report: common_utils.py:313-334 @ MLM 2a75ac12 (MiB)
MLMMEM = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \|"
                    r" max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
# --- theoretical_memory_utils.py:339-353 (MiB)
THEO = re.compile(r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
                  r"(?:, activation=([\d.]+) MB, total=([\d.]+) MB)?")
PARAMS = re.compile(r"Total number of parameters in billions:\s*([\d.]+)")
DONE = re.compile(r"\[after training is done\]")                 # pretrain.py:164
EXITING = re.compile(r"exiting program at iteration (\d+)")       # train.py:1509

# --- tracebacks
TB_START = re.compile(r"^Traceback \(most recent call last\):")
TB_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)')
EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Warning|Interrupt))(?::\s?(.*))?$")

# One harness run directory, as launch writes it and compare / diagnose read it.
LOG = "log.txt"
MANIFEST = "manifest.json"
CONFIG_DUMP = "ConfigContainer.yaml"     # what the harness passes as --save_config_filepath


# ---------------------------------------------------------------- records
@dataclass
class Iteration:
    iteration: int
    total: int
    time_ms: Optional[float] = None
    loss: Optional[float] = None         # None: `lm loss` missing (Bridge prints it only if >= 0)
    grad_norm: Optional[float] = None
    tflops: Optional[float] = None       # iteration-line throughput (only with log_throughput)
    global_batch_size: Optional[int] = None
    skipped: Optional[int] = None
    nan_iterations: Optional[int] = None
    complete: bool = True                # False: the line was cut before its last field
    line: int = 0

    @property
    def finite(self) -> bool:
        """Loss present and finite, grad norm (when printed) finite, no NaN iteration counted."""
        if not self.complete:
            return True  # a cut line proves nothing either way; counted separately
        if self.loss is None or not math.isfinite(self.loss):
            return False
        if self.grad_norm is not None and not math.isfinite(self.grad_norm):
            return False
        return not self.nan_iterations


@dataclass
class MemoryReport:
    rank: int
    after: int                       # "(after K iterations)"
    allocated_gb: Optional[float]
    max_allocated_gb: Optional[float]
    reserved_gb: Optional[float]
    max_reserved_gb: Optional[float]
    source: str                      # "bridge" (decimal GB) or "mlm" (MiB, converted)
    line: int = 0


@dataclass
class StepTime:
    seconds: float
    tflops: float
    line: int = 0


@dataclass
class Theoretical:
    weight_optimizer_mib: float
    activation_mib: Optional[float]
    total_mib: Optional[float]
    line: int = 0


@dataclass
class ErrorEvent:
    """An exception line (`ValueError: ...`), with the frames of its traceback."""
    exc_type: str
    message: str
    line: int
    stream: str = ""
    frames: list = field(default_factory=list)


@dataclass
class RunLog:
    name: str
    path: str = ""
    format: str = "unknown"          # "bridge", "mlm" or "unknown" (from the memory report style)
    iterations: list = field(default_factory=list)
    step_times: list = field(default_factory=list)
    memory: list = field(default_factory=list)
    theoretical: list = field(default_factory=list)
    params_billions: Optional[float] = None
    ooms: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    completed: bool = False          # `[after training is done]` seen
    exit_iteration: Optional[int] = None
    manifest: Optional[dict] = None
    config: Optional[dict] = None    # the run's ConfigContainer.yaml, flattened to dotted keys
    setting: Optional[str] = None
    # every line, prefixes stripped, for diagnose; iteration / Step Time / memory lines are
    # blanked (kept as "" so numbering holds) since no error text lives in them
    lines: list = field(default_factory=list)
    replaced_bytes: int = 0
    truncated: bool = False          # last line had no newline

    # ---- derived
    @property
    def target_iterations(self) -> Optional[int]:
        totals = [it.total for it in self.iterations]
        return max(totals) if totals else None

    @property
    def last_iteration(self) -> int:
        return max((it.iteration for it in self.iterations), default=0)

    @property
    def optimizer_initialised(self) -> bool:
        """A memory report after K >= 2 iterations or an iteration >= 2 line: the first
        optimizer step (which creates the optimizer state) has completed
        (train_utils.py:1151-1154: "memory after the second iteration ... include optimizer state")."""
        return any(m.after >= 2 for m in self.memory) or any(it.iteration >= 2 for it in self.iterations)

    def per_rank_peaks(self, at: Optional[int] = None) -> dict:
        """{rank: (after_k, max_allocated_gb, max_reserved_gb)}.

        Peaks are cumulative since process start (no reset in training/), so the
        max over a rank's reports up to `at` iterations (default: all) is the peak.
        """
        out: dict = {}
        for m in self.memory:
            if at is not None and m.after > at:
                continue
            k, a, r = out.get(m.rank, (0, None, None))
            out[m.rank] = (max(k, m.after), _max(a, m.max_allocated_gb), _max(r, m.max_reserved_gb))
        return out

    def report_points(self) -> set:
        return {m.after for m in self.memory}

    def peak(self, at: Optional[int] = None) -> tuple:
        """(hottest rank, max_allocated_gb, max_reserved_gb) over ranks, or (None, None, None)."""
        peaks = self.per_rank_peaks(at)
        if not peaks:
            return None, None, None
        hot = max(peaks, key=lambda r: (peaks[r][1] or 0.0, -r))
        reserved = max((p[2] for p in peaks.values() if p[2] is not None), default=None)
        return hot, peaks[hot][1], reserved

    @property
    def skipped_iterations(self) -> int:
        return sum(it.skipped or 0 for it in self.iterations)

    @property
    def nan_iterations(self) -> int:
        return sum(it.nan_iterations or 0 for it in self.iterations)

    @property
    def non_finite(self) -> list:
        return [it.iteration for it in self.iterations if not it.finite]

    def step_time_at(self) -> list:
        """Pair each Step Time line with the logged iteration it belongs to.

        Rank 0 prints it once per log interval, in the same `training_log` call as
        the iteration line (train_utils.py:1036-1051 before :1088), so the k-th
        Step Time line belongs to the k-th logged iteration. Extra lines (a cut
        log) get no iteration.
        """
        its = sorted({it.iteration for it in self.iterations})
        return [(its[i] if i < len(its) else None, st) for i, st in enumerate(self.step_times)]


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


# ---------------------------------------------------------------- parsing
def _num(text: str) -> float:
    t = text.strip().lower()
    if t in ("nan", "-nan"):
        return math.nan
    if t in ("inf", "+inf"):
        return math.inf
    if t == "-inf":
        return -math.inf
    try:
        return float(text)
    except ValueError:
        return math.nan


def split_prefix(raw: str) -> tuple:
    """(stream, rank, text): the launcher prefix, its rank number, the line without it."""
    if not raw or raw[0] not in "[ \t0123456789":
        return "", None, raw
    m = _PREFIX.match(raw)
    if not m:
        return "", None, raw
    prefix = m.group(0)
    rank = None
    for r in _PREFIX_RANK.finditer(prefix):
        rank = int(next(g for g in r.groups() if g is not None))
    return prefix.strip(), rank, raw[m.end():]


def parse_iteration(text: str, line: int = 0) -> Optional[Iteration]:
    m = ITER.search(text)
    if not m:
        return None
    it = Iteration(iteration=int(m.group(1)), total=int(m.group(2)), line=line)
    rest = text[m.end():]
    if (t := TIME.search(rest)):
        it.time_ms = _num(t.group(1))
    if (t := TPUT.search(rest)):
        it.tflops = _num(t.group(1))
    if (t := LOSS.search(rest)):
        it.loss = _num(t.group(1))
    if (t := GNORM.search(rest)):
        it.grad_norm = _num(t.group(1))
    if (t := GBS.search(rest)):
        it.global_batch_size = int(t.group(1))
    if (t := SKIP.search(rest)):
        it.skipped = int(t.group(1))
    if (t := NANS.search(rest)):
        it.nan_iterations = int(t.group(1))
    else:
        it.complete = False
    return it


def parse_memory(text: str, line: int = 0) -> Optional[MemoryReport]:
    m = MEM.search(text)
    if m:
        keys = {k: finite_or_none(_num(v)) for k, v in MEM_KEY.findall(m.group(3))}
        return MemoryReport(int(m.group(1)), int(m.group(2)), keys.get("mem-allocated-gigabytes"),
                            keys.get("mem-max-allocated-gigabytes"), keys.get("mem-reserved-gigabytes"),
                            keys.get("mem-max-reserved-gigabytes"), "bridge", line)
    m = MLMMEM.search(text)
    if m:
        gb = [finite_or_none(_num(v) * MIB / GB) for v in m.groups()[2:]]
        return MemoryReport(int(m.group(1)), int(m.group(2)), gb[0], gb[1], gb[2], gb[3], "mlm", line)
    return None


@dataclass
class _Stream:
    frames: Optional[list] = None
    after_frame: bool = False        # the next indented line is the frame's source line


_CARETS = re.compile(r"^\s*[\^~]+\s*$")      # Python 3.11+ error-location markers


def log_of(path) -> Path:
    """The log a user names: a file as given, or a harness run directory's log.txt."""
    p = Path(path)
    return p / LOG if p.is_dir() and (p / LOG).is_file() else p


def read_text(path: Path) -> tuple:
    """(text, replaced_count): bytes decoded with errors='replace'; InputError when unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except IsADirectoryError:
        raise InputError(str(path), f"is a directory without {LOG}") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    text = data.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")


def parse_text(text: str, name: str = "log", path: str = "") -> RunLog:
    """Parse a whole log's text. Never raises on content."""
    run = RunLog(name=name, path=path)
    run.truncated = bool(text) and not text.endswith("\n")
    streams: dict = {}
    last_logged = 0
    seen_oom: dict = {}
    # split on "\n" only (not str.splitlines' form feeds and Unicode separators) so line
    # numbers are the ones an editor shows
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    for no, raw in enumerate(rows, start=1):
        stream, rank, line = split_prefix(raw.replace("\r", ""))
        run.lines.append(line)
        st = streams.setdefault(stream, _Stream())
        # tracebacks (per stream, so interleaved ranks do not mix frames)
        if TB_START.match(line):
            st.frames = []
            continue
        if st.frames is not None:
            fm = TB_FRAME.match(line)
            if fm:
                st.frames.append(Frame(fm.group(1), int(fm.group(2)), fm.group(3)))
                st.after_frame = True
                continue
            if (st.after_frame and line.startswith("    ")) or _CARETS.match(line):
                continue         # source text shown in a traceback is code, not an event
            st.after_frame = False
        oom = parse_oom(line, no)
        if oom is not None:
            oom.stream, oom.rank = stream, rank
            oom.frames = list(st.frames or [])
            oom.iteration = last_logged + 1
            oom.stage = oom_stage(oom.frames, last_logged)
            key = oom.key() if oom.parsed else ("text", oom.text[-200:])
            prev = seen_oom.get(key)
            if prev is None:
                seen_oom[key] = oom
                run.ooms.append(oom)
            elif not prev.frames and oom.frames:   # keep the copy that carries the traceback
                run.ooms[run.ooms.index(prev)] = oom
                seen_oom[key] = oom
            st.frames = None
            continue
        em = EXC_LINE.match(line)
        if em and (st.frames is not None or not em.group(1).endswith("Warning")):
            run.errors.append(ErrorEvent(em.group(1), (em.group(2) or "").strip(), no, stream, list(st.frames or [])))
            st.frames = None
            continue
        it = parse_iteration(line, no)
        if it is not None:
            run.iterations.append(it)
            run.lines[-1] = ""
            last_logged = max(last_logged, it.iteration)
            continue
        if (m := STEP.search(line)):
            run.step_times.append(StepTime(_num(m.group(1)), _num(m.group(2)), no))
            run.lines[-1] = ""
            continue
        mem = parse_memory(line, no)
        if mem is not None:
            run.memory.append(mem)
            run.lines[-1] = ""
            run.format = mem.source if run.format == "unknown" else run.format
            last_logged = max(last_logged, mem.after)
            continue
        if (m := THEO.search(line)):
            weight = finite_or_none(_num(m.group(1)))
            if weight is not None:
                run.theoretical.append(Theoretical(weight, finite_or_none(_num(m.group(2) or "nan")),
                                                   finite_or_none(_num(m.group(3) or "nan")), no))
            continue
        if (m := PARAMS.search(line)):
            run.params_billions = finite_or_none(_num(m.group(1)))
            continue
        if DONE.search(line):
            run.completed = True
            continue
        if (m := EXITING.search(line)):
            run.exit_iteration = int(m.group(1))
    if run.format == "unknown" and run.iterations:
        run.format = "bridge" if run.step_times else "unknown"
    return run


def run_name(path: Path, manifest: Optional[dict]) -> str:
    """A run is named by its manifest, else its directory when the log is `log.txt`, else its file stem."""
    if manifest and isinstance(manifest.get("name"), str) and manifest["name"]:
        return manifest["name"]
    if path.name == LOG and path.parent.name:
        return path.parent.name
    return path.stem


def read_manifest(path: Path) -> Optional[dict]:
    """`manifest.json` beside the log (the harness writes run_dir/manifest.json + run_dir/log.txt)."""
    mpath = path.parent / MANIFEST
    if not mpath.is_file():
        return None
    try:
        data = json.loads(mpath.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        raise InputError(str(mpath), f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(str(mpath), "must be a JSON object")
    return data


def _flatten(node, prefix: str = "", out: Optional[dict] = None) -> dict:
    out = {} if out is None else out
    if isinstance(node, dict):
        for k, v in node.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = node
    return out


def read_config_dump(path: Path) -> Optional[dict]:
    """The `ConfigContainer.yaml` beside the log, flattened; None when absent or unreadable.

    Bridge dumps may carry Python tags; they are read as plain values, not constructed.
    A dump that cannot be read is skipped (the comparison falls back to manifest and log).
    """
    cpath = path.parent / CONFIG_DUMP
    if not cpath.is_file():
        return None
    import yaml

    class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    def _any(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Loader.add_multi_constructor("", _any)
    try:
        data = yaml.load(cpath.read_text(encoding="utf-8", errors="replace"), Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return None
    return _flatten(data) if isinstance(data, dict) else None


def manifest_setting(manifest: Optional[dict]) -> Optional[str]:
    """The recompute setting a manifest names, as text (`[]`, `moe_act`, `block:4`, ...)."""
    if not manifest:
        return None
    s = manifest.get("setting")
    if isinstance(s, str):
        return s
    if isinstance(s, dict):
        gran = s.get("recompute_granularity", s.get("granularity"))
        mods = s.get("recompute_modules", s.get("modules"))
        if gran == "selective":
            return "[]" if not mods else ",".join(mods)
        if gran == "full":
            return f"{s.get('recompute_method', s.get('method'))}:{s.get('recompute_num_layers', s.get('num_layers'))}"
        if gran in (None, "none"):
            return "none"
    return None


def parse_file(path: str | Path, name: Optional[str] = None) -> RunLog:
    """Parse one log file (and its manifest.json when present)."""
    p = Path(path)
    manifest = read_manifest(p)
    text, replaced = read_text(p)
    run = parse_text(text, name=name or run_name(p, manifest), path=str(p))
    run.replaced_bytes = replaced
    run.manifest = manifest
    run.config = read_config_dump(p)
    run.setting = manifest_setting(manifest)
    return run


def parse_lines(lines: Iterable[str], name: str = "log") -> RunLog:
    return parse_text("\n".join(lines) + "\n", name=name)
