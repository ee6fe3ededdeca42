"""enableDynamicNetworks for real: a running pod's network-selection annotation changes, and its
interfaces follow (the real daemon under systemd-socket-activate, the real shim, bridge and
host-local in real namespaces, the stand-in API server where the annotation is patched).

Added, removed, refused without an interface name, a failed ADD rolled back, the daemon killed
in the middle of an ADD and restarted, the sandbox's DEL after hot-plugs, a terminating pod,
and the key off: nothing follows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from harness import (STATUS_KEY, Cluster, events_bound, netns_addresses, reconcile_bound,
                     watch_bound)
from multusd.wire import api
from testlib import free_port, metric_value, wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def running_pod(cluster: Cluster, name: str, networks: str = ""):
    """A pod attached through the shim, then Running (as the kubelet reports it)."""
    pod = cluster.pod(name, annotations={NETWORKS_KEY: networks} if networks else {})
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    cluster.kube.update_pod("default", name, phase="Running")
    return pod, ns_name, ns_path, cid


def select(cluster: Cluster, name: str, networks) -> None:
    """Patch the pod's network selections, as `kubectl annotate` would."""
    value = networks if isinstance(networks, str) or networks is None else json.dumps(networks)
    cluster.kube.update_pod("default", name, annotations={NETWORKS_KEY: value})


