"""Build a matched recompute sweep for Megatron Bridge's performance harness.

One run per candidate recompute setting; everything else identical. The user's
harness arguments (after `--`) are copied unchanged into every run, and only the
recompute tokens, the run name and the config dump path differ.

Facts this module relies on (Megatron-Bridge `main` @ 067f987 unless noted):

* The rank-local entry point is `scripts/performance/bootstrap.py`; it installs
  recipe env vars and then execs `run_script.py` / `run_recipe.py`
  (`scripts/performance/bootstrap.py:29-69`). A plain `python` launch is one
  process, so a single node runs through `torchrun --nproc_per_node N` from the
  repo root with `PYTHONPATH=src`.
* Slurm goes through Bridge's own `scripts/performance/setup_experiment.py`
  (nemo_run), which forwards all training flags and Hydra overrides to
  `bootstrap.py` on every rank (`setup_experiment.py:74-119,591`). We never
  reimplement that launcher.
* `--recompute_modules` takes ONE comma-separated token (`list_of_strings`,
  `argument_parser.py:41-43`); a space-separated second label becomes an
  unknown argument and then an invalid Hydra override.
* An empty list is not expressible through argparse: `--recompute_modules ""`
  gives `['']`, which MCore rejects at `model.finalize()`
  (`transformer_config.py:1836-1840 @ core 2a75ac12`). The `[]` control goes
  through Hydra: `model.recompute_granularity=selective model.recompute_modules=[]`
  (valid: labels are only checked when the list is non-empty, `:1824-1825`).
* `-rl N` always means full/block/N (`overrides.py:174-177`); the uniform
  method is not reachable by a flag, so `uniform:N` goes through Hydra.
* `--recompute_modules` leaves a recipe's full-recompute method/num_layers in
  place (e.g. `perf_recipes/llama/h100/llama3.py:87-89`, full/block/5), which
  MCore then rejects (`transformer_config.py:1807-1813`); a selective candidate
  therefore also clears them through Hydra.
* Flat-path precedence is argparse > Hydra > recipe (`run_script.py:76-79`), so
  Hydra nulls never undo a flag given in the same run.
* With `--use_recipes` the recompute flags are ignored
  (`run_recipe.py:45-208`, `utils/utils.py:354-398`) and Hydra is applied last
  (`run_recipe.py:218-243`), so on that path every candidate is Hydra-only.
* When the exact perf recipe for the GPU count does not exist, the fallback
  weak-scales `train.global_batch_size` unless `-gb` is given
  (`overrides.py:645-707`), so GBS and sequence length are pinned per sweep.
* `-ol` (legacy CPU offload) cannot coexist with any recompute granularity
  (`transformer_config.py:1765-1780`), so it is refused in a recompute sweep.
* Without `--save_config_filepath` the rank writes to
  `/nemo_run/configs/ConfigContainer.yaml` (`overrides.py:469-472`).
* Recompute variants of one workload collide on the default experiment name,
  so each run gets a unique `-wdj` (`setup_experiment.py:122-139,595-603`); it
  only touches W&B settings when `-wdk` is also given (`overrides.py:463-467`),
  and `--use_recipes` needs it (`utils/utils.py:889`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from mbridge_recompute.errors import InputError
from mbridge_recompute.logs.runlog import CONFIG_DUMP
from mbridge_recompute.setting import RecomputeSetting

BOOTSTRAP = "scripts/performance/bootstrap.py"
SETUP_EXPERIMENT = "scripts/performance/setup_experiment.py"
ARGUMENT_PARSER = "scripts/performance/argument_parser.py"
LAUNCHERS = ("local", "slurm")

# Long options argparse would accept by prefix (allow_abbrev is on in Bridge's
# parser): any token that is a prefix of one of these, down to the stem, is the
# same option.  option -> (stem, why it conflicts)
_CONFLICTING_LONG = {
    "--recompute_modules": ("--recompute", "the sweep sets the recompute modules per candidate"),
    "--recompute_num_layers": ("--recompute", "the sweep sets full recompute per candidate"),
    "--activation_offload_layers": ("--activation_off",
                                    "legacy CPU offload cannot be combined with any recompute "
                                    "granularity (transformer_config.py:1765-1780)"),
    "--save_config_filepath": ("--save_config", "the sweep writes each run's config into its run dir"),
    "--wandb_experiment_name": ("--wandb_exp", "the sweep gives every run its own -wdj name"),
}
_CONFLICTING_SHORT = {
    "-rl": "the sweep sets full recompute per candidate",
    "-ol": "legacy CPU offload cannot be combined with any recompute granularity "
           "(transformer_config.py:1765-1780)",
    "-wdj": "the sweep gives every run its own -wdj name",
}
# Hydra override on any recompute key, in every spelling Hydra accepts (+, ++, ~).
_HYDRA_RECOMPUTE = re.compile(r"^(\+\+|\+|~)?model\.(recompute_\w*|distribute_saved_activations)\s*(=|$)")

_PINNED = {
    # flag spellings that pin a value -> what our option is called
    "gbs": (("-gb", "--global_batch_size"), "-gb"),
    "seq": (("-sl", "--seq_length"), "-sl"),
}
_NUM_GPUS = ("-ng", "--num_gpus")


@dataclass
class PlannedRun:
    """One run of the sweep: a candidate and the exact process to start."""
    name: str
    setting: RecomputeSetting
    argv: list
    env: dict                # environment overrides on top of the caller's environment
    cwd: str
    run_dir: str
    recompute_tokens: list   # the tokens that differ between runs (for the reader)

    def as_dict(self) -> dict:
        return {"name": self.name, "candidate": self.setting.describe(),
                "setting": self.setting.as_fields(), "argv": list(self.argv),
                "env": dict(self.env), "cwd": self.cwd, "run_dir": self.run_dir,
                "recompute_tokens": list(self.recompute_tokens)}


@dataclass
class Sweep:
    repo: str
    launcher: str
    passthrough: list
    runs: list = field(default_factory=list)
    notes: list = field(default_factory=list)


# --------------------------------------------------------------------------- candidates

def parse_candidates(texts: Sequence[str], where: str = "--candidates") -> list:
    """Candidate strings ('[]', 'core_attn', 'layernorm,moe_act', 'uniform:2', 'block:4', 'none')."""
    out = [RecomputeSetting.parse(t, where=where) for t in texts]
    return _unique(out, where)


def candidates_from_plan(path: str, with_control: bool = True, notes: Optional[list] = None) -> list:
    """The settings a `plan --json` report proposes.

    Its `harness_candidates` short list when present; otherwise its frontier, then
    its recommendation.

    Entries the plan marks `allowed: false` (a constraint rejects them) are left
    out, each with a line in `notes`.

    A plan entry with granularity selective and modules None means MCore's
    implicit default, which it replaces by ["core_attn"]
    (`transformer_config.py:1821-1822`); the sweep spells it out.
    """
    from mbridge_recompute.inputs.loading import read_json

    data = read_json(path, "--from-plan")
    if not isinstance(data, dict):
        raise InputError("--from-plan", f"{path}: expected the JSON object of `plan --json`")
    short = data.get("harness_candidates")
    if isinstance(short, list) and short and all(isinstance(t, str) for t in short):
        # the plan's own short list (control, recommendation, its frontier neighbours):
        # a whole frontier can hold 10-30 points, too many runs for one matched sweep
        settings = parse_candidates(short, "--from-plan")
        if with_control and RecomputeSetting.selective() not in settings:
            settings.insert(0, RecomputeSetting.selective())
        return _unique(settings, "--from-plan")
    entries = list(data.get("frontier") or [])
    if data.get("recommendation"):
        entries.append(data["recommendation"])
    if not entries:
        raise InputError("--from-plan", f"{path} has no 'frontier' entries and no 'recommendation'")
    settings = [RecomputeSetting.selective()] if with_control else []
    for i, e in enumerate(entries):
        if isinstance(e, dict) and e.get("allowed") is False:
            if notes is not None:
                notes.append(f"--from-plan: left out {e.get('name') or e.get('describe') or i}: rejected by "
                             f"{', '.join(map(str, e.get('rejected_by') or [])) or 'a constraint'}")
            continue
        settings.append(_setting_from_fields(e, f"--from-plan entry {i}"))
    # the recommendation is usually also on the frontier: keep the first occurrence
    out = []
    for s in settings:
        if s not in out:
            out.append(s)
    return _unique(out, "--from-plan")


def _setting_from_fields(e, where: str) -> RecomputeSetting:
    if not isinstance(e, dict) or "recompute_granularity" not in e:
        raise InputError(where, "expected recompute_granularity/recompute_modules/"
                                "recompute_method/recompute_num_layers")
    gran = e.get("recompute_granularity")
    if gran in (None, "none", "null"):
        return RecomputeSetting.off()
    if gran == "selective":
        mods = e.get("recompute_modules")
        if mods is None:
            mods = ["core_attn"]
        if isinstance(mods, str):
            mods = [m for m in mods.split(",") if m]
        if not isinstance(mods, list) or not all(isinstance(m, str) and m.strip() for m in mods):
            raise InputError(where, f"recompute_modules must be a list of labels, got {mods!r}")
        return RecomputeSetting.selective(*[m.strip() for m in mods])
    if gran == "full":
        method, n = e.get("recompute_method"), e.get("recompute_num_layers")
        if method not in ("uniform", "block") or not isinstance(n, int) or n < 1:
            raise InputError(where, f"full recompute needs method uniform/block and num_layers >= 1, "
                                    f"got {method!r}/{n!r}")
        return RecomputeSetting.full(method, n)
    raise InputError(where, f"unknown recompute_granularity {gran!r}")


def _known_labels() -> set:
    # the checkout's Megatron-LM may be any version: accept a label any known version has
    from mbridge_recompute.facts import releases

    return {lab for v in releases.keys() for lab in releases.labels_for(v)}


def _unique(settings: list, where: str) -> list:
    known = _known_labels()
    for s in settings:
        bad = [m for m in (s.modules or ()) if m not in known]
        if bad:
            raise InputError(where, f"unknown recompute label(s) {', '.join(map(repr, bad))} in "
                                    f"{s.describe()!r}; known: {', '.join(sorted(known))}")
    seen = {}
    for s in settings:
        if s in seen:
            raise InputError(where, f"candidate {s.describe()!r} is given twice")
        seen[s] = True
    if not settings:
        raise InputError(where, "no candidates")
    return settings


# --------------------------------------------------------------------------- passthrough

def _option_name(token: str) -> str:
    return token.split("=", 1)[0]


def _is_long_prefix(token: str, option: str, stem: str) -> bool:
    name = _option_name(token)
    return name.startswith(stem) and option.startswith(name)


def _is_short(token: str, option: str) -> bool:
    # argparse accepts -rl 5, -rl=5 and -rl5 for a single-dash multi-letter option
    return token == option or token.startswith(option + "=") or (
        token.startswith(option) and token[len(option):].isdigit())


def conflicts(passthrough: Sequence[str]) -> list:
    """(token, reason) for every passthrough argument that would fight the sweep."""
    found = []
    for tok in passthrough:
        for opt, (stem, why) in _CONFLICTING_LONG.items():
            if tok.startswith("--") and _is_long_prefix(tok, opt, stem):
                found.append((tok, why))
                break
        else:
            for opt, why in _CONFLICTING_SHORT.items():
                if _is_short(tok, opt):
                    found.append((tok, why))
                    break
            else:
                if _HYDRA_RECOMPUTE.match(tok):
                    found.append((tok, "the sweep sets model.recompute_* per candidate"))
    return found


def flag_value(passthrough: Sequence[str], spellings: Iterable[str]) -> Optional[str]:
    """The value of the last `-x V` / `--xx V` / `--xx=V` in the passthrough, or None."""
    value = None
    toks = list(passthrough)
    for i, tok in enumerate(toks):
        for sp in spellings:
            if tok == sp and i + 1 < len(toks):
                value = toks[i + 1]
            elif tok.startswith(sp + "="):
                value = tok.split("=", 1)[1]
    return value


def _has_hydra(passthrough: Sequence[str], key: str) -> bool:
    return any(re.match(rf"^(\+\+|\+)?{re.escape(key)}=", t) for t in passthrough)


def _positive_int(text: str, field_name: str) -> int:
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise InputError(field_name, f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise InputError(field_name, f"expected a positive integer, got {v}")
    return v


# --------------------------------------------------------------------------- tokens per candidate

def recompute_tokens(setting: RecomputeSetting, hydra_only: bool = False) -> list:
    """Harness argv tokens that put `setting` in place of whatever the recipe has.

    The config writer owns the spelling (`snippets.render(setting, "harness")`:
    one comma token for `--recompute_modules`, Hydra for `[]`, uniform and off,
    `-rl N` for block, method/num_layers cleared next to a selective flag), so a
    sweep runs exactly what `config --format harness` prints. `hydra_only` is
    for the `--use_recipes` path, where the recompute flags are ignored
    (`run_recipe.py:45-208`): there every key goes through Hydra.
    """
    from mbridge_recompute.write.snippets import render  # jinja2 is not needed for token formats

    try:
        return list(render(setting, "overrides" if hydra_only else "harness"))
    except ValueError as exc:  # a label that is not one identifier
        raise InputError("--candidates", str(exc)) from None


# --------------------------------------------------------------------------- the sweep

def build_sweep(repo: str, settings: Sequence[RecomputeSetting], passthrough: Sequence[str], *,
                out_dir: str, launcher: str = "local", gbs: Optional[int] = None,
                seq: Optional[int] = None, env: Optional[dict] = None, name_prefix: str = "recompute",
                python: str = "python", torchrun: str = "torchrun") -> Sweep:
    """The matched sweep: one `PlannedRun` per setting, identical except for the recompute tokens."""
    if launcher not in LAUNCHERS:
        raise InputError("--launcher", f"{launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    repo_path = Path(repo).expanduser().resolve()
    if not repo_path.is_dir():
        raise InputError("--repo", f"{repo} is not a directory")
    entry = SETUP_EXPERIMENT if launcher == "slurm" else BOOTSTRAP
    if not (repo_path / entry).is_file():
        raise InputError("--repo", f"{repo_path} has no {entry} (not a Megatron-Bridge checkout?)")
    passthrough = list(passthrough)
    if not passthrough:
        raise InputError("harness arguments", "give the Bridge harness arguments after '--' "
                                               "(e.g. -- -m llama -mr llama3_8b -g h100 -ng 8 -gb 128 -sl 8192)")
    bad = conflicts(passthrough)
    if bad:
        tok, why = bad[0]
        raise InputError("harness arguments", f"{tok!r} conflicts with the sweep: {why}")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name_prefix):
        raise InputError("--name-prefix", f"{name_prefix!r}: use letters, digits, _ . + -")

    extra = []
    for key, value, opt in (("gbs", gbs, "--gbs"), ("seq", seq, "--seq")):
        spellings, flag = _PINNED[key]
        given = flag_value(passthrough, spellings)
        hydra_gbs = key == "gbs" and _has_hydra(passthrough, "train.global_batch_size")
        if value is not None:
            if given is not None or hydra_gbs:
                raise InputError(opt, f"also given as {flag} in the harness arguments; give it once")
            extra += [flag, str(_positive_int(str(value), opt))]
        elif given is None and not hydra_gbs:
            what = "global batch size" if key == "gbs" else "sequence length"
            raise InputError(opt, f"the harness arguments lack {flag}: a matched sweep pins the {what} "
                                  f"(otherwise the recipe fallback may rescale it); pass {flag} N after "
                                  f"'--' or {opt} N")
        else:
            if given is not None:
                _positive_int(given, flag)

    ng_text = flag_value(passthrough, _NUM_GPUS)
    if ng_text is None:
        raise InputError("-ng", "the harness arguments lack -ng/--num_gpus (Bridge requires it, "
                                "argument_parser.py:222-228)")
    num_gpus = _positive_int(ng_text, "-ng")
    hydra_only = "--use_recipes" in passthrough

    sweep = Sweep(repo=str(repo_path), launcher=launcher, passthrough=passthrough)
    if hydra_only:
        sweep.notes.append("--use_recipes: recompute flags are ignored on that path (run_recipe.py:45-208), "
                           "so every candidate is written as Hydra overrides")
        if flag_value(passthrough, ("-ms", "--max_steps")) is None:
            sweep.notes.append("--use_recipes without -ms fails in run_recipe.py:191 (max_steps is None)")
    if launcher == "local" and num_gpus > 8:
        sweep.notes.append(f"-ng {num_gpus} on one node: torchrun starts {num_gpus} local processes; "
                           "use --launcher slurm for several nodes")

    out = Path(out_dir).expanduser().resolve()
    base_env = {"PYTHONPATH": "src"} if launcher == "local" else {}
    base_env.update(env or {})
    names = set()
    for s in settings:
        name = s.slug()
        if name in names:  # parse/plan already refuse duplicates; names must also be unique
            raise InputError("--candidates", f"two candidates share the run name {name!r}")
        names.add(name)
        run_dir = out / name
        rtoks = recompute_tokens(s, hydra_only=hydra_only)
        tail = [*passthrough, *extra, *rtoks, "-wdj", f"{name_prefix}_{name}"]
        if launcher == "local":
            tail += ["--save_config_filepath", str(run_dir / CONFIG_DUMP)]
            argv = [torchrun, "--nproc_per_node", str(num_gpus), BOOTSTRAP, *tail]
        else:
            # On Slurm each experiment's own job dir is mounted at /nemo_run, and
            # with a unique -wdj the default /nemo_run/configs/ConfigContainer.yaml
            # (overrides.py:469-472) is already per run; a login-node path may not
            # exist inside the container.
            argv = [python, SETUP_EXPERIMENT, *tail]
        sweep.runs.append(PlannedRun(name=name, setting=s, argv=argv, env=dict(base_env), cwd=str(repo_path),
                              run_dir=str(run_dir), recompute_tokens=rtoks))
    return sweep


def harness_tail(run: PlannedRun) -> list:
    """The arguments Bridge's own argument parser sees (after the entry script)."""
    for entry in (BOOTSTRAP, SETUP_EXPERIMENT):
        if entry in run.argv:
            return run.argv[run.argv.index(entry) + 1:]
    return list(run.argv)


def display(run: PlannedRun) -> str:
    """The run as one shell line for a person to read or paste (never executed)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in run.env.items())
    cmd = " ".join(shlex.quote(a) for a in run.argv)
    return f"cd {shlex.quote(run.cwd)} && {env + ' ' if env else ''}{cmd}"
