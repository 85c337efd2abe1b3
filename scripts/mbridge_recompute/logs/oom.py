"""PyTorch CUDA out-of-memory events: the numbers in the message and the stage it hit.

The message is c10/cuda/CUDACachingAllocator.cpp's (torch >= 2.1 wording, checked
against real output of torch 2.11; the older "(GPU 0; X total capacity; ...)" form is
read too). Sizes come as `format_size` prints them (bytes, KiB, MiB, GiB) and are kept
in bytes.

OOM stage heuristic:
the traceback that ends in the OOM line, read from that rank's stream, decides:
  1. a backward frame (`backward`, `_engine_run_backward`, `backward_step`,
     `custom_backward`) -> "backward" (a recompute replay runs inside backward);
  2. an optimizer frame (a file under `optimizer/` or `torch/optim/`, or
     `_init_group`/`step`), inside model/optimizer construction -> "setup",
     else before any logged iteration -> "optimizer-state-init" (Adam states are
     created lazily in the first step), else "optimizer-step";
  3. a forward frame (`forward_step`, `forward`) -> "first-forward" when no
     iteration was logged before the OOM, else "forward";
  4. a construction frame (`setup_model_and_optimizer`, `get_model`,
     `get_megatron_optimizer`, DDP buffer allocation) -> "setup";
  5. no traceback: "unknown" (the iteration number still says when).
The iteration in progress is the last iteration number logged (iteration line
or memory report) before the OOM, plus one; with `log_interval > 1` it is a
lower bound. With nothing logged before the OOM it is None: the text does not
say (a pasted message, or a run resumed from a checkpoint, starts at no known
iteration), and no report invents one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from mbridge_recompute.units import GIB, KIB, MIB, TIB

_SIZE = r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)"
# (a source line such as `except torch.OutOfMemoryError:` in a traceback is not an OOM)
OOM_MARK = re.compile(r"CUDA out of memory|CUDA error: out of memory"
                      r"|^\s*(?:[\w.]+\.)?OutOfMemoryError(?::|$)")
OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE)
OOM_CAP = re.compile(r"GPU (\d{1,6}) has a total capac\w* of " + _SIZE + r" of which " + _SIZE + r" is free")
OOM_INUSE = re.compile(r"this process has " + _SIZE + r" memory in use")
OOM_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
OOM_ALLOWED = re.compile(_SIZE + r" allowed;")      # set_per_process_memory_fraction in force
OOM_ALLOC = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and " + _SIZE
                       + r" is reserved by PyTorch but unallocated")
OOM_LEGACY = re.compile(r"\(GPU (\d{1,6}); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; "
                        + _SIZE + r" free; " + _SIZE + r" reserved in total by PyTorch\)")
_UNIT = {"bytes": 1, "B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB}


_BACKWARD_FUNCS = {"backward", "_engine_run_backward", "backward_step", "custom_backward", "run_backward"}
_OPTIM_FUNCS = {"_init_group", "step_with_ready_grads", "prepare_grads", "_init_state", "init_state_fn",
                "initialize_state"}
_FORWARD_FUNCS = {"forward_step", "forward", "_forward_step_helper", "forward_step_calc_loss"}
_SETUP_FUNCS = {"setup_model_and_optimizer", "get_model", "get_megatron_optimizer", "_allocate_buffers",
                "setup", "build_model", "_get_megatron_optimizer_based_on_param_groups"}


@dataclass
class Frame:
    file: str
    lineno: int
    func: str


@dataclass
class OOMEvent:
    text: str
    line: int
    stream: str = ""                 # launcher prefix of the rank that printed it
    rank: Optional[int] = None       # rank number from the prefix, when there is one
    gpu: Optional[int] = None        # "GPU N" from the message (a local device index)
    requested: Optional[float] = None            # bytes
    capacity: Optional[float] = None
    free: Optional[float] = None
    process_in_use: Optional[float] = None       # "this process has X memory in use"
    other_processes: float = 0.0                 # sum of "Process P has X memory in use"
    allowed: Optional[float] = None              # "X allowed;": the per-process cap, when one is set
    allocated: Optional[float] = None            # "allocated by PyTorch"
    reserved_unallocated: Optional[float] = None
    stage: str = "unknown"
    # the iteration in progress (a lower bound), or None when no iteration was logged before the
    # OOM: the text then does not say which iteration it was (a pasted message, a resumed run)
    iteration: Optional[int] = None
    frames: list = field(default_factory=list)

    def key(self) -> tuple:
        return (self.gpu, self.requested, self.capacity, self.free, self.allocated, self.reserved_unallocated)

    @property
    def limit(self) -> Optional[float]:
        """What this process may use: the device capacity, or the per-process cap when lower."""
        if self.allowed is not None and self.capacity is not None:
            return min(self.allowed, self.capacity)
        return self.capacity if self.allowed is None else self.allowed

    @property
    def parsed(self) -> bool:
        return self.requested is not None and self.capacity is not None

    def as_dict(self) -> dict:
        def g(x):
            return None if x is None else round(x / GIB, 3)
        return {"line": self.line, "rank": self.rank, "gpu": self.gpu, "stage": self.stage,
                "iteration": self.iteration, "requested_gib": g(self.requested),
                "capacity_gib": g(self.capacity), "allowed_gib": g(self.allowed), "free_gib": g(self.free),
                "process_in_use_gib": g(self.process_in_use),
                "other_processes_gib": g(self.other_processes) if self.other_processes else 0.0,
                "allocated_gib": g(self.allocated), "reserved_unallocated_gib": g(self.reserved_unallocated),
                "frames": [f"{f.file}:{f.lineno} in {f.func}" for f in self.frames[-6:]]}


def parse_oom(text: str, line: int = 0) -> Optional[OOMEvent]:
    """The numbers of one PyTorch OOM message; None when the line is not one."""
    if not OOM_MARK.search(text):
        return None
    ev = OOMEvent(text=text.strip(), line=line)
    if (m := OOM_TRIED.search(text)):
        ev.requested = _size(*m.groups())
    if (m := OOM_CAP.search(text)):
        ev.gpu = int(m.group(1))
        ev.capacity = _size(m.group(2), m.group(3))
        ev.free = _size(m.group(4), m.group(5))
    if (m := OOM_INUSE.search(text)):
        ev.process_in_use = _size(*m.groups())
    if (m := OOM_ALLOWED.search(text)):
        ev.allowed = _size(*m.groups())
    ev.other_processes = sum(_size(v, u) or 0.0 for _, v, u in OOM_OTHER.findall(text))
    if (m := OOM_ALLOC.search(text)):
        ev.allocated = _size(m.group(1), m.group(2))
        ev.reserved_unallocated = _size(m.group(3), m.group(4))
    if (m := OOM_LEGACY.search(text)):
        ev.gpu = int(m.group(1))
        ev.capacity = _size(m.group(2), m.group(3))
        ev.allocated = _size(m.group(4), m.group(5))
        ev.free = _size(m.group(6), m.group(7))
        reserved = _size(m.group(8), m.group(9))
        ev.reserved_unallocated = None if reserved is None or ev.allocated is None \
            else max(0.0, reserved - ev.allocated)
    return ev


def oom_stage(frames: list, iterations_before: int) -> str:
    """The stage an OOM happened in, from its traceback frames (see module docstring)."""
    funcs = {f.func for f in frames}
    files = [f.file.replace("\\", "/") for f in frames]
    if funcs & _BACKWARD_FUNCS or any(f.endswith("torch/autograd/__init__.py") for f in files):
        return "backward"
    in_optimizer = bool(funcs & _OPTIM_FUNCS) or any(
        "/optimizer/" in f or "torch/optim/" in f or f.endswith("optimizer.py") for f in files)
    if in_optimizer:
        if funcs & _SETUP_FUNCS:
            return "setup"
        return "optimizer-state-init" if iterations_before == 0 else "optimizer-step"
    if funcs & _FORWARD_FUNCS:
        return "first-forward" if iterations_before == 0 else "forward"
    if funcs & _SETUP_FUNCS:
        return "setup"
    return "unknown"


def _size(value: str, unit: str) -> Optional[float]:
    try:
        x = float(value) * _UNIT[unit]
    except (ValueError, KeyError):
        return None
    return x if math.isfinite(x) else None


def finite_or_none(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None
