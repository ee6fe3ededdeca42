"""Which delegates a pod gets, in order, with the exact config bytes each one will execute.

Resolves, as upstream Multus does (``k8sclient.go:GetDefaultNetworks``, ``TryLoadPodDelegates``,
``types/conf.go:LoadNetConf``, ``multus.go:CmdAdd``):

1. the master: ``clusterNetwork`` (a NAD, a conf name in ``confDir``, a directory or a file),
   or else ``delegates[0]`` of the multus config;
2. ``defaultNetworks`` (not for pods in ``systemNamespaces``) or the other ``delegates``;
3. the pod's ``v1.multus-cni.io/default-network`` annotation, which replaces the master;
4. the pod's ``k8s.v1.cni.cncf.io/networks`` selections (NADs), with namespace isolation;
5. the ``auxiliaryCNIChainName`` chain;

then validates ``default-route`` requests (no ECMP) and names the interfaces. It also reads
and writes upstream's scratch cache format (``<cniDir>/<containerID>``). Reads conf files;
no Kubernetes client of its own (NADs come through a :class:`NadGetter`), no processes.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
from dataclasses import dataclass, replace
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Protocol,
                    Sequence, Tuple)

from .errors import (ConfigError, ConfigProblem, DecodeFailure, InvalidNetworkConfig, IOFailure,
                     MultusError)
from .netstatus import go_ip_string, go_json
from .runtimeconf import inject_cni_args
from .selection import (DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION, NetworkSelection,
                        parse_default_network, parse_ip, parse_selections)

LOG = logging.getLogger(__name__)

RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
DEFAULT_CONF_DIR = "/etc/cni/multus/net.d"
DEFAULT_MULTUS_NAMESPACE = "kube-system"
DEFAULT_SYSTEM_NAMESPACES = ("kube-system",)
DEFAULT_GLOBAL_NAMESPACES = ("default",)
PASSTHRU_PLUGIN = {"type": "passthru", "name": "passthru-cni"}

_CONF_EXTENSIONS = (".conf", ".json", ".conflist")
# CNI spec: a network name usable as a directory name for the subdirectory plugin chain.
_CHAIN_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


@dataclass(frozen=True)
class Delegate:
    """One network attachment of a pod: what to execute and how.

    ``conf`` is the delegate's CNI config (conf or conflist) exactly as it will be executed.
    The ``*_request`` fields are the pod's per-attachment requests (upstream stores them in
    the scratch cache, so DEL sees the same as ADD); ``port_mappings`` and ``bandwidth`` are
    not cached, as upstream.
    """

    name: str
    conf: bytes
    ifname: str
    master: bool
    selection: Optional[NetworkSelection] = None
    resource_name: str = ""
    device_id: str = ""
    ifname_request: str = ""
    mac_request: str = ""
    ip_request: Tuple[str, ...] = ()
    infiniband_guid_request: str = ""
    gateway_request: Optional[Tuple[str, ...]] = None
    port_mappings: Tuple[Dict[str, Any], ...] = ()
    bandwidth: Optional[Dict[str, Any]] = None
    filter_v4_gateway: bool = False
    filter_v6_gateway: bool = False

    @property
    def is_conflist(self) -> bool:
        """True for a conflist (no top-level ``type``), as upstream decides."""
        return not _json_object(self.conf).get("type")

    @property
    def conf_name(self) -> str:
        """The ``name`` inside the config: libcni's network name (its result-cache key)."""
        name = _json_object(self.conf).get("name")
        return name if isinstance(name, str) else ""

    @property
    def plugin_type(self) -> str:
        """The plugin type (a conflist's first plugin), for messages."""
        data = _json_object(self.conf)
        if data.get("type"):
            return str(data["type"])
        plugins = data.get("plugins")
        if isinstance(plugins, list) and plugins and isinstance(plugins[0], dict):
            return str(plugins[0].get("type", ""))
        return ""


class NadGetter(Protocol):
    """Looks a NetworkAttachmentDefinition up; None when it does not exist.

    The object returned has ``.namespace``, ``.name``, ``.config`` (the ``spec.config``
    string, "" when the spec is empty) and ``.annotations``. Other failures (API down) are
    raised as :class:`~multusd.errors.MultusError` (e.g. TryAgainLater).
    """

    def __call__(self, namespace: str, name: str) -> Any: ...


