"""multusd: Multus CNI's thick plugin as a host service, and the CNI spec facts all its layers share.

The shim (``wire/``: the standard library and :mod:`multusd.errors` only), the engine
(``cni/``) and the core (``core/``) need the spec's versions, what each command requires, the
conversion of a result between versions, how a config names its ``cniDir`` (where the
daemon's records and the marks of a failed DEL meet) and how daemon-config.json is laid over
the runtime's (:func:`overlaid`), where those marks are, their format
(:func:`mark_json`, :func:`parse_mark`) and the clock their windows are counted on; besides
the error hierarchy, this package is the one module all of them may import, so each of these
is defined here, once.
Nothing is imported here at load time but :mod:`multusd.gojson` (standard library only,
importing nothing itself), on purpose: the shim is imported through this package once per pod
sandbox and must start fast, and the error hierarchy imports this package. So a
result that cannot be converted is reported as a :class:`ResultError` carrying its CNI error
code; :func:`multusd.errors.from_exception` makes it the error it stands for (the engine's
:func:`multusd.cni.result.convert_result` and the shim do).

JSON is read as upstream reads it (architecture invariant 15) by :mod:`multusd.gojson`, which
every layer reaches through this package: :func:`go_loads` is Go's ``json.Unmarshal`` into an
``interface{}``, :func:`go_field`/:func:`go_fields` read a Go struct's fields out of what it
returns; Go's ``json.Marshal`` is :func:`multusd.store.go_json` (the daemon's alone).

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
#: (a name no container ID has), written by the shim when the daemon cannot answer, or answers
#: an error (``wire/delwindow``), and by the daemon (``core/delmarks``), both in the one format
#: :func:`mark_json` writes and :func:`parse_mark` reads: who wrote a mark, the runtime's
#: request env kept in it (to run the DEL again), and the daemon's ``deleteRetryWindow`` for
#: the shim, in ``<UNRELEASED_DIR>/<WINDOW_FILE>``. When ``<cniDir>`` cannot take a mark (a
#: full or read-only disk, a file where the directory should be), it goes to the same name in
#: the socket's directory (``/run/multus``): see :func:`unreleased_marks_dir`.
UNRELEASED_DIR: str = ".multusd-unreleased"
WINDOW_FILE: str = ".settings"
MARKED_BY_SHIM, MARKED_BY_DAEMON = "shim", "daemon"
MARK_REQUEST_ENV: tuple = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME",
                           "CNI_ARGS", "CNI_PATH")
#: Where the kernel says which boot this is (a new random UUID at every boot).
BOOT_ID_FILE: str = "/proc/sys/kernel/random/boot_id"


def cni_dir_of(conf: dict) -> str:
    """The ``cniDir`` a config names (the shim's 00-multus.conf, or a request's merged config):
    where a sandbox's records and the marks of its failed DEL are. The shim and the daemon
    both read it here, so that they always agree.

    Read as upstream's NetConf struct reads it (``"CNIDir"`` too). Absent, null, "" or not a
    string (a config upstream would refuse): Multus's default; a relative path is taken from
    ``/``, the working directory of the daemon under systemd (and of upstream's), so that the
    shim, whatever its runtime's working directory, finds the same place.
    """
    value = go_field(conf, "cniDir")
    if not isinstance(value, str) or not value or "\0" in value:
        return DEFAULT_CNI_DIR
    return value if value.startswith("/") else "/" + value


def overlaid(conf: dict, daemon: dict) -> dict:
    """``conf`` (the runtime's multus config) with every top-level key of ``daemon``
    (daemon-config.json) laid over it, nested values replaced whole: upstream's overlay (F09),
    what a request's merged config is (:func:`multusd.config.daemonconf.overlay`) and what the
    shim reads ``cniDir`` from when a DEL failed, so that both find the same one. As
    upstream's: two maps (keys exactly as written, the daemon's winning), the result with its
    keys sorted, as upstream writes it out and reads it into its NetConf struct, so that a
    struct read of it (:func:`go_field`) meets its members in that order."""
    merged = dict(conf)
    merged.update(daemon)
    return GoObject(sorted(merged.items()))


def unreleased_marks_dir(directory: str) -> str:
    """The marks' directory under ``directory``: ``<cniDir>`` (their home, beside the records)
    or the socket's directory (``/run/multus``, for a mark ``<cniDir>`` cannot take)."""
    return directory.rstrip("/") + "/" + UNRELEASED_DIR


# --- the clock of a DEL's window ---------------------------------------------------------
# A window must end when it says, whatever happens to the wall clock: a step back of N days
# (an NTP correction, a wrong RTC at boot) must not keep DEL failing for N days. Within a boot
# it is counted on CLOCK_BOOTTIME, which nothing steps and which counts suspended time too;
# a mark written in another boot falls back to the wall clock, but never for more than one
# window, and the next write of the mark counts the rest on this boot's clock again.


def clock_now() -> tuple:
    """``(wall clock, boot id, CLOCK_BOOTTIME)``, now; the boot id is "" where the kernel
    does not say it (then the wall clock alone counts, bounded as across boots)."""
    import time

    try:
        with open(BOOT_ID_FILE, "rb") as handle:
            boot_id = handle.read(64).decode("ascii", "replace").strip()
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, AttributeError):
        boot_id, boot = "", 0.0
    return time.time(), boot_id, boot


