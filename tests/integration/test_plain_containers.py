"""Containers that are not pods, as podman's CNI backend asks for them, through the real shim.

No K8S_POD_NAMESPACE (podman sends ``IgnoreUnknown=1;K8S_POD_NAME=<container name>``): the
daemon's own networks are attached (clusterNetwork + defaultNetworks, or delegates) with the
runtime's runtimeConfig; VERSION with podman's empty and dummy values; DEL with prevResult;
DEL after a failed ADD; the same with a kubeconfig (served, and said in the log).
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from harness import Cluster, call_shim, netns_addresses
from multusd.cni import resultcache
from multusd.wire import api

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

PORTS = [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}]


def podman(command: str, conf: dict, name: str, cid: str = "", netns: str = "", **kw):
    """The shim called with what podman 4.3 puts in the env (no namespace, no UID)."""
    return call_shim(command, conf, container_id=cid, netns=netns, ifname="eth0",
                     cni_args=f"IgnoreUnknown=1;K8S_POD_NAME={name}", **kw)


def recorded(path: str) -> list:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def result_cache_names(daemon) -> list:
    return sorted(os.listdir(os.path.join(daemon.cni_dir, "results")))


def test_a_container_gets_the_cluster_and_default_networks_with_its_runtime_config(
        sandbox, tmp_path):
    conf_dir = str(tmp_path / "confdir")
    os.makedirs(conf_dir)
    record = str(tmp_path / "calls.jsonl")
    cluster = {"cniVersion": "0.4.0", "name": "host-net", "plugins": [
        sandbox.net("ignored", "10.150.0.0/24", cni_version="0.4.0"),
        {"type": "stub-record", "recordFile": record, "capabilities": {"portMappings": True}}]}
    del cluster["plugins"][0]["name"], cluster["plugins"][0]["cniVersion"]
    cluster_path = os.path.join(conf_dir, "10-host.conflist")
    with open(cluster_path, "w") as handle:
        json.dump(cluster, handle)
    with open(os.path.join(conf_dir, "20-extra.conf"), "w") as handle:
        json.dump(sandbox.net("extra", "10.151.0.0/24", cni_version="0.4.0", gateway=False),
                  handle)
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "clusterNetwork": cluster_path,
                             "defaultNetworks": ["extra"], "confDir": conf_dir})
    # What libcni hands the shim: the conflist's plugin plus the capability's runtimeConfig.
    conf = daemon.shim_conf("0.4.0", name="multusnet", capabilities={"portMappings": True},
                            runtimeConfig={"portMappings": PORTS})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    name = "web_1.test-2"  # podman's container names allow '_' and '.'

    version = call_shim("VERSION", conf, container_id="", netns="dummy", ifname="dummy",
                        cni_args="", env_extra={"CNI_PATH": "dummy"})
    assert version.code == 0 and "0.4.0" in version.output["supportedVersions"], version
    add = podman("ADD", conf, name, cid, ns_path)

    assert add.code == 0, add.output
    assert add.output["cniVersion"] == "0.4.0"
    assert [ip["address"] for ip in add.output["ips"]] == ["10.150.0.2/24"]
    links = {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"}
    assert links == {"eth0": ["10.150.0.2/24"], "net1": ["10.151.0.2/24"]}
    stub_add = recorded(record)[-1]
    assert stub_add["command"] == "ADD"
    assert stub_add["stdin"]["runtimeConfig"] == {"portMappings": PORTS}
    assert stub_add["env"]["CNI_ARGS"] == (f"IgnoreUnknown=true;K8S_POD_NAMESPACE=;"
                                           f"K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=;"
                                           "K8S_POD_UID=")
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert result_cache_names(daemon) == [f"extra-{cid}-net1", f"host-net-{cid}-eth0"]
    assert "not a Kubernetes pod" in daemon.log()

    # libcni puts its cached result into the DEL config as prevResult.
    delete = podman("DEL", dict(conf, prevResult=add.output), name, cid, ns_path)

    assert delete.code == 0, delete.output
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert result_cache_names(daemon) == []
    stub_del = recorded(record)[-1]
    assert stub_del["command"] == "DEL"
    assert stub_del["stdin"]["runtimeConfig"] == {"portMappings": PORTS}


def test_delegates_mode_and_a_repeated_del(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "delegates": [
        sandbox.net("first", "10.152.0.0/24", cni_version="0.4.0"),
        sandbox.net("second", "10.153.0.0/24", cni_version="0.4.0", gateway=False)]})
    conf = daemon.shim_conf("0.4.0", name="multusnet")
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex

    add = podman("ADD", conf, "db", cid, ns_path)

    assert add.code == 0, add.output
    links = {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"}
    assert links == {"eth0": ["10.152.0.2/24"], "net1": ["10.153.0.2/24"]}
    for _ in range(2):  # podman rm and conmon's cleanup may both get here
        delete = podman("DEL", dict(conf, prevResult=add.output), "db", cid, ns_path)
        assert delete.code == 0, delete.output
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []


def test_del_after_a_failed_add_succeeds_and_nothing_is_left(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "delegates": [
        sandbox.net("good", "10.154.0.0/24", cni_version="0.4.0"),
        {"cniVersion": "0.4.0", "name": "broken", "type": "stub-add-error"}]})  # its DEL works
    conf = daemon.shim_conf("0.4.0", name="multusnet")
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex

    add = podman("ADD", conf, "app", cid, ns_path)

    assert add.code == 1
    assert add.output["code"] == 42
    assert add.output["msg"].startswith("[container app:broken]: error adding container to "
                                        "network \"broken\": stub error"), add.output
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []
    # podman tears the network down after a failed set-up: no cached result, no prevResult.
    delete = podman("DEL", conf, "app", cid, ns_path)
    assert delete.code == 0, delete.output
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert resultcache.list_entries(daemon.cni_dir) == []


def test_with_a_kubeconfig_a_container_is_served_without_a_pod_lookup(sandbox, kube_api,
                                                                      tmp_path):
    cluster = Cluster(sandbox, kube_api, tmp_path).start()
    conf = cluster.daemon.shim_conf("0.4.0", name="multusnet")
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    pod_gets = kube_api.count("GET", "/api/v1/namespaces/")

    add = podman("ADD", conf, "cache", cid, ns_path)

    assert add.code == 0, add.output
    assert {k: v for k, v in netns_addresses(ns_name).items() if k != "lo"} == {
        "eth0": ["10.80.0.2/24"]}
    assert kube_api.count("GET", "/api/v1/namespaces/") == pod_gets
    assert "[warning]" in next(line for line in cluster.daemon.log().splitlines()
                             if "not a Kubernetes pod" in line)
    assert "no network-status is written" in cluster.daemon.log()
    assert podman("DEL", dict(conf, prevResult=add.output), "cache", cid, ns_path).code == 0
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []
    assert kube_api.events == []


def test_without_kubernetes_default_networks_skip_only_system_namespaces(sandbox, tmp_path):
    conf_dir = str(tmp_path / "confdir")
    os.makedirs(conf_dir)
    for name, subnet in (("main", "10.161.0.0/24"), ("extra", "10.162.0.0/24")):
        with open(os.path.join(conf_dir, f"10-{name}.conf"), "w") as handle:
            json.dump(sandbox.net(name, subnet, cni_version="0.4.0", gateway=name == "main"),
                      handle)
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "clusterNetwork": "main",
                             "defaultNetworks": ["extra"], "confDir": conf_dir})
    conf = daemon.shim_conf("0.4.0")
    got = {}
    for namespace in ("test", "kube-system"):
        ns_name, ns_path = sandbox.netns()
        cid = uuid.uuid4().hex
        add = call_shim("ADD", conf, container_id=cid, netns=ns_path, pod=(namespace, "p"))
        assert add.code == 0, add.output
        got[namespace] = sorted(k for k in netns_addresses(ns_name) if k != "lo")
        assert call_shim("DEL", conf, container_id=cid, netns=ns_path,
                         pod=(namespace, "p")).code == 0
    assert got == {"test": ["eth0", "net1"], "kube-system": ["eth0"]}
    assert sandbox.leases_held() == []


def test_with_a_kubeconfig_hot_plug_still_needs_a_pod(sandbox, kube_api, tmp_path):
    cluster = Cluster(sandbox, kube_api, tmp_path).start()
    _, ns_path = sandbox.netns()
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": uuid.uuid4().hex, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net9", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=cache"}
    body = api.encode_request(env, json.dumps(sandbox.net("hp", "10.163.0.0/24",
                                                          cni_version="0.4.0")).encode())
    response = api.http_request(cluster.daemon.socket_path, "POST", "/delegate", body,
                                timeout=30)
    assert response.status == 400
    assert "needs the pod's K8S_POD_NAMESPACE" in json.loads(response.body)["msg"]
    assert sandbox.leases_held() == []
