"""multusd.kube.reflector: every kind of failure steps the one backoff, and only calm resets it.

A raw HTTP/1.1 server on loopback answers every request the same way for a kind of failure
(by what the request asks: a WatchList, a LIST, a plain watch); a real :class:`Reflector`
over the real transport runs its rounds one by one in the test's thread, and its one
:class:`~multusd.kube.retries.Delays` runs on a clock the test moves by each wait, as
:meth:`Reflector.run` would have waited it. What is asserted: the waits follow client-go's
curve whatever the failure and whatever came before it (a whole WatchList, an answer), what
each next request asks for, and that a storm of ERROR events at the stand-in costs a handful
of requests.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple
from urllib.parse import parse_qs, urlsplit

import pytest

from multusd.kube import failures
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import NADS_PATH, nad_from_object
from multusd.kube.reflector import YOUNG_WATCH, Reflector
from multusd.kube.retries import API_SERVER
from multusd.kube.watchstream import WatchState
from testlib import token_kubeconfig, wait_for

NS = "default"
STEPS = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]  # client-go's reflector: 0.8 s doubling to 30 s
Answer = Tuple[str, Any]  # ("status", (code, reason, details)), ("events", [...]), ("list", {..})


def nad(name: str, version: int) -> Dict[str, Any]:
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(version)},
            "spec": {"config": '{"cniVersion":"1.0.0","name":"n","type":"bridge"}'}}


def event(etype: str, obj: Dict[str, Any]) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode() + b"\n"


def status(code: int, reason: str, message: str, **details: Any) -> Dict[str, Any]:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}
    if details:
        body["details"] = details
    return body


def end_of_initial_events(version: int) -> bytes:
    return event("BOOKMARK", {"kind": "NetworkAttachmentDefinition", "metadata": {
        "resourceVersion": str(version), "annotations": {"k8s.io/initial-events-end": "true"}}})


def nad_list(version: int) -> Dict[str, Any]:
    return {"kind": "NetworkAttachmentDefinitionList", "metadata": {"resourceVersion":
                                                                    str(version)},
            "items": [nad("b", version - 1)]}


LEADER_CHANGED = status(500, "InternalError",
                        "Internal error occurred: etcdserver: leader changed")
EXPIRED = status(410, "Expired", "too old resource version: 5 (9)")
TOO_LARGE = status(504, "Timeout", "Timeout: Too large resource version: 50, current: 7",
                   causes=[{"reason": "ResourceVersionTooLarge"}], retryAfterSeconds=1)
SYNCED = [event("ADDED", nad("a", 4)), end_of_initial_events(5)]  # a whole WatchList


def watch_list(query: Dict[str, str]) -> bool:
    return query.get("sendInitialEvents") == "true"


def watch(query: Dict[str, str]) -> bool:
    return query.get("watch") == "true" and not watch_list(query)


# kind -> how the server answers a request (by its query); every round the reflector makes
# against it fails, except where a failure needs a healthy round before it (a young watch)
KINDS: Dict[str, Callable[[Dict[str, str]], Answer]] = {
    "429": lambda q: ("status", status(429, "TooManyRequests", "slow down")),
    "500": lambda q: ("status", status(500, "InternalError", "etcd is unhappy")),
    "event-500": lambda q: ("events", SYNCED + [event("ERROR", LEADER_CHANGED)]),
    "event-410": lambda q: ("events", SYNCED + [event("ERROR", EXPIRED)]),
    "410-at-relist": lambda q: (
        ("events", SYNCED + [event("ERROR", EXPIRED)]) if q.get("resourceVersion") == "0" else
        ("events", [event("ERROR", EXPIRED)]) if watch_list(q) or watch(q) else
        ("list", nad_list(7))),
    "too-large": lambda q: (
        ("events", SYNCED + [event("ERROR", TOO_LARGE)]) if watch_list(q) else
        ("events", [event("ERROR", TOO_LARGE)]) if watch(q) else ("list", nad_list(7))),
    "young-end": lambda q: ("events", SYNCED if watch_list(q) else []),
    # a server (or proxy) that ends every watch right after its first event: news, then the end
    "early-end": lambda q: ("events", SYNCED if watch_list(q) else [event("BOOKMARK", {
        "kind": "NetworkAttachmentDefinition", "metadata": {"resourceVersion": "6"}})]),
    "unfinished": lambda q: ("events", [event("ADDED", nad("a", 4))]),
    "no-watch-list": lambda q: (
        ("status", status(422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: "
                          "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for "
                          "watch unless the WatchList feature gate is enabled"))
        if watch_list(q) else ("status", status(500, "InternalError", "etcd is unhappy"))),
    "malformed": lambda q: ("events", [b"{this is not json\n"]),
}
EXPECTED = {  # the kinds of failure each server makes a round end in
    "refused": {failures.UNREACHABLE}, "429": {failures.ANSWERED},
    "500": {failures.ANSWERED}, "event-500": {failures.EVENT},
    "event-410": {failures.EXPIRED}, "410-at-relist": {failures.EXPIRED},
    "too-large": {failures.TOO_LARGE}, "young-end": {failures.YOUNG},
    "early-end": {failures.YOUNG},
    "unfinished": {failures.UNFINISHED},
    "no-watch-list": {failures.NO_WATCH_LIST, failures.ANSWERED},
    "malformed": {failures.MALFORMED},
}


class Server:
    """Answers every request (each on a connection of its own) by ``answer(query)``."""

    def __init__(self, answer: Callable[[Dict[str, str]], Answer]) -> None:
        self.answer = answer
        self.queries: List[Dict[str, str]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            target = head.split(b" ")[1].decode()
            query = {k: v[-1] for k, v in parse_qs(urlsplit(target).query).items()}
            self.queries.append(query)
            form, what = self.answer(query)
            try:
                if form == "events":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for line in what:
                        conn.sendall(b"%x\r\n%s\r\n" % (len(line), line))
                    conn.sendall(b"0\r\n\r\n")
                    return
                body = json.dumps(what).encode()
                code = what.get("code", 200) if form == "status" else 200
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: "
                             b"close\r\nContent-Length: %d\r\n\r\n%s" % (code, len(body), body))
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def refused_url() -> str:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: every connection is refused
    return f"http://127.0.0.1:{port}"


def config_for(tmp_path, url: str) -> ClientConfig:
    return ClientConfig(token_kubeconfig(tmp_path / "kubeconfig", "t0k3n-for-the-backoff-table",
                                         server=url))


@pytest.fixture
def reflector_for(tmp_path) -> Iterator[Any]:
    """``reflector_for(url)``: a Reflector (not running) whose one backoff runs on a fake
    clock; its transport is closed at the end."""
    made: List[ClientConfig] = []

    def make(url: str) -> Tuple[Reflector, FakeClock]:
        config = config_for(tmp_path, url)
        made.append(config)

        def send(extra: Dict[str, Any], timeout: float, read_timeout: Any) -> Any:
            return config.transport.request("GET", NADS_PATH, query=extra, timeout=timeout,
                                            read_timeout=read_timeout, stream=True)

        clock = FakeClock()
        reflector = Reflector(WatchState(kinds=("nads",)), "nads", "nads", send, nad_from_object,
                              {}, config, 5.0, None, 2.0, delays=API_SERVER.delays(clock=clock))
        return reflector, clock

    yield make
    for config in made:
        config.close()


def failed_rounds(reflector: Reflector, clock: FakeClock, count: int,
                  at_once: bool = False) -> List[Tuple[str, float]]:
    """Run rounds until ``count`` failed; each failure's (kind, wait), the clock moved by
    each wait as if it had been waited. A watch's expiry relisted at once (no wait) is not
    counted, unless ``at_once``."""
    seen: List[Tuple[str, float]] = []
    for _ in range(3 * count):
        outcome = reflector.round()
        if outcome.failure is None:
            continue  # a watch that ended as it should: the next one at once, no wait
        wait = reflector.wait_after(outcome)  # what run() waits: the one call
        if outcome.at_once and not at_once:
            continue  # the relist of an expiry after a working watch: at once, no wait
        seen.append((outcome.failure, wait))
        clock.now += wait
        if len(seen) == count:
            return seen
    raise AssertionError(f"only {len(seen)} of {count} rounds failed: {seen}")


@pytest.mark.parametrize("kind", ["refused"] + list(KINDS))
def test_every_failure_steps_the_one_backoff_and_only_calm_resets_it(kind, reflector_for):
    server = None if kind == "refused" else Server(KINDS[kind])
    try:
        reflector, clock = reflector_for(refused_url() if server is None else server.url)
        seen = failed_rounds(reflector, clock, len(STEPS))
        assert {failure for failure, _ in seen} <= EXPECTED[kind], seen
        for (_, wait), step in zip(seen, STEPS):
            assert step <= wait < 2 * step, (kind, seen)
        # 119 s after the last failure (the clock was moved by its wait): not calm yet
        clock.now += API_SERVER.calm - 1.0 - seen[-1][1]
        [(_, wait)] = failed_rounds(reflector, clock, 1)
        assert 30.0 <= wait < 60.0
        clock.now += API_SERVER.calm  # two minutes without a failure: from the start again
        [(_, wait)] = failed_rounds(reflector, clock, 1)
        assert 0.8 <= wait < 1.6
    finally:
        if server is not None:
            server.close()


def test_a_410_at_a_relist_is_never_asked_again_but_listed_from_the_current_state(
        reflector_for):
    server = Server(KINDS["410-at-relist"])
    try:
        reflector, clock = reflector_for(server.url)
        failed_rounds(reflector, clock, 6)
        asked = [(q.get("sendInitialEvents") == "true", q.get("watch") == "true",
                  q.get("resourceVersion")) for q in server.queries]
        assert asked[:2] == [(True, True, "0"), (True, True, "5")]  # the relist at 5: 410
        for before, after in zip(asked, asked[1:]):
            if before[0] and before[2] != "0":  # a relist at a known version answered 410 ...
                assert after == (False, False, None)  # ... is followed by a consistent LIST
        assert all(not (a[0] and a == b) for a, b in zip(asked, asked[1:]))
    finally:
        server.close()


def test_a_refused_watch_list_is_asked_once_and_the_list_follows_after_the_wait(reflector_for):
    server = Server(KINDS["no-watch-list"])
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 3)
        assert [kind for kind, _ in seen] == [failures.NO_WATCH_LIST, failures.ANSWERED,
                                              failures.ANSWERED]
        assert reflector.state.watch_list is False
        assert [q.get("watch") for q in server.queries] == ["true", None, None]  # then LISTs
    finally:
        server.close()


def test_retry_after_is_a_floor_under_the_curve(reflector_for):
    server = Server(lambda q: ("events", SYNCED + [event("ERROR", status(
        429, "TooManyRequests", "slow down", retryAfterSeconds=7))]))
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 5)
        for (_, wait), step in zip(seen, STEPS):
            assert max(step, 7.0) <= wait < max(2 * step, 7.0 * 1.2 + 1e-9)
    finally:
        server.close()


def test_an_error_storm_costs_a_handful_of_requests_then_the_watch_is_back(kube_api, run):
    """The stand-in's ERROR storm against a running reflector: its WatchLists deliver the
    whole state, then end in ERROR 500; it relists only as the curve lets it."""
    kube_api.add_nad(NS, "a", '{"cniVersion":"1.0.0","name":"a","type":"bridge"}')
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    started = kube_api.storm_errors
    until = kube_api.error_storm(5.0)
    wait_for(lambda: kube_api.storm_errors > started, what="a WatchList ended by the storm")
    wait_for(lambda: time.monotonic() > until and kube_api.wait_for_watchers(1, timeout=0),
             timeout=40, what="the watch open again after the storm")
    # 0.8-1.6 s, then 1.6-3.2, then 3.2-6.4 s: at most 3 WatchLists in 5 s (main: thousands)
    assert kube_api.count_list_watch("nads", since=until - 5.0, until=until) <= 3
    assert nads.reflector.delays.failures >= 2 and nads.state.synced["nads"]
    kube_api.add_nad(NS, "b", '{"cniVersion":"1.0.0","name":"b","type":"bridge"}')
    wait_for(lambda: nads.names() == ["a", "b"], what="b by the watch after the storm")


def test_a_readers_wake_up_ends_one_wait_per_run_of_failures(reflector_for):
    """A reader that found the API answering (KubeClient._wake_nads) may cut one wait short;
    however often it says so, the next waits are the curve's until calm starts a new run."""
    reflector, clock = reflector_for(refused_url())
    wake = reflector.state.wake["nads"]

    def pause() -> threading.Thread:
        wake.set()  # from before the failure: the pause clears it as it begins
        thread = threading.Thread(target=reflector._pause, args=(600.0,), daemon=True)
        thread.start()
        wait_for(lambda: not wake.is_set(), what="the pause to begin")
        return thread

    reflector.delays.next()  # a failure: a run begins
    first = pause()
    wake.set()
    first.join(10)
    assert not first.is_alive()  # ended early: the one wake-up of this run
    reflector.delays.next()  # the attempt it let through failed as well
    second = pause()
    for _ in range(3):
        wake.set()
        wait_for(lambda: not wake.is_set(), what="the wake-up to be read")
    second.join(1.0)
    assert second.is_alive()  # read, and not obeyed: the curve's wait goes on
    reflector.state.stop()
    second.join(10)
    assert not second.is_alive()  # stopping ends every wait
    clock.now += API_SERVER.calm  # calm: the next failure begins a new run, with one wake-up
    reflector.state.stopping.clear()
    reflector.delays.next()
    third = pause()
    wake.set()
    third.join(10)
    assert not third.is_alive()


