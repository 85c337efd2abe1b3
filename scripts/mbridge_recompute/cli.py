"""`mbridge-recompute <subcommand>`: one dispatcher for every tool.

Each subcommand lives in `commands/<name>.py` with `add_arguments(parser)` and
`run(args) -> int`. Only the chosen subcommand's module is imported, so start-up
stays light (no torch, no megatron) for every tool that does not need them.

The exit-code and JSON contract is kept here, once, for every tool
(references/cli-reference.md, "Conventions"):

* an `InputError` (exit 2) or `Rejected` (exit 1) becomes one `error: FIELD: REASON` line on
  stderr and, with `--json`, one `{"error": {"field", "message", "exit"}}` object on stdout;
  argparse's own errors (unknown option, bad value) take the same path;
* `note:` lines a tool wrote to stderr before it failed are dropped, so a failure prints exactly
  one line there (a note is kept when anything else follows it, or when the tool succeeds);
* input that defeats a reader anyway (nesting past the recursion limit, an integer past
  Python's 4300-digit conversion limit, more data than memory) is bad input, not a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
from pathlib import Path

from mbridge_recompute import __version__
from mbridge_recompute.errors import EXIT_BAD_INPUT, InputError
from mbridge_recompute.output import WIDTH, width

# name -> (module, one-line help). Order is the order of the help text.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "per-rank memory estimate, per-label saving and cost, recommended setting"),
    "config": ("config", "write a recompute setting as python / yaml / overrides / harness / mlm"),
    "check": ("check", "check a workload's recompute setting against every known constraint"),
    "harness": ("harness", "build (and with --launch, run) a matched Bridge performance-harness sweep"),
    "compare": ("compare", "compare run logs against the matched control"),
    "diagnose": ("diagnose", "classify an OOM or recompute error from a log or a message"),
    "tests": ("tests", "run recompute-focused tests and judge them (zero selected is a failure)"),
    "tune": ("tune", "run the loop plan -> run -> measure -> calibrate until the cheapest setting passes"),
}
EXIT_INTERRUPTED = 130

# argparse: "argument --timeout: invalid float value: 'x'", "unrecognized arguments: --x y",
# "the following arguments are required: --repo, --candidates"
_ARG_FIELD = re.compile(r"^argument ([^:]+?)(?:/[^:]*)?: ")
_REQUIRED = re.compile(r"^the following arguments are required: ([^,\s]+)")
_UNRECOGNISED = re.compile(r"^unrecognized arguments: (\S+)")


class _Shown(Exception):
    """--help or --version was asked for: what to print (as text, or as one JSON object)."""

    def __init__(self, key: str, text: str):
        super().__init__(key)
        self.key, self.text = key, text


class _HelpAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        raise _Shown("help", parser.format_help())


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, version: str, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.version = version

    def __call__(self, parser, namespace, values, option_string=None):
        raise _Shown("version", self.version)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors go through the one error path (exit 2, one line, JSON with --json),
    and whose --help and --version print one JSON object with --json (`_Shown`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, add_help=False, **kwargs)
        self.add_argument("-h", "--help", action=_HelpAction, help="show this help message and exit")

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        field = self.prog
        for pattern in (_ARG_FIELD, _REQUIRED, _UNRECOGNISED):
            m = pattern.match(message)
            if m:
                field = m.group(1)
                break
        raise InputError(field, message if field == self.prog else f"{message} ({self.prog})")


class _NoteGate:
    """stderr that holds back `note:` lines until something else is written or the tool ends.

    A failing tool then prints its one error line alone; on success the notes come out in order.
    Everything that is not a note (pytest output, launch progress) passes straight through. A
    note wrapped to the text width (output.warn) is held whole: its indented continuation
    lines go with it.
    """

    def __init__(self, inner):
        self.inner = inner
        self.pending: list[str] = []
        self.partial = ""
        self.in_note = False

    def write(self, text: str) -> int:
        self.partial += text
        while "\n" in self.partial:
            line, self.partial = self.partial.split("\n", 1)
            self._line(line + "\n")
        return len(text)

    def _line(self, line: str) -> None:
        if line.startswith("note:") or (self.in_note and line.startswith(" ")):
            self.in_note = True
            self.pending.append(line)
            return
        self.in_note = False
        self._release()
        self.inner.write(line)

    def _release(self) -> None:
        for note in self.pending:
            self.inner.write(note)
        self.pending.clear()

    def flush(self) -> None:
        if self.partial and not self.partial.startswith("note:"[:len(self.partial)]):
            self._release()
            self.inner.write(self.partial)
            self.partial = ""
        self.inner.flush()

    def close_gate(self, drop_notes: bool) -> None:
        if drop_notes:
            self.pending.clear()
        else:
            self._release()
        if self.partial and not (drop_notes and self.partial.startswith("note:")):
            self.inner.write(self.partial)
        self.partial = ""
        self.inner.flush()

    def __getattr__(self, name):          # fileno, isatty, encoding, buffer ...
        return getattr(self.inner, name)


def _top_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mbridge-recompute",
        description="Activation recompute for Megatron Bridge / Megatron-Core.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands:\n" + "\n".join(f"  {n:<9} {h}" for n, (_, h) in SUBCOMMANDS.items())
        + "\n\nRun 'mbridge-recompute <subcommand> --help' for its options.",
    )
    p.add_argument("--version", action=_VersionAction, version=f"mbridge-recompute {__version__}")
    p.add_argument("--json", action="store_true", help="print one JSON object (help, version or error)")
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
                     epilog=getattr(module, "EPILOG", None), usage=getattr(module, "USAGE", None))
    module.add_arguments(parser)
    parser.add_argument("--wide", action="store_true",
                        help="text: one line per sentence and per table row, however long "
                             "(default: fit %d columns)" % WIDTH)
    return parser, module


def wants_json(argv: list) -> bool:
    """Whether the command line asks for JSON (before any `--`; argparse also takes `--js`)."""
    for tok in argv:
        if tok == "--":
            return False
        if len(tok) >= 4 and "--json".startswith(tok):
            return True
    return False


def _limit_error(exc: BaseException):
    """The InputError for input that defeated a reader, or None when `exc` is not such a case."""
    if isinstance(exc, RecursionError):
        return InputError("input", "nested too deeply to read (more levels than the reader allows)")
    if isinstance(exc, MemoryError):
        return InputError("input", "too large to hold in memory")
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return InputError("input", "holds an integer with more than 4300 digits")
    return None


def _run(argv: list) -> int:
    if not argv:
        raise _Shown("help", _top_parser().format_help())
    if argv[0] not in SUBCOMMANDS:
        # no subcommand: its --help / --version, or one error line (JSON with --json)
        _top_parser().parse_args(argv)
        raise InputError("subcommand", f"required: one of {', '.join(SUBCOMMANDS)}")
    parser, module = build_parser(argv[0])
    rest, tail = argv[1:], None
    # what a bare -- hands over: a Megatron-LM argument list (`plan.py [options] [--mlm-args] --
    # ARGS`, inputs/mlm_args.py: read after any --mlm-args FILE), or the arguments a tool names as
    # its TAIL (tune's harness arguments)
    tail_dest = getattr(module, "TAIL", None) or (
        "mlm_argv" if any(a.dest == "mlm_args" for a in parser._actions) else None)
    if "--" in rest and tail_dest:
        cut = rest.index("--")
        rest, tail = rest[:cut], rest[cut + 1:]
        if tail_dest == "mlm_argv" and rest[-1:] == ["--mlm-args"]:
            rest = rest[:-1]
    args = parser.parse_args(rest)
    _refuse_empty(parser, args, foreign={tail_dest, "passthrough", "extra"})
    if tail is not None:
        setattr(args, tail_dest, tail)
    release = contextlib.nullcontext()
    if hasattr(args, "mcore_version"):
        # the release is resolved here, once, and the tool runs with it (args.release and
        # releases.current()); nothing below resolves --mcore-version again
        from mbridge_recompute.facts import releases

        args.release = releases.target(args.mcore_version)
        release = releases.using(args.release)
    with width(None if args.wide else WIDTH), release:
        return module.run(args)


def _refuse_empty(parser, args, foreign: set) -> None:
    """An option or argument given as '' (or only blanks) is not silently the default: exit 2.
    `foreign` names the arguments handed to another program (after a bare --)."""
    for action in parser._actions:
        if action.dest in foreign or action.dest is argparse.SUPPRESS or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in items) and value is not action.default:
            names = action.option_strings or [action.metavar or action.dest]
            raise InputError(str(next((o for o in names if str(o).startswith("--")), names[0])), "is empty")


def _fail(exc: InputError, as_json: bool) -> int:
    sys.stderr.write(exc.line() + "\n")
    if as_json:
        sys.stdout.write(json.dumps(exc.to_dict()) + "\n")
    return exc.exit_code


# The packages every tool imports (pyproject's dependencies). An agent's interpreter after
# `npx skills add` may hold none of them, and a traceback deep in the card loader is no way to
# say so: the tool names them in one line instead (exit 2).
REQUIRED_PACKAGES = (("yaml", "pyyaml"), ("jinja2", "jinja2"), ("packaging", "packaging"))


def _require_packages() -> None:
    import importlib.util

    missing = [pip for module, pip in REQUIRED_PACKAGES if importlib.util.find_spec(module) is None]
    if missing:
        raise InputError("python", f"{sys.executable} lacks {', '.join(missing)}: install with "
                                   f"`{Path(sys.executable).name} -m pip install {' '.join(missing)}`")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv[1:] if argv and argv[0] in SUBCOMMANDS else argv)
    gate = _NoteGate(sys.stderr)
    sys.stderr = gate
    failed = False
    try:
        try:
            _require_packages()
            code = _run(argv)
        except (RecursionError, MemoryError, ValueError) as exc:
            limit = _limit_error(exc)
            if limit is None:
                raise
            raise limit from None
    except _Shown as shown:
        gate.close_gate(drop_notes=True)
        if as_json:
            sys.stdout.write(json.dumps({shown.key: shown.text}) + "\n")
        else:
            sys.stdout.write(shown.text if shown.text.endswith("\n") else shown.text + "\n")
        code = 0
    except InputError as exc:
        failed = True
        gate.close_gate(drop_notes=True)
        code = _fail(exc, as_json)
    except KeyboardInterrupt:
        failed = True
        gate.close_gate(drop_notes=False)
        sys.stderr.write("error: interrupted\n")
        if as_json:
            sys.stdout.write(json.dumps({"error": {"field": None, "message": "interrupted",
                                                   "exit": EXIT_INTERRUPTED}}) + "\n")
        code = EXIT_INTERRUPTED
    finally:
        if not failed:
            gate.close_gate(drop_notes=False)
        sys.stderr = gate.inner
    sys.stdout.flush()
    sys.exit(code)


__all__ = ["EXIT_BAD_INPUT", "SUBCOMMANDS", "build_parser", "main", "wants_json"]