DeviceIdGetter = Callable[[str], str]
"""Given a NAD's resourceName, the next device ID allocated to the pod for it ("" if none)."""


class NadNotFound(InvalidNetworkConfig):
    """A network-attachment-definition the pod needs does not exist.

    ``namespace`` and ``nad_name`` name it; ``event_message`` is upstream's text for the
    ``NoNetworkFound`` Warning event the caller emits.
    """

    def __init__(self, namespace: str, nad_name: str, reason: str = "") -> None:
        self.namespace = namespace
        self.nad_name = nad_name
        reason = reason or f'network-attachment-definitions.k8s.cni.cncf.io "{nad_name}" not found'
        self.event_message = (f"cannot find a network-attachment-definition ({nad_name}) "
                              f"in namespace ({namespace}): {reason}")
        super().__init__(f"{self.event_message}; create it, or correct the pod's annotation")


@dataclass(frozen=True)
class MultusSettings:
    """The keys of the merged multus config that decide what a pod gets (F29 defaults)."""

    conf_dir: str = DEFAULT_CONF_DIR
    multus_namespace: str = DEFAULT_MULTUS_NAMESPACE
    system_namespaces: Tuple[str, ...] = DEFAULT_SYSTEM_NAMESPACES
    global_namespaces: Tuple[str, ...] = DEFAULT_GLOBAL_NAMESPACES
    namespace_isolation: bool = False
    cluster_network: str = ""
    default_networks: Tuple[str, ...] = ()
    delegates: Tuple[Dict[str, Any], ...] = ()
    auxiliary_chain: str = ""
    cni_version: str = ""


def load_settings(netconf: Mapping[str, Any]) -> MultusSettings:
    """Read and check the selection-related keys of the merged multus config.

    :raises ConfigError: listing every problem (wrong types, neither delegates nor
        clusterNetwork).
    """
    problems: List[ConfigProblem] = []
    reader = _SettingsReader(netconf, problems)
    settings = MultusSettings(
        conf_dir=reader.string("confDir") or DEFAULT_CONF_DIR,
        multus_namespace=reader.string("multusNamespace") or DEFAULT_MULTUS_NAMESPACE,
        system_namespaces=reader.string_list("systemNamespaces", DEFAULT_SYSTEM_NAMESPACES),
        global_namespaces=reader.global_namespaces(),
        namespace_isolation=reader.boolean("namespaceIsolation"),
        cluster_network=reader.string("clusterNetwork"),
        default_networks=reader.string_list("defaultNetworks", ()),
        delegates=reader.objects("delegates"),
        auxiliary_chain=reader.string("auxiliaryCNIChainName"),
        cni_version=reader.string("cniVersion"),
    )
    if not problems and not settings.cluster_network and not settings.delegates:
        problems.append(ConfigProblem("clusterNetwork", "at least one delegate/clusterNetwork "
                                      "must be specified: set clusterNetwork (or delegates)"))
    if problems:
        raise ConfigError("of the multus network config", problems)
    return settings


def build_delegates(netconf: Mapping[str, Any], *, pod_namespace: str, pod_name: str,
                    annotations: Optional[Mapping[str, str]], cni_ifname: str,
                    get_nad: Optional[NadGetter],
                    device_id_for: Optional[DeviceIdGetter] = None) -> List[Delegate]:
    """Every delegate of a pod, in execution order, with interface names assigned.

    :param netconf: the merged multus config (request config with daemon-config overlaid).
    :param annotations: the pod's annotations; None when there is no pod (only the
        cluster network / ``delegates`` are used).
    :param cni_ifname: CNI_IFNAME, the master's interface name.
    :param get_nad: NAD lookup; None when no Kubernetes client is configured.
    :param device_id_for: device-plugin allocation lookup for NADs with a resourceName.
    :raises NadNotFound: when a selected NAD does not exist (emit ``NoNetworkFound``).
    :raises InvalidNetworkConfig: for every other unusable config or annotation.
    """
    settings = load_settings(netconf)
    pod = f"{pod_namespace}/{pod_name}"
    resolver = _Resolver(settings, get_nad, device_id_for, pod)
    if settings.cluster_network:
        delegates = [resolver.cluster_network()]
        if annotations is not None and pod_namespace not in settings.system_namespaces:
            delegates.extend(resolver.default_network(ref) for ref in settings.default_networks)
    else:
        delegates = _inline_delegates(settings.delegates)
    if annotations is not None:
        default_network = annotations.get(DEFAULT_NETWORK_ANNOTATION)
        if default_network is not None:
            selection = parse_default_network(default_network, settings.multus_namespace, pod)
            delegates[0] = resolver.selected(selection, master=True)
        for selection in parse_selections(annotations.get(NETWORKS_ANNOTATION, ""),
                                          pod_namespace, pod=pod):
            _check_namespace_isolation(settings, pod_namespace, selection)
            delegates.append(resolver.selected(selection, master=False))
    if any(d.gateway_request is not None for d in delegates):
        delegates = mark_gateway_filters(delegates)
    if settings.auxiliary_chain:
        auxiliary = _auxiliary_chain(settings)
        if auxiliary is not None:
            delegates.append(auxiliary)
    return _assign_ifnames(delegates, cni_ifname)


