"""Reading the files users give and writing the files the tools produce, safely.

Writing, so that nothing the user owns is overwritten by surprise: `check_target` refuses an
output path before any work is done (a directory, a missing parent, an existing file without
--force, a symlink, and anything that exists and is not a regular file -- a FIFO, a socket or a
device -- even with --force); `write` then creates the file exclusively (`O_EXCL | O_NOFOLLOW`), or with
--force replaces it atomically: the data goes to a fresh temporary file in the same directory
(created exclusively, so a planted link is never followed), which `os.replace` moves over the
target, so a symlink planted at the path is replaced, never followed, and a reader never sees
half a file. `create_exclusive` opens a new file for streaming (a run's log) the same way.

Reading: this is the one reader of every file a user hands the tools (workload YAML, Bridge
config dumps, run manifests, Hugging Face config.json, plan / compare / diagnose reports,
argument files, training logs), with one policy, so that no tool reads what another refuses:

* regular files only: the file is opened without blocking and asked with fstat what it is, so
  `/dev/zero`, a FIFO or a socket is refused before a byte is read (and a FIFO cannot hang the
  open itself); a symbolic link is followed, since the user named it;
* at most LIMITS[kind] bytes: the size is checked before reading and the read stops one byte
  past the limit (a file that grows while it is read is refused too);
* documents are UTF-8, with or without a byte-order mark; logs may also be UTF-16/32
  (logs/runlog.py decodes them) and are read piece by piece (`open_log`), never whole;
* YAML and JSON go through yamlio.py: nesting, alias expansion, integer digits,
  duplicate keys, non-text keys and lone surrogates bounded or refused, Python tags never
  constructed;
* every failure is an `InputError` naming the field (exit 2, one line).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from mbridge_recompute import yamlio
from mbridge_recompute.errors import InputError
from mbridge_recompute.limits import LIMITS
from mbridge_recompute.units import MIB

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
def _describe(field: str, path: str) -> str:
    return "" if field == path else f"{path}: "      # the path once, in the field or the reason


def open_regular(path, field: str, kind: str):
    """(binary file object, size) of the regular file at `path`; InputError naming `field`."""
    text = str(path)
    if not text.strip():
        raise InputError(field, "is empty")
    name = _describe(field, text)
    try:
        fd = os.open(text, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        if os.path.islink(text):
            raise InputError(field, f"{name}is a symbolic link to nothing") from None
        raise InputError(field, f"{name}no such file") from None
    except IsADirectoryError:
        raise InputError(field, f"{name}is a directory") from None
    except (OSError, ValueError) as exc:      # ValueError: an embedded NUL
        raise InputError(field, f"{name}cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(field, f"{name}is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(field, f"{name}is not a regular file (a device, pipe or socket is not read)")
        limit = LIMITS[kind]
        if st.st_size > limit:
            raise InputError(field, f"{name}is {st.st_size} bytes, more than the {_mib(limit)} MiB "
                                    f"read of a {kind}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _mib(limit: int) -> str:
    return f"{limit / MIB:g}"


def read_bytes(path, field: str, kind: str) -> bytes:
    """The bytes of a regular file, at most LIMITS[kind] of them; InputError naming `field`."""
    limit = LIMITS[kind]
    fh, _ = open_regular(path, field, kind)
    try:
        with fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(field, f"{_describe(field, str(path))}cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(field, f"{_describe(field, str(path))}grew past the {_mib(limit)} MiB read of "
                                f"a {kind}")
    return data


def decode_utf8(data: bytes, field: str) -> str:
    """A document's text: UTF-8, a leading byte-order mark dropped (Windows editors write one)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(field, f"is not UTF-8 text (byte {exc.start})") from None


def read_text(path, field: str, kind: str) -> str:
    """A document file as text (UTF-8, BOM accepted), within LIMITS[kind]."""
    return decode_utf8(read_bytes(path, field, kind), field)


def read_yaml(path, field: str, kind: str = "workload") -> Any:
    """A YAML document file as plain data, bounded and unambiguous (yamlio.py)."""
    return yamlio.load_text(read_text(path, field, kind), field)


def read_json(path, field: str, kind: str) -> Any:
    """A JSON document file as plain data, bounded and unambiguous (yamlio.py)."""
    return yamlio.load_json_text(read_text(path, field, kind), field, "" if field == str(path) else str(path))


def exists(path) -> bool:
    """Whether anything is at `path`, a dangling symbolic link included (a planted link is input too)."""
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True
