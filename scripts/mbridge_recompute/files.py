"""Writing the files the tools produce, so that nothing the user owns is overwritten by surprise.

`check_target` refuses an output path before any work is done (a directory, a missing parent,
an existing file without --force, a symlink); `write` then creates the file exclusively, or with
--force replaces it atomically: the data goes to a fresh temporary file in the same directory,
which `os.replace` moves over the target, so a symlink planted at the path is replaced, never
followed, and a reader never sees half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mbridge_recompute.errors import InputError


def check_target(path: Path, force: bool, field: str, suffixes: tuple = ()) -> None:
    """InputError naming `field` unless `path` may be written."""
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(field, f"{path}: use a {', '.join(suffixes)} file name")
    if path.is_symlink():
        raise InputError(field, f"{path} is a symbolic link; give the file itself")
    if path.is_dir():
        raise InputError(field, f"{path} is a directory")
    if path.exists() and not force:
        raise InputError(field, f"{path} exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise InputError(field, f"no such directory: {path.parent}")


def write(path: Path, data: bytes | str, force: bool, field: str) -> None:
    """Create `path` (it must not exist), or with `force` replace it atomically."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if not force:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except FileExistsError:
        raise InputError(field, f"{path} exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise InputError(field, f"cannot write {path}: {exc.strerror or exc}") from None
