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
* broken bytes: the file is read as bytes and decoded with errors="replace";
* size: a log is read in CHUNK-byte pieces and parsed line by line, and what a run keeps is
  bounded (the MAX_* counts below), so the memory a reader needs does not grow with the file:
  a 1 GiB log costs what a 10 MB one does (tests/test_hostile_surfaces.py measures it). What a
  bound left out is counted in `RunLog.dropped`, and the readers say so.

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
from collections import deque
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


# ---------------------------------------------------------------- bounds
# What one parsed run holds at most, whatever the size of its log. Real harness runs log a few
# hundred iteration lines and tens of memory reports per rank; these counts are far above that
# and keep a parsed run within tens of MB (an iteration record is ~200 bytes).
CHUNK = 1 << 20                 # bytes read and decoded at a time
MAX_LINE_CHARS = 1 << 20        # a longer line is cut there (its rest, up to the newline, skipped)
MAX_ITERATIONS = 100_000        # the last ones are kept: the steady window is the end of a run
MAX_STEP_TIMES = 100_000        # the last ones, like the iteration lines they pair with
MAX_MEMORY_REPORTS = 100_000    # the first ones (1,000 ranks x 100 reports)
MAX_THEORETICAL = 1_000
MAX_ERRORS = 1_000              # the first exception lines; every one is still scanned
MAX_OOMS = 200                  # distinct OOM events, the first ones
MAX_FRAMES = 100                # of one traceback: the outermost 30 and the innermost 70
MAX_TEXT = 2_000                # characters of one error message kept
MAX_KEPT_LINES = 20_000         # lines kept for a caller that did not scan them while parsing
MAX_KEPT_LINE = 4_096           # characters of a kept line
MAX_NON_FINITE = 100            # iteration numbers listed as non-finite (all are counted)


# ---------------------------------------------------------------- records
@dataclass(slots=True)
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


@dataclass(slots=True)
class MemoryReport:
    rank: int
    after: int                       # "(after K iterations)"
    allocated_gb: Optional[float]
    max_allocated_gb: Optional[float]
    reserved_gb: Optional[float]
    max_reserved_gb: Optional[float]
    source: str                      # "bridge" (decimal GB) or "mlm" (MiB, converted)
    line: int = 0


@dataclass(slots=True)
class StepTime:
    seconds: float
    tflops: float
    line: int = 0


@dataclass(slots=True)
class Theoretical:
    weight_optimizer_mib: float
    activation_mib: Optional[float]
    total_mib: Optional[float]
    line: int = 0


@dataclass(slots=True)
class ErrorEvent:
    """An exception line (`ValueError: ...`), with the frames of its traceback."""
    exc_type: str
    message: str
    line: int
    stream: str = ""
    frames: list = field(default_factory=list)


