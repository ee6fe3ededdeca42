"""The cache files upstream Multus v4.3 writes, built from its Go types (for migration tests).

Written from upstream's struct definitions, not from multusd's code, so that comparing the two
finds a difference instead of repeating it:

* the scratch cache ``<cniDir>/<containerID>``: ``json.Marshal([]*types.DelegateNetConf)``
  (pkg/types/types.go). Fields in struct order; ``Conf`` and each ``ConfList`` plugin through
  ``PluginConf.MarshalJSON`` (a map: sorted keys, ``dns`` dropped when empty, ``ipam`` always);
  ``CNINetworkConfigList`` (libcni's untagged struct) empty unless the delegate is a conflist
  loaded from a file (clusterNetwork path), when it holds each plugin's raw bytes and ``Bytes``
  is the lossy re-encoding of the list through ``PluginConf``;
* libcni v1.3's result cache ``<cniDir>/results/<net>-<cid>-<ifname>``: ``cachedInfo``
  (kind, containerId, config, ifName, networkName, netns, cniArgs, capabilityArgs, result),
  the maps (``capabilityArgs``, ``result``) with sorted keys, Go's omitempty.

The optional tests with upstream's own binaries (tests/integration/test_migration.py) check
these against what upstream's daemon really writes.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

Pair = Tuple[str, str]


def go_marshal(value: Any, sort_keys: bool = False) -> bytes:
    """``encoding/json`` output: compact, HTML characters escaped, UTF-8 kept."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text.encode()


def b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode()


def plugin_conf(raw: Mapping[str, Any]) -> Dict[str, Any]:
    """``types.PluginConf`` of one plugin config, as its MarshalJSON writes it (sorted keys)."""
    view: Dict[str, Any] = {}
    for key in ("cniVersion", "name", "type"):
        if raw.get(key):
            view[key] = raw[key]
    if raw.get("capabilities"):
        view["capabilities"] = dict(raw["capabilities"])
    ipam = raw.get("ipam") or {}
    view["ipam"] = {"type": ipam["type"]} if ipam.get("type") else {}
    dns = {k: v for k, v in (raw.get("dns") or {}).items()
           if k in ("nameservers", "domain", "search", "options") and v}
    if dns:
        view["dns"] = dns
    if raw.get("prevResult"):
        view["prevResult"] = raw["prevResult"]
    return dict(sorted(view.items()))


def conf_list(raw: Mapping[str, Any]) -> Dict[str, Any]:
    """``types.NetConfList`` (struct order, omitempty)."""
    view: Dict[str, Any] = {}
    for key in ("cniVersion", "name"):
        if raw.get(key):
            view[key] = raw[key]
    for key in ("disableCheck", "disableGC"):
        if raw.get(key) is True:
            view[key] = True
    if raw.get("plugins"):
        view["plugins"] = [plugin_conf(p) for p in raw["plugins"]]
    return view


def empty_network_config_list() -> Dict[str, Any]:
    return {"Name": "", "CNIVersion": "", "DisableCheck": False, "DisableGC": False,
            "LoadOnlyInlinedPlugins": False, "Plugins": None, "Bytes": None}


