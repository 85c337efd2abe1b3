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
# (every number a regex hands to int() is bounded, so a 5000-digit "rank" is text, not a
# ValueError past Python's integer-conversion limit)
def is_option(tok: str) -> bool:
    """Whether a token of a run's command line is an option (`-x`, `--flag`, `--k=v`) rather
    than a value: a lone `-` and negative numbers (`-1`, `-1e-5`) are values."""
    if not tok.startswith("-") or len(tok) == 1:
        return False
    try:
        float(tok)
        return False
    except ValueError:
        return True


_PREFIX = re.compile(r"^(?:\s*(?:\[default\d{1,6}\]:|\[rank\d{1,6}\]: ?"
                     r"|\[1,\d{1,6}\]<std(?:out|err)>:|\d{1,5}: ))+")
_PREFIX_RANK = re.compile(r"\[(?:default|rank)(\d{1,6})\]|\[1,(\d{1,6})\]|^\s*(\d{1,5}): ")

# --- Bridge iteration line: train_utils.py:1088-1140 (MLM: training.py:3567-3653)
ITER = re.compile(r"iteration\s+(\d{1,12})/\s*(\d{1,12})\s*\|")
TIME = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
TPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
LOSS = re.compile(r"\blm loss:\s*([-+\d.Ee]+|nan|NAN|NaN|inf|INF|-inf|-INF)")
GNORM = re.compile(r"grad norm:\s*([-+\d.Ee]+|nan|NAN|NaN|inf|INF)")
GBS = re.compile(r"global batch size:\s*(\d{1,12})(?!\d)")
SKIP = re.compile(r"number of skipped iterations:\s*(\d{1,12})(?!\d)")
NANS = re.compile(r"number of nan iterations:\s*(\d{1,12})(?!\d)")
# --- Bridge throughput line, rank 0: train_utils.py:1036-1051
STEP = re.compile(r"Step Time :\s*([\d.]+)s GPU utilization:\s*([\d.]+)\s*MODEL_TFLOP/s/GPU")
# --- Bridge memory report: train_utils.py:1160-1213 (decimal GB)
MEM = re.compile(r"\[Rank (\d{1,9})\] \(after (\d{1,12}) iterations\) memory \(GB\)(.*)")
MEM_KEY = re.compile(r"(mem-[\w-]+):\s*([\d.eE+-]+)")
# --- Megatron-LM memory report: common_utils.py:313-334 @ MLM 2a75ac12 (MiB)
MLMMEM = re.compile(r"\[Rank (\d{1,9})\] \(after (\d{1,12}) iterations\) memory \(MB\)"
                    r" \| allocated: ([\d.]+) \|"
                    r" max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
# --- theoretical_memory_utils.py:339-353 (MiB)
THEO = re.compile(r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
                  r"(?:, activation=([\d.]+) MB, total=([\d.]+) MB)?")
PARAMS = re.compile(r"Total number of parameters in billions:\s*([\d.]+)")
DONE = re.compile(r"\[after training is done\]")                 # pretrain.py:164
EXITING = re.compile(r"exiting program at iteration (\d{1,12})(?!\d)")       # train.py:1509

# --- tracebacks
TB_START = re.compile(r"^Traceback \(most recent call last\):")
TB_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d{1,9}), in (\S+)')
EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Warning|Interrupt))"
                      r"(?::\s?(.*))?$")

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
    if raw[0] in " \t":
        head = raw.lstrip(" \t")
        if not head or head[0] not in "[0123456789":
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


