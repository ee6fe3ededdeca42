"""What ``00-multus.conf`` holds: the CNI config that makes the container runtime call multus-shim.

Upstream's daemon writes this file at start-up and then watches the primary network's
config with fsnotify. multusd does not sit watching: ``multusd-config.path`` watches the
directory and starts ``multusd-config.service``, a oneshot that runs ``multusd
generate-config`` (:func:`multusd.config.generateconfig.run`). Every run looks at the
directory afresh:

* ``multusConfigFile: "auto"`` (the default): pick the primary network (``multusMasterCNI``,
  else the lexically first ``*.conf``/``*.conflist`` in ``multusAutoconfigDir`` that is not
  ``00-multus*``) and write ``<cniConfigDir>/00-multus.conf`` byte for byte as upstream's
  generator would (same keys, same order, Go's ``omitempty`` and HTML escaping).
* any other value is the path of an operator-written config, copied to
  ``<cniConfigDir>/<basename>``.

Unlike upstream, the file is written atomically (``store.atomic_write``), never empty, never
rewritten when its bytes would not change (so the path unit's own trigger dies out), and kept
when the primary disappears or the readiness indicator is absent: a stale configuration is
safer than a half-configured node. Only ``--remove`` (package removal) deletes it, and only
when it looks like ours.

This module decides what the file holds (:func:`plan`, :func:`generate`); writing and
removing it is :mod:`multusd.config.generateconfig`'s.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from multusd import go_fields, go_loads, store
from multusd.store import read_or_none
from multusd.config.reader import ConfigReader, is_wrong_type, lenient_str
from multusd.errors import ConfigError, ConfigProblem, IOFailure

LOG = logging.getLogger(__name__)

MULTUS_CONF_NAME = "00-multus.conf"
GENERATED_PREFIX = "00-multus"
DEFAULT_NETWORK_NAME = "multus-cni-network"
DEFAULT_SHIM_TYPE = "multus-shim"
DEFAULT_CNI_CONFIG_DIR = "/etc/cni/net.d"
AUTO = "auto"
CONF_MODE = 0o600
CONF_DIR_MODE = 0o755

EXIT_OK = 0
EXIT_CONFIG = 1
EXIT_IO = 2

# Upstream's MultusConf field order; only these keys ever reach 00-multus.conf.
OUTPUT_KEYS = (
    "binDir", "capabilities", "cniVersion", "logFile", "logLevel", "logToStderr",
    "logOptions", "name", "clusterNetwork", "namespaceIsolation", "globalNamespaces",
    "type", "cniDir", "auxiliaryCNIChainName", "daemonSocketDir",
)
_STRING_KEYS = (
    "binDir", "cniVersion", "logFile", "logLevel", "globalNamespaces", "type", "cniDir",
    "auxiliaryCNIChainName", "daemonSocketDir", "multusConfigFile", "multusMasterCNI",
    "multusAutoconfigDir", "cniConfigDir", "readinessindicatorfile",
)
_BOOL_KEYS = ("logToStderr", "namespaceIsolation", "forceCNIVersion", "overrideNetworkName")
_MULTUS_CONF_POINTERS = ("capabilities", "logOptions")  # a map, a pointer to a struct
_MULTUS_CONF_KEYS = ("name", "clusterNetwork") + _STRING_KEYS + _BOOL_KEYS + _MULTUS_CONF_POINTERS
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
_CHECK_INTRODUCED = (0, 4, 0, 1)  # CNI 0.4.0 added CHECK: a primary below it cannot follow
_NOT_OMITTED = ("cniVersion", "name", "type")  # upstream's fields without omitempty
_STABLE_READ_TRIES = 3


class Plan(NamedTuple):
    """What one run would do: the file to write, or what it is still waiting for."""

    target: str                       # the file in cniConfigDir
    document: Optional[Dict[str, Any]]  # None: nothing to write yet
    content: Optional[bytes]          # the exact bytes of ``target``
    waiting_for: str                  # why there is nothing to write ('' when there is)
    primary: str                      # auto mode: the primary's path ('' when none)
    primary_rewrite: Optional[bytes]  # forceCNIVersion: the primary's new bytes


class _Settings(NamedTuple):
    auto: bool
    static_file: str
    autoconfig_dir: str
    master: str
    readiness_file: str
    cni_version: str
    force_version: bool
    override_name: bool
    shim_type: str
    source: str
    conf: Mapping[str, Any]


# --------------------------------------------------------------------------- public API

def generate(daemon_conf: Mapping[str, Any], *,
             source: str = "daemon-config.json") -> Optional[Dict[str, Any]]:
    """The content of 00-multus.conf for ``daemon_conf``, keys in upstream's order.

    Reads the primary network's config but writes nothing (with ``forceCNIVersion`` the
    result is what upstream generates after rewriting the primary; :func:`run` does the
    rewrite). In static mode (``multusConfigFile`` a path) it is that file's parsed content.

    :returns: the document, or None when there is nothing to write yet (no primary network,
        or ``readinessindicatorfile`` set and absent).
    :raises ConfigError: listing every problem of the daemon config and the primary.
    :raises IOFailure: when a file exists but cannot be read.
    """
    return plan(daemon_conf, source=source).document


def render(document: Mapping[str, Any], sort_keys: bool = False) -> bytes:
    """``document`` serialised as Go's ``json.Marshal`` would: compact, HTML-escaped, UTF-8."""
    return store.go_json(document, sort_keys=sort_keys).encode("utf-8")