@dataclass
class _Dropped:
    """What the iteration lines no longer kept (past MAX_ITERATIONS) said, in sum."""
    count: int = 0
    max_total: Optional[int] = None
    max_iteration: int = 0
    reached_two: bool = False
    skipped: int = 0
    nan_iterations: int = 0
    non_finite: list = field(default_factory=list)

    def add(self, it: Iteration) -> None:
        self.count += 1
        self.max_total = it.total if self.max_total is None else max(self.max_total, it.total)
        self.max_iteration = max(self.max_iteration, it.iteration)
        self.reached_two = self.reached_two or it.iteration >= 2
        self.skipped += it.skipped or 0
        self.nan_iterations += it.nan_iterations or 0
        if not it.finite and len(self.non_finite) < MAX_NON_FINITE:
            self.non_finite.append(it.iteration)


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
    # lines (prefixes stripped) for a caller that did not scan them while parsing: iteration /
    # Step Time / memory lines and tracebacks are blanked ("" keeps the numbering), at most
    # MAX_KEPT_LINES of them, each cut to MAX_KEPT_LINE characters
    lines: list = field(default_factory=list)
    line_count: int = 0
    replaced_bytes: int = 0
    truncated: bool = False          # last line had no newline
    encoding: str = "utf-8"
    dropped: dict = field(default_factory=dict)     # what a bound left out: {kind: count}
    early: _Dropped = field(default_factory=_Dropped)
    scan: object = None              # the line watcher the parse fed (logs/diagnose.LineScan)

    # ---- derived
    @property
    def target_iterations(self) -> Optional[int]:
        totals = [it.total for it in self.iterations]
        if self.early.max_total is not None:
            totals.append(self.early.max_total)
        return max(totals) if totals else None

    @property
    def last_iteration(self) -> int:
        return max(max((it.iteration for it in self.iterations), default=0), self.early.max_iteration)

    @property
    def optimizer_initialised(self) -> bool:
        """A memory report after K >= 2 iterations or an iteration >= 2 line: the first
        optimizer step (which creates the optimizer state) has completed
        (train_utils.py:1151-1154: "memory after the second iteration ... include optimizer state")."""
        return (self.early.reached_two or any(m.after >= 2 for m in self.memory)
                or any(it.iteration >= 2 for it in self.iterations))

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
        return self.early.skipped + sum(it.skipped or 0 for it in self.iterations)

    @property
    def nan_iterations(self) -> int:
        return self.early.nan_iterations + sum(it.nan_iterations or 0 for it in self.iterations)

    @property
    def non_finite(self) -> list:
        kept = [it.iteration for it in self.iterations if not it.finite]
        return (self.early.non_finite + kept)[:MAX_NON_FINITE] if self.early.non_finite else kept

    def step_time_at(self) -> list:
        """Pair each Step Time line with the logged iteration it belongs to.

        Rank 0 prints it once per log interval, in the same `training_log` call as
        the iteration line (train_utils.py:1036-1051 before :1088), so the k-th
        Step Time line belongs to the k-th logged iteration. Extra lines (a cut
        log) get no iteration. When the earliest lines were not kept (past
        MAX_ITERATIONS), the pairs are counted from the end instead: the last Step Time
        line belongs to the last logged iteration.
        """
        its = sorted({it.iteration for it in self.iterations})
        if self.early.count or self.dropped.get("step times"):
            shift = len(its) - len(self.step_times)
            return [(its[i + shift] if 0 <= i + shift < len(its) else None, st)
                    for i, st in enumerate(self.step_times)]
        return [(its[i] if i < len(its) else None, st) for i, st in enumerate(self.step_times)]

    def bounds_note(self) -> Optional[str]:
        """One sentence on what the bounds left out of this run, or None."""
        parts = [f"{n} {kind}" for kind, n in self.dropped.items() if n]
        if not parts:
            return None
        return ("the log is larger than what one run keeps: " + ", ".join(parts)
                + " were not kept (counted and scanned, not stored)")


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
    dropped_frames: int = 0

    def add_frame(self, frame: Frame) -> None:
        """Keep the outermost 30 and the innermost MAX_FRAMES - 30 frames of a traceback."""
        self.frames.append(frame)
        if len(self.frames) > MAX_FRAMES:
            del self.frames[30]
            self.dropped_frames += 1


_CARETS = re.compile(r"^\s*[\^~]+\s*$")      # Python 3.11+ error-location markers


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


