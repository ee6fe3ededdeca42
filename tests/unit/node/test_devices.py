"""devices.py without a kubelet: the checkpoint file, ID allocation, device-info files.

All files live under the test's tmp dir; the gRPC path is tested against a real server in
tests/integration/test_devices_podresources.py.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from multusd.node import devices

from multusd.core import runtimeconf
from multusd.core.podnetworks import build_delegates
from multusd.core.settings import load_settings
from multusd.errors import DecodeFailure, InvalidEnvironment, IOFailure

POD_UID = "9f1c7c1e-0000-4000-8000-000000000001"
OTHER_UID = "9f1c7c1e-0000-4000-8000-000000000002"
RESOURCE = "intel.com/sriov_netdevice"


def write_checkpoint(path, entries) -> str:
    data = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {RESOURCE: []}},
            "Checksum": 1234}
    path.write_text(json.dumps(data))
    return str(path)


def entry(uid: str, resource: str, ids, container: str = "app") -> dict:
    return {"PodUID": uid, "ContainerName": container, "ResourceName": resource,
            "DeviceIDs": ids, "AllocResp": "CgA="}


@pytest.fixture
def checkpoint(tmp_path) -> str:
    return write_checkpoint(tmp_path / "kubelet_internal_checkpoint", [
        entry(POD_UID, RESOURCE, {"0": ["0000:af:06.3"], "1": ["0000:af:06.1"]}),
        entry(POD_UID, "example.com/gpu", {"-1": ["gpu-1"]}, container="side"),
        entry(OTHER_UID, RESOURCE, {"0": ["0000:af:06.2"]}),
    ])


def no_socket(tmp_path) -> str:
    return str(tmp_path / "no-such-kubelet.sock")


def test_checkpoint_ids_for_the_pod_uid_sorted(tmp_path, checkpoint):
    found = devices.device_ids_for_pod("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint)
    assert found == {RESOURCE: ["0000:af:06.1", "0000:af:06.3"],
                     "example.com/gpu": ["gpu-1"]}


def test_checkpoint_of_an_old_kubelet_lists_ids_directly(tmp_path):
    path = write_checkpoint(tmp_path / "cp", [entry(POD_UID, RESOURCE, ["b", "a"])])
    assert devices.checkpoint_device_ids(path, POD_UID) == {RESOURCE: ["b", "a"]}


def test_a_pod_without_allocations_gets_nothing(tmp_path, checkpoint):
    assert devices.device_ids_for_pod("default", "pod-z", "0000-unknown",
                                      pod_resources_socket=no_socket(tmp_path),
                                      checkpoint=checkpoint) == {}


def test_no_socket_and_no_checkpoint_says_so(tmp_path):
    with pytest.raises(IOFailure) as err:
        devices.device_ids_for_pod("default", "pod-a", POD_UID,
                                   pod_resources_socket=no_socket(tmp_path),
                                   checkpoint=str(tmp_path / "missing"))
    assert "pod-resources socket" in err.value.msg and "missing" in err.value.msg


def test_corrupt_checkpoint_is_a_decode_failure(tmp_path):
    path = tmp_path / "cp"
    path.write_text("{not json")
    with pytest.raises(DecodeFailure):
        devices.checkpoint_device_ids(str(path), POD_UID)
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        entry(POD_UID, RESOURCE, {"0": "not-a-list"})]}}))
    with pytest.raises(DecodeFailure):
        devices.checkpoint_device_ids(str(path), POD_UID)


def test_checkpoint_needs_the_pod_uid(checkpoint):
    with pytest.raises(InvalidEnvironment):
        devices.checkpoint_device_ids(checkpoint, "")


def test_allocator_gives_successive_ids_then_runs_out(tmp_path, checkpoint):
    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint)
    assert [allocate(RESOURCE), allocate("example.com/gpu"), allocate(RESOURCE)] == [
        "0000:af:06.1", "gpu-1", "0000:af:06.3"]
    assert allocate(RESOURCE) == ""
    assert allocate("example.com/none") == ""


def test_allocator_asks_nothing_until_a_resource_is_needed(tmp_path):
    # The checkpoint does not exist: constructing must not fail, the first call must.
    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=str(tmp_path / "missing"))
    with pytest.raises(IOFailure):
        allocate(RESOURCE)


def test_allocator_merges_extra_devices_per_resource_and_sorts_them(tmp_path, checkpoint):
    """DRA's devices join the kubelet's of the same resource, sorted together (upstream)."""
    asked = []

    def extra():
        asked.append(True)
        return [(RESOURCE, "0000:af:06.2", "claim-a"), ("example.com/dra", "d-1", "claim-b")]

    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint, extra=extra)
    assert [allocate(RESOURCE) for _ in range(3)] == ["0000:af:06.1", "0000:af:06.2",
                                                      "0000:af:06.3"]
    assert allocate("example.com/dra") == "d-1" and allocate("example.com/dra") == ""
    assert asked == [True]  # once, on the first call
    assert allocate.origin(RESOURCE, "0000:af:06.2") == "claim-a"
    assert allocate.origin(RESOURCE, "0000:af:06.1") is None  # the kubelet's
    assert allocate.origin("example.com/dra", "d-1") == "claim-b"


def test_allocator_asks_extra_nothing_until_a_resource_is_needed(tmp_path, checkpoint):
    def extra():
        raise AssertionError("asked")

    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint, extra=extra)
    assert allocate.origin(RESOURCE, "0000:af:06.1") is None


def test_an_extra_device_not_handed_out_has_no_origin(tmp_path, checkpoint):
    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint,
                                       extra=lambda: [(RESOURCE, "0000:af:06.9", "claim")])
    assert allocate(RESOURCE) == "0000:af:06.1"
    assert allocate.origin(RESOURCE, "0000:af:06.9") is None


def test_a_dra_only_node_needs_no_kubelet_device_plugin_state(tmp_path):
    """No pod-resources socket, no checkpoint: DRA's devices serve their resource."""
    allocate = devices.DeviceAllocator(
        "default", "pod-a", POD_UID, pod_resources_socket=no_socket(tmp_path),
        checkpoint=str(tmp_path / "missing"),
        extra=lambda: [(RESOURCE, "0000:af:06.2", "claim-a"), (RESOURCE, "0000:af:06.1", "c")])
    assert [allocate(RESOURCE), allocate(RESOURCE), allocate(RESOURCE)] == [
        "0000:af:06.1", "0000:af:06.2", ""]
    assert allocate.origin(RESOURCE, "0000:af:06.2") == "claim-a"


