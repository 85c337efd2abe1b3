"""Which megatron-core release the tools reason about, how it was chosen, and what it accepts.

The card (`releases:`) lists the releases it holds facts for, oldest first: one key per minor
release ("0.16" ... "0.19"; every patch of it shares its facts) and "main". Anything a user gives
(`--mcore-version 0.19.2`, an installed package's version, a Bridge-pinned commit) resolves to
one of those keys or is refused with the known ones listed.

The default is the installed megatron-core, read from its package metadata without importing it
(importing megatron pulls torch), else the newest release the card covers.

A tool resolves the release once, at its edge (`cli._run`: `--mcore-version`, else the default),
into one `Release`, and passes that object on; it is also the invocation's `current()` release,
which code that is handed no release uses. Every function here that takes a version takes a
`Release` too, so passing the object never resolves it again.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Union

from mbridge_recompute.facts import card


@dataclass(frozen=True)
class Release:
    """A resolved release: the card key whose facts apply, what was asked for, and how."""
    key: str                   # "0.16" ... "0.19", "main"
    requested: str             # the version or commit that led here ("0.19.2", "cd4afff", "main")
    how: str                   # one sentence: where the version came from
    asked: bool = False        # named by the user or an input (not the installed / newest default)

    @property
    def name(self) -> str:
        """What a report calls it: the requested release, and the facts used when they differ."""
        if self.requested == self.key:
            return self.key
        return f"{self.requested} (the {self.key} facts)"

    def to_dict(self) -> dict:
        return {"key": self.key, "requested": self.requested, "how": self.how}

    def __str__(self) -> str:
        return self.key

    @property
    def meta(self) -> dict:
        """The card's `releases:` entry of this release (tag, commit, patches, ...)."""
        return meta(self.key)

    def labels(self) -> list[str]:
        return labels_for(self)

    def enum(self, name: str) -> list[str]:
        return enum(name, self)


ReleaseLike = Union[Release, str]  # a Release, or what a user or a file names (resolved here)
_CURRENT: ContextVar[Optional[Release]] = ContextVar("mbridge_recompute_release", default=None)


@contextlib.contextmanager
def using(release: Release):
    """Make `release` the invocation's release (`current()`) inside the block."""
    token = _CURRENT.set(release)
    try:
        yield release
    finally:
        _CURRENT.reset(token)


def current() -> Release:
    """The release of this invocation: the one its edge resolved (`using`), else the default
    (`target()`: the installed megatron-core, else the newest the card covers)."""
    return _CURRENT.get() or target()


def resolve(version: Optional[ReleaseLike] = None, field: str = "--mcore-version") -> Release:
    """`version` as a Release: a Release as it is, a string resolved (InputError naming `field`
    when the card has no facts for it), None the invocation's release."""
    if isinstance(version, Release):
        return version
    if version is None:
        return current()
    return target(version, field)


def keys() -> list[str]:
    """The card's release keys, oldest first."""
    return list(card.load()["releases"])


def newest_release() -> str:
    """The newest numbered release the card covers (not main)."""
    return [k for k in keys() if k != "main"][-1]


def meta(key: str) -> dict:
    return card.load()["releases"][key]


@lru_cache(maxsize=1)
def installed_mcore_version() -> Optional[str]:
    """megatron-core's version from its metadata (no import: importing it pulls torch)."""
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def _known_text() -> str:
    rows = []
    for k in keys():
        m = meta(k)
        rows.append(f"{k} ({', '.join(m['patches'])})" if m.get("patches") else f"{k} ({m['commit']})")
    return "; ".join(rows)


def _refuse(text: str, field: str, why: str):
    from mbridge_recompute.errors import InputError

    raise InputError(field, f"{why}: {text!r}; known: {_known_text()}")


def resolve_version(text: Optional[ReleaseLike], field: str = "--mcore-version") -> str:
    """The card key for a Release, a version string, a card key, or a pinned commit (InputError
    otherwise); None is the invocation's release.

    A patch maps to its minor release ("0.19.2" -> "0.19"); the version Megatron-LM main gives
    itself (the card's `package_version` of main, "0.20.0", and its pre-releases) maps to "main".
    """
    if isinstance(text, Release):
        return text.key
    if text is None:
        return current().key
    return _key_of(str(text).strip(), field)


