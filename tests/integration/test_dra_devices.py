"""Devices from DRA ResourceClaims through the real shim and daemon, to a recording delegate.

A NAD with ``k8s.v1.cni.cncf.io/resourceName`` gets its deviceID from the pod's ResourceClaim
and this node's ResourceSlices (the stand-in API server, tests/kubedra.py), merged with the
kubelet's device-plugin IDs as the checkpoint path is: ``deviceID``/``pciBusID`` in the config,
runtimeConfig ``deviceID`` and ``CNIDeviceInfoFile``, the device-info in network-status. The
delegate is tests/stubs/stub-record, which records what it was given; the cluster network is
the real bridge plugin. DEL works from the scratch cache with the API server gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from harness import Cluster, netns_addresses
from kubedra import gpu_device, network_device

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"
RESOURCE_KEY = "k8s.v1.cni.cncf.io/resourceName"
SRIOV, GPU = "sriov.example.com", "gpu.example.com"
RESOURCE = "example.com/sriov_vf"


class DraNode:
    """A cluster with a recording NAD per resource, this node's slices and a kubelet dir."""

    def __init__(self, sandbox, kube, tmp_path) -> None:
        self.cluster = Cluster(sandbox, kube, tmp_path)
        self.kube = kube
        self.record = str(tmp_path / "calls.jsonl")
        self.kubelet = str(tmp_path / "kubelet")
        self.devinfo = str(tmp_path / "devinfo")
        self.checkpoint({})
        node = kube.node
        kube.add_resource_slice("a-sriov", node=node, driver=SRIOV, pool="pool-0", devices=[
            network_device("vf-0", "0000:03:00.1", RESOURCE),
            network_device("vf-1", "0000:03:00.2", RESOURCE)])
        # another node: the same pool and device names, other IDs (never to be used here)
        kube.add_resource_slice("b-sriov", node="node-b", driver=SRIOV, pool="pool-0", devices=[
            network_device("vf-0", "0000:81:00.1", RESOURCE),
            network_device("vf-1", "0000:81:00.2", RESOURCE)])
        kube.add_resource_slice("a-gpu", node=node, driver=GPU, pool="pool-0",
                                devices=[gpu_device("gpu-0")])

    def checkpoint(self, by_uid: dict) -> None:
        """The kubelet's device-plugin checkpoint: {pod uid: {resource: [ids]}}."""
        path = os.path.join(self.kubelet, "device-plugins", "kubelet_internal_checkpoint")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        entries = [{"PodUID": uid, "ContainerName": "app", "ResourceName": resource,
                    "DeviceIDs": {"0": ids}}
                   for uid, resources in by_uid.items() for resource, ids in resources.items()]
        with open(path, "w") as handle:
            json.dump({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}},
                       "Checksum": 0}, handle)

    def nad(self, name: str, resource: str = RESOURCE) -> None:
        conf = {"cniVersion": "0.4.0", "type": "stub-record", "recordFile": self.record,
                "capabilities": {"deviceID": True, "CNIDeviceInfoFile": True},
                "result": {"interfaces": [{"name": "netX", "sandbox": "x"}],
                           "ips": [{"version": "4", "address": "10.94.0.7/24",
                                    "interface": 0}]}}
        self.kube.add_nad("default", name, json.dumps(conf), annotations={RESOURCE_KEY: resource})

    def start(self) -> "DraNode":
        self.cluster.start(kubeletRootDir=self.kubelet, deviceInfoDir=self.devinfo)
        return self

    def pod(self, name: str, networks: str, claims=(), extended=None) -> dict:
        status = {"resourceClaimStatuses": [{"name": f"net{i}", "resourceClaimName": c}
                                            for i, c in enumerate(claims)]}
        if extended is not None:
            status["extendedResourceClaimStatus"] = extended
        return self.kube.add_pod("default", name, annotations={NETWORKS_KEY: networks},
                                 status=status)

    def attach(self, pod: dict):
        ns_name, ns_path = self.cluster.sandbox.netns()
        cid = uuid.uuid4().hex
        return self.cluster.shim("ADD", pod, ns_path, cid), ns_name, ns_path, cid

    def calls(self, command: str) -> dict:
        """network name -> the stub's stdin, for each call of ``command``."""
        found = {}
        if os.path.exists(self.record):
            with open(self.record) as handle:
                for line in handle:
                    call = json.loads(line)
                    if call["command"] == command:
                        found[call["stdin"]["name"]] = call["stdin"]
        return found

    def show(self, query: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "multusd", "show", query, "--config",
                               self.cluster.daemon.config_path, *extra],
                              capture_output=True, text=True, timeout=120)


