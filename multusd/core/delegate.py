"""One network attachment of a pod (:class:`Delegate`): what to execute and how, its ifname."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from multusd import go_field
from multusd.core.dra import DraDevice
from multusd.core.netconf import conf_object
from multusd.core.selection import DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION, NetworkSelection
from multusd.store.valueclass import Record

# What named a delegate (Delegate.named_by): the multus config's key, or the pod's annotation.
# Recorded with it in the scratch cache: a running pod's annotation only ever removes what it
# named itself (multusd.core.netchanges).
BY_CLUSTER_NETWORK = "clusterNetwork"
BY_DEFAULT_NETWORKS = "defaultNetworks"
BY_DELEGATES = "delegates"
BY_AUXILIARY_CHAIN = "auxiliaryCNIChainName"
BY_DEFAULT_NETWORK_ANNOTATION = DEFAULT_NETWORK_ANNOTATION
BY_NETWORKS_ANNOTATION = NETWORKS_ANNOTATION
NAMED_BY = (BY_CLUSTER_NETWORK, BY_DEFAULT_NETWORKS, BY_DELEGATES, BY_AUXILIARY_CHAIN,
            BY_DEFAULT_NETWORK_ANNOTATION, BY_NETWORKS_ANNOTATION)


class Delegate(Record):
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
    dra_device: Optional[DraDevice] = None  # where device_id came from, when DRA allocated it
    named_by: str = ""  # NAMED_BY: what named it ("" in a record that does not say)

    @property
    def is_conflist(self) -> bool:
        """True for a conflist (no top-level ``type``), as upstream decides (its NetConf
        struct: ``"Type"`` counts)."""
        return not go_field(conf_object(self.conf), "type")

    @property
    def conf_name(self) -> str:
        """The ``name`` inside the config: libcni's network name (its result-cache key), as
        upstream's NetConf/NetConfList structs read it."""
        name = go_field(conf_object(self.conf), "name")
        return name if isinstance(name, str) else ""

    @property
    def plugin_type(self) -> str:
        """The plugin type (a conflist's first plugin), for messages."""
        data = conf_object(self.conf)
        if go_field(data, "type"):
            return str(go_field(data, "type"))
        plugins = data.get("plugins")
        if isinstance(plugins, list) and plugins and isinstance(plugins[0], dict):
            return str(go_field(plugins[0], "type", ""))
        return ""


def ifname_for(delegate: Delegate, cni_ifname: str, index: int) -> str:
    """Upstream's getIfname: a request wins, the master takes CNI_IFNAME, others net<index>."""
    if delegate.ifname_request:
        return delegate.ifname_request
    if delegate.master:
        return cni_ifname
    return f"net{index}"