def links(ns_name: str) -> dict:
    return {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"}


def status_of(cluster: Cluster, name: str) -> list:
    return [(s["name"], s.get("interface"), s.get("ips")) for s in cluster.status("default", name)]


def daemon_status(cluster: Cluster) -> dict:
    return json.loads(api.http_request(cluster.daemon.socket_path, "GET", "/status",
                                       timeout=5).body)


def settled(cluster: Cluster) -> dict:
    """The daemon's dynamicNetworks status once every pod change it got was dealt with."""
    return wait_for(lambda: (lambda d: d if d["pending"] == 0 else None)(
        daemon_status(cluster)["dynamicNetworks"]), reconcile_bound(),
        what="every pod change dealt with")


def show(cluster: Cluster, query: str) -> subprocess.CompletedProcess:
    """`multusd show` of the daemon's node, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "multusd", "show", query, "--config",
                           cluster.daemon.config_path], capture_output=True, text=True,
                          timeout=60)


def records_of(cluster: Cluster, cid: str) -> list:
    cni_dir = cluster.daemon.cni_dir
    found = [name for name in os.listdir(cni_dir) if name == cid]
    results = os.path.join(cni_dir, "results")
    if os.path.isdir(results):
        found += [name for name in os.listdir(results) if cid in name]
    return found


def test_a_selection_added_to_a_running_pod_appears_in_it_and_in_network_status(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.nad("net-b", "10.82.0.0/24")
    port = free_port()
    cluster.start(enableDynamicNetworks=True, metricsPort=port)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-0", "net-a")
    assert links(ns_name) == {"eth0": ["10.80.0.2/24"], "net1": ["10.81.0.2/24"]}

    # the element the sandbox's ADD named net1 stays, written without an interface as before
    select(cluster, "web-0", [{"name": "net-a"}, {"name": "net-b", "interface": "fast0"}])

    wait_for(lambda: links(ns_name).get("fast0"), reconcile_bound(), what="fast0 with its address")
    assert links(ns_name) == {"eth0": ["10.80.0.2/24"], "net1": ["10.81.0.2/24"],
                              "fast0": ["10.82.0.2/24"]}
    wait_for(lambda: len(cluster.status("default", "web-0")) == 3, reconcile_bound(),
             what="network-status")
    assert status_of(cluster, "web-0") == [("cluster-net", "eth0", ["10.80.0.2"]),
                                           ("default/net-a", "net1", ["10.81.0.2"]),
                                           ("default/net-b", "fast0", ["10.82.0.2"])]
    wait_for(lambda: any(e["message"] == "Add fast0 [10.82.0.2/24] from default/net-b"
                         for e in cluster.events("AddedInterface")),
             events_bound(3), what="the event")  # behind the ADD's two
    assert settled(cluster)["reconciliations"]["changed"] == 1
    shown = show(cluster, "default/web-0")
    assert shown.returncode == 0, shown.stdout + shown.stderr  # network-status agrees
    assert "fast0: network default/net-b, NAD default/net-b, ADDED while the pod ran, at " \
        in shown.stdout
    assert "net1: network default/net-a, NAD default/net-a\n" in shown.stdout
    metrics = api_metrics(port)
    assert metric_value(metrics, "multusd_dynamic_reconciliations_total", outcome="changed") == 1

    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert links(ns_name) == {}
    assert cluster.sandbox.leases_held() == []
    assert records_of(cluster, cid) == []


def api_metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def test_a_removed_selection_leaves_the_pod_and_releases_its_lease(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.nad("net-b", "10.82.0.0/24")
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-1", "net-a,net-b@data0")
    assert set(links(ns_name)) == {"eth0", "net1", "data0"}
    assert len(cluster.sandbox.leases_held()) == 3

    select(cluster, "web-1", "net-b@data0")  # net-a (net1) goes

    wait_for(lambda: len(cluster.status("default", "web-1")) == 2, reconcile_bound(),
             what="network-status")
    assert status_of(cluster, "web-1") == [("cluster-net", "eth0", ["10.80.0.2"]),
                                           ("default/net-b", "data0", ["10.82.0.2"])]
    assert links(ns_name) == {"eth0": ["10.80.0.2/24"], "data0": ["10.82.0.2/24"]}
    assert len(cluster.sandbox.leases_held()) == 2
    wait_for(lambda: [e["message"] for e in cluster.events("RemovedInterface")] ==
             ["Remove net1 from default/net-a"], events_bound(4),  # behind the ADD's three
             what="the RemovedInterface event")
    shown = show(cluster, "default/web-1")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "net1: network default/net-a, REMOVED while the pod ran, at " in shown.stdout

    select(cluster, "web-1", None)  # no selection at all: data0 goes too, eth0 stays
    wait_for(lambda: len(cluster.status("default", "web-1")) == 1, reconcile_bound(),
             what="network-status")
    assert set(links(ns_name)) == {"eth0"}
    assert len(cluster.sandbox.leases_held()) == 1
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
    assert records_of(cluster, cid) == []


def test_a_selection_without_an_interface_name_is_refused_with_an_event(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.nad("net-b", "10.82.0.0/24")
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-2", "net-a")
    before = cluster.kube.pod("default", "web-2")["metadata"]["annotations"][STATUS_KEY]

    select(cluster, "web-2", "net-a,net-b")

    wait_for(lambda: cluster.events("FailedAddingInterface"),
             reconcile_bound() + events_bound(3), what="the Warning event")
    (event,) = cluster.events("FailedAddingInterface")
    assert event["type"] == "Warning"
    assert "network default/net-b names no interface" in event["message"]
    assert '"interface"' in event["message"]
    assert set(links(ns_name)) == {"eth0", "net1"}
    assert len(cluster.sandbox.leases_held()) == 2
    assert cluster.kube.pod("default", "web-2")["metadata"]["annotations"][STATUS_KEY] == before
    assert settled(cluster)["reconciliations"]["refused"] == 1
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


def test_a_failed_add_is_rolled_back_and_reported_with_the_plugins_error(cluster):
    bad = cluster.sandbox.net("hotbad", "10.87.0.0/24", cni_version="0.4.0", gateway=False)
    conflist = {"cniVersion": "0.4.0",
                "plugins": [{k: v for k, v in bad.items() if k not in ("cniVersion", "name")},
                            {"type": "stub-add-error"}]}
    cluster.kube.add_nad("default", "hotbad", json.dumps(conflist))
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-3")

    select(cluster, "web-3", "hotbad@bad0")

    wait_for(lambda: cluster.events("FailedAddingInterface"),
             reconcile_bound() + events_bound(2), what="the Warning event")
    message = cluster.events("FailedAddingInterface")[0]["message"]
    assert message.startswith("bad0 (default/hotbad): its ADD failed and was rolled back:")
    assert set(links(ns_name)) == {"eth0"}
    assert len(cluster.sandbox.leases_held()) == 1  # eth0's: the failed ADD's was released
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
    assert records_of(cluster, cid) == []


def test_the_daemon_killed_in_the_middle_of_an_add_converges_after_its_restart(cluster, tmp_path):
    gated = cluster.sandbox.net("gated", "10.88.0.0/24", cni_version="0.4.0", gateway=False)
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    conflist = {"cniVersion": "0.4.0",
                "plugins": [{k: v for k, v in gated.items() if k not in ("cniVersion", "name")},
                            {"type": "stub-gate", "startedFile": started, "gateFile": gate}]}
    cluster.kube.add_nad("default", "gated", json.dumps(conflist))
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-4")

    select(cluster, "web-4", "gated@slow0")
    wait_for(lambda: os.path.exists(started), reconcile_bound(),
             what="the ADD held in its second plugin")
    assert "slow0" in links(ns_name)  # the bridge made it and took a lease
    os.killpg(cluster.daemon.proc.pid, signal.SIGKILL)
    cluster.daemon.proc.wait()
    open(gate, "w").close()  # the orphaned plugin ends
    os.unlink(started)

    cluster.daemon.start()
    wait_for(lambda: len(cluster.status("default", "web-4")) == 2, reconcile_bound(),
             what="network-status after the restart")
    assert status_of(cluster, "web-4")[1][:2] == ("default/gated", "slow0")
    assert set(links(ns_name)) == {"eth0", "slow0"}
    assert len(cluster.sandbox.leases_held()) == 2  # the interrupted ADD's lease was released
    assert "an unfinished ADD of slow0 (default/gated) undone" in cluster.daemon.log()
    assert len(cluster.events("AddedInterface")) == 1 + 1  # eth0's, slow0's once

    # a second restart finds everything done: nothing is run or written again
    cluster.daemon.terminate()
    puts = cluster.kube.count("PUT")
    cluster.daemon.start()
    wait_for(lambda: daemon_status(cluster).get("dynamicNetworks", {}).get("podsChecked"),
             reconcile_bound(), what="the pod looked at after the second restart")
    assert settled(cluster)["reconciliations"] == {
        outcome: 0 for outcome in ("changed", "unchanged", "refused", "failed", "gone",
                                   "stopped")}
    assert cluster.kube.count("PUT") == puts
    assert len(cluster.events("AddedInterface")) == 2
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
    assert records_of(cluster, cid) == []


def test_a_terminating_pod_and_the_key_off_change_nothing(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.start()  # enableDynamicNetworks unset: off
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-5")
    cluster.pod("marker")
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 2, watch_bound(),
             what="the marker")
    select(cluster, "web-5", "net-a@net9")
    cluster.kube.delete_pod("default", "marker")  # delivered after the annotation's change
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 1, watch_bound(),
             what="the watch past the change")
    assert set(links(ns_name)) == {"eth0"}
    assert "dynamicNetworks" not in daemon_status(cluster)
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0

    cluster.daemon.terminate()
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-6")
    cluster.pod("marker")
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 3, watch_bound(),
             what="the marker")
    cluster.kube.update_pod("default", "web-6", annotations={NETWORKS_KEY: "net-a@net9"},
                            terminating=True)
    cluster.kube.delete_pod("default", "marker")
    wait_for(lambda: daemon_status(cluster)["kube"]["cachedPods"] == 2, watch_bound(),
             what="the watch past the change")
    assert sum(settled(cluster)["reconciliations"].values()) == 0
    assert set(links(ns_name)) == {"eth0"}
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


def test_a_delegate_request_from_elsewhere_is_served_and_warned_about(cluster):
    cluster.start(enableDynamicNetworks=True)
    pod, ns_name, ns_path, cid = running_pod(cluster, "web-7")
    hot = cluster.sandbox.net("hot", "10.86.0.0/24", cni_version="0.4.0", gateway=False)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net5", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-7;"
           f"K8S_POD_UID={pod['metadata']['uid']}"}
    body = api.encode_request(env, json.dumps(hot).encode(), {})
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)
    assert response.status == 200, response.body
    assert "net5" in links(ns_name)
    assert "multus-dynamic-networks-controller" in cluster.daemon.log()
    env["CNI_COMMAND"] = "DEL"
    body = api.encode_request(env, json.dumps(hot).encode(), {})
    assert api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body,
                            timeout=60).status == 200
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