@pytest.fixture
def node(sandbox, kube_api, tmp_path) -> DraNode:
    return DraNode(sandbox, kube_api, tmp_path)


def test_a_vf_and_a_gpu_in_one_claim_give_the_delegate_this_nodes_vf(node):
    node.nad("sriov-net")
    node.start()
    node.kube.add_resource_claim("default", "web-net-x7k", [("vf", SRIOV, "pool-0", "vf-1"),
                                                             ("gpu", GPU, "pool-0", "gpu-0")])
    pod = node.pod("web", "sriov-net", claims=["web-net-x7k"])

    add, ns_name, ns_path, cid = node.attach(pod)

    assert add.code == 0, add.output
    stdin = node.calls("ADD")["sriov-net"]
    assert stdin["deviceID"] == stdin["pciBusID"] == "0000:03:00.2"
    assert stdin["runtimeConfig"]["deviceID"] == "0000:03:00.2"
    info_file = stdin["runtimeConfig"]["CNIDeviceInfoFile"]
    assert info_file == os.path.join(node.devinfo, "cni", f"default-sriov-net-{cid}_net1")
    assert "eth0" in netns_addresses(ns_name)  # the real cluster network ran too
    # network-status carries the device-info of the DRA device (upstream has none)
    status = node.cluster.status("default", "web")
    assert status[1]["name"] == "default/sriov-net"
    assert status[1]["device-info"] == {"type": "pci", "version": "1.1.0",
                                        "pci": {"pci-address": "0000:03:00.2"}}
    # the scratch cache records where the device came from, under a key of our own
    with open(os.path.join(node.cluster.daemon.cni_dir, cid)) as handle:
        cached = json.load(handle)
    assert cached[1]["deviceID"] == "0000:03:00.2" and cached[1]["resourceName"] == RESOURCE
    assert cached[1]["draDevice"] == {"claim": "web-net-x7k", "request": "vf", "driver": SRIOV,
                                      "pool": "pool-0", "device": "vf-1"}
    assert "draDevice" not in cached[0]
    # multusd show lists the claim, driver, pool and device of the attachment
    shown = node.show("default/web", "--json", "--no-api")
    assert shown.returncode == 0, shown.stderr
    attachments = json.loads(shown.stdout)["attachments"]
    assert attachments[1]["dra"] == cached[1]["draDevice"] and attachments[0]["dra"] is None
    text = node.show("web", "--no-api").stdout
    assert f"DRA claim web-net-x7k request vf: driver {SRIOV}, pool pool-0, device vf-1" in text
    # one claim GET; one list per driver, both of this node
    assert len(node.kube.dra_requests("resourceclaims")) == 1
    assert sorted(q["fieldSelector"] for _, _, q in node.kube.dra_requests("resourceslices")) \
        == [f"spec.nodeName={node.kube.node},spec.driver={GPU}",
            f"spec.nodeName={node.kube.node},spec.driver={SRIOV}"]

    # DEL from the scratch cache alone: no API server at all
    node.kube.stop()
    sent = len(node.kube.requests)
    assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert node.calls("DEL")["sriov-net"]["runtimeConfig"]["deviceID"] == "0000:03:00.2"
    assert node.calls("DEL")["sriov-net"]["deviceID"] == "0000:03:00.2"
    assert len(node.kube.requests) == sent
    assert not os.path.exists(os.path.join(node.cluster.daemon.cni_dir, cid))
    assert node.cluster.sandbox.leases_held() == []