def as_instant(now: object = None) -> tuple:
    """``now`` as a :func:`clock_now` reading: None is now; a number is a wall-clock time
    with no boot clock (what tests and an old caller pass)."""
    if now is None:
        return clock_now()
    if isinstance(now, tuple):
        return now
    return float(now), "", 0.0


def window_left(mark: dict, now: object = None) -> float:
    """Seconds until the DEL window of ``mark`` ends (its JSON keys ``until``, ``window``,
    ``bootId``, ``untilBoot``); 0 or less once it has ended. A mark that names no end has
    ended (a window that cannot be read must not hold a drain)."""
    wall, boot_id, boot = as_instant(now)
    until_boot = number_of(mark.get("untilBoot"))
    if boot_id and mark.get("bootId") == boot_id and until_boot is not None:
        return until_boot - boot
    until = number_of(mark.get("until"))
    if until is None:
        return 0.0
    window = number_of(mark.get("window"))
    left = until - wall
    return min(left, window) if window is not None and window > 0 else left


def window_end(window: float, before: "dict | None", now: object = None) -> dict:
    """The keys of a mark's window, ``{"until", "bootId", "untilBoot"}``: ``window`` seconds
    from the first failure that ``before`` (the mark as written until now; None: this failure
    is the first) records, no more than ``window`` from now, counted on this boot's clock."""
    wall, boot_id, boot = as_instant(now)
    left, until = window, wall + window
    if before is not None:
        old = number_of(before.get("window"))
        change = window - old if old else 0.0
        left = min(window, window_left(before, now) + change)
        until = wall + left
        if boot_id and before.get("bootId") == boot_id and \
                number_of(before.get("untilBoot")) is not None and \
                number_of(before.get("until")) is not None:
            until = before["until"] + change  # as first said, whatever the wall clock did
    end = {"until": until, "bootId": boot_id}
    if boot_id:
        end["untilBoot"] = boot + left
    return end