def normalize(text: str) -> str:
    """Line ends as "\\n" (CRLF and a lone CR both end a line), ANSI escape sequences removed."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x1b" in text or "\x9b" in text:
        text = _ANSI.sub("", text)
    return text


class LogText:
    """The lines of a log read from a binary stream CHUNK bytes at a time, never all at once.

    The encoding is told from the first bytes (`detect_encoding`); undecodable bytes become
    U+FFFD and are counted (`replaced`); CRLF and a lone CR end a line, ANSI sequences are
    removed (`normalize`); a line longer than MAX_LINE_CHARS is cut there and the rest of it
    skipped (`cut`). `truncated`: the last line had no newline. At most `limit` bytes are read;
    one more is bad input naming `field`.
    """

    def __init__(self, stream, field: str, limit: int):
        self.stream, self.field, self.limit = stream, field, limit
        self.replaced = 0
        self.truncated = False
        self.cut = 0
        self.encoding = "utf-8"
        self.bytes_read = 0
        self.any_text = False      # a line with more than whitespace was read

    def _count(self, exc: UnicodeDecodeError):
        self.replaced += 1
        return "\ufffd", exc.end

    def __iter__(self):
        import codecs

        first = self._read()
        self.encoding = detect_encoding(first)
        bom = next((b for b, name in _BOMS if name == self.encoding and first.startswith(b)), b"")
        handler = f"mbridge-recompute-count-{id(self)}"
        codecs.register_error(handler, self._count)
        decoder = codecs.getincrementaldecoder(self.encoding)(errors=handler)
        pending = ""
        skipping = False           # inside the rest of a line that was cut
        data, final = first[len(bom):], not first
        while True:
            text = decoder.decode(data, final=final)
            if text:
                if not final and text.endswith("\r"):
                    text, hold = text[:-1], "\r"     # a CRLF split across two pieces
                else:
                    hold = ""
                pending += text
                if "\r" in pending:
                    pending = pending.replace("\r\n", "\n").replace("\r", "\n")
                rows = pending.split("\n")
                pending = rows.pop() + hold
                for row in rows:
                    if skipping:
                        skipping = False
                        continue
                    if not self.any_text and row.strip():
                        self.any_text = True
                    yield _strip_ansi(row)
                if len(pending) > MAX_LINE_CHARS:
                    if not skipping:
                        self.cut += 1
                        self.any_text = True
                        yield _strip_ansi(pending[:MAX_LINE_CHARS])
                    skipping, pending = True, ""
            if final:
                break
            data = self._read()
            final = not data
        if pending and not skipping:
            self.truncated = True
            self.any_text = self.any_text or bool(pending.strip())
            yield _strip_ansi(pending)
        elif skipping:
            self.truncated = True

    def _read(self) -> bytes:
        data = self.stream.read(CHUNK)
        self.bytes_read += len(data)
        if self.bytes_read > self.limit:
            raise InputError(self.field, f"grew past the {self.limit // MIB} MiB read of a log")
        return data


def _strip_ansi(line: str) -> str:
    return _ANSI.sub("", line) if ("\x1b" in line or "\x9b" in line) else line


class _Parser:
    """One run's records from its lines, fed one at a time (see the module docstring)."""

    def __init__(self, name: str, path: str, watch=None):
        self.run = RunLog(name=name, path=path, scan=watch)
        self.watch = watch
        self.streams: dict = {}
        self.last_logged = 0
        self.seen_oom: dict = {}
        self.no = 0
        self.iterations: deque = deque(maxlen=MAX_ITERATIONS)
        self.step_times: deque = deque(maxlen=MAX_STEP_TIMES)

    def _drop(self, kind: str) -> None:
        self.run.dropped[kind] = self.run.dropped.get(kind, 0) + 1

    def _keep(self, line: str) -> None:
        """Hand a line that may hold an error text to the watcher, or keep it (bounded)."""
        if self.watch is not None:
            self.watch(self.no, line)
        elif len(self.run.lines) < MAX_KEPT_LINES:
            self.run.lines.append(line[:MAX_KEPT_LINE])
        else:
            self._drop("lines")

    def _blank(self) -> None:
        if self.watch is None and len(self.run.lines) < MAX_KEPT_LINES:
            self.run.lines.append("")

    def feed(self, raw: str) -> None:
        self.no += 1
        no, run = self.no, self.run
        stream, rank, line = split_prefix(raw)
        st = self.streams.get(stream)
        if st is None:
            st = self.streams[stream] = _Stream()
        # tracebacks (per stream, so interleaved ranks do not mix frames); their headers, frames
        # and the source they show are not scanned: no error message lives there (a
        # `raise X("...")` source line is code), and a traceback is mostly such lines
        if line.startswith("Traceback") and TB_START.match(line):
            st.frames, st.dropped_frames = [], 0
            self._blank()
            return
        if st.frames is not None:
            fm = TB_FRAME.match(line) if line.lstrip().startswith("File ") else None
            if fm:
                st.add_frame(Frame(fm.group(1)[:MAX_KEPT_LINE], int(fm.group(2)), fm.group(3)[:200]))
                st.after_frame = True
                self._blank()
                return
            if (st.after_frame and line.startswith("    ")) or (("^" in line or "~" in line)
                                                               and _CARETS.match(line)):
                self._blank()
                return         # source text shown in a traceback is code, not an event
            st.after_frame = False
        # cheap substring tests first: most lines of a long log are none of these, and a
        # dozen regex searches per line were most of the parse time on a large log
        oom = parse_oom(line, no) if ("out of memory" in line or "OutOfMemoryError" in line) else None
        if oom is not None:
            self._keep(line)
            oom.text = oom.text[:MAX_TEXT]
            oom.stream, oom.rank = stream, rank
            oom.frames = list(st.frames or [])
            oom.iteration = self.last_logged + 1 if self.last_logged else None
            oom.stage = oom_stage(oom.frames, self.last_logged)
            key = oom.key() if oom.parsed else ("text", oom.text[-200:])
            prev = self.seen_oom.get(key)
            if prev is None:
                if len(run.ooms) < MAX_OOMS:
                    self.seen_oom[key] = oom
                    run.ooms.append(oom)
                else:
                    self._drop("OOM events")
            elif not prev.frames and oom.frames:   # keep the copy that carries the traceback
                run.ooms[run.ooms.index(prev)] = oom
                self.seen_oom[key] = oom
            st.frames = None
            return
        em = EXC_LINE.match(line) if ("Error" in line or "Exception" in line or "Warning" in line
                                       or "Interrupt" in line) else None
        if em and (st.frames is not None or not em.group(1).endswith("Warning")):
            self._keep(line)
            if len(run.errors) < MAX_ERRORS:
                run.errors.append(ErrorEvent(em.group(1)[:200], (em.group(2) or "").strip()[:MAX_TEXT], no,
                                             stream, list(st.frames or [])))
            else:
                self._drop("exception lines")
            st.frames = None
            return
        if not ("iteration" in line or "Step Time" in line or "Theoretical memory" in line
                or "number of parameters" in line or "after training is done" in line):
            self._keep(line)
            return
        it = parse_iteration(line, no)
        if it is not None:
            if len(self.iterations) == MAX_ITERATIONS:
                run.early.add(self.iterations[0])
                self._drop("iteration lines")
            self.iterations.append(it)
            self._blank()
            self.last_logged = max(self.last_logged, it.iteration)
            return
        if (m := STEP.search(line)):
            if len(self.step_times) == MAX_STEP_TIMES:
                self._drop("step times")
            self.step_times.append(StepTime(_num(m.group(1)), _num(m.group(2)), no))
            self._blank()
            return
        mem = parse_memory(line, no)
        if mem is not None:
            if len(run.memory) < MAX_MEMORY_REPORTS:
                run.memory.append(mem)
            else:
                self._drop("memory reports")
            self._blank()
            run.format = mem.source if run.format == "unknown" else run.format
            self.last_logged = max(self.last_logged, mem.after)
            return
        self._keep(line)
        if (m := THEO.search(line)):
            weight = finite_or_none(_num(m.group(1)))
            if weight is not None and len(run.theoretical) < MAX_THEORETICAL:
                run.theoretical.append(Theoretical(weight, finite_or_none(_num(m.group(2) or "nan")),
                                                   finite_or_none(_num(m.group(3) or "nan")), no))
            return
        if (m := PARAMS.search(line)):
            run.params_billions = finite_or_none(_num(m.group(1)))
            return
        if DONE.search(line):
            run.completed = True
            return
        if (m := EXITING.search(line)):
            run.exit_iteration = int(m.group(1))

    def finish(self) -> RunLog:
        run = self.run
        run.iterations = list(self.iterations)
        run.step_times = list(self.step_times)
        run.line_count = self.no
        if run.format == "unknown" and run.iterations:
            run.format = "bridge" if run.step_times else "unknown"
        return run


