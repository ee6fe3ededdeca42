"""multusd: Multus CNI's thick plugin as a host service, and the CNI spec facts all its layers share.

The shim (``wire/``: the standard library and :mod:`multusd.errors` only) and the engine
(``cni/``) both need the spec's versions, what each command requires, the conversion of a
result between versions, Multus's default ``cniDir`` (where the daemon's records and the
shim's marks of a failed DEL meet) and the names of those marks; besides the error hierarchy,
this package is the one module both may import, so each of these is defined here, once.
Nothing is imported here, on purpose: the shim is imported through this package once per pod sandbox and must start fast, and the error
hierarchy imports this package. So a result that cannot be converted is reported as a
:class:`ResultError` carrying its CNI error code; :func:`multusd.errors.from_exception` makes
it the error it stands for (the engine's :func:`multusd.cni.result.convert_result` and the
shim do).

Result conversion follows libcni's converters: a result is first read into the fields the
spec defines for its version (unknown keys are dropped, as libcni's typed decode does), then
written out in the target version's shape.

* 0.3.x/0.4.0 ``ips[]`` carry ``version`` ("4"/"6"); 1.0.0+ have none (it is derived
  from the address when going down).
* ``interfaces[]`` keep ``name``, ``mac``, ``sandbox`` in every version; ``mtu``,
  ``socketPath`` and ``pciID`` only exist in 1.x results and are dropped going to 0.x.
* ``routes[]`` and ``dns`` carry over unchanged. A 0.x result always has a ``dns``
  object (libcni prints ``{}``); a 1.x result omits an empty one.

Usage::

    down = convert({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}]}, "0.4.0")
    # {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.1.0.5/24"}], "dns": {}}
"""

__version__ = "0.1.0"

#: The CNI spec versions multusd speaks, oldest first (0.1.0/0.2.0 results are not supported).
SUPPORTED_VERSIONS: tuple = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

#: The newest of them: the version of the result the daemon answers ADD with (as upstream's
#: answers with its newest; a version added above must be one upstream's shim can read), the
#: cap of a plugin's ``cniVersions`` list, and the version of an error no config names one for.
CURRENT_VERSION: str = SUPPORTED_VERSIONS[-1]

#: The oldest config version that has each command (as the CNI skel library checks); DEL
#: sends a cached ``prevResult`` from CHECK's version on.
COMMAND_MIN_VERSION: dict = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}

#: Multus's default ``cniDir``: the scratch cache, libcni's result cache (the directory Multus
#: gives libcni) and the marks of a failed DEL.
DEFAULT_CNI_DIR: str = "/var/lib/cni/multus"

#: The marks of a DEL that failed, one file per container ID in ``<cniDir>/<UNRELEASED_DIR>``
#: (a name no container ID has), written by the shim when the daemon cannot answer
#: (``wire/delwindow``) and by the daemon (``core/unreleased``): who wrote a mark, the runtime's
#: request env kept in it (to run the DEL again), and the daemon's ``deleteRetryWindow`` for
#: the shim, in ``<UNRELEASED_DIR>/<WINDOW_FILE>``.
UNRELEASED_DIR: str = ".multusd-unreleased"
WINDOW_FILE: str = ".settings"
MARKED_BY_SHIM, MARKED_BY_DAEMON = "shim", "daemon"
MARK_REQUEST_ENV: tuple = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME",
                           "CNI_ARGS", "CNI_PATH")

#: The keys of the spec's DNS object (a result's ``dns``, a network config's ``dns``).
DNS_KEYS: tuple = ("nameservers", "domain", "search", "options")

_ROUTE_KEYS = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
_INTERFACE_KEYS = {True: ("name", "mac", "sandbox"),
                   False: ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")}
_ZERO_OMITTED = frozenset(("mtu", "advmss", "priority"))


class ResultError(ValueError):
    """A result :func:`convert` cannot convert; ``code`` is the CNI error code it stands for:
    1 (IncompatibleCNIVersion, a version multusd does not speak) or 6 (DecodeFailure, not a
    CNI result)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg


def convert(result: dict, to_version: str) -> dict:
    """``result`` rewritten for spec version ``to_version``; ``result`` is not modified.

    :raises ResultError: code 1 when either version is not supported, code 6 when ``result``
        is not a CNI result object.
    """
    if not isinstance(result, dict):
        raise _decode_failure(f"a CNI result must be a JSON object, got {type(result).__name__}")
    from_version = result.get("cniVersion", "")
    _require_supported(from_version, "the result being converted")
    _require_supported(to_version, "the requested result version")
    legacy, from_legacy = to_version.startswith("0."), from_version.startswith("0.")
    out: dict = {"cniVersion": to_version}
    sections = (("interfaces", [_pick(i, _INTERFACE_KEYS[legacy])
                                for i in _list(result, "interfaces")]),
                ("ips", [_convert_ip(ip, legacy, from_legacy) for ip in _list(result, "ips")]),
                ("routes", [_pick(r, _ROUTE_KEYS) for r in _list(result, "routes")]))
    out.update((key, value) for key, value in sections if value)
    dns = _dns(result.get("dns"))
    if dns or legacy:
        out["dns"] = dns
    return out


def _require_supported(version: object, what: str) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise ResultError(1, f"cniVersion {version!r} in {what} is not supported; use one of "
                             f"{', '.join(SUPPORTED_VERSIONS)}")


def _decode_failure(msg: str) -> ResultError:
    return ResultError(6, msg)


def _convert_ip(ip: object, legacy: bool, from_legacy: bool) -> dict:
    if not isinstance(ip, dict) or not ip.get("address"):
        raise _decode_failure(f"invalid entry {ip!r} in a CNI result's 'ips': needs an 'address'")
    out: dict = {}
    if legacy:
        # A 0.x source says its family; a 1.x one never does (libcni derives it).
        out["version"] = (from_legacy and ip.get("version")) or _ip_family(ip["address"])
    if ip.get("interface") is not None:
        out["interface"] = ip["interface"]
    out["address"] = ip["address"]
    if ip.get("gateway"):
        out["gateway"] = ip["gateway"]
    return out


def _ip_family(address: object) -> str:
    """``"4"`` or ``"6"`` for a CIDR or bare address."""
    host = address.split("/", 1)[0] if isinstance(address, str) else ""
    if ":" in host:
        return "6"
    if host.count(".") == 3 and all(part.isdigit() for part in host.split(".")):
        return "4"
    raise _decode_failure(f"invalid IP address {address!r} in a CNI result")


def _dns(dns: object) -> dict:
    if not isinstance(dns, dict):
        return {}
    return {key: _copy(dns[key]) for key in DNS_KEYS if dns.get(key)}


def _pick(source: object, keys: tuple) -> dict:
    """The set ``keys`` of ``source``, copied.

    libcni omits empty strings and zero ``mtu``/``advmss``/``priority``; ``table`` and
    ``scope`` are pointers there, so an explicit 0 survives.
    """
    if not isinstance(source, dict):
        raise _decode_failure(f"invalid entry {source!r} in a CNI result: expected an object")
    return {key: _copy(source[key]) for key in keys
            if not (source.get(key) in (None, "", [], {})
                    or (key in _ZERO_OMITTED and source.get(key) == 0))}


def _list(result: dict, key: str) -> list:
    value = result.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _decode_failure(f"invalid {key!r} in a CNI result: expected a list, got {value!r}")
    return value


def _copy(value: object) -> object:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