# ANSI escape sequences (colour, cursor moves; CSI and OSC forms, and two-byte escapes): a
# coloured log must parse like a plain one, and none of it may reach the user's terminal
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])"
                   r"|\x9b[0-?]*[ -/]*[@-~]")
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def detect_encoding(data: bytes) -> str:
    """utf-8, or the UTF-16/32 a byte-order mark or the NUL pattern of a BOM-less file shows.

    Windows tools (PowerShell's `>` / Tee-Object) write UTF-16 LE; such a log read as UTF-8
    holds a NUL between every character and would match nothing.
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    sample = data[:4096]
    if len(sample) >= 4:
        even, odd = sample[0::2].count(0), sample[1::2].count(0)
        half = len(sample) // 2
        if odd > 0.4 * half and even < 0.05 * half:
            return "utf-16-le"
        if even > 0.4 * half and odd < 0.05 * half:
            return "utf-16-be"
    return "utf-8"


def decode_log(data: bytes) -> tuple:
    """(text, replaced_count, encoding): newlines normalised, ANSI sequences removed.

    A lone CR ends a line too: a log written with CR-only line ends (old macOS tools, progress
    bars redrawn in place) would otherwise be one line.
    """
    enc = detect_encoding(data)
    bom = next((b for b, name in _BOMS if name == enc and data.startswith(b)), b"")
    body = data[len(bom):]
    text = body.decode(enc, errors="replace")
    replaced = text.count("\ufffd") - body.decode(enc, errors="ignore").count("\ufffd")
    return normalize(text), replaced, enc


def normalize(text: str) -> str:
    """Line ends as "\\n" (CRLF and a lone CR both end a line), ANSI escape sequences removed."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x1b" in text or "\x9b" in text:
        text = _ANSI.sub("", text)
    return text


def read_text(path: Path, field: str | None = None) -> tuple:
    """(text, replaced_count) of a log; InputError when it is unreadable, not a file or empty."""
    from mbridge_recompute.files import LOG_LIMIT, read_bytes

    p = Path(path)
    field = field or str(p)
    if p.is_dir():
        raise InputError(field, f"is a directory without {LOG}")
    data = read_bytes(p, field, LOG_LIMIT)
    text, replaced, _ = decode_log(data)
    if not text.strip():
        raise InputError(field, "is empty")
    return text, replaced


def parse_text(text: str, name: str = "log", path: str = "") -> RunLog:
    """Parse a whole log's text. Never raises on content."""
    # a long log becomes millions of small records that hold no reference cycles; the cyclic
    # collector rescanning them again and again cost a third of the parse time of a 1.2M-
    # traceback log, so it pauses while they are built
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        return _parse_text(text, name, path)
    finally:
        if paused:
            gc.enable()


def _parse_text(text: str, name: str, path: str) -> RunLog:
    text = normalize(text)
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
        stream, rank, line = split_prefix(raw)
        run.lines.append(line)
        st = streams.get(stream)
        if st is None:
            st = streams[stream] = _Stream()
        # tracebacks (per stream, so interleaved ranks do not mix frames)
        # traceback headers, frames and the source they show are blanked in `run.lines` too:
        # no error message lives there (a `raise X("...")` source line is code), and diagnose
        # then has a quarter of a traceback's lines to search
        if line.startswith("Traceback") and TB_START.match(line):
            st.frames = []
            run.lines[-1] = ""
            continue
        if st.frames is not None:
            fm = TB_FRAME.match(line) if line.lstrip().startswith("File ") else None
            if fm:
                st.frames.append(Frame(fm.group(1), int(fm.group(2)), fm.group(3)))
                st.after_frame = True
                run.lines[-1] = ""
                continue
            if (st.after_frame and line.startswith("    ")) or (("^" in line or "~" in line)
                                                               and _CARETS.match(line)):
                run.lines[-1] = ""
                continue         # source text shown in a traceback is code, not an event
            st.after_frame = False
        # cheap substring tests first: most lines of a long log are none of these, and a
        # dozen regex searches per line were most of the parse time on a large log
        oom = parse_oom(line, no) if ("out of memory" in line or "OutOfMemoryError" in line) else None
        if oom is not None:
            oom.stream, oom.rank = stream, rank
            oom.frames = list(st.frames or [])
            oom.iteration = last_logged + 1 if last_logged else None
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
        em = EXC_LINE.match(line) if ("Error" in line or "Exception" in line or "Warning" in line
                                       or "Interrupt" in line) else None
        if em and (st.frames is not None or not em.group(1).endswith("Warning")):
            run.errors.append(ErrorEvent(em.group(1), (em.group(2) or "").strip(), no, stream,
                                         list(st.frames or [])))
            st.frames = None
            continue
        if not ("iteration" in line or "Step Time" in line or "Theoretical memory" in line
                or "number of parameters" in line or "after training is done" in line):
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


