"""A pod's delegates in parallel (``"parallelDelegates": true``, an opt-in): the master first,
secondaries together, what names another attachment's interface after it, the same outcome.

The real daemon and shim and the fake API server. ``stub-timed`` records when each plugin
call started and ended, and its barrier makes secondaries prove they overlapped: each waits
for its peers to have started, and fails when they never do (as in a sequential run).
``stub-link`` makes real links in the pod and, bond-style, fails unless the links it
enslaves already exist there when it runs. Real bridge + host-local networks show nothing
leaks: links, leases, caches.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest

from harness import STATUS_KEY, Cluster, events_bound, netns_addresses
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


class Timed:
    """stub-timed networks sharing one record file and one barrier directory."""

    def __init__(self, cluster: Cluster, tmp_path) -> None:
        self.cluster = cluster
        self.record = str(tmp_path / "calls.jsonl")
        self.barrier_dir = str(tmp_path / "barrier")
        os.makedirs(self.barrier_dir)

    def conf(self, name: str, number: int, **extra) -> dict:
        conf = {"cniVersion": "0.4.0", "name": name, "type": "stub-timed",
                "recordFile": self.record, "barrierDir": self.barrier_dir,
                "result": {"interfaces": [{"mac": f"0a:00:00:00:00:{number:02x}"}],
                           "ips": [{"version": "4", "address": f"192.0.2.{number}/24",
                                    "interface": 0}]}}
        conf.update(extra)
        return conf

    def nad(self, name: str, number: int, **extra) -> None:
        self.cluster.kube.add_nad("default", name, json.dumps(self.conf(name, number, **extra)))

    def cluster_network(self, **extra) -> str:
        path = os.path.join(self.cluster.conf_dir, "00-timed.conf")
        with open(path, "w") as handle:
            json.dump(self.conf("timed-cluster", 1, **extra), handle)
        return path

    def calls(self, command: str) -> dict:
        with open(self.record) as handle:
            lines = [json.loads(line) for line in handle]
        return {c["ifname"]: c for c in lines if c["command"] == command}

    def reset(self) -> None:
        os.unlink(self.record)
        for name in os.listdir(self.barrier_dir):
            os.unlink(os.path.join(self.barrier_dir, name))


@pytest.fixture
def timed(cluster, tmp_path) -> Timed:
    return Timed(cluster, tmp_path)


def attach(cluster: Cluster, pod: dict):
    _, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    return cluster.shim("ADD", pod, ns_path, cid), ns_path, cid


def test_secondaries_overlap_after_the_master(cluster, timed):
    peers = ["net1", "net2", "net3"]
    for number, name in enumerate(["sec-a", "sec-b", "sec-c"], start=2):
        timed.nad(name, number, barrier=peers, barrierOn="ADD")
    cluster.start(clusterNetwork=timed.cluster_network(), parallelDelegates=True)
    pod = cluster.pod("par-0", annotations={NETWORKS_KEY: "sec-a,sec-b,sec-c"})

    add, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output  # the barrier fails a sequential run
    calls = timed.calls("ADD")
    assert sorted(calls) == ["eth0", "net1", "net2", "net3"]
    assert all(calls[p]["start"] >= calls["eth0"]["end"] for p in peers)
    assert max(calls[p]["start"] for p in peers) < min(calls[p]["end"] for p in peers)

    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert sorted(timed.calls("DEL")) == ["eth0", "net1", "net2", "net3"]
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    assert not os.listdir(os.path.join(cluster.daemon.cni_dir, "results"))


def test_del_releases_the_master_and_the_secondaries_together(cluster, timed):
    peers = ["eth0", "net1", "net2"]
    for number, name in enumerate(["sec-a", "sec-b"], start=2):
        timed.nad(name, number, barrier=peers, barrierOn="DEL")
    cluster.start(clusterNetwork=timed.cluster_network(barrier=peers, barrierOn="DEL"),
                  parallelDelegates=True)
    pod = cluster.pod("par-1", annotations={NETWORKS_KEY: "sec-a,sec-b"})
    add, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output

    delete = cluster.shim("DEL", pod, ns_path, cid)

    assert delete.code == 0, delete.output  # the DEL barrier fails a sequential release
    dels = timed.calls("DEL")
    assert max(dels[p]["start"] for p in peers) < min(dels[p]["end"] for p in peers)
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))


def test_dependent_delegates_wait_for_what_they_name(cluster, timed):
    timed.nad("sec-a", 2, barrier=["net1", "net2"])
    timed.nad("sec-b", 3, barrier=["net1", "net2"])
    timed.nad("on-net1", 4, master="net1")         # names net1's interface as its master
    timed.nad("in-pod", 5, linkInContainer=True)   # its link is one of the pod's interfaces
    cluster.start(clusterNetwork=timed.cluster_network(), parallelDelegates=True)
    pod = cluster.pod("par-2", annotations={NETWORKS_KEY: "sec-a,sec-b,on-net1,in-pod"})

    add, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output
    calls = timed.calls("ADD")
    assert calls["net3"]["start"] >= calls["net1"]["end"]
    assert all(calls["net4"]["start"] >= calls[i]["end"] for i in ("eth0", "net1", "net2", "net3"))
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    dels = timed.calls("DEL")
    assert dels["net1"]["start"] >= dels["net3"]["end"]
    assert all(dels[i]["start"] >= dels["net4"]["end"] for i in ("net1", "net2", "net3"))


class Links:
    """stub-link networks: ``maker`` NADs create a dummy link, ``needs`` NADs require links."""

    def __init__(self, cluster: Cluster, tmp_path) -> None:
        self.cluster = cluster
        self.record = str(tmp_path / "links.jsonl")
        self.markers = str(tmp_path / "markers")
        os.makedirs(self.markers)

    def conf(self, name: str, **extra) -> dict:
        return {"cniVersion": "0.4.0", "name": name, "type": "stub-link",
                "recordFile": self.record, "markerDir": self.markers, **extra}

    def maker(self, name: str) -> None:
        self.cluster.kube.add_nad("default", name, json.dumps(self.conf(name, makeLink=True)))

    def needs(self, name: str, **extra) -> None:
        self.cluster.kube.add_nad("default", name, json.dumps(self.conf(name, **extra)))

    def calls(self, command: str) -> dict:
        with open(self.record) as handle:
            lines = [json.loads(line) for line in handle]
        return {c["ifname"]: c for c in lines if c["command"] == command}


def test_a_bond_and_a_vlan_on_pod_links_wait_for_those_links(cluster, tmp_path):
    links = Links(cluster, tmp_path)
    for name in ("slave-a", "slave-b", "slave-c"):
        links.maker(name)
    # bond-cni's own config shape: links by name, in the pod
    links.needs("bond", mode="active-backup", linksInContainer=True,
                links=[{"name": "net1"}, {"name": "net2"}])
    # vlan style, inside a conflist: the master link is one of the pod's interfaces
    cluster.kube.add_nad("default", "vlan-on-c", json.dumps({
        "cniVersion": "0.4.0", "name": "vlan-on-c",
        "plugins": [dict(links.conf("vlan-on-c"), master="net3", linkInContainer=True)]}))
    cluster.start(parallelDelegates=True)
    pod = cluster.pod("par-7", annotations={
        NETWORKS_KEY: "slave-a,slave-b,slave-c,bond@bond0,vlan-on-c@vlan7"})

    add, ns_path, cid = attach(cluster, pod)

    # stub-link fails the ADD when a link it names is not in the netns yet (a wrong order)
    assert add.code == 0, add.output
    ns_name = os.path.basename(ns_path)
    assert {"net1", "net2", "net3", "bond0", "vlan7"} <= set(netns_addresses(ns_name))
    calls = links.calls("ADD")
    makers = ("net1", "net2", "net3")
    assert max(calls[m]["start"] for m in makers) < min(calls[m]["end"] for m in makers)
    assert all(calls["bond0"]["start"] >= calls[m]["end"] for m in ("net1", "net2"))
    assert calls["vlan7"]["start"] >= calls["net3"]["end"]

    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    dels = links.calls("DEL")
    assert all(dels[m]["start"] >= dels["bond0"]["end"] for m in ("net1", "net2"))
    assert dels["net3"]["start"] >= dels["vlan7"]["end"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))


def test_the_auxiliary_chain_runs_after_every_other_network(cluster, timed):
    timed.nad("sec-a", 2, barrier=["net1", "net2"])
    timed.nad("sec-b", 3, barrier=["net1", "net2"])
    cluster_network = timed.cluster_network()
    aux_dir = os.path.join(os.path.dirname(cluster_network), "aux")
    os.makedirs(aux_dir)
    with open(os.path.join(aux_dir, "10-timed.conf"), "w") as handle:
        json.dump({"type": "stub-timed", "recordFile": timed.record}, handle)
    cluster.start(clusterNetwork=cluster_network, auxiliaryCNIChainName="aux",
                  parallelDelegates=True)
    pod = cluster.pod("par-6", annotations={NETWORKS_KEY: "sec-a,sec-b"})

    add, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output
    calls = timed.calls("ADD")
    assert sorted(calls) == ["eth0", "net1", "net2", "net3"]  # net3: the chain
    assert all(calls["net3"]["start"] >= calls[i]["end"] for i in ("eth0", "net1", "net2"))
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    dels = timed.calls("DEL")
    assert all(dels[i]["start"] >= dels["net3"]["end"] for i in ("eth0", "net1", "net2"))


@pytest.mark.parametrize("setting", [{}, {"parallelDelegates": False}], ids=["unset", "false"])
def test_by_default_and_with_false_every_delegate_runs_in_order(cluster, timed, setting):
    for number, name in enumerate(["sec-a", "sec-b", "sec-c"], start=2):
        timed.nad(name, number)
    cluster.start(clusterNetwork=timed.cluster_network(), **setting)
    pod = cluster.pod("par-3", annotations={NETWORKS_KEY: "sec-a,sec-b,sec-c"})

    add, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0

    order = ["eth0", "net1", "net2", "net3"]
    calls, dels = timed.calls("ADD"), timed.calls("DEL")
    assert all(calls[b]["start"] >= calls[a]["end"] for a, b in zip(order, order[1:]))
    assert all(dels[a]["start"] >= dels[b]["end"] for a, b in zip(order, order[1:]))


def test_result_status_and_events_are_those_of_the_sequential_run(cluster, timed):
    for number, name in enumerate(["sec-a", "sec-b", "sec-c"], start=2):
        timed.nad(name, number)
    cluster_network = timed.cluster_network()
    pod = cluster.pod("par-4", annotations={NETWORKS_KEY: "sec-a,sec-b,sec-c"})
    _, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    seen = {}
    for parallel in (True, False):
        cluster.start(clusterNetwork=cluster_network, parallelDelegates=parallel)
        events_before = len(cluster.events("AddedInterface"))
        add = cluster.shim("ADD", pod, ns_path, cid)
        assert add.code == 0, add.output
        status = cluster.kube.pod("default", "par-4")["metadata"]["annotations"][STATUS_KEY]
        wait_for(lambda: len(cluster.events("AddedInterface")) == events_before + 4,
                 events_bound(4),
                 what="4 AddedInterface events")
        events = [e["message"] for e in cluster.events("AddedInterface")[events_before:]]
        seen[parallel] = (json.dumps(add.output), status, sorted(events))
        assert cluster.shim("DEL", pod, ns_path, cid).code == 0
        cluster.daemon.terminate()
    assert seen[True] == seen[False]
    assert [s["interface"] for s in json.loads(seen[True][1])] == ["eth0", "net1", "net2", "net3"]


def test_one_failing_secondary_rolls_back_all_others(cluster, tmp_path):
    record = str(tmp_path / "fail.jsonl")
    cluster.nad("real-a", "10.91.0.0/24")
    cluster.kube.add_nad("default", "broken", json.dumps({
        "cniVersion": "0.4.0", "name": "broken", "type": "stub-timed", "recordFile": record,
        "failOn": "ADD", "error": {"cniVersion": "0.4.0", "code": 7, "msg": "broken by test"}}))
    cluster.nad("real-c", "10.93.0.0/24")
    cluster.start(parallelDelegates=True)
    pod = cluster.pod("par-5", annotations={NETWORKS_KEY: "real-a,broken,real-c"})
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex

    add = cluster.shim("ADD", pod, ns_path, cid)

    assert add.code != 0
    assert "broken by test" in add.output["msg"] and "default/broken" in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    results = os.path.join(cluster.daemon.cni_dir, "results")
    assert not os.path.isdir(results) or not os.listdir(results)


def test_16_pods_with_3_networks_at_once_leave_nothing(cluster):
    cluster.nad("load-a", "10.94.0.0/24")
    cluster.nad("load-b", "10.95.0.0/24")
    cluster.start(parallelDelegates=True)
    pods = [cluster.pod(f"load-{i}", annotations={NETWORKS_KEY: "load-a,load-b"})
            for i in range(16)]
    namespaces = [cluster.sandbox.netns() for _ in pods]
    cids = [uuid.uuid4().hex for _ in pods]
    outcomes: dict = {}

    def run(command: str, index: int) -> None:
        outcomes[(command, index)] = cluster.shim(command, pods[index], namespaces[index][1],
                                                  cids[index])

    for command in ("ADD", "DEL"):
        threads = [threading.Thread(target=run, args=(command, i)) for i in range(len(pods))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [(i, outcomes[(command, i)].output) for i in range(len(pods))
                  if outcomes[(command, i)].code != 0]
        assert failed == [], failed
        if command == "ADD":
            addresses = [netns_addresses(name) for name, _ in namespaces]
            assert all(sorted(a) == ["eth0", "lo", "net1", "net2"] for a in addresses)
            ips = [ip for a in addresses for k, v in a.items() if k != "lo" for ip in v]
            assert len(ips) == len(set(ips)) == 48
    assert all(set(netns_addresses(name)) == {"lo"} for name, _ in namespaces)
    assert cluster.sandbox.leases_held() == []
    assert not os.listdir(os.path.join(cluster.daemon.cni_dir, "results"))
    assert not [c for c in cids if os.path.exists(os.path.join(cluster.daemon.cni_dir, c))]
