"""Build a matched recompute sweep for Megatron Bridge's performance harness.

One run per candidate recompute setting; everything else identical. The user's
harness arguments (after `--`) are copied unchanged into every run, and only the
recompute tokens, the run name and the config dump path differ. What differs between
Bridge releases (the rank entry point, what `-sl` and `-d` do, the flags and their
choices) comes from `runs/bridge.py`, keyed by the release the checkout is.

Facts this module relies on at every release (0.5: v0.5.1; 0.6 / main: v0.6.0 = 067f987,
whose harness files are identical; lines are 067f987's unless noted):

* `--recompute_modules` takes ONE comma-separated token (`list_of_strings`,
  `argument_parser.py:41-43`); a space-separated second label is left to Hydra,
  which fails with "Error parsing override 'X' missing EQUAL".
* An empty list is not expressible through argparse: `--recompute_modules ""`
  gives `['']`, which MCore rejects at `model.finalize()`
  (`transformer_config.py:1836-1840 @ core 2a75ac12`). The `[]` control goes
  through Hydra: `model.recompute_granularity=selective model.recompute_modules=[]`
  (valid: labels are only checked when the list is non-empty, `:1824-1825`).
* `-rl N` always means full/block/N (`overrides.py:174-177`; `:150-153 @ v0.5.1`);
  the uniform method is not reachable by a flag, so `uniform:N` goes through Hydra.
* Flat-path precedence is argparse > Hydra > recipe (`run_script.py:76-79`;
  `:86-87 @ v0.5.1`): Hydra nulls never undo a flag given in the same run. They do
  undo what the *recipe* sets, so a selective candidate clears a recipe's
  full-recompute method/num_layers through Hydra (e.g. `perf_recipes/llama/h100/
  llama3.py:87-89`, full/block/5, which MCore would reject next to labels,
  `transformer_config.py:1807-1813`), and `-rl` is never combined with labels.
* With `--use_recipes` the recompute flags are ignored (`run_recipe.py:45-208`,
  `utils/utils.py:354-398`) and Hydra is applied last (`run_recipe.py:218-243`),
  so on that path every candidate is Hydra-only.
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
* MCore tests each label for membership (`"core_attn" in config.recompute_modules`,
  `transformer/attention.py:330 @ core_v0.16.1`), so label order and repeats do
  not change a setting: `mlp,layernorm` and `layernorm,mlp` are one run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from mbridge_recompute.errors import InputError, Rejected
from mbridge_recompute.inputs.harness_argv import HarnessArgv, check_passthrough
from mbridge_recompute.logs.runlog import CONFIG_DUMP
from mbridge_recompute.output import shell_line, shell_token
from mbridge_recompute.runs import bridge
from mbridge_recompute.setting import RecomputeSetting

SETUP_EXPERIMENT = bridge.SETUP_EXPERIMENT
ARGUMENT_PARSER = bridge.ARGUMENT_PARSER
LAUNCHERS = ("local", "slurm")
# bounds checked before anything is expanded (a candidate list or a label list of a million
# entries is refused, not split, sorted and echoed)
MAX_CANDIDATES = 64
MAX_LABELS = 32
MAX_CANDIDATE_TEXT = 512
MAX_PASSTHROUGH = 512

# Long options argparse would accept by prefix (allow_abbrev is on in Bridge's
# parser): any token that is a prefix of one of these, down to the stem, is the
# same option.  option -> (stem, why it conflicts)
_CONFLICTING_LONG = {
    "--recompute_modules": ("--recompute", "the sweep sets the recompute modules per candidate"),
    "--recompute_num_layers": ("--recompute", "the sweep sets full recompute per candidate; -rl cannot be "
                                              "undone by Hydra overrides in the same run"),
    "--activation_offload_layers": ("--activation_off",
                                    "legacy CPU offload cannot be combined with any recompute "
                                    "granularity (transformer_config.py:1765-1780)"),
    "--save_config_filepath": ("--save_config", "the sweep writes each run's config into its run dir"),
    "--wandb_experiment_name": ("--wandb_exp", "the sweep gives every run its own -wdj name"),
}
_CONFLICTING_SHORT = {
    "-rl": "the sweep sets full recompute per candidate; -rl cannot be undone by Hydra overrides in the "
           "same run (argparse is applied after Hydra)",
    "-ol": "legacy CPU offload cannot be combined with any recompute granularity "
           "(transformer_config.py:1765-1780)",
    "-wdj": "the sweep gives every run its own -wdj name",
}
# Hydra override on any recompute key, in every spelling Hydra accepts (+, ++, ~).
_HYDRA_RECOMPUTE = re.compile(r"^(\+\+|\+|~)?model\.(recompute_\w*|distribute_saved_activations)\s*(=|$)")

_PINNED = {
    # the harness flag that pins a value -> how the sweep writes it
    "gbs": ("--global_batch_size", "-gb"),
    "seq": ("--seq_length", "-sl"),
}
_NUM_GPUS = "--num_gpus"


@dataclass
class PlannedRun:
    """One run of the sweep: a candidate and the exact process to start."""
    name: str
    setting: RecomputeSetting
    argv: list
    env: dict                # environment overrides on top of the caller's environment
    cwd: Optional[str]       # the checkout root; None in a dry run without a checkout
    run_dir: str
    recompute_tokens: list   # the tokens that differ between runs (for the reader)
    entry: str = ""          # the harness script in argv (what Bridge's parser sees follows it)

    def as_dict(self) -> dict:
        return {"name": self.name, "candidate": self.setting.describe(),
                "setting": self.setting.as_fields(), "argv": list(self.argv),
                "env": dict(self.env), "cwd": self.cwd, "run_dir": self.run_dir,
                "recompute_tokens": list(self.recompute_tokens), "entry": self.entry}


@dataclass
class Sweep:
    repo: Optional[str]
    launcher: str
    passthrough: list
    runs: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    release: Optional[bridge.Detection] = None
    unchecked: list = field(default_factory=list)   # what a dry run could not check, and why


# --------------------------------------------------------------------------- candidates

def parse_candidates(texts: Sequence[str], where: str = "--candidates") -> list:
    """Candidate strings ('[]', 'core_attn', 'layernorm,moe_act', 'uniform:2', 'block:4', 'none')."""
    if len(texts) > MAX_CANDIDATES:
        raise Rejected(where, f"{len(texts)} candidates; a matched sweep takes at most {MAX_CANDIDATES}")
    for t in texts:
        if len(t) > MAX_CANDIDATE_TEXT or t.count(",") >= MAX_LABELS:
            raise Rejected(where, f"a candidate of {len(t)} characters / {t.count(',') + 1} labels; at most "
                                  f"{MAX_LABELS} labels in one candidate")
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
    from mbridge_recompute import files

    data = files.read_json(path, "--from-plan", "plan")
    if not isinstance(data, dict):
        raise InputError("--from-plan", f"{path}: expected the JSON object of `plan --json`")
    short = data.get("harness_candidates")
    if short is not None:
        if not isinstance(short, list) or not all(isinstance(t, str) for t in short):
            raise InputError("--from-plan: harness_candidates", "must be a list of candidate strings")
        if short:
            # the plan's own short list (control, recommendation, its frontier neighbours):
            # a whole frontier can hold 10-30 points, too many runs for one matched sweep
            settings = parse_candidates(short, "--from-plan")
            return _with_control(settings, with_control, "--from-plan", notes)
    entries = data.get("frontier") or []
    if not isinstance(entries, list):
        raise InputError("--from-plan: frontier", "must be a list of plan entries")
    if len(entries) > MAX_CANDIDATES:
        raise Rejected("--from-plan: frontier", f"{len(entries)} entries; a matched sweep takes at most "
                                                f"{MAX_CANDIDATES}")
    entries = list(entries)
    rec = data.get("recommendation")
    if rec is not None and not isinstance(rec, dict):
        raise InputError("--from-plan: recommendation", "must be a plan entry (a JSON object)")
    if rec:
        entries.append(rec)
    if not entries:
        raise InputError("--from-plan", f"{path} has no 'frontier' entries and no 'recommendation'")
    settings = []
    for i, e in enumerate(entries):
        where = f"--from-plan entry {i}"
        if not isinstance(e, dict):
            raise InputError(where, "must be a plan entry (a JSON object)")
        if e.get("allowed") is False:
            if notes is not None:
                rejected_by = e.get("rejected_by") or []
                if not isinstance(rejected_by, list):
                    raise InputError(f"{where}: rejected_by", "must be a list of constraint ids")
                name = e.get("name") or e.get("describe") or i
                notes.append(f"--from-plan: left out {name}: rejected by "
                             f"{', '.join(map(str, rejected_by)) or 'a constraint'}")
            continue
        settings.append(_setting_from_fields(e, where))
    # the recommendation is usually also on the frontier: keep the first occurrence
    out = []
    for s in settings:
        if _key(s) not in {_key(x) for x in out}:
            out.append(s)
    return _with_control(out, with_control, "--from-plan", notes)


def _with_control(settings: list, with_control: bool, where: str, notes: Optional[list],
                  explicit: bool = False) -> list:
    """The `[]` control first unless asked not to (a comparison needs it), then the rest.

    `explicit`: the user typed the candidates, so `[]` among them with --no-control is a
    contradiction, not something to drop.
    """
    control = RecomputeSetting.selective()
    if with_control and control not in settings:
        settings = [control, *settings]
        if notes is not None:
            notes.append(f"the '[]' control was added to {where} (a matched comparison needs it; "
                         "--no-control leaves it out)")
    elif not with_control and control in settings:
        if explicit:
            raise Rejected("--no-control", "'[]' (the control) is among the candidates")
        settings = [s for s in settings if s != control]
        if notes is not None:
            notes.append(f"--no-control: the '[]' control in {where} is left out")
    return _unique(settings, where)


def _setting_from_fields(e, where: str) -> RecomputeSetting:
    if not isinstance(e, dict) or "recompute_granularity" not in e:
        raise InputError(where, "expected recompute_granularity/recompute_modules/"
                                "recompute_method/recompute_num_layers")
    gran = e.get("recompute_granularity")
    if gran is not None and not isinstance(gran, str):
        raise InputError(f"{where}: recompute_granularity",
                         f"must be text or null, got {type(gran).__name__}")
    if gran in (None, "none", "null"):
        return RecomputeSetting.off()
    if gran == "selective":
        mods = e.get("recompute_modules")
        if mods is None:
            mods = ["core_attn"]
        if isinstance(mods, str):
            mods = [m for m in mods.split(",") if m]
        if not isinstance(mods, list) or not all(isinstance(m, str) and m.strip() for m in mods):
            raise InputError(f"{where}: recompute_modules", f"must be a list of labels, got "
                                                             f"{type(mods).__name__}")
        if len(mods) > MAX_LABELS:
            raise Rejected(f"{where}: recompute_modules", f"{len(mods)} labels; at most {MAX_LABELS}")
        return RecomputeSetting.selective(*[m.strip() for m in mods])
    if gran == "full":
        method, n = e.get("recompute_method"), e.get("recompute_num_layers")
        # bool is an int in Python: `recompute_num_layers: true` is not 1
        if method not in ("uniform", "block") or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputError(where, f"full recompute needs method uniform/block and num_layers >= 1, "
                                    f"got {str(method)[:40]!r}/{str(n)[:40]!r}")
        return RecomputeSetting.full(method, n)
    raise InputError(f"{where}: recompute_granularity", f"unknown value {gran[:40]!r}")


def _known_labels() -> set:
    # the checkout's Megatron-LM may be any version: accept a label any known version has
    from mbridge_recompute.facts import releases

    return {lab for v in releases.keys() for lab in releases.labels_for(v)}


def _key(s: RecomputeSetting):
    """What makes two settings the same run: labels as a set (MCore tests membership), and the
    layout / offloading / optimizer changes an alternative makes beside them (`[]` and
    `[]@context_parallel_size=2` are two runs)."""
    mods = None if s.modules is None else frozenset(s.modules)
    return (s.granularity, mods, s.method, s.num_layers, s.distribute_saved_activations, s.changes)


def _unique(settings: list, where: str) -> list:
    known = _known_labels()
    for s in settings:
        bad = [m for m in (s.modules or ()) if m not in known]
        if bad:
            raise InputError(where, f"unknown recompute label(s) {', '.join(map(repr, bad[:5]))} in "
                                    f"{s.candidate()[:80]!r}; known: {', '.join(sorted(known))}")
        twice = sorted({m for m in (s.modules or ()) if s.modules.count(m) > 1})
        if twice:
            raise Rejected(where, f"label {twice[0]!r} is given twice in {s.candidate()[:80]!r}")
    seen: dict = {}
    for s in settings:
        k = _key(s)
        if k in seen:
            same = "" if seen[k].candidate() == s.candidate() else \
                f" as {seen[k].candidate()!r} (label order does not matter)"
            raise Rejected(where, f"candidate {s.candidate()!r} is given twice{same}")
        seen[k] = s
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
    # argparse takes -rl 5 and -rl=5; -rl5 it leaves unknown (then Hydra fails on it), which is
    # refused here just the same
    return token == option or token.startswith(option + "=") or (
        token.startswith(option) and token[len(option):].isdigit())


def conflicts(passthrough: Sequence[str]) -> list:
    """(token, reason) for every passthrough argument that would fight the sweep.

    A screen on the tokens themselves, wider on purpose than the release's parser
    (inputs/harness_argv.py): any prefix of a conflicting long option down to its stem
    (`--recompute`, which argparse would call ambiguous), `-rl5` (which argparse leaves to Hydra)
    and every Hydra spelling of a recompute key are refused with the reason the sweep has, before
    the release is known.
    """
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


def flag_value(passthrough: Sequence[str], spellings: Iterable[str], release: str = "main") -> Optional[str]:
    """The value argparse keeps for the flag one of `spellings` names (its last occurrence, in any
    spelling or abbreviation the release's parser takes), or None (inputs/harness_argv.py)."""
    from mbridge_recompute.inputs.harness_argv import _table, canonical

    table, _ = _table(release)
    names = {canonical(table[sp]) for sp in spellings if sp in table}
    hargv = HarnessArgv.parse(passthrough, release)
    hits = [f for f in hargv.flags if f.name in names]
    return hits[-1].value if hits else None


def _has_hydra(hargv, key: str) -> bool:
    return any(o.key == key and o.op != "~" for o in hargv.overrides)


def _positive_int(text: str, field_name: str) -> int:
    if len(str(text)) > 12 or not str(text).strip().lstrip("+").isdigit():
        raise InputError(field_name, f"expected a positive integer, got {str(text)[:40]!r}")
    v = int(text)
    if v < 1:
        raise InputError(field_name, f"expected a positive integer, got {v}")
    return v


def _executable(text: str, option: str) -> str:
    """A launcher program: a bare name is looked up on PATH; a path is the user's, from their cwd.

    The run starts with cwd = the checkout, where a relative path would name another file.
    """
    if not text:
        raise InputError(option, "is empty")
    if os.sep in text or (os.altsep and os.altsep in text):
        return os.path.abspath(os.path.expanduser(text))
    return text


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

def _checkout(repo: Optional[str], launch: bool) -> Optional[Path]:
    if repo is None:
        if launch:
            raise InputError("--repo", "--launch needs the Megatron-Bridge checkout (--repo DIR)")
        return None
    if not str(repo).strip():
        raise InputError("--repo", "is empty")
    path = Path(repo).expanduser().resolve()
    if not path.is_dir():
        raise InputError("--repo", f"{repo} is not a directory")
    return path


def build_sweep(repo: Optional[str], settings: Sequence[RecomputeSetting], passthrough: Sequence[str], *,
                out_dir: str, launcher: str = "local", gbs: Optional[int] = None,
                seq: Optional[int] = None, env: Optional[dict] = None, name_prefix: str = "recompute",
                python: str = "python", torchrun: str = "torchrun", launch: bool = False,
                release: Optional[str] = None) -> Sweep:
    """The matched sweep: one `PlannedRun` per setting, identical except for the recompute tokens.

    Without a checkout (a dry run only) the argv is built for `release` (default main) and the
    sweep lists what it could not check; with a partial checkout the same.
    """
    if launcher not in LAUNCHERS:
        raise InputError("--launcher", f"{launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    repo_path = _checkout(repo, launch)
    passthrough = list(passthrough)
    if len(passthrough) > MAX_PASSTHROUGH:
        raise Rejected("harness arguments", f"{len(passthrough)} tokens; at most {MAX_PASSTHROUGH}")
    if not passthrough:
        raise Rejected("harness arguments", "give the Bridge harness arguments after '--' "
                                            "(e.g. -- -m llama -mr llama3_8b -g h100 -ng 8 -gb 128 -sl 8192)")
    bad = conflicts(passthrough)
    if bad:
        tok, why = bad[0]
        raise Rejected("harness arguments", f"{tok!r} conflicts with the sweep: {why}")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", name_prefix):
        raise InputError("--name-prefix", f"{name_prefix[:80]!r}: use 1-64 letters, digits, _ . + -")

    det = bridge.detect(repo_path, release)
    facts = det.release or bridge.newest()
    # the passthrough read once, as the release's rank reads it (argparse, then Hydra)
    hargv = HarnessArgv.parse(passthrough, facts.key)
    hydra_only = hargv.use_recipes
    for s in settings:
        for name, _ in s.changes:
            given = hargv.last("--" + name)
            if given is not None:
                # the candidate writes the change as a Hydra override, and the rank applies its flags
                # after Hydra (run_script.py:76-79 @ v0.6.0): the flag would silently win
                raise Rejected("harness arguments", f"{given.text!r} fights candidate {s.candidate()!r}, "
                                                    f"which sets {name} per run; leave the flag out")
    if launcher == "slurm":
        entry = SETUP_EXPERIMENT
    else:
        entry = facts.local_entry_recipes if hydra_only else facts.local_entry
    sweep = Sweep(repo=str(repo_path) if repo_path else None, launcher=launcher, passthrough=passthrough,
                  release=det)
    sweep.notes += det.notes
    if det.key is None:
        sweep.notes.append(f"the Bridge release could not be told from the checkout: the argv follows "
                           f"{facts.key} (pass --bridge-release {', '.join(bridge.keys())})")
    if repo_path is None:
        sweep.unchecked.append("no checkout (--repo): the entry point, the release and the checkout's own "
                               "argument parser were not checked; run from the root of your Megatron-Bridge "
                               "checkout")
    elif not (repo_path / entry).is_file():
        if launch:
            raise InputError("--repo", f"{repo_path} has no {entry} (not a Megatron-Bridge checkout of "
                                       f"release {facts.key}?)")
        sweep.unchecked.append(f"{repo_path} has no {entry}: a partial checkout; --launch would refuse it")
    if launch and not det.supported:
        raise Rejected("--repo", "; ".join(n for n in det.notes if "older than" in n))

    extra = []
    for key, value, opt in (("gbs", gbs, "--gbs"), ("seq", seq, "--seq")):
        name, flag = _PINNED[key]
        given = hargv.value(name)
        hydra_gbs = key == "gbs" and _has_hydra(hargv, "train.global_batch_size")
        if value is not None:
            if given is not None or hydra_gbs:
                raise Rejected(opt, f"also given as {flag} in the harness arguments; give it once")
            extra += [flag, str(_positive_int(str(value), opt))]
        elif given is None and not hydra_gbs:
            what = "global batch size" if key == "gbs" else "sequence length"
            raise Rejected(opt, f"the harness arguments lack {flag}: a matched sweep pins the {what} "
                                f"(otherwise the recipe fallback may rescale it); pass {flag} N after "
                                f"'--' or {opt} N")
        else:
            if given is not None:
                _positive_int(given, flag)

    ng_text = hargv.value(_NUM_GPUS)
    if ng_text is None:
        raise Rejected("-ng", "the harness arguments lack -ng/--num_gpus (Bridge requires it, "
                              "argument_parser.py:222-228)")
    num_gpus = _positive_int(ng_text, "-ng")
    seq_pinned = seq if seq is not None else hargv.value(_PINNED["seq"][0])
    if (not facts.seq_length_sets_model and not hydra_only and seq_pinned is not None
            and not _has_hydra(hargv, "model.seq_length")):
        extra.append(f"model.seq_length={int(seq_pinned)}")
        sweep.notes.append(facts.seq_length_why)

    # the release's own parser, read as data: unknown flags, bad choices, a flag given twice,
    # stray words (a second label after a space) -- refused before any GPU time
    problems = check_passthrough([*passthrough, *extra], facts.key)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Rejected("harness arguments", problems[0] + more)

    if hydra_only:
        sweep.notes.append("--use_recipes: recompute flags are ignored on that path (run_recipe.py:45-208), "
                           "so every candidate is written as Hydra overrides")
        if hargv.value("--max_steps") is None:
            sweep.notes.append("--use_recipes without -ms fails in run_recipe.py:191 (max_steps is None)")
    if hargv.has_switch("--dryrun") and not facts.dryrun_validates:
        sweep.notes.append(facts.dryrun_why)
    if launcher == "local" and facts.local_env_note:
        sweep.notes.append(facts.local_env_note)
    if launcher == "local" and num_gpus > 8:
        sweep.notes.append(f"-ng {num_gpus} on one node: torchrun starts {num_gpus} local processes; "
                           "use --launcher slurm for several nodes")

    out = Path(out_dir).expanduser().resolve()      # relative to the user's cwd, never the checkout
    base_env = {"PYTHONPATH": "src"} if launcher == "local" else {}
    base_env.update(env or {})
    torchrun, python = _executable(torchrun, "--torchrun"), _executable(python, "--python")
    names = set()
    for s in settings:
        name = s.slug()
        if name in names:  # parse/plan already refuse duplicates; names must also be unique
            raise Rejected("--candidates", f"two candidates share the run name {name!r}")
        names.add(name)
        run_dir = out / name
        rtoks = recompute_tokens(s, hydra_only=hydra_only)
        tail = [*passthrough, *extra, *rtoks, "-wdj", f"{name_prefix}_{name}"]
        if launcher == "local":
            tail += ["--save_config_filepath", str(run_dir / CONFIG_DUMP)]
            argv = [torchrun, "--nproc_per_node", str(num_gpus), entry, *tail]
        else:
            # On Slurm each experiment's own job dir is mounted at /nemo_run, and
            # with a unique -wdj the default /nemo_run/configs/ConfigContainer.yaml
            # (overrides.py:469-472) is already per run; a login-node path may not
            # exist inside the container.
            argv = [python, SETUP_EXPERIMENT, *tail]
        sweep.runs.append(PlannedRun(name=name, setting=s, argv=argv, env=dict(base_env),
                                     cwd=str(repo_path) if repo_path else None, run_dir=str(run_dir),
                                     recompute_tokens=rtoks, entry=entry))
    return sweep


def harness_tail(run: PlannedRun) -> list:
    """The arguments Bridge's own argument parser sees (after the entry script)."""
    for entry in (run.entry, bridge.BOOTSTRAP, bridge.RUN_SCRIPT, bridge.RUN_RECIPE, SETUP_EXPERIMENT):
        if entry and entry in run.argv:
            return run.argv[run.argv.index(entry) + 1:]
    return list(run.argv)


def display(run: PlannedRun) -> str:
    """The run as one shell line for a person to read or paste (never executed)."""
    env = " ".join(f"{k}={shell_token(v)}" for k, v in run.env.items())
    cmd = shell_line(run.argv)
    head = f"cd {shell_token(run.cwd)} && " if run.cwd else ""
    return f"{head}{env + ' ' if env else ''}{cmd}"
