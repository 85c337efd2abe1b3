"""Megatron Bridge releases, as the harness and the test runner need them; the facts are the
card's (`bridge_releases:`, `bridge_tests:`), this module turns them into types.

Bridge's performance harness (`scripts/performance/`) comes in two generations, told apart by
the rank entry each release names: `run_script.py` (the 0.5 releases; `-sl` sets only the
dataset's length, `-d` writes the config without validating it) and `bootstrap.py` (0.6 and
main: it installs the recipe's environment and execs the rank script). Releases of one
generation differ in the recompute tests they hold, not in the harness.

At every release Hydra overrides are applied before the argparse flags on the flat path, so a
`-rl N` (full/block/N) can never be undone by `model.recompute_*=null` in the same run: the fix
for `-rl` beside `--recompute_modules` is to drop `-rl` (Hydra nulls only undo a full recompute
the *recipe* carries).

`detect` reads the checkout without importing or writing anything in it: the version in
`src/megatron/bridge/package_info.py` (as text), which alone is misleading (the v0.6.0 tag says
0.6.1, main says 0.7.0), checked against the layout: `bootstrap.py`, the old
`scripts/performance/configs/`, the `--task` choices of each generation.

The harness flags of each release (spellings, arity, choices, lines) are data in
`data/bridge_harness_flags.json` (facts/bridge_flags.py); inputs/harness_argv.py reads a harness
argv against them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from mbridge_recompute.errors import InputError

PERF = "scripts/performance"
BOOTSTRAP = f"{PERF}/bootstrap.py"
RUN_SCRIPT = f"{PERF}/run_script.py"
RUN_RECIPE = f"{PERF}/run_recipe.py"
SETUP_EXPERIMENT = f"{PERF}/setup_experiment.py"
ARGUMENT_PARSER = f"{PERF}/argument_parser.py"
PACKAGE_INFO = "src/megatron/bridge/package_info.py"
_CORE_NEEDS = "torch + megatron-core (tests/unit_tests/conftest.py imports both); CPU"


@dataclass(frozen=True)
class Suite:
    """A named selection of recompute tests (runs/testrunner.py runs it)."""
    name: str
    paths: tuple              # files or node ids, relative to the checkout root
    keyword: Optional[str]    # a -k expression, or None
    needs: str                # what the environment must provide, for the reader
    why: str = ""             # why it is this selection at this release


@dataclass(frozen=True)
class Release:
    """What one Bridge release's harness and tests are, for the tools (card `bridge_releases:`)."""
    key: str
    local_entry: str                   # what torchrun starts on each rank (flat path)
    local_entry_recipes: str           # ... with --use_recipes
    seq_length_sets_model: bool        # -sl sets model.seq_length (else only the dataset's)
    seq_length_why: str
    dryrun_validates: bool             # -d builds and validates the config (runtime_config_update)
    dryrun_why: str
    task_choices: tuple
    local_env_note: str                # what a local torchrun launch lacks, if anything
    package_info: str = ""             # MAJOR.MINOR that package_info.py says at this release
    suites: dict = field(default_factory=dict)


def _card() -> dict:
    from mbridge_recompute.facts import card

    return card.load()


def _suites(entry: dict) -> dict:
    tests = _card()["bridge_tests"]
    return {
        "core": Suite("core", tuple(tests[t] for t in entry["core_tests"]), None, _CORE_NEEDS,
                      entry["core_why"]),
        # argparse > Hydra > recipe for recompute: TestRecipeDefault, TestRecomputePrecedence A-E,
        # TestFullChainSanity (test_override_precedence.py, added with the precedence fix, #3518)
        "precedence": Suite("precedence", (tests["override_precedence"],), "recompute or FullChain",
                            "nemo_run (the test imports the harness's argument_parser) and the "
                            "DeepSeek-V3 HF config reachable or cached"),
        # full recompute forward/backward through a TE layer spec (test_checkpointed_forward)
        "gpu": Suite("gpu", (tests["qwen3_vl_transformer_block"],), "checkpointed",
                     "Transformer Engine; a GPU preferred"),
    }


@lru_cache(maxsize=1)
def releases() -> dict:
    """{key: Release} for every Bridge release the card covers, oldest first."""
    out = {}
    for key, e in _card()["bridge_releases"].items():
        out[key] = Release(
            key=key, local_entry=e["local_entry"], local_entry_recipes=e["local_entry_recipes"],
            seq_length_sets_model=e["seq_length_sets_model"], seq_length_why=e["seq_length_why"],
            dryrun_validates=e["dryrun_validates"], dryrun_why=e["dryrun_why"],
            task_choices=tuple(e["task_choices"]), local_env_note=e["local_env_note"],
            package_info=str(e["package_info"]), suites=_suites(e))
    return out


def keys() -> tuple:
    """The Bridge release keys, oldest first (the last is the newest, main)."""
    return tuple(releases())


def release(key: str) -> Release:
    return releases()[key]


def newest() -> Release:
    return releases()[keys()[-1]]


def _read_at(key: str) -> str:
    return str(_card()["bridge_releases"][key]["read_at"])