# ---- a watch's expiry: relisted at once, once per working watch ----------------------------------

def test_a_watchs_expiry_is_relisted_at_once_and_a_server_expiring_all_is_on_the_curve(
        reflector_for):
    """Every WatchList delivers the state, then its watch gets ERROR 410: the first 410 is
    relisted at once (from the version it had), every later one (no watch worked between
    them) steps the curve: a server answering 410 to everything makes no loop."""
    server = Server(KINDS["event-410"])
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 1 + len(STEPS), at_once=True)
        assert seen[0] == (failures.EXPIRED, 0.0)
        for (kind, wait), step in zip(seen[1:], STEPS):
            assert kind == failures.EXPIRED and step <= wait < 2 * step, seen
        asked = [(q.get("sendInitialEvents"), q.get("resourceVersion")) for q in server.queries]
        assert asked[:2] == [("true", "0"), ("true", "5")]  # the relist: at the version it had
    finally:
        server.close()


def test_a_relist_at_once_that_fails_steps_the_curve(reflector_for):
    server = Server(lambda q: ("events", SYNCED + [event("ERROR", EXPIRED)])
                    if q.get("resourceVersion") == "0" else
                    ("status", status(500, "InternalError", "etcd is unhappy")))
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 4, at_once=True)
        assert seen[0] == (failures.EXPIRED, 0.0)
        for (kind, wait), step in zip(seen[1:], STEPS):
            assert kind == failures.ANSWERED and step <= wait < 2 * step, seen
        assert all(q.get("sendInitialEvents") == "true" for q in server.queries)  # relists
    finally:
        server.close()


