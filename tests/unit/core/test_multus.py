"""multusd.core.multus: the class Multus, each request to its command; CHECK, STATUS and GC
on stub delegates (a real namespace where CHECK opens one; the stand-in API server where
STATUS needs a pod watch)."""

from __future__ import annotations

import json
import os
import time

import pytest

from multusd.core import request
from multusd.core.multus import Multus
from multusd.errors import MultusError, NotReady, TryAgainLater

from harness import watch_bound
from stubnode import LOG, StubNode
from testlib import wait_for


@pytest.fixture
def node(tmp_path):
    return StubNode(tmp_path)


def stub_calls(node: StubNode) -> list:
    with open(node.calls_file) as handle:
        return [json.loads(line) for line in handle]


def test_the_engine_searches_the_requests_bin_dir_then_the_daemons_cni_path(node, tmp_path):
    node.configure([node.stub("cluster")])
    daemon_path = [p for p in os.environ.get("CNI_PATH", "").split(":") if p]
    engine = node.multus.engine({"binDir": str(tmp_path)})
    assert engine.bin_dirs[0] == str(tmp_path)
    assert list(engine.bin_dirs[1:]) == [p for p in daemon_path if p != str(tmp_path)]
    assert engine.observer is node.multus.plugin_observer
    assert node.multus.engine({}).bin_dirs[:2] == ("/opt/cni/bin", "/usr/lib/cni")


def test_without_kubernetes_the_daemon_is_ready_at_once(node):
    node.configure([node.stub("cluster")])
    assert node.multus.ready()


@pytest.mark.privileged
def test_check_asks_every_delegate_whose_version_has_check(node, netns):
    node.configure([node.stub("cluster"), node.stub("old", cniVersion="0.3.1"),
                    node.stub("extra")])
    node.run("ADD", "c1", netns)
    node.run("CHECK", "c1", netns)
    assert node.calls()[3:] == [("CHECK", "cluster", "eth0"), ("CHECK", "extra", "net2")]


@pytest.mark.privileged
def test_check_without_records_says_add_was_not_run(node, netns):
    node.configure([node.stub("cluster")])
    with pytest.raises(MultusError, match="CHECK: no attachments recorded for container c1"):
        node.run("CHECK", "c1", netns)


@pytest.mark.privileged
def test_a_failed_check_names_the_pod_and_the_network(node, netns):
    error = {"cniVersion": "1.0.0", "code": 11, "msg": "not ready"}
    node.configure([node.stub("cluster", failOn="CHECK", error=error)])
    node.run("ADD", "c1", netns)
    with pytest.raises(MultusError) as err:
        node.run("CHECK", "c1", netns)
    assert err.value.msg == ('CHECK: [ns/web/u1:cluster]: error adding container to network '
                             '"cluster": not ready')


def test_status_asks_the_cluster_networks_plugins_only(node):
    node.configure([node.stub("cluster", cniVersion="1.1.0"),
                    node.stub("extra", cniVersion="1.1.0")])
    node.run("STATUS", cniVersion="1.1.0")
    assert node.calls() == [("STATUS", "cluster", "")]


def test_status_without_the_readiness_indicator_file_is_not_ready_at_once(node, tmp_path):
    node.configure([node.stub("cluster", cniVersion="1.1.0")],
                   multusConfigFile=str(tmp_path / "00-multus.conf"))
    ready = tmp_path / "ready"
    req = node.request("STATUS", cniVersion="1.1.0", readinessindicatorfile=str(ready))
    with pytest.raises(NotReady) as err:
        node.multus.cni(req, time.monotonic() + 3600, LOG)  # before: a wait of 45 s, code 11
    assert err.value.code == 50
    assert err.value.msg == (f"multusd cannot serve ADD yet: the readiness indicator file {ready} "
                             "(readinessindicatorfile) does not exist; the cluster network "
                             "writes it once it is ready on this node")
    assert not ready.exists()  # answered while it was still missing, not once it appeared
    assert node.calls() == []  # the cluster network was not asked
    ready.write_text("")
    node.multus.cni(req, time.monotonic() + 30, LOG)
    assert node.calls() == [("STATUS", "cluster", "")]


def test_status_while_the_pod_watch_has_not_synced_names_it_and_why(node, kube_api):
    from multusd.kube.client import KubeClient

    node.configure([node.stub("cluster", cniVersion="1.1.0")])
    kube_api.watch_cache_ready = False  # every list of this node's pods: 429, Retry-After
    client = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    client.start()
    try:
        multus = Multus(node.config, client)
        wait_for(lambda: client.last_error, watch_bound(), what="the first list to be refused")
        with pytest.raises(NotReady) as err:
            multus.cni(node.request("STATUS", cniVersion="1.1.0"), time.monotonic() + 3600, LOG)
        assert err.value.code == 50
        assert err.value.msg.startswith("multusd cannot serve ADD yet: its pod watch on "
                                        f"{client.server_url} has not synced (pods: ")
        assert "answered 429" in err.value.msg  # why: the server's answer to its list
        assert node.calls() == []
        kube_api.watch_cache_ready = True
        assert client.wait_synced(60), client.last_error
        multus.cni(node.request("STATUS", cniVersion="1.1.0"), time.monotonic() + 30, LOG)
        assert node.calls() == [("STATUS", "cluster", "")]
    finally:
        client.stop()


