"""multusd.kube.client: how a lookup is answered (cache, live GET, the not-found wait), the
UID and node-name rules, the NAD API's failures, and waking the NAD watch.

Every test runs a real :class:`KubeClient` (started: its reflector threads, or not) against the
stand-in API server (tests/kubeapi.py); what it asked is read off the server's request log.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import List

import pytest

from kubeapi import FakeKubeAPI
from kubedra import network_device
from multusd.errors import DeadlineExceeded, MultusError, TryAgainLater
from multusd.kube.client import KubeClient
from multusd.kube.clientconfig import RBAC_FILE
from multusd.kube.lookups import EMPTY_CACHE_MISSES, NAD_CRD_FILE, nad_condition
from multusd.kube.objects import PODS_PATH, Pod, pod_from_object
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'
NADS_LIST = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def nad_path(name: str) -> str:
    return f"/apis/k8s.cni.cncf.io/v1/namespaces/{NS}/network-attachment-definitions/{name}"


@pytest.fixture
def make_client():
    """KubeClients, started and synced unless told otherwise; all stopped at teardown."""
    made: List[KubeClient] = []

    def make(api: FakeKubeAPI, *, node: str = "", start: bool = True, synced: bool = True,
             **options) -> KubeClient:
        client = KubeClient(api.kubeconfig_path, node or api.node, node_source="nodeName",
                            request_timeout=options.pop("request_timeout", 5.0), **options)
        made.append(client)
        if start:
            client.start()
            if synced:
                assert client.wait_synced(10, nads=True), client.last_error
        return client

    yield make
    for client in made:
        client.stop()


def gets(api: FakeKubeAPI, name: str) -> int:
    return api.count("GET", pod_path(name))


def in_thread(call) -> tuple:
    """Run ``call`` in a thread; (thread, result list)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


# ---- get_pod: cache, live GET, not-found wait -------------------------------------------------

def test_a_cached_pod_costs_no_request(kube_api, make_client):
    kube_api.add_pod(NS, "web")
    client = make_client(kube_api)
    before = len(kube_api.requests)
    assert client.get_pod(NS, "web").name == "web"
    assert len(kube_api.requests) == before and client.cache_misses == 0


def test_a_stale_cache_answers_nothing_and_the_node_stays_ready(kube_api, make_client):
    kube_api.add_pod(NS, "web")
    client = make_client(kube_api)
    kube_api.fail_next("GET", PODS_PATH, 503, times=None, initial_events=True)  # relists fail
    assert kube_api.wait_for_watchers(2)  # expire the watches, not the lists before them
    kube_api.expire_watches()
    wait_for(lambda: not client.synced(), what="the pod cache to be known stale")
    assert client.ready()  # a stale cache does not take readiness away
    assert client.cached_pod(NS, "web") is not None
    assert client.get_pod(NS, "web").name == "web"
    assert gets(kube_api, "web") == 1  # the live GET, not the stale copy
    kube_api.clear_failures()
    assert client.wait_synced(10)
    assert client.get_pod(NS, "web") is not None and gets(kube_api, "web") == 1


def test_a_pod_the_watch_brings_within_wait_costs_no_get(kube_api, make_client):
    client = make_client(kube_api)
    thread, result = in_thread(lambda: client.get_pod(NS, "late", wait=30, not_found_wait=0))
    kube_api.add_pod(NS, "late")
    thread.join(30)
    assert result[0] is not None and result[0].name == "late"
    assert gets(kube_api, "late") == 0


def test_after_a_404_the_watch_gets_its_chance_then_no_second_get(kube_api, make_client):
    client = make_client(kube_api)
    thread, result = in_thread(lambda: client.get_pod(NS, "mirror", not_found_wait=30))
    wait_for(lambda: gets(kube_api, "mirror") == 1, what="the live GET (404)")
    kube_api.add_pod(NS, "mirror")  # e.g. a static pod's mirror, created after its sandbox
    thread.join(30)
    assert result[0] is not None and result[0].name == "mirror"
    assert gets(kube_api, "mirror") == 1


