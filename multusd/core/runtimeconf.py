"""What each delegate receives besides its config: its RuntimeConf (capability args, CNI_ARGS).

A request the config does not declare as a capability is never refused: it is handed on as
upstream hands it on, with a warning (:func:`undeclared_requests`).

Upstream: ``types/conf.go:mergeCNIRuntimeConfig``, ``delegateRuntimeConfig``, ``injectCNIArgs``
and ``multus.go:DelegateAdd``; :func:`runtime_conf` puts it together for one delegate of a
request, with the pod's cni-args injected earlier (:func:`inject_cni_args`). Every function
here returns new objects and never mutates its inputs: before upstream's fix 91e4efcd6 one delegate's ``mac``/``ips`` leaked into the next
because the global runtimeConfig was modified in place.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from multusd import go_field, go_loads
from multusd.cni.args import build_delegate_args
from multusd.cni.resultcache import RuntimeConf
from multusd.errors import InvalidNetworkConfig
from multusd.node.devices import devinfo_cni_dir
from multusd.store import go_json
from multusd.core.selection import (BANDWIDTH, DEVICE_ID, INFINIBAND_GUID, IPS, MAC,
                                    PORT_MAPPINGS, REQUESTS, json_value, parse_ip_or_cidr,
                                    parse_mac, requested)

if TYPE_CHECKING:
    from multusd.core.delegate import Delegate
    from multusd.core.request import CmdArgs

LOG = logging.getLogger(__name__)

DEVINFO_CNI_DIR = devinfo_cni_dir()

# The requests in the order upstream's mergeCNIRuntimeConfig sets them (F38), which the
# result cache's capabilityArgs keep.
_CAPABILITY_ORDER = (PORT_MAPPINGS, BANDWIDTH, IPS, MAC, INFINIBAND_GUID, DEVICE_ID)
# runtimeConfig keys upstream only passes on when they carry a value.
_CAPABILITY_KEYS = tuple(r.capability for r in _CAPABILITY_ORDER) + ("CNIDeviceInfoFile",)


def runtime_conf(req: "CmdArgs", delegate: "Delegate") -> RuntimeConf:
    """What ``delegate``'s plugins are run with for ``req`` besides its config: libcni's
    RuntimeConf (the attachment, CNI_ARGS with the pod identity and the legacy ``IP=``/``MAC=``,
    the capability args, the cache directory).

    :raises InvalidNetworkConfig: the delegate's requested MAC or an IP does not parse.
    """
    capability_args = delegate_capability_args(
        go_field(req.config, "runtimeConfig") or {}, delegate, container_id=req.container_id,
        devinfo_dir=devinfo_cni_dir(req.effective.devinfo_dir))
    legacy = legacy_cni_args(delegate)
    args = build_delegate_args(req.pod_namespace, req.pod_name, req.infra_container_id,
                               req.pod_uid, legacy)
    return RuntimeConf(container_id=req.container_id, netns=req.netns, ifname=delegate.ifname,
                       args=tuple(args), capability_args=capability_args,
                       cache_dir=req.effective.cni_dir)


def delegate_capability_args(global_runtime_config: Optional[Mapping[str, Any]],
                             delegate: "Delegate", *, container_id: str = "",
                             devinfo_dir: str = DEVINFO_CNI_DIR) -> Dict[str, Any]:
    """The capability args (libcni ``CapabilityArgs``) for one delegate.

    A deep copy of the runtime's global ``runtimeConfig``; for a non-master delegate the
    selection's ``portMappings``, ``bandwidth``, ``ips``, ``mac``, ``infinibandGUID`` and
    ``deviceID`` replace the global values. With a ``deviceID`` and ``container_id`` the
    ``CNIDeviceInfoFile`` path is added (F42). Empty values of these keys are left out.
    The plugin invoker later keeps only the keys the plugin declares in ``capabilities``.
    """
    args: Dict[str, Any] = copy.deepcopy(dict(global_runtime_config or {}))
    if not delegate.master:
        for request in _CAPABILITY_ORDER:
            value = getattr(delegate, request.delegate)
            if requested(value):
                args[request.capability] = json_value(value)
    if args.get("deviceID") and container_id:
        # Always our own path, even if the runtime sent one: two delegates must not share it.
        args["CNIDeviceInfoFile"] = device_info_path(delegate.name, container_id,
                                                     delegate.ifname, base_dir=devinfo_dir)
    for key in _CAPABILITY_KEYS:
        if key in args and (args[key] is None or (key != "bandwidth" and not args[key])):
            del args[key]
    return args


def device_info_path(delegate_name: str, container_id: str, ifname: str, *,
                     base_dir: str = DEVINFO_CNI_DIR) -> str:
    """Where the delegate's device-info file lives (NAD utils ``GetCNIDeviceInfoPath``)."""
    filename = f"{delegate_name}-{container_id}_{ifname}".replace("/", "-")
    return os.path.join(base_dir, filename)


