"""The recompute setting a run actually had, next to the one its command asked for.

A run is a harness run directory (`log.txt`, `manifest.json`, `ConfigContainer.yaml`, as
runs/launch.py writes them) or a log with the config its rank dumped. What ran is read from the
dump: on the flat harness path Bridge writes it after `runtime_config_update` and the model's
`finalize()` (setup.py:724-743 @ megatron-bridge 0.6.2, `maybe_log_and_save_config`), so it holds
the values megatron-core trained with. What was asked is the manifest's candidate when the
harness built the run, and the recompute tokens of its argv otherwise.

Each difference gets its cause, from what the Bridge harness and megatron-core do:

- `none-promoted`: recompute_modules None becomes ["core_attn"] in `__post_init__`, outside the
  selective branch, so at any granularity (tc:1193-1194 @ core_v0.16.1, :1763-1764 @ core_v0.19.0,
  :1940-1941 @ main); Bridge never does it itself.
- `recipe-leak`: `--recompute_modules` sets only the granularity and the labels (overrides.py:178-180
  @ Megatron-Bridge v0.6.0), so a recipe's full-recompute method and layer count stay, and
  megatron-core then rejects the mix ("recompute_num_layers must be None", tc:1752-1755 @ 0.19).
- `flag-order`: argparse flags are applied after Hydra overrides (run_script.py:76-79 @ v0.6.0), so
  `-rl N` (full/block/N, overrides.py:174-177) wins over a Hydra `model.recompute_*=null`.
- `ignored-flags`: with `--use_recipes` the recompute flags are not read at all and Hydra is
  applied last (run_recipe.py:45-208, 239-242 @ v0.6.0).
- `ignored-label`: a label that ran but changes nothing for this model (the card's silent no-op
  findings, e.g. moe on a dense model).

Reads the run with logs/runlog.py's readers; nothing here imports torch or megatron.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mbridge_recompute.errors import InputError

FIELDS = ("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers")
CAUSES = {
    "none-promoted": "megatron-core turns recompute_modules None into [core_attn] at any granularity "
                     "(transformer_config.py __post_init__: tc:1193-1194 @ core_v0.16.1, tc:1763-1764 @ "
                     "core_v0.19.0); Bridge does not",
    "recipe-leak": "the recipe's own value stayed: --recompute_modules sets only the granularity and the "
                   "labels (scripts/performance/utils/overrides.py:178-180 @ Megatron-Bridge v0.6.0)",
    "flag-order": "-rl is applied after the Hydra overrides (run_script.py:76-79, overrides.py:174-177 @ "
                  "Megatron-Bridge v0.6.0), so a Hydra null cannot undo it",
    "ignored-flags": "--use_recipes reads no recompute flag and applies Hydra last "
                     "(run_recipe.py:45-208, 239-242 @ Megatron-Bridge v0.6.0)",
    "ignored-label": "the label ran but changes nothing for this model",
    "unexplained": "the recipe or another override set it",
}
# what to do about each cause, in the order of CAUSES
FIXES = {
    "none-promoted": "spell the labels out (recompute_modules=[core_attn]) so the command says what runs",
    "recipe-leak": "clear the recipe's values with Hydra: model.recompute_method=null "
                   "model.recompute_num_layers=null (run_harness.py does this for every selective candidate)",
    "flag-order": "leave -rl out; Hydra nulls cannot undo a flag",
    "ignored-flags": "with --use_recipes give the setting as Hydra overrides (model.recompute_*=...)",
    "ignored-label": "drop the label; it recomputes nothing for this model",
    "unexplained": "compare the recipe's values with the command; the dump shows what ran",
}


@dataclass
class RunSetting:
    """What a run asked for and what it had."""
    run: str
    asked: dict                       # field -> value (absent: the command did not say)
    asked_from: str                   # "manifest candidate" or "argv"
    ran: Optional[dict]               # field -> value from the dump; None without a dump
    ran_from: str
    requests: list = field(default_factory=list)
    differences: list = field(default_factory=list)    # {field, asked, ran, cause, why}
    ignored_labels: list = field(default_factory=list)  # {label, finding, message}
    error: Optional[str] = None       # the run's first exception line, if it failed
    use_recipes: bool = False
    argv: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"run": self.run, "asked": self.asked, "asked_from": self.asked_from, "ran": self.ran,
                "ran_from": self.ran_from,
                "requests": [{"field": r.field, "value": r.value, "token": r.token, "source": r.source}
                             for r in self.requests],
                "differences": self.differences, "ignored_labels": self.ignored_labels,
                "error": self.error}


def requests_of(argv: list, release: Optional[str] = None) -> tuple[list, bool]:
    """The recompute requests of a harness command line, in the order the rank applies them
    (inputs/harness_argv.py: Hydra overrides first, then the argparse flags, run_script.py:76-79 @
    v0.6.0), and whether it runs --use_recipes (whose path reads no recompute flag)."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv

    hargv = HarnessArgv.of_command(argv, release)
    return hargv.recompute_requests(), hargv.use_recipes


