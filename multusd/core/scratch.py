"""The scratch cache ``<cniDir>/<containerID>``: delegates in upstream's DelegateNetConf JSON."""

from __future__ import annotations

import base64
import binascii
import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import DNS_KEYS, go_fields, go_loads
from multusd.core import dra
from multusd.core.netconf import conf_object, marshal_raw_map
from multusd.core.delegate import NAMED_BY, Delegate, ifname_for
from multusd.errors import DecodeFailure
from multusd.core.netstatus import go_ip_string
from multusd.core.selection import DEVICE_ID, INFINIBAND_GUID, IPS, MAC, json_value, requested
from multusd.store.valueclass import replace
from multusd.store import go_json, read_or_none

LOG = logging.getLogger(__name__)


def cache_path(cni_dir: str, container_id: str) -> str:
    """``<cniDir>/<containerID>``: where a sandbox's scratch cache is."""
    return os.path.join(cni_dir, container_id)


def read_cache(path: str) -> Optional[bytes]:
    """The scratch cache's bytes; None when there is none.

    :raises IOFailure: it exists but cannot be read.
    """
    return read_or_none(path, "the scratch cache")


def delegates_to_cache(delegates: Sequence[Delegate]) -> bytes:
    """The scratch-cache content for ``<cniDir>/<containerID>``, in upstream's exact format.

    A JSON array of upstream's ``DelegateNetConf``: ``Conf``, ``ConfList``,
    ``CNINetworkConfigList`` (libcni's list, untagged; upstream fills it only for a conflist
    it loaded from a file, and reads it nowhere on DEL: written empty, as for every other
    delegate), ``Name``, ``ifnameRequest``, ``macRequest``, ``infinibandGUIDRequest``,
    ``ipRequest``, ``default-route``, ``IsFilterV4Gateway``, ``IsFilterV6Gateway``,
    ``deviceID``, ``resourceName`` and ``Bytes`` (base64 of :attr:`Delegate.conf`); for a
    device DRA allocated also ``draDevice`` (claim, request, driver, pool, device), and last
    what named the delegate (:data:`NAMED_BY_KEY`, :attr:`Delegate.named_by`): keys no field
    of upstream's DelegateNetConf matches (Go's decoder matches names case-insensitively, and
    skips these), so that upstream's reader skips them.
    """
    return encode_entries([cache_entry(d) for d in delegates])