def slow_watch_list(query: Dict[str, str]) -> Iterator[bytes]:
    """A relist's WatchList that streams its state for longer than YOUNG_WATCH (an ADDED
    event every half second, each well within the end wait of the last), then its end
    bookmark, then ERROR 410 at once: the watch after it never followed a change."""
    began = time.monotonic()
    while time.monotonic() - began < YOUNG_WATCH + 1.0:
        yield event("ADDED", nad("a", 4))
        time.sleep(0.5)  # the server's pace: how slowly it streams, not a synchronisation
    yield end_of_initial_events(6)
    yield event("ERROR", EXPIRED)


def test_a_relist_that_streams_long_then_expires_is_not_a_working_watch(reflector_for):
    """The at-once allowance is spent on the first 410; the relist streams its state for
    longer than YOUNG_WATCH and its watch is answered 410 right after the end bookmark:
    no watch followed changes in between, so that 410 steps the curve (a relist at once
    every time the state took that long to stream would be a loop of whole lists)."""
    server = Server(lambda q: ("events", SYNCED + [event("ERROR", EXPIRED)])
                    if q.get("resourceVersion") == "0" else ("events", slow_watch_list(q)))
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 2, at_once=True)
        assert seen[0] == (failures.EXPIRED, 0.0)
        kind, wait = seen[1]
        assert kind == failures.EXPIRED and STEPS[0] <= wait < 2 * STEPS[0], seen
        assert [q.get("resourceVersion") for q in server.queries] == ["0", "5"]
    finally:
        server.close()


