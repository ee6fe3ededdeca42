"""The ``k8s.v1.cni.cncf.io/network-status`` annotation value, byte-for-byte as upstream writes it.

Upstream builds it with network-attachment-definition-client v1.7.6
(``CreateNetworkStatuses``/``CreateNetworkStatus``) and joins each element, indented by Go's
``json.MarshalIndent(status, "", "    ")``, inside ``[...]``. This module reproduces both the
content rules and the exact text (through :func:`multusd.go_json`).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any, Dict, List, Mapping, Optional

from multusd import DNS_KEYS
from multusd.store import go_json

LOG = logging.getLogger(__name__)

# Key order of Go's DeviceInfo struct and its nested structs (unknown keys are dropped there).
_DEVICE_INFO_KEYS = ("type", "version", "pci", "vdpa", "vhost-user", "memif")
_DEVICE_NESTED_KEYS = {
    "pci": ("pci-address", "vhost-net", "rdma-device", "pf-pci-address", "representor-device"),
    "vdpa": ("parent-device", "driver", "path", "pci-address", "pf-pci-address",
             "representor-device"),
    "vhost-user": ("mode", "path"),
    "memif": ("role", "path", "mode"),
}


def status_entries(name: str, result: Mapping[str, Any], *, default: bool,
                   device_info: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """The network-status entries of one delegate's ADD result (CNI 1.0+ shape).

    A result with exactly one interface gives one entry holding every IP. Otherwise there is
    one entry per *sandbox* interface, IPs mapped by their ``interface`` index; IPs without
    an index go to the last entry, and ``default`` marks the first interface that has a
    gateway (or the first sandbox interface). A result without interfaces gives no entry
    (upstream behaviour; the NPWG spec would want a minimal one).

    :param name: the delegate's network-status name (conf name, or ``<ns>/<nad>``).
    :param default: True for the master (cluster default) network.
    :param device_info: the delegate's device-info file content, when it has one.
    """
    interfaces = [i for i in result.get("interfaces") or [] if isinstance(i, dict)]
    dns = _dns(result.get("dns"))
    gateways = _default_gateways(result.get("routes"))
    devinfo = _device_info(device_info)
    if len(interfaces) == 1:
        return [_single_entry(name, interfaces[0], result, default, dns, gateways, devinfo)]
    return _multi_entries(name, interfaces, result, default, dns, gateways, devinfo)


def format_network_status(entries: List[Mapping[str, Any]]) -> str:
    """The annotation value: each entry as Go's ``MarshalIndent(e, "", "    ")``, joined in [ ]."""
    return "[" + ",".join(go_json(_ordered(e), indent=4) for e in entries) + "]"


# --- internals -------------------------------------------------------------------------------


def _single_entry(name: str, interface: Mapping[str, Any], result: Mapping[str, Any],
                  default: bool, dns: Dict[str, Any], gateways: List[str],
                  devinfo: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"name": name}
    if interface.get("sandbox"):
        entry.update(interface=interface.get("name", ""), mac=interface.get("mac", ""),
                     mtu=interface.get("mtu", 0))
    entry["ips"] = [ip for ip in (_bare_ip(c) for c in _ip_configs(result)) if ip]
    entry.update(default=default, dns=dns, gateway=gateways)
    if devinfo:
        entry["device-info"] = devinfo
    return _ordered(entry)


def _multi_entries(name: str, interfaces: List[Mapping[str, Any]], result: Mapping[str, Any],
                   default: bool, dns: Dict[str, Any], gateways: List[str],
                   devinfo: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    configs = _ip_configs(result)
    gateway_index = -1
    if default:
        gateway_index = next((c["interface"] for c in configs
                              if c.get("gateway") and isinstance(c.get("interface"), int)), -1)
    entries: List[Dict[str, Any]] = []
    position: Dict[int, int] = {}
    default_set = False
    for index, interface in enumerate(interfaces):
        if not interface.get("sandbox"):
            continue
        is_default = False
        if default and not default_set and (index == gateway_index or gateway_index == -1):
            is_default = default_set = True
        entry = {"name": name, "interface": interface.get("name", ""), "ips": [],
                 "mac": interface.get("mac", ""), "mtu": interface.get("mtu", 0),
                 "default": is_default, "dns": dns, "gateway": list(gateways)}
        if devinfo:
            entry["device-info"] = devinfo
        position[index] = len(entries)
        entries.append(entry)
    for config in configs:
        ip = _bare_ip(config)
        if not ip:
            continue
        if isinstance(config.get("interface"), int):
            if config["interface"] in position:
                entries[position[config["interface"]]]["ips"].append(ip)
        elif entries:
            # Upstream gives IPs without an interface index to the last entry.
            entries[-1]["ips"].append(ip)
    return [_ordered(e) for e in entries]


def _ordered(entry: Mapping[str, Any]) -> Dict[str, Any]:
    """Go's NetworkStatus field order, with its omitempty rules (dns is always present)."""
    out: Dict[str, Any] = {"name": entry.get("name", "")}
    for key in ("interface", "ips", "mac", "mtu", "default"):
        if entry.get(key):
            out[key] = entry[key]
    out["dns"] = entry.get("dns") or {}
    for key in ("device-info", "gateway"):
        if entry.get(key):
            out[key] = entry[key]
    return out


def _ip_configs(result: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [c for c in result.get("ips") or [] if isinstance(c, dict)]


def go_ip_string(text: str) -> str:
    """An address as Go's ``net.IP.String()`` prints it (IPv4-mapped IPv6 as plain IPv4)."""
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _bare_ip(config: Mapping[str, Any]) -> str:
    address = str(config.get("address") or "")
    try:
        return go_ip_string(address.split("/", 1)[0])
    except ValueError:
        LOG.warning("ignoring unparseable address %r in a delegate result", address)
        return ""


def _default_gateways(routes: Any) -> List[str]:
    """Gateways of the default routes: dst missing, or a dst whose address is all-zero."""
    gateways = []
    for route in routes or []:
        if not isinstance(route, dict):
            continue
        dst = route.get("dst")
        if dst:
            try:
                if any(ipaddress.ip_address(str(dst).split("/", 1)[0]).packed):
                    continue  # not an all-zero destination: not a default route
            except ValueError:
                continue
        gateway = route.get("gw")
        # A default route without a gateway (device route) has no gateway to report; upstream
        # would print Go's "<nil>" here, which no consumer can parse.
        if gateway:
            try:
                gateways.append(go_ip_string(str(gateway)))
            except ValueError:
                LOG.warning("ignoring unparseable gateway %r in a delegate result", gateway)
    return gateways


def _dns(dns: Any) -> Dict[str, Any]:
    if not isinstance(dns, dict):
        return {}
    return {key: dns[key] for key in DNS_KEYS if dns.get(key)}


def _device_info(info: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if not info:
        return None
    out: Dict[str, Any] = {}
    for key in _DEVICE_INFO_KEYS:
        value = info.get(key)
        if key in _DEVICE_NESTED_KEYS:
            if isinstance(value, dict):
                nested = {k: value[k] for k in _DEVICE_NESTED_KEYS[key] if value.get(k)}
                out[key] = nested  # Go keeps a present (non-nil) nested struct even if empty
        elif value:
            out[key] = value
    return out
