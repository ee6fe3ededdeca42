"""The stand-in API server's per-client ledger (tests/kubeclients.py), which bench/fleet.py reads.

Each client is the user its token authenticates as; every request is booked with its kind and
whether a LIST was a watch-cache or a storage read (decided from the request alone, by
kube-apiserver's rules), and every byte written back is booked to the request it answered, a
watch stream included.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Tuple

import pytest

import kubeclients
from kubeclients import CACHE, OTHER, STORAGE, WATCH, read_source, request_kind
from testlib import wait_for

PODS = "/api/v1/pods"
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"


@pytest.mark.parametrize("query, source", [
    ({}, STORAGE),                                                  # a consistent list
    ({"limit": "500"}, STORAGE),                                    # its first page
    ({"resourceVersion": "0"}, CACHE),
    ({"resourceVersion": "0", "limit": "500"}, CACHE),              # client-go's relist
    ({"resourceVersion": "12", "resourceVersionMatch": "NotOlderThan"}, CACHE),
    ({"resourceVersion": "12", "resourceVersionMatch": "Exact"}, STORAGE),
    ({"resourceVersion": "12"}, CACHE),                             # unpaged: not older than
    ({"resourceVersion": "12", "limit": "500"}, STORAGE),           # paged: exact
    ({"resourceVersion": "0", "continue": "abc", "limit": "5"}, STORAGE),
    ({"watch": "true", "resourceVersion": "12"}, WATCH),
    ({"watch": "true", "sendInitialEvents": "true",                 # WatchList
      "resourceVersionMatch": "NotOlderThan"}, CACHE),
    ({"watch": "true", "sendInitialEvents": "true",                 # multusd's first sync
      "resourceVersionMatch": "NotOlderThan", "resourceVersion": "0"}, CACHE),
    ({"watch": "true", "sendInitialEvents": "true",                 # and its relists
      "resourceVersionMatch": "NotOlderThan", "resourceVersion": "12"}, CACHE),
])
def test_read_source_follows_kube_apiservers_rules(query, source):
    assert read_source("GET", query) == source


def test_request_kinds_name_the_resource_and_the_verb():
    assert request_kind("GET", PODS, {"fieldSelector": "spec.nodeName=a"}) == "pods list"
    assert request_kind("GET", PODS, {"watch": "1"}) == "pods watch"
    assert request_kind("GET", NADS, {"watch": "true", "sendInitialEvents": "true"}) == \
        "nads watchlist"
    assert request_kind("GET", "/api/v1/namespaces/d/pods/web", {}) == "pods get"
    assert request_kind("PUT", "/api/v1/namespaces/d/pods/web/status", {}) == \
        "pods/status update"
    assert request_kind("POST", "/api/v1/namespaces/d/events", {}) == "events create"
    assert request_kind("GET", "/version/", {}) == "GET /version/"


def _get(kube_api, token: str, path: str) -> Tuple[bytes, int]:
    """GET ``path`` on a connection of its own: (the body, every byte the server sent)."""
    with socket.create_connection(("127.0.0.1", kube_api.port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received.partition(b"\r\n\r\n")[2], len(received)


def test_each_client_is_booked_its_requests_bytes_and_storage_reads(kube_api):
    for number in range(30):
        kube_api.add_pod("default", f"other-{number}", node="node-other")
    kube_api.add_pod("default", "mine", node="node-7")
    kube_api.add_nad("default", "net1", '{"type": "bridge"}')
    kube_api.auth.add_token("token-of-node-7", "system:node:node-7")
    started = kube_api.clients.clock()

    body, wrote = _get(kube_api, "token-of-node-7",
                       PODS + "?fieldSelector=spec.nodeName%3Dnode-7")
    assert [p["metadata"]["name"] for p in json.loads(body)["items"]] == ["mine"]
    _body, wrote_cached = _get(kube_api, "token-of-node-7", NADS + "?resourceVersion=0")
    _get(kube_api, kube_api.token, PODS + "?resourceVersion=0")  # another client

    mine = kube_api.clients.window("system:node:node-7", started)
    assert mine["requests"] == 2
    assert mine["by_kind"] == {"pods list": 1, "nads list": 1}
    assert (mine["storage_lists"], mine["cache_lists"]) == (1, 1)
    assert mine["storage_objects"] == 31  # etcd read every pod to return one
    assert mine["bytes"] == wrote + wrote_cached
    theirs = kube_api.clients.window(kube_api.user, started)
    assert (theirs["requests"], theirs["cache_lists"], theirs["storage_objects"]) == (1, 1, 0)
    assert set(kube_api.clients.clients()) == {"system:node:node-7", kube_api.user}
    assert kube_api.clients.window("system:node:node-7", kube_api.clients.clock())["requests"] == 0


def test_a_watch_streams_bytes_to_its_client_and_a_401_to_anonymous(kube_api):
    kube_api.auth.add_token("token-b", "system:node:b")
    sock = socket.create_connection(("127.0.0.1", kube_api.port), timeout=10)
    try:
        sock.sendall(f"GET {PODS}?watch=true&timeoutSeconds=30 "
                     "HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer token-b\r\n\r\n".encode())
        assert kube_api.wait_for_watchers(1)
        kube_api.add_pod("default", "watched", node="b")
        received = b""
        while b"watched" not in received:
            received += sock.recv(65536)
        wait_for(lambda: kube_api.clients.window("system:node:b")["bytes"] == len(received),
                 10, what="the watch's bytes booked to its client")
        window = kube_api.clients.window("system:node:b")
        assert window["by_kind"] == {"pods watch": 1} and window["watches"] == 1
    finally:
        sock.close()
    _get(kube_api, "no-such-token", PODS)
    anonymous = [c for c in kube_api.clients.clients() if c.startswith("anonymous ")]
    assert len(anonymous) == 1
    assert kube_api.clients.window(anonymous[0])["requests"] == 1


def test_stored_objects_counts_the_namespace_a_list_names(kube_api):
    kube_api.add_pod("a", "one", node="x")
    kube_api.add_pod("b", "two", node="x")
    assert kubeclients.stored_objects(kube_api, "/api/v1/namespaces/a/pods") == 1
    assert kubeclients.stored_objects(kube_api, PODS) == 2
    assert kubeclients.stored_objects(kube_api, "/api/v1/nodes") == 0
    assert read_source("POST", {}) == OTHER


# ---- WatchList as kube-apiserver answers it, and as servers that do not stream lists -------------

WATCH_LIST = ("?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
              "&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion=")


def _events(kube_api, query: str) -> Tuple[int, list]:
    """(HTTP status, the events or the Status) of a NAD watch with ``query``."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(kube_api.url + NADS + query,
                                     headers={"Authorization": f"Bearer {kube_api.token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, [json.loads(line) for line in response.read().splitlines()
                                     if line.strip()]
    except urllib.error.HTTPError as error:
        return error.code, [json.loads(error.read())]


