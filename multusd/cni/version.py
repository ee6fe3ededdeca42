"""CNI spec versions in the engine: parsing, comparison, and what a config's version allows.

The versions themselves (:data:`~multusd.SUPPORTED_VERSIONS`, :data:`~multusd.CURRENT_VERSION`)
and each command's minimum (:data:`~multusd.COMMAND_MIN_VERSION`) are defined in the
:mod:`multusd` package, which the shim shares.
"""

from __future__ import annotations

from multusd import COMMAND_MIN_VERSION, SUPPORTED_VERSIONS
from multusd.errors import IncompatibleCNIVersion


def parse_version(v: str) -> tuple:
    """``"1.0.0"`` -> ``(1, 0, 0)``.

    :raises IncompatibleCNIVersion: when ``v`` is not three dot-separated numbers.
    """
    parts = v.split(".") if isinstance(v, str) else []
    if len(parts) != 3 or not all(part.isdigit() and part.isascii() for part in parts):
        raise IncompatibleCNIVersion(
            f"invalid cniVersion {v!r}: expected MAJOR.MINOR.PATCH, one of "
            f"{', '.join(SUPPORTED_VERSIONS)}")
    major, minor, patch = (int(part) for part in parts)
    return major, minor, patch


def at_least(v: str, minimum: str) -> bool:
    """True when spec version ``v`` is ``minimum`` or newer."""
    return parse_version(v) >= parse_version(minimum)


def is_supported(v: str) -> bool:
    """True for a version multusd can convert results to and from."""
    return v in SUPPORTED_VERSIONS


def require_supported(v: str, source: str = "") -> str:
    """Return ``v`` if multusd supports it.

    :raises IncompatibleCNIVersion: naming ``source`` and the versions that would work.
    """
    parse_version(v)
    if v not in SUPPORTED_VERSIONS:
        where = f" in {source}" if source else ""
        raise IncompatibleCNIVersion(
            f"cniVersion {v!r}{where} is not supported; use one of "
            f"{', '.join(SUPPORTED_VERSIONS)}")
    return v


def supports_check(v: str) -> bool:
    """CHECK (and a cached prevResult on DEL) exist from spec 0.4.0 on."""
    return at_least(v, COMMAND_MIN_VERSION["CHECK"])


def supports_status_gc(v: str) -> bool:
    """STATUS and GC exist from spec 1.1.0 on."""
    return all(at_least(v, COMMAND_MIN_VERSION[command]) for command in ("STATUS", "GC"))


def is_legacy(v: str) -> bool:
    """0.x results carry ``ips[].version`` and always a ``dns`` object."""
    return parse_version(v) < (1, 0, 0)


def has_ip_sections(v: object) -> bool:
    """A result of version ``v`` keeps its addresses and routes in ``ip4``/``ip6`` objects.

    So do 0.1.0 and 0.2.0, the versions before the oldest multusd speaks (which has the
    ``interfaces``/``ips``/``routes`` lists), and a result without a ``cniVersion``. multusd
    never converts such a result, but a plugin may have cached one.
    """
    if v is None:
        return True
    try:
        return parse_version(v) < parse_version(SUPPORTED_VERSIONS[0])  # type: ignore[arg-type]
    except IncompatibleCNIVersion:
        return False
