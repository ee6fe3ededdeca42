"""multusd.kube.access: the one-shot checks of ``multusd doctor`` and the permissions it reviews.

Each check is one live request of a never-started :class:`ApiProbe` against the stand-in API
server (tests/kubeapi.py); the exact access reviews sent are read off a byte recorder
(tests/wirepeer.py). The permission list is checked against what a running client really asks.
"""

from __future__ import annotations

import json
from typing import Iterator, List

import pytest

from kubeapi import request_attributes
from multusd.errors import MultusError, TryAgainLater
from multusd.kube.access import PERMISSIONS, REVIEWS_PATH, ApiProbe
from multusd.kube.client import KubeClient
from multusd.kube.objects import NADS_PATH
from testlib import token_kubeconfig, wait_for
from wirepeer import WirePeer

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'


@pytest.fixture
def probes() -> Iterator:
    made: List[ApiProbe] = []

    def make(kubeconfig: str, node: str = "node-a", timeout: float = 5.0) -> ApiProbe:
        made.append(ApiProbe(kubeconfig, node, request_timeout=timeout))
        return made[-1]

    yield make
    for probe in made:
        probe.stop()


@pytest.fixture
def probe(kube_api, probes) -> ApiProbe:
    return probes(kube_api.kubeconfig_path, kube_api.node)


# ---- version, node, pods --------------------------------------------------------------------

def test_version_is_the_servers_git_version(kube_api, probe):
    version, seconds = probe.version()
    assert version == "v1.30.0-multusd-fake" and seconds >= 0
    assert kube_api.count("GET", "/version") == 1


def test_version_failures_are_translated(kube_api, probes, tmp_path):
    wrong = probes(kube_api.write_kubeconfig(str(tmp_path / "wrong"), token="wrong-0123456789"))
    with pytest.raises(MultusError) as caught:
        wrong.version()
    assert "401 Unauthorized" in caught.value.msg and "get the API server's version" \
        in caught.value.msg
    kube_api.stop()
    with pytest.raises(TryAgainLater):
        probes(kube_api.kubeconfig_path, timeout=0.5).version()


def test_the_node_exists_is_missing_or_may_not_be_read(kube_api, probes):
    assert probes(kube_api.kubeconfig_path, kube_api.node).node_exists() is True
    assert probes(kube_api.kubeconfig_path, "ghost").node_exists() is False
    kube_api.deny("get", "nodes")
    assert probes(kube_api.kubeconfig_path, kube_api.node).node_exists() is None


def test_a_failing_node_read_is_raised(kube_api, probe):
    kube_api.fail_next("GET", "/api/v1/nodes/", 401, times=None)
    with pytest.raises(MultusError) as caught:
        probe.node_exists()
    assert "cannot get node node-a" in caught.value.msg


def test_pods_on_node_lists_this_nodes_pods_only(kube_api, probe):
    kube_api.add_pod(NS, "here")
    kube_api.add_pod(NS, "there", node="node-b")
    pods = probe.pods_on_node()
    assert [(p.name, p.node_name) for p in pods] == [("here", "node-a")]
    (_, path, query), = [r for r in kube_api.requests if r[1] == "/api/v1/pods"]
    assert query == {"fieldSelector": "spec.nodeName=node-a"}


def test_pods_on_node_failures_name_the_node(kube_api, probe):
    kube_api.deny("list", "pods")
    with pytest.raises(MultusError) as caught:
        probe.pods_on_node()
    assert "list the pods on node node-a" in caught.value.msg and "403" in caught.value.msg


def test_pod_node_tells_scheduled_unscheduled_and_missing(kube_api, probe):
    kube_api.add_pod(NS, "there", node="node-b")
    kube_api.add_pod(NS, "pending", node="")
    assert probe.pod_node(NS, "there") == "node-b"
    assert probe.pod_node(NS, "pending") == ""
    assert probe.pod_node(NS, "nope") is None
    kube_api.fail_next("GET", f"/api/v1/namespaces/{NS}/pods/there", 403)
    with pytest.raises(MultusError):
        probe.pod_node(NS, "there")


def test_pod_is_one_live_get_without_waiting(kube_api, probe):
    kube_api.add_pod(NS, "web")
    assert probe.pod(NS, "web").name == "web"
    assert probe.pod(NS, "nope") is None  # an unstarted client has no watch to wait for
    assert kube_api.count("GET", f"/api/v1/namespaces/{NS}/pods/nope") == 1
    assert kube_api.count("GET", "/api/v1/pods") == 0  # nothing listed, nothing watched


# ---- the NAD API ---------------------------------------------------------------------------------

def test_nad_api_is_none_while_nads_can_be_listed(kube_api, probe):
    assert probe.nad_api() is None
    (_, _, query), = [r for r in kube_api.requests if r[1] == NADS_PATH]
    assert query == {"limit": "1"}  # one item is enough to know


