"""A Bridge performance-harness argument list, read once the way the rank reads it.

The rank scripts parse their arguments with `parse_known_args` on the release's parser
(scripts/performance/argument_parser.py, built with argparse's `allow_abbrev` on) and hand what
is left to Hydra's override parser (`parse_hydra_overrides`,
training/utils/omegaconf_utils.py:163-186 @ megatron-bridge 0.6.2); the flags are applied after
the overrides (run_script.py:76-79 @ v0.6.0). `HarnessArgv.parse` does the same from the flag
table of the release (data/bridge_harness_flags.json, runs/bridge.py), so that every tool asks one
reading: the harness builder (what the release would refuse), check --run (what the command
asked for), compare (whether two commands differ beyond recompute) and diagnose (labels given
twice, -rl beside --recompute_modules).

argparse, as CPython's `_parse_optional`, `_get_option_tuples` and `consume_optional` do it: a
token that starts with '-' is an option unless it is '-', a negative number (the parser has no
option that looks like one) or holds a space; an option is its exact spelling, `--name=value` /
`-x=value`, a unique prefix of a long option (`--recompute_mod`), a short option with its value
attached (`-mllama` for `-m llama`) or a unique prefix of a short one; a prefix that fits two options is an
"ambiguous option" error. A flag takes its values from the tokens that follow (one, an optional
one, or every following value for nargs='*'); a repeated flag keeps its last value unless it
appends. What argparse does not take -- unknown options and their words, every other word, and
everything after '--' -- goes to Hydra in order.

Hydra, as its override grammar reads one token (hydra-core 1.3.2's OverridesParser):
`[~|+|++]key[@package][=value]`; the value `null` (any case) is None, `true` / `false` a bool,
`4`, `-4`, `+4`, `4_000` an int, `1e3`, `inf`, `nan` a float, `'x'` / `"x"` a string, `[a, 'b']` a
list, `{a: 1}` a dict, an empty value the empty string, `a,b` a choice sweep (which a single run
refuses), and anything else the unquoted string with its surrounding blanks dropped.
tests/test_hostile_surfaces.py compares both readings with real argparse and real Hydra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

from mbridge_recompute.facts import bridge_flags

# the scripts that start a rank (or the experiment); what follows one is the harness's own argv
ENTRY_SCRIPTS = ("bootstrap.py", "run_script.py", "run_recipe.py", "setup_experiment.py")
RECOMPUTE_FIELDS = ("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers")
MODULES_FLAG = "--recompute_modules"
LAYERS_FLAG = "--recompute_num_layers"


# ---------------------------------------------------------------- records
@dataclass(frozen=True)
class Flag:
    """An option the release's parser took."""
    name: str                 # the flag's canonical (last, long) spelling: --recompute_modules
    written: str              # the option token as written: --recompute_mod, -rl, --recompute_modules=a
    values: tuple             # its value tokens; () for a switch
    at: int                   # index of its first token
    attached: bool = False    # the value is part of the option token (--x=v, -mllama)

    @property
    def value(self) -> Optional[str]:
        return self.values[-1] if self.values else None

    @property
    def text(self) -> str:
        """The flag as the command wrote it: `--recompute_mod moe_act`, `-rl=2`, `-mllama`."""
        return self.written if self.attached else " ".join((self.written, *self.values))


class Sweep(tuple):
    """A Hydra choice sweep (`a,b`): a list of choices, which a single run does not accept."""


@dataclass(frozen=True)
class Override:
    """A token Hydra reads as an override."""
    op: str                   # "" change, "+" add, "++" force add, "~" delete
    key: str
    value: object             # the parsed value (None, bool, int, float, str, list, dict, Sweep)
    text: Optional[str]       # the value as written, None when there is none (~key)
    token: str
    at: int

    @property
    def field(self) -> Optional[str]:
        """The model field of a `model.X` override, else None."""
        head, _, name = self.key.partition(".")
        return name if head == "model" and name and "." not in name else None


@dataclass(frozen=True)
class Request:
    """One thing the command asked of a recompute field, in the order the rank applies it."""
    field: str
    value: object
    token: str                # what the command said, as written
    source: str               # "hydra" or "flag"