def mark_gateway_filters(delegates: Sequence[Delegate]) -> List[Delegate]:
    """Check ``default-route`` requests and mark which delegates lose their default routes (F50).

    Every delegate without a requested IPv4 gateway gets ``filter_v4_gateway`` (same for v6),
    the cluster network included.

    :raises InvalidNetworkConfig: more than one IPv4 or IPv6 gateway overall (ECMP).
    """
    v4 = [(d.name, gw) for d in delegates for gw in d.gateway_request or () if _is_v4(gw)]
    v6 = [(d.name, gw) for d in delegates for gw in d.gateway_request or () if not _is_v4(gw)]
    if len(v4) > 1 or len(v6) > 1:
        listed = ", ".join(f"{gw} ({name})" for name, gw in v4 + v6)
        raise InvalidNetworkConfig(
            f"multus does not support ECMP for default-route: the pod's networks request "
            f"{listed}; request at most one IPv4 and one IPv6 default-route gateway in total")
    marked = []
    for delegate in delegates:
        gateways = delegate.gateway_request or ()
        marked.append(replace(delegate,
                              filter_v4_gateway=not any(_is_v4(gw) for gw in gateways),
                              filter_v6_gateway=not any(not _is_v4(gw) for gw in gateways)))
    return marked


# --- conf files ----------------------------------------------------------------------------


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


def find_conf_by_name(conf_dir: str, name: str) -> Optional[bytes]:
    """The first ``.conf``/``.json``/``.conflist`` file of ``conf_dir`` (sorted) named ``name``.

    A missing directory finds nothing. Like upstream, a broken file met before the match is
    an error rather than being skipped.

    :raises InvalidNetworkConfig: a broken config file in ``conf_dir``.
    """
    return _scan_conf_dir(conf_dir, name)


def nad_config(nad: Any, conf_dir: str) -> bytes:
    """The delegate bytes of a NAD: ``spec.config`` with its name filled in when missing.

    An empty spec means "the file in ``conf_dir`` whose name is the NAD's name" (F35).

    :raises InvalidNetworkConfig: bad JSON, no type/plugins, or no such file.
    """
    namespace, name = getattr(nad, "namespace", ""), getattr(nad, "name", "")
    where = f"network-attachment-definition {namespace}/{name}"
    config = getattr(nad, "config", "") or ""
    if config == "":
        conf = _scan_conf_dir(conf_dir, name)
        if conf is None:
            raise InvalidNetworkConfig(
                f"{where} has an empty spec and no file in {conf_dir!r} has \"name\": "
                f"{name!r}; put the CNI config in spec.config or add such a file to confDir")
    else:
        try:
            data = json.loads(config)
        except ValueError as exc:
            raise InvalidNetworkConfig(f"{where}: spec.config is not valid JSON ({exc}); "
                                       "fix the NAD's CNI config") from None
        if not isinstance(data, dict):
            raise InvalidNetworkConfig(f"{where}: spec.config must be a JSON object (a CNI "
                                       "conf or conflist)")
        conf = config.encode()
        if "name" not in data or data["name"] == "":
            # The NAD name becomes the network name (thick plugin behaviour, F35).
            data["name"] = name
            conf = go_json(data, sort_keys=True).encode()
    _check_delegate_conf(conf, where)
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
        conf = _scan_conf_dir(ref, None) if _has_conf_files(ref) else None
        if conf is None:
            raise InvalidNetworkConfig(f"cannot find network: {ref!r} is a directory without "
                                       "any .conf or .conflist file")
        return _display_name(conf), conf, ""
    if not os.path.exists(ref):
        raise InvalidNetworkConfig(f"cannot find network: {ref!r} does not exist; give an "
                                   "existing conf/conflist file or directory, or a network name")
    conf = load_conf_file(ref)
    return _display_name(conf), conf, ""