def test_nad_api_names_a_missing_crd_and_a_refusal(kube_api, probe):
    kube_api.nad_crd_installed = False
    condition, message = probe.nad_api()
    assert condition == "crd-missing" and "kubectl apply -f" in message
    kube_api.nad_crd_installed = True
    kube_api.deny("list", "network-attachment-definitions", "k8s.cni.cncf.io")
    condition, message = probe.nad_api()
    assert condition == "forbidden" and "rbac.yaml" in message


def test_nad_api_unavailable_carries_the_translated_failure(kube_api, probes):
    kube_api.fail_next("GET", NADS_PATH, 503, times=None)
    condition, message = probes(kube_api.kubeconfig_path, timeout=0.5).nad_api()
    assert condition == "unavailable"
    assert "list NetworkAttachmentDefinitions" in message and "answered 503" in message


# ---- access reviews ------------------------------------------------------------------------------

def recorded_kubeconfig(tmp_path, peer: WirePeer) -> str:
    return token_kubeconfig(tmp_path / "recorded.kubeconfig", "tok-0123456789abcdef",
                            server=peer.url)


def review_answer(status: dict) -> bytes:
    body = json.dumps({"kind": "SelfSubjectAccessReview", "status": status}).encode()
    return (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d"
            b"\r\n\r\n%s" % (len(body), body))


@pytest.fixture
def peer() -> Iterator[WirePeer]:
    made = WirePeer()
    yield made
    made.stop()


def test_a_review_of_a_subresource_names_it_apart(tmp_path, peer, probes):
    peer.answer(review_answer({"allowed": True, "reason": "RBAC: allowed"}))
    probe = probes(recorded_kubeconfig(tmp_path, peer))
    assert probe.can("update", "", "pods/status") == (True, "RBAC: allowed")
    head = peer.heads[0]
    assert head.line == f"POST {REVIEWS_PATH} HTTP/1.1"
    assert json.loads(head.body) == {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "update", "group": "", "resource": "pods",
                                        "subresource": "status"}}}


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_a_review_of_listing_pods_names_this_node_as_the_node_authorizer_needs(
        tmp_path, peer, probes, verb):
    peer.answer(review_answer({"allowed": False}))
    probe = probes(recorded_kubeconfig(tmp_path, peer), "node-7")
    assert probe.can(verb, "", "pods") == (False, "")
    attributes = json.loads(peer.heads[0].body)["spec"]["resourceAttributes"]
    assert attributes["fieldSelector"] == {"requirements": [
        {"key": "spec.nodeName", "operator": "In", "values": ["node-7"]}]}


def test_other_reviews_carry_no_field_selector_and_an_evaluation_error_is_the_reason(
        tmp_path, peer, probes):
    peer.answer(review_answer({"allowed": False, "evaluationError": "webhook timed out"}))
    probe = probes(recorded_kubeconfig(tmp_path, peer))
    assert probe.can("list", "k8s.cni.cncf.io", "network-attachment-definitions") == \
        (False, "webhook timed out")
    attributes = json.loads(peer.heads[0].body)["spec"]["resourceAttributes"]
    assert "fieldSelector" not in attributes and "subresource" not in attributes


def test_a_review_that_cannot_be_made_is_raised(kube_api, probe):
    kube_api.fail_next("POST", REVIEWS_PATH, 403)
    with pytest.raises(MultusError) as caught:
        probe.can("get", "", "pods")
    assert "review access to get pods" in caught.value.msg


def test_reviews_follow_the_servers_rbac(kube_api, probe):
    kube_api.deny("create", "events")
    assert probe.can("create", "", "events")[0] is False
    assert probe.can("get", "", "pods")[0] is True


# ---- PERMISSIONS is what the daemon asks for --------------------------------------------

@pytest.mark.parametrize("watch_list", ["serve", "refused"])
def test_the_permissions_reviewed_are_what_a_running_client_uses(kube_api, watch_list):
    # a server that streams lists is asked to watch only; one that does not, to list as well
    kube_api.watch_list = watch_list
    kube_api.add_pod(NS, "web")
    kube_api.add_pod(NS, "elsewhere", node="node-b")
    kube_api.add_nad(NS, "net1", NAD_CONFIG)
    client = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    client.start()
    try:
        assert client.wait_synced(10, nads=True)
        assert kube_api.wait_for_watchers(2)
        client.get_pod(NS, "elsewhere", not_found_wait=0)  # a live GET
        client.get_nad(NS, "nope")  # a live GET
        client.set_network_status(client.get_pod(NS, "web"), "[]")
        client.emit_event(client.get_pod(NS, "web"), "Normal", "Test", "permissions")
        wait_for(lambda: kube_api.events, what="the event")
    finally:
        client.stop()
    used = set()
    for method, path, query in list(kube_api.requests):
        attributes = request_attributes(method, path, query)
        if attributes is not None:
            verb, group, resource, _ = attributes
            used.add((group, resource, verb))
    reviewed = {(group, resource, verb) for group, resource, verb, _ in PERMISSIONS}
    lists = {(group, resource, "list") for group, resource in
             (("", "pods"), ("k8s.cni.cncf.io", "network-attachment-definitions"))}
    assert used == (reviewed if watch_list == "refused" else reviewed - lists)