def _key_of(text: str, field: str) -> str:
    if text in keys():
        return text
    # a commit names its facts from 7 hex digits on: Bridge's pinned Megatron-LM commits, and main's
    pins = [*(card.load().get("bridge_pins") or []), {"commit": meta("main")["commit"], "facts": "main"}]
    for pin in pins:
        commit = pin.get("commit")
        if commit and len(text) >= 7 and commit.startswith(text.lower()):
            return pin["facts"]
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(text)
    except InvalidVersion:
        _refuse(text, field, "not a megatron-core release, card release or pinned commit")
    minor = f"{v.release[0]}.{v.release[1] if len(v.release) > 1 else 0}"
    if minor in keys():
        return minor
    main = meta("main").get("package_version")
    if main and Version(main).release[:2] == v.release[:2]:
        return "main"    # Megatron-LM main names itself after the next release (package_info.py)
    _refuse(text, field, "megatron-core release the card has no facts for")


def unlisted(text: str, key: str) -> str:
    """'' for a card key, a commit or a release the card lists; else the clause that says which
    release's facts stand in for it (0.19.99 -> the 0.19 facts, 0.20 -> main's)."""
    from packaging.version import InvalidVersion, Version

    if text in keys():
        return ""
    try:
        v = Version(text)
    except InvalidVersion:
        return ""                         # a pinned commit: its facts are the pin's
    m = meta(key)
    if key == "main":
        return (f" (not a released megatron-core: Megatron-LM main {m['commit']} calls itself "
                f"{m.get('package_version')}, and main's facts are used)")
    patches = m.get("patches") or []
    if str(v) in patches:
        return "" if str(v) == text else f" (read as {v})"
    return (f" (not a release the card lists -- {key} has {', '.join(patches)}: the {key} facts are "
            "used, unchecked for this patch)")


def target(requested: Optional[str] = None, field: str = "--mcore-version") -> Release:
    """The release to reason about, and how it was chosen."""
    if requested is not None:
        key = resolve_version(requested, field)
        text = str(requested).strip()
        return Release(key, text, f"{field} {text}" + unlisted(text, key), asked=True)
    installed = installed_mcore_version()
    if installed is not None:
        try:
            key = resolve_version(installed, "installed megatron-core")
        except Exception:   # noqa: BLE001 - an installed release the card does not know
            from mbridge_recompute.errors import InputError

            raise InputError("--mcore-version", f"the installed megatron-core {installed} is a release "
                                                f"the card has no facts for; pass --mcore-version, "
                                                f"known: {_known_text()}") from None
        return Release(key, installed, f"the installed megatron-core {installed} (package metadata)")
    newest = newest_release()
    return Release(newest, meta(newest)["newest"],
                   "no megatron-core installed here: the newest release the card covers, "
                   f"{meta(newest)['newest']}")


def bridge_pin_facts(bridge: str) -> Optional[str]:
    """The megatron-core release whose facts a Megatron Bridge release runs with (card
    `bridge_pins:`), or None when the card does not say."""
    pin = next((p for p in card.load().get("bridge_pins") or [] if p.get("bridge") == bridge), None)
    return pin["facts"] if pin else None


def target_version() -> str:
    """The card key of the invocation's release."""
    return current().key


def in_range(key: str, spec: str) -> bool:
    """Whether release `key` lies in `spec`: "0.19", "0.16-0.18" or "0.17-main"."""
    order = keys()
    lo, _, hi = spec.partition("-")
    hi = hi or lo
    return order.index(lo) <= order.index(key) <= order.index(hi)


def labels_for(version: Optional[ReleaseLike]) -> list[str]:
    key = resolve_version(version)
    return [e["label"] for e in card.load()["labels"] if in_range(key, e["releases"])]


def enum(name: str, version: Optional[ReleaseLike]) -> list[str]:
    """The values release `version` accepts for `name` (card `enums:`); [] when it has no such field."""
    row = enum_row(name, version)
    return list(row["values"]) if row else []


def enum_row(name: str, version: Optional[ReleaseLike]) -> Optional[dict]:
    """The card `enums:` row of `name` that holds for release `version` (values, source, and
    `raised_at` where the card says where another value is refused), or None."""
    key = resolve_version(version)
    return next((row for row in card.load()["enums"][name] if in_range(key, row["releases"])), None)


def enum_union(name: str) -> frozenset:
    """Every value some release accepts for `name`."""
    return frozenset(v for row in card.load()["enums"][name] for v in row["values"])


def require_known(mods, version: Optional[ReleaseLike], field: str) -> None:
    """InputError naming `field` for the first label megatron-core `version` does not know."""
    allowed = labels_for(version)
    unknown = [m for m in mods if m not in allowed]
    if unknown:
        from mbridge_recompute.errors import InputError

        named = version.name if isinstance(version, Release) else \
            Release(resolve_version(version), str(version), "").name
        raise InputError(field, f"unknown label {unknown[0]!r} for megatron-core "
                                f"{named}; valid: {', '.join(allowed)}")
