"""multusd.kube.reflector: list and watch rules, against the stand-in API server or a raw one.

Each test runs one real :class:`Reflector` thread over the real transport; what it asked for
is read off the server's request log, what it holds off its store. Nothing of ours is patched.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Dict, Iterator, List

import pytest

from kubeapi import FakeKubeAPI
from multusd.kube import reflector as reflector_mod
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import NADS_PATH, PODS_PATH, nad_from_object, pod_from_object
from multusd.kube.reflector import Reflector, WatchState, shutdown_response, watch_events
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'


class Running:
    """One reflector thread over the stand-in, and what it holds."""

    def __init__(self, api: FakeKubeAPI, kind: str, watch_idle: Any = None) -> None:
        self.api, self.kind = api, kind
        self.config = ClientConfig(api.kubeconfig_path)
        self.state = WatchState(kinds=(kind,))
        self.store: Dict[Any, Any] = {}
        self.path = PODS_PATH if kind == "pods" else NADS_PATH
        base = {"fieldSelector": f"spec.nodeName={api.node}"} if kind == "pods" else {}

        def send(extra: Dict[str, Any], timeout: float, read_timeout: Any) -> Any:
            return self.config.transport.request("GET", self.path, query={**base, **extra},
                                                 timeout=timeout, read_timeout=read_timeout,
                                                 stream=True)

        trim = pod_from_object if kind == "pods" else nad_from_object
        self.reflector = Reflector(self.state, kind, kind, send, trim, self.store, self.config,
                                   5.0, watch_idle)
        self.thread = threading.Thread(target=self.reflector.run, daemon=True)
        self.thread.start()

    def names(self) -> List[str]:
        with self.state.cond:
            return sorted(name for _, name in self.store)

    def synced(self, timeout: float = 10.0) -> bool:
        with self.state.cond:
            return self.state.cond.wait_for(lambda: self.state.synced[self.kind], timeout)

    def lists(self) -> List[Dict[str, str]]:
        """The queries of its LIST requests, oldest first."""
        return [q for m, p, q in list(self.api.requests)
                if p == self.path and q.get("watch") != "true"]

    def watches(self) -> List[Dict[str, str]]:
        return [q for m, p, q in list(self.api.requests)
                if p == self.path and q.get("watch") == "true"]

    def reopens(self, cause: str) -> int:
        with self.state.cond:
            return self.state.reopens.get((self.kind, cause), 0)

    def stop(self) -> None:
        self.state.stop()
        with self.state.cond:
            watches = list(self.state.open_watches.values())
        for response in watches:
            shutdown_response(response)
        self.thread.join(timeout=10)
        self.config.close()


@pytest.fixture
def run(kube_api) -> Iterator[Any]:
    started: List[Running] = []

    def start(kind: str = "nads", api: FakeKubeAPI = kube_api, **options: Any) -> Running:
        running = Running(api, kind, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


# ---- lists: from the watch cache, paged, never back in time -------------------------------------

def test_the_first_list_is_a_paged_watch_cache_read(kube_api, run):
    for index in range(3):
        kube_api.add_pod(NS, f"here-{index}")
    for index in range(20):
        kube_api.add_pod(NS, f"elsewhere-{index}", node="node-z")
    pods = run("pods")
    assert pods.synced()
    assert pods.names() == ["here-0", "here-1", "here-2"]
    first = pods.lists()[0]
    assert first["resourceVersion"] == "0" and first["limit"] == str(reflector_mod.LIST_PAGE)
    assert kube_api.count_list_reads("pods", "cache") == 1
    assert kube_api.count_list_reads("pods", "storage") == 0  # no etcd read of every pod


def test_a_lagging_watch_cache_is_caught_up_by_the_watch_from_the_lists_version(kube_api, run):
    kube_api.add_nad(NS, "old", NAD_CONFIG)
    kube_api.add_nad(NS, "deleted-later", NAD_CONFIG)
    held = kube_api.hold_watch_cache()
    kube_api.add_nad(NS, "newer", NAD_CONFIG)  # etcd has it; the cache does not yet
    kube_api.delete_nad(NS, "deleted-later")
    nads = run()
    assert nads.synced()
    assert nads.names() == ["deleted-later", "old"]  # the cache's older state, as listed
    wait_for(lambda: nads.watches(), what="the watch")
    assert nads.watches()[0]["resourceVersion"] == str(held)  # from the list's own version
    kube_api.release_watch_cache()
    wait_for(lambda: nads.names() == ["newer", "old"], what="the watch to deliver the gap")
    assert len(nads.lists()) == 1


def test_a_relist_after_expiry_reads_the_cache_at_the_last_version_and_drops_deletions(
        kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.add_nad(NS, "c", NAD_CONFIG)
    wait_for(lambda: "c" in nads.names(), what="c by watch")
    seen = nads.reflector.version
    kube_api.stop()
    kube_api.delete_nad(NS, "a")  # while no watch can see it
    kube_api.compact()
    kube_api.start()  # the watch from `seen` is answered ERROR 410
    wait_for(lambda: nads.names() == ["b", "c"], timeout=15, what="the relist")
    relist = nads.lists()[1]
    assert relist.get("resourceVersion") == seen and "limit" not in relist
    assert kube_api.count_list_reads("nads", "storage") == 0
    assert nads.reopens("expired") == 1 and nads.state.relists["nads"] == 1


def test_410_at_the_start_of_a_watch_relists_at_the_last_version(kube_api, run):
    kube_api.expired_as_http = True
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    version = nads.reflector.version
    kube_api.stop()
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    kube_api.compact()
    kube_api.start()
    wait_for(lambda: nads.names() == ["a", "b"], timeout=15, what="the relist")
    assert [q.get("resourceVersion") for q in nads.lists()] == ["0", version]
    assert nads.reopens("expired") == 1


def test_too_large_in_the_stream_lists_consistently(kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    wait_for(lambda: "b" in nads.names(), what="b by watch")
    kube_api.stop()
    kube_api.delete_nad(NS, "a")
    kube_api.restart(lose_history=True)  # versions restart below the reflector's
    wait_for(lambda: nads.names() == ["b"], timeout=15, what="the consistent list")
    relist = nads.lists()[1]
    assert "resourceVersion" not in relist and relist["limit"] == str(reflector_mod.LIST_PAGE)
    assert kube_api.count_list_reads("nads", "storage") == 1
    assert nads.reopens("expired") == 1
    kube_api.add_nad(NS, "c", NAD_CONFIG)  # and the watch goes on from the new history
    wait_for(lambda: nads.names() == ["b", "c"], what="c by watch")


def test_a_list_at_a_version_the_cache_has_not_reached_falls_back_to_a_consistent_list(
        kube_api, run):
    """An API server whose watch cache is behind what the reflector saw (504 after a wait),
    reached here through a cache that was not ready: its first list came from etcd."""
    kube_api.too_large_wait = 0.2
    kube_api.watch_cache_ready = False  # a list without selectors with limit: from etcd
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    behind = kube_api.hold_watch_cache()
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    nads = run()
    assert nads.synced() and nads.names() == ["a", "b"]
    wait_for(lambda: nads.watches(), what="the watch (429: the cache is not ready)")
    kube_api.watch_cache_ready = True
    kube_api.wait_for_watchers(1)  # opened from the etcd version, beyond the cache
    assert int(nads.watches()[-1]["resourceVersion"]) > behind
    kube_api.expire_watches()
    wait_for(lambda: len(nads.lists()) == 3, what="the relist and its fallback")
    asked = [q.get("resourceVersion") for q in nads.lists()]
    assert asked == ["0", nads.watches()[1]["resourceVersion"], None]
    assert kube_api.count_list_reads("nads", "storage") == 2  # the first and the last
    assert nads.synced()


def test_an_expired_continue_token_lists_the_whole_once(kube_api, run):
    for index in range(reflector_mod.LIST_PAGE + 20):
        kube_api.add_nad(NS, f"net-{index:04d}", NAD_CONFIG)
    kube_api.watch_cache_ready = False  # the cacher sends a paged list to etcd

    def compaction_between_pages() -> None:
        kube_api.add_nad(NS, "between", NAD_CONFIG)
        kube_api.compact()
        kube_api.watch_cache_ready = True

    kube_api.between_pages = compaction_between_pages
    nads = run()
    assert nads.synced()
    assert len(nads.names()) == reflector_mod.LIST_PAGE + 21 and "between" in nads.names()
    first, second, whole = nads.lists()
    assert first["resourceVersion"] == "0" and "continue" in second
    assert "resourceVersion" not in second  # a continue carries no version
    assert whole == {"resourceVersion": "0"}  # once, without limit: the cache's whole list
    assert kube_api.count_list_reads("nads", "storage") == 1


def test_a_paged_list_follows_continue_tokens(kube_api, run):
    for index in range(2 * reflector_mod.LIST_PAGE + 1):
        kube_api.add_nad(NS, f"net-{index:04d}", NAD_CONFIG)
    kube_api.watch_cache_ready = False
    nads = run()
    assert nads.synced() and len(nads.names()) == 2 * reflector_mod.LIST_PAGE + 1
    assert [("continue" in q) for q in nads.lists()] == [False, True, True]
    assert len(nads.lists()) == 3


# ---- watches: resumed from the last version, bookmarks, error events -----------------------------

def test_bookmarks_advance_the_version_the_next_watch_resumes_from(kube_api, run):
    kube_api.bookmark_interval = 0.2
    pods = run("pods")
    assert pods.synced() and kube_api.wait_for_watchers(1)
    other = kube_api.add_pod(NS, "elsewhere", node="node-z")  # no event for this node's watch
    version = other["metadata"]["resourceVersion"]
    wait_for(lambda: pods.reflector.version == version, what="a bookmark with its version")
    kube_api.restart()  # cut: the next watch resumes from the bookmark's version
    wait_for(lambda: len(pods.watches()) >= 2, timeout=15, what="the next watch")
    assert pods.watches()[1]["resourceVersion"] == version and len(pods.lists()) == 1


def test_a_watch_the_server_ends_is_resumed_without_a_relist(kube_api, run):
    kube_api.watch_timeout_cap = 1.5  # the server ends each watch after 1.5 s
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced()
    wait_for(lambda: len(nads.watches()) >= 3, timeout=15, what="two watches ended")
    assert nads.reopens("ended") >= 2 and len(nads.lists()) == 1
    assert {q["resourceVersion"] for q in nads.watches()} == {nads.reflector.version}
    assert all(q["allowWatchBookmarks"] == "true" for q in nads.watches())


def test_an_error_event_relists(kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    assert kube_api.fail_watches(500, "InternalError", "etcd watch channel closed") == 1
    wait_for(lambda: len(nads.lists()) == 2, what="the relist")
    assert nads.lists()[1].get("resourceVersion") == nads.watches()[0]["resourceVersion"]
    assert nads.reopens("error") == 1
    wait_for(lambda: nads.state.errors["nads"] is None, what="the error to clear")


def test_a_watch_the_server_refuses_with_retry_after_waits_that_long(kube_api, run):
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.watch_cache_ready = False  # watches answered 429 with Retry-After: 1
    kube_api.restart()
    wait_for(lambda: len(nads.watches()) >= 2, what="the refused watch")
    kube_api.watch_cache_ready = True
    wait_for(lambda: len(nads.watches()) >= 3, what="the watch after Retry-After")
    refused, retried = [at for at, kind, watch in kube_api.read_log if watch][1:3]
    assert retried - refused >= 1.0  # not sooner than the server asked (as it saw them)
    assert nads.reopens("error") == 1


def test_the_first_answer_after_an_outage_resets_the_backoff(kube_api, run):
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.stop()
    wait_for(lambda: nads.reflector.backoff.current >= 1.0, timeout=15,
             what="failed attempts to grow the backoff")
    kube_api.start()
    wait_for(lambda: nads.reflector.backoff.current == reflector_mod.BACKOFF_INITIAL,
             timeout=15, what="the first answer to reset the backoff")
    assert kube_api.wait_for_watchers(1)
    assert nads.reopens("connection") >= 2 and len(nads.lists()) == 1


def test_a_silent_stream_is_resumed_from_its_version(kube_api, run):
    nads = run(watch_idle=0.5)
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.blackhole()
    try:
        wait_for(lambda: nads.reopens("silence") >= 1, what="the silence")
    finally:
        kube_api.blackhole(False)
    wait_for(lambda: len(nads.watches()) >= 2, what="the resumed watch")
    assert nads.watches()[-1]["resourceVersion"] == nads.watches()[0]["resourceVersion"]
    assert len(nads.lists()) == 1


def test_backoff_doubles_to_its_cap_with_jitter_and_resets():
    backoff = reflector_mod.Backoff(0.25, 4.0)
    steps = []
    for _ in range(8):
        step = backoff.current
        delay = backoff.next()
        assert step / 2 <= delay <= step  # at random in the second half of the step
        steps.append(step)
    assert steps == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.current == 0.25
    assert len({round(reflector_mod.Backoff(4.0, 4.0).next(), 6) for _ in range(50)}) > 10


def test_retry_after_comes_from_the_header_or_the_status():
    from multusd.kube.transport import ApiError

    header = ApiError(429, "Too Many Requests", "{}", {"Retry-After": "3"})
    assert 3.0 <= reflector_mod._retry_after(header) <= 3.6
    status = ApiError(504, "Gateway Timeout", json.dumps(
        {"kind": "Status", "code": 504, "details": {"retryAfterSeconds": 1}}))
    assert 1.0 <= reflector_mod._retry_after(status) <= 1.2
    assert reflector_mod._retry_after(ApiError(503, "Unavailable", "")) is None
    huge = ApiError(429, "Too Many Requests", "", {"retry-after": "86400"})
    assert reflector_mod._retry_after(huge) <= reflector_mod.RETRY_AFTER_MAX * 1.2


def test_the_default_silence_bound_is_past_the_servers_own_end():
    low, high = reflector_mod.WATCH_TIMEOUT_SECONDS
    assert low > 60  # the server's bookmark cadence
    assert reflector_mod.WATCH_SILENCE_MARGIN > 2  # its pre-timeout bookmark comes 2 s before


# ---- event framing --------------------------------------------------------------------------------

def _raw_watch_server(chunks: List[bytes]) -> Iterator[str]:
    """A real HTTP server on loopback answering one request with ``chunks`` as the HTTP/1.1
    chunks of a watch response (each in its own write); yields its kubeconfig's URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for chunk in chunks:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    thread.join(timeout=5)
    listener.close()


def test_events_are_framed_by_lines_whatever_the_chunks(tmp_path):
    events = [{"type": "ADDED", "object": {"metadata": {"name": f"n{i}", "namespace": NS,
                                                         "resourceVersion": str(10 + i)}}}
              for i in range(4)]
    lines = [json.dumps(event).encode() for event in events]
    chunks = [lines[0][:7], lines[0][7:] + b"\n" + lines[1][:30],  # split inside a line
              lines[1][30:] + b"\n",
              b"\n" + lines[2] + b"\n" + lines[3]]  # an empty line; the last one unterminated
    servers = _raw_watch_server(chunks)
    url = next(servers)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t0k3n-for-the-raw-server"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    config = ClientConfig(str(kubeconfig))
    try:
        response = config.transport.request("GET", NADS_PATH, query={"watch": True},
                                            timeout=5, stream=True)
        assert list(watch_events(response)) == events
        response.close()
    finally:
        config.close()
        next(servers, None)
