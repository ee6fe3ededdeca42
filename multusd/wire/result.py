"""The ADD result as it crosses the wire, rewritten for the runtime's cniVersion (the shim's side).

multusd's daemon answers ADD with a 1.1.0 result and upstream's with 1.0.0 ("current"); the
runtime wants the version of its own config. This is the same conversion as the engine's
:func:`multusd.cni.result.convert_result`, spelled out here because ``wire/`` may import
nothing but the standard library and :mod:`multusd.errors` (the shim runs once per pod and
must stay independent of the daemon's layers). ``tests/unit/wire/test_wire_result.py`` holds
the two to the same output for every pair of versions, so they cannot drift apart.
"""

from multusd import SUPPORTED_VERSIONS, wire

_ROUTE_KEYS = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
_DNS_KEYS = ("nameservers", "domain", "search", "options")
_INTERFACE_KEYS = {True: ("name", "mac", "sandbox"),
                   False: ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")}
_ZERO_OMITTED = frozenset(("mtu", "advmss", "priority"))


def for_runtime(result: object, to_version: str) -> dict:
    """``result`` in spec version ``to_version`` (libcni's typed decode, then its encoder).

    :raises IncompatibleCNIVersion: either version is not supported.
    :raises DecodeFailure: ``result`` is not a CNI result object.
    """
    if not isinstance(result, dict):
        raise wire.errors().DecodeFailure(f"a CNI result must be a JSON object, got {type(result).__name__}")
    from_version = result.get("cniVersion", "")
    for version, what in ((from_version, "the result being converted"),
                          (to_version, "the requested result version")):
        if version not in SUPPORTED_VERSIONS:
            raise wire.errors().IncompatibleCNIVersion(
                f"incompatible CNI versions: {what} has cniVersion {version!r}; supported: "
                f"{', '.join(SUPPORTED_VERSIONS)}")
    legacy, from_legacy = to_version.startswith("0."), from_version.startswith("0.")
    out: dict = {"cniVersion": to_version}
    sections = (("interfaces", [_pick(i, _INTERFACE_KEYS[legacy])
                                for i in _list(result, "interfaces")]),
                ("ips", [_ip(ip, legacy, from_legacy) for ip in _list(result, "ips")]),
                ("routes", [_pick(r, _ROUTE_KEYS) for r in _list(result, "routes")]))
    out.update((key, value) for key, value in sections if value)
    dns = result.get("dns")
    dns = {k: _copy(dns[k]) for k in _DNS_KEYS if dns.get(k)} if isinstance(dns, dict) else {}
    if dns or legacy:
        out["dns"] = dns
    return out


def _ip(ip: object, legacy: bool, from_legacy: bool) -> dict:
    if not isinstance(ip, dict) or not ip.get("address"):
        raise wire.errors().DecodeFailure(f"invalid entry {ip!r} in a CNI result's 'ips': needs an 'address'")
    out: dict = {}
    if legacy:
        out["version"] = (from_legacy and ip.get("version")) or _family(ip["address"])
    if ip.get("interface") is not None:
        out["interface"] = ip["interface"]
    out["address"] = ip["address"]
    if ip.get("gateway"):
        out["gateway"] = ip["gateway"]
    return out


def _family(address: object) -> str:
    host = address.split("/", 1)[0] if isinstance(address, str) else ""
    if ":" in host:
        return "6"
    if host.count(".") == 3 and all(part.isdigit() for part in host.split(".")):
        return "4"
    raise wire.errors().DecodeFailure(f"invalid IP address {address!r} in a CNI result")


def _pick(source: object, keys: tuple) -> dict:
    if not isinstance(source, dict):
        raise wire.errors().DecodeFailure(f"invalid entry {source!r} in a CNI result: expected an object")
    return {key: _copy(source[key]) for key in keys
            if not (source.get(key) in (None, "", [], {})
                    or (key in _ZERO_OMITTED and source.get(key) == 0))}


def _list(result: dict, key: str) -> list:
    value = result.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise wire.errors().DecodeFailure(f"invalid {key!r} in a CNI result: expected a list, got {value!r}")
    return value


def _copy(value: object) -> object:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