def test_status_of_a_failing_cluster_network_is_not_ready_carrying_its_error(node):
    error = {"cniVersion": "1.1.0", "code": 42, "msg": "datastore unreachable",
             "details": "dial tcp: refused"}
    node.configure([node.stub("cluster", cniVersion="1.1.0", failOn="STATUS", error=error)])
    with pytest.raises(NotReady) as err:
        node.run("STATUS", cniVersion="1.1.0")
    assert (err.value.code, err.value.details) == (50, "dial tcp: refused")
    assert err.value.msg == ("multusd cannot serve ADD: its cluster network 'cluster' is not "
                             "ready: its STATUS failed with code 42: datastore unreachable")


@pytest.mark.parametrize("code", [50, 51])
def test_status_passes_the_cluster_networks_own_not_available_unchanged(node, code):
    error = {"cniVersion": "1.1.0", "code": code, "msg": "no route to the overlay"}
    node.configure([node.stub("cluster", cniVersion="1.1.0", failOn="STATUS", error=error)])
    with pytest.raises(MultusError) as err:
        node.run("STATUS", cniVersion="1.1.0")
    assert err.value.to_cni_error("1.1.0") == dict(error, details="")


def test_status_of_a_cluster_network_that_cannot_be_loaded_is_not_ready(node, tmp_path):
    node.configure([node.stub("cluster", cniVersion="1.1.0")])
    req = node.request("STATUS", cniVersion="1.1.0", delegates=[],
                       clusterNetwork=str(tmp_path / "missing.conf"))
    with pytest.raises(NotReady) as err:
        node.multus.cni(req, time.monotonic() + 30, LOG)
    assert err.value.msg.startswith("multusd cannot serve ADD: its cluster network cannot be "
                                    "loaded: ")
    assert "missing.conf" in err.value.msg


def test_gc_waits_for_the_readiness_indicator_file_no_longer_than_its_deadline(node, tmp_path):
    node.configure([node.stub("cluster", cniVersion="1.1.0")],
                   multusConfigFile=str(tmp_path / "00-multus.conf"))
    req = node.request("GC", cniVersion="1.1.0", readinessindicatorfile=str(tmp_path / "ready"))
    with pytest.raises(TryAgainLater, match="still waiting for readinessindicatorfile"):
        node.multus.cni(req, time.monotonic() + 0.3, LOG)  # not the 45 s of upstream's wait
    assert node.calls() == []


@pytest.mark.parametrize("command", ["ADD", "GC"])
def test_a_readiness_indicator_key_in_another_case_is_waited_for_as_upstream_does(
        node, netns, tmp_path, command):
    """"ReadinessIndicatorFile" is upstream's readinessindicatorfile (its NetConf struct reads
    it so, and so did multusd's STATUS): ADD and GC went on without waiting for it."""
    node.configure([node.stub("cluster", cniVersion="1.1.0")],
                   multusConfigFile=str(tmp_path / "00-multus.conf"))
    req = node.request(command, "c1", netns if command == "ADD" else "", cniVersion="1.1.0",
                       ReadinessIndicatorFile=str(tmp_path / "ready"))
    with pytest.raises(TryAgainLater, match="still waiting for readinessindicatorfile"):
        node.multus.cni(req, time.monotonic() + 0.3, LOG)
    assert node.calls() == []


def test_gc_hands_the_cluster_network_every_attachment_the_result_cache_holds(node, tmp_path):
    node.configure([node.stub("cluster", cniVersion="1.1.0")])
    with pytest.raises(MultusError, match="results does not exist"):
        node.run("GC", cniVersion="1.1.0")
    results = os.path.join(node.cni_dir, "results")
    os.makedirs(results)
    with open(os.path.join(results, "other-c9-eth0"), "w") as handle:
        json.dump({"kind": "cniCacheV1", "containerId": "c9", "ifName": "eth0",
                   "networkName": "other", "config": ""}, handle)
    node.run("GC", cniVersion="1.1.0")
    (call,) = stub_calls(node)
    assert call["command"] == "GC"
    assert call["stdin"]["cni.dev/valid-attachments"] == [{"containerID": "c9",
                                                           "ifname": "eth0"}]


@pytest.mark.parametrize("enabled", [False, True])
def test_a_delegate_request_while_dynamic_networks_are_on_is_warned_about_once_per_pod(
        tmp_path, caplog, enabled):
    node = StubNode(tmp_path).configure([], enableDynamicNetworks=enabled)
    conf = node.stub("dyn")
    for pod in ("web", "web", "api"):
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": "",
               "CNI_IFNAME": "net5", "CNI_ARGS": f"K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod}"}
        req = request.parse(env, json.dumps(conf).encode(), node.config)
        node.multus.hotplug(req, {}, time.monotonic() + 30, LOG)
    warned = [r.getMessage() for r in caplog.records if "multus-dynamic-networks-controller"
              in r.getMessage()]
    assert len(warned) == (2 if enabled else 0)
    if enabled:
        assert "pod ns/web" in warned[0] and "pod ns/api" in warned[1]
        assert '"enableDynamicNetworks": false' in warned[0]