@dataclass
class HarnessArgv:
    tokens: list
    release: str
    head: list = field(default_factory=list)       # launcher and entry script before the harness argv
    flags: list = field(default_factory=list)
    overrides: list = field(default_factory=list)
    left: list = field(default_factory=list)       # the tokens argparse leaves to Hydra, in order
    problems: list = field(default_factory=list)   # what the release's parser or Hydra would refuse

    # ---- reading
    @classmethod
    def parse(cls, tokens, release: str = "main") -> "HarnessArgv":
        """The harness arguments `tokens` (without launcher or entry script) at Bridge `release`."""
        out = cls(tokens=[str(t) for t in tokens], release=release)
        _read(out)
        return out

    @classmethod
    def of_command(cls, argv, release: Optional[str] = None) -> "HarnessArgv":
        """A whole command line (torchrun ... run_script.py ARGS): the harness part after the entry
        script, or every token when no entry script is named (a hand-written manifest)."""
        argv = [str(t) for t in argv]
        cut = next((i + 1 for i, t in enumerate(argv) if t.rsplit("/", 1)[-1] in ENTRY_SCRIPTS), 0)
        out = cls.parse(argv[cut:], release or "main")
        out.head = argv[:cut]
        return out

    # ---- questions
    def given(self, name: str) -> list:
        """Every occurrence of flag `name` (canonical spelling), in order."""
        return [f for f in self.flags if f.name == name]

    def last(self, name: str) -> Optional[Flag]:
        """The occurrence argparse keeps (the last one: a store action overwrites)."""
        hits = self.given(name)
        return hits[-1] if hits else None

    def value(self, name: str) -> Optional[str]:
        f = self.last(name)
        return f.value if f is not None else None

    def has_switch(self, name: str) -> bool:
        return bool(self.given(name))

    @property
    def use_recipes(self) -> bool:
        return self.has_switch("--use_recipes")

    def override(self, key: str) -> list:
        return [o for o in self.overrides if o.key == key]

    def recompute_requests(self) -> list:
        """The recompute requests in the order the rank applies them: Hydra overrides first, then
        the flags (run_script.py:76-79 @ v0.6.0). With --use_recipes the flags are not read
        (run_recipe.py:45-208 @ v0.6.0), so only the overrides count."""
        hydra = [Request(o.field, None if o.op == "~" else _request_value(o.value), o.token, "hydra")
                 for o in self.overrides if o.field in RECOMPUTE_FIELDS]
        if self.use_recipes:
            return hydra
        flags = []
        layers = self.last(LAYERS_FLAG)
        if layers is not None:
            # -rl N is full / block / N, applied before the labels (overrides.py:174-177 @ v0.6.0)
            n = _int_or_text(layers.value)
            flags += [Request("recompute_granularity", "full", layers.text, "flag"),
                      Request("recompute_method", "block", layers.text, "flag"),
                      Request("recompute_num_layers", n, layers.text, "flag")]
        modules = self.last(MODULES_FLAG)
        if modules is not None:
            # list_of_strings: one comma-separated token (argument_parser.py:41-43 @ v0.6.0); the
            # labels, then selective (overrides.py:178-180 @ v0.6.0)
            mods = (modules.value or "").split(",")
            flags += [Request("recompute_modules", mods, modules.text, "flag"),
                      Request("recompute_granularity", "selective", modules.text, "flag")]
        return hydra + flags

    def recompute_flags(self) -> list:
        """The recompute flags as written (they are ignored with --use_recipes)."""
        return [f for f in self.flags if f.name in (MODULES_FLAG, LAYERS_FLAG)]

    def settings(self, skip_flags=(), skip_keys=()) -> dict:
        """{flag name or Hydra key: [values]}: the command as a comparable whole. A flag is named by
        its canonical spelling (so -gb and --global_batch_size are one), an override by its key
        with its value parsed (so [a, b] and ['a','b'] are one); `skip_*` leaves out flags and
        keys (or key prefixes ending in '.' / '_') that do not make two runs differ."""
        out: dict = {}
        for f in self.flags:
            if f.name in skip_flags:
                continue
            out.setdefault(f.name, []).append(" ".join(f.values))
        for o in self.overrides:
            if any(o.key == k or (k.endswith((".", "_")) and o.key.startswith(k)) for k in skip_keys):
                continue
            out.setdefault(o.op + o.key, []).append(repr(o.value))
        return out


