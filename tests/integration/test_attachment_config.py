"""Per-attachment runtime config through the real shim and daemon: what each delegate gets.

runtimeConfig (mac, ips) only for the attachment that asked and declares them, legacy
MAC=/IP= CNI_ARGS whether declared or not (a real static IPAM reading them),
cni-args, a macvlan with a static MAC and IP, default-route moved to net1 (routes and
result caches), ECMP refused, device IDs from the kubelet checkpoint with device-info files.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from harness import Cluster, netns_addresses
from multusd.cni import resultcache

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"
RESOURCE_KEY = "k8s.v1.cni.cncf.io/resourceName"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def records(path: str) -> dict:
    """The recording stub's calls, by network name then command."""
    calls: dict = {}
    with open(path) as handle:
        for line in handle:
            call = json.loads(line)
            calls.setdefault(call["stdin"]["name"], {})[call["command"]] = call
    return calls


def recording_nad(cluster: Cluster, name: str, record: str, **conf) -> None:
    body = {"cniVersion": "0.4.0", "type": "stub-record", "recordFile": record,
            "capabilities": {"mac": True, "ips": True}}
    body.update(conf)
    cluster.kube.add_nad("default", name, json.dumps(body))


def attach(cluster: Cluster, pod: dict):
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    return cluster.shim("ADD", pod, ns_path, cid), ns_name, ns_path, cid


def test_only_the_requesting_attachment_gets_its_mac_ips_and_cni_args(cluster, tmp_path):
    record = str(tmp_path / "calls.jsonl")
    recording_nad(cluster, "rec-1", record)
    recording_nad(cluster, "rec-2", record)
    cluster.start()
    selection = [{"name": "rec-1", "mac": "c2:11:22:33:44:55", "ips": ["10.1.1.5/24"],
                  "cni-args": {"args0": "val0"}}, {"name": "rec-2"}]
    pod = cluster.pod("rec-pod", annotations={NETWORKS_KEY: json.dumps(selection)})
    add, _, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output

    calls = records(record)
    first, second = calls["rec-1"]["ADD"], calls["rec-2"]["ADD"]
    assert first["stdin"]["runtimeConfig"] == {"mac": "c2:11:22:33:44:55",
                                               "ips": ["10.1.1.5/24"]}
    assert first["stdin"]["args"] == {"cni": {"args0": "val0"}}
    assert "MAC=c2:11:22:33:44:55" in first["env"]["CNI_ARGS"].split(";")
    assert "IP=10.1.1.5/24" in first["env"]["CNI_ARGS"].split(";")
    assert "runtimeConfig" not in second["stdin"]
    assert "MAC=" not in second["env"]["CNI_ARGS"]
    assert second["env"]["CNI_ARGS"].startswith(
        f"IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=rec-pod;"
        f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={pod['metadata']['uid']}")
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert set(records(record)["rec-2"]) == {"ADD", "DEL"}


def test_requests_a_nad_does_not_declare_go_on_as_upstream_with_a_warning(cluster, tmp_path):
    record = str(tmp_path / "calls.jsonl")
    recording_nad(cluster, "nocaps", record, capabilities={})
    cluster.start()
    selection = [{"name": "nocaps", "mac": "c2:11:22:33:44:55", "ips": ["10.1.1.5/24"],
                  "infiniband-guid": "c2:11:22:33:44:55:66:77",
                  "portMappings": [{"hostPort": 8080, "containerPort": 80}]}]
    pod = cluster.pod("nocaps-pod", annotations={NETWORKS_KEY: json.dumps(selection)})
    add, _, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output  # upstream serves this pod: so does multusd
    call = records(record)["nocaps"]["ADD"]
    args = call["env"]["CNI_ARGS"].split(";")
    # exactly upstream's CNI_ARGS: the pod's five, then the deprecated MAC= and IP=
    assert args == ["IgnoreUnknown=true", "K8S_POD_NAMESPACE=default",
                    "K8S_POD_NAME=nocaps-pod", f"K8S_POD_INFRA_CONTAINER_ID={cid}",
                    f"K8S_POD_UID={pod['metadata']['uid']}", "MAC=c2:11:22:33:44:55",
                    "IP=10.1.1.5/24"]
    assert "runtimeConfig" not in call["stdin"]  # only what a plugin declares
    log = cluster.daemon.log()
    for request in ("ips", "mac", "infiniband-guid", "portMappings"):
        assert f"network 'default/nocaps': the pod requests '{request}' but no plugin" in log
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_static_ipam_without_capabilities_takes_the_ip_and_mac_from_legacy_args(cluster):
    """The common NAD in the field: bridge + static IPAM, no "capabilities" at all."""
    conf = {"cniVersion": "0.4.0", "type": "bridge", "bridge": cluster.sandbox.bridge(),
            "ipam": {"type": "static", "routes": [{"dst": "10.2.0.0/16"}]}}
    cluster.kube.add_nad("default", "legacy", json.dumps(conf))
    cluster.start()
    pod = cluster.pod("legacy-pod", annotations={NETWORKS_KEY: json.dumps(
        [{"name": "legacy", "ips": ["10.1.7.5/24"], "mac": "c2:11:22:33:44:77"}])})
    add, ns_name, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["net1"] == ["10.1.7.5/24"]  # static read IP= (CNI_ARGS)
    link = subprocess.run(["ip", "-n", ns_name, "-j", "link", "show", "net1"], check=True,
                          capture_output=True, text=True).stdout
    assert json.loads(link)[0]["address"] == "c2:11:22:33:44:77"  # bridge read MAC=
    status = {s["interface"]: s for s in cluster.status("default", "legacy-pod")}
    assert status["net1"]["ips"] == ["10.1.7.5"] and status["net1"]["mac"] == "c2:11:22:33:44:77"
    cached = resultcache.read(cluster.daemon.cni_dir, "legacy", cid, "net1")
    assert cached["cniArgs"][-2:] == [["MAC", "c2:11:22:33:44:77"], ["IP", "10.1.7.5/24"]]
    # libcni records the capability args it was handed, declared or not (so does upstream)
    assert cached["capabilityArgs"] == {"ips": ["10.1.7.5/24"], "mac": "c2:11:22:33:44:77"}
    assert "the pod requests 'ips' but no plugin" in cluster.daemon.log()

    assert cluster.shim("CHECK", pod, ns_path, cid).code == 0
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))


