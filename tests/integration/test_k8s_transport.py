"""The API client's transport end to end: ADDs through an API server that sheds load, is cut
or restarts (the real daemon and shim), and an IPv6 API server over TLS.

Each failure is injected by the stand-in API server (tests/kubeapi.py); the daemon's
``multusd_kube_request_retries_total`` says what it retried.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

import pytest

from harness import Cluster, events_bound, watch_bound
from multusd.kube.client import NETWORK_STATUS_ANNOTATION, KubeClient
from testlib import free_port, wait_for

NS = "default"


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def retries(port: int) -> dict:
    """The daemon's multusd_kube_request_retries_total, by cause."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {cause: float(value) for cause, value in re.findall(
        r'^multusd_kube_request_retries_total\{cause="([^"]+)"\} (\S+)$', text, re.M)}


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def add_and_delete(cluster: Cluster, pod: dict) -> None:
    """ADD must succeed and write the network-status; DEL releases everything."""
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    assert cluster.status(NS, pod["metadata"]["name"])[0]["interface"] == "eth0"
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


@pytest.mark.privileged
@pytest.mark.cni_plugins
@pytest.mark.parametrize("request_kind", ["status-put", "live-pod-get"])
def test_an_add_succeeds_through_503_429_500(cluster, request_kind):
    port = free_port()
    cluster.start(metricsPort=port)
    # a pod of another node is not in this node's watch cache: its ADD asks the API server
    node = "node-b" if request_kind == "live-pod-get" else None
    pod = cluster.pod("shed", node=node)
    method, path = ("PUT", pod_path("shed") + "/status") if request_kind == "status-put" else \
        ("GET", pod_path("shed"))
    cluster.kube.fail_next(method, path, 503)
    cluster.kube.fail_next(method, path, 429, retry_after=1)  # API Priority and Fairness
    cluster.kube.fail_next(method, path, 500)
    add_and_delete(cluster, pod)
    assert cluster.kube.count(method, path) == 4  # three failures, then the one that worked
    assert retries(port) == {"503": 1.0, "429": 1.0, "500": 1.0}


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_an_add_succeeds_through_the_cuts_of_a_rolling_restart(cluster):
    port = free_port()
    cluster.start(metricsPort=port)
    pod = cluster.pod("rolling")
    path = pod_path("rolling") + "/status"
    cluster.kube.fail_next("PUT", path, drop="reset")  # read, then RST: no answer
    cluster.kube.fail_next("PUT", path, drop="close")  # read, then closed: no answer
    cluster.kube.fail_next("PUT", path, 502)  # the load balancer: no backend yet
    add_and_delete(cluster, pod)
    assert cluster.kube.count("PUT", path) == 4
    counted = retries(port)
    assert counted.get("502") == 1.0 and sum(counted.values()) == 3


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_an_add_waits_for_a_stopped_api_server_within_its_deadline(cluster):
    port = free_port()
    cluster.start(metricsPort=port)
    pod = cluster.pod("waits")
    wait_for(lambda: cluster.kube.count("GET", "/api/v1/pods", watch=True) >= 1, watch_bound(),
             what="the pod watch")
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    cluster.kube.stop()  # refused from now on
    result = {}
    shim = threading.Thread(target=lambda: result.update(add=cluster.shim("ADD", pod, ns_path,
                                                                          cid)))
    shim.start()
    try:
        wait_for(lambda: retries(port).get("refused", 0) >= 2, watch_bound(),
                 what="the daemon's writes to be refused twice")
    finally:
        cluster.kube.start()
        shim.join(60)
    assert result["add"].code == 0, result["add"].output
    assert cluster.status(NS, "waits")[0]["interface"] == "eth0"
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert cluster.sandbox.leases_held() == []


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_an_add_whose_pod_read_trickles_ends_at_its_deadline_while_other_pods_are_served(
        cluster):
    request_timeout = 4.0
    slow = cluster.pod("slow", node="node-b")  # not in this node's cache: a live GET
    fast = cluster.pod("fast")  # in the cache
    cluster.start(requestTimeout=request_timeout)
    # the live GET's answer: its status line after a second, then a byte every half second
    # (whole in minutes, to a client that bounds each read and not the request)
    cluster.kube.trickle("GET", pod_path("slow"), seconds=600)
    _, slow_ns = cluster.sandbox.netns()
    _, fast_ns = cluster.sandbox.netns()
    slow_id, fast_id = uuid.uuid4().hex, uuid.uuid4().hex
    result = {}

    def add_slow() -> None:
        started = time.monotonic()
        result["add"] = cluster.shim("ADD", slow, slow_ns, slow_id)
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=add_slow)
    thread.start()
    try:
        assert cluster.kube.wait_trickling(1, 20)
        # meanwhile a pod from the cache is served, whole
        add = cluster.shim("ADD", fast, fast_ns, fast_id)
        assert add.code == 0, add.output
        assert cluster.kube.trickled == []  # the slow answer was still trickling
        assert cluster.status(NS, "fast")[0]["interface"] == "eth0"
    finally:
        thread.join(60)
    slow_add = result["add"]
    assert slow_add.code == 1 and slow_add.output["code"] == 11, slow_add.output
    msg = slow_add.output["msg"]
    assert f"127.0.0.1:{cluster.kube.port} did not answer in time" in msg, msg
    assert "default/slow" in msg
    # the contract: it ended by its deadline (plus a generous margin for a loaded machine),
    # not when the server was done trickling
    assert result["took"] < request_timeout + 20
    wait_for(lambda: cluster.kube.trickled == [(pod_path("slow"), "client gone")], watch_bound(),
             what="the daemon to hang up on the trickling server")
    for pod, netns, cid in ((fast, fast_ns, fast_id), (slow, slow_ns, slow_id)):
        assert cluster.shim("DEL", pod, netns, cid).code == 0
    assert cluster.sandbox.leases_held() == []


