"""Which delegates a pod gets, in order, with the exact config bytes each one will execute.

Resolves, as upstream Multus does (``k8sclient.go:GetDefaultNetworks``, ``TryLoadPodDelegates``,
``types/conf.go:LoadNetConf``, ``multus.go:CmdAdd``):

1. the master: ``clusterNetwork`` (a NAD, a conf name in ``confDir``, a directory or a file),
   or else ``delegates[0]`` of the multus config;
2. ``defaultNetworks`` (not for pods in ``systemNamespaces``) or the other ``delegates``;
3. the pod's ``v1.multus-cni.io/default-network`` annotation, which replaces the master;
4. the pod's ``k8s.v1.cni.cncf.io/networks`` selections (NADs), with namespace isolation;
5. the ``auxiliaryCNIChainName`` chain;

then validates ``default-route`` requests (no ECMP) and names the interfaces, all from the
request's :class:`~multusd.core.settings.MultusSettings`, read once by the caller. Loading the
configs themselves is :mod:`multusd.core.netconf`'s; the scratch cache is
:mod:`multusd.core.scratch`'s. No Kubernetes client of its own (NADs come through a
:class:`~multusd.core.netconf.NadGetter`, :func:`nad_getter` makes one of the ``kube``
object), no processes.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from multusd import go_field
from multusd.core.delegate import (BY_AUXILIARY_CHAIN, BY_CLUSTER_NETWORK, BY_DEFAULT_NETWORKS,
                                   BY_DEFAULT_NETWORK_ANNOTATION, BY_DELEGATES,
                                   BY_NETWORKS_ANNOTATION, Delegate, ifname_for)
from multusd.core.netconf import (NadGetter, chained_conflist, check_delegate_conf, conf_object,
                                  nad_config, nad_resource_name, network_name, resolve_network)
from multusd.core.settings import MultusSettings
from multusd.errors import InvalidNetworkConfig, MultusError
from multusd.store.valueclass import replace
from multusd.store import go_json
from multusd.core.runtimeconf import inject_cni_args
from multusd.core.selection import (DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION,
                                    NetworkSelection, parse_default_network, parse_ip,
                                    parse_selections)

LOG = logging.getLogger(__name__)

PASSTHRU_PLUGIN = {"type": "passthru", "name": "passthru-cni"}

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


def build_delegates(settings: MultusSettings, *, pod_namespace: str, pod_name: str,
                    annotations: Optional[Mapping[str, str]], cni_ifname: str,
                    get_nad: Optional[NadGetter],
                    device_id_for: Optional[DeviceIdGetter] = None) -> List[Delegate]:
    """Every delegate of a pod, in execution order, with interface names assigned.

    :param settings: the request's multus settings (read once by the caller).
    :param annotations: the pod's annotations; None when there is no pod (only the
        cluster network / ``delegates`` are used).
    :param cni_ifname: CNI_IFNAME, the master's interface name.
    :param get_nad: NAD lookup; None when no Kubernetes client is configured.
    :param device_id_for: device-plugin allocation lookup for NADs with a resourceName.
    :raises NadNotFound: when a selected NAD does not exist (emit ``NoNetworkFound``).
    :raises InvalidNetworkConfig: for every other unusable config or annotation.
    """
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
            check_namespace_isolation(settings, pod_namespace, selection)
            delegates.append(resolver.selected(selection, master=False))
    if any(d.gateway_request is not None for d in delegates):
        delegates = mark_gateway_filters(delegates)
    if settings.auxiliary_chain:
        auxiliary = _auxiliary_chain(settings)
        if auxiliary is not None:
            delegates.append(auxiliary)
    return _assign_ifnames(delegates, cni_ifname)


def selection_delegate(settings: MultusSettings, selection: NetworkSelection, *,
                       pod_namespace: str, pod_name: str,
                       get_nad: Optional[NadGetter]) -> Delegate:
    """The delegate of one selection added to a running pod (``enableDynamicNetworks``): as a
    pod's ADD makes it (the NAD's config, cni-args, ips, mac, deviceID; namespace isolation),
    named as the selection asks, but without ``default-route`` (the pod's other attachments
    keep their routes) and without a device-plugin allocation (the kubelet allocates a pod's
    devices once, before its sandbox exists).

    :raises NadNotFound: the NAD does not exist.
    :raises InvalidNetworkConfig: its config is unusable, or namespace isolation forbids it.
    """
    check_namespace_isolation(settings, pod_namespace, selection)
    delegate = _Resolver(settings, get_nad, None, f"{pod_namespace}/{pod_name}").selected(
        selection, master=False)
    return replace(delegate, ifname=selection.interface, gateway_request=None)


def nad_getter(kube: Any, deadline: float) -> Optional[NadGetter]:
    """The NAD lookup of a request (bounded by its ``deadline``); None without Kubernetes."""
    if kube is None:
        return None
    return lambda namespace, name: kube.get_nad(namespace, name, deadline=deadline)


def mark_gateway_filters(delegates: Sequence[Delegate]) -> List[Delegate]:
    """Check ``default-route`` requests and mark which delegates lose their default routes (F50).

    Every delegate without a requested IPv4 gateway gets ``filter_v4_gateway`` (same for v6),
    the cluster network included.

    :raises InvalidNetworkConfig: more than one IPv4 or IPv6 gateway overall (ECMP).
    """
    v4 = [(d.name, gw) for d in delegates for gw in d.gateway_request or () if _is_v4(gw)]
    v6 = [(d.name, gw) for d in delegates for gw in d.gateway_request or () if not _is_v4(gw)]
    if len(v4) > 1 or len(v6) > 1:
        listed = ", ".join(f"{gw or 'an empty gateway'} ({name})" for name, gw in v4 + v6)
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


def add_device_id(conf: bytes, device_id: str) -> bytes:
    """Put ``deviceID`` and ``pciBusID`` in a conf, or in every plugin of a conflist (F41)."""
    data = conf_object(conf)  # upstream: its NetConf struct decides ("Type" counts), a map edits
    targets = [data] if go_field(data, "type") else [p for p in data.get("plugins") or []
                                                     if isinstance(p, dict)]
    for plugin in targets:
        plugin["deviceID"] = device_id
        plugin["pciBusID"] = device_id
    return go_json(data, sort_keys=True).encode()


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
        return self._with_device(Delegate(name=name, conf=conf, ifname="", master=True,
                                          named_by=BY_CLUSTER_NETWORK), resource)

    def default_network(self, ref: str) -> Delegate:
        try:
            name, conf, resource = resolve_network(
                ref, multus_namespace=self.settings.multus_namespace,
                conf_dir=self.settings.conf_dir, get_nad=self.get_nad)
        except MultusError as exc:
            raise exc.with_prefix(f"failed to get defaultNetworks entry {ref!r}: ") from exc
        return self._with_device(Delegate(name=name, conf=conf, ifname="", master=False,
                                          named_by=BY_DEFAULT_NETWORKS), resource)

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
        named_by = BY_DEFAULT_NETWORK_ANNOTATION if master else BY_NETWORKS_ANNOTATION
        delegate = self._with_device(
            Delegate(name=f"{selection.namespace}/{selection.name}", conf=conf, ifname="",
                     master=master, selection=selection, named_by=named_by),
            nad_resource_name(nad))
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


def _inline_delegates(raw_delegates: Sequence[Mapping[str, Any]]) -> List[Delegate]:
    delegates = []
    for index, raw in enumerate(raw_delegates):
        conf = go_json(raw, sort_keys=True).encode()
        try:
            check_delegate_conf(conf, f"delegates[{index}] of the multus config")
        except InvalidNetworkConfig as exc:
            raise InvalidNetworkConfig(f"failed to load delegate {index} config: {exc.msg}") \
                from exc
        delegates.append(Delegate(name=network_name(conf), conf=conf, ifname="",
                                  master=index == 0, named_by=BY_DELEGATES))
    return delegates


def check_namespace_isolation(settings: MultusSettings, pod_namespace: str,
                              selection: NetworkSelection) -> None:
    """Upstream's namespace isolation: a pod selects NADs of its own namespace or of
    ``globalNamespaces`` only (the ADD's check, and a running pod's new selections').

    :raises InvalidNetworkConfig: the selection crosses into another namespace.
    """
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
    conf, plugin_count = chained_conflist(skeleton, where,
                                          os.path.dirname(settings.cluster_network))
    if plugin_count < 2:
        LOG.debug("auxiliary chain %r has no plugins beyond passthru; not added", name)
        return None
    return Delegate(name=name, conf=conf, ifname="", master=False, named_by=BY_AUXILIARY_CHAIN)


def _assign_ifnames(delegates: Sequence[Delegate], cni_ifname: str) -> List[Delegate]:
    named: List[Delegate] = []
    owner: Dict[str, str] = {}
    for index, delegate in enumerate(delegates):
        ifname = ifname_for(delegate, cni_ifname, index)
        if ifname in owner:
            raise InvalidNetworkConfig(
                f"interface name {ifname!r} would be used twice in the pod: by network "
                f"{owner[ifname]!r} and by network {delegate.name!r}; request a different "
                "'interface' in the pod's annotation")
        owner[ifname] = delegate.name
        named.append(replace(delegate, ifname=ifname))
    return named


def _is_v4(gateway: str) -> bool:
    """Go's ``To4() != nil``: an IPv4 or IPv4-mapped address. "" (Go's nil IP, from ``""`` or
    ``null`` in ``default-route``) is not, so upstream counts it as an IPv6 gateway."""
    if gateway == "":
        return False
    ip = parse_ip(gateway)
    return ip.version == 4 or getattr(ip, "ipv4_mapped", None) is not None