def plan(daemon_conf: Mapping[str, Any], *, source: str = "daemon-config.json") -> Plan:
    """Decide what to write for ``daemon_conf`` without writing anything.

    :raises ConfigError: listing every problem found.
    :raises IOFailure: when a file exists but cannot be read.
    """
    settings = _settings(daemon_conf, source)
    if settings.readiness_file and not os.path.exists(settings.readiness_file):
        target = _target(settings)
        return Plan(target, None, None,
                    f"readinessindicatorfile {settings.readiness_file!r}, which the default "
                    "network writes once it is ready", "", None)
    if not settings.auto:
        return _plan_static(settings)
    return _plan_auto(settings)


def load_daemon_config(config_path: str) -> Dict[str, Any]:
    """daemon-config.json as a dict (plain JSON, no drop-ins).

    :raises ConfigError: the file is missing, is not JSON, or is not a JSON object.
    """
    try:
        with open(config_path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(config_path, [ConfigProblem(
            config_path, "does not exist; write the daemon config there or pass "
                         "--config with the path of yours")]) from None
    except OSError as exc:
        raise ConfigError(config_path, [ConfigProblem(
            config_path, f"cannot be read ({exc.strerror}); fix its permissions")]) from exc
    return _parse_object(raw, config_path, "the daemon config")


# --------------------------------------------------------------------------- settings

def _settings(conf: Mapping[str, Any], source: str) -> _Settings:
    """Validate the keys this module reads; collect every problem before failing."""
    problems = ConfigReader()
    if not isinstance(conf, Mapping):
        raise ConfigError(source, [ConfigProblem(source, "must be a JSON object {...}")])
    # As upstream's MultusConf struct reads the daemon config: "CNIVersion" is a cniVersion.
    conf = go_fields(conf, _MULTUS_CONF_KEYS, nils=_MULTUS_CONF_POINTERS,
                     merges=_MULTUS_CONF_POINTERS)
    for key in _STRING_KEYS:
        problems.expect(conf, key, str, "a string")
    for key in _BOOL_KEYS:
        problems.expect(conf, key, bool, "true or false")
    _check_capabilities(conf, problems)
    conf["logOptions"] = problems.log_options(conf)

    mode = lenient_str(conf, "multusConfigFile", AUTO) or AUTO
    auto = mode == AUTO
    autoconfig_dir = lenient_str(conf, "multusAutoconfigDir", "")
    master = lenient_str(conf, "multusMasterCNI", "")
    cni_version = lenient_str(conf, "cniVersion", "")
    shim_type = lenient_str(conf, "type", DEFAULT_SHIM_TYPE)
    if conf.get("type") == "":
        problems.append(ConfigProblem("type", "must not be empty; remove the key to use "
                                              f"{DEFAULT_SHIM_TYPE!r}"))
    if auto:
        if not autoconfig_dir and not is_wrong_type(conf, "multusAutoconfigDir", str):
            problems.append(ConfigProblem(
                "multusAutoconfigDir", "is required when multusConfigFile is \"auto\"; write "
                "the directory holding the primary network's config, e.g. \"/etc/cni/net.d\""))
        if not cni_version and not is_wrong_type(conf, "cniVersion", str):
            problems.append(ConfigProblem(
                "cniVersion", "the CNI version is a mandatory parameter when the "
                "'-multus-config-file=auto' option is used; write e.g. \"0.4.0\" or \"1.0.0\""))
        elif cni_version and not _SEMVER.match(cni_version):
            problems.append(ConfigProblem(
                "cniVersion", f"couldn't get top level cni version from {cni_version!r}; "
                "write a full version such as \"1.0.0\""))
        if os.path.basename(master) == MULTUS_CONF_NAME:
            problems.append(ConfigProblem(
                "multusMasterCNI", f"cannot be {MULTUS_CONF_NAME!r}, the file multusd "
                "generates (a recursive config); name the primary network's file instead"))
    elif not os.path.isabs(mode):
        problems.append(ConfigProblem(
            "multusConfigFile", f"must be \"auto\" or an absolute path, got {mode!r}"))
    readiness = lenient_str(conf, "readinessindicatorfile", "")
    if problems:
        raise ConfigError(source, problems)
    return _Settings(
        auto=auto, static_file="" if auto else mode, autoconfig_dir=autoconfig_dir,
        master=master,
        readiness_file=os.path.normpath(readiness) if readiness else "",
        cni_version=cni_version, force_version=conf.get("forceCNIVersion") is True,
        override_name=conf.get("overrideNetworkName") is True, shim_type=shim_type,
        source=source, conf=conf)


def _check_capabilities(conf: Mapping[str, Any], problems: ConfigReader) -> None:
    caps = conf.get("capabilities")
    if caps is None:
        return
    if not isinstance(caps, dict):
        problems.bad("capabilities", "an object of name: true/false", caps)
        return
    for name in caps:
        problems.expect(caps, name, bool, "true or false", prefix="capabilities.")


def _target(settings: _Settings) -> str:
    return runtime_conf_paths(settings.conf)[0]


def runtime_conf_paths(daemon_conf: Mapping[str, Any]) -> Tuple[str, ...]:
    """Where the runtime's multus config is: the file written to ``cniConfigDir`` (auto mode:
    00-multus.conf; static mode: the copy of ``multusConfigFile``), then in static mode the
    operator's file itself. Read leniently (keys of a wrong type: their defaults)."""
    mode = lenient_str(daemon_conf, "multusConfigFile", AUTO) or AUTO
    directory = lenient_str(daemon_conf, "cniConfigDir", "") or DEFAULT_CNI_CONFIG_DIR
    if mode == AUTO:
        return (os.path.join(directory, MULTUS_CONF_NAME),)
    return (os.path.join(directory, os.path.basename(mode)), mode)


# --------------------------------------------------------------------------- static mode

def _plan_static(settings: _Settings) -> Plan:
    """An operator-written config: copied byte for byte, after checking it is a JSON object."""
    path = settings.static_file
    raw = read_or_none(path)
    if raw is None:
        raise ConfigError(settings.source, [ConfigProblem(
            "multusConfigFile", f"{path!r} does not exist; write that file or set "
                                "multusConfigFile to \"auto\"")])
    document = _parse_object(raw, path, "multusConfigFile")  # an empty file fails here too
    return Plan(_target(settings), document, raw, "", "", None)


# --------------------------------------------------------------------------- auto mode

def _plan_auto(settings: _Settings) -> Plan:
    target = _target(settings)
    primary, waiting = find_primary(settings.autoconfig_dir, settings.master)
    if not primary:
        return Plan(target, None, None, waiting, "", None)
    raw = _read_stable(primary)
    if raw is None:  # removed between listing and reading
        return Plan(target, None, None, f"the primary network config {primary!r}", "", None)
    data = _parse_object(raw, primary, "the primary network config")
    problems: List[ConfigProblem] = []
    rewrite = None
    if settings.force_version:
        if data.get("cniVersion") != settings.cni_version:
            data = dict(data, cniVersion=settings.cni_version)
            rewrite = render(data, sort_keys=True)  # what upstream's rewrite produces
    else:
        _check_version(settings.cni_version, data, primary, problems)
    capabilities = _primary_capabilities(data, primary, problems)
    name = _network_name(settings, data, primary, problems)
    if problems:
        raise ConfigError(settings.source, problems)
    document = _document(settings.conf, settings.cni_version, name, primary, capabilities,
                         settings.shim_type)
    return Plan(target, document, render(document), "", primary, rewrite)


def find_primary(autoconfig_dir: str, master: str = "") -> Tuple[str, str]:
    """The primary network's config file, as upstream picks it.

    :returns: ``(path, "")``, or ``("", what we are waiting for)`` when there is none yet.
    :raises IOFailure: the directory exists but cannot be listed.
    """
    if master:
        path = os.path.join(autoconfig_dir, master)
        if os.path.isfile(path):
            return path, ""
        return "", f"multusMasterCNI {path!r} to be written"
    try:
        names = os.listdir(autoconfig_dir)
    except FileNotFoundError:
        return "", f"multusAutoconfigDir {autoconfig_dir!r} to be created"
    except OSError as exc:
        raise IOFailure(f"cannot list multusAutoconfigDir {autoconfig_dir!r}: "
                        f"{exc.strerror}") from exc
    candidates = sorted(name for name in names if is_candidate(autoconfig_dir, name))
    if not candidates:
        return "", (f"a primary network config (*.conf or *.conflist) in {autoconfig_dir!r}; "
                    "install the cluster's default network plugin")
    return os.path.join(autoconfig_dir, candidates[0]), ""


def is_candidate(directory: str, name: str) -> bool:
    if name.startswith(GENERATED_PREFIX):
        return False
    # Go's filepath.Ext: .conf and .conflist only, never .json
    if not (name.endswith(".conf") or name.endswith(".conflist")):
        return False
    return os.path.isfile(os.path.join(directory, name))


def _check_version(multus_version: str, primary: Mapping[str, Any], path: str,
                   problems: List[ConfigProblem]) -> None:
    """F25: a multus config at >= 0.4.0 cannot delegate to a primary below 0.4.0."""
    top = _semver_key(multus_version)
    if top is None:
        problems.append(_delegate_problem(path, "couldn't get top level cni version",
                                          "write a full cniVersion such as \"1.0.0\" in the "
                                          "daemon config"))
        return
    if top < _CHECK_INTRODUCED:
        return
    version = primary.get("cniVersion")
    if not isinstance(version, str):
        problems.append(_delegate_problem(path, "couldn't get cni version of delegate",
                                          f"write a \"cniVersion\" in {path}"))
        return
    key = _semver_key(version)
    if key is None:
        problems.append(_delegate_problem(path, f"invalid cniVersion {version!r}",
                                          f"write a full version such as \"1.0.0\" in {path}"))
    elif key < _CHECK_INTRODUCED:
        problems.append(_delegate_problem(
            path, f"delegate cni version is {version} while top level cni version is "
                  f"{multus_version}",
            f"raise cniVersion in {path} to at least 0.4.0, or lower cniVersion in the daemon "
            "config below 0.4.0, or set \"forceCNIVersion\": true"))


def _delegate_problem(path: str, error: str, remedy: str) -> ConfigProblem:
    return ConfigProblem(path, "failed to load the primary CNI configuration as a multus "
                               f"delegate with error '{error}'; {remedy}")


def _semver_key(version: str) -> Optional[Tuple[int, int, int, int]]:
    """A sortable key; a pre-release sorts before its release, as semver says."""
    match = _SEMVER.match(version or "")
    if not match:
        return None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3)),
            0 if match.group(4) else 1)