@pytest.fixture
def master_link():
    name = f"mdd{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)  # no dummy module here
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def test_macvlan_with_a_static_mac_and_ip_from_the_selection(cluster, master_link):
    conf = {"cniVersion": "0.4.0", "type": "macvlan", "master": master_link, "mode": "bridge",
            "capabilities": {"mac": True, "ips": True}, "ipam": {"type": "static"}}
    cluster.kube.add_nad("default", "mv", json.dumps(conf))
    cluster.start()
    pod = cluster.pod("mv-pod", annotations={
        NETWORKS_KEY: '[{"name":"mv","mac":"c2:11:22:33:44:66","ips":["10.1.1.5/24"]}]'})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["net1"] == ["10.1.1.5/24"]
    link = subprocess.run(["ip", "-n", ns_name, "-j", "link", "show", "net1"], check=True,
                          capture_output=True, text=True).stdout
    assert json.loads(link)[0]["address"] == "c2:11:22:33:44:66"
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert "net1" not in netns_addresses(ns_name)


def default_routes(ns_name: str) -> list:
    out = subprocess.run(["ip", "-4", "-n", ns_name, "-j", "route", "show", "default"],
                         check=True, capture_output=True, text=True).stdout
    return [(r.get("gateway"), r["dev"]) for r in json.loads(out)]


def test_default_route_moves_to_net1_in_the_pod_and_in_the_caches(cluster):
    cluster.nad("gwnet", "10.91.0.0/24", gateway=True)
    cluster.start()
    pod = cluster.pod("gw-pod", annotations={
        NETWORKS_KEY: '[{"name":"gwnet","default-route":["10.91.0.1"]}]'})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert default_routes(ns_name) == [("10.91.0.1", "net1")]

    cni_dir = cluster.daemon.cni_dir
    eth0 = resultcache.read_result(cni_dir, "cluster-net", cid, "eth0")
    net1 = resultcache.read_result(cni_dir, "gwnet", cid, "net1")
    assert not any(r.get("dst") == "0.0.0.0/0" for r in eth0.get("routes", []))
    assert {"dst": "0.0.0.0/0", "gw": "10.91.0.1"} in net1["routes"]
    # the result the runtime sees is eth0's, untouched
    assert add.output["routes"] == [{"dst": "0.0.0.0/0"}]

    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert cluster.sandbox.leases_held() == []