def number_of(value: object) -> "float | None":
    """A JSON number as a float (a bool is no number); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def seconds_of(value: object) -> "float | None":
    """A JSON number of seconds, positive (a window, a timeout a config names); else None."""
    number = number_of(value)
    return number if number is not None and number > 0 else None


# --- the mark of a failed DEL: one format, two writers -----------------------------------
# The shim (wire/delwindow: standard library only, and only when a DEL failed) and the daemon
# (core/delmarks, whose FailedDelete is the typed view) write and read the same file: these
# two functions are its one definition, here so that the shim imports nothing more for it.


def mark_request(env: dict, config: bytes) -> dict:
    """The runtime's DEL request as a mark keeps it, to run it again as sent: its
    :data:`MARK_REQUEST_ENV` variables (never the rest of its environment) and its config."""
    return {"env": {key: env[key] for key in MARK_REQUEST_ENV if key in env},
            "config": config.decode("utf-8", "replace")}


def mark_json(container_id: str, *, by: str, first_failure: float, last_failure: float,
              end: dict, window: float, attempts: int, error: str, cni_dir: str,
              request: "dict | None", failures: "list | tuple" = (),
              released: "list | tuple" = (), announced: bool = False) -> dict:
    """The mark of ``container_id``'s failed DEL as it is written.

    ``by``: :data:`MARKED_BY_SHIM` or :data:`MARKED_BY_DAEMON`; times: seconds since the
    epoch; ``end``: the window's end as :func:`window_end` gives it (``until``, ``bootId``,
    ``untilBoot``); ``cni_dir``: where the sandbox's records are; ``request``:
    :func:`mark_request`'s; ``failures``: ``(network, interface, error)`` of each delegate
    whose DEL failed and ``released``: ``(network, interface)`` of each released already
    (the daemon's; the shim knows neither); ``announced``: the journal and the pod were told.
    """
    return {"containerId": container_id, "by": by, "firstFailure": first_failure,
            "lastFailure": last_failure, "until": end["until"],
            "bootId": end.get("bootId") or "", "untilBoot": end.get("untilBoot"),
            "window": window, "attempts": attempts, "error": error,
            "failures": [{"network": network, "interface": ifname, "error": why}
                         for network, ifname, why in failures],
            "released": [{"network": network, "interface": ifname}
                         for network, ifname in released],
            "cniDir": cni_dir or None, "announced": announced, "request": request}


def parse_mark(container_id: str, data: object) -> "dict | None":
    """``data`` (a mark file's JSON) read as the mark of ``container_id``: every key of
    :func:`mark_json`, of its type (one missing or of another type: its default); None when
    it is no mark (not an object, another container's, or no first failure).

    Defaults: ``lastFailure`` and ``until`` the first failure, ``attempts`` 1, ``by`` the
    shim (a mark that does not say), ``window`` 0, ``cniDir`` None (not an absolute path:
    the reader's own).
    """
    if not isinstance(data, dict) or data.get("containerId", container_id) != container_id:
        return None
    first = number_of(data.get("firstFailure"))
    if not first:
        return None
    attempts, request, cni_dir = data.get("attempts"), data.get("request"), data.get("cniDir")
    return mark_json(
        container_id, by=str(data.get("by") or MARKED_BY_SHIM), first_failure=first,
        last_failure=_number_or(data.get("lastFailure"), first),
        end={"until": _number_or(data.get("until"), first),
             "bootId": str(data.get("bootId") or ""),
             "untilBoot": number_of(data.get("untilBoot"))},
        window=_number_or(data.get("window"), 0.0),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 1,
        error=str(data.get("error") or ""),
        failures=[(str(f.get("network", "")), str(f.get("interface", "")),
                   str(f.get("error", ""))) for f in _objects(data.get("failures"))],
        released=[(str(r.get("network", "")), str(r.get("interface", "")))
                  for r in _objects(data.get("released"))],
        cni_dir=cni_dir if isinstance(cni_dir, str) and cni_dir.startswith("/") else "",
        request=request if isinstance(request, dict) else None,
        announced=data.get("announced") is True)


def marks_places(cni_dir: str, spare: str = "") -> list:
    """Where the marks of ``cni_dir``'s sandboxes are, in the order they are looked for and
    written: ``<cniDir>``'s marks directory, then ``spare`` (the socket directory's, for a
    mark ``<cniDir>`` cannot take) when there is another."""
    home = unreleased_marks_dir(cni_dir)
    return [home] + ([spare] if spare and spare != home else [])


def _number_or(value: object, default: float) -> float:
    number = number_of(value)
    return default if number is None else number


def _objects(value: object) -> list:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


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


# JSON as Go reads it: a module of its own (its size), part of this shared root.
from multusd.gojson import (MAX_JSON_DEPTH, GoObject, ascii_json, go_field,  # noqa: E402
                            go_fields, go_fold, go_loads)
