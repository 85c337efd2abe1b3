"""Add a megatron-core release to the card in one command (a maintainer tool; nothing imports it
at run time).

    python tests/tools/add_release.py --key 0.20 --tag core_v0.20.0            # from the git mirror
    python tests/tools/add_release.py --key 0.19 --package ENV_DIR --version 0.19.2 --tag core_v0.19.0
    ... --bridge v0.7.0 --bridge-key 0.7                                        # and a Bridge tag
    ... --write                                                                 # change the data files

What it does, reading upstream files only (no import of megatron, so no torch):
1. Every card constraint that holds in the release before the new one (`--from`, default the
   newest numbered release) is re-found in the new release by the text of the lines its site
   cites there: the same lines (stripped) are searched in the same file of the new tree, the
   nearest match where several exist (by the shift the unique matches of that file show), then
   in every other file the card abbreviates (a check that moved file). The result is the new
   `at` entry, or a report that it moved or vanished.
2. The recompute and offload label sets are read from the new TransformerConfig's
   `allowed_modules` literals; label ranges and the offload_modules enum follow.
3. The field lists (TransformerConfig, MLATransformerConfig with ModelParallelConfig's fields,
   DistributedDataParallelConfig, OptimizerConfig) are read from the class bodies, for
   data/upstream_fields.json.
4. The card's `releases:` entry is written from the package metadata (version, Requires-Python)
   or the tag (commit, date); what cannot be read without running the code
   (te_version_without_te) is carried over from the previous release and said so.
5. With `--bridge TAG`: the Bridge harness parser's flags at that tag (every add_argument of
   scripts/performance/argument_parser.py: spellings, arity, choices, required, append, line),
   for data/bridge_harness_flags.json, and which of the card's Bridge recompute tests exist there.

Then the live differential decides (tests/test_releases.py, after tests/envs/build.sh has built
an environment for the release): the built-in rules must give megatron-core's own verdicts.
Without --write it prints what it would change (text, or --json) and exits 0; a constraint it
could not re-find makes the exit 1 so that someone looks.
"""

from __future__ import annotations

import argparse
import ast
import email
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from mirrors import BRIDGE_MIRROR, MLM_MIRROR  # noqa: E402

from mbridge_recompute.facts import card  # noqa: E402

DATA = ROOT / "scripts" / "mbridge_recompute" / "data"
TC = "megatron/core/transformer/transformer_config.py"


