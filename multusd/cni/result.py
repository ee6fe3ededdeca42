"""CNI results in the daemon: the spec's conversion failing with the error hierarchy, queries,
and a result's default routes taken out or added (what a cached result must say after a
default-route fixup).

The conversion itself is :func:`multusd.convert`, shared with the shim (which may import
neither the engine nor, on its happy path, the errors); here what it reports
(:class:`multusd.ResultError`) becomes the :class:`~multusd.errors.IncompatibleCNIVersion` or
:class:`~multusd.errors.DecodeFailure` it stands for. Which delegate loses or gains a default
route is Multus's rule (:mod:`multusd.core.defaultroute`); the edits here only do as told,
in the result's own shape (``routes``, or the ``ip4``/``ip6`` objects of a 0.1.0/0.2.0 one).
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import DNS_KEYS, ResultError, convert
from multusd.cni.version import has_ip_sections
from multusd.errors import DecodeFailure, from_exception

_DEFAULT_DST = {4: "0.0.0.0/0", 6: "::/0"}


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


def without_default_routes(result: Mapping[str, Any], ipv4: bool, ipv6: bool,
                           where: str = "the cached result") -> Dict[str, Any]:
    """A copy of ``result`` without its IPv4 and/or IPv6 default routes.

    A default route is one whose ``dst`` has prefix length 0 (``0.0.0.0/0``, ``::/0``,
    ``::0/0``); routes without a parsable ``dst`` are kept. 0.1.0/0.2.0 results keep
    routes in ``ip4``/``ip6``; later ones in ``routes`` (dropped when it becomes empty).

    :raises DecodeFailure: ``routes`` is not a list of objects (``where`` names the file).
    """
    out = copy.deepcopy(dict(result))
    for section, version, wanted in _route_sections(out, where):
        if not wanted(ipv4, ipv6):
            continue
        routes = _routes_of(section, where)
        if routes is None:
            continue
        kept = [r for r in routes if _route_default_version(r) != version]
        if kept:
            section["routes"] = kept
        else:
            section.pop("routes", None)
    return out


def with_default_routes(result: Mapping[str, Any], gateways: Sequence[Any],
                        where: str = "the cached result") -> Dict[str, Any]:
    """A copy of ``result`` with a ``{"dst": <default>, "gw": <gateway>}`` route per gateway.

    For a 0.1.0/0.2.0 result the route goes into ``ip4``/``ip6`` and only if that section
    exists (upstream behaviour).

    :param gateways: IP addresses (``ipaddress`` objects, or strings the caller checked).
    :raises DecodeFailure: ``routes`` is not a list of objects.
    """
    out = copy.deepcopy(dict(result))
    for gateway in gateways:
        address = ipaddress.ip_address(gateway)
        route = {"dst": _DEFAULT_DST[address.version], "gw": str(address)}
        if has_ip_sections(out.get("cniVersion")):
            section = out.get("ip4" if address.version == 4 else "ip6")
            if not isinstance(section, dict):
                continue
        else:
            section = out
        routes = _routes_of(section, where) or []
        section["routes"] = routes + [route]
    return out


# --- internals -----------------------------------------------------------------------------


def _route_sections(result: Dict[str, Any], where: str) -> List[Tuple[Dict[str, Any], int, Any]]:
    """(section holding "routes", IP version it may hold a default for, family selector)."""
    def v4(ipv4: bool, ipv6: bool) -> bool:
        return ipv4

    def v6(ipv4: bool, ipv6: bool) -> bool:
        return ipv6

    if not has_ip_sections(result.get("cniVersion")):
        # One list for both families: select per route, so run it once per family.
        return [(result, 4, v4), (result, 6, v6)]
    sections = []
    for key, version, wanted in (("ip4", 4, v4), ("ip6", 6, v6)):
        section = result.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise DecodeFailure(f"{where}: {key!r} is not an object")
        sections.append((section, version, wanted))
    return sections


def _routes_of(section: Mapping[str, Any], where: str) -> Optional[List[Dict[str, Any]]]:
    routes = section.get("routes")
    if routes is None:
        return None
    if not isinstance(routes, list) or not all(isinstance(r, dict) for r in routes):
        raise DecodeFailure(f"{where}: 'routes' must be a list of route objects; remove the "
                            "corrupt cache file and recreate the pod sandbox")
    return list(routes)


def _route_default_version(route: Mapping[str, Any]) -> Optional[int]:
    """4 or 6 when ``route`` is a default route of that version, else None."""
    dst = route.get("dst")
    if not isinstance(dst, str):
        return None
    try:
        network = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return None
    return network.version if network.prefixlen == 0 else None