# ---------------------------------------------------------------- argparse
@lru_cache(maxsize=None)
def _table(release: str) -> tuple:
    """({spelling: entry}, {canonical: entry}) of the release's harness flags."""
    entries = bridge_flags.flags(release)
    return {sp: e for e in entries for sp in e["flags"]}, {e["flags"][-1]: e for e in entries}


def canonical(entry: dict) -> str:
    return entry["flags"][-1]


def _match(token: str, table: dict):
    """(entry, spelling, attached value or None) as argparse's _parse_optional finds it, ("?", ...)
    for an unknown option, or None when the token is a value. Raises _Ambiguous."""
    if not token or token[0] != "-" or len(token) == 1:
        return None
    if token in table:
        return table[token], token, None
    if "=" in token:
        name, value = token.split("=", 1)
        if name in table:
            return table[name], name, value
    hits = []
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        hits = [(sp, value if eq else None) for sp in table if sp.startswith(name)]
    elif token[1] != "-":
        short, rest = token[:2], token[2:]
        for sp in table:
            if sp == short:
                hits.append((sp, rest))
            elif sp.startswith(token):
                hits.append((sp, None))
    entries = {id(table[sp]) for sp, _ in hits}
    if len(entries) > 1:
        raise _Ambiguous(token, sorted(sp for sp, _ in hits))
    if hits:
        sp, value = hits[0]
        return table[sp], sp, value
    if not is_option(token):
        return None                  # a negative number is a value (no option looks like one)
    if " " in token:
        return None
    return "?", token, None


class _Ambiguous(Exception):
    def __init__(self, token: str, hits: list):
        super().__init__(token)
        self.token, self.hits = token, hits


def _is_value(token: str, table: dict) -> bool:
    try:
        return _match(token, table) is None
    except _Ambiguous:
        return False


def _read(out: HarnessArgv) -> None:
    table, _ = _table(out.release)
    toks = out.tokens
    rest: list = []                  # (index, token) argparse leaves over, in order
    reported: set = set()            # indices whose refusal is already a problem
    seen: dict = {}
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok == "--":
            # no positional takes it: '--' and everything after it are left over, '--' included
            rest += [(j, toks[j]) for j in range(i, len(toks))]
            break
        try:
            hit = _match(tok, table)
        except _Ambiguous as amb:
            out.problems.append(f"{tok!r}: ambiguous option at Bridge {out.release}: could match "
                                f"{', '.join(amb.hits[:6])}")
            i += 1
            continue          # argparse stops here ("ambiguous option"); the rest is still read
        if hit is None:
            rest.append((i, tok))
            i += 1
            continue
        entry, written, attached = hit
        if entry == "?":
            out.problems.append(f"{tok!r}: not a flag of this release's harness at Bridge {out.release}; the "
                                "rank would hand it to Hydra, which cannot parse it")
            reported.add(i)
            rest.append((i, tok))
            i += 1
            continue
        i = _take(out, table, seen, entry, tok, written, attached, i)
    out.left = [tok for _, tok in rest]
    for at, tok in rest:
        o, why = parse_override(tok, at)
        if o is not None:
            out.overrides.append(o)
        if why and at not in reported:
            out.problems.append(why)


def _take(out: HarnessArgv, table: dict, seen: dict, entry, tok: str, written: str, attached, i: int) -> int:
    """Record the flag at token i (and what it consumes, as argparse's consume_optional does);
    the index of the next token to read."""
    toks = out.tokens
    while True:
        kind = entry["value"]
        if attached is not None and kind == "none":
            if written[1] != "-" and attached != "":
                # single-dash switches combine: -dm x is -d then -m x
                _record(out, seen, entry, tok, (), i, True)
                written, attached = "-" + attached[0], attached[1:] or None
                if written in table:
                    entry = table[written]
                    continue
            out.problems.append(f"{tok!r}: {entry['flags'][-1]} takes no value (argparse: ignored explicit "
                                "argument)")
            return i + 1
        if attached is not None:
            _record(out, seen, entry, tok, (attached,), i, True)
            return i + 1
        j, values = i + 1, []
        if kind == "one":
            if j >= len(toks) or toks[j] == "--" or not _is_value(toks[j], table):
                out.problems.append(f"{tok!r} needs a value (argparse: expected one argument)")
                return i + 1
            values, j = [toks[j]], j + 1
        elif kind == "optional":
            if j < len(toks) and toks[j] != "--" and _is_value(toks[j], table):
                values, j = [toks[j]], j + 1
        elif kind == "many":
            while j < len(toks) and toks[j] != "--" and _is_value(toks[j], table):
                values.append(toks[j])
                j += 1
        _record(out, seen, entry, tok, tuple(values), i, False)
        return j