def _primary_capabilities(primary: Mapping[str, Any], path: str,
                          problems: List[ConfigProblem]) -> List[str]:
    """Capabilities set to true: a conflist's plugins[].capabilities, else the top level's."""
    plugins = primary.get("plugins")
    if plugins is not None and not isinstance(plugins, list):
        problems.append(ConfigProblem(f"{path}: plugins", "must be a list of plugin configs"))
        return []
    sources = plugins if plugins else [primary]
    enabled: List[str] = []
    for plugin in sources:
        caps = plugin.get("capabilities") if isinstance(plugin, dict) else None
        if isinstance(caps, dict):
            enabled.extend(name for name, value in caps.items() if value is True)
    return enabled


def _network_name(settings: _Settings, primary: Mapping[str, Any], path: str,
                  problems: List[ConfigProblem]) -> str:
    if not settings.override_name:
        return DEFAULT_NETWORK_NAME
    name = primary.get("name")
    if not isinstance(name, str) or not name:
        problems.append(ConfigProblem(
            "overrideNetworkName", f"the primary CNI configuration {path!r} does not feature "
                                   "the network name; give it a \"name\" or remove "
                                   "overrideNetworkName"))
        return ""
    return name


def _document(conf: Mapping[str, Any], cni_version: str, name: str, primary: str,
              primary_caps: List[str], shim_type: str) -> Dict[str, Any]:
    """Upstream's MultusConf marshalled: its field order, empty values left out."""
    capabilities = dict(conf.get("capabilities") or {})
    capabilities.update((cap, True) for cap in primary_caps)
    values: Dict[str, Any] = {
        "binDir": conf.get("binDir"),
        "capabilities": {key: capabilities[key] for key in sorted(capabilities)},
        "cniVersion": cni_version,
        "logFile": conf.get("logFile"),
        "logLevel": conf.get("logLevel"),
        "logToStderr": conf.get("logToStderr") is True,
        "logOptions": conf.get("logOptions"),  # a pointer: present (even as {}) when set
        "name": name,
        "clusterNetwork": primary,
        "namespaceIsolation": conf.get("namespaceIsolation") is True,
        "globalNamespaces": conf.get("globalNamespaces"),
        "type": shim_type,
        "cniDir": conf.get("cniDir"),
        "auxiliaryCNIChainName": conf.get("auxiliaryCNIChainName"),
        "daemonSocketDir": conf.get("daemonSocketDir"),
    }
    return {key: values[key] for key in OUTPUT_KEYS
            if key in _NOT_OMITTED or not _omitted(key, values[key])}


