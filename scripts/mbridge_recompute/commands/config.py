"""`config`: write a recompute setting for Bridge, the perf harness or Megatron-LM.

The setting is checked before it is written: it is put into the workload (the
one given, or a permissive baseline when none is given) and the constraint
checker must accept it. An illegal setting is refused with the constraint
that forbids it (exit 1); options that contradict each other are unusable
input (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mbridge_recompute import files
from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mbridge_recompute.rules.findings import errors

DESCRIPTION = ("Write a recompute setting as Bridge Python, Bridge YAML, Hydra overrides, "
               "perf-harness argv or Megatron-LM flags, after checking it against the workload.")

EPILOG = """\
examples:
  write_config.py --modules moe_act,layernorm                      # Bridge Python (default)
  write_config.py --modules '[]' --format harness                  # matched no-recompute control
  write_config.py --granularity full --method uniform --num-layers 1 --format overrides
  write_config.py --granularity full --method block --num-layers 4 --format mlm
  write_config.py --granularity none --format yaml --output recompute.yaml
  write_config.py examples/moonlight_16b.yaml --modules moe_act --json

options that go together:
  --granularity selective  needs --modules (a,b or [] for the matched control); --modules alone
                           implies selective
  --granularity full       needs --method {uniform,block} and --num-layers N (per model chunk)
  --granularity none       takes none of --modules/--method/--num-layers/--distribute-saved-activations

which workload the setting is checked against:
  a WORKLOAD.yaml, --model, --hf-config or --set: that workload with this setting in place of its own.
  none of them: a permissive baseline built for the setting (bf16, no dropout, no CUDA graphs;
  MoE with grouped GEMM for MoE labels, MLA for mla_up_proj, TP 2 without SP for
  --distribute-saved-activations). Only the setting's own constraints can fail there; its
  warnings describe that baseline model. Give your workload for the full check.

formats:
  python     cfg.model.* assignments for a Bridge recipe or ConfigContainer
  yaml       a model: section
  overrides  Hydra key=value tokens for Bridge (one argv token each)
  harness    Bridge perf-harness argv: --recompute_modules a,b or -rl N where they say exactly
             this setting, Hydra overrides for the rest ([] control, uniform, off);
             the harness's flat path only (--use_recipes ignores the flags: use overrides)
  mlm        Megatron-LM flags (--recompute-granularity ...); the empty list cannot be expressed
The Bridge formats (python, yaml, overrides, harness) set all five recompute keys, so a recipe's
own values cannot leak through; Megatron-LM starts from its defaults, so mlm passes only the rest.