def add_device_id(conf: bytes, device_id: str) -> bytes:
    """Put ``deviceID`` and ``pciBusID`` in a conf, or in every plugin of a conflist (F41)."""
    data = _json_object(conf)
    targets = [data] if data.get("type") else [p for p in data.get("plugins") or []
                                               if isinstance(p, dict)]
    for plugin in targets:
        plugin["deviceID"] = device_id
        plugin["pciBusID"] = device_id
    return go_json(data, sort_keys=True).encode()


# --- the scratch cache ---------------------------------------------------------------------


def delegates_to_cache(delegates: Sequence[Delegate]) -> bytes:
    """The scratch-cache content for ``<cniDir>/<containerID>``, in upstream's exact format.

    A JSON array of upstream's ``DelegateNetConf``: ``Conf``, ``ConfList``, ``Name``,
    ``ifnameRequest``, ``macRequest``, ``infinibandGUIDRequest``, ``ipRequest``,
    ``default-route``, ``IsFilterV4Gateway``, ``IsFilterV6Gateway``, ``deviceID``,
    ``resourceName`` and ``Bytes`` (base64 of :attr:`Delegate.conf`).
    """
    return ("[" + ",".join(go_json(_cache_entry(d)) for d in delegates) + "]").encode()


def delegates_from_cache(data: bytes, *, top_cni_version: str = "",
                         cni_ifname: str = "eth0") -> List[Delegate]:
    """The delegates recorded by :func:`delegates_to_cache` or by upstream Multus.

    The first is the master again; interface names are recomputed as on ADD. A conflist
    recorded without ``cniVersion`` gets ``top_cni_version`` (F57), keeping every other key.

    :raises DecodeFailure: when ``data`` is not a cache file.
    """
    try:
        items = json.loads(data)
    except ValueError as exc:
        raise DecodeFailure(f"the multus scratch cache is not valid JSON: {exc}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise DecodeFailure("the multus scratch cache is not a JSON list of delegate objects")
    delegates = []
    for index, item in enumerate(items):
        delegate = _delegate_from_cache_entry(item, index, top_cni_version)
        delegates.append(replace(delegate, ifname=_ifname_for(delegate, cni_ifname, index)))
    return delegates


# --- internals: resolution -----------------------------------------------------------------


class _Resolver:
    """Turns config entries and selections into delegates, for one pod."""

    def __init__(self, settings: MultusSettings, get_nad: Optional[NadGetter],
                 device_id_for: Optional[DeviceIdGetter], pod: str) -> None:
        self.settings = settings
        self.get_nad = get_nad
        self.device_id_for = device_id_for
        self.pod = pod

    def cluster_network(self) -> Delegate:
        ref = self.settings.cluster_network
        try:
            name, conf, resource = resolve_network(
                ref, multus_namespace=self.settings.multus_namespace,
                conf_dir=self.settings.conf_dir, get_nad=self.get_nad)
        except MultusError as exc:
            raise exc.with_prefix(f"failed to get clusterNetwork {ref!r} in namespace "
                                  f"{self.settings.multus_namespace!r}: ") from exc
        return self._with_device(Delegate(name=name, conf=conf, ifname="", master=True), resource)

    def default_network(self, ref: str) -> Delegate:
        try:
            name, conf, resource = resolve_network(
                ref, multus_namespace=self.settings.multus_namespace,
                conf_dir=self.settings.conf_dir, get_nad=self.get_nad)
        except MultusError as exc:
            raise exc.with_prefix(f"failed to get defaultNetworks entry {ref!r}: ") from exc
        return self._with_device(Delegate(name=name, conf=conf, ifname="", master=False),
                                 resource)

    def selected(self, selection: NetworkSelection, *, master: bool) -> Delegate:
        """The delegate of a NAD the pod selects (networks or default-network annotation)."""
        if self.get_nad is None:
            raise InvalidNetworkConfig(
                f"pod {self.pod!r} selects network-attachment-definition "
                f"{selection.namespace}/{selection.name}, but multusd has no Kubernetes "
                "client; set kubeconfig in the daemon config")
        nad = self.get_nad(selection.namespace, selection.name)
        if nad is None:
            raise NadNotFound(selection.namespace, selection.name)
        conf = nad_config(nad, self.settings.conf_dir)
        delegate = self._with_device(
            Delegate(name=f"{selection.namespace}/{selection.name}", conf=conf, ifname="",
                     master=master, selection=selection),
            _resource_name(nad))
        if selection.cni_args is not None:
            delegate = replace(delegate, conf=inject_cni_args(delegate.conf, selection.cni_args))
        return replace(
            delegate,
            # A device the kubelet allocated wins over one the pod asks for (upstream).
            device_id=delegate.device_id or selection.device_id,
            ifname_request=selection.interface, mac_request=selection.mac,
            ip_request=selection.ips, infiniband_guid_request=selection.infiniband_guid,
            gateway_request=selection.default_route, port_mappings=selection.port_mappings,
            bandwidth=selection.bandwidth)

    def _with_device(self, delegate: Delegate, resource_name: str) -> Delegate:
        if not resource_name:
            return delegate
        device_id = self.device_id_for(resource_name) if self.device_id_for else ""
        if not device_id:
            return replace(delegate, resource_name=resource_name)
        return replace(delegate, conf=add_device_id(delegate.conf, device_id),
                       resource_name=resource_name, device_id=device_id)


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
            return f"{multus_namespace}/{ref}", nad_config(nad, conf_dir), _resource_name(nad)
    conf = _scan_conf_dir(conf_dir, ref)
    if conf is not None:
        return _display_name(conf), conf, ""
    if lookup_error is not None:
        raise lookup_error
    raise InvalidNetworkConfig(
        f"cannot find network {ref!r}: there is no network-attachment-definition "
        f"{multus_namespace}/{ref} and no .conf/.json/.conflist file in {conf_dir!r} with "
        f"\"name\": {ref!r}; create one of them")


def _inline_delegates(raw_delegates: Sequence[Mapping[str, Any]]) -> List[Delegate]:
    delegates = []
    for index, raw in enumerate(raw_delegates):
        conf = go_json(raw, sort_keys=True).encode()
        try:
            _check_delegate_conf(conf, f"delegates[{index}] of the multus config")
        except InvalidNetworkConfig as exc:
            raise InvalidNetworkConfig(f"failed to load delegate {index} config: {exc.msg}") \
                from exc
        delegates.append(Delegate(name=_display_name(conf), conf=conf, ifname="",
                                  master=index == 0))
    return delegates


def _check_namespace_isolation(settings: MultusSettings, pod_namespace: str,
                               selection: NetworkSelection) -> None:
    if (settings.namespace_isolation and selection.namespace != pod_namespace
            and selection.namespace not in settings.global_namespaces):
        raise InvalidNetworkConfig(
            "namespace isolation enabled, annotation violates permission, pod is in namespace "
            f"{pod_namespace} but refers to target namespace {selection.namespace}; use a "
            f"network-attachment-definition in {pod_namespace!r}, or add "
            f"{selection.namespace!r} to globalNamespaces")


def _auxiliary_chain(settings: MultusSettings) -> Optional[Delegate]:
    name = settings.auxiliary_chain
    if "/" not in settings.cluster_network:
        raise InvalidNetworkConfig(
            "auxiliary chain used but ClusterNetwork must be a path, and it is not a path: "
            f"{settings.cluster_network!r}; set clusterNetwork to the primary's conf file "
            "or unset auxiliaryCNIChainName")
    skeleton = go_json({"cniVersion": settings.cni_version, "name": name,
                        "plugins": [dict(PASSTHRU_PLUGIN)]}).encode()
    where = f"auxiliaryCNIChainName {name!r}"
    parts = _parse_conflist(skeleton, where, os.path.dirname(settings.cluster_network))
    if len(parts.inline) + len(parts.chained) < 2:
        LOG.debug("auxiliary chain %r has no plugins beyond passthru; not added", name)
        return None
    conf = _conflist_bytes(parts)
    return Delegate(name=name, conf=conf, ifname="", master=False)


def _assign_ifnames(delegates: Sequence[Delegate], cni_ifname: str) -> List[Delegate]:
    named: List[Delegate] = []
    owner: Dict[str, str] = {}
    for index, delegate in enumerate(delegates):
        ifname = _ifname_for(delegate, cni_ifname, index)
        if ifname in owner:
            raise InvalidNetworkConfig(
                f"interface name {ifname!r} would be used twice in the pod: by network "
                f"{owner[ifname]!r} and by network {delegate.name!r}; request a different "
                "'interface' in the pod's annotation")
        owner[ifname] = delegate.name
        named.append(replace(delegate, ifname=ifname))
    return named


def _ifname_for(delegate: Delegate, cni_ifname: str, index: int) -> str:
    """Upstream's getIfname: a request wins, the master takes CNI_IFNAME, others net<index>."""
    if delegate.ifname_request:
        return delegate.ifname_request
    if delegate.master:
        return cni_ifname
    return f"net{index}"


def _resource_name(nad: Any) -> str:
    annotations = getattr(nad, "annotations", None) or {}
    return str(annotations.get(RESOURCE_NAME_ANNOTATION, "") or "")


def _is_v4(gateway: str) -> bool:
    ip = parse_ip(gateway)
    return ip.version == 4 or getattr(ip, "ipv4_mapped", None) is not None


# --- internals: conf parsing ---------------------------------------------------------------


class _ConfListParts(NamedTuple):
    data: Dict[str, Any]          # the list-level object as read
    inline: List[Dict[str, Any]]  # its "plugins"
    chained: List[Dict[str, Any]]  # plugins from <dir>/<name>/*.conf, key order kept


def _json_object(conf: bytes) -> Dict[str, Any]:
    try:
        data = json.loads(conf)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _parse_plugin_conf(raw: bytes, source: str) -> Dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidNetworkConfig(f"error loading CNI config file {source!r}: error parsing "
                                   f"configuration: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidNetworkConfig(f"error loading CNI config file {source!r}: it must hold a "
                                   "JSON object")
    if not isinstance(data.get("type"), str) or not data["type"]:
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
                               f"{json.dumps(value)} for {key}; use true or false")


