"""Megatron Bridge releases, as the harness and the test runner need them: facts as data.

Bridge's performance harness (`scripts/performance/`) comes in two generations, and the
recompute tests differ per release:

* **0.5** (v0.5.0, v0.5.1; their harness files are byte-identical): no `bootstrap.py`; the rank
  script is `run_script.py` (flat perf recipes) or `run_recipe.py` (`--use_recipes`), which
  `setup_experiment.py` also picks itself (`setup_experiment.py:63-64,510-540 @ v0.5.1`);
  `-sl` sets only the dataset's length, so the `model.seq_length == dataset.seq_length` check
  fails whenever it differs from the recipe; `-d` writes the config without validating it.
* **0.6** (v0.6.0; the 0.6.2 wheel ships no `scripts/`, so its harness is v0.6.0's) and
  **main** (067f987): `bootstrap.py` installs the recipe's environment and execs the rank
  script (`bootstrap.py:29-69 @ v0.6.0`); `-sl` sets `model.seq_length`; `-d` validates.
  The two differ in the recompute tests they hold, not in the harness.

At every release Hydra overrides are applied before the argparse flags on the flat path, so a
`-rl N` (full/block/N) can never be undone by `model.recompute_*=null` in the same run: the fix
for `-rl` beside `--recompute_modules` is to drop `-rl` (Hydra nulls only undo a full recompute
the *recipe* carries).

`detect` reads the checkout without importing or writing anything in it: the version in
`src/megatron/bridge/package_info.py` (as text), which alone is misleading (the v0.6.0 tag says
0.6.1, main says 0.7.0), checked against the layout: `bootstrap.py` (>= 0.6), the 0.5
`scripts/performance/configs/`, the `--task` choices (`lora` at 0.5, `peft` from 0.6).

The harness flags of each release (spellings, arity, choices, lines) are data in
`data/bridge_harness_flags.json`; `check_passthrough` judges a harness argv against them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from mbridge_recompute import DATA_DIR
from mbridge_recompute.errors import InputError

PERF = "scripts/performance"
BOOTSTRAP = f"{PERF}/bootstrap.py"
RUN_SCRIPT = f"{PERF}/run_script.py"
RUN_RECIPE = f"{PERF}/run_recipe.py"
SETUP_EXPERIMENT = f"{PERF}/setup_experiment.py"
ARGUMENT_PARSER = f"{PERF}/argument_parser.py"
PACKAGE_INFO = "src/megatron/bridge/package_info.py"
KEYS = ("0.5", "0.6", "main")

_UT = "tests/unit_tests"
_COMM = (f"{_UT}/training/test_comm_overlap.py::TestMegatronCommOverlapConfig::"
         "test_moe_ep_overlap_rejects_moe_in_recompute_modules")
_THEORY = f"{_UT}/training/utils/test_theoretical_memory_utils.py"
_PEFT = f"{_UT}/peft/test_recompute.py"
_R050 = f"{_UT}/recipes/test_r050_perf_recipe_ports.py"
_QWEN = (f"{_UT}/scripts/performance/test_qwen35_vl_workload_base_configs.py::"
         "test_qwen35_vl_35b_h100_measured_performance_defaults")
_PRECEDENCE = f"{_UT}/recipes/test_override_precedence.py"
_QWEN3_BLOCK = f"{_UT}/models/qwen_vl/modelling_qwen3_vl/test_transformer_block.py"
_CORE_NEEDS = "torch + megatron-core (tests/unit_tests/conftest.py imports both); CPU"


@dataclass(frozen=True)
class Suite:
    """A named selection of recompute tests (runs/testrunner.py runs it)."""
    name: str
    paths: tuple              # files or node ids, relative to the checkout root
    keyword: Optional[str]    # a -k expression, or None
    needs: str                # what the environment must provide, for the reader
    why: str = ""             # why it is this selection at this release


def _bridge_suites(core: tuple, core_why: str) -> dict:
    return {
        "core": Suite("core", core, None, _CORE_NEEDS, core_why),
        # argparse > Hydra > recipe for recompute: TestRecipeDefault, TestRecomputePrecedence A-E,
        # TestFullChainSanity (test_override_precedence.py, added with the precedence fix, #3518)
        "precedence": Suite("precedence", (_PRECEDENCE,), "recompute or FullChain",
                            "nemo_run (the test imports the harness's argument_parser) and the "
                            "DeepSeek-V3 HF config reachable or cached"),
        # full recompute forward/backward through a TE layer spec (test_checkpointed_forward)
        "gpu": Suite("gpu", (_QWEN3_BLOCK,), "checkpointed", "Transformer Engine; a GPU preferred"),
    }


@dataclass(frozen=True)
class Release:
    """What one Bridge release's harness and tests are, for the tools."""
    key: str
    local_entry: str                   # what torchrun starts on each rank (flat path)
    local_entry_recipes: str           # ... with --use_recipes
    seq_length_sets_model: bool        # -sl sets model.seq_length (else only the dataset's)
    seq_length_why: str
    dryrun_validates: bool             # -d builds and validates the config (runtime_config_update)
    dryrun_why: str
    task_choices: tuple
    local_env_note: str                # what a local torchrun launch lacks, if anything
    suites: dict = field(default_factory=dict)


