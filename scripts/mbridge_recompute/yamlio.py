"""Parsing the YAML and JSON text a user hands the tools, within bounds, as plain data.

The files themselves are read by `files.py` (regular files only, LIMITS per kind, UTF-8 with or
without a BOM); this module turns their text into data with one policy for every document,
whatever tool reads it. A YAML text is read in two passes over libyaml's event stream
(`CSafeLoader`, the C parser; PyYAML's pure-Python one took 121 s and 2 GB on a 6 MB file):

1. a scan that refuses, before anything is built, what would make building or walking the
   document unbounded or ambiguous: nesting deeper than MAX_DEPTH, more than MAX_NODES nodes
   once aliases are expanded (an alias bomb is a few lines that expand to billions of nodes),
   an alias to a collection that is still open (a document that contains itself), a key that
   is not text (`1: foo`, `true: {...}`, `? [a]`, an empty key), a key given twice in one
   mapping (YAML's last-wins would silently drop one), an integer with more digits than Python
   converts (4300, `sys.get_int_max_str_digits`), a second document, and any Python tag
   (`!!python/...`; Bridge writes its dumps with `yaml.safe_dump`, models/config.py:231 @
   megatron-bridge 0.6.2, which writes none);
2. construction with the safe constructor, which after the scan cannot recurse deeply or blow up
   (a tag it does not know is refused there).

JSON (config.json, run manifests, plan / compare / diagnose reports) gets the same policy:
integer digits, duplicate keys, nesting, and strings holding a lone UTF-16 surrogate (`"\\ud800"`,
which no terminal or file can encode) refused.

Every refusal is `InputError(where, "line N: ...")`: exit 2, one line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mbridge_recompute.errors import InputError
from mbridge_recompute.limits import MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_INT_DIGITS, MAX_NODES

_SURROGATE = re.compile("[\ud800-\udfff]")
_INTISH = re.compile(r"^[-+]?[0-9][0-9_]*$|^[-+]?0[xob][0-9a-fA-F_]+$")


def _yaml():
    import yaml  # light: only when a file is read

    return yaml


def _loader_class():
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line(event) -> int:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else 0


class _Frame:
    __slots__ = ("kind", "anchor", "size", "expect_key", "keys", "key_path", "pending_key")

    def __init__(self, kind: str, anchor, key_path: str):
        self.kind = kind                    # "map" or "seq"
        self.anchor = anchor
        self.size = 1
        self.expect_key = kind == "map"
        self.keys: dict = {}
        self.key_path = key_path
        self.pending_key = None


def _is_text_key(event) -> bool:
    """A mapping key that the safe constructor turns into a str."""
    yaml = _yaml()
    if not isinstance(event, yaml.ScalarEvent):
        return False
    tag = event.tag
    if tag not in (None, "!"):
        return tag == "tag:yaml.org,2002:str"
    if event.implicit[0] is False and event.implicit[1]:   # quoted: text whatever it reads
        return True
    if event.value == "<<":
        return True                                         # a merge key
    resolved = yaml.resolver.Resolver().resolve(yaml.ScalarNode, event.value, event.implicit)
    return resolved == "tag:yaml.org,2002:str" and event.value != ""


def scan(text: str, where: str) -> None:
    """Refuse a YAML text whose construction or use would be unbounded or ambiguous."""
    yaml = _yaml()
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InputError(where, f"is {len(text)} characters; at most {MAX_DOCUMENT_BYTES} are read")
    stack: list[_Frame] = []
    anchors: dict = {}          # anchor -> expanded size, once its node is complete
    open_anchors: set = set()
    total = 0
    loader = _loader_class()(text)
    try:
        while True:
            event = loader.get_event()
            if event is None:
                break
            kind = type(event)
            if kind in (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent):
                continue
            if kind is yaml.DocumentStartEvent:
                if total:
                    raise InputError(where, f"line {_line(event)}: a second YAML document; "
                                            "a workload file holds one")
                continue
            parent = stack[-1] if stack else None
            is_key = parent is not None and parent.kind == "map" and parent.expect_key
            end = kind in (yaml.MappingEndEvent, yaml.SequenceEndEvent)
            if is_key and not end:
                if not _is_text_key(event):
                    shown = getattr(event, "value", None)
                    shown = "an empty key" if shown in (None, "") and kind is yaml.ScalarEvent else (
                        repr(shown) if shown is not None else "a collection")
                    raise InputError(_at(where, parent.key_path), f"line {_line(event)}: keys must be "
                                     f"text, got {shown} (quote it if it is a name)")
                if event.value != "<<":
                    first = parent.keys.get(event.value)
                    if first is not None:
                        raise InputError(_at(where, _join(parent.key_path, event.value)),
                                         f"given twice (lines {first} and {_line(event)}); YAML would "
                                         "keep the last one silently")
                    parent.keys[event.value] = _line(event)
                parent.pending_key = event.value
            size = 0
            if kind is yaml.AliasEvent:
                if event.anchor in open_anchors:
                    raise InputError(where, f"line {_line(event)}: alias *{event.anchor} refers to a "
                                            "collection that contains it (a document cannot contain itself)")
                size = anchors.get(event.anchor, 1)
            elif kind is yaml.ScalarEvent:
                size = 1
                value = event.value
                if (event.implicit[0] and len(value) > MAX_INT_DIGITS and _INTISH.match(value)):
                    raise InputError(_at(where, _child_path(stack)), f"line {_line(event)}: a number of "
                                     f"{len(value)} digits (at most {MAX_INT_DIGITS} can be read)")
                if event.tag and event.tag.startswith("tag:yaml.org,2002:python/"):
                    raise InputError(where, f"line {_line(event)}: Python tag {event.tag} is not read")
                if event.anchor:
                    anchors[event.anchor] = 1
            elif kind in (yaml.MappingStartEvent, yaml.SequenceStartEvent):
                if len(stack) >= MAX_DEPTH:
                    raise InputError(where, f"line {_line(event)}: nested deeper than {MAX_DEPTH} levels")
                if event.tag and event.tag.startswith("tag:yaml.org,2002:python/"):
                    raise InputError(where, f"line {_line(event)}: Python tag {event.tag} is not read")
                frame = _Frame("map" if kind is yaml.MappingStartEvent else "seq", event.anchor,
                               _child_path(stack))
                if event.anchor:
                    open_anchors.add(event.anchor)
                stack.append(frame)
                total += 1
                _count(total, where, event)
                continue
            elif end:
                frame = stack.pop()
                if frame.anchor:
                    open_anchors.discard(frame.anchor)
                    anchors[frame.anchor] = frame.size
                size = frame.size
                parent = stack[-1] if stack else None
                if parent is not None:
                    parent.size += size
                    if parent.kind == "map":
                        parent.expect_key = not parent.expect_key
                continue
            total += size
            _count(total, where, event)
            if parent is not None:
                parent.size += size
                if parent.kind == "map":
                    parent.expect_key = not parent.expect_key
    except yaml.YAMLError as exc:
        raise InputError(where, _yaml_reason(exc)) from None
    finally:
        loader.dispose()


def _yaml_reason(exc) -> str:
    """One line for a YAML error (PyYAML's own text spans several)."""
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}" if mark else ""
    reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    if getattr(exc, "character", None) is not None and getattr(exc, "position", None) is not None:
        at = f" at character {exc.position}"
    return f"not valid YAML{at}: {' '.join(str(reason).split())}"


def _count(total: int, where: str, event) -> None:
    if total > MAX_NODES:
        raise InputError(where, f"line {_line(event)}: more than {MAX_NODES} values once aliases are "
                                "expanded (a ConfigContainer dump has about 3,000)")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _child_path(stack: list) -> str:
    if not stack:
        return ""
    top = stack[-1]
    if top.kind == "map" and not top.expect_key and top.pending_key is not None:
        return _join(top.key_path, top.pending_key)
    return top.key_path


def _at(where: str, path: str) -> str:
    return f"{where}: {path}" if path and where else (path or where)


def load_text(text: str, where: str) -> Any:
    """Plain data (dict, list, str, int, float, bool, None) from one bounded YAML document."""
    yaml = _yaml()
    scan(text, where)
    try:
        return yaml.load(text, Loader=_loader_class())
    except yaml.YAMLError as exc:          # a scan passes only what the parser accepts
        raise InputError(where, _yaml_reason(exc)) from None
    except (ValueError, RecursionError, OverflowError) as exc:   # belt and braces
        raise InputError(where, f"cannot be read: {type(exc).__name__}") from None


def load_json_text(text: str, where: str, path: str = "") -> Any:
    """A bounded JSON document: integer digits, duplicate keys, nesting and lone surrogates."""
    named = f"{path} " if path else ""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InputError(where, f"is {len(text)} characters; at most {MAX_DOCUMENT_BYTES} are read")

    def _int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise InputError(where, f"{named}holds a number of {len(digits)} digits "
                                    f"(at most {MAX_INT_DIGITS} can be read)")
        return int(digits)

    def _pairs(pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                raise InputError(where, f"{named}gives key {key!r} twice; JSON readers keep the last one "
                                        "silently")
            out[key] = value
        return out

    if not text.strip():
        raise InputError(where, f"{named}is empty")
    try:
        data = json.loads(text, parse_int=_int, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        msg = " ".join(exc.msg.split())
        raise InputError(where, f"{named}is not valid JSON (line {exc.lineno}): {msg}") from None
    except RecursionError:
        raise InputError(where, f"{named}is nested too deeply to read") from None
    _check_json_tree(data, where, named)
    return data


def _check_json_tree(data: Any, where: str, named: str) -> None:
    """Nesting within MAX_DEPTH and no lone surrogate in any key or string, without recursion."""
    stack = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise InputError(where, f"{named}holds a lone UTF-16 surrogate escape ({node[:40]!a}); "
                                        "text must be valid Unicode")
            continue
        if isinstance(node, (dict, list)):
            if depth >= MAX_DEPTH:
                raise InputError(where, f"{named}is nested more than {MAX_DEPTH} levels deep")
            if isinstance(node, dict):
                stack.extend((k, depth + 1) for k in node)
                stack.extend((v, depth + 1) for v in node.values())
            else:
                stack.extend((v, depth + 1) for v in node)