def _parse_conflist(raw: bytes, source: str, chain_dir: Optional[str],
                    strict_name: bool = True) -> _ConfListParts:
    """libcni's conflist loading, plus the subdirectory chain when ``chain_dir`` is given.

    With ``strict_name`` (Multus' own chain loading) a name unusable as a directory is an
    error; without it (libcni's directory scan) such a list simply has no chain.
    """
    def fail(problem: str) -> InvalidNetworkConfig:
        return InvalidNetworkConfig(f"error loading CNI conflist {source!r}: {problem}")

    try:
        data = json.loads(raw)
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
        if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str) \
                or not plugin["type"]:
            raise fail(f"failed to parse plugin config {index}: missing 'type'")
    chained: List[Dict[str, Any]] = []
    if chain_dir is not None and not inline_only:
        if _CHAIN_NAME.match(name):
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


def _marshal_raw_map(data: Mapping[str, Any], overrides: Mapping[str, str]) -> str:
    """Go's ``json.Marshal(map[string]json.RawMessage)``: sorted keys, values kept as they are."""
    members = []
    for key in sorted(data):
        value = overrides[key] if key in overrides else go_json(data[key])
        members.append(f"{go_json(key)}:{value}")
    return "{" + ",".join(members) + "}"


def _conflist_bytes(parts: _ConfListParts) -> bytes:
    """Upstream's lossless conflist bytes: list keys sorted, every plugin's own keys kept."""
    # Inline plugins went through Go's interface{} (sorted keys); chained ones are raw bytes.
    plugins = [go_json(p, sort_keys=True) for p in parts.inline]
    plugins += [go_json(p) for p in parts.chained]
    data = dict(parts.data)
    data["plugins"] = None
    return _marshal_raw_map(data, {"plugins": "[" + ",".join(plugins) + "]"}).encode()


