"""Watch expiry as client-go handles it: 410 Gone at the start or in the stream, lost history.

The reflectors of :class:`multusd.kube.client.KubeClient` against the fake API server: each
form of expiry leads to a new read of the whole state (a WatchList from the last version, or
a consistent LIST when that version is gone), so a NAD deleted while the watch could not see
it leaves the cache; a cache known to be stale is not "synced".
Then the same through the real daemon and shim: the deleted NAD is refused afterwards.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import pytest

from harness import Cluster, watch_bound
from kubeapi import FakeKubeAPI
from multusd.kube.client import KubeClient
from multusd.wire import api
from testlib import free_port, wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"0.4.0","name":"gone-net","type":"bridge"}'
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def client(kube_api):
    made = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    made.start()
    assert made.wait_synced(watch_bound(), nads=True), made.last_error
    assert kube_api.wait_for_watchers(2)
    yield made
    made.stop()


def nad_lists(kube: FakeKubeAPI) -> int:
    """Reads of the whole NAD state answered: LISTs and WatchLists."""
    return kube.count_list_reads("nads")


def delete_unseen(kube: FakeKubeAPI, form: str) -> None:
    """Delete the NAD while no watch can see it, then come back expired in ``form``."""
    kube.stop()
    kube.delete_nad(NS, "gone-net")
    if form == "lost-history":
        kube.restart(lose_history=True)
        return
    kube.compact()
    kube.expired_as_http = form == "http-410"
    kube.start()


FORMS = ["stream-410", "http-410", "lost-history"]


@pytest.mark.parametrize("form", FORMS)
def test_expired_watch_relists_and_drops_a_nad_deleted_meanwhile(kube_api, form):
    kube_api.add_nad(NS, "gone-net", NAD_CONFIG)
    client = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    client.start()
    try:
        assert client.wait_synced(watch_bound(), nads=True)
        assert client.cached_nad(NS, "gone-net") is not None
        delete_unseen(kube_api, form)
        wait_for(lambda: client.cached_nad(NS, "gone-net") is None, watch_bound(),
                 what=f"the NAD to leave the cache after {form}")
        assert nad_lists(kube_api) == 2 and client.relists >= 1
        assert client.wait_synced(watch_bound(), nads=True)
        # and the watch from the new list's version works: a new NAD arrives by watch alone
        kube_api.add_nad(NS, "new-net", NAD_CONFIG)
        wait_for(lambda: client.cached_nad(NS, "new-net") is not None, watch_bound(),
                 what="new NAD")
        assert nad_lists(kube_api) == 2
    finally:
        client.stop()


def test_error_410_in_an_open_stream_relists(kube_api, client):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    wait_for(lambda: client.cached_nad(NS, "a") is not None, watch_bound(), what="NAD by watch")
    assert nad_lists(kube_api) == 1
    assert kube_api.expire_watches() == 2
    wait_for(lambda: nad_lists(kube_api) == 2 and
             kube_api.count_list_reads("pods") == 2, watch_bound(), what="both relisted")
    assert client.wait_synced(watch_bound(), nads=True)
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    wait_for(lambda: client.cached_nad(NS, "b") is not None, watch_bound(),
             what="NAD after relist")


def test_a_cache_known_stale_is_not_synced(kube_api, client):
    kube_api.fail_next("GET", NADS, 500, times=None, initial_events=True)  # relists fail
    kube_api.expire_watches()
    wait_for(lambda: not client.nads_synced(), watch_bound(),
             what="the stale cache to count as unsynced")
    wait_for(lambda: client.last_error, watch_bound(), what="the failing relist to be reported")
    # readiness needs the pod cache only, which relists fine while the NAD list fails
    assert client.wait_synced(watch_bound()) and not client.nads_synced()
    kube_api.clear_failures()
    assert client.wait_synced(watch_bound(), nads=True)


def test_a_stale_cache_answers_nothing_but_readiness_stays(kube_api, client):
    """While a relist is pending, lookups are live GETs: a pod or NAD deleted while the watch
    could not see it is not served from the cache, and ADDs need not wait for the relist."""
    kube_api.add_pod(NS, "gone-pod")
    kube_api.add_nad(NS, "gone-net", NAD_CONFIG)
    wait_for(lambda: client.cached_pod(NS, "gone-pod") and client.cached_nad(NS, "gone-net"),
             watch_bound(), what="both in the caches")
    kube_api.fail_next("GET", "/api/v1/pods", 500, times=None, initial_events=True)  # relists
    kube_api.fail_next("GET", NADS, 500, times=None, initial_events=True)  # fail for now
    kube_api.stop()
    kube_api.delete_pod(NS, "gone-pod")
    kube_api.delete_nad(NS, "gone-net")
    kube_api.add_pod(NS, "new-pod")
    kube_api.compact()
    kube_api.start()  # both watches expire; their relists fail
    wait_for(lambda: client.relists >= 2, watch_bound(), what="both caches to be known stale")
    assert client.ready() and not client.synced() and not client.nads_synced()
    assert client.cached_pod(NS, "gone-pod") is not None  # still held, but not answered:
    assert client.get_pod(NS, "gone-pod", not_found_wait=0) is None
    assert client.get_nad(NS, "gone-net") is None
    assert client.get_pod(NS, "new-pod", not_found_wait=0) is not None
    assert kube_api.count("GET", f"/api/v1/namespaces/{NS}/pods/gone-pod") == 1
    kube_api.clear_failures()
    assert client.wait_synced(watch_bound(), nads=True)
    assert client.cached_pod(NS, "gone-pod") is None and client.cached_nad(NS, "gone-net") is None


def test_an_api_server_restart_relists_from_its_new_watch_cache(kube_api, client):
    """kube-apiserver comes back with a new watch cache: the watches from older versions get
    410 and relist at their last version, a watch-cache read; no etcd list of pods."""
    kube_api.add_pod(NS, "stays")
    wait_for(lambda: client.cached_pod(NS, "stays"), watch_bound(), what="the pod")
    kube_api.stop()
    kube_api.add_pod(NS, "while-away")
    kube_api.restart(new_watch_cache=True)
    wait_for(lambda: client.cached_pod(NS, "while-away"), watch_bound(), what="the relisted pod")
    assert kube_api.count_list_reads("pods", "cache") == 2
    assert kube_api.count_list_reads("pods", "storage") == 0
    reopens = client.watch_reopens
    assert reopens.get(("pods", "expired")) == 1
    assert client.wait_synced(watch_bound(), nads=True)


@pytest.mark.privileged
@pytest.mark.cni_plugins
@pytest.mark.parametrize("form", FORMS)
def test_daemon_refuses_a_nad_deleted_while_its_watch_was_expired(sandbox, kube_api, tmp_path,
                                                                   form):
    cluster = Cluster(sandbox, kube_api, tmp_path)
    cluster.nad("gone-net", "10.88.0.0/24")
    port = free_port()
    cluster.start(metricsPort=port)
    first = cluster.pod("exp-1", annotations={NETWORKS_KEY: "gone-net"})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert cluster.shim("ADD", first, ns_path, cid).code == 0
    assert cluster.shim("DEL", first, ns_path, cid).code == 0
    # a NAD event moves the daemon's watch to a version a restored etcd has not reached yet
    cluster.nad("later-net", "10.89.0.0/24")
    wait_for(lambda: "multusd_cached_nads 2" in metrics(port), watch_bound(),
             what="later-net watched")

    delete_unseen(kube_api, form)
    wait_for(lambda: nad_lists(kube_api) == 2, watch_bound(),
             what=f"the daemon to relist after {form}")
    wait_for(lambda: api.http_request(cluster.daemon.socket_path, "GET", "/readyz",
                                      timeout=2).status == 200, watch_bound(), what="synced again")
    second = cluster.pod("exp-2", annotations={NETWORKS_KEY: "gone-net"})
    ns2_name, ns2_path = sandbox.netns()
    add = cluster.shim("ADD", second, ns2_path, uuid.uuid4().hex)
    assert add.code == 1, add.output
    assert "gone-net" in add.output["msg"] and "not found" in add.output["msg"]
    assert add.output["cniVersion"] == "0.4.0"
    assert sandbox.leases_held() == []
    relists = re.search(r"^multusd_watch_relists_total (\S+)$", metrics(port), re.M)
    assert relists and float(relists.group(1)) >= 1


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_the_fake_streams_a_watch_list_as_client_go_asks_for_it(kube_api):
    """WatchList, as upstream v4.3's client-go informers open their watches: the objects as
    ADDED, then the BOOKMARK that ends the initial events (without it they never sync)."""
    kube_api.add_nad(NS, "listed-net", NAD_CONFIG)
    query = ("?watch=true&sendInitialEvents=true&allowWatchBookmarks=true"
             "&resourceVersionMatch=NotOlderThan&resourceVersion=&timeoutSeconds=1")
    request = urllib.request.Request(kube_api.url + NADS + query,
                                     headers={"Authorization": f"Bearer {kube_api.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "listed-net"
    bookmark = events[1]["object"]
    assert bookmark["kind"] == "NetworkAttachmentDefinition"
    assert bookmark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