def test_two_nads_of_one_resource_take_the_claims_two_devices_in_order(node):
    node.nad("sriov-a")
    node.nad("sriov-b")
    node.start()
    node.kube.add_resource_claim("default", "two-vfs", [("vf", SRIOV, "pool-0", "vf-1"),
                                                         ("vf", SRIOV, "pool-0", "vf-0")])
    pod = node.pod("two", "sriov-a,sriov-b", claims=["two-vfs"])

    add, _, ns_path, cid = node.attach(pod)

    assert add.code == 0, add.output
    calls = node.calls("ADD")
    assert calls["sriov-a"]["deviceID"] == "0000:03:00.1"
    assert calls["sriov-b"]["deviceID"] == "0000:03:00.2"
    assert [s.get("device-info", {}).get("pci", {}).get("pci-address")
            for s in node.cluster.status("default", "two")[1:]] == ["0000:03:00.1",
                                                                   "0000:03:00.2"]
    assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_dra_ids_merge_with_device_plugin_ids_and_a_device_info_file_wins(node):
    node.nad("sriov-a")
    node.nad("sriov-b")
    node.start()
    node.kube.add_resource_claim("default", "one-vf", [("vf", SRIOV, "pool-0", "vf-1")])
    pod = node.pod("merged", "sriov-a,sriov-b", claims=["one-vf"])
    node.checkpoint({pod["metadata"]["uid"]: {RESOURCE: ["0000:03:00.9"]}})
    # a device-info file for the DRA device, where a device plugin would leave it
    dp_file = os.path.join(node.devinfo, "dp", "example.com-sriov_vf-0000:03:00.2-device.json")
    os.makedirs(os.path.dirname(dp_file))
    device_info = {"type": "pci", "version": "1.1.0",
                   "pci": {"pci-address": "0000:03:00.2", "pf-pci-address": "0000:03:00.0"}}
    with open(dp_file, "w") as handle:
        json.dump(device_info, handle)

    add, _, ns_path, cid = node.attach(pod)

    assert add.code == 0, add.output
    calls = node.calls("ADD")
    assert calls["sriov-a"]["deviceID"] == "0000:03:00.2"  # sorted: DRA's, then the kubelet's
    assert calls["sriov-b"]["deviceID"] == "0000:03:00.9"
    status = node.cluster.status("default", "merged")
    assert status[1]["device-info"] == device_info
    assert "device-info" not in status[2]  # a device-plugin ID without a file: as upstream
    with open(os.path.join(node.cluster.daemon.cni_dir, cid)) as handle:
        cached = json.load(handle)
    assert cached[1]["draDevice"]["device"] == "vf-1" and "draDevice" not in cached[2]
    info_file = calls["sriov-a"]["runtimeConfig"]["CNIDeviceInfoFile"]
    assert os.path.exists(info_file)
    assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert not os.path.exists(info_file)


def test_a_claim_not_yet_allocated_fails_the_add_naming_it_and_leaves_nothing(node):
    node.nad("sriov-net")
    node.start()
    node.kube.add_resource_claim("default", "web-net-pending", None)
    pod = node.pod("pending", "sriov-net", claims=["web-net-pending"])

    add, ns_name, _, cid = node.attach(pod)

    assert add.code != 0
    msg = add.output["msg"]
    assert "ResourceClaim default/web-net-pending" in msg and "has no device allocation" in msg
    assert msg.startswith(f"[default/pending/{pod['metadata']['uid']}")
    assert node.calls("ADD") == {}
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert not os.path.exists(os.path.join(node.cluster.daemon.cni_dir, cid))
    assert node.cluster.sandbox.leases_held() == []


EXTENDED = {"resourceClaimName": "ext-abc", "requestMappings": [
    {"containerName": "app", "resourceName": RESOURCE, "requestName": "container-0-request-0"}]}


