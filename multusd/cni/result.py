"""CNI results in the daemon: the spec's conversion failing with the error hierarchy, and queries.

The conversion itself is :func:`multusd.convert`, shared with the shim (which may import
neither the engine nor, on its happy path, the errors); here what it reports
(:class:`multusd.ResultError`) becomes the :class:`~multusd.errors.IncompatibleCNIVersion` or
:class:`~multusd.errors.DecodeFailure` it stands for.
"""

from __future__ import annotations

from multusd import DNS_KEYS, ResultError, convert
from multusd.errors import DecodeFailure, from_exception


def convert_result(result: dict, to_version: str) -> dict:
    """``result`` rewritten for spec version ``to_version`` (:func:`multusd.convert`).

    :raises IncompatibleCNIVersion: when either version is not supported.
    :raises DecodeFailure: when ``result`` is not a CNI result object.
    """
    try:
        return convert(result, to_version)
    except ResultError as exc:
        raise from_exception(exc) from None


def is_empty(result: dict | None) -> bool:
    """True when ``result`` has no interfaces, addresses, routes or DNS settings."""
    if not result:
        return True
    dns = result.get("dns")
    return not (result.get("interfaces") or result.get("ips") or result.get("routes")
                or (isinstance(dns, dict) and any(dns.get(key) for key in DNS_KEYS)))


def ip_addresses(result: dict) -> list:
    """The ``address`` (CIDR) of every entry of ``ips``, in order.

    :raises DecodeFailure: when ``ips`` is not a list.
    """
    ips = result.get("ips")
    if ips is not None and not isinstance(ips, list):
        raise DecodeFailure(f"invalid 'ips' in a CNI result: expected a list, got {ips!r}")
    return [ip["address"] for ip in ips or () if ip.get("address")]