@pytest.fixture
def client(kube_api):
    made = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    made.start()
    assert made.wait_synced(watch_bound(), nads=True), made.last_error
    yield made
    made.stop()


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_status_put_whose_answer_was_lost_is_settled_by_the_409_path(kube_api, client, how):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    path = pod_path("web") + "/status"
    kube_api.fail_next("PUT", path, drop=how, processed=True)  # written, then the answer lost
    client.set_network_status(pod, "[]")
    assert kube_api.pod(NS, "web")["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == "[]"
    # sent again, refused (409: the pod's version moved with the write), the pod read again:
    # the annotation is there, nothing more is written
    assert [m for m, p, _ in kube_api.requests if p in (path, pod_path("web"))] == \
        ["PUT", "PUT", "GET"]


def test_an_event_whose_answer_was_lost_is_not_sent_twice(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    events = f"/api/v1/namespaces/{NS}/events"
    kube_api.fail_next("POST", events, drop="reset", processed=True)
    client.emit_event(pod, "Normal", "AddedInterface", "lost answer")
    client.emit_event(pod, "Normal", "AddedInterface", "next one")
    wait_for(lambda: len(kube_api.events) == 2, events_bound(2, client.request_timeout),
             what="both events")
    assert [e["message"] for e in kube_api.events] == ["lost answer", "next one"]
    assert kube_api.count("POST", events) == 2


def test_an_ipv6_api_server_over_tls(make_kube_api):
    api = make_kube_api(tls=True, host="::1")  # its certificate names IP ::1
    assert api.url.startswith("https://[::1]:")
    api.add_pod(NS, "web")
    client = KubeClient(api.kubeconfig_path, api.node, request_timeout=5.0)
    try:
        client.start()
        assert client.wait_synced(watch_bound(), nads=True), client.last_error
        assert client.get_pod(NS, "absent", not_found_wait=0) is None  # a live GET
        pod = client.get_pod(NS, "web")
        client.set_network_status(pod, "[]")
        assert api.pod(NS, "web")["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == "[]"
    finally:
        client.stop()