def _bootstrap_release(key: str, tag: str, suites: dict) -> "Release":
    """A release whose harness starts through bootstrap.py, which installs the recipe's environment
    and execs run_script.py or run_recipe.py (bootstrap.py:29-69 @ `tag`); its facts read at `tag`."""
    return Release(
        key=key,
        local_entry=BOOTSTRAP, local_entry_recipes=BOOTSTRAP,
        seq_length_sets_model=True,
        seq_length_why=f"-sl sets model.seq_length (overrides.py:514-515 @ {tag})",
        dryrun_validates=True,
        dryrun_why=("-d runs runtime_config_update before writing the config "
                    f"(run_script.py:153-164 @ {tag})"),
        task_choices=("pretrain", "sft", "peft"), local_env_note="", suites=suites)


# Facts read at v0.5.1 (0.5), v0.6.0 (0.6: the 0.6.2 wheel's library, whose harness is v0.6.0's)
# and 067f987 (main). On every release the harness applies its argparse flags after the Hydra
# overrides (run_script.py:76-79, overrides.py:174-177 @ 067f987; :86-87, :150-153 @ v0.5.1).
RELEASES = {
    "0.5": Release(
        key="0.5",
        local_entry=RUN_SCRIPT, local_entry_recipes=RUN_RECIPE,
        seq_length_sets_model=False,
        seq_length_why=("-sl sets only the mock/squad dataset length at 0.5 (overrides.py:382,417,431 @ "
                        "v0.5.1), and training asserts model.seq_length == dataset.seq_length "
                        "(src/megatron/bridge/training/config.py:1376 @ v0.5.1): the sweep also pins "
                        "model.seq_length through Hydra"),
        dryrun_validates=False,
        dryrun_why=("-d at 0.5 writes the config before runtime_config_update, so nothing is validated "
                    "(run_script.py:105-111 @ v0.5.1): a -d run that succeeds proves nothing about "
                    "recompute"),
        task_choices=("pretrain", "sft", "lora"),
        local_env_note=("at 0.5 the perf environment variables (CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*, ...) "
                        "are set by setup_experiment.py's PerfEnvPlugin on Slurm only "
                        "(perf_plugins.py:203-590 @ v0.5.1): a local torchrun run lacks them unless "
                        "exported (--env)"),
        suites=_bridge_suites(
            (_THEORY, _PEFT),
            "the comm-overlap recompute test was added after 0.5 (890cee39b) and "
            "test_r050_perf_recipe_ports.py / the Qwen3.5-VL test do not exist at 0.5"),
    ),
    "0.6": _bootstrap_release(
        "0.6", "v0.6.0",
        _bridge_suites((_COMM, _THEORY, _PEFT, _R050),
                       "the Qwen3.5-VL workload test exists at v0.6.0 but asserts nothing about "
                       "recompute (its recompute assertions came later, a7f4ad56b)")),
    "main": _bootstrap_release(
        "main", "067f987",
        _bridge_suites((_COMM, _THEORY, _PEFT, _R050, _QWEN), "every recompute test of the release")),
}


# ---------------------------------------------------------------- detection
@dataclass
class Detection:
    key: Optional[str]                 # a RELEASES key, or None when nothing says which
    how: str                           # one sentence: what was read and what it showed
    version: Optional[str] = None      # package_info.py's MAJOR.MINOR.PATCH, as text
    layout: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    supported: bool = True             # False: older than any release the facts cover

    @property
    def release(self) -> Optional[Release]:
        return RELEASES.get(self.key) if self.key else None

    def to_dict(self) -> dict:
        return {"key": self.key, "how": self.how, "package_info": self.version, "layout": self.layout,
                "supported": self.supported, "notes": list(self.notes)}


_VERSION_PART = re.compile(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d{1,4})\s*$", re.M)
_TASK = re.compile(r"""["']--task["'][^)]*?choices\s*=\s*\[([^\]]*)\]""", re.S)


def _read_small(path: Path) -> Optional[str]:
    """A small text file of the checkout, or None (read only: nothing is imported or written)."""
    from mbridge_recompute import files

    if not path.is_file():
        return None
    try:
        return files.read_bytes(path, str(path), "checkout source").decode("utf-8", errors="replace")
    except InputError:
        return None


def package_version(repo: Path) -> Optional[str]:
    text = _read_small(repo / PACKAGE_INFO)
    if text is None:
        return None
    parts = dict(_VERSION_PART.findall(text))
    if not {"MAJOR", "MINOR", "PATCH"} <= set(parts):
        return None
    return f"{int(parts['MAJOR'])}.{int(parts['MINOR'])}.{int(parts['PATCH'])}"