def test_a_pod_the_watch_cannot_see_is_read_again_after_the_wait(kube_api, make_client):
    kube_api.add_pod(NS, "web", node="node-b")  # not in this node's watch
    kube_api.fail_next("GET", pod_path("web"), 404)  # not there yet at the first GET
    client = make_client(kube_api)
    pod = client.get_pod(NS, "web", not_found_wait=0.2)
    assert pod is not None and pod.node_name == "node-b"
    assert gets(kube_api, "web") == 2


def test_a_pod_the_server_does_not_have_is_none_after_two_gets(kube_api, make_client):
    client = make_client(kube_api)
    assert client.get_pod(NS, "nope", not_found_wait=0.1) is None
    assert gets(kube_api, "nope") == 2
    assert client.cache_misses == 0  # a miss is a pod found live


def test_an_unstarted_client_asks_once_and_never_waits(kube_api, make_client):
    client = make_client(kube_api, start=False)
    assert client.get_pod(NS, "nope", wait=30, not_found_wait=30) is None
    assert gets(kube_api, "nope") == 1
    kube_api.add_pod(NS, "web")
    assert client.get_pod(NS, "web").name == "web" and client.cache_misses == 1


def test_a_deadline_already_past_sends_nothing(kube_api, make_client):
    client = make_client(kube_api, start=False)
    with pytest.raises(DeadlineExceeded) as caught:
        client.get_pod(NS, "web", deadline=time.monotonic() - 1)
    assert "deadline passed before" in caught.value.msg and kube_api.url in caught.value.msg
    assert gets(kube_api, "web") == 0


def test_the_not_found_wait_ends_before_the_deadline_and_leaves_time_to_ask_again(
        kube_api, make_client):
    client = make_client(kube_api)
    # a wait to the deadline (or past it) would end in DeadlineExceeded at the second GET
    assert client.get_pod(NS, "nope", not_found_wait=60,
                          deadline=time.monotonic() + 0.5) is None
    assert gets(kube_api, "nope") == 2


def test_live_get_failures_are_translated(kube_api, make_client):
    client = make_client(kube_api, start=False)
    kube_api.fail_next("GET", pod_path("web"), 403)
    with pytest.raises(MultusError) as caught:
        client.get_pod(NS, "web")
    assert not isinstance(caught.value, TryAgainLater)
    assert "cannot get pod default/web" in caught.value.msg and "403" in caught.value.msg
    kube_api.fail_next("GET", pod_path("web"), 503, times=None)
    with pytest.raises(TryAgainLater) as caught:
        client.get_pod(NS, "web", deadline=time.monotonic() + 0.5)
    assert "answered 503" in caught.value.msg


# ---- the expected UID ------------------------------------------------------------------------

def test_a_cached_pod_with_another_uid_is_a_miss(kube_api, make_client):
    kube_api.add_pod(NS, "sts-0", uid="uid-1")
    client = make_client(kube_api)
    pod = client.get_pod(NS, "sts-0", expected_uid="uid-2", not_found_wait=0)
    assert gets(kube_api, "sts-0") == 1  # asked the server: the caller checks the UID
    assert pod.uid == "uid-1"
    assert client.get_pod(NS, "sts-0", expected_uid="uid-1").uid == "uid-1"
    assert gets(kube_api, "sts-0") == 1


def test_a_cached_static_pod_is_used_whatever_the_uid(kube_api, make_client):
    kube_api.add_pod("kube-system", "etcd-node-a", uid="mirror-uid", static=True)
    client = make_client(kube_api)
    pod = client.get_pod("kube-system", "etcd-node-a", expected_uid="runtime-uid")
    assert pod.uid == "mirror-uid" and pod.is_static
    assert kube_api.count("GET", "/api/v1/namespaces/kube-system/pods/") == 0


# ---- the node name -----------------------------------------------------------------------------

def mismatch_warnings(caplog) -> List[str]:
    return [r.getMessage() for r in caplog.records if "node name mismatch" in r.getMessage()]