def test_two_default_routes_are_refused_as_ecmp(cluster):
    cluster.nad("gw-a", "10.92.0.0/24", gateway=True)
    cluster.nad("gw-b", "10.93.0.0/24", gateway=True)
    cluster.start()
    pod = cluster.pod("ecmp-pod", annotations={NETWORKS_KEY: json.dumps(
        [{"name": "gw-a", "default-route": ["10.92.0.1"]},
         {"name": "gw-b", "default-route": ["10.93.0.1"]}])})
    add, ns_name, _, _ = attach(cluster, pod)
    assert add.code != 0
    assert "multus does not support ECMP for default-route" in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []


def write_checkpoint(kubelet_dir: str, uid: str, resource: str, ids: list) -> None:
    path = os.path.join(kubelet_dir, "device-plugins", "kubelet_internal_checkpoint")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump({"Data": {"PodDeviceEntries": [
            {"PodUID": uid, "ContainerName": "app", "ResourceName": resource,
             "DeviceIDs": {"0": ids}}], "RegisteredDevices": {resource: ids}},
            "Checksum": 0}, handle)


def test_device_id_from_the_checkpoint_reaches_the_delegate_and_network_status(cluster,
                                                                               tmp_path):
    kubelet, devinfo = str(tmp_path / "kubelet"), str(tmp_path / "devinfo")
    record = str(tmp_path / "calls.jsonl")
    resource = "example.com/sriov"
    conf = {"cniVersion": "0.4.0", "type": "stub-record", "recordFile": record,
            "capabilities": {"deviceID": True, "CNIDeviceInfoFile": True},
            "result": {"interfaces": [{"name": "net1", "sandbox": "x"}],
                       "ips": [{"version": "4", "address": "10.94.0.7/24", "interface": 0}]}}
    cluster.kube.add_nad("default", "sriov-net", json.dumps(conf),
                         annotations={RESOURCE_KEY: resource})
    cluster.start(kubeletRootDir=kubelet, deviceInfoDir=devinfo)
    pod = cluster.pod("dev-pod", annotations={NETWORKS_KEY: "sriov-net"})
    write_checkpoint(kubelet, pod["metadata"]["uid"], resource, ["0000:03:00.2", "0000:03:00.1"])
    dp_file = os.path.join(devinfo, "dp", "example.com-sriov-0000:03:00.1-device.json")
    os.makedirs(os.path.dirname(dp_file))
    device_info = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:03:00.1"}}
    with open(dp_file, "w") as handle:
        json.dump(device_info, handle)

    add, _, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output

    call = records(record)["sriov-net"]["ADD"]["stdin"]
    assert call["deviceID"] == "0000:03:00.1" and call["pciBusID"] == "0000:03:00.1"
    info_file = call["runtimeConfig"]["CNIDeviceInfoFile"]
    assert info_file == os.path.join(devinfo, "cni", f"default-sriov-net-{cid}_net1")
    assert call["runtimeConfig"]["deviceID"] == "0000:03:00.1"
    with open(info_file) as handle:
        assert json.load(handle) == device_info
    status = cluster.status("default", "dev-pod")
    assert status[1]["device-info"] == device_info

    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert not os.path.exists(info_file)


def test_a_nad_without_resource_name_never_reads_device_paths(cluster, tmp_path):
    kubelet = str(tmp_path / "kubelet")
    os.makedirs(os.path.join(kubelet, "device-plugins"))
    with open(os.path.join(kubelet, "device-plugins", "kubelet_internal_checkpoint"), "w") as f:
        f.write("{corrupt")
    cluster.nad("plain", "10.95.0.0/24")
    cluster.start(kubeletRootDir=kubelet)
    pod = cluster.pod("plain-pod", annotations={NETWORKS_KEY: "plain"})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["net1"] == ["10.95.0.2/24"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_auxiliary_chain_runs_after_every_network(cluster):
    aux_dir = os.path.join(cluster.conf_dir, "aux")
    os.makedirs(aux_dir)
    with open(os.path.join(aux_dir, "10-tuning.conf"), "w") as handle:
        json.dump({"type": "tuning", "sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}, handle)
    cluster.start(auxiliaryCNIChainName="aux")
    pod = cluster.pod("aux-pod")
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    sysctl = subprocess.run(["ip", "netns", "exec", ns_name, "cat",
                             "/proc/sys/net/ipv4/conf/eth0/arp_filter"],
                            check=True, capture_output=True, text=True).stdout.strip()
    assert sysctl == "1"
    assert [ip["address"] for ip in add.output["ips"]] == ["10.80.0.2/24"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