@pytest.mark.parametrize("extra, dra_said", [
    (lambda: [("example.com/gpu", "gpu-0", "claim")],
     "DRA ResourceClaims (they allocate devices of 'example.com/gpu' only)"),
    (lambda: [], "DRA ResourceClaims (they allocate no device with a resourceName)"),
    (None, "DRA ResourceClaims (not asked: no pod object from the API server)"),
], ids=["another resource", "no device", "no pod"])
def test_a_resource_no_source_supplies_fails_naming_every_source_tried(tmp_path, extra,
                                                                        dra_said):
    socket_path, missing = no_socket(tmp_path), str(tmp_path / "missing")
    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=socket_path, checkpoint=missing,
                                       extra=extra)
    if extra is not None and extra():
        assert allocate("example.com/gpu") == "gpu-0"  # DRA's own resource: served
    with pytest.raises(IOFailure) as err:
        allocate(RESOURCE)
    msg = err.value.msg
    assert msg.startswith(f"pod default/pod-a has no device for resourceName {RESOURCE!r}: "
                          f"tried its {dra_said} and the kubelet's device plugins (no "
                          f"pod-resources socket {socket_path!r}; cannot read the kubelet "
                          f"device-plugin checkpoint {missing!r}: No such file or directory")
    assert "give the pod a ResourceClaim" in msg and "kubeletRootDir" in msg


def test_the_kubelet_is_asked_when_dra_lacks_a_resource_and_its_state_appeared(tmp_path):
    path = tmp_path / "checkpoint"
    allocate = devices.DeviceAllocator(
        "default", "pod-a", POD_UID, pod_resources_socket=no_socket(tmp_path),
        checkpoint=str(path), extra=lambda: [(RESOURCE, "0000:af:06.5", "claim")])
    assert allocate(RESOURCE) == "0000:af:06.5"
    write_checkpoint(path, [entry(POD_UID, RESOURCE, {"0": ["0000:af:06.1"]}),
                            entry(POD_UID, "example.com/gpu", {"0": ["gpu-1"]})])
    assert allocate("example.com/gpu") == "gpu-1"
    assert allocate(RESOURCE) == ""  # DRA's list, handed out in order, stays as it was


