"""`mbridge-recompute <subcommand>`: one dispatcher for every tool.

Each subcommand lives in `commands/<name>.py` with `add_arguments(parser)` and
`run(args) -> int`. Only the chosen subcommand's module is imported, so start-up
stays light (no torch, no megatron) for every tool that does not need them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from mbridge_recompute import __version__
from mbridge_recompute.errors import EXIT_BAD_INPUT, InputError

# name -> (module, one-line help). Order is the order of the help text.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "per-rank memory estimate, per-label saving and cost, recommended setting"),
    "config": ("config", "write a recompute setting as python / yaml / overrides / harness / mlm"),
    "check": ("check", "check a workload's recompute setting against every known constraint"),
    "harness": ("harness", "build (and with --launch, run) a matched Bridge performance-harness sweep"),
    "compare": ("compare", "compare run logs against the matched control"),
    "diagnose": ("diagnose", "classify an OOM or recompute error from a log or a message"),
    "tests": ("tests", "run recompute-focused tests and judge them (zero selected is a failure)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line (no usage dump) on bad options."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message}\n")


def _top_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mbridge-recompute",
        description="Activation recompute for Megatron Bridge / Megatron-Core.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands:\n" + "\n".join(f"  {n:<9} {h}" for n, (_, h) in SUBCOMMANDS.items())
        + "\n\nRun 'mbridge-recompute <subcommand> --help' for its options.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("subcommand", choices=list(SUBCOMMANDS), metavar="subcommand")
    return p


def _prog(name: str) -> str:
    """What the user ran: `check_config.py` for the script, `mbridge-recompute check` otherwise."""
    ran = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return ran if ran.endswith(".py") and ran != "__main__.py" else f"mbridge-recompute {name}"


def build_parser(name: str):
    """The parser of one subcommand and its module."""
    module_name, help_line = SUBCOMMANDS[name]
    module = importlib.import_module(f"mbridge_recompute.commands.{module_name}")
    prog = _prog(name)
    parser = _Parser(prog=prog, description=getattr(module, "DESCRIPTION", help_line),
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog=getattr(module, "EPILOG", None))
    module.add_arguments(parser)
    return parser, module


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        _top_parser().parse_args(argv[:1] if argv else ["--help"])
        return
    parser, module = build_parser(argv[0])
    rest, mlm_argv = argv[1:], None
    if "--" in rest and any(a.dest == "mlm_args" for a in parser._actions):
        # `plan.py [options] -- ARGS`: a Megatron-LM argument list after a bare -- (inputs/mlm_args.py)
        cut = rest.index("--")
        rest, mlm_argv = rest[:cut], rest[cut + 1:]
    args = parser.parse_args(rest)
    if mlm_argv is not None:
        args.mlm_args = mlm_argv
    try:
        code = module.run(args)
    except InputError as exc:
        sys.stderr.write(exc.line() + "\n")
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    sys.exit(code)
