"""CNI results as plain dicts: conversion between spec versions and small queries.

Conversion follows libcni's converters: a result is first read into the fields the
spec defines for its version (unknown keys are dropped, as libcni's typed decode does),
then written out in the target version's shape.

* 0.3.x/0.4.0 ``ips[]`` carry ``version`` ("4"/"6"); 1.0.0+ have none (it is derived
  from the address when going down).
* ``interfaces[]`` keep ``name``, ``mac``, ``sandbox`` in every version; ``mtu``,
  ``socketPath`` and ``pciID`` only exist in 1.x results and are dropped going to 0.x.
* ``routes[]`` and ``dns`` carry over unchanged. A 0.x result always has a ``dns``
  object (libcni prints ``{}``); a 1.x result omits an empty one.

Usage::

    down = convert_result({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}]},
                          "0.4.0")
    # {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.1.0.5/24"}], "dns": {}}
"""

from __future__ import annotations

from multusd.errors import DecodeFailure
from multusd.cni.version import is_legacy, require_supported

# The shim's side of this conversion is multusd.wire.result (wire/ may not import cni/);
# tests/unit/wire/test_wire_result.py keeps the two identical.

_ROUTE_KEYS = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
_DNS_KEYS = ("nameservers", "domain", "search", "options")
_LEGACY_INTERFACE_KEYS = ("name", "mac", "sandbox")
_INTERFACE_KEYS = ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")
_ZERO_OMITTED = frozenset(("mtu", "advmss", "priority"))


def convert_result(result: dict, to_version: str) -> dict:
    """``result`` rewritten for spec version ``to_version``; ``result`` is not modified.

    :raises IncompatibleCNIVersion: when either version is not supported.
    :raises DecodeFailure: when ``result`` is not a CNI result object.
    """
    if not isinstance(result, dict):
        raise DecodeFailure(f"a CNI result must be a JSON object, got {type(result).__name__}")
    from_version = result.get("cniVersion", "")
    require_supported(from_version, "the result being converted")
    require_supported(to_version, "the requested result version")
    legacy = is_legacy(to_version)
    from_legacy = is_legacy(from_version)
    out: dict = {"cniVersion": to_version}
    interfaces = [_convert_interface(i, legacy) for i in _list(result, "interfaces")]
    if interfaces:
        out["interfaces"] = interfaces
    ips = [_convert_ip(ip, legacy, from_legacy) for ip in _list(result, "ips")]
    if ips:
        out["ips"] = ips
    routes = [_pick(route, _ROUTE_KEYS) for route in _list(result, "routes")]
    if routes:
        out["routes"] = routes
    dns = _convert_dns(result.get("dns"))
    if dns or legacy:
        out["dns"] = dns
    return out


def is_empty(result: dict | None) -> bool:
    """True when ``result`` has no interfaces, addresses, routes or DNS settings."""
    if not result:
        return True
    return not (result.get("interfaces") or result.get("ips") or result.get("routes")
                or _convert_dns(result.get("dns")))


def ip_addresses(result: dict) -> list:
    """The ``address`` (CIDR) of every entry of ``ips``, in order."""
    return [ip["address"] for ip in _list(result, "ips") if ip.get("address")]


def ip_family(address: str) -> str:
    """``"4"`` or ``"6"`` for a CIDR or bare address.

    :raises DecodeFailure: when ``address`` is not an IP address.
    """
    host = address.split("/", 1)[0] if isinstance(address, str) else ""
    if ":" in host:
        return "6"
    if host.count(".") == 3 and all(part.isdigit() for part in host.split(".")):
        return "4"
    raise DecodeFailure(f"invalid IP address {address!r} in a CNI result")


def _convert_interface(interface: dict, legacy: bool) -> dict:
    return _pick(interface, _LEGACY_INTERFACE_KEYS if legacy else _INTERFACE_KEYS)


def _convert_ip(ip: dict, legacy: bool, from_legacy: bool) -> dict:
    if not isinstance(ip, dict) or not ip.get("address"):
        raise DecodeFailure(f"invalid entry {ip!r} in a CNI result's 'ips': needs an 'address'")
    out: dict = {}
    if legacy:
        # A 0.x source says its family; a 1.x one never does (libcni derives it).
        out["version"] = (from_legacy and ip.get("version")) or ip_family(ip["address"])
    if ip.get("interface") is not None:
        out["interface"] = ip["interface"]
    out["address"] = ip["address"]
    if ip.get("gateway"):
        out["gateway"] = ip["gateway"]
    return out


def _convert_dns(dns: object) -> dict:
    if not isinstance(dns, dict):
        return {}
    return {key: _copy(dns[key]) for key in _DNS_KEYS if dns.get(key)}


def _pick(source: object, keys: tuple) -> dict:
    """The set ``keys`` of ``source``, copied.

    libcni omits empty strings and zero ``mtu``/``advmss``/``priority``; ``table`` and
    ``scope`` are pointers there, so an explicit 0 survives.
    """
    if not isinstance(source, dict):
        raise DecodeFailure(f"invalid entry {source!r} in a CNI result: expected an object")
    return {key: _copy(source[key]) for key in keys if not _omitted(key, source.get(key))}


def _omitted(key: str, value: object) -> bool:
    if value is None or value == "" or value == [] or value == {}:
        return True
    return key in _ZERO_OMITTED and value == 0


def _list(result: dict, key: str) -> list:
    value = result.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeFailure(f"invalid {key!r} in a CNI result: expected a list, got {value!r}")
    return value


def _copy(value: object) -> object:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