def _record(out: HarnessArgv, seen: dict, entry, tok: str, values: tuple, at: int, attached: bool) -> None:
    flag = Flag(canonical(entry), tok, values, at, attached)
    out.flags.append(flag)
    choices = entry.get("choices")
    if choices and flag.values:
        allowed = ["None" if c is None else str(c) for c in choices]
        if flag.values[-1] not in allowed:
            out.problems.append(f"{tok} {flag.values[-1]!r}: invalid choice at Bridge {out.release} "
                                f"(choose from {', '.join(allowed)})")
    if flag.name in seen and not entry.get("append"):
        out.problems.append(f"{flag.name} is given twice ({seen[flag.name]!r} and {tok!r}): argparse keeps "
                            "only the last; give it once (a list flag takes one comma-separated token)")
    seen.setdefault(flag.name, tok)


# ---------------------------------------------------------------- Hydra
_KEY = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-./]*(?:@[\w\-.]*)?)(=|$)")
_INT = re.compile(r"^[+-]?(?:0|[1-9](?:_?\d)*)$")
_FLOAT = re.compile(r"^[+-]?(?:(?:\d(?:_?\d)*)?\.\d(?:_?\d)*(?:[eE][+-]?\d+)?|\d(?:_?\d)*\.?(?:[eE][+-]?\d+)"
                    r"|\d(?:_?\d)*\.|inf|nan)$", re.I)


def _bare_word(token: str) -> str:
    return (f"{token!r} is neither a harness flag nor a key=value override: the rank hands it to Hydra, "
            f"which fails (\"Error parsing override {token!r} missing EQUAL\"); labels go in one "
            "comma-separated token (--recompute_modules a,b)")


def parse_override(token: str, at: int = 0) -> tuple:
    """(Override or None, why Hydra would refuse it or "") for one token Hydra reads."""
    m = _KEY.match(token)
    if not m:
        return None, _bare_word(token)
    op, key, eq = m.group(1) or "", m.group(2), m.group(3)
    key = key.split("@", 1)[0]
    if not eq:
        if op != "~":
            return None, _bare_word(token)
        return Override(op, key, None, None, token, at), ""
    text = token[m.end():]
    try:
        value = parse_value(text)
    except ValueError as exc:
        return Override(op, key, text, text, token, at), f"{token!r}: Hydra cannot parse the value ({exc})"
    why = ""
    if isinstance(value, Sweep):
        why = (f"{token!r}: Hydra reads {text!r} as a sweep over {len(value)} values, which a single run "
               "refuses; a list is written [a,b]")
    return Override(op, key, value, text, token, at), why


_EMPTY = object()          # an element with nothing in it (`a,` or `,b`): Hydra refuses it in a sweep
# what a backslash escapes in an unquoted value (hydra's OverrideLexer ESC); before anything else
# the backslash is kept as it is
_ESCAPABLE = set("\\()[]{}:=, \t")


def parse_value(text: str):
    """One Hydra override value (see the module docstring); ValueError when Hydra refuses it."""
    items, pos = _elements(text, 0, top=True)
    if pos != len(text):
        raise ValueError(f"unexpected {text[pos]!r}")
    if len(items) > 1:
        if any(v is _EMPTY for v in items):
            raise ValueError("an empty choice in a sweep")
        return Sweep(items)
    return "" if items[0] is _EMPTY else items[0]


def _elements(text: str, pos: int, top: bool) -> tuple:
    """Comma-separated elements from `pos` up to the closing bracket (or the end at the top)."""
    items = []
    while True:
        start = _blank(text, pos)
        value, pos = _element(text, pos, top)
        items.append(value)
        after = _blank(text, pos)
        if after < len(text) and text[after] == ",":
            pos = after + 1
            continue
        if top and after == len(text) and after > pos and text[start] in "[{'\"":
            # a quoted, list or dict value ends the override: Hydra takes no blank after it
            raise ValueError("a blank after the value")
        return items, after


