"""Which `recompute_modules` labels exist in which megatron-core version.

The lists come from the card (`labels[].versions`); the version in force is the
installed megatron-core's, read from package metadata without importing it.
"""

from __future__ import annotations

from functools import lru_cache

from mbridge_recompute.facts import card

DEFAULT_VERSION = "0.16.1"


@lru_cache(maxsize=1)
def installed_mcore_version() -> str | None:
    """megatron-core's version from its metadata (no import: importing it pulls torch)."""
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def known_versions() -> list[str]:
    return list(card.load()["versions"])


def resolve_version(version: str | None) -> str:
    """Map any megatron-core version string onto a label set the card knows.

    0.16.x -> "0.16.1"; anything newer (0.17, 1.x, dev builds) -> "main"; the
    card's own names pass through.
    """
    if not version:
        return DEFAULT_VERSION
    if version in known_versions():
        return version
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        from mbridge_recompute.errors import InputError

        raise InputError("--mcore-version", f"not a version: {version!r}; use one of "
                         f"{', '.join(known_versions())} or a release number") from None
    return DEFAULT_VERSION if v.release[:2] <= (0, 16) else "main"


def target_version() -> str:
    return resolve_version(installed_mcore_version())


def labels_for(version: str) -> list[str]:
    version = resolve_version(version)
    return [e["label"] for e in card.load()["labels"] if version in e["versions"]]


def require_known(mods, version: str, field: str) -> None:
    """InputError naming `field` for the first label megatron-core `version` does not know."""
    allowed = labels_for(version)
    unknown = [m for m in mods if m not in allowed]
    if unknown:
        from mbridge_recompute.errors import InputError

        raise InputError(field, f"unknown label {unknown[0]!r} for megatron-core "
                                f"{resolve_version(version)}; valid: {', '.join(allowed)}")