# manifest.json fields the tools read, and the types they must have (the harness writes them;
# a hand-edited or foreign manifest with another type is bad input, never a traceback)
_MANIFEST_TYPES = {
    "name": (str,), "candidate": (str,), "setting": (str, dict), "argv": (list,),
    "recompute_tokens": (list,), "revisions": (dict,), "git": (dict,), "env": (dict,),
    "status": (str,), "returncode": (int, type(None)), "cwd": (str,),
}
_SETTING_TYPES = {
    "recompute_granularity": (str, type(None)), "granularity": (str, type(None)),
    "recompute_modules": (list, type(None)), "modules": (list, type(None)),
    "recompute_method": (str, type(None)), "method": (str, type(None)),
    "recompute_num_layers": (int, type(None)), "num_layers": (int, type(None)),
}
_TYPE_NAMES = {str: "text", dict: "a mapping", list: "a list", int: "an integer", type(None): "null"}


def _check_types(data: dict, types: dict, where: str) -> None:
    for key, want in types.items():
        if key not in data:
            continue
        value = data[key]
        # bool is an int in Python; a `true` where a count belongs is not 1
        if not isinstance(value, want) or isinstance(value, bool):
            names = " or ".join(_TYPE_NAMES[t] for t in want)
            raise InputError(f"{where}: {key}", f"must be {names}, got {type(value).__name__}")


def read_manifest(path: Path) -> Optional[dict]:
    """`manifest.json` beside the log (the harness writes run_dir/manifest.json + run_dir/log.txt)."""
    from mbridge_recompute.files import read_json

    mpath = path.parent / MANIFEST
    if not mpath.is_file():
        return None
    data = read_json(mpath, str(mpath))
    if not isinstance(data, dict):
        raise InputError(str(mpath), "must be a JSON object")
    _check_types(data, _MANIFEST_TYPES, str(mpath))
    for key in ("argv", "recompute_tokens"):
        if key in data and not all(isinstance(t, str) for t in data[key]):
            raise InputError(f"{mpath}: {key}", "must be a list of text tokens")
    for key in ("env", "revisions", "git"):
        if key in data and not all(isinstance(v, (str, type(None))) for v in data[key].values()):
            raise InputError(f"{mpath}: {key}", "must map names to text")
    if isinstance(data.get("setting"), dict):
        _check_types(data["setting"], _SETTING_TYPES, f"{mpath}: setting")
        for key in ("recompute_modules", "modules"):
            mods = data["setting"].get(key)
            if isinstance(mods, list) and not all(isinstance(m, str) for m in mods):
                raise InputError(f"{mpath}: setting.{key}", "must be a list of labels (text)")
    return data


def flatten(node, field: str = "config", max_values: int = 200_000) -> dict:
    """A nested mapping as {dotted.key: leaf}, without recursion, at most `max_values` leaves."""
    out: dict = {}
    stack = [("", node)]
    while stack:
        prefix, value = stack.pop()
        if isinstance(value, dict) and value:
            for k, v in reversed(list(value.items())):
                stack.append((f"{prefix}.{k}" if prefix else str(k), v))
            continue
        out[prefix] = value
        if len(out) > max_values:
            raise InputError(field, f"holds more than {max_values} values")
    return out


def read_config_dump(path: Path) -> Optional[dict]:
    """The `ConfigContainer.yaml` beside the log, flattened; None when absent.

    Bridge dumps carry Python tags (`_target_`); they are read as plain values, never
    constructed. A dump that cannot be read -- not YAML, an alias bomb, a self-referencing
    anchor, nesting past any real config -- is bad input naming the file (exit 2), refused
    before it is expanded.
    """
    from mbridge_recompute.files import DOC_LIMIT, decode_utf8, read_bytes, yaml_tree

    cpath = path.parent / CONFIG_DUMP
    if not cpath.is_file():
        return None
    field = str(cpath)
    data = yaml_tree(decode_utf8(read_bytes(cpath, field, DOC_LIMIT), field), field)
    return flatten(data, field) if isinstance(data, dict) else None


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
            method = s.get("recompute_method", s.get("method"))
            return f"{method}:{s.get('recompute_num_layers', s.get('num_layers'))}"
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