def delegate_entry(conf: bytes, name: str, *, from_file_conflist: bool = False,
                   ifname_request: str = "", mac_request: str = "",
                   ip_request: Sequence[str] = (), gateway_request: Optional[List[str]] = None,
                   filter_v4: bool = False, filter_v6: bool = False,
                   device_id: str = "", resource_name: str = "") -> Dict[str, Any]:
    """One ``DelegateNetConf`` of the scratch cache, fields in Go struct order."""
    raw = json.loads(conf)
    is_list = not raw.get("type")
    # LoadDelegateNetConf unmarshals the bytes into Conf (and ConfList for a conflist);
    # LoadDelegateNetConfFromConfList (a clusterNetwork "*.conflist" file) leaves Conf empty
    entry: Dict[str, Any] = {"Conf": {"ipam": {}} if from_file_conflist else plugin_conf(raw),
                             "ConfList": conf_list(raw) if is_list else {}}
    data_bytes = conf
    if from_file_conflist:
        # libcni's NetworkConfFromBytes: each plugin re-marshalled from a map (sorted keys)
        plugins = [{"Network": plugin_conf(p), "Bytes": b64(go_marshal(p, sort_keys=True))}
                   for p in raw["plugins"]]
        entry["CNINetworkConfigList"] = {
            "Name": raw.get("name", ""), "CNIVersion": raw.get("cniVersion", ""),
            "DisableCheck": raw.get("disableCheck") is True,
            "DisableGC": raw.get("disableGC") is True,
            "LoadOnlyInlinedPlugins": raw.get("loadOnlyInlinedPlugins") is True,
            "Plugins": plugins, "Bytes": b64(conf)}
        data_bytes = go_marshal(conf_list(raw))  # "Convert the plugins back to bytes"
    else:
        entry["CNINetworkConfigList"] = empty_network_config_list()
    entry["Name"] = name
    if ifname_request:
        entry["ifnameRequest"] = ifname_request
    if mac_request:
        entry["macRequest"] = mac_request
    if ip_request:
        entry["ipRequest"] = list(ip_request)
    if gateway_request is not None:
        entry["default-route"] = list(gateway_request)
    entry["IsFilterV4Gateway"] = filter_v4
    entry["IsFilterV6Gateway"] = filter_v6
    if device_id:
        entry["deviceID"] = device_id
    if resource_name:
        entry["resourceName"] = resource_name
    entry["Bytes"] = b64(data_bytes)
    return entry


def scratch_cache(entries: Sequence[Mapping[str, Any]]) -> bytes:
    return go_marshal(list(entries))


def result_entry(container_id: str, config: bytes, ifname: str, net_name: str, netns: str,
                 cni_args: Sequence[Pair], capability_args: Mapping[str, Any],
                 result: Mapping[str, Any]) -> Dict[str, Any]:
    """libcni's ``cachedInfo`` (struct order; the two maps with sorted keys at every level)."""
    entry: Dict[str, Any] = {"kind": "cniCacheV1", "containerId": container_id,
                             "config": b64(config), "ifName": ifname, "networkName": net_name}
    if netns:
        entry["netns"] = netns
    if cni_args:
        entry["cniArgs"] = [[k, v] for k, v in cni_args]
    if capability_args:
        entry["capabilityArgs"] = _sorted(capability_args)
    if result:
        entry["result"] = _sorted(result)
    return entry


def upstream_args(namespace: str, name: str, infra_id: str, uid: str,
                  extra: Sequence[Pair] = ()) -> List[Pair]:
    """The CNI_ARGS upstream gives every delegate (types/conf.go createRuntimeConf, DelegateAdd)."""
    return [("IgnoreUnknown", "true"), ("K8S_POD_NAMESPACE", namespace),
            ("K8S_POD_NAME", name), ("K8S_POD_INFRA_CONTAINER_ID", infra_id),
            ("K8S_POD_UID", uid), *extra]


def write_result_entry(cni_dir: str, entry: Mapping[str, Any]) -> str:
    """As libcni's cacheAdd: results/ 0700, the file 0600, written in place."""
    directory = os.path.join(cni_dir, "results")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory,
                        f"{entry['networkName']}-{entry['containerId']}-{entry['ifName']}")
    with open(path, "wb") as handle:
        handle.write(go_marshal(dict(entry)))
    os.chmod(path, 0o600)
    return path


def write_scratch(cni_dir: str, container_id: str, data: bytes) -> str:
    """As saveScratchNetConf: the directory 0700, the file 0600, written in place."""
    os.makedirs(cni_dir, mode=0o700, exist_ok=True)
    path = os.path.join(cni_dir, container_id)
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)
    return path


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