# ---------------------------------------------------------------- upstream trees
class Tree:
    """The upstream files of one release: a git ref of a mirror, or a directory (a checkout, or
    the site directory of an installed package, which holds megatron/core/...)."""

    def __init__(self, git: Optional[Path] = None, ref: Optional[str] = None, root: Optional[Path] = None):
        self.git, self.ref, self.root = git, ref, root
        self._cache: dict = {}

    @property
    def name(self) -> str:
        return f"{self.ref} ({self.git})" if self.git else str(self.root)

    def text(self, path: str) -> Optional[str]:
        if path not in self._cache:
            if self.git:
                p = subprocess.run(["git", "--git-dir", str(self.git), "show", f"{self.ref}:{path}"],
                                   capture_output=True, text=True)
                self._cache[path] = p.stdout if p.returncode == 0 else None
            else:
                f = self.root / path
                self._cache[path] = f.read_text(encoding="utf-8") if f.is_file() else None
        return self._cache[path]

    def lines(self, path: str) -> Optional[list]:
        t = self.text(path)
        return None if t is None else t.splitlines()

    def git_value(self, *args: str) -> Optional[str]:
        if not self.git:
            return None
        p = subprocess.run(["git", "--git-dir", str(self.git), *args], capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None


# ---------------------------------------------------------------- re-finding cited lines
def _norm(lines: list) -> list:
    return [ln.strip() for ln in lines]


def _find(block: list, lines: list) -> list:
    """Start indices (0-based) where the stripped `block` occurs in `lines`."""
    k, nb = len(block), _norm(block)
    nl = _norm(lines)
    first = nb[0]
    return [i for i in range(len(nl) - k + 1) if nl[i] == first and nl[i:i + k] == nb]


@dataclass
class Refound:
    cid: str
    old: str                               # the site in the previous release
    new: Optional[str] = None              # the site in the new release, or None
    status: str = "vanished"               # same | moved | vanished
    note: str = ""


@dataclass
class ReleaseChange:
    key: str
    previous: str
    tree: str
    refound: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    offload_modules: list = field(default_factory=list)
    fields: dict = field(default_factory=dict)
    release_entry: dict = field(default_factory=dict)
    bridge: dict = field(default_factory=dict)

    @property
    def at(self) -> dict:
        return {r.cid: r.new for r in self.refound if r.new}

    @property
    def lost(self) -> list:
        return [r for r in self.refound if r.new is None]

    def to_dict(self) -> dict:
        return {"key": self.key, "previous": self.previous, "tree": self.tree,
                "at": self.at, "refound": [r.__dict__ for r in self.refound], "labels": self.labels,
                "offload_modules": self.offload_modules, "release": self.release_entry,
                "fields": {k: len(v) for k, v in self.fields.items()},
                "bridge": {k: v for k, v in self.bridge.items() if k != "flags"}}


def _abbr_of(path: str, legend: dict) -> str:
    """The card's name for `path`: its abbreviation, else the path below megatron/core/."""
    for abbr, p in legend.items():
        if p == path:
            return abbr
    return path.removeprefix("megatron/core/")


class _Lost(Exception):
    pass


class _Finder:
    """Re-finds the ranges of sites of `old` in `new`, learning each file's line shift from the
    ranges that match once."""

    def __init__(self, old: Tree, new: Tree):
        self.old, self.new = old, new
        self.legend = card.load()["abbreviations"]
        self.shifts: dict = {}

    def learn(self, sites) -> None:
        for s in sites:
            for part in (s, s.caller):
                if part is None:
                    continue
                path = part.path(self.legend)
                old, new = self.old.lines(path), self.new.lines(path)
                for a, b in part.ranges if old and new else ():
                    found = _find(old[a - 1:b], new)
                    if len(found) == 1:
                        self.shifts.setdefault(path, []).append(found[0] + 1 - a)

    def _range(self, path: str, a: int, b: int, notes: list) -> tuple:
        """(the card name of the file it is in now, first line) of old lines a-b of `path`."""
        old = self.old.lines(path)
        if old is None:
            raise _Lost(f"{path} is not in {self.old.name}")
        block = old[a - 1:b]
        found = _find(block, self.new.lines(path) or [])
        if len(found) > 1:
            seen = sorted(self.shifts.get(path, [0]))
            shift = seen[len(seen) // 2]
            notes.append(f"{len(found)} matches of lines {a}-{b}, the nearest taken")
            found = [min(found, key=lambda i: abs(i + 1 - (a + shift)))]
        if found:
            return None, found[0] + 1
        # a check whose file moved: every other file the card abbreviates
        elsewhere = [(other, i) for other in sorted(set(self.legend.values()) - {path})
                     for i in _find(block, self.new.lines(other) or [])]
        if len(elsewhere) == 1:
            other, i = elsewhere[0]
            return _abbr_of(other, self.legend), i + 1
        first = next((ln.strip() for ln in block if ln.strip()), "")
        raise _Lost(f"lines {a}-{b} of {path} ({first[:60]!r}) are in no file of {self.new.name}"
                    + (f" ({len(elsewhere)} places elsewhere)" if elsewhere else ""))

    def site(self, s: card.Site, notes: list) -> tuple:
        """(the site in the new release, whether it moved)."""
        moved, parts = False, []
        for part in (s, s.caller):
            if part is None:
                continue
            name, ranges = part.file, []
            for a, b in part.ranges:
                now, start = self._range(part.path(self.legend), a, b, notes)
                if now:
                    notes.append(f"{part.file} -> {now}")
                    name = now
                ranges.append((start, start + (b - a)))
                moved |= start != a or name != part.file
            parts.append(card.Site(name, tuple(ranges)))
        if len(parts) > 1:
            parts[0] = parts[0]._replace(caller=parts[1])
        return parts[0], moved


def refind_sites(old: Tree, new: Tree, sites: dict) -> dict:
    """{name: (new site text or None, same | moved | vanished, note)} for `sites`, each the
    text of a site of `old` ({name: 'tc:1093-1095', ...})."""
    parsed = {name: card.site(text) for name, text in sites.items()}
    finder = _Finder(old, new)
    finder.learn(parsed.values())
    out = {}
    for name, s in parsed.items():
        notes: list = []
        try:
            found, moved = finder.site(s, notes)
        except _Lost as lost:
            out[name] = (None, "vanished", str(lost))
            continue
        out[name] = (found.text(), "moved" if moved else "same", "; ".join(notes))
    return out


# ---------------------------------------------------------------- what the source says
def label_sets(tc_source: str) -> dict:
    """The recompute_modules and offload_modules sets of a TransformerConfig source (the
    `allowed_modules` literals of __post_init__), as rules/differential.installed_label_sets reads
    an installed one."""
    tree = ast.parse(tc_source)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "allowed_modules"
                                                for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            if isinstance(value, (ast.Set, ast.List, ast.Tuple)):
                found = [e.value for e in value.elts if isinstance(e, ast.Constant)]
                key = "recompute_modules" if "mla_up_proj" in found else \
                    "offload_modules" if "attn_norm" in found else None
                if key:
                    out[key] = found
    return out


def _default(node) -> Optional[dict]:
    """A dataclass field default as upstream_fields.json writes it (tests/tools/
    gen_upstream_fields.py `_plain`), read from the source: a literal, an enum member, a torch
    dtype or a `field(default=...)` / `field(default_factory=list|dict|tuple)`; None otherwise."""
    if node is None:
        return None
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        kw = {k.arg: k.value for k in node.keywords}
        if "default" in kw:
            return _default(kw["default"])
        factory = getattr(kw.get("default_factory"), "id", None)
        return {"value": {"list": [], "tuple": [], "dict": None}.get(factory)} \
            if factory in ("list", "tuple") else None
    if isinstance(node, ast.Attribute):
        if getattr(node.value, "id", None) == "torch":
            return {"dtype": node.attr}
        if isinstance(node.value, ast.Name) and re.fullmatch(r"[A-Z][a-z]\w*", node.value.id):
            return {"enum": node.attr}           # AttnBackend.auto, not F.gelu
        return None
    try:
        value = _constant(node)
    except (ValueError, TypeError):
        return None
    if isinstance(value, float) and value != value:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return {"value": list(value)}
    return None


_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
          ast.Pow: lambda a, b: a ** b}


def _constant(node):
    """A literal, or integer arithmetic on literals (1024 * 1024)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        a, b = _constant(node.left), _constant(node.right)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
            raise ValueError("not integer arithmetic")
        return _ARITH[type(node.op)](a, b)
    return ast.literal_eval(node)


def _class_bodies(source: str) -> tuple:
    """({class: [(field, default node)]}, {class: [base names]}) of a module's dataclasses."""
    tree = ast.parse(source)
    own, bases = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            own[node.name] = [(n.target.id, n.value) for n in node.body
                              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                              and "ClassVar" not in ast.unparse(n.annotation)]
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    return own, bases


def _fields_of(name: str, bodies: list) -> dict:
    """{field: default node} of class `name`, its bases' first (a subclass redefines)."""
    own, bases = {}, {}
    for o, b in bodies:
        own.update(o)
        bases.update(b)
    out: dict = {}
    for base in reversed(bases.get(name, [])):
        out.update(_fields_of(base, bodies))
    out.update(dict(own.get(name, [])))
    return out


def field_lists(tree: Tree) -> dict:
    """upstream_fields.json's part of one release, read from the class bodies (dataclass fields
    with their bases', private ones included as dataclasses.fields lists them)."""
    tc = _class_bodies(tree.text(TC))
    mpc = _class_bodies(tree.text("megatron/core/model_parallel_config.py"))
    ddp = _class_bodies(tree.text("megatron/core/distributed/distributed_data_parallel_config.py"))
    opt = _class_bodies(tree.text("megatron/core/optimizer/optimizer_config.py"))
    transformer = _fields_of("TransformerConfig", [mpc, tc])
    defaults = {k: d for k, node in transformer.items() if (d := _default(node)) is not None}
    return {"TransformerConfig": sorted(transformer),
            "MLATransformerConfig": sorted(_fields_of("MLATransformerConfig", [mpc, tc])),
            "DistributedDataParallelConfig": sorted(_fields_of("DistributedDataParallelConfig", [ddp])),
            "OptimizerConfig": sorted(_fields_of("OptimizerConfig", [opt])),
            "TransformerConfig_defaults": defaults}


def release_entry(tree: Tree, previous: dict, version: Optional[str], tag: str) -> dict:
    """The card's `releases:` entry: from the package metadata where there is one, else the tag."""
    meta = None
    if tree.root is not None:
        infos = sorted(tree.root.glob("megatron_core-*.dist-info/METADATA"))
        if infos:
            meta = email.message_from_string(infos[-1].read_text(encoding="utf-8"))
    version = version or (meta["Version"] if meta else None) or tag.removeprefix("core_v")
    entry = {"newest": version, "tag": tag}
    mirror = Tree(MLM_MIRROR, tag)
    commit = mirror.git_value("rev-parse", "--short=7", f"{tag}^{{commit}}")
    if commit:
        entry["commit"] = commit
        entry["date"] = mirror.git_value("log", "-1", "--format=%cs", tag)
    python = meta["Requires-Python"] if meta else None
    if python is None:
        m = re.search(r'requires-python\s*=\s*"([^"]+)"', mirror.text("pyproject.toml") or "")
        python = m.group(1) if m else None
    if python:
        entry["python"] = python.replace(" ", "")
    minor = ".".join(version.split(".")[:2])
    entry["patches"] = [version] if version.startswith(minor) else []
    entry["te_version_without_te"] = previous.get("te_version_without_te")
    entry["carried_over"] = ["te_version_without_te (what TE version megatron-core reports without "
                             "TE: read it in the live differential)"]
    return entry


# ---------------------------------------------------------------- Bridge
_ARG = re.compile(r"^-")


def bridge_flags(source: str) -> list:
    """Every add_argument of a Bridge harness argument_parser.py: spellings, arity, choices,
    required, append, line (the shape of data/bridge_harness_flags.json)."""
    tree = ast.parse(source)
    # module-level dict literals: a flag's choices may be one's keys (NUM_GPUS_PER_NODE_MAP.keys())
    dicts = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Dict) for t in node.targets if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and _ARG.match(a.value)]
        if not flags:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw["action"].value if isinstance(kw.get("action"), ast.Constant) else None
        nargs = kw["nargs"].value if isinstance(kw.get("nargs"), ast.Constant) else None
        if action in ("store_true", "store_false", "store_const", "count", "help", "version") \
                or nargs == 0:
            value = "none"
        elif nargs == "?":
            value = "optional"
        elif nargs in ("*", "+") or isinstance(nargs, int) and nargs > 1:
            value = "many"
        else:
            value = "one"
        entry = {"flags": flags, "value": value, "line": node.lineno}
        choices = kw.get("choices")
        if isinstance(choices, ast.Call) and getattr(choices.func, "attr", None) == "keys" \
                and getattr(choices.func.value, "id", None) in dicts:
            choices = ast.List(elts=dicts[choices.func.value.id].keys)
        if isinstance(choices, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant)
                                                               for e in choices.elts):
            entry["choices"] = [e.value for e in choices.elts]
        if isinstance(kw.get("required"), ast.Constant) and kw["required"].value:
            entry["required"] = True
        if action == "append":
            entry["append"] = True
        out.append(entry)
    return sorted(out, key=lambda e: e["line"])


