"""Multus with Kubernetes: the real shim and daemon, real plugins, the fake API server.

A pod asks for networks in its annotations and gets them: NADs, the cluster network from
each of its sources, defaultNetworks, namespace isolation, pod identity, network-status,
events, DEL without the pod or the cache, CHECK, and hot-plug through /delegate.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest

from harness import Cluster, call_shim, events_bound, netns_addresses, shim_bound, watch_bound
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def attach(cluster: Cluster, pod: dict, **kw):
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid, **kw)
    return add, ns_name, ns_path, cid


def test_pod_with_two_nads_gets_eth0_net1_net2_and_network_status(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.nad("net-b", "10.82.0.0/24")
    cluster.start()
    pod = cluster.pod("web-0", annotations={NETWORKS_KEY: "net-a,net-b"})

    add, ns_name, ns_path, cid = attach(cluster, pod)

    assert add.code == 0, add.output
    assert [ip["address"] for ip in add.output["ips"]] == ["10.80.0.2/24"]
    links = {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"}
    assert links == {"eth0": ["10.80.0.2/24"], "net1": ["10.81.0.2/24"],
                     "net2": ["10.82.0.2/24"]}
    status = cluster.status("default", "web-0")
    assert [(s["name"], s["interface"], s["ips"], s.get("default", False)) for s in status] == [
        ("cluster-net", "eth0", ["10.80.0.2"], True),
        ("default/net-a", "net1", ["10.81.0.2"], False),
        ("default/net-b", "net2", ["10.82.0.2"], False)]
    assert all(s["mac"] for s in status)
    wait_for(lambda: len(cluster.events("AddedInterface")) == 3, events_bound(3),
             what="3 events")
    messages = sorted(e["message"] for e in cluster.events("AddedInterface"))
    assert "Add net1 [10.81.0.2/24] from default/net-a" in messages

    assert cluster.shim("CHECK", pod, ns_path, cid).code == 0
    before = len(cluster.kube.requests)
    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert len(cluster.kube.requests) == before  # DEL needs no API call
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []


@pytest.mark.parametrize("annotation,expected", [
    ("net-a@data0", {"data0": "10.81.0.2/24"}),
    ("other/net-c", {"net1": "10.83.0.2/24"}),
    ('[{"name":"net-a","interface":"fast0"},{"name":"net-c","namespace":"other"}]',
     {"fast0": "10.81.0.2/24", "net2": "10.83.0.2/24"}),
])
def test_annotation_forms(cluster, annotation, expected):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.nad("net-c", "10.83.0.0/24", namespace="other")
    cluster.start()
    pod = cluster.pod("web-1", annotations={NETWORKS_KEY: annotation})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    links = netns_addresses(ns_name)
    assert {k: links[k][0] for k in expected} == expected
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


def test_malformed_annotation_names_the_pod_and_the_bad_part(cluster):
    cluster.start()
    pod = cluster.pod("web-2", annotations={NETWORKS_KEY: "net-a@this-name-is-too-long0"})
    add, ns_name, _, _ = attach(cluster, pod)
    assert add.code != 0
    assert "default/web-2" in add.output["msg"]
    assert NETWORKS_KEY in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []


def test_missing_nad_fails_with_an_event_and_leaves_nothing(cluster):
    cluster.start()
    pod = cluster.pod("web-3", annotations={NETWORKS_KEY: "ghost"})
    add, ns_name, _, cid = attach(cluster, pod)
    assert add.code != 0
    assert "cannot find a network-attachment-definition (ghost)" in add.output["msg"]
    wait_for(lambda: cluster.events("NoNetworkFound"), events_bound(),
             what="NoNetworkFound event")
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))


@pytest.mark.parametrize("source", ["nad", "name", "directory", "conflist"])
def test_cluster_network_from_each_source(cluster, tmp_path, source):
    if source == "nad":
        conf = dict(cluster.cluster)
        conf.pop("name")
        cluster.kube.add_nad("kube-system", "primary", json.dumps(conf))
        ref, name = "primary", "kube-system/primary"
    elif source == "name":
        ref, name = "cluster-net", "cluster-net"
    elif source == "directory":
        ref, name = cluster.conf_dir, "cluster-net"
    else:
        conflist = {"cniVersion": "0.4.0", "name": "cluster-list",
                    "plugins": [{k: v for k, v in cluster.cluster.items()
                                 if k not in ("cniVersion", "name")}]}
        ref = str(tmp_path / "cluster.conflist")
        with open(ref, "w") as handle:
            json.dump(conflist, handle)
        name = "cluster-list"
    cluster.start(clusterNetwork=ref)
    pod = cluster.pod("web-4")
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["eth0"] == ["10.80.0.2/24"]
    assert cluster.status("default", "web-4")[0]["name"] == name
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


def test_default_networks_skipped_in_system_namespaces(cluster):
    cluster.nad("extra", "10.84.0.0/24", namespace="kube-system")
    cluster.start(defaultNetworks=["extra"])
    for namespace, expected in (("apps", {"eth0", "net1"}), ("kube-system", {"eth0"})):
        pod = cluster.pod("web-5", namespace=namespace)
        add, ns_name, ns_path, cid = attach(cluster, pod)
        assert add.code == 0, add.output
        assert set(netns_addresses(ns_name)) - {"lo"} == expected
        assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_default_network_annotation_replaces_the_cluster_network(cluster):
    alt = dict(cluster.sandbox.net("alt", "10.85.0.0/24", cni_version="0.4.0"))
    alt.pop("name")
    cluster.kube.add_nad("kube-system", "alt-bridge", json.dumps(alt))
    cluster.start()
    pod = cluster.pod("web-6", annotations={
        "v1.multus-cni.io/default-network": "kube-system/alt-bridge"})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["eth0"] == ["10.85.0.2/24"]
    assert cluster.status("default", "web-6")[0]["name"] == "kube-system/alt-bridge"
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


@pytest.mark.parametrize("global_namespaces,allowed", [("default", False),
                                                       ("default,other", True)])
def test_namespace_isolation(cluster, global_namespaces, allowed):
    cluster.nad("net-c", "10.83.0.0/24", namespace="other")
    cluster.start(namespaceIsolation=True, globalNamespaces=global_namespaces)
    pod = cluster.pod("web-7", namespace="apps", annotations={NETWORKS_KEY: "other/net-c"})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    if allowed:
        assert add.code == 0, add.output
        assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    else:
        assert add.code != 0
        assert "namespace isolation enabled" in add.output["msg"]
        assert set(netns_addresses(ns_name)) == {"lo"}


def test_uid_mismatch_is_refused_but_a_static_pod_is_allowed(cluster):
    cluster.start()
    pod = cluster.pod("web-8")
    add, ns_name, _, _ = attach(cluster, pod, uid="11111111-0000-0000-0000-000000000000")
    assert add.code != 0
    assert 'expected pod UID "11111111-0000-0000-0000-000000000000"' in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}

    static = cluster.pod("etcd-node", namespace="kube-system", static=True)
    add, ns_name, ns_path, cid = attach(cluster, static, uid=str(uuid.uuid4()))
    assert add.code == 0, add.output
    assert cluster.shim("DEL", static, ns_path, cid).code == 0


def test_pod_created_a_moment_after_add_starts(cluster):
    cluster.start()
    ns_name, ns_path = cluster.sandbox.netns()
    uid = str(uuid.uuid4())
    out = {}
    pod_ref = {"metadata": {"namespace": "default", "name": "late-0", "uid": uid}}
    caller = threading.Thread(target=lambda: out.update(add=cluster.shim("ADD", pod_ref, ns_path,
                                                                         "latecid")))
    caller.start()
    wait_for(lambda: cluster.kube.count("GET", "/api/v1/namespaces/default/pods/late-0") or
             len(cluster.daemon.log().split("ADD starting")) > 1, shim_bound("ADD"),
             what="ADD to start")
    cluster.kube.add_pod("default", "late-0", uid=uid)
    caller.join(shim_bound("ADD"))
    assert out["add"].code == 0, out["add"].output
    assert netns_addresses(ns_name)["eth0"] == ["10.80.0.2/24"]
    assert cluster.shim("DEL", pod_ref, ns_path, "latecid").code == 0


def test_pod_missing_from_the_api_gets_upstreams_empty_result(cluster):
    cluster.start()
    ns_name, ns_path = cluster.sandbox.netns()
    ghost = {"metadata": {"namespace": "default", "name": "ghost-0", "uid": str(uuid.uuid4())}}
    add = cluster.shim("ADD", ghost, ns_path, "ghostcid")
    assert add.code == 0, add.output
    assert add.output["ips"][0]["address"] == "0.0.0.0/0"
    assert set(netns_addresses(ns_name)) == {"lo"}


def test_del_after_the_pod_is_deleted_and_without_scratch_cache(cluster):
    cluster.nad("net-a", "10.81.0.0/24")
    cluster.start()
    pod = cluster.pod("web-9", annotations={NETWORKS_KEY: "net-a"})
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    cluster.kube.delete_pod("default", "web-9")
    cluster.kube.delete_nad("default", "net-a")
    os.unlink(os.path.join(cluster.daemon.cni_dir, cid))
    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert cluster.sandbox.leases_held() == []
    assert set(netns_addresses(ns_name)) == {"lo"}


def test_hot_plug_adds_and_removes_net5(cluster):
    cluster.start()
    pod = cluster.pod("web-10")
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    hot = cluster.sandbox.net("hotnet", "10.86.0.0/24", cni_version="0.4.0", gateway=False)
    meta = pod["metadata"]
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net5",
           "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-10;K8S_POD_UID={meta['uid']}"}
    body = api.encode_request(env, json.dumps(hot).encode(), {"cni-args": {"x": "y"}})
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)
    assert response.status == 200, response.body
    result = json.loads(response.body)["Result"]
    assert result["cniVersion"] == "1.1.0"
    assert netns_addresses(ns_name)["net5"] == ["10.86.0.2/24"]

    env["CNI_COMMAND"] = "DEL"
    body = api.encode_request(env, json.dumps(hot).encode(), {})
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)
    assert response.status == 200, response.body
    assert "net5" not in netns_addresses(ns_name)
    assert "eth0" in netns_addresses(ns_name)
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


def test_hot_plug_hands_undeclared_ips_and_mac_on_as_legacy_args(cluster):
    cluster.start()
    pod = cluster.pod("web-12")
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    static = {"cniVersion": "0.4.0", "name": "hotstatic", "type": "bridge",
              "bridge": cluster.sandbox.bridge(), "ipam": {"type": "static"}}  # no capabilities
    meta = pod["metadata"]
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net7",
           "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-12;K8S_POD_UID={meta['uid']}"}
    attributes = {"ips": ["10.1.9.7/24"], "mac": "c2:11:22:33:44:99"}
    body = api.encode_request(env, json.dumps(static).encode(), attributes)
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)

    assert response.status == 200, response.body
    assert netns_addresses(ns_name)["net7"] == ["10.1.9.7/24"]
    assert "network 'default/hotstatic': the pod requests 'ips'" in cluster.daemon.log()
    env["CNI_COMMAND"] = "DEL"
    body = api.encode_request(env, json.dumps(static).encode(), attributes)
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)
    assert response.status == 200, response.body
    assert "net7" not in netns_addresses(ns_name)
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_readyz_waits_for_the_api_caches(cluster):
    cluster.kube.stop()
    full = {"cniVersion": "0.4.0", "kubeconfig": cluster.kube.kubeconfig_path,
            "nodeName": cluster.kube.node, "confDir": cluster.conf_dir,
            "clusterNetwork": cluster.cluster_path}
    daemon = cluster.sandbox.daemon(full)
    assert api.http_request(daemon.socket_path, "GET", "/readyz", timeout=2).status == 500
    assert api.http_request(daemon.socket_path, "GET", "/healthz", timeout=2).status == 200
    status_body = api.encode_request({"CNI_COMMAND": "STATUS"}, json.dumps(
        daemon.shim_conf("1.1.0")).encode())
    response = api.http_request(daemon.socket_path, "POST", "/cni", status_body, timeout=30)
    assert response.status == 400
    assert json.loads(response.body)["code"] == 50  # "not available": the spec's STATUS code
    assert "has not synced" in json.loads(response.body)["msg"]
    shim_status = call_shim("STATUS", daemon.shim_conf("1.1.0"))
    assert (shim_status.code, shim_status.output["code"]) == (1, 50)
    cluster.kube.start()
    wait_for(lambda: api.http_request(daemon.socket_path, "GET", "/readyz",
                                      timeout=2).status == 200, watch_bound(),
             what="readyz after API back")


def test_a_failed_hot_plug_leaves_no_interface_or_lease(cluster):
    cluster.start()
    pod = cluster.pod("web-11")
    add, ns_name, ns_path, cid = attach(cluster, pod)
    assert add.code == 0, add.output
    bridge = cluster.sandbox.net("hotbad", "10.87.0.0/24", cni_version="0.4.0", gateway=False)
    conflist = {"cniVersion": "0.4.0", "name": "hotbad",
                "plugins": [{k: v for k, v in bridge.items() if k not in ("cniVersion", "name")},
                            {"type": "stub-error"}]}
    meta = pod["metadata"]
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net6",
           "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-11;K8S_POD_UID={meta['uid']}"}
    body = api.encode_request(env, json.dumps(conflist).encode(), {})
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body, timeout=60)
    assert response.status == 400
    assert json.loads(response.body)["code"] == 42  # the stub's own error, passed through
    assert "net6" not in netns_addresses(ns_name)
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []
