"""Reading the files users give and writing the files the tools produce, safely.

Writing, so that nothing the user owns is overwritten by surprise: `check_target` refuses an
output path before any work is done (a directory, a missing parent, an existing file without
--force, a symlink, and anything that exists and is not a regular file -- a FIFO, a socket or a
device -- even with --force); `write` then creates the file exclusively (`O_EXCL | O_NOFOLLOW`), or with
--force replaces it atomically: the data goes to a fresh temporary file in the same directory
(created exclusively, so a planted link is never followed), which `os.replace` moves over the
target, so a symlink planted at the path is replaced, never followed, and a reader never sees
half a file. `create_exclusive` opens a new file for streaming (a run's log) the same way.

Reading, so that no input can make a tool hang, exhaust memory or print a traceback: only
regular files are read (`/dev/zero`, a FIFO or a socket is refused before a byte is read), and
no more than a per-kind limit (`read_bytes`); JSON and YAML are parsed with their nesting,
aliases and integer sizes bounded (`read_json`, `yaml_tree`), and every failure is an
`InputError` naming the field.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from mbridge_recompute.errors import InputError
from mbridge_recompute.units import MIB

# What one tool reads at most, per kind of file. A long training log is hundreds of MB; a plan,
# a manifest or a config dump is kilobytes, so 64 MiB already means "not what it claims to be".
LOG_LIMIT = 1024 * MIB
DOC_LIMIT = 64 * MIB
# A YAML/JSON document expands to at most this many values once its aliases are followed
# (a Bridge ConfigContainer dump holds about two thousand).
MAX_VALUES = 200_000
MAX_DEPTH = 200
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# ---------------------------------------------------------------- writing
def check_target(path: Path, force: bool, field: str, suffixes: tuple = ()) -> None:
    """InputError naming `field` unless `path` may be written.

    Only a regular file is ever replaced, and only with `force`: a FIFO, a socket or a device
    node (`/dev/null`) is refused whatever the flags, because replacing it with a plain file
    would destroy something that is not the user's output (as root, a system device).
    """
    path = Path(path)
    if not str(path).strip():
        raise InputError(field, "is empty")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(field, f"{path}: use a {', '.join(suffixes)} file name")
    _refuse_existing(path, force, field)
    if not path.parent.is_dir():
        raise InputError(field, f"no such directory: {path.parent}")


def _refuse_existing(path: Path, force: bool, field: str) -> None:
    """InputError unless nothing is at `path`, or (with `force`) a regular file is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:        # ValueError: an embedded NUL
        raise InputError(field, f"cannot use {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(field, f"{path} is a symbolic link; give the file itself")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{path} is not a regular file (a device, pipe or socket is never "
                                "replaced, not even with --force)")
    if not force:
        raise InputError(field, f"{path} exists; pass --force to overwrite it")