def bridge_release(tag: str) -> dict:
    tree = Tree(BRIDGE_MIRROR, tag)
    info = tree.text("src/megatron/bridge/package_info.py") or ""
    parts = dict(re.findall(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d+)", info, re.M))
    source = tree.text("scripts/performance/argument_parser.py")
    tests = card.load()["bridge_tests"]
    present = {}
    for name, node in tests.items():
        path, *inner = node.split("::")
        text = tree.text(path)
        present[name] = text is not None and all(f"def {part}" in text or f"class {part}" in text
                                                 for part in inner)
    return {"tag": tag, "package_info": f"{parts.get('MAJOR')}.{parts.get('MINOR')}" if parts else None,
            "bootstrap": tree.text("scripts/performance/bootstrap.py") is not None,
            "flags": bridge_flags(source) if source else [], "tests_present": present}


# ---------------------------------------------------------------- the whole change
def sited(data: dict) -> list:
    """The card entries that cite megatron-core lines per release (an `at` map): constraints
    other than Bridge's own, and memory bugs."""
    return [c for c in data["constraints"] if not c.get("bridge")] + [
        b for b in data.get("memory_bugs", []) if b.get("at")]


def add(key: str, new: Tree, previous: Optional[str] = None, old: Optional[Tree] = None,
        version: Optional[str] = None, tag: Optional[str] = None,
        bridge: Optional[str] = None, main: Optional[Tree] = None) -> ReleaseChange:
    """The change that adds release `key` (read from `new`), re-found from `previous` (read from
    `old`, default the mirror at its tag). With `main` (Megatron-LM main's tree), the rules only
    main had are searched too: one found in the new release arrived with it."""
    data = card.load()
    numbered = [k for k in data["releases"] if k != "main"]
    previous = previous or [k for k in numbered if k != key][-1]
    old = old or Tree(MLM_MIRROR, data["releases"][previous]["tag"])
    change = ReleaseChange(key, previous, new.name)
    # every megatron-core site the card cites per release: the constraints (Megatron Bridge's own
    # rules, with a `bridge` field, cite Bridge's lines instead) and the known memory bugs
    mcore = sited(data)
    sites = {c["id"]: c["at"][previous] for c in mcore if previous in c["at"]}
    for cid, (text, status, note) in refind_sites(old, new, sites).items():
        change.refound.append(Refound(cid, sites[cid], text, status, note))
    if main is not None:
        later = {c["id"]: c["at"]["main"] for c in mcore
                 if "main" in c["at"] and previous not in c["at"]}
        for cid, (text, _status, _note) in refind_sites(main, new, later).items():
            if text:
                change.refound.append(Refound(cid, f"{later[cid]} @ main", text, "arrived",
                                              "on main before, in this release now"))
    sets = label_sets(new.text(TC) or "")
    change.labels = sets.get("recompute_modules", [])
    change.offload_modules = sets.get("offload_modules", [])
    change.fields = field_lists(new)
    change.release_entry = release_entry(new, data["releases"][previous], version,
                                         tag or data["releases"].get(key, {}).get("tag") or key)
    if bridge:
        change.bridge = bridge_release(bridge)
    return change


# ---------------------------------------------------------------- writing
def _flow(mapping: dict) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in mapping.items()) + "}"