def _omitted(key: str, value: Any) -> bool:
    """Go's omitempty: "", false, nil and empty maps go; logOptions is a pointer (nil only)."""
    if key == "logOptions":
        return value is None
    return value is None or value == "" or value is False or value == {}


def stat_key(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def looks_generated(raw: bytes, shim_type: str = DEFAULT_SHIM_TYPE) -> bool:
    """Whether ``raw`` is a 00-multus.conf a generator (ours or upstream's) wrote.

    Recognised by content, so the file stays byte-compatible with upstream's: only
    generator keys, a non-empty ``clusterNetwork``, and the shim's ``type``.
    """
    try:
        doc = go_loads(raw)
    except ValueError:
        return False
    if not isinstance(doc, dict) or not set(doc) <= set(OUTPUT_KEYS):
        return False
    cluster = doc.get("clusterNetwork")
    return (isinstance(cluster, str) and bool(cluster)
            and doc.get("type") in (shim_type, DEFAULT_SHIM_TYPE)
            and isinstance(doc.get("name"), str))


# --------------------------------------------------------------------------- file helpers

def _read_stable(path: str) -> Optional[bytes]:
    """Read a file another tool may be writing in place; retry while it changes under us."""
    raw = None
    for _ in range(_STABLE_READ_TRIES):
        before = stat_key(path)
        raw = read_or_none(path)
        if raw is None or stat_key(path) == before:
            return raw
    return raw


def _parse_object(raw: bytes, path: str, what: str) -> Dict[str, Any]:
    try:
        doc = go_loads(raw)  # as upstream reads it (invalid UTF-8 in a string is U+FFFD)
    except ValueError as exc:
        raise ConfigError(path, [ConfigProblem(path, f"{what} is not valid JSON ({exc}); fix "
                                                     "it, nothing is written until it parses")]
                          ) from exc
    if not isinstance(doc, dict):
        raise ConfigError(path, [ConfigProblem(path, f"{what} must be a JSON object {{...}}, "
                                                     f"got {type(doc).__name__}")])
    return doc