def test_a_wrong_node_name_is_warned_once_per_pair_of_names(kube_api, make_client, caplog):
    for name, node in (("a", "real"), ("b", "real"), ("c", "other")):
        kube_api.add_pod(NS, name, node=node)
    client = make_client(kube_api, node="wrong")
    with caplog.at_level(logging.WARNING, logger="multusd.kube.client"):
        for name in ("a", "b"):
            assert client.get_pod(NS, name, not_found_wait=0) is not None
        assert client.node_mismatch == ("wrong", "real")
        assert len(mismatch_warnings(caplog)) == 1
        client.get_pod(NS, "c", not_found_wait=0)
    assert client.node_mismatch == ("wrong", "other")
    warnings = mismatch_warnings(caplog)
    assert len(warnings) == 2 and "'other'" in warnings[1] and "(node name from nodeName)" \
        in warnings[1]
    assert 'set "nodeName": \'real\'' in warnings[0] and "MULTUS_NODE_NAME=real" in warnings[0]
    assert client.cache_misses == 3


def test_an_unscheduled_pod_found_live_is_no_mismatch(kube_api, make_client):
    kube_api.add_pod(NS, "pending", node="")
    client = make_client(kube_api)
    assert client.get_pod(NS, "pending", not_found_wait=0).node_name == ""
    assert client.node_mismatch is None and client.cache_misses == 1


def test_an_empty_pod_watch_while_pods_are_found_live_is_warned_once(kube_api, make_client,
                                                                    caplog):
    for n in range(EMPTY_CACHE_MISSES + 2):
        kube_api.add_pod(NS, f"p{n}", node="")  # found live, never in this node's watch
    client = make_client(kube_api)
    with caplog.at_level(logging.WARNING, logger="multusd.kube.client"):
        for n in range(EMPTY_CACHE_MISSES - 1):
            client.get_pod(NS, f"p{n}", not_found_wait=0)
        assert "holds no pods" not in caplog.text
        for n in range(EMPTY_CACHE_MISSES - 1, EMPTY_CACHE_MISSES + 2):
            client.get_pod(NS, f"p{n}", not_found_wait=0)
    warned = [r.getMessage() for r in caplog.records if "holds no pods" in r.getMessage()]
    assert len(warned) == 1 and f"({EMPTY_CACHE_MISSES} live GETs in a row)" in warned[0]


def test_a_pod_cache_that_holds_pods_is_never_called_empty(kube_api, make_client, caplog):
    kube_api.add_pod(NS, "here")
    for n in range(EMPTY_CACHE_MISSES + 1):
        kube_api.add_pod(NS, f"p{n}", node="")
    client = make_client(kube_api)
    with caplog.at_level(logging.WARNING, logger="multusd.kube.client"):
        for n in range(EMPTY_CACHE_MISSES + 1):
            client.get_pod(NS, f"p{n}", not_found_wait=0)
    assert "holds no pods" not in caplog.text


# ---- get_nad and the NAD API ------------------------------------------------------------------

def test_a_cached_nad_costs_no_request_and_a_missing_one_is_none_after_one_get(kube_api,
                                                                             make_client):
    kube_api.add_nad(NS, "net1", NAD_CONFIG)
    client = make_client(kube_api)
    assert client.get_nad(NS, "net1").config == NAD_CONFIG
    assert kube_api.count("GET", nad_path("net1")) == 0
    assert client.get_nad(NS, "nope") is None
    assert kube_api.count("GET", nad_path("nope")) == 1 and client.nad_refusals == 0


def test_a_missing_crd_is_told_from_a_missing_nad_by_details_name(kube_api, make_client):
    client = make_client(kube_api, start=False)
    assert client.get_nad(NS, "nope") is None  # 404 naming the object: it does not exist
    kube_api.nad_crd_installed = False  # 404 naming no object: the resource type is missing
    with pytest.raises(MultusError) as caught:
        client.get_nad(NS, "net1")
    assert not isinstance(caught.value, TryAgainLater)
    assert "cannot get NetworkAttachmentDefinition default/net1" in caught.value.msg
    assert "CRD" in caught.value.msg and f"kubectl apply -f {NAD_CRD_FILE}" in caught.value.msg
    assert client.nad_refusals == 1