def _ran(dump: Optional[dict], where: str) -> Optional[dict]:
    """The four recompute fields of the dump's model section, each of the type megatron-core
    reads (values.coerce, as a workload's own), or None without a model section."""
    from mbridge_recompute.inputs.values import coerce

    model = dump.get("model") if dump is not None else None
    if model is None:
        return None
    if not isinstance(model, dict):
        raise InputError(f"{where}: model", f"must be a mapping, got {type(model).__name__}")
    return {k: coerce(k, model.get(k), f"{where}: model.{k}") for k in FIELDS}


def read(run: str, config: Optional[str] = None, watch=None) -> tuple[RunSetting, Optional[dict], object]:
    """(the run's setting, the dumped ConfigContainer as a mapping or None, the parsed log).

    Each of the run's files is read once (logs/rundir.py)."""
    from mbridge_recompute.logs.rundir import RunDir

    if not str(run).strip():
        raise InputError("--run", "is empty")
    if not Path(run).exists() and not Path(run).is_symlink():
        raise InputError("--run", f"no such run directory or log: {run}")
    rd = RunDir(run, field="--run", config=config)
    manifest = rd.manifest
    dump = rd.dump
    parsed = rd.parse(watch)
    argv = [str(a) for a in (manifest or {}).get("argv") or []]
    release = (manifest or {}).get("bridge_release")
    requests, use_recipes = requests_of(argv, release if isinstance(release, str) else None)
    if manifest and isinstance(manifest.get("setting"), dict):
        asked = {k: manifest["setting"].get(k) for k in FIELDS}
        asked_from = "manifest candidate"
    else:
        asked = {}
        for r in requests:
            asked[r.field] = r.value
        asked_from = "argv" if argv else "nothing (no manifest): only what ran is reported"
    ran = _ran(dump, rd.dump_field)
    error = None
    if parsed.errors:
        e = parsed.errors[0]
        error = f"{e.exc_type}: {e.message}" if e.message else e.exc_type
    if ran is not None:
        ran_from = str(rd.dump_path)
    elif dump is not None:
        ran_from = f"{rd.dump_path} has no model: section"
    else:
        ran_from = "no config dump (the run did not reach the point where the rank writes it)"
    setting = RunSetting(run=str(run), asked=asked, asked_from=asked_from, ran=ran, ran_from=ran_from,
                         requests=requests, error=error, use_recipes=use_recipes, argv=argv)
    setting.differences = differences(setting)
    return setting, dump, parsed


def differences(s: RunSetting) -> list:
    out = []
    if s.use_recipes:
        from mbridge_recompute.inputs.harness_argv import HarnessArgv

        flags = [f.text for f in HarnessArgv.of_command(s.argv).recompute_flags()]
        if flags:
            out.append({"field": "recompute flags", "asked": flags, "ran": "not read",
                        "cause": "ignored-flags", "why": CAUSES["ignored-flags"]})
    if s.ran is None:
        if s.error and "recompute_num_layers must be None" in s.error and \
                s.asked.get("recompute_granularity") == "selective":
            out.append({"field": "recompute_num_layers", "asked": s.asked.get("recompute_num_layers"),
                        "ran": "rejected", "cause": "recipe-leak",
                        "why": CAUSES["recipe-leak"] + f"; the run failed: {s.error}"})
        return out
    if s.asked_from == "argv":
        out += _by_request(s)
        return out
    if s.asked_from != "manifest candidate":
        return out                    # nothing says what was asked: what ran is the report
    for name in FIELDS:
        asked, ran = s.asked.get(name, _ABSENT), s.ran.get(name)
        if _same(asked, ran) or _inert(s, name):
            continue
        cause = "flag-order" if _flag_won(s.requests, name, ran) else \
            _unrequested_cause(name, ran, s.ran.get("recompute_granularity"))
        if cause is None:
            cause = "unexplained"
        out.append({"field": name, "asked": None if asked is _ABSENT else asked, "ran": ran,
                    "cause": cause, "why": CAUSES[cause]})
    return out


