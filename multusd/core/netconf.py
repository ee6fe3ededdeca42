"""Loading delegate CNI configs from files, directories and NADs.

Upstream's ``types/conf.go`` loading and NAD utils' ``GetCNIConfigFromFile``: conf and
conflist files (with the ``<dir>/<name>/*.conf`` subdirectory chain), the first conf of a
directory, a NAD's ``spec.config`` (or the conf file its empty spec names), and the
``clusterNetwork``/``defaultNetworks`` lookup across both. Reads files; NADs come through a
:class:`NadGetter`, no Kubernetes client of its own.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Protocol, Tuple

from multusd import go_field, go_loads
from multusd.cni.names import is_valid_name
from multusd.errors import InvalidNetworkConfig, IOFailure, MultusError
from multusd.store import go_json

RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"

_CONF_EXTENSIONS = (".conf", ".json", ".conflist")


class NadGetter(Protocol):
    """Looks a NetworkAttachmentDefinition up; None when it does not exist.

    The object returned has ``.namespace``, ``.name``, ``.config`` (the ``spec.config``
    string, "" when the spec is empty) and ``.annotations``. Other failures (API down) are
    raised as :class:`~multusd.errors.MultusError` (e.g. TryAgainLater).
    """

    def __call__(self, namespace: str, name: str) -> Any: ...


def load_conf_file(path: str) -> bytes:
    """A conf or conflist file, as its delegate bytes.

    A ``.conflist`` also gets the plugins of ``<dir>/<name>/*.conf`` (unless
    ``loadOnlyInlinedPlugins``), rebuilt without losing any key. Anything else must be a
    single plugin config with a ``type``.

    :raises InvalidNetworkConfig: unreadable, not a regular file, or not a usable config.
    """
    try:
        if not os.path.isfile(path):
            raise InvalidNetworkConfig(f"error loading CNI config file {path!r}: it is not a "
                                       "regular file")
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise IOFailure(f"error loading CNI config file {path!r}: {exc.strerror}") from exc
    if path.endswith(".conflist"):
        return _conflist_bytes(_parse_conflist(raw, path, os.path.dirname(path)))
    _parse_plugin_conf(raw, path)
    return raw


def nad_config(nad: Any, conf_dir: str) -> bytes:
    """The delegate bytes of a NAD: ``spec.config`` with its name filled in when missing.

    An empty spec means "the file in ``conf_dir`` whose name is the NAD's name" (F35).

    :raises InvalidNetworkConfig: bad JSON, no type/plugins, or no such file.
    """
    namespace, name = getattr(nad, "namespace", ""), getattr(nad, "name", "")
    where = f"network-attachment-definition {namespace}/{name}"
    config = getattr(nad, "config", "") or ""
    if config == "":
        conf = find_conf_by_name(conf_dir, name)
        if conf is None:
            raise InvalidNetworkConfig(
                f"{where} has an empty spec and no file in {conf_dir!r} has \"name\": "
                f"{name!r}; put the CNI config in spec.config or add such a file to confDir")
    else:
        try:
            data = go_loads(config)
        except ValueError as exc:
            raise InvalidNetworkConfig(f"{where}: spec.config is not valid JSON ({exc}); "
                                       "fix the NAD's CNI config") from None
        if not isinstance(data, dict):
            raise InvalidNetworkConfig(f"{where}: spec.config must be a JSON object (a CNI "
                                       "conf or conflist)")
        conf = config.encode("utf-8", "surrogatepass")
        if "name" not in data or data["name"] == "":  # a Go map: "name" exactly
            # The NAD name becomes the network name (thick plugin behaviour, F35).
            data["name"] = name
            conf = go_json(data, sort_keys=True).encode()
    check_delegate_conf(conf, where)
    return conf


def resolve_network(ref: str, *, multus_namespace: str, conf_dir: str,
                    get_nad: Optional[NadGetter]) -> Tuple[str, bytes, str]:
    """Resolve a ``clusterNetwork`` or ``defaultNetworks`` entry (F31).

    Without ``/``: the NAD ``<multus_namespace>/<ref>``, else the conf named ``ref`` in
    ``conf_dir``. With ``/``: a directory (its first conf file) or a conf/conflist file.

    :returns: (network-status name, delegate config bytes, the NAD's resourceName or "").
    :raises InvalidNetworkConfig: when nothing usable is found, saying where it looked.
    """
    if "/" not in ref:
        return _resolve_by_name(ref, multus_namespace, conf_dir, get_nad)
    if os.path.isdir(ref):
        conf = find_conf_by_name(ref, None) if _has_conf_files(ref) else None
        if conf is None:
            raise InvalidNetworkConfig(f"cannot find network: {ref!r} is a directory without "
                                       "any .conf or .conflist file")
        return network_name(conf), conf, ""
    if not os.path.exists(ref):
        raise InvalidNetworkConfig(f"cannot find network: {ref!r} does not exist; give an "
                                   "existing conf/conflist file or directory, or a network name")
    conf = load_conf_file(ref)
    return network_name(conf), conf, ""


def chained_conflist(raw: bytes, source: str, chain_dir: str) -> Tuple[bytes, int]:
    """A conflist with the plugins of ``<chain_dir>/<name>/*.conf`` appended, losslessly.

    :returns: (the delegate bytes, how many plugins they hold in all).
    :raises InvalidNetworkConfig: not a usable conflist, or a broken chained plugin file.
    """
    parts = _parse_conflist(raw, source, chain_dir)
    return _conflist_bytes(parts), len(parts.inline) + len(parts.chained)


def conf_object(conf: bytes) -> Dict[str, Any]:
    """A config as a JSON object (read as Go reads it); {} when it is not valid JSON or not an
    object."""
    try:
        data = go_loads(conf)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def check_delegate_conf(conf: bytes, where: str) -> None:
    """Upstream's LoadDelegateNetConf checks: a ``type``, or ``plugins`` whose first has one
    (its NetConf and NetConfList structs: ``"Type"`` and ``"Plugins"`` count too)."""
    try:
        data = go_loads(conf)
    except ValueError as exc:
        raise InvalidNetworkConfig(f"{where}: the CNI config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidNetworkConfig(f"{where}: the CNI config must be a JSON object")
    if go_field(data, "type"):
        return
    plugins = go_field(data, "plugins", nil=True)
    if not isinstance(plugins, list):
        raise InvalidNetworkConfig(f"{where}: delegate must have the 'type' or 'plugin' field; "
                                   "give a conf with \"type\" or a conflist with \"plugins\"")
    if not plugins or not isinstance(plugins[0], dict) or not go_field(plugins[0], "type"):
        raise InvalidNetworkConfig(f"{where}: a plugin delegate must have the 'type' field; "
                                   "the first of \"plugins\" has none")


def network_name(conf: bytes) -> str:
    """The config's ``name`` (the network name: upstream's NetConf/NetConfList ``Name``), ""
    when it has none."""
    name = go_field(conf_object(conf), "name")
    return name if isinstance(name, str) else ""


def nad_resource_name(nad: Any) -> str:
    """The NAD's ``k8s.v1.cni.cncf.io/resourceName`` annotation, "" when unset."""
    annotations = getattr(nad, "annotations", None) or {}
    return str(annotations.get(RESOURCE_NAME_ANNOTATION, "") or "")


def marshal_raw_map(data: Mapping[str, Any], overrides: Mapping[str, str]) -> str:
    """Go's ``json.Marshal(map[string]json.RawMessage)``: sorted keys, values kept as they are."""
    members = []
    for key in sorted(data):
        value = overrides[key] if key in overrides else go_json(data[key])
        members.append(f"{go_json(key)}:{value}")
    return "{" + ",".join(members) + "}"


# --- internals -----------------------------------------------------------------------------


def _resolve_by_name(ref: str, multus_namespace: str, conf_dir: str,
                     get_nad: Optional[NadGetter]) -> Tuple[str, bytes, str]:
    lookup_error: Optional[MultusError] = None
    if get_nad is not None:
        try:
            nad = get_nad(multus_namespace, ref)
        except MultusError as exc:
            # The API may be down; a conf file of that name still works without it.
            nad, lookup_error = None, exc
        if nad is not None:
            return f"{multus_namespace}/{ref}", nad_config(nad, conf_dir), nad_resource_name(nad)
    conf = find_conf_by_name(conf_dir, ref)
    if conf is not None:
        return network_name(conf), conf, ""
    if lookup_error is not None:
        raise lookup_error
    raise InvalidNetworkConfig(
        f"cannot find network {ref!r}: there is no network-attachment-definition "
        f"{multus_namespace}/{ref} and no .conf/.json/.conflist file in {conf_dir!r} with "
        f"\"name\": {ref!r}; create one of them")


class _ConfListParts(NamedTuple):
    data: Dict[str, Any]          # the list-level object as read
    inline: List[Dict[str, Any]]  # its "plugins"
    chained: List[Dict[str, Any]]  # plugins from <dir>/<name>/*.conf, key order kept


def _parse_plugin_conf(raw: bytes, source: str) -> Dict[str, Any]:
    """libcni's ConfFromBytes: a NetConf struct (``"Type"`` sets its type)."""
    try:
        data = go_loads(raw)
    except ValueError as exc:
        raise InvalidNetworkConfig(f"error loading CNI config file {source!r}: error parsing "
                                   f"configuration: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidNetworkConfig(f"error loading CNI config file {source!r}: it must hold a "
                                   "JSON object")
    plugin_type = go_field(data, "type")
    if not isinstance(plugin_type, str) or not plugin_type:
        raise InvalidNetworkConfig(f"error loading CNI config file {source!r}: no 'type'; "
                                   "perhaps this is supposed to be a .conflist?")
    return data


def _read_bool(data: Mapping[str, Any], key: str, source: str) -> bool:
    value = data.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidNetworkConfig(f"error parsing configuration list {source!r}: invalid value "
                               f"{go_json(value)[:80]} for {key}; use true or false")


def _parse_conflist(raw: bytes, source: str, chain_dir: Optional[str],
                    strict_name: bool = True) -> _ConfListParts:
    """libcni's conflist loading, plus the subdirectory chain when ``chain_dir`` is given.

    libcni reads the list into a map (its keys exactly: ``"Name"`` is no ``name``) and each
    plugin into a NetConf struct (``"Type"`` is a ``type``).

    With ``strict_name`` (Multus' own chain loading) a name unusable as a directory is an
    error; without it (libcni's directory scan) such a list simply has no chain.
    """
    def fail(problem: str) -> InvalidNetworkConfig:
        return InvalidNetworkConfig(f"error loading CNI conflist {source!r}: {problem}")

    try:
        data = go_loads(raw)
    except ValueError as exc:
        raise fail(f"error parsing configuration list: {exc}") from None
    if not isinstance(data, dict):
        raise fail("it must hold a JSON object")
    name = data.get("name")
    if not isinstance(name, str):
        raise fail("no name: a conflist needs a string \"name\"")
    if "cniVersion" in data and not isinstance(data["cniVersion"], str):
        raise fail("\"cniVersion\" must be a string")
    for key in ("disableCheck", "disableGC"):
        _read_bool(data, key, source)
    inline_only = _read_bool(data, "loadOnlyInlinedPlugins", source)
    plugins = data.get("plugins")
    if plugins is None and inline_only:
        raise fail("'loadOnlyInlinedPlugins' is true, and there is no 'plugins' key")
    if plugins is not None and (not isinstance(plugins, list) or not plugins):
        raise fail("'plugins' must be a non-empty list of plugin configs")
    inline = list(plugins or [])
    for index, plugin in enumerate(inline):
        plugin_type = go_field(plugin, "type")
        if not isinstance(plugin, dict) or not isinstance(plugin_type, str) or not plugin_type:
            raise fail(f"failed to parse plugin config {index}: missing 'type'")
    chained: List[Dict[str, Any]] = []
    if chain_dir is not None and not inline_only:
        if is_valid_name(name):  # usable as the chain's directory name
            chained = _chained_plugins(os.path.join(chain_dir, name))
        elif strict_name:
            raise fail(f"invalid network config name {name!r}: it must start with a letter or "
                       "digit followed by letters, digits, '_', '.' or '-'")
    if not inline and not chained:
        raise fail("no plugin configs found")
    return _ConfListParts(data, inline, chained)


def _chained_plugins(directory: str) -> List[Dict[str, Any]]:
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".conf"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise IOFailure(f"failed to read plugin config files in {directory!r}: "
                        f"{exc.strerror}") from exc
    plugins = []
    for filename in names:
        path = os.path.join(directory, filename)
        if os.path.isdir(path):
            continue
        with open(path, "rb") as handle:
            plugins.append(_parse_plugin_conf(handle.read(), path))
    return plugins


def _conflist_bytes(parts: _ConfListParts) -> bytes:
    """Upstream's lossless conflist bytes: list keys sorted, every plugin's own keys kept."""
    # Inline plugins went through Go's interface{} (sorted keys); chained ones are raw bytes.
    plugins = [go_json(p, sort_keys=True) for p in parts.inline]
    plugins += [go_json(p) for p in parts.chained]
    data = dict(parts.data)
    data["plugins"] = None
    return marshal_raw_map(data, {"plugins": "[" + ",".join(plugins) + "]"}).encode()


def _has_conf_files(directory: str) -> bool:
    try:
        return any(n.endswith((".conf", ".conflist")) and not os.path.isdir(
            os.path.join(directory, n)) for n in os.listdir(directory))
    except OSError:
        return False


def find_conf_by_name(conf_dir: str, name: str) -> Optional[bytes]:
    """The first ``.conf``/``.json``/``.conflist`` file of ``conf_dir`` (sorted) named ``name``.

    A missing directory finds nothing. Like upstream, a broken file met before the match is
    an error rather than being skipped.

    :raises InvalidNetworkConfig: a broken config file in ``conf_dir``.
    """
    try:
        filenames = sorted(os.listdir(conf_dir))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise IOFailure(f"cannot list CNI config directory {conf_dir!r}: {exc.strerror}") \
            from exc
    for filename in filenames:
        extension = filename[filename.rfind("."):] if "." in filename else ""
        path = os.path.join(conf_dir, filename)
        if extension not in _CONF_EXTENSIONS or os.path.isdir(path):
            continue
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise IOFailure(f"error loading CNI config file {path!r}: {exc.strerror}") from exc
        if extension == ".conflist":
            found = _parse_conflist(raw, path, conf_dir, strict_name=False).data.get("name")
        else:
            found = go_field(_parse_plugin_conf(raw, path), "name")
        if name is None or found == name:
            return raw
    return None
