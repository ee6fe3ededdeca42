"""systemNamespaces by namespace (F49): no network-status in kube-system; a pod so named has it."""

from __future__ import annotations

import uuid

import pytest

from harness import STATUS_KEY, Cluster, events_bound
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def add_del(cluster: Cluster, pod: dict) -> None:
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    assert add.output["ips"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def annotations(cluster: Cluster, namespace: str, name: str) -> dict:
    return cluster.kube.pod(namespace, name)["metadata"]["annotations"]


def test_system_namespace_pod_gets_no_network_status(cluster):
    cluster.start()
    add_del(cluster, cluster.pod("coredns-1", namespace="kube-system"))
    assert STATUS_KEY not in annotations(cluster, "kube-system", "coredns-1")
    # the attachment itself was reported as usual
    wait_for(lambda: cluster.events("AddedInterface"), events_bound(),
             what="the AddedInterface event")


def test_pod_named_like_a_system_namespace_gets_network_status(cluster):
    cluster.start()
    add_del(cluster, cluster.pod("kube-system", namespace="test"))
    assert [s["name"] for s in cluster.status("test", "kube-system")] == ["cluster-net"]


def test_system_namespaces_key_is_honoured(cluster):
    cluster.start(systemNamespaces=["infra"])
    add_del(cluster, cluster.pod("agent", namespace="infra"))
    add_del(cluster, cluster.pod("dns", namespace="kube-system"))
    assert STATUS_KEY not in annotations(cluster, "infra", "agent")
    assert [s["name"] for s in cluster.status("kube-system", "dns")] == ["cluster-net"]