def _inert(s: RunSetting, name: str) -> bool:
    """A field whose value changes nothing at the granularity that ran (and was asked): the labels
    outside selective recompute, the method and layer count with recompute off (megatron-core reads
    them only there: tc:1170-1230 @ core_v0.16.1)."""
    g_ran, g_asked = s.ran.get("recompute_granularity"), s.asked.get("recompute_granularity", _ABSENT)
    if name == "recompute_modules":
        return g_ran != "selective" and g_asked != "selective"
    if name in ("recompute_method", "recompute_num_layers"):
        return g_ran is None and g_asked in (None, _ABSENT)
    return False


def _flag_won(requests: list, name: str, ran) -> bool:
    """A Hydra override of `name` followed by a flag that set what ran (flags are applied last)."""
    for i, r in enumerate(requests):
        if r.field == name and r.source == "hydra":
            later = [x for x in requests[i + 1:] if x.field == name and x.source == "flag"]
            if later and _same(later[-1].value, ran):
                return True
    return False


def _unrequested_cause(name: str, ran, granularity=None) -> Optional[str]:
    """Why a field the command left as None (or did not name) ran with a value. The labels are
    read only under selective recompute (tc:1196 @ core_v0.16.1), so their promotion to
    [core_attn] on a full-recompute run changes nothing and is not a difference."""
    if name == "recompute_modules" and ran == ["core_attn"]:
        return "none-promoted" if granularity == "selective" else None
    if name in ("recompute_method", "recompute_num_layers") and ran is not None:
        return "recipe-leak"
    return None


def _by_request(s: RunSetting) -> list:
    """Differences for a command given as argv: each request that did not hold, and the fields it
    did not name that ran with a value all the same."""
    out = []
    for i, r in enumerate(s.requests):
        ran = s.ran.get(r.field)
        if _same(r.value, ran):
            continue
        later = [x for x in s.requests[i + 1:] if x.field == r.field]
        if r.source == "hydra" and any(x.source == "flag" for x in later):
            cause = "flag-order"
        elif r.field == "recompute_modules" and r.value is None and ran == ["core_attn"]:
            if s.ran.get("recompute_granularity") != "selective":
                continue              # labels are not read outside selective: nothing changed
            cause = "none-promoted"
        else:
            cause = "unexplained"
        if later and cause == "unexplained" and _same(later[-1].value, ran):
            continue                  # a later request of the same command holds: no difference
        out.append({"field": r.field, "asked": r.value, "ran": ran, "token": r.token, "cause": cause,
                    "why": CAUSES[cause]})
    named = {r.field for r in s.requests}
    for name in FIELDS:
        if name in named:
            continue
        cause = _unrequested_cause(name, s.ran.get(name), s.ran.get("recompute_granularity"))
        if cause == "recipe-leak" and s.ran.get("recompute_granularity") != "selective":
            cause = None              # the recipe's own full recompute, asked for by nothing else
        if cause:
            out.append({"field": name, "asked": None, "ran": s.ran.get(name), "cause": cause,
                        "why": CAUSES[cause]})
    return out


class _Absent:
    def __repr__(self):
        return "<not asked>"


_ABSENT = _Absent()


def _same(a, b) -> bool:
    if a is _ABSENT:
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def add_ignored_labels(s: RunSetting, report: dict) -> None:
    """Labels that ran but did nothing, from a check report of the run's effective workload."""
    if not s.ran or s.ran.get("recompute_granularity") != "selective":
        return
    for f in report.get("findings", []):
        if f.get("kind") == "silent-no-op":
            s.ignored_labels.append({"finding": f["id"], "message": f["message"]})
            s.differences.append({"field": "recompute_modules", "asked": s.asked.get("recompute_modules"),
                                  "ran": s.ran.get("recompute_modules"), "cause": "ignored-label",
                                  "why": f"{CAUSES['ignored-label']}: {f['message']} [{f['id']}]"})