def write_card(text: str, change: ReleaseChange, order: list) -> str:
    """The card text with `change.key` added to every re-found constraint's `at` (in release
    order) and to its releases: map; the rest of the file is left as written."""
    lines = text.splitlines(keepends=True)
    at = change.at
    cid = None
    for i, line in enumerate(lines):
        m = re.match(r"  - id: (\S+)", line)
        if m:
            cid = m.group(1)
        m = re.match(r"(\s+at: )(\{.*\})(\s*)$", line)
        if m and cid in at:
            import yaml

            mapping = yaml.safe_load(m.group(2))
            mapping[change.key] = at[cid]
            mapping = {k: mapping[k] for k in order if k in mapping}
            lines[i] = m.group(1) + _flow(mapping) + "\n"
    return "".join(lines)


def write(change: ReleaseChange, bridge_key: Optional[str] = None, data_dir: Path = DATA,
          top_card: Path = ROOT / "card.yaml") -> list:
    """Apply the change to data/card.yaml (and its top-level copy), data/upstream_fields.json and,
    with a Bridge tag, data/bridge_harness_flags.json. Returns the files written."""
    data = card.load()
    order = list(data["releases"])
    if change.key not in order:
        order.insert(order.index("main"), change.key)
    text = (data_dir / "card.yaml").read_text(encoding="utf-8")
    text = write_card(text, change, order)
    if change.key not in data["releases"]:
        entry = {k: v for k, v in change.release_entry.items() if k != "carried_over"}
        block = f'  "{change.key}":\n' + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in entry.items())
        text = text.replace('  "main":\n    tag:', block + '  "main":\n    tag:', 1)
    written = []
    for path in (data_dir / "card.yaml", top_card):
        path.write_text(text, encoding="utf-8")
        written.append(str(path))
    fields_path = data_dir / "upstream_fields.json"
    fields = json.loads(fields_path.read_text(encoding="utf-8"))
    mine = fields["mcore"].setdefault(change.key, {})
    mine.update(change.fields, version=change.release_entry["newest"])
    fields["mcore"] = {k: fields["mcore"][k] for k in order if k in fields["mcore"]}
    fields_path.write_text(json.dumps(fields, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    written.append(str(fields_path))
    if change.bridge and bridge_key:
        flags_path = data_dir / "bridge_harness_flags.json"
        flags = json.loads(flags_path.read_text(encoding="utf-8"))
        flags["releases"][bridge_key] = {"read_at": change.bridge["tag"], "flags": change.bridge["flags"]}
        flags_path.write_text(json.dumps(flags, indent=1) + "\n", encoding="utf-8")
        written.append(str(flags_path))
    return written


# ---------------------------------------------------------------- report
def render(change: ReleaseChange) -> str:
    out = [f"megatron-core {change.release_entry.get('newest')} as card release {change.key}, "
           f"re-found from {change.previous} in {change.tree}"]
    counts = {s: sum(r.status == s for r in change.refound)
              for s in ("same", "moved", "vanished", "arrived")}
    out.append(f"constraints: {counts['same']} at the same lines, {counts['moved']} moved, "
               f"{counts['vanished']} not found, {counts['arrived']} arrived from main")
    for r in change.refound:
        if r.status != "same":
            line = f"  {r.status:8} {r.cid}: {r.old} -> {r.new or '?'}" + (f" ({r.note})" if r.note else "")
            out.append(line if len(line) <= 100 else line[:97] + "...")
    known = [e["label"] for e in card.load()["labels"]]
    out.append("recompute labels: " + ", ".join(change.labels)
               + (f" (new: {', '.join(sorted(set(change.labels) - set(known)))})"
                  if set(change.labels) - set(known) else ""))
    out.append("offload modules: " + ", ".join(change.offload_modules))
    out.append("release entry: " + json.dumps({k: v for k, v in change.release_entry.items()
                                               if k != "carried_over"}))
    out += [f"  carried over: {c}" for c in change.release_entry.get("carried_over", [])]
    if change.bridge:
        b = change.bridge
        harness = "bootstrap.py" if b["bootstrap"] else "run_script.py"
        out.append(f"Bridge {b['tag']}: package_info {b['package_info']}, {harness} harness, "
                   f"{len(b['flags'])} flags; tests missing there: "
                   + (", ".join(n for n, ok in b["tests_present"].items() if not ok) or "none"))
    out.append("next: tests/envs/build.sh for the release, then tests/test_releases.py decides")
    return "\n".join(out)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--key", required=True, help="the card key of the release (MAJOR.MINOR)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tag", help="a Megatron-LM tag of the mirror ($MLM_MIRROR)")
    src.add_argument("--package", type=Path, help="an installed megatron-core's site directory")
    p.add_argument("--release-tag", help="with --package: the tag whose code the package carries")
    p.add_argument("--version", help="the package version (default: its metadata, or the tag)")
    p.add_argument("--from", dest="previous", help="the release to re-find from (default: the newest)")
    p.add_argument("--bridge", help="a Megatron Bridge tag of the mirror ($BRIDGE_MIRROR)")
    p.add_argument("--no-main", action="store_true",
                   help="do not search the rules only main had (they need the mirror at main)")
    p.add_argument("--bridge-key", help="with --bridge --write: the bridge_harness_flags.json key")
    p.add_argument("--write", action="store_true", help="write the data files")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    new = Tree(MLM_MIRROR, args.tag) if args.tag else Tree(root=args.package)
    main = None if args.no_main else Tree(MLM_MIRROR, card.load()["releases"]["main"]["commit"])
    change = add(args.key, new, args.previous, version=args.version,
                 tag=args.tag or args.release_tag, bridge=args.bridge, main=main)
    if args.json:
        print(json.dumps(change.to_dict(), indent=1))
    else:
        print(render(change))
    if args.write:
        for f in write(change, args.bridge_key):
            print(f"wrote {f}", file=sys.stderr)
    return 1 if change.lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