def _blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _element(text: str, pos: int, top: bool):
    pos = _blank(text, pos)
    if pos >= len(text):
        return _EMPTY, pos
    c = text[pos]
    if c == "[":
        pos = _blank(text, pos + 1)
        if pos < len(text) and text[pos] == "]":
            return [], pos + 1
        items, pos = _elements(text, pos, top=False)
        if pos >= len(text) or text[pos] != "]":
            raise ValueError("a list without its closing ]")
        if any(v is _EMPTY for v in items):
            raise ValueError("an empty list element")
        return items, pos + 1
    if c == "{":
        depth, j = 0, pos
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                return _dict(text[pos:j]), j
        raise ValueError("a dict without its closing }")
    if c in "'\"":
        j, out = pos + 1, []
        while j < len(text) and text[j] != c:
            if text[j] == "\\" and j + 1 < len(text) and text[j + 1] == c:
                j += 1
            out.append(text[j])
            j += 1
        if j >= len(text):
            raise ValueError("a quoted string without its closing quote")
        return "".join(out), j + 1
    j, out, escaped = pos, [], set()     # escaped: positions of `out` a backslash protects
    stops = "," if top else ",]"
    while j < len(text) and text[j] not in stops:
        ch = text[j]
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in _ESCAPABLE:
            escaped.add(len(out))
            out.append(text[j + 1])
            j += 2
            continue
        if ch == "$" and text.startswith("${", j):
            end = text.find("}", j)
            if end < 0 or not text[j + 2:end].strip():
                raise ValueError("an interpolation without a name or its closing }")
            out.append(text[j:end + 1])
            j = end + 1
            continue
        if ch in "=[]{}'\"()":
            raise ValueError(f"unexpected {ch!r}")
        out.append(ch)
        j += 1
    # one blank run is dropped at each end, but an escaped blank stays, and a colon keeps the
    # blanks around it (the lexer's COLON token holds them)
    head = 0
    while head < len(out) and out[head] in " \t" and head not in escaped:
        head += 1
    end = len(out)
    while end > head and out[end - 1] in " \t" and end - 1 not in escaped:
        end -= 1
    if end < len(out) and end > head and out[end - 1] == ":" and end - 1 not in escaped:
        end = len(out)
    if head and head < len(out) and out[head] == ":":
        head = 0
    word = "".join(out[head:end])
    return (_primitive(word) if word else _EMPTY), j


def _lead_until(out: list, kept: int) -> int:
    """Blanks at the start of `out` before the escaped character at `kept`."""
    n = 0
    while n < kept and out[n] in " \t":
        n += 1
    return n


def _primitive(word: str):
    low = word.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(word):
        return int(word.replace("_", ""))
    if _FLOAT.match(word):
        return float(word.replace("_", ""))
    return word


def _dict(text: str) -> dict:
    """A flow mapping `{a: 1, b: [x]}` (its values read as Hydra values)."""
    inner = text[1:-1].strip()
    out: dict = {}
    if not inner:
        return out
    depth, start, parts = 0, 0, []
    for j, ch in enumerate(inner):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:j])
            start = j + 1
    parts.append(inner[start:])
    for part in parts:
        k, colon, v = part.partition(":")
        if not colon or not k.strip() or any(ch in k for ch in "[]{}'\"=(),"):
            raise ValueError("a dict entry without 'key: value'")
        out[k.strip().strip("'\"")] = parse_value(v.strip())
    return out


def _request_value(value):
    return list(value) if isinstance(value, Sweep) else value


def _int_or_text(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return text


def is_option(tok: str) -> bool:
    """Whether a token of a run's command line is an option (`-x`, `--flag`, `--k=v`) rather
    than a value: a lone `-` and negative numbers (`-1`, `-1e-5`) are values."""
    if not tok.startswith("-") or len(tok) == 1:
        return False
    try:
        float(tok)
        return False
    except ValueError:
        return True


def check_passthrough(tokens: list, key: str) -> list:
    """Problems a release's harness parser (or Hydra, which gets what the parser leaves) would hit
    with `tokens`, before any GPU time, read as the rank reads them."""
    return HarnessArgv.parse(tokens, key).problems