def test_nads_the_node_may_not_read_name_the_rbac_file(kube_api, make_client):
    kube_api.deny("get", "network-attachment-definitions", "k8s.cni.cncf.io")
    client = make_client(kube_api, start=False)
    with pytest.raises(MultusError) as caught:
        client.get_nad(NS, "net1")
    assert "403 Forbidden" in caught.value.msg and f"kubectl apply -f {RBAC_FILE}" \
        in caught.value.msg
    assert client.nad_refusals == 1


def test_a_failing_nad_get_is_try_again_later(kube_api, make_client):
    client = make_client(kube_api, start=False)
    kube_api.fail_next("GET", nad_path("net1"), 503, times=None)
    with pytest.raises(TryAgainLater):
        client.get_nad(NS, "net1", deadline=time.monotonic() + 0.5)
    assert client.nad_refusals == 0


@pytest.mark.parametrize("status,condition", [(404, "crd-missing"), (403, "forbidden"),
                                              (503, "unavailable")])
def test_a_failing_nad_watch_is_named_and_blocks_no_pod(kube_api, make_client, status,
                                                        condition):
    kube_api.add_pod(NS, "web")
    kube_api.fail_next("GET", NADS_LIST, status, times=None)
    client = make_client(kube_api, synced=False)
    assert client.wait_synced(10)  # readiness needs the pod cache only
    wait_for(lambda: client.nad_problem() is not None, what="the NAD list to fail")
    assert client.ready() and not client.nads_synced()
    assert client.nad_problem()[0] == condition
    assert client.get_pod(NS, "web") is not None


@pytest.mark.parametrize("exists", [True, False])
def test_a_nad_api_that_answers_again_wakes_the_nad_watch(kube_api, make_client, exists):
    # the failing list says "come back in 60 s": only the lookup's wake-up brings it sooner
    kube_api.fail_next("GET", NADS_LIST, 503, times=None, retry_after=60)
    client = make_client(kube_api, synced=False)
    wait_for(lambda: client.nad_problem() is not None, what="the NAD list to fail")
    lists = kube_api.count("GET", NADS_LIST)  # WatchLists (or LISTs), each failed
    kube_api.clear_failures()
    if exists:
        kube_api.add_nad(NS, "net1", NAD_CONFIG)
        assert client.get_nad(NS, "net1").config == NAD_CONFIG
    else:
        assert client.get_nad(NS, "net1") is None  # 404 of the object: the API answers
    assert client.wait_synced(20, nads=True) and client.nad_problem() is None
    assert kube_api.count("GET", NADS_LIST) == lists + 1  # one read, which goes on as the watch


def test_nad_condition_names_the_fix():
    assert nad_condition(404, None)[0] == "crd-missing"
    assert NAD_CRD_FILE in nad_condition(404, None)[1]
    assert nad_condition(403, None) == ("forbidden", nad_condition(403, "ignored")[1])
    assert RBAC_FILE in nad_condition(403, None)[1]
    assert nad_condition(500, "the server said so") == ("unavailable", "the server said so")
    assert nad_condition(None, None)[0] == "unavailable" and nad_condition(None, None)[1]


def test_a_pod_listener_is_handed_every_pod_the_watch_delivers(kube_api, make_client, caplog):
    kube_api.add_pod(NS, "web", annotations={"a": "1"})
    client = make_client(kube_api, start=False)
    seen: List[Pod] = []
    client.add_pod_listener(lambda pod: seen.append(pod))
    client.add_pod_listener(lambda pod: 1 / 0)  # a broken listener stops nothing
    client.start()
    assert client.wait_synced(10)
    kube_api.update_pod(NS, "web", annotations={"a": "2"}, phase="Running")
    wait_for(lambda: len(seen) == 2, 10, what="the change delivered")
    assert [(p.name, p.annotations["a"], p.phase) for p in seen] == [("web", "1", "Pending"),
                                                                    ("web", "2", "Running")]
    wait_for(lambda: client.cached_pod(NS, "web").phase == "Running", 10, what="the cache")
    assert "a pod listener failed on default/web" in caplog.text
    kube_api.add_pod(NS, "other", node="elsewhere")
    assert client.get_pod(NS, "other") is not None  # a live GET is no delivery of the watch
    assert len(seen) == 2


