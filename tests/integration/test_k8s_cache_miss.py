"""A pod cache miss costs one live GET at once; a wrong node name is detected and reported."""

from __future__ import annotations

import logging

import pytest

from harness import watch_bound
from multusd.kube.client import KubeClient

NS = "default"


@pytest.fixture
def make_client(kube_api):
    made = []

    def make(node: str) -> KubeClient:
        client = KubeClient(kube_api.kubeconfig_path, node, node_source="nodeName",
                            request_timeout=5.0)
        client.start()
        assert client.wait_synced(watch_bound(), nads=True), client.last_error
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()


def pod_gets(kube_api, name: str) -> int:
    return kube_api.count("GET", f"/api/v1/namespaces/{NS}/pods/{name}")


def test_a_miss_is_one_live_get_and_a_wrong_node_name_is_named(kube_api, make_client, caplog):
    kube_api.add_pod(NS, "web", node="real-node")
    client = make_client("wrong-node")
    with caplog.at_level(logging.WARNING, logger="multusd.kube.client"):
        pod = client.get_pod(NS, "web")
        assert pod is not None and pod.node_name == "real-node"
        assert pod_gets(kube_api, "web") == 1
        assert client.cache_misses == 1
        assert client.node_mismatch == ("wrong-node", "real-node")
        kube_api.add_pod(NS, "web-2", node="real-node")
        client.get_pod(NS, "web-2")
    warnings = [r.getMessage() for r in caplog.records if "node name mismatch" in r.getMessage()]
    assert len(warnings) == 1  # once, not per ADD
    assert "'real-node'" in warnings[0] and "'wrong-node'" in warnings[0]
    assert "nodeName" in warnings[0] and "MULTUS_NODE_NAME" in warnings[0]


def test_right_node_name_no_miss_no_mismatch(kube_api, make_client):
    kube_api.add_pod(NS, "web")
    client = make_client(kube_api.node)
    assert client.get_pod(NS, "web") is not None
    assert pod_gets(kube_api, "web") == 0
    assert (client.cache_misses, client.node_mismatch) == (0, None)


def test_an_empty_pod_watch_while_adds_arrive_is_reported(kube_api, make_client, caplog):
    client = make_client("some-node")
    for index in range(3):  # pods the API server has without a node name to compare
        kube_api.add_pod(NS, f"w{index}", node="")
    with caplog.at_level(logging.WARNING, logger="multusd.kube.client"):
        for index in range(3):
            assert client.get_pod(NS, f"w{index}") is not None
    assert client.node_mismatch is None
    assert any("holds no pods while ADDs arrive" in r.getMessage() and "'some-node'" in
               r.getMessage() for r in caplog.records)


def test_a_pod_the_api_server_lacks_is_none_after_one_get(kube_api, make_client):
    client = make_client(kube_api.node)
    assert client.get_pod(NS, "ghost", not_found_wait=0) is None
    assert pod_gets(kube_api, "ghost") == 1
    assert client.cache_misses == 0  # a pod that does not exist says nothing about the name