class Nad:
    def __init__(self, name: str, config: dict, annotations: dict) -> None:
        self.namespace, self.name = "default", name
        self.config, self.annotations = json.dumps(config), annotations


def test_two_nads_with_the_same_resource_get_the_sorted_ids_in_order(tmp_path, checkpoint):
    """F41 end to end through podnetworks.build_delegates with the real allocator."""
    nads = {name: Nad(name, {"cniVersion": "1.0.0", "name": name, "type": "host-device"},
                      {"k8s.v1.cni.cncf.io/resourceName": RESOURCE})
            for name in ("sriov-a", "sriov-b")}
    allocate = devices.DeviceAllocator("default", "pod-a", POD_UID,
                                       pod_resources_socket=no_socket(tmp_path),
                                       checkpoint=checkpoint)
    netconf = {"cniVersion": "1.0.0", "name": "multus", "type": "multus",
               "delegates": [{"cniVersion": "1.0.0", "name": "cluster", "type": "bridge"}]}
    built = build_delegates(load_settings(netconf), pod_namespace="default", pod_name="pod-a",
                            annotations={"k8s.v1.cni.cncf.io/networks": "sriov-a,sriov-b"},
                            cni_ifname="eth0", get_nad=lambda ns, name: nads.get(name),
                            device_id_for=allocate)
    assert [(d.resource_name, d.device_id) for d in built[1:]] == [
        (RESOURCE, "0000:af:06.1"), (RESOURCE, "0000:af:06.3")]


# --- device-info files ----------------------------------------------------------------------


DEVICE_INFO = {"type": "pci", "version": "1.1.0",
               "pci": {"pci-address": "0000:af:06.1", "pf-pci-address": "0000:af:00.0"}}


def test_device_plugin_info_path_replaces_slashes(tmp_path):
    assert devices.device_plugin_info_path(RESOURCE, "a/b", dp_dir=str(tmp_path)) == str(
        tmp_path / "intel.com-sriov_netdevice-a-b-device.json")
    assert devices.device_plugin_info_path(RESOURCE, "x") == (
        "/var/run/k8s.cni.cncf.io/devinfo/dp/intel.com-sriov_netdevice-x-device.json")


def test_cni_device_info_path_is_upstreams():
    assert runtimeconf.device_info_path("default/sriov-a", "cid1", "net1") == (
        "/var/run/k8s.cni.cncf.io/devinfo/cni/default-sriov-a-cid1_net1")


def test_copy_load_and_remove_device_info(tmp_path):
    dp_dir = tmp_path / "dp"
    dp_dir.mkdir()
    source = devices.device_plugin_info_path(RESOURCE, "0000:af:06.1", dp_dir=str(dp_dir))
    with open(source, "w") as handle:
        json.dump(DEVICE_INFO, handle)
    dest = str(tmp_path / "cni" / "default-sriov-a-cid1_net1")

    assert devices.copy_device_plugin_info(RESOURCE, "0000:af:06.1", dest,
                                           dp_dir=str(dp_dir)) is True
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o444
    assert devices.load_device_info(dest) == DEVICE_INFO
    # A second ADD of the same sandbox/interface replaces the read-only file.
    assert devices.copy_device_plugin_info(RESOURCE, "0000:af:06.1", dest,
                                           dp_dir=str(dp_dir)) is True

    assert devices.remove_device_info(dest) is True
    assert not os.path.exists(dest)
    assert devices.remove_device_info(dest) is False
    assert devices.load_device_info(dest) is None


def test_copy_without_a_device_plugin_file_is_logged_not_raised(tmp_path):
    dest = str(tmp_path / "cni" / "x")
    assert devices.copy_device_plugin_info(RESOURCE, "nope", dest,
                                           dp_dir=str(tmp_path)) is False
    assert not os.path.exists(dest)


def test_malformed_device_plugin_file_is_not_copied(tmp_path, caplog):
    source = devices.device_plugin_info_path(RESOURCE, "d1", dp_dir=str(tmp_path))
    with open(source, "w") as handle:
        handle.write("[1, 2]")
    dest = str(tmp_path / "cni" / "x")
    assert devices.copy_device_plugin_info(RESOURCE, "d1", dest, dp_dir=str(tmp_path)) is False
    assert not os.path.exists(dest)
    assert "malformed" in caplog.text


def test_load_of_a_non_object_is_none(tmp_path):
    path = tmp_path / "info"
    path.write_text('"just a string"')
    assert devices.load_device_info(str(path)) is None
