"""DRA-allocated devices on the Multus side: merged with the kubelet's, recorded, described.

The Kubernetes side (ResourceClaims, ResourceSlices) is the ``kube`` object's
(``pod_dra_devices``); this module turns what it returns into per-resource device IDs for
:class:`multusd.node.devices.DeviceAllocator` (merged there with the device-plugin IDs and
sorted, as upstream merges its resource map), remembers which delegate got which DRA device
(:class:`DraDevice`, kept in the scratch cache under a key upstream's reader ignores, for
``multusd show``), and gives a DRA device whose ID is a PCI address its device-info when
neither a device-info file nor the plugin provided one (upstream writes none for DRA).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd.store.valueclass import Record, replace

LOG = logging.getLogger(__name__)

CACHE_KEY = "draDevice"  # in a scratch-cache entry; no field of upstream's DelegateNetConf
DEVICE_INFO_VERSION = "1.1.0"
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_FIELDS = ("claim", "request", "driver", "pool", "device")

Extra = Callable[[], Sequence[Tuple[str, str, Any]]]
"""What :class:`DeviceAllocator` asks once: (resourceName, deviceID, origin) of each device."""


class DraDevice(Record):
    """Where a delegate's device came from: the claim and request, and the published device."""

    claim: str    # the ResourceClaim's name (in the pod's namespace)
    request: str
    driver: str
    pool: str
    device: str

    def to_cache(self) -> Dict[str, str]:
        return {name: getattr(self, name) for name in _FIELDS}


def from_cache(value: Any) -> Optional[DraDevice]:
    """The :class:`DraDevice` of a scratch-cache entry's ``draDevice``; None when absent or
    malformed (it only describes; DEL never needs it)."""
    if not isinstance(value, Mapping):
        return None
    fields = {name: value.get(name) for name in _FIELDS}
    if not all(isinstance(v, str) for v in fields.values()):
        LOG.warning("ignoring a malformed %r in a scratch cache entry: %r", CACHE_KEY, value)
        return None
    return DraDevice(**fields)


def device_lookup(kube: Any, pod: Any, deadline: float) -> Extra:
    """The allocator's ``extra`` source: the pod's DRA devices, asked of ``kube`` when called.

    Only called for a pod that has a NAD with a resourceName, once per ADD.
    """
    def devices() -> List[Tuple[str, str, DraDevice]]:
        found = kube.pod_dra_devices(pod, deadline=deadline)
        if found:
            LOG.debug("DRA devices of pod %s/%s: %s", pod.namespace, pod.name,
                      ", ".join(f"{d.resource_name}={d.device_id}" for d in found))
        return [(d.resource_name, d.device_id,
                 DraDevice(claim=d.claim, request=d.request, driver=d.driver, pool=d.pool,
                           device=d.device)) for d in found]

    return devices


def with_origins(delegates: Sequence[Any], origin: Callable[[str, str], Any]) -> List[Any]:
    """The delegates, each one whose device came from DRA marked with its :class:`DraDevice`."""
    marked = []
    for delegate in delegates:
        found = origin(delegate.resource_name, delegate.device_id) if delegate.device_id \
            else None
        marked.append(replace(delegate, dra_device=found) if isinstance(found, DraDevice)
                      else delegate)
    return marked


def device_info(device_id: str) -> Optional[Dict[str, Any]]:
    """The device-info (NPWG device-info spec) a DRA device's ID tells: a PCI address gives
    ``{"type": "pci", "pci": {"pci-address": ...}}``; anything else gives None."""
    if not _PCI_ADDRESS.fullmatch(device_id):
        return None
    return {"type": "pci", "version": DEVICE_INFO_VERSION, "pci": {"pci-address": device_id}}