def test_a_retry_after_that_is_no_number_is_no_wait_and_the_round_still_ends(reflector_for):
    """A 429 whose Status asks for "2²" seconds (a proxy's, a broken server's): read as no
    Retry-After, the round a failure as any; the exception it raised ended the reflector's
    thread (the caches were never updated again)."""
    server = Server(lambda q: ("status", status(429, "TooManyRequests", "slow down",
                                                retryAfterSeconds="2\u00b2")))
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 2)
        assert [kind for kind, _ in seen] == [failures.ANSWERED] * 2
        for (_, wait), step in zip(seen, STEPS):
            assert step <= wait < 2 * step, seen
    finally:
        server.close()


# ---- a server that is starting: its first step, for ten answers per run -----------------------

INITIALIZING = status(429, "TooManyRequests", "storage is (re)initializing", retryAfterSeconds=1)


def test_a_watch_cache_initialising_is_asked_after_its_retry_after_ten_times_per_run(
        reflector_for):
    server = Server(lambda q: ("status", INITIALIZING))
    try:
        reflector, clock = reflector_for(server.url)
        allowance = API_SERVER.starting
        seen = failed_rounds(reflector, clock, allowance + 4)
        assert all(kind == failures.STARTING for kind, _ in seen[:allowance]), seen
        assert all(1.0 <= wait < 1.2 for _, wait in seen[:allowance]), seen  # not grown
        # still initialising after ten: on the curve, from its start (the answers did not grow it)
        for (_, wait), step in zip(seen[allowance:], STEPS):
            assert max(step, 1.0) <= wait < 2 * step, seen
        clock.now += API_SERVER.calm + 1.0  # calm: a new run, ten on the first step again
        [(_, wait)] = failed_rounds(reflector, clock, 1)
        assert 1.0 <= wait < 1.2 and reflector.delays.failures == 0
    finally:
        server.close()


