"""The multus settings: the keys of the merged multus config that decide what a pod gets.

:class:`MultusSettings` (:func:`load_settings`): ``clusterNetwork``, ``defaultNetworks``,
``delegates``, the namespaces, the auxiliary chain, read strictly, every problem listed. They
are read for each configuration by the one resolver, :mod:`multusd.core.effective`, which also
resolves the directories leniently (DEL must find a sandbox's records whatever else the config
gets wrong); nothing else reads them from a config.

The defaults are upstream's (F29).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from multusd import go_field, go_fields
from multusd.config.reader import ConfigReader
from multusd.errors import ConfigError, ConfigProblem, InvalidNetworkConfig
from multusd.store.valueclass import Record

DEFAULT_CONF_DIR = "/etc/cni/multus/net.d"
DEFAULT_MULTUS_NAMESPACE = "kube-system"
DEFAULT_SYSTEM_NAMESPACES = ("kube-system",)
DEFAULT_GLOBAL_NAMESPACES = ("default",)
NO_NETWORKS = "at least one delegate/clusterNetwork must be specified"
SETTINGS_SOURCE = "of the multus network config"  # how a ConfigError of the settings names them


class MultusSettings(Record):
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
    problems = reader = ConfigReader()
    # As upstream's NetConf struct reads them: "ClusterNetwork" sets clusterNetwork.
    netconf = go_fields(netconf, _SETTINGS_KEYS, nils=_SETTINGS_LISTS)
    settings = MultusSettings(
        conf_dir=reader.string(netconf, "confDir") or DEFAULT_CONF_DIR,
        multus_namespace=reader.string(netconf, "multusNamespace") or DEFAULT_MULTUS_NAMESPACE,
        system_namespaces=reader.string_list(netconf, "systemNamespaces",
                                             DEFAULT_SYSTEM_NAMESPACES),
        global_namespaces=reader.names(netconf, "globalNamespaces", DEFAULT_GLOBAL_NAMESPACES),
        namespace_isolation=reader.boolean(netconf, "namespaceIsolation"),
        cluster_network=reader.string(netconf, "clusterNetwork"),
        default_networks=reader.string_list(netconf, "defaultNetworks", ()),
        delegates=reader.objects(netconf, "delegates"),
        auxiliary_chain=reader.string(netconf, "auxiliaryCNIChainName"),
        cni_version=reader.string(netconf, "cniVersion"),
    )
    if not problems and not settings.cluster_network and not settings.delegates:
        problems.append(ConfigProblem("clusterNetwork", f"{NO_NETWORKS}: set clusterNetwork "
                                      "(or delegates)"))
    if problems:
        raise ConfigError(SETTINGS_SOURCE, problems)
    return settings


_SETTINGS_LISTS = ("systemNamespaces", "defaultNetworks", "delegates")
_SETTINGS_KEYS = ("confDir", "multusNamespace", "globalNamespaces", "namespaceIsolation",
                  "clusterNetwork", "auxiliaryCNIChainName", "cniVersion") + _SETTINGS_LISTS


def require_delegates(netconf: Mapping[str, Any]) -> None:
    """Refuse, before any work, a config that names no network at all (upstream's check).

    :raises InvalidNetworkConfig: neither ``clusterNetwork`` nor ``delegates`` is set.
    """
    if not go_field(netconf, "clusterNetwork") and not go_field(netconf, "delegates"):
        raise InvalidNetworkConfig(f"{NO_NETWORKS}: set \"clusterNetwork\" (or \"delegates\") "
                                   "in daemon-config.json or the runtime's CNI config")