def legacy_cni_args(delegate: "Delegate") -> List[Tuple[str, str]]:
    """The deprecated ``MAC=``/``IP=`` CNI_ARGS upstream still adds for requested MAC/IPs (F39).

    :raises InvalidNetworkConfig: when the requested MAC or an IP does not parse.
    """
    extra: List[Tuple[str, str]] = []
    if delegate.mac_request:
        try:
            parse_mac(delegate.mac_request)
        except ValueError:
            raise InvalidNetworkConfig(
                f"network {delegate.name!r}: failed to parse mac address "
                f"{delegate.mac_request!r}; request a MAC such as 'c2:11:22:33:44:55'") from None
        extra.append((MAC.legacy_arg, delegate.mac_request))
    if delegate.ip_request:
        for ip in delegate.ip_request:
            try:
                parse_ip_or_cidr(ip)
            except ValueError:
                raise InvalidNetworkConfig(
                    f"network {delegate.name!r}: failed to parse IP address {ip!r}; request "
                    "an IP or CIDR such as '10.1.1.5/24'") from None
        extra.append((IPS.legacy_arg, ",".join(delegate.ip_request)))
    return extra


def inject_cni_args(conf: bytes, cni_args: Mapping[str, Any]) -> bytes:
    """Merge ``cni_args`` into ``args.cni`` of a conf, or of every plugin of a conflist (F40).

    Keys of ``cni_args`` override existing ``args.cni`` keys; other keys are kept, and every
    other part of the config round-trips. Written with sorted keys, as upstream re-encodes it.

    :raises InvalidNetworkConfig: when the config or its ``args`` is not a JSON object.
    """
    data = _load_object(conf, "a network config")
    name = data.get("name", "")
    if go_field(data, "type"):  # upstream's NetConf struct decides: "Type" counts
        _merge_cni_args(data, cni_args, name)
    elif isinstance(data.get("plugins"), list):
        for plugin in data["plugins"]:
            if not isinstance(plugin, dict):
                raise InvalidNetworkConfig(f"network {name!r}: every element of 'plugins' "
                                           "must be an object")
            _merge_cni_args(plugin, cni_args, name)
    else:
        raise InvalidNetworkConfig(f"network {name!r}: cannot add cni-args: the config has "
                                   "neither 'type' nor 'plugins'")
    return go_json(data, sort_keys=True).encode()


def declared_capabilities(conf: bytes) -> Dict[str, bool]:
    """Capabilities set to true in a conf, or in any plugin of a conflist."""
    data = _load_object(conf, "a network config")
    plugins = data.get("plugins") if not go_field(data, "type") else [data]
    declared: Dict[str, bool] = {}
    for plugin in plugins if isinstance(plugins, list) else []:
        capabilities = go_field(plugin, "capabilities", nil=True)  # libcni's NetConf field
        if isinstance(capabilities, dict):
            declared.update({k: True for k, v in capabilities.items() if v is True})
    return declared


def undeclared_requests(delegate: "Delegate") -> List[str]:
    """What becomes of each request of the pod's selection that the delegate's config does
    not declare as a capability: one log line each (empty when there is none).

    Never a refusal (upstream serves these pods): as upstream, ``ips`` and ``mac`` still
    reach the plugins as the legacy ``IP=``/``MAC=`` CNI_ARGS (static IPAM, bridge, macvlan
    and tuning read them), and the other requests are not passed on at all; runtimeConfig
    carries only what a plugin declares (F38, F39). The NPWG spec's refusal (F63a) would
    break the many NADs in the field that declare no capabilities.
    """
    selection = delegate.selection
    if selection is None:
        return []
    declared = declared_capabilities(delegate.conf)
    network = f"{selection.namespace}/{selection.name}"
    lines = []
    for request in REQUESTS:
        if request is DEVICE_ID and delegate.resource_name:
            continue  # the device plugin's ID is written into the config itself (F41)
        if not requested(getattr(selection, request.attribute)) or request.capability in declared:
            continue
        fate = (f"passed on only as the legacy CNI_ARGS {request.legacy_arg}=, as upstream does"
                if request.legacy_arg else "not passed on, as upstream does")
        lines.append(
            f"network {network!r}: the pod requests {request.key!r} but no plugin of its "
            f"config declares \"capabilities\": {{\"{request.capability}\": true}}: {fate}; "
            f"declare the capability on the plugin that applies it to hand it over as "
            f"runtimeConfig")
    return lines


# --- internals -------------------------------------------------------------------------------


def _load_object(conf: bytes, what: str) -> Dict[str, Any]:
    try:
        data = go_loads(conf)
    except ValueError as exc:
        raise InvalidNetworkConfig(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidNetworkConfig(f"{what} must be a JSON object, got "
                                   f"{type(data).__name__}")
    return data


def _merge_cni_args(plugin: Dict[str, Any], cni_args: Mapping[str, Any], name: str) -> None:
    # ``plugin`` is part of a config just read and written out at once: the cni-args' values
    # are shared with it, not copied (a deep copy recursed: Go takes 10,000 levels of them).
    args = plugin.get("args")
    if args is None:
        args = plugin["args"] = {}
    if not isinstance(args, dict):
        raise InvalidNetworkConfig(f"network {name!r}: 'args' must be an object to receive "
                                   f"the pod's cni-args, got {go_json(args)[:200]}")
    cni = args.get("cni")
    if cni is None:
        args["cni"] = dict(cni_args)
        return
    if not isinstance(cni, dict):
        raise InvalidNetworkConfig(f"network {name!r}: 'args.cni' must be an object to receive "
                                   f"the pod's cni-args, got {go_json(cni)[:200]}")
    cni.update(cni_args)