exit codes: 0 written, 1 the setting breaks a constraint (refused, named on stderr),
2 unusable options or workload.
"""


def add_arguments(parser) -> None:
    from mbridge_recompute.inputs.loading import add_workload_arguments
    from mbridge_recompute.write.snippets import FORMATS

    add_workload_arguments(parser)
    g = parser.add_argument_group("recompute setting")
    g.add_argument("--granularity", choices=("selective", "full", "none"),
                   help="selective (labels), full (whole layers) or none")
    g.add_argument("--modules", metavar="A,B",
                   help="selective labels, one comma-separated token, or [] for the matched control")
    g.add_argument("--method", choices=("uniform", "block"), help="full recompute method")
    g.add_argument("--num-layers", type=int, metavar="N",
                   help="full recompute: layers per group (uniform) or per model chunk (block)")
    g.add_argument("--distribute-saved-activations", action="store_true",
                   help="full recompute only: split the saved layer inputs across TP ranks (no SP)")
    g.add_argument("--candidate", metavar="TEXT",
                   help="a plan candidate instead of the options above: 'moe_act', '[]', 'uniform:2', "
                        "or one with layout / offload changes, 'mlp@virtual_pipeline_model_parallel_size=10' "
                        "(the names plan --json and --alternatives print)")
    o = parser.add_argument_group("output")
    o.add_argument("--format", choices=FORMATS, default="python", help="default: python")
    o.add_argument("--json", action="store_true",
                   help="one JSON object: the setting, every format, the check")
    o.add_argument("--output", metavar="PATH", help="write the --format snippet to PATH")
    o.add_argument("--force", action="store_true", help="let --output overwrite an existing file")


# ---------------------------------------------------------------- options -> setting
def parse_modules(text: str, version) -> tuple:
    """'a,b' / '[a,b]' / '[]' -> labels, each known to megatron-core `version`."""
    from mbridge_recompute.facts import releases

    t = text.strip()
    bracketed = t.startswith("[") and t.endswith("]")
    inner = t[1:-1].strip() if bracketed else t
    if not inner:
        if bracketed:
            return ()
        raise InputError("--modules", "empty; use [] for the matched no-recompute control")
    mods = [m.strip() for m in inner.split(",")]
    if any(not m for m in mods):
        raise InputError("--modules", f"{text!r} has an empty label (one comma-separated token: a,b)")
    releases.require_known(mods, version, "--modules")
    seen = set()
    for m in mods:
        if m in seen:
            raise InputError("--modules", f"{m!r} is listed twice")
        seen.add(m)
    return tuple(mods)


def setting_from_args(args, version):
    """The RecomputeSetting the options describe, or InputError naming the option at fault."""
    from mbridge_recompute.setting import RecomputeSetting

    if getattr(args, "candidate", None) is not None:
        for opt, given in (("--granularity", args.granularity), ("--modules", args.modules is not None),
                           ("--method", args.method), ("--num-layers", args.num_layers is not None),
                           ("--distribute-saved-activations", args.distribute_saved_activations)):
            if given:
                raise InputError(opt, "goes without --candidate (the candidate says it all)")
        setting = RecomputeSetting.parse(args.candidate, "--candidate")
        if setting.modules:
            parse_modules("[" + ",".join(setting.modules) + "]", version)
        return setting
    g = args.granularity
    if g is None:
        if args.modules is not None:
            g = "selective"  # as the harness's --recompute_modules does (overrides.py:178-180)
        elif args.method is not None:
            raise InputError("--method", "needs --granularity full")
        elif args.num_layers is not None:
            raise InputError("--num-layers", "needs --granularity full")
        else:
            raise InputError("--granularity", "required: selective, full or none "
                             "(or --modules A,B, which implies selective)")
    if g == "none":
        for opt, given in (("--modules", args.modules is not None), ("--method", args.method),
                           ("--num-layers", args.num_layers is not None),
                           ("--distribute-saved-activations", args.distribute_saved_activations)):
            if given:
                raise InputError(opt, "has no meaning with --granularity none")
        return RecomputeSetting.off()
    if g == "selective":
        if args.method is not None:
            # Megatron-LM rejects it (arguments.py:899-902 @ core_v0.16.1) though
            # TransformerConfig accepts it; selective always covers every layer.
            raise InputError("--method", "only with --granularity full (selective covers every layer)")
        if args.num_layers is not None:
            # tc:1179-1185 @ core_v0.16.1: selective needs recompute_num_layers None
            raise InputError("--num-layers", "only with --granularity full "
                             "(selective needs recompute_num_layers None)")
        if args.modules is None:
            raise InputError("--modules", "required with --granularity selective: A,B or [] "
                             "(megatron-core's implicit default is [core_attn]; say it if you mean it)")
        return RecomputeSetting(granularity="selective", modules=parse_modules(args.modules, version),
                                distribute_saved_activations=args.distribute_saved_activations)
    # full
    if args.modules is not None:
        # labels are read only under selective (tc:1196 @ core_v0.16.1)
        raise InputError("--modules", "only with --granularity selective (full recomputes whole layers)")
    if args.method is None:
        raise InputError("--method", "required with --granularity full: uniform or block")
    if args.num_layers is None:
        raise InputError("--num-layers", "required with --granularity full")
    if args.num_layers < 1:
        # 0.16.1 checks no bound: uniform with N <= 0 loops forever, block recomputes
        # nothing (transformer_block.py:536-564 @ core_v0.16.1)
        raise InputError("--num-layers", f"must be >= 1, got {args.num_layers}")
    return RecomputeSetting.full(args.method, args.num_layers, args.distribute_saved_activations)


# ---------------------------------------------------------------- workload
def baseline_workload(setting):
    """The most permissive workload for `setting`: every label it names applies (each label's
    card `baseline:` fields, merged in card order), no CUDA graphs, no dropout, bf16. Only
    constraints of the setting itself can fail here (e.g. distribute_saved_activations without
    full recompute)."""
    from mbridge_recompute.facts import card
    from mbridge_recompute.workload import FIELD_NAMES, Workload

    mods = set(setting.modules or ())
    kw: dict = dict(bf16=True, attention_dropout=0.0, hidden_dropout=0.0, num_layers=8,
                    hidden_size=1024, num_attention_heads=16)
    extra: dict = {}                     # TransformerConfig fields the Workload does not name
    for entry in card.load()["labels"]:
        if entry["label"] in mods:
            for name, value in (entry.get("baseline") or {}).items():
                (kw if name in FIELD_NAMES else extra)[name] = value
    if setting.granularity == "full":
        # uniform N must divide the layers of a chunk and block N should not exceed them
        kw["num_layers"] = 8 * max(1, setting.num_layers or 1)
    if setting.distribute_saved_activations:
        kw.update(tensor_model_parallel_size=2, sequence_parallel=False)
    return Workload(**kw, extra_model=extra)


def _has_workload(args) -> bool:
    from mbridge_recompute.inputs.loading import has_workload

    return has_workload(args)


# Workload fields a --set may change that decide what the recompute setting does at run time
# (CUDA graphs capture or skip recompute, offloading moves what recompute would keep): a --set
# of one of them is part of the change, so every snippet writes it (the printed config is the
# whole change that was checked).
SNIPPET_SET_FIELDS = ("cuda_graph_impl", "cuda_graph_scope", "cuda_graph_modules", "cpu_offloading",
                      "cpu_offloading_num_layers", "fine_grained_activation_offloading", "offload_modules")


def with_set_changes(setting, args, base):
    """`setting` with the SNIPPET_SET_FIELDS the --set options changed, at the values the loaded
    workload `base` holds for them (coerced and checked like every field)."""
    from mbridge_recompute.inputs.loading import parse_override

    fields = {}
    for text in getattr(args, "sets", None) or ():
        key, _ = parse_override(text)
        leaf = key.rsplit(".", 1)[-1]
        if leaf in SNIPPET_SET_FIELDS and leaf not in dict(setting.changes):
            fields[leaf] = getattr(base, leaf)
    return setting.with_changes(**fields) if fields else setting


def check_setting(setting, args, version, base=None) -> dict:
    """Put the setting into the workload as the snippet writes it, and check it."""
    from mbridge_recompute.rules import check_workload
    from mbridge_recompute.write.snippets import written_fields

    given = base is not None or _has_workload(args)
    if base is None and given:
        from mbridge_recompute.inputs.loading import load_from_args

        base = load_from_args(args, version, default=True)
    elif base is None:
        base = baseline_workload(setting)
    w = setting.apply(base.replace(**written_fields(setting)))   # the layout changes too
    if given:
        from mbridge_recompute.inputs.loading import revalidate

        w = revalidate(w, version)      # a change is checked as a loaded workload is (exit 2 or 1)
    report = check_workload(w, validator="builtin", version=version)
    return {"ok": report["ok"], "validator": report["validator"], "version": report["version"],
            "facts": report["facts"], "release": report["release"],
            "checked_against": "workload" if given else "baseline", "findings": report["findings"]}


# ---------------------------------------------------------------- output
def _output_path(args):
    """Validate --output before any work: never overwrite without --force (exit 2)."""
    if not args.output:
        if args.force:
            raise InputError("--force", "only with --output")
        return None
    path = Path(args.output)
    files.check_target(path, args.force, "--output")
    return path


def _refusal_text(setting, check: dict) -> str:
    lines = [f"refused: {setting.describe()} breaks "
             + ("this workload's" if check["checked_against"] == "workload" else "its own")
             + " constraints:"]
    for f in errors(check["findings"]):
        lines.append(f"  {f['id']}: {f['message']}")
        lines.append(f"    fix: {f['fix']}")
    from mbridge_recompute.output import wrap_all

    return "\n".join(wrap_all(lines))


def run(args) -> int:
    from mbridge_recompute.output import emit, shell_lines, warn
    from mbridge_recompute.write import snippets

    release = args.release
    setting = setting_from_args(args, release)
    out_path = _output_path(args)
    base = None
    if _has_workload(args):
        from mbridge_recompute.inputs.loading import load_from_args

        base = load_from_args(args, release, default=True)   # --set alone: on the embedded default
        setting = with_set_changes(setting, args, base)
    fields = snippets.written_fields(setting)
    wanted = None
    if not args.json or out_path:
        try:
            wanted = snippets.render(setting, args.format)
        except snippets.NotExpressible as exc:
            raise InputError("--format", f"{exc.fmt} cannot express {setting.describe()}: "
                             f"{exc.reason}") from None

    check = check_setting(setting, args, release, base)
    report: dict = {"ok": check["ok"], "setting": fields, "name": setting.slug(),
                    "description": setting.describe(), "check": check}
    if not check["ok"]:
        report["refused"] = errors(check["findings"])
        if args.json:
            emit(report, True, None)
        sys.stderr.write(_refusal_text(setting, check) + "\n")
        return EXIT_PROBLEM

    for f in check["findings"]:
        warn(f"{f['severity']}: {f['id']}: {f['message']} (fix: {f['fix']})")
    if check["checked_against"] == "baseline":
        warn("note: no workload given; checked against a permissive baseline model, so only the "
             "setting's own constraints could fail (give WORKLOAD.yaml or --model for the full check)")

    if out_path:
        files.write(out_path, snippets.as_text(wanted), args.force, "--output")
        sys.stderr.write(f"wrote the {args.format} snippet to {out_path}\n")

    if args.json:
        everything = snippets.render_all(setting)
        unexpressible = everything.pop("unexpressible")
        report["formats"] = everything
        if unexpressible:
            report["unexpressible"] = unexpressible
        report["format"] = args.format
        report["output"] = str(out_path) if out_path else None
        emit(report, True, None)
    elif not out_path:          # a file keeps one line; the terminal gets the width
        sys.stdout.write(snippets.as_text(wanted) if isinstance(wanted, str)
                         else "\n".join(shell_lines(wanted)) + "\n")
    return EXIT_OK