def _check_delegate_conf(conf: bytes, where: str) -> None:
    """Upstream's LoadDelegateNetConf checks: a ``type``, or ``plugins`` whose first has one."""
    try:
        data = json.loads(conf)
    except ValueError as exc:
        raise InvalidNetworkConfig(f"{where}: the CNI config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidNetworkConfig(f"{where}: the CNI config must be a JSON object")
    if data.get("type"):
        return
    plugins = data.get("plugins")
    if not isinstance(plugins, list):
        raise InvalidNetworkConfig(f"{where}: delegate must have the 'type' or 'plugin' field; "
                                   "give a conf with \"type\" or a conflist with \"plugins\"")
    if not plugins or not isinstance(plugins[0], dict) or not plugins[0].get("type"):
        raise InvalidNetworkConfig(f"{where}: a plugin delegate must have the 'type' field; "
                                   "the first of \"plugins\" has none")


def _display_name(conf: bytes) -> str:
    name = _json_object(conf).get("name")
    return name if isinstance(name, str) else ""


def _has_conf_files(directory: str) -> bool:
    try:
        return any(n.endswith((".conf", ".conflist")) and not os.path.isdir(
            os.path.join(directory, n)) for n in os.listdir(directory))
    except OSError:
        return False


def _scan_conf_dir(conf_dir: str, name: Optional[str]) -> Optional[bytes]:
    """NAD utils' GetCNIConfigFromFile: first matching file by sorted name (None: any name)."""
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
            found = _parse_plugin_conf(raw, path).get("name")
        if name is None or found == name:
            return raw
    return None


# --- internals: settings -------------------------------------------------------------------


class _SettingsReader:
    """Typed reads of the multus config that record a ConfigProblem instead of raising."""

    def __init__(self, netconf: Mapping[str, Any], problems: List[ConfigProblem]) -> None:
        self.netconf = netconf
        self.problems = problems

    def _bad(self, key: str, expected: str) -> None:
        self.problems.append(ConfigProblem(key, f"must be {expected}, got "
                                                f"{json.dumps(self.netconf.get(key))}"))

    def string(self, key: str) -> str:
        value = self.netconf.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            self._bad(key, "a string")
            return ""
        return value

    def boolean(self, key: str) -> bool:
        value = self.netconf.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            self._bad(key, "true or false")
            return False
        return value

    def string_list(self, key: str, default: Tuple[str, ...]) -> Tuple[str, ...]:
        if key not in self.netconf:
            return default
        value = self.netconf[key]
        if value is None:
            return ()  # an explicit null empties the list, as Go's decoder does
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self._bad(key, "a list of strings")
            return default
        return tuple(value)

    def global_namespaces(self) -> Tuple[str, ...]:
        value = self.netconf.get("globalNamespaces")
        if value is None or value == "":
            return DEFAULT_GLOBAL_NAMESPACES
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(v.strip() for v in value)
        self._bad("globalNamespaces", "a comma-separated string of namespaces")
        return DEFAULT_GLOBAL_NAMESPACES

    def objects(self, key: str) -> Tuple[Dict[str, Any], ...]:
        value = self.netconf.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self._bad(key, "a list of CNI config objects")
            return ()
        return tuple(value)


# --- internals: cache entries --------------------------------------------------------------


def _plugin_conf_view(data: Mapping[str, Any]) -> Dict[str, Any]:
    """What Go's cni ``types.PluginConf`` keeps of a config, as it marshals it (sorted keys)."""
    view: Dict[str, Any] = {}
    for key in ("cniVersion", "name", "type"):
        if isinstance(data.get(key), str) and data[key]:
            view[key] = data[key]
    capabilities = data.get("capabilities")
    if isinstance(capabilities, dict):
        flags = {k: v for k, v in capabilities.items() if isinstance(v, bool)}
        if flags:
            view["capabilities"] = flags
    ipam = data.get("ipam")
    ipam_type = ipam.get("type") if isinstance(ipam, dict) else None
    view["ipam"] = {"type": ipam_type} if isinstance(ipam_type, str) and ipam_type else {}
    dns = data.get("dns")
    if isinstance(dns, dict):
        kept = {k: dns[k] for k in ("nameservers", "domain", "search", "options") if dns.get(k)}
        if kept:
            view["dns"] = kept
    if isinstance(data.get("prevResult"), dict) and data["prevResult"]:
        view["prevResult"] = data["prevResult"]
    return json.loads(go_json(view, sort_keys=True))


def _conflist_view(data: Mapping[str, Any]) -> Dict[str, Any]:
    """Go's cni ``types.NetConfList`` of a conflist, in its struct field order."""
    view: Dict[str, Any] = {}
    for key in ("cniVersion", "name"):
        if isinstance(data.get(key), str) and data[key]:
            view[key] = data[key]
    for key in ("disableCheck", "disableGC"):
        if data.get(key) is True:
            view[key] = True
    plugins = [p for p in data.get("plugins") or [] if isinstance(p, dict)]
    if plugins:
        view["plugins"] = [_plugin_conf_view(p) for p in plugins]
    return view


def _cache_entry(delegate: Delegate) -> Dict[str, Any]:
    data = _json_object(delegate.conf)
    entry: Dict[str, Any] = {
        "Conf": _plugin_conf_view(data),
        "ConfList": _conflist_view(data) if delegate.is_conflist else {},
        "Name": delegate.name,
    }
    if delegate.ifname_request:
        entry["ifnameRequest"] = delegate.ifname_request
    if delegate.mac_request:
        entry["macRequest"] = delegate.mac_request
    if delegate.infiniband_guid_request:
        entry["infinibandGUIDRequest"] = delegate.infiniband_guid_request
    if delegate.ip_request:
        entry["ipRequest"] = list(delegate.ip_request)
    if delegate.gateway_request is not None:
        entry["default-route"] = [go_ip_string(gw) for gw in delegate.gateway_request]
    entry["IsFilterV4Gateway"] = delegate.filter_v4_gateway
    entry["IsFilterV6Gateway"] = delegate.filter_v6_gateway
    if delegate.device_id:
        entry["deviceID"] = delegate.device_id
    if delegate.resource_name:
        entry["resourceName"] = delegate.resource_name
    entry["Bytes"] = base64.b64encode(delegate.conf).decode()
    return entry


def _cached_string(item: Mapping[str, Any], key: str, index: int) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DecodeFailure(f"the multus scratch cache entry {index} has a non-string {key!r}")
    return value


def _cached_strings(item: Mapping[str, Any], key: str, index: int) -> Optional[Tuple[str, ...]]:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DecodeFailure(f"the multus scratch cache entry {index} has a malformed {key!r}")
    return tuple(value)


def _cached_conf(item: Mapping[str, Any], index: int) -> bytes:
    encoded = item.get("Bytes")
    if isinstance(encoded, str) and encoded:
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise DecodeFailure(f"the multus scratch cache entry {index} has invalid base64 "
                                "in 'Bytes'") from None
    # No raw bytes: rebuild what we can from the parsed views (DEL should still run).
    conf_list = item.get("ConfList")
    if isinstance(conf_list, dict) and conf_list.get("plugins"):
        return go_json(conf_list).encode()
    conf = item.get("Conf")
    if isinstance(conf, dict) and conf.get("type"):
        return go_json(conf).encode()
    raise DecodeFailure(f"the multus scratch cache entry {index} holds no delegate config")


def _inject_cni_version(conf: bytes, cni_version: str) -> bytes:
    data = _json_object(conf)
    if not data:
        LOG.warning("cannot add cniVersion to a cached conflist that is not a JSON object; "
                    "using it unchanged")
        return conf
    data["cniVersion"] = cni_version
    return _marshal_raw_map(data, {}).encode()


def _delegate_from_cache_entry(item: Mapping[str, Any], index: int,
                               top_cni_version: str) -> Delegate:
    conf = _cached_conf(item, index)
    conf_list = item.get("ConfList") if isinstance(item.get("ConfList"), dict) else {}
    if conf_list.get("plugins") and not conf_list.get("cniVersion") and top_cni_version:
        conf = _inject_cni_version(conf, top_cni_version)
    return Delegate(
        name=_cached_string(item, "Name", index), conf=conf, ifname="", master=index == 0,
        resource_name=_cached_string(item, "resourceName", index),
        device_id=_cached_string(item, "deviceID", index),
        ifname_request=_cached_string(item, "ifnameRequest", index),
        mac_request=_cached_string(item, "macRequest", index),
        ip_request=_cached_strings(item, "ipRequest", index) or (),
        infiniband_guid_request=_cached_string(item, "infinibandGUIDRequest", index),
        gateway_request=_cached_strings(item, "default-route", index),
        filter_v4_gateway=item.get("IsFilterV4Gateway") is True,
        filter_v6_gateway=item.get("IsFilterV6Gateway") is True)
