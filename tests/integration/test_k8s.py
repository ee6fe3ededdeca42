"""multusd.kube (client, reflector, status) against the fake API server, via ``kubernetes``."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from harness import events_bound, watch_bound
from kubeapi import FakeKubeAPI
from multusd.errors import MultusError, PodNotFound, TryAgainLater
from multusd.kube.client import NETWORK_STATUS_ANNOTATION, KubeClient, Pod
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'
STATUS = json.dumps([{"name": "cbr0", "interface": "eth0", "ips": ["10.1.0.5"],
                      "default": True, "dns": {}}], indent=4)


def pod_path(name: str, namespace: str = NS) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def nad_path(name: str, namespace: str = NS) -> str:
    return f"/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions/{name}"


@pytest.fixture
def make_client():
    """Factory of KubeClients (started unless start=False); all are stopped at teardown."""
    made = []

    def make(api: FakeKubeAPI, *, start: bool = True, kubeconfig: str = "",
             node: str = "") -> KubeClient:
        client = KubeClient(kubeconfig or api.kubeconfig_path, node or api.node,
                            request_timeout=5.0)
        made.append(client)
        if start:
            client.start()
        return client

    yield make
    for client in made:
        client.stop()


@pytest.fixture
def client(kube_api, make_client) -> KubeClient:
    """A started client whose caches are in sync with kube_api."""
    made = make_client(kube_api)
    assert made.wait_synced(watch_bound(), nads=True), made.last_error
    return made


# ---- caches and readiness --------------------------------------------------------------------

def test_caches_sync_with_one_watch_list_each(kube_api, make_client):
    kube_api.add_pod(NS, "web")
    kube_api.add_nad(NS, "net1", NAD_CONFIG)
    client = make_client(kube_api, start=False)
    assert not client.synced()
    client.start()
    assert client.wait_synced(watch_bound(), nads=True)
    assert client.synced()
    assert kube_api.wait_for_watchers(2)
    nads = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
    for path, kind in (("/api/v1/pods", "pods"), (nads, "nads")):
        # one WatchList, from the watch cache, which goes on as the watch
        assert kube_api.count("GET", path) == kube_api.count("GET", path, watch=True) == 1
        assert kube_api.count_list_reads(kind, "cache") == kube_api.count_list_reads(kind) == 1
    assert client.api_requests == 2
    assert client.cached_pod(NS, "web") is not None
    assert client.cached_nad(NS, "net1").config == NAD_CONFIG


def test_not_synced_while_the_list_fails(kube_api, make_client):
    kube_api.fail_next("GET", "/api/v1/pods", 500, times=None)
    client = make_client(kube_api)
    wait_for(lambda: client.last_error, watch_bound(), what="the failing pod list to be reported")
    assert not client.synced()
    assert "500" in client.last_error and kube_api.url in client.last_error
    kube_api.clear_failures()
    assert client.wait_synced(watch_bound(), nads=True)


def test_cached_pod_and_nad_cost_no_requests(kube_api, make_client):
    created = kube_api.add_pod(NS, "web", annotations={"k8s.v1.cni.cncf.io/networks": "net1"})
    kube_api.add_nad(NS, "net1", NAD_CONFIG)
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound(), nads=True)
    before, sent = len(kube_api.requests), client.api_requests
    pod = client.get_pod(NS, "web")
    nad = client.get_nad(NS, "net1")
    assert pod.uid == created["metadata"]["uid"]
    assert pod.annotations["k8s.v1.cni.cncf.io/networks"] == "net1"
    assert nad.config == NAD_CONFIG
    assert len(kube_api.requests) == before
    assert client.api_requests == sent


def test_pod_created_after_the_lookup_started_is_returned(kube_api, client):
    timer = threading.Timer(0.2, kube_api.add_pod, args=(NS, "late"))
    timer.start()
    try:
        pod = client.get_pod(NS, "late", wait=10)
    finally:
        timer.join()
    assert pod is not None and pod.name == "late"
    assert pod.uid == kube_api.pod(NS, "late")["metadata"]["uid"]
    assert kube_api.count("GET", pod_path("late")) == 0  # the watch delivered it


def test_missing_pod_is_none_after_one_live_get(kube_api, client):
    assert client.get_pod(NS, "ghost", wait=0.1, not_found_wait=0) is None
    assert kube_api.count("GET", pod_path("ghost")) == 1


def test_after_a_404_the_watch_may_still_deliver_the_pod(kube_api, client):
    assert client.get_pod(NS, "ghost", not_found_wait=0.2) is None
    assert kube_api.count("GET", pod_path("ghost")) == 2  # before and after the bounded wait
    found = []
    fetch = threading.Thread(target=lambda: found.append(client.get_pod(NS, "late-2")))
    fetch.start()
    wait_for(lambda: kube_api.count("GET", pod_path("late-2")) == 1, watch_bound(),
             what="the first GET")
    kube_api.add_pod(NS, "late-2")
    fetch.join(10)
    assert found and found[0] is not None and found[0].name == "late-2"
    assert kube_api.count("GET", pod_path("late-2")) == 1  # the watch delivered it


def test_recreated_pod_with_another_uid_is_fetched_live(kube_api, client):
    kube_api.add_pod(NS, "sts-0", uid="old-uid")
    wait_for(lambda: client.cached_pod(NS, "sts-0"), watch_bound(), what="sts-0 in the cache")
    kube_api.fail_next("GET", "/api/v1/pods", 500, times=None, watch=True)  # no new events
    kube_api.stop()
    kube_api.start()
    kube_api.delete_pod(NS, "sts-0")
    kube_api.add_pod(NS, "sts-0", uid="new-uid")
    pod = client.get_pod(NS, "sts-0", wait=0.1, expected_uid="new-uid")
    assert pod.uid == "new-uid"
    assert kube_api.count("GET", pod_path("sts-0")) == 1


def test_pod_on_another_node_is_not_cached(kube_api, client):
    kube_api.add_pod(NS, "elsewhere", node="node-b")
    kube_api.add_pod(NS, "here")
    wait_for(lambda: client.cached_pod(NS, "here"), watch_bound(),
             what="the local pod in the cache")
    assert client.cached_pod(NS, "elsewhere") is None
    assert all(q.get("fieldSelector") == f"spec.nodeName={kube_api.node}"
               for m, path, q in kube_api.requests if path == "/api/v1/pods")
    assert client.get_pod(NS, "elsewhere", wait=0).name == "elsewhere"  # live GET still works


def test_pod_moving_to_this_node_enters_the_cache(kube_api, client):
    kube_api.add_pod(NS, "moving", node="node-b")
    kube_api.update_pod(NS, "moving", node=kube_api.node)
    wait_for(lambda: client.cached_pod(NS, "moving"), watch_bound(),
             what="the pod after it moved here")
    kube_api.update_pod(NS, "moving", node="node-c")
    wait_for(lambda: client.cached_pod(NS, "moving") is None, watch_bound(),
             what="the pod to leave the cache")


def test_pod_annotation_change_and_delete_seen_through_watch(kube_api, client):
    kube_api.add_pod(NS, "web")
    wait_for(lambda: client.cached_pod(NS, "web"), watch_bound(), what="web in the cache")
    kube_api.update_pod(NS, "web", annotations={"k8s.v1.cni.cncf.io/networks": "net2"})
    wait_for(lambda: client.cached_pod(NS, "web").annotations.get(
        "k8s.v1.cni.cncf.io/networks") == "net2", watch_bound(), what="the new annotation")
    kube_api.delete_pod(NS, "web")
    wait_for(lambda: client.cached_pod(NS, "web") is None, watch_bound(),
             what="web to leave the cache")


# ---- NetworkAttachmentDefinitions -------------------------------------------------------------

def test_nad_miss_makes_one_live_get(kube_api, make_client):
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound(), nads=True)
    kube_api.hold_watch_cache()  # the watch delivers nothing newer
    kube_api.add_nad("team", "late-net", NAD_CONFIG)
    assert client.cached_nad("team", "late-net") is None
    nad = client.get_nad("team", "late-net")
    assert nad.config == NAD_CONFIG
    assert kube_api.count("GET", nad_path("late-net", "team")) == 1
    assert client.get_nad("team", "absent") is None
    assert kube_api.count("GET", nad_path("absent", "team")) == 1


def test_nad_update_and_delete_seen_through_watch(kube_api, client):
    kube_api.add_nad("team", "net1", NAD_CONFIG)
    wait_for(lambda: client.cached_nad("team", "net1"), watch_bound(), what="net1 in the cache")
    changed = NAD_CONFIG.replace("bridge", "macvlan")
    kube_api.add_nad("team", "net1", changed, annotations={"k8s.v1.cni.cncf.io/resourceName": "x"})
    wait_for(lambda: client.cached_nad("team", "net1").config == changed, watch_bound(),
             what="the new config")
    assert client.get_nad("team", "net1").annotations["k8s.v1.cni.cncf.io/resourceName"] == "x"
    kube_api.delete_nad("team", "net1")
    wait_for(lambda: client.cached_nad("team", "net1") is None, watch_bound(),
             what="net1 to leave the cache")
    assert kube_api.count("GET", nad_path("net1", "team")) == 0


# ---- network-status ---------------------------------------------------------------------------

def pod_requests(kube_api, since: int, name: str) -> list:
    """(method, path) of the requests about one pod since ``since`` (watches left out)."""
    return [(m, p) for m, p, _ in kube_api.requests[since:] if p.startswith(pod_path(name))]


def test_set_network_status_writes_the_annotation_with_one_put(kube_api, client):
    kube_api.add_pod(NS, "web", annotations={"keep": "me"})
    pod = client.get_pod(NS, "web", wait=5)
    before = len(kube_api.requests)
    client.set_network_status(pod, STATUS)
    stored = kube_api.pod(NS, "web")
    assert stored["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == STATUS
    assert stored["metadata"]["annotations"]["keep"] == "me"
    assert stored["status"]["phase"] == "Pending"  # the status itself is untouched
    assert stored["spec"]["containers"][0]["name"] == "main"
    assert pod_requests(kube_api, before, "web") == [
        ("PUT", pod_path("web") + "/status")]  # the watch's copy, guarded by resourceVersion
    wait_for(lambda: client.cached_pod(NS, "web").annotations.get(NETWORK_STATUS_ANNOTATION)
             == STATUS, watch_bound(), what="the watch to bring the annotation back")


def test_set_network_status_from_a_stale_copy_loses_no_change_made_since(kube_api, client):
    kube_api.add_pod(NS, "web", annotations={"keep": "me"})
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.update_pod(NS, "web", annotations={"added": "meanwhile"}, phase="Running")
    before = len(kube_api.requests)
    client.set_network_status(pod, STATUS)  # pod: the copy from before the update
    stored = kube_api.pod(NS, "web")
    assert stored["metadata"]["annotations"] == {
        "keep": "me", "added": "meanwhile", NETWORK_STATUS_ANNOTATION: STATUS}
    assert stored["status"]["phase"] == "Running"
    assert pod_requests(kube_api, before, "web") == [
        ("PUT", pod_path("web") + "/status"), ("GET", pod_path("web")),
        ("PUT", pod_path("web") + "/status")]


def test_set_network_status_already_in_the_copy_is_confirmed_with_the_server(kube_api, client):
    kube_api.add_pod(NS, "web", annotations={NETWORK_STATUS_ANNOTATION: STATUS})
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.update_pod(NS, "web", annotations={NETWORK_STATUS_ANNOTATION: "[]"})
    client.set_network_status(pod, STATUS)  # the copy says done; the server says otherwise
    assert kube_api.pod(NS, "web")["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == STATUS
    wait_for(lambda: client.cached_pod(NS, "web").annotations.get(NETWORK_STATUS_ANNOTATION)
             == STATUS, watch_bound(), what="the watch to bring the annotation")
    before = len(kube_api.requests)
    client.set_network_status(client.get_pod(NS, "web"), STATUS)  # nothing to write
    assert pod_requests(kube_api, before, "web") == [("GET", pod_path("web"))]


def test_set_network_status_retries_on_conflict(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.fail_next("PUT", pod_path("web") + "/status", 409, times=2)
    client.set_network_status(pod, STATUS)
    assert kube_api.pod(NS, "web")["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == STATUS
    assert kube_api.count("PUT", pod_path("web") + "/status") == 3
    assert kube_api.count("GET", pod_path("web")) == 2  # none before the first PUT


def test_set_network_status_gives_up_after_conflicts(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.fail_next("PUT", pod_path("web") + "/status", 409, times=None)
    with pytest.raises(TryAgainLater) as info:
        client.set_network_status(pod, STATUS)
    assert "default/web" in info.value.msg
    assert kube_api.count("PUT", pod_path("web") + "/status") == 5


def test_set_network_status_of_a_deleted_pod_is_not_an_error(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.delete_pod(NS, "web")
    client.set_network_status(pod, STATUS)  # the PUT answers 404: logged, not raised
    assert kube_api.pod(NS, "web") is None
    assert kube_api.count("PUT", pod_path("web") + "/status") == 1


def test_set_network_status_refuses_a_replaced_pod(kube_api, client):
    kube_api.add_pod(NS, "sts-0", uid="uid-1")
    pod = client.get_pod(NS, "sts-0", wait=5)
    kube_api.delete_pod(NS, "sts-0")
    kube_api.add_pod(NS, "sts-0", uid="uid-2")
    with pytest.raises(PodNotFound) as info:
        client.set_network_status(pod, STATUS)
    assert "uid-1" in info.value.msg and "uid-2" in info.value.msg
    assert NETWORK_STATUS_ANNOTATION not in kube_api.pod(NS, "sts-0")["metadata"]["annotations"]


def test_set_network_status_of_a_static_pod_ignores_the_uid(kube_api, client):
    kube_api.add_pod("kube-system", "etcd-node-a", uid="mirror-uid", static=True)
    runtime_view = Pod(namespace="kube-system", name="etcd-node-a", uid="runtime-uid",
                       annotations={}, is_static=True, resource_version="")
    client.set_network_status(runtime_view, STATUS)
    stored = kube_api.pod("kube-system", "etcd-node-a")
    assert stored["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == STATUS


def test_set_network_status_forbidden_names_the_missing_permission(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    kube_api.fail_next("PUT", pod_path("web") + "/status", 403, times=None)
    with pytest.raises(MultusError) as info:
        client.set_network_status(pod, STATUS)
    assert "403" in info.value.msg and "pods/status update" in info.value.msg
    assert "/usr/share/multusd/rbac.yaml" in info.value.msg
    assert not isinstance(info.value, TryAgainLater)
    # the watch's copy was refused, then a fresh copy: refused too, so it is a real refusal
    assert [m for m, path, _ in kube_api.requests if path.startswith(pod_path("web"))][-3:] \
        == ["PUT", "GET", "PUT"]


# ---- events -------------------------------------------------------------------------------------

def test_events_are_delivered_with_source_multus(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    client.emit_event(pod, "Normal", "AddedInterface", "Add net1 [1.1.1.3/24] from test/net1")
    client.emit_event(pod, "Warning", "NoNetworkFound", "cannot find a network-attachment-"
                      "definition (nope) in namespace (default): not found")
    wait_for(lambda: len(kube_api.events) == 2, events_bound(2, client.request_timeout),
             what="two events")
    first, second = kube_api.events
    assert first["involvedObject"]["uid"] == pod.uid
    assert first["involvedObject"]["kind"] == "Pod"
    assert first["source"]["component"] == "multus"
    assert (first["type"], first["reason"]) == ("Normal", "AddedInterface")
    assert first["message"] == "Add net1 [1.1.1.3/24] from test/net1"
    assert (second["type"], second["reason"]) == ("Warning", "NoNetworkFound")


def test_events_never_raise(kube_api, client):
    kube_api.add_pod(NS, "web")
    pod = client.get_pod(NS, "web", wait=5)
    client.emit_event(pod, "Bogus", "X", "a type the API would reject is dropped here")
    kube_api.stop()
    client.emit_event(pod, "Normal", "AddedInterface", "sent while the API server is down")
    kube_api.start()
    client.emit_event(pod, "Normal", "AddedInterface", "after the restart")
    wait_for(lambda: any(e["message"] == "after the restart" for e in kube_api.events),
             events_bound(2, client.request_timeout), what="the event sent after the restart")
    assert all(e["type"] in ("Normal", "Warning") for e in kube_api.events)


# ---- the API server going away ----------------------------------------------------------------

def test_caches_recover_after_the_api_server_restarts(kube_api, client):
    kube_api.add_pod(NS, "stays")
    kube_api.add_pod(NS, "goes")
    wait_for(lambda: client.cached_pod(NS, "goes"), watch_bound(), what="the pods in the cache")
    kube_api.stop()
    kube_api.add_pod(NS, "while-away")
    kube_api.delete_pod(NS, "goes")
    kube_api.add_nad(NS, "net-while-away", NAD_CONFIG)
    wait_for(lambda: client.last_error, watch_bound(), what="the lost watch to be reported")
    kube_api.start()
    wait_for(lambda: client.cached_pod(NS, "while-away"), timeout=watch_bound(),
             what="the pod added while the API server was away")
    wait_for(lambda: client.cached_nad(NS, "net-while-away"), timeout=watch_bound(),
             what="the NAD added while the API server was away")
    wait_for(lambda: client.cached_pod(NS, "goes") is None, watch_bound(),
             what="the deleted pod to leave")
    assert client.cached_pod(NS, "stays") is not None
    assert kube_api.count_list_reads("pods") == 1  # resumed, not relisted
    wait_for(lambda: client.last_error is None, watch_bound(), what="the error to clear")


def test_expired_watch_relists(kube_api, client):
    kube_api.add_pod(NS, "old")
    wait_for(lambda: client.cached_pod(NS, "old"), watch_bound(), what="old in the cache")
    kube_api.stop()
    kube_api.delete_pod(NS, "old")
    kube_api.add_pod(NS, "new")
    kube_api.compact()  # the client's resourceVersion is now too old: 410 Gone
    kube_api.start()
    wait_for(lambda: client.cached_pod(NS, "new") and client.cached_pod(NS, "old") is None,
             timeout=watch_bound(), what="the relisted cache")
    assert kube_api.count_list_reads("pods") == 2


def test_unreachable_api_server_is_try_again_later(kube_api, client):
    url = kube_api.url
    kube_api.stop()
    with pytest.raises(TryAgainLater) as info:
        client.get_pod(NS, "ghost", wait=0)
    assert url in info.value.msg


def test_server_errors_are_try_again_later(kube_api, client):
    kube_api.fail_next("GET", pod_path("ghost"), 503, times=None)
    with pytest.raises(TryAgainLater) as info:  # retried until the deadline's end, then this
        client.get_pod(NS, "ghost", wait=0, deadline=time.monotonic() + 1.0)
    sent = kube_api.count("GET", pod_path("ghost"))
    assert sent > 1 and "503" in info.value.msg and f"after {sent} attempts" in info.value.msg


def test_forbidden_watch_is_diagnosed(kube_api, make_client):
    kube_api.fail_next("GET", "/api/v1/pods", 403, times=None, watch=True)
    client = make_client(kube_api)
    wait_for(lambda: client.last_error, watch_bound(), what="the forbidden watch to be reported")
    assert "403" in client.last_error and "watch" in client.last_error
    assert "ClusterRole" in client.last_error


# ---- credentials ------------------------------------------------------------------------------

def test_wrong_token_gives_a_clear_401_error(kube_api, make_client, tmp_path):
    wrong = "wrong-token-0b1c2d3e4f5a6978"
    kubeconfig = kube_api.write_kubeconfig(str(tmp_path / "wrong.kubeconfig"), token=wrong)
    client = make_client(kube_api, kubeconfig=kubeconfig)
    with pytest.raises(MultusError) as info:
        client.get_pod(NS, "web", wait=0)
    assert "401" in info.value.msg and "credentials" in info.value.msg
    assert kubeconfig in info.value.msg and kube_api.url in info.value.msg
    assert wrong not in str(info.value) and wrong not in info.value.details
    wait_for(lambda: client.last_error, watch_bound(), what="the watch to report the 401")
    assert "401" in client.last_error and wrong not in client.last_error
    assert not client.synced()


def test_no_credential_reaches_a_log_record(kube_api, make_client, tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's and the client's included
    wrong = "wrong-token-77aa66bb55cc44dd"
    bad = make_client(kube_api, kubeconfig=kube_api.write_kubeconfig(
        str(tmp_path / "bad.kubeconfig"), token=wrong))
    good = make_client(kube_api)
    assert good.wait_synced(watch_bound(), nads=True)
    kube_api.add_pod(NS, "web")
    pod = good.get_pod(NS, "web", wait=5)
    good.set_network_status(pod, STATUS)
    good.emit_event(pod, "Normal", "AddedInterface", "Add net1")
    wait_for(lambda: kube_api.events, events_bound(1, good.request_timeout), what="the event")
    with pytest.raises(MultusError):
        bad.get_pod(NS, "web", wait=0)
    wait_for(lambda: bad.last_error, watch_bound(), what="the failing watch")
    kube_api.stop()
    wait_for(lambda: good.last_error, watch_bound(), what="the lost watch")
    with pytest.raises(TryAgainLater):
        good.get_pod(NS, "ghost", wait=0)
    kube_api.start()
    captured = capsys.readouterr()
    assert caplog.records, "nothing was logged: the test would prove nothing"
    for secret in (kube_api.token, wrong):
        assert secret not in caplog.text
        assert all(secret not in record.getMessage() for record in caplog.records)
        assert secret not in captured.out and secret not in captured.err


def test_tls_and_token_file(make_kube_api, make_client):
    api = make_kube_api(tls=True, token_file=True)
    api.add_pod(NS, "web")
    kubeconfig = json.loads(open(api.kubeconfig_path).read())
    assert "tokenFile" in kubeconfig["users"][0]["user"]
    assert api.url.startswith("https://")
    client = make_client(api)
    assert client.wait_synced(watch_bound(), nads=True), client.last_error
    assert client.get_pod(NS, "web").name == "web"


def test_stop_ends_the_background_threads(kube_api, make_client):
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound(), nads=True)
    assert kube_api.wait_for_watchers(2)
    client.emit_event(Pod(NS, "p", "u", {}, False, "1"), "Normal", "R", "m")
    client.stop()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("multusd-k8s")
             and t.is_alive()]
    assert alive == []