def write(path: Path, data: bytes | str, force: bool, field: str) -> None:
    """Create `path` (it must not exist), or with `force` replace it atomically."""
    path = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if not force:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            return
        # mkstemp creates its file with O_EXCL: a link planted under the temporary name fails it
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.chmod(tmp, 0o644)
            # asked again right before the swap: what was checked at start-up may have been
            # replaced by a FIFO or a device since (the work between can take minutes)
            _refuse_existing(path, True, field)
            os.replace(tmp, path)         # replaces a regular file at `path`, nothing else
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except FileExistsError:
        raise InputError(field, f"{path} exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise InputError(field, f"cannot write {path}: {exc.strerror or exc}") from None


def create_exclusive(path: Path, field: str):
    """A new file at `path` opened for binary writing; never follows or reuses what is there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        raise InputError(field, f"{path} exists (something else wrote it)") from None
    except OSError as exc:
        raise InputError(field, f"cannot create {path}: {exc.strerror or exc}") from None
    return os.fdopen(fd, "wb")


# ---------------------------------------------------------------- reading
def read_bytes(path, field: str, limit: int = DOC_LIMIT) -> bytes:
    """The bytes of a regular file, at most `limit` of them; InputError naming `field` otherwise."""
    text = str(path)
    if not text.strip():
        raise InputError(field, "is an empty path")
    name = "" if field == text else f"{text}: "      # the path once, in the field or the reason
    try:
        st = os.stat(text)
    except FileNotFoundError:
        raise InputError(field, f"{name}no such file") from None
    except (OSError, ValueError) as exc:      # ValueError: an embedded NUL
        raise InputError(field, f"{name}cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{name}is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{name}is not a regular file (a device, pipe or socket is not read)")
    if st.st_size > limit:
        raise InputError(field, f"{name}is {st.st_size} bytes, more than the {limit // MIB} MiB "
                                "this tool reads")
    try:
        with open(text, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(field, f"{name}cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(field, f"{name}grew past the {limit // MIB} MiB this tool reads")
    return data


def read_stream(stream, field: str, limit: int = LOG_LIMIT) -> bytes:
    """At most `limit` bytes of an open binary stream (stdin)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(field, f"more than the {limit // MIB} MiB this tool reads")
    return data


def decode_utf8(data: bytes, field: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(field, f"is not UTF-8 text (byte {exc.start})") from None


def parse_json(text: str, field: str) -> Any:
    """`json.loads` whose every failure is an InputError naming `field`."""
    if not text.strip():
        raise InputError(field, "is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(field, f"is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except RecursionError:
        raise InputError(field, "is nested too deeply to read") from None
    except ValueError as exc:                 # int() past the 4300-digit conversion limit
        raise InputError(field, f"holds a number this tool cannot read ({str(exc)[:80]})") from None


def read_json(path, field: str, limit: int = DOC_LIMIT) -> Any:
    return parse_json(decode_utf8(read_bytes(path, field, limit), field), field)


def yaml_tree(text: str, field: str, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH) -> Any:
    """A YAML document as plain Python values, refusing alias bombs, cycles and deep nesting.

    The node graph is composed first (aliases stay shared, so a "billion laughs" document is
    still small there) and its expanded size, depth and cycles are measured on it; only a
    document within the bounds is constructed. Tags (Bridge dumps carry `_target_` Python tags)
    are read as the plain mapping, sequence or scalar they hold, never constructed.
    """
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _Loader(base):
        pass

    def _any(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Loader.add_multi_constructor("", _any)
    # integers stay text until asked for: a 5000-digit integer must not raise in int()
    _Loader.add_constructor("tag:yaml.org,2002:int", _int_or_text)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, field, max_values, max_depth)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise InputError(field, f"is not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise InputError(field, "is nested too deeply to read") from None
    except (TypeError, ValueError) as exc:     # an unhashable key, a value no constructor takes
        raise InputError(field, f"cannot be read as data: {str(exc)[:120]}") from None
    finally:
        loader.dispose()


def _int_or_text(loader, node):
    """YAML's own integer reading, except that an integer past 100 digits stays text."""
    if len(str(node.value).lstrip("+-")) > 100:
        return loader.construct_scalar(node)
    return type(loader).__mro__[1].construct_yaml_int(loader, node)


def _measure(root, field: str, max_values: int, max_depth: int) -> None:
    """Expanded size, depth and cycles of a composed YAML node graph, without recursion."""
    import yaml

    size: dict = {}                    # id(node) -> expanded value count
    on_path: set = set()
    stack = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        kids = []
        if isinstance(node, yaml.SequenceNode):
            kids = node.value
        elif isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            if size[key] > max_values:
                raise InputError(field, f"expands to more than {max_values} values (an alias bomb?)")
            continue
        if key in size:
            continue
        if key in on_path:
            raise InputError(field, "refers to itself (a YAML alias inside its own anchor)")
        if depth > max_depth:
            raise InputError(field, f"is nested more than {max_depth} levels deep")
        on_path.add(key)
        stack.append((node, depth, True))
        for k in kids:
            if id(k) in on_path:
                raise InputError(field, "refers to itself (a YAML alias inside its own anchor)")
            if id(k) not in size:
                stack.append((k, depth + 1, False))