def layout(repo: Path) -> dict:
    """The structural facts that tell the harness generation apart."""
    out = {"bootstrap.py": (repo / BOOTSTRAP).is_file(),
           "run_script.py": (repo / RUN_SCRIPT).is_file(),
           "setup_experiment.py": (repo / SETUP_EXPERIMENT).is_file(),
           "argument_parser.py": (repo / ARGUMENT_PARSER).is_file(),
           "configs/": (repo / PERF / "configs").is_dir(),
           "perf_recipes/": (repo / "src/megatron/bridge/perf_recipes").is_dir(),
           "test_override_precedence.py": (repo / _PRECEDENCE).is_file(),
           "task_choices": None}
    text = _read_small(repo / ARGUMENT_PARSER)
    m = _TASK.search(text) if text else None
    if m:
        out["task_choices"] = re.findall(r"""["'](\w+)["']""", m.group(1))
    return out


def _version_tuple(v: Optional[str]) -> Optional[tuple]:
    return tuple(int(x) for x in v.split(".")) if v else None


def detect(repo: Optional[Path], forced: Optional[str] = None) -> Detection:
    """Which Bridge release a checkout is, and how that was decided (never imports it)."""
    if repo is None:
        if forced:
            return Detection(forced, f"given with --bridge-release {forced} (no checkout to read)")
        return Detection("main", "no checkout given: the facts of main (067f987) are assumed; "
                                 "pass --bridge-release 0.5 or 0.6 for an older release")
    version = package_version(repo)
    lay = layout(repo)
    vt = _version_tuple(version)
    tasks = lay["task_choices"] or []
    new_harness = lay["bootstrap.py"] or "peft" in tasks
    old_harness = (not lay["bootstrap.py"]) and (lay["configs/"] or "lora" in tasks)
    said = f"package_info.py says {version}" if version else "no readable package_info.py"
    notes: list = []
    if new_harness:
        gen = "bootstrap.py present" if lay["bootstrap.py"] else "--task choices hold peft"
        key = "main" if vt is not None and vt >= (0, 7, 0) else "0.6"
        how = f"{said}; {gen} (the 0.6 harness)"
        if vt is None:
            how += "; without a version the 0.6 facts are used (main shares its harness)"
        elif vt < (0, 6, 0):
            notes.append(f"package_info.py says {version} but the layout is the 0.6 harness; the layout wins")
            key = "0.6"
    elif old_harness:
        gen = "no bootstrap.py, scripts/performance/configs/ present" if lay["configs/"] else \
            "no bootstrap.py, --task choices hold lora"
        key, how = "0.5", f"{said}; {gen} (the 0.5 harness)"
        if vt is not None and vt >= (0, 6, 0):
            notes.append(f"package_info.py says {version} but the layout is the 0.5 harness; the layout wins")
    elif vt is not None:
        key = "0.5" if vt < (0, 6, 0) else "main" if vt >= (0, 7, 0) else "0.6"
        how = f"{said}; the harness layout could not be read (scripts/performance incomplete)"
    else:
        key, how = None, "neither package_info.py nor the harness layout says which release this is"
    det = Detection(key, how, version, lay, notes)
    if key == "0.5" and ((vt is not None and vt < (0, 5, 0)) or not lay["test_override_precedence.py"]):
        # before the precedence fix (#3518) a run without a recompute flag lost its Hydra recompute
        # settings, so a Hydra-only control would silently not be the control
        det.supported = False
        det.notes.append("older than v0.5.0 (no tests/unit_tests/recipes/test_override_precedence.py): "
                         "its harness may wipe Hydra recompute overrides, which the sweep's control relies "
                         "on; --launch refuses it unless --bridge-release is given")
    if forced:
        if forced != det.key:
            det.notes.append(f"--bridge-release {forced} given; the checkout reads as {det.key or 'unknown'} "
                             f"({how})")
        det.key, det.how, det.supported = forced, f"given with --bridge-release {forced}", True
    return det


# ---------------------------------------------------------------- flags
@lru_cache(maxsize=1)
def _flag_data() -> dict:
    path = DATA_DIR / "bridge_harness_flags.json"
    return json.loads(path.read_text(encoding="utf-8"))["releases"]


def flags(key: str) -> list:
    """The flags of `key`'s harness parser: [{"flags", "value", "line", "choices"?, ...}]."""
    return _flag_data()[key]["flags"]


def check_passthrough(tokens: list, key: str) -> list:
    """Problems a release's harness parser (or Hydra, which gets what the parser leaves) would hit
    with `tokens`, before any GPU time: runs/harness_argv.py reads them as the rank does."""
    from mbridge_recompute.runs.harness_argv import HarnessArgv

    return HarnessArgv.parse(tokens, key).problems
