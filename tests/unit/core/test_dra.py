"""core/dra.py: what a DRA device leaves in the scratch cache, and the device-info it gives."""

from __future__ import annotations

import json

import pytest

from multusd.core import dra
from multusd.core.delegate import Delegate
from multusd.core.scratch import delegates_from_cache, delegates_to_cache

DEVICE = dra.DraDevice(claim="web-net-x7k", request="vf", driver="sriov.example.com",
                       pool="pool-0", device="vf-1")
# The JSON names of upstream's DelegateNetConf (pkg/types/types.go); Go's decoder matches
# keys to them case-insensitively and ignores every other key.
UPSTREAM_KEYS = ("Conf", "ConfList", "Name", "ifnameRequest", "macRequest",
                 "infinibandGUIDRequest", "ipRequest", "default-route", "IsFilterV4Gateway",
                 "IsFilterV6Gateway", "deviceID", "resourceName", "Bytes")


def delegates() -> list:
    conf = json.dumps({"cniVersion": "1.0.0", "name": "sriov", "type": "sriov"}).encode()
    return [Delegate(name="cluster", conf=b'{"cniVersion":"1.0.0","name":"c","type":"bridge"}',
                     ifname="eth0", master=True),
            Delegate(name="default/sriov-net", conf=conf, ifname="net1", master=False,
                     resource_name="example.com/vf", device_id="0000:03:00.2",
                     dra_device=DEVICE)]


def test_the_scratch_cache_keeps_the_dra_device_under_a_key_of_its_own():
    data = delegates_to_cache(delegates())
    entries = json.loads(data)
    assert entries[1][dra.CACHE_KEY] == {"claim": "web-net-x7k", "request": "vf",
                                         "driver": "sriov.example.com", "pool": "pool-0",
                                         "device": "vf-1"}
    assert dra.CACHE_KEY not in entries[0]
    assert dra.CACHE_KEY.lower() not in {key.lower() for key in UPSTREAM_KEYS}
    loaded = delegates_from_cache(data)
    assert loaded[1].dra_device == DEVICE and loaded[0].dra_device is None
    assert (loaded[1].device_id, loaded[1].resource_name) == ("0000:03:00.2", "example.com/vf")


@pytest.mark.parametrize("value", [None, "junk", {"claim": "c"}, {**DEVICE.to_cache(),
                                                                  "pool": 3}])
def test_a_malformed_dra_record_is_ignored_not_fatal(value):
    assert dra.from_cache(value) is None


@pytest.mark.parametrize("device_id, info", [
    ("0000:03:00.2", {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:03:00.2"}}),
    ("0000:af:06.7", {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:af:06.7"}}),
    ("gpu-0", None), ("0000:03:00.8", None), ("/dev/vhost-vdpa-0", None)])
def test_device_info_of_a_dra_device_only_from_a_pci_address(device_id, info):
    assert dra.device_info(device_id) == info


def test_with_origins_marks_only_the_devices_dra_gave():
    cluster, sriov = delegates()
    kubelets = Delegate(name="default/dp-net", conf=sriov.conf, ifname="net2", master=False,
                        resource_name="example.com/vf", device_id="0000:04:00.1")
    unmarked = [cluster, Delegate(name=sriov.name, conf=sriov.conf, ifname="net1", master=False,
                                  resource_name=sriov.resource_name, device_id=sriov.device_id),
                kubelets]
    origins = {("example.com/vf", "0000:03:00.2"): DEVICE}
    marked = dra.with_origins(unmarked, lambda resource, device_id:
                              origins.get((resource, device_id)))
    assert [d.dra_device for d in marked] == [None, DEVICE, None]