def parse_lines_into(lines: Iterable[str], name: str = "log", path: str = "", watch=None) -> RunLog:
    """Parse lines (without their newlines) one at a time. Never raises on content."""
    # a long log becomes many small records that hold no reference cycles; the cyclic
    # collector rescanning them again and again cost a third of the parse time of a 1.2M-
    # traceback log, so it pauses while they are built
    import gc

    parser = _Parser(name, path, watch)
    paused = gc.isenabled()
    gc.disable()
    try:
        for line in lines:
            parser.feed(line)
    finally:
        if paused:
            gc.enable()
    return parser.finish()


def parse_text(text: str, name: str = "log", path: str = "", watch=None) -> RunLog:
    """Parse a whole log's text. Never raises on content."""
    text = normalize(text)
    truncated = bool(text) and not text.endswith("\n")
    # split on "\n" only (not str.splitlines' form feeds and Unicode separators) so line
    # numbers are the ones an editor shows
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    run = parse_lines_into(rows, name, path, watch)
    run.truncated = truncated
    return run


def parse_stream(stream, field: str, name: str = "log", path: str = "", watch=None,
                 then: Iterable[str] = ()) -> RunLog:
    """Parse a log from an open binary stream, CHUNK bytes at a time, then the lines `then` (a
    message pasted beside the log); InputError when there is no text at all."""
    import itertools

    from mbridge_recompute.limits import LOG_LIMIT

    reader = LogText(stream, field, LOG_LIMIT)
    then = list(then)
    run = parse_lines_into(itertools.chain(reader, then), name, path, watch)
    run.replaced_bytes, run.truncated, run.encoding = reader.replaced, reader.truncated, reader.encoding
    if then:
        run.truncated = False
    if reader.cut:
        run.dropped[f"lines longer than {MAX_LINE_CHARS} characters (cut there)"] = reader.cut
    if not reader.any_text and not any(t.strip() for t in then):
        raise InputError(field, "is empty")
    return run