def test_a_403_to_what_was_served_is_a_server_starting_until_it_lasts(reflector_for, caplog):
    """The server streamed the state once, then ends the watch with an ERROR event and
    answers 403 to everything: ten answers on the first step (logged as a server starting,
    each a relist), then the refusal it is: a warning naming the fix, the curve growing."""
    server = Server(lambda q: ("events", SYNCED + [event("ERROR", LEADER_CHANGED)])
                    if q.get("resourceVersion") == "0" else
                    ("status", status(403, "Forbidden", 'network-attachment-definitions is '
                                      'forbidden: User "system:node:n1" cannot watch resource')))
    try:
        reflector, clock = reflector_for(server.url)
        caplog.set_level(logging.INFO, logger="multusd.kube.reflector")
        allowance = API_SERVER.starting
        seen = failed_rounds(reflector, clock, 1 + allowance + 3)
        assert seen[0][0] == failures.EVENT and 0.8 <= seen[0][1] < 1.6
        assert [kind for kind, _ in seen[1:1 + allowance]] == [failures.STARTING] * allowance
        assert all(0.8 <= wait < 1.6 for _, wait in seen[1:1 + allowance]), seen
        assert [kind for kind, _ in seen[1 + allowance:]] == [failures.ANSWERED] * 3
        for (_, wait), step in zip(seen[1 + allowance:], STEPS[1:]):  # growing from the EVENT
            assert step <= wait < 2 * step, seen
        assert all(q.get("sendInitialEvents") == "true" for q in server.queries)  # relists
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.WARNING and "403" in r.getMessage()]
        assert len(warnings) == 1 and "forbids it (403" in warnings[0], warnings
        assert "rbac" in warnings[0].lower()  # the fix, once the refusal lasts
        infos = [r.getMessage() for r in caplog.records if "starting up" in r.getMessage()]
        assert len(infos) == 1  # said once, then quietly
    finally:
        server.close()


def test_a_403_to_what_was_never_served_is_a_refusal_from_the_start(reflector_for):
    server = Server(lambda q: ("status", status(403, "Forbidden", "forbidden")))
    try:
        reflector, clock = reflector_for(server.url)
        seen = failed_rounds(reflector, clock, 3)
        assert [kind for kind, _ in seen] == [failures.ANSWERED] * 3
        for (_, wait), step in zip(seen, STEPS):
            assert step <= wait < 2 * step, seen
    finally:
        server.close()