# ---------------------------------------------------------------- detection
@dataclass
class Detection:
    key: Optional[str]                 # a card bridge_releases key; None when nothing says which
    how: str                           # one sentence: what was read and what it showed
    version: Optional[str] = None      # package_info.py's MAJOR.MINOR.PATCH, as text
    layout: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    supported: bool = True             # False: older than any release the facts cover

    @property
    def release(self) -> Optional[Release]:
        return releases().get(self.key) if self.key else None

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
           "test_override_precedence.py": (repo / _card()["bridge_tests"]["override_precedence"]).is_file(),
           "task_choices": None}
    text = _read_small(repo / ARGUMENT_PARSER)
    m = _TASK.search(text) if text else None
    if m:
        out["task_choices"] = re.findall(r"""["'](\w+)["']""", m.group(1))
    return out


def _minor(v: Optional[str]) -> Optional[tuple]:
    return tuple(int(x) for x in v.split(".")[:2]) if v else None


def key_of_version(version: Optional[str]) -> Optional[str]:
    """The release a package_info.py version names: the key whose `package_info` has its
    MAJOR.MINOR; a version at or past the newest key's (main's development number) is that
    key; None for a version older than every key (or none)."""
    vt = _minor(version)
    if vt is None:
        return None
    for r in releases().values():
        if _minor(r.package_info) == vt:
            return r.key
    if vt > _minor(newest().package_info):
        return newest().key
    return None


def _generation(key: Optional[str]) -> Optional[str]:
    """'run_script' or 'bootstrap': the harness generation of a release."""
    return None if key is None else ("bootstrap" if release(key).local_entry == BOOTSTRAP else "run_script")


def detect(repo: Optional[Path], forced: Optional[str] = None) -> Detection:
    """Which Bridge release a checkout is, and how that was decided (never imports it)."""
    oldest, newest_key = keys()[0], keys()[-1]
    if repo is None:
        if forced:
            return Detection(forced, f"given with --bridge-release {forced} (no checkout to read)")
        older = [k for k in keys() if k != newest_key]
        return Detection(newest_key, f"no checkout given: the facts of {newest_key} "
                                     f"({_read_at(newest_key)}) are assumed; pass --bridge-release "
                                     f"{' or '.join(older)} for an older release")
    version = package_version(repo)
    lay = layout(repo)
    by_version = key_of_version(version)
    tasks = lay["task_choices"] or []
    # the generations are told apart by their layout: bootstrap.py and the --task choices
    boot_tasks = set(release(newest_key).task_choices) - set(release(oldest).task_choices)
    flat_tasks = set(release(oldest).task_choices) - set(release(newest_key).task_choices)
    new_harness = lay["bootstrap.py"] or bool(boot_tasks & set(tasks))
    old_harness = (not lay["bootstrap.py"]) and (lay["configs/"] or bool(flat_tasks & set(tasks)))
    said = f"package_info.py says {version}" if version else "no readable package_info.py"
    first_boot = next(k for k in keys() if _generation(k) == "bootstrap")
    notes: list = []
    if new_harness:
        gen = "bootstrap.py present" if lay["bootstrap.py"] else \
            f"--task choices hold {', '.join(sorted(boot_tasks & set(tasks)))}"
        key = by_version if _generation(by_version) == "bootstrap" else first_boot
        how = f"{said}; {gen} (the {first_boot} harness)"
        if version is None:
            how += f"; without a version the {first_boot} facts are used ({newest_key} shares its harness)"
        elif _generation(by_version) != "bootstrap":
            notes.append(f"package_info.py says {version} but the layout is the {first_boot} harness; "
                         "the layout wins")
    elif old_harness:
        gen = "no bootstrap.py, scripts/performance/configs/ present" if lay["configs/"] else \
            f"no bootstrap.py, --task choices hold {', '.join(sorted(flat_tasks & set(tasks)))}"
        key, how = oldest, f"{said}; {gen} (the {oldest} harness)"
        if version is not None and _generation(by_version) == "bootstrap":
            notes.append(f"package_info.py says {version} but the layout is the {oldest} harness; "
                         "the layout wins")
    elif version is not None:
        key = by_version or oldest
        how = f"{said}; the harness layout could not be read (scripts/performance incomplete)"
    else:
        key, how = None, "neither package_info.py nor the harness layout says which release this is"
    det = Detection(key, how, version, lay, notes)
    if key == oldest and ((version is not None and by_version is None)
                          or not lay["test_override_precedence.py"]):
        # before the precedence fix (#3518) a run without a recompute flag lost its Hydra recompute
        # settings, so a Hydra-only control would silently not be the control
        det.supported = False
        first_tag = _card()["bridge_releases"][oldest]["tags"][0]
        det.notes.append(f"older than {first_tag} (no tests/unit_tests/recipes/test_override_precedence.py): "
                         "its harness may wipe Hydra recompute overrides, which the sweep's control relies "
                         "on; --launch refuses it unless --bridge-release is given")
    if forced:
        if forced != det.key:
            det.notes.append(f"--bridge-release {forced} given; the checkout reads as {det.key or 'unknown'} "
                             f"({how})")
        det.key, det.how, det.supported = forced, f"given with --bridge-release {forced}", True
    return det