def encode_entries(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """A scratch cache of the entries (dicts as :func:`cache_entry` makes or the file holds)."""
    return ("[" + ",".join(go_json(entry) for entry in entries) + "]").encode()


def cache_entries(data: bytes) -> List[Dict[str, Any]]:
    """The entries of a scratch cache's bytes, as the file holds them.

    :raises DecodeFailure: ``data`` is not a JSON list of objects.
    """
    try:
        items = go_loads(data)
    except ValueError as exc:
        raise DecodeFailure(f"the multus scratch cache is not valid JSON: {exc}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise DecodeFailure("the multus scratch cache is not a JSON list of delegate objects")
    return items


def delegates_from_cache(data: bytes, *, top_cni_version: str = "",
                         cni_ifname: str = "eth0") -> List[Delegate]:
    """The delegates recorded by :func:`delegates_to_cache` or by upstream Multus.

    The first is the master again; interface names are recomputed as on ADD. A conflist
    recorded without ``cniVersion`` gets ``top_cni_version`` (F57), keeping every other key.

    :raises DecodeFailure: when ``data`` is not a cache file.
    """
    delegates = []
    for index, item in enumerate(cache_entries(data)):
        delegate = _delegate_from_cache_entry(item, index, top_cni_version)
        delegates.append(replace(delegate, ifname=ifname_for(delegate, cni_ifname, index)))
    return delegates


# --- internals -----------------------------------------------------------------------------


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
        kept = {k: dns[k] for k in DNS_KEYS if dns.get(k)}
        if kept:
            view["dns"] = kept
    if isinstance(data.get("prevResult"), dict) and data["prevResult"]:
        view["prevResult"] = data["prevResult"]
    return go_loads(go_json(view, sort_keys=True))


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


def cache_entry(delegate: Delegate) -> Dict[str, Any]:
    """The scratch-cache entry of one delegate (see :func:`delegates_to_cache`)."""
    data = conf_object(delegate.conf)
    entry: Dict[str, Any] = {
        "Conf": _plugin_conf_view(data),
        "ConfList": _conflist_view(data) if delegate.is_conflist else {},
        "CNINetworkConfigList": dict(_EMPTY_NETWORK_CONFIG_LIST),
        "Name": delegate.name,
    }
    if delegate.ifname_request:
        entry["ifnameRequest"] = delegate.ifname_request
    _put_requests(entry, delegate, _CACHED_REQUESTS)
    if delegate.gateway_request is not None:
        # Go's MarshalText of a nil IP (an empty gateway) is ""
        entry["default-route"] = [go_ip_string(gw) if gw else "" for gw in
                                  delegate.gateway_request]
    entry["IsFilterV4Gateway"] = delegate.filter_v4_gateway
    entry["IsFilterV6Gateway"] = delegate.filter_v6_gateway
    _put_requests(entry, delegate, (DEVICE_ID,))
    if delegate.resource_name:
        entry["resourceName"] = delegate.resource_name
    if delegate.dra_device is not None:  # ours: upstream's reader ignores the key
        entry[dra.CACHE_KEY] = delegate.dra_device.to_cache()
    entry["Bytes"] = base64.b64encode(delegate.conf).decode()
    if delegate.named_by:  # ours: upstream's reader ignores the key
        entry[NAMED_BY_KEY] = delegate.named_by
    return entry


NAMED_BY_KEY = "multusdNamedBy"  # what named the delegate (ours)

# The requests upstream's DelegateNetConf records between ifnameRequest and default-route, in
# its field order (deviceID comes after the gateway flags).
_CACHED_REQUESTS = (MAC, INFINIBAND_GUID, IPS)


def _put_requests(entry: Dict[str, Any], delegate: Delegate, requests: Sequence) -> None:
    for request in requests:
        value = getattr(delegate, request.delegate)
        if requested(value):
            entry[request.cache_key] = json_value(value)


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


# libcni.NetworkConfigList's zero value as Go marshals it (no JSON tags, nil slices as null).
_EMPTY_NETWORK_CONFIG_LIST = {"Name": "", "CNIVersion": "", "DisableCheck": False,
                              "DisableGC": False, "LoadOnlyInlinedPlugins": False,
                              "Plugins": None, "Bytes": None}


def _executed_conflist(item: Mapping[str, Any]) -> Optional[bytes]:
    """The conflist upstream v4.3 executed on ADD, when it recorded one in
    ``CNINetworkConfigList`` (a conflist loaded from a file: clusterNetwork, defaultNetworks,
    the auxiliary chain), rebuilt from each plugin's raw bytes; None otherwise.

    Its ``Bytes`` for such a delegate are a re-encoding through Go's ``PluginConf``, which
    keeps only the standard keys (``bridge``, ``subnet``, ``dataDir`` ... are lost): a DEL run
    from them would not release what the ADD made.
    """
    chain = item.get("CNINetworkConfigList")
    plugins = chain.get("Plugins") if isinstance(chain, dict) else None
    if not isinstance(plugins, list) or not plugins:
        return None
    raw_plugins = []
    for plugin in plugins:
        encoded = plugin.get("Bytes") if isinstance(plugin, dict) else None
        try:
            raw = go_loads(base64.b64decode(encoded or "", validate=True))
        except (binascii.Error, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        raw_plugins.append(raw)
    conf: Dict[str, Any] = {}
    for key, go_key in (("cniVersion", "CNIVersion"), ("name", "Name")):
        if isinstance(chain.get(go_key), str) and chain[go_key]:
            conf[key] = chain[go_key]
    for key, go_key in (("disableCheck", "DisableCheck"), ("disableGC", "DisableGC")):
        if chain.get(go_key) is True:
            conf[key] = True
    conf["plugins"] = raw_plugins
    return go_json(conf).encode()


def _cached_conf(item: Mapping[str, Any], index: int) -> bytes:
    executed = _executed_conflist(item)
    if executed is not None:
        return executed
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
    data = conf_object(conf)
    if not data:
        LOG.warning("cannot add cniVersion to a cached conflist that is not a JSON object; "
                    "using it unchanged")
        return conf
    data["cniVersion"] = cni_version
    return marshal_raw_map(data, {}).encode()


# Upstream's DelegateNetConf fields, which it reads the cache back into (Go's struct rules:
# "name" sets Name); the slices among them, which null sets to nil.
_ENTRY_NILS = ("ipRequest", "default-route", "Bytes")
_ENTRY_FIELDS = ("Conf", "ConfList", "CNINetworkConfigList", "Name", "ifnameRequest",
                 "macRequest", "infinibandGUIDRequest", "IsFilterV4Gateway", "IsFilterV6Gateway",
                 "deviceID", "resourceName", dra.CACHE_KEY) + _ENTRY_NILS


def _delegate_from_cache_entry(item: Mapping[str, Any], index: int,
                               top_cni_version: str) -> Delegate:
    item = {**item, **go_fields(item, _ENTRY_FIELDS, nils=_ENTRY_NILS)}  # ours as written
    conf = _cached_conf(item, index)
    conf_list = item.get("ConfList") if isinstance(item.get("ConfList"), dict) else {}
    if conf_list.get("plugins") and not conf_list.get("cniVersion") and top_cni_version:
        conf = _inject_cni_version(conf, top_cni_version)
    return Delegate(
        name=_cached_string(item, "Name", index), conf=conf, ifname="", master=index == 0,
        resource_name=_cached_string(item, "resourceName", index),
        device_id=_cached_string(item, DEVICE_ID.cache_key, index),
        ifname_request=_cached_string(item, "ifnameRequest", index),
        mac_request=_cached_string(item, MAC.cache_key, index),
        ip_request=_cached_strings(item, IPS.cache_key, index) or (),
        infiniband_guid_request=_cached_string(item, INFINIBAND_GUID.cache_key, index),
        gateway_request=_cached_strings(item, "default-route", index),
        filter_v4_gateway=item.get("IsFilterV4Gateway") is True,
        filter_v6_gateway=item.get("IsFilterV6Gateway") is True,
        dra_device=dra.from_cache(item.get(dra.CACHE_KEY)),
        named_by=item[NAMED_BY_KEY] if item.get(NAMED_BY_KEY) in NAMED_BY else "")