def parse_path(path, field: str, name: str, watch=None, then: Iterable[str] = ()) -> RunLog:
    """Parse the log file at `path` (a regular file, at most limits.LIMITS["log"] bytes)."""
    from mbridge_recompute import files

    fh, _ = files.open_regular(path, field, "log")
    with fh:
        try:
            return parse_stream(fh, field, name, str(path), watch, then)
        except OSError as exc:
            raise InputError(field, f"cannot read: {exc.strerror or exc}") from None


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


def check_manifest(data, where: str) -> dict:
    """A run manifest's data, its fields of the types the tools read; InputError naming `where`."""
    if not isinstance(data, dict):
        raise InputError(where, "must be a JSON object")
    _check_types(data, _MANIFEST_TYPES, where)
    for key in ("argv", "recompute_tokens"):
        if key in data and not all(isinstance(t, str) for t in data[key]):
            raise InputError(f"{where}: {key}", "must be a list of text tokens")
    for key in ("env", "revisions", "git"):
        if key in data and not all(isinstance(v, (str, type(None))) for v in data[key].values()):
            raise InputError(f"{where}: {key}", "must map names to text")
    if isinstance(data.get("setting"), dict):
        _check_types(data["setting"], _SETTING_TYPES, f"{where}: setting")
        for key in ("recompute_modules", "modules"):
            mods = data["setting"].get(key)
            if isinstance(mods, list) and not all(isinstance(m, str) for m in mods):
                raise InputError(f"{where}: setting.{key}", "must be a list of labels (text)")
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


def parse_lines(lines: Iterable[str], name: str = "log") -> RunLog:
    return parse_text("\n".join(lines) + "\n", name=name)