@pytest.mark.parametrize("published, ok", [(RESOURCE, True), ("example.com/other", False)],
                         ids=["match", "mismatch"])
def test_extended_resource_mapping(node, published, ok):
    node.kube.add_resource_slice("a-sriov", node=node.kube.node, driver=SRIOV, pool="pool-0",
                                 devices=[network_device("vf-0", "0000:03:00.1", published)])
    node.nad("sriov-net")
    node.start()
    node.kube.add_resource_claim("default", "ext-abc",
                                 [("container-0-request-0", SRIOV, "pool-0", "vf-0")])
    pod = node.pod("ext", "sriov-net", extended=EXTENDED)

    add, ns_name, ns_path, cid = node.attach(pod)

    if ok:
        assert add.code == 0, add.output
        assert node.calls("ADD")["sriov-net"]["deviceID"] == "0000:03:00.1"
        assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0
    else:
        assert add.code != 0
        assert "has k8s.cni.cncf.io/resourceName 'example.com/other', but the pod's " \
            "extended-resource mapping for request 'container-0-request-0' is " \
            f"'{RESOURCE}'" in add.output["msg"]
        assert node.calls("ADD") == {} and set(netns_addresses(ns_name)) == {"lo"}


def test_a_dra_only_node_needs_no_kubelet_device_plugin_state(node):
    """No checkpoint and no pod-resources socket: the claim's device serves the NAD; a NAD
    whose resource no claim gives fails, naming every source tried, and leaves nothing."""
    shutil.rmtree(node.kubelet)
    node.nad("sriov-net")
    node.nad("other-net", resource="example.com/not_here")
    node.start()
    node.kube.add_resource_claim("default", "dra-vf", [("vf", SRIOV, "pool-0", "vf-1")])
    pod = node.pod("dra-only", "sriov-net", claims=["dra-vf"])

    add, _, ns_path, cid = node.attach(pod)

    assert add.code == 0, add.output
    assert node.calls("ADD")["sriov-net"]["deviceID"] == "0000:03:00.2"
    assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0

    node.kube.add_resource_claim("default", "dra-vf-2", [("vf", SRIOV, "pool-0", "vf-0")])
    other = node.pod("dra-other", "sriov-net,other-net", claims=["dra-vf-2"])
    add, ns_name, _, cid = node.attach(other)

    assert add.code != 0
    msg = add.output["msg"]
    socket_path = os.path.join(node.kubelet, "pod-resources", "kubelet.sock")
    checkpoint = os.path.join(node.kubelet, "device-plugins", "kubelet_internal_checkpoint")
    assert ("has no device for resourceName 'example.com/not_here': tried its DRA "
            f"ResourceClaims (they allocate devices of '{RESOURCE}' only) and the kubelet's "
            f"device plugins (no pod-resources socket {socket_path!r}; cannot read the kubelet "
            f"device-plugin checkpoint {checkpoint!r}") in msg, msg
    with open(node.record) as handle:  # the first pod's ADD and DEL, nothing of the second's
        assert [json.loads(line)["command"] for line in handle] == ["ADD", "DEL"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert not os.path.exists(os.path.join(node.cluster.daemon.cni_dir, cid))
    assert node.cluster.sandbox.leases_held() == []


def test_a_pod_without_claims_costs_no_dra_request(node):
    node.nad("sriov-net")
    node.start()
    pod = node.pod("plain", "sriov-net")
    node.checkpoint({pod["metadata"]["uid"]: {RESOURCE: ["0000:03:00.4"]}})

    add, _, ns_path, cid = node.attach(pod)

    assert add.code == 0, add.output
    assert node.calls("ADD")["sriov-net"]["deviceID"] == "0000:03:00.4"
    assert node.kube.dra_requests() == []
    assert "device-info" not in node.cluster.status("default", "plain")[1]
    assert node.cluster.shim("DEL", pod, ns_path, cid).code == 0