# ---- lifecycle -------------------------------------------------------------------------------

def test_start_twice_starts_one_pair_of_watches(kube_api, make_client):
    client = make_client(kube_api)
    client.start()
    assert kube_api.wait_for_watchers(2)
    assert kube_api.count("GET", PODS_PATH) == 1  # a WatchList each, going on as the watch
    assert kube_api.count("GET", NADS_LIST) == 1


def test_stop_ends_every_thread_and_events_no_longer_go_out(kube_api, make_client):
    before = {t for t in threading.enumerate() if t.name.startswith("multusd-k8s-")}
    client = make_client(kube_api)
    ours = {t for t in threading.enumerate() if t.name.startswith("multusd-k8s-")} - before
    assert {t.name for t in ours} == {"multusd-k8s-pods", "multusd-k8s-nads",
                                      "multusd-k8s-events"}
    client.stop()
    assert not any(t.is_alive() for t in ours)
    pod = Pod(namespace=NS, name="web", uid="u", annotations={}, is_static=False,
              resource_version="1")
    client.emit_event(pod, "Normal", "After", "stop")  # never raises, and nothing sends it
    assert kube_api.count("POST", f"/api/v1/namespaces/{NS}/events") == 0


def test_requests_are_counted(kube_api, make_client):
    client = make_client(kube_api, start=False)
    client.get_pod(NS, "nope", not_found_wait=0)
    client.get_nad(NS, "nope")
    assert client.api_requests == 2


# ---- DRA devices ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduled", ["node-b", ""], ids=["its-node", "unscheduled"])
def test_dra_devices_are_searched_on_the_pods_node_else_this_one(kube_api, make_client,
                                                                 scheduled):
    driver = "sriov.example.com"
    for node in ("node-a", "node-b"):
        kube_api.add_resource_slice(f"{node}-vfs", node=node, driver=driver, pool="p",
                                    devices=[network_device("vf-0", f"{node}-vf-0", "r/vf")])
    kube_api.add_resource_claim(NS, "c", [("req", driver, "p", "vf-0")])
    pod = pod_from_object(kube_api.add_pod(NS, "web", node=scheduled, status={
        "resourceClaimStatuses": [{"name": "net", "resourceClaimName": "c"}]}))
    client = make_client(kube_api, start=False)
    devices = client.pod_dra_devices(pod, deadline=time.monotonic() + 10)
    assert [d.device_id for d in devices] == [f"{scheduled or 'node-a'}-vf-0"]
    assert client.dra_slice_lists == 1


# ---- a slow server ----------------------------------------------------------------------------

def test_a_trickled_live_get_ends_at_the_deadline_and_holds_no_cached_lookup(kube_api,
                                                                            make_client):
    kube_api.add_pod(NS, "cached")
    kube_api.add_pod(NS, "elsewhere", node="node-b")  # not in this node's cache
    client = make_client(kube_api)
    kube_api.trickle("GET", pod_path("elsewhere"), seconds=600)
    outcome = {}

    def slow() -> None:
        try:
            client.get_pod(NS, "elsewhere", deadline=time.monotonic() + 3.0)
        except MultusError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        assert kube_api.wait_trickling(1, 10)
        assert client.get_pod(NS, "cached") is not None  # served while the GET trickles
        assert kube_api.trickled == []
    finally:
        thread.join(30)
    error = outcome["error"]
    assert isinstance(error, TryAgainLater)
    assert f"127.0.0.1:{kube_api.port} did not answer in time" in error.msg
    assert "get pod default/elsewhere" in error.msg