def test_a_watch_list_from_0_is_the_watch_caches_snapshot_and_a_cache_read(kube_api):
    kube_api.add_nad("default", "old", '{"type": "bridge"}')
    held = kube_api.hold_watch_cache()
    kube_api.add_nad("default", "newer", '{"type": "bridge"}')  # not in the cache yet
    started = kube_api.clients.clock()
    status, events = _events(kube_api, WATCH_LIST + "0")
    assert status == 200 and [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "old"
    end = events[1]["object"]["metadata"]
    assert end == {"resourceVersion": str(held),
                   "annotations": {"k8s.io/initial-events-end": "true"}}
    window = kube_api.clients.window(kube_api.user, started)
    assert window["by_kind"] == {"nads watchlist": 1} and window["cache_lists"] == 1
    assert kube_api.count_list_reads("nads", "cache") == 1
    kube_api.release_watch_cache()


def test_servers_that_do_not_stream_lists_answer_as_kube_apiserver_does(kube_api):
    kube_api.add_nad("default", "net1", '{"type": "bridge"}')
    kube_api.watch_list = "refused"  # the WatchList gate off: ListOptions validation
    status, [body] = _events(kube_api, WATCH_LIST + "0")
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == ('ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: '
                               'Forbidden: sendInitialEvents is forbidden for watch unless the '
                               'WatchList feature gate is enabled')
    assert body["details"]["causes"] == [{
        "reason": "FieldValueForbidden", "field": "sendInitialEvents",
        "message": "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList "
                   "feature gate is enabled"}]
    kube_api.watch_list = "no-progress"  # 1.31+ over an etcd without progress requests
    status, [error] = _events(kube_api, WATCH_LIST + "0")
    assert status == 200 and error["type"] == "ERROR"
    assert (error["object"]["code"], error["object"]["reason"]) == (500, "InternalError")
    assert "RequestWatchProgress is disabled" in error["object"]["message"]
    kube_api.watch_list = "ignored"  # before 1.19: a plain watch from 0
    status, events = _events(kube_api, WATCH_LIST + "0")
    assert status == 200 and [e["type"] for e in events] == ["ADDED"]
    kube_api.watch_list = "serve"  # and every server validates the options it knows
    status, [body] = _events(kube_api, "?watch=true&sendInitialEvents=true")
    assert status == 422 and "requires setting resourceVersionMatch to NotOlderThan" in \
        body["message"]
    status, [body] = _events(kube_api, "?watch=true&resourceVersionMatch=NotOlderThan")
    assert status == 422 and "unless sendInitialEvents is provided" in body["message"]



# ---- what a recovery is measured by: served requests, successful LISTs, requests in flight -------

def test_the_ledger_counts_requests_in_flight_until_served():
    now = [0.0]
    ledger = kubeclients.ClientLedger(clock=lambda: now[0])
    first = ledger.record("a", "GET", PODS, {"resourceVersion": "0"}, lambda _p: 0)
    now[0] = 1.0
    second = ledger.record("b", "GET", NADS, {"resourceVersion": "0"}, lambda _p: 0)
    third = ledger.record("a", "GET", PODS + "/x", {}, lambda _p: 0)
    now[0] = 2.0
    ledger.answered(first, 200)
    ledger.answered(first, 500)  # the first status line is the one the client got
    ledger.served(first, listed=True)
    ledger.answered(second, 429)
    ledger.served(second, listed=True)  # a refusal lists nothing
    now[0] = 3.0
    ledger.served(first)  # served once: the first instant counts
    assert ledger.peak_in_flight(["a", "b"]) == 3
    assert ledger.peak_in_flight(["a"]) == 2
    assert ledger.peak_in_flight(["a", "b"], start=2.0) == 1  # the third, never served
    assert ledger.peak_in_flight(["a", "b"], end=1.0) == 1
    assert ledger.peak_in_flight(["nobody"]) == 0
    mine = ledger.window("a")
    assert mine["first_listed"] == 2.0 and mine["first"] == 0.0
    assert mine["first_listed_by_resource"] == {"pods": 2.0}
    assert ledger.window("a", start=0.5)["first_listed"] is None  # asked before the window
    assert ledger.window("b")["first_listed"] is None
    ledger.answered(third, 200)
    ledger.served(third, listed=True)  # 200 to a GET of one object: not a LIST
    assert ledger.window("a", start=0.5)["first_listed"] is None
    now[0] = 4.0
    later = ledger.record("a", "GET", NADS, {"resourceVersion": "0"}, lambda _p: 0)
    ledger.answered(later, 200)
    ledger.served(later, listed=True)
    assert ledger.window("a")["first_listed_by_resource"] == {"pods": 2.0, "nads": 4.0}
    assert ledger.listed_since("a", 1.5) == {"pods": 2.0, "nads": 4.0}  # asked at 0, served at 2
    assert ledger.listed_since("a", 3.0) == {"nads": 4.0}
    assert ledger.listed_since("b", 0.0) == {} == ledger.listed_since("nobody", 0.0)


def test_a_watch_is_in_flight_until_its_initial_events_are_out(kube_api):
    kube_api.add_nad("default", "net1", '{"type": "bridge"}')
    started = kube_api.clients.clock()
    status, events = _events(kube_api, WATCH_LIST + "0")  # its server ends it after 1 s
    assert status == 200 and [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    window = kube_api.clients.window(kube_api.user, started)
    assert window["first_listed"] is not None
    listed = window["first_listed"] - started
    assert listed < kube_api.clients.clock() - started - 0.5  # served well before its end
    sock = socket.create_connection(("127.0.0.1", kube_api.port), timeout=10)
    try:  # a plain watch, open: served, no longer in flight, and no LIST
        sock.sendall(f"GET {PODS}?watch=true&resourceVersion=1&timeoutSeconds=60 HTTP/1.1\r\n"
                     f"Host: x\r\nAuthorization: Bearer {kube_api.token}\r\n\r\n".encode())
        assert kube_api.wait_for_watchers(1)
        wait_for(lambda: kube_api.clients.peak_in_flight(
            [kube_api.user], kube_api.clients.clock()) == 0, 10, what="the watch served")
        assert kube_api.clients.window(kube_api.user, started)["first_listed"] - started \
            == listed
    finally:
        sock.close()
    _get(kube_api, kube_api.token, NADS + "?resourceVersion=0")
    assert kube_api.clients.peak_in_flight([kube_api.user], kube_api.clients.clock()) == 0


def test_a_list_refused_or_unauthorised_is_not_a_successful_list(kube_api):
    started = kube_api.clients.clock()
    kube_api.fail_next("GET", PODS, 503)
    _get(kube_api, kube_api.token, PODS + "?resourceVersion=0")
    _get(kube_api, "no-such-token", PODS + "?resourceVersion=0")
    assert kube_api.clients.window(kube_api.user, started)["first_listed"] is None
    _get(kube_api, kube_api.token, PODS + "?resourceVersion=0")
    assert kube_api.clients.window(kube_api.user, started)["first_listed"] is not None


def test_a_restart_with_an_outage_refuses_connections_until_it_comes_back(kube_api):
    port = kube_api.port
    came_back = []
    restart = threading.Thread(target=lambda: came_back.append(kube_api.restart(down_for=600)))
    restart.start()
    try:
        wait_for(lambda: not kube_api.listening, 10, what="the stand-in gone")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        assert restart.is_alive()  # still away: only resume() or 600 s end it
    finally:
        kube_api.resume()
        restart.join(30)
    assert kube_api.port == port and came_back[0] <= kube_api.clients.clock()
    body, _wrote = _get(kube_api, kube_api.token, NADS + "?resourceVersion=0")
    assert json.loads(body)["kind"] == "NetworkAttachmentDefinitionList"
    assert kube_api.clients.window(kube_api.user, came_back[0])["requests"] == 1
