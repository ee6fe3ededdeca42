"""multusd.kube.reflector against the stand-in API server: WatchList, its fallbacks, watches.

Each test runs one real :class:`Reflector` thread over the real transport
(tests/unit/kube/conftest.py); what it asked for is read off the server's request log, what it
holds off its store. Nothing of ours is patched. The LIST path (a server that does not stream
lists) is in test_reflector_lists.py, what only a scripted server can stage in
test_reflector_stream.py.
"""

from __future__ import annotations

import json
import logging

from multusd.kube import reflector as reflector_mod
from multusd.kube import retries, watchstream
from multusd.kube.watchstream import WatchState
from multusd.kube.transport import ApiError
from testlib import wait_for


class FakeClock:
    """A clock the test moves (the backoff's state takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'
FALLBACK = "does not stream lists"  # the one log line of a fallback


# ---- WatchList: one request per resource, from the watch cache ----------------------------------

def test_the_first_sync_is_one_watch_list_from_the_watch_cache_that_goes_on_as_the_watch(
        kube_api, run):
    for index in range(3):
        kube_api.add_pod(NS, f"here-{index}")
    for index in range(20):
        kube_api.add_pod(NS, f"elsewhere-{index}", node="node-z")
    pods = run("pods")
    assert pods.synced()
    assert pods.names() == ["here-0", "here-1", "here-2"]
    [query] = pods.requests()
    assert (query["watch"], query["sendInitialEvents"], query["resourceVersionMatch"],
            query["resourceVersion"], query["allowWatchBookmarks"]) == \
        ("true", "true", "NotOlderThan", "0", "true")
    low, high = reflector_mod.WATCH_TIMEOUT_SECONDS
    assert low <= int(query["timeoutSeconds"]) <= high
    assert kube_api.count_list_reads("pods", "cache") == 1
    assert kube_api.count_list_reads("pods", "storage") == 0  # no etcd read of every pod
    assert pods.state.watch_list is True and pods.state.listed["pods"]
    added = kube_api.add_pod(NS, "here-3")
    wait_for(lambda: "here-3" in pods.names(), what="the pod by the same stream")
    assert len(pods.requests()) == 1
    assert pods.reflector.version == added["metadata"]["resourceVersion"]


def test_a_lagging_watch_cache_is_caught_up_by_the_stream_that_listed_it(kube_api, run):
    kube_api.add_nad(NS, "old", NAD_CONFIG)
    kube_api.add_nad(NS, "deleted-later", NAD_CONFIG)
    held = kube_api.hold_watch_cache()
    kube_api.add_nad(NS, "newer", NAD_CONFIG)  # etcd has it; the cache does not yet
    kube_api.delete_nad(NS, "deleted-later")
    nads = run()
    assert nads.synced()
    assert nads.names() == ["deleted-later", "old"]  # the cache's older state, as streamed
    assert nads.reflector.version == str(held)
    kube_api.release_watch_cache()
    wait_for(lambda: nads.names() == ["newer", "old"], what="the stream to deliver the gap")
    assert len(nads.requests()) == 1


def test_a_relist_streams_the_cache_at_the_last_version_and_drops_deletions(kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.add_nad(NS, "c", NAD_CONFIG)
    wait_for(lambda: "c" in nads.names(), what="c by watch")
    seen = nads.reflector.version
    kube_api.hold_watch_cache()  # the open watch sees nothing newer
    kube_api.delete_nad(NS, "a")
    kube_api.fail_next("GET", nads.path, 503, times=None, watch=True)  # relists fail for now
    assert kube_api.expire_watches() == 1  # ERROR 410: history compacted
    wait_for(lambda: len(nads.watch_lists()) >= 2, what="a relist that failed")
    with nads.state.cond:  # the old cache, as it was, and known stale, until a state replaces it
        assert not nads.state.synced["nads"] and nads.state.listed["nads"]
    assert nads.names() == ["a", "b", "c"]
    kube_api.release_watch_cache()
    kube_api.clear_failures()
    wait_for(lambda: nads.names() == ["b", "c"] and nads.state.synced["nads"], timeout=15,
             what="the relist")
    assert {q["resourceVersion"] for q in nads.watch_lists()[1:]} == {seen}
    assert all(q["resourceVersionMatch"] == "NotOlderThan" for q in nads.watch_lists())
    assert nads.lists() == [] and kube_api.count_list_reads("nads", "storage") == 0
    assert nads.reopens("expired") == 1 and nads.state.relists["nads"] == 1


def test_too_large_in_the_watch_lists_consistently(kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.add_nad(NS, "b", NAD_CONFIG)
    wait_for(lambda: "b" in nads.names(), what="b by watch")
    kube_api.stop()
    kube_api.delete_nad(NS, "a")
    kube_api.restart(lose_history=True)  # versions restart below the reflector's
    wait_for(lambda: nads.names() == ["b"], timeout=15, what="the consistent list")
    [consistent] = nads.lists()
    assert "resourceVersion" not in consistent and \
        consistent["limit"] == str(reflector_mod.LIST_PAGE)
    assert kube_api.count_list_reads("nads", "storage") == 1
    assert nads.reopens("expired") == 1
    kube_api.add_nad(NS, "c", NAD_CONFIG)  # and the watch goes on from the new history
    wait_for(lambda: nads.names() == ["b", "c"], what="c by watch")
    assert len(nads.watch_lists()) == 1 and nads.state.watch_list is True


# ---- servers that do not stream lists: LIST then WATCH, for the life of the process -------------

def _falls_back_for_good(kube_api, run, caplog, **options) -> None:
    """The first sync costs one WatchList; the fallback lists and watches; the other reflector
    of the same client and every relist never ask again; it is logged once."""
    caplog.set_level(logging.INFO, logger="multusd.kube.reflector")
    kube_api.add_pod(NS, "here")
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    state = WatchState(kinds=("pods", "nads"))
    pods = run("pods", state=state, **options)
    assert pods.synced() and pods.names() == ["here"]
    assert len(pods.watch_lists()) == 1 and state.watch_list is False
    first = pods.lists()[0]
    assert first["resourceVersion"] == "0" and first["limit"] == str(reflector_mod.LIST_PAGE)
    wait_for(lambda: pods.watches(), what="the watch from the list's version")
    nads = run("nads", state=state, **options)
    assert nads.synced() and nads.names() == ["a"] and nads.watch_lists() == []
    wait_for(lambda: nads.watches(), what="the NAD watch")
    kube_api.stop()  # back with a compacted history: both watches get 410 and relist
    kube_api.add_pod(NS, "elsewhere", node="node-z")
    kube_api.compact()
    kube_api.start()
    wait_for(lambda: len(pods.lists()) == 2 and len(nads.lists()) == 2, timeout=15,
             what="both relisted")
    assert len(pods.watch_lists()) == 1 and nads.watch_lists() == []
    assert kube_api.count_list_reads("pods", "storage") == 0
    assert len([r for r in caplog.records if FALLBACK in r.getMessage()]) == 1


def test_a_server_with_its_watch_list_gate_off_is_listed_then_watched(kube_api, run, caplog):
    kube_api.watch_list = "refused"  # 422 Invalid: sendInitialEvents: Forbidden
    _falls_back_for_good(kube_api, run, caplog)
    [line] = [r.getMessage() for r in caplog.records if FALLBACK in r.getMessage()]
    assert "422" in line and "WatchList feature gate" in line


def test_a_server_whose_etcd_cannot_answer_progress_requests_is_listed_then_watched(
        kube_api, run, caplog):
    kube_api.watch_list = "no-progress"  # 200, one ERROR event 500
    _falls_back_for_good(kube_api, run, caplog)
    [line] = [r.getMessage() for r in caplog.records if FALLBACK in r.getMessage()]
    assert "500" in line and "RequestWatchProgress" in line


def test_a_server_that_ignores_watch_list_is_listed_once_its_end_bookmark_is_overdue(
        kube_api, run, caplog):
    kube_api.watch_list = "ignored"  # a plain watch from 0: every object ADDED, no end
    _falls_back_for_good(kube_api, run, caplog, list_end_wait=0.3)
    [line] = [r.getMessage() for r in caplog.records if FALLBACK in r.getMessage()]
    assert "ignores sendInitialEvents" in line


# ---- watches: resumed from the last version, bookmarks, error events -----------------------------

def test_bookmarks_advance_the_version_the_next_watch_resumes_from(kube_api, run):
    kube_api.bookmark_interval = 0.2
    pods = run("pods")
    assert pods.synced() and kube_api.wait_for_watchers(1)
    other = kube_api.add_pod(NS, "elsewhere", node="node-z")  # no event for this node's watch
    version = other["metadata"]["resourceVersion"]
    wait_for(lambda: pods.reflector.version == version, what="a bookmark with its version")
    kube_api.restart()  # cut: the next watch resumes from the bookmark's version
    wait_for(lambda: pods.watches(), timeout=15, what="the next watch")
    assert pods.watches()[0]["resourceVersion"] == version
    assert len(pods.watch_lists()) == 1 and pods.lists() == []


def test_a_watch_the_server_ends_is_resumed_without_a_relist(kube_api, run):
    kube_api.watch_timeout_cap = 1.5  # the server ends each watch after 1.5 s
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced()
    wait_for(lambda: len(nads.watches()) >= 2, timeout=15, what="two watches ended")
    assert nads.reopens("ended") >= 2 and len(nads.watch_lists()) == 1 and nads.lists() == []
    assert {q["resourceVersion"] for q in nads.watches()} == {nads.reflector.version}
    assert all(q["allowWatchBookmarks"] == "true" for q in nads.requests())


def test_an_error_event_relists(kube_api, run):
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    seen = nads.reflector.version
    assert kube_api.fail_watches(500, "InternalError", "etcd watch channel closed") == 1
    wait_for(lambda: len(nads.watch_lists()) == 2, what="the relist")
    assert nads.watch_lists()[1]["resourceVersion"] == seen
    assert nads.reopens("error") == 1 and nads.state.watch_list is True
    wait_for(lambda: nads.state.errors["nads"] is None, what="the error to clear")


def test_a_watch_the_server_refuses_with_retry_after_waits_that_long_then_relists(kube_api,
                                                                                  run):
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    kube_api.watch_cache_ready = False  # watches answered 429 with Retry-After: 1
    kube_api.restart()
    wait_for(lambda: nads.watches(), what="the refused watch")
    kube_api.watch_cache_ready = True
    # a cache "(re)initializing" is a new one: it does not hold the version to resume from
    wait_for(lambda: len(nads.watch_lists()) >= 2, what="the relist after Retry-After")
    refused = [at for at, kind, watch in kube_api.read_log if watch][0]
    relisted = [at for at, kind, watch in kube_api.read_log if not watch][1]
    assert relisted - refused >= 1.0  # not sooner than the server asked (as it saw them)
    assert nads.reopens("error") == 1 and len(nads.watches()) == 1


def test_an_outage_steps_the_one_backoff_and_the_first_answer_does_not_reset_it(kube_api, run):
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    delays = nads.reflector.delays
    assert delays.failures == 0
    kube_api.stop()  # the watch is cut, then every attempt is refused
    wait_for(lambda: delays.failures >= 3, timeout=15, what="failures to step the curve")
    kube_api.start()
    assert kube_api.wait_for_watchers(1, timeout=30)
    # the server answers again: the curve stays where the outage left it (only calm resets it)
    assert delays.failures >= 3 and not delays.calm()
    assert nads.reopens("connection") >= 3
    assert len(nads.watch_lists()) == 1 and nads.lists() == []


def test_a_silent_stream_is_resumed_from_its_version(kube_api, run):
    nads = run(watch_idle=0.5)
    assert nads.synced() and kube_api.wait_for_watchers(1)
    version = nads.reflector.version
    kube_api.blackhole()
    try:
        wait_for(lambda: nads.reopens("silence") >= 1, what="the silence")
    finally:
        kube_api.blackhole(False)
    wait_for(lambda: nads.watches(), what="the resumed watch")
    assert nads.watches()[-1]["resourceVersion"] == version
    assert len(nads.watch_lists()) == 1 and nads.lists() == []


def test_the_reflectors_backoff_is_client_gos_curve_reset_only_by_calm():
    clock = FakeClock()
    delays = retries.API_SERVER.delays(clock=clock)
    steps = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    for step in steps:
        wait = delays.next()
        assert step <= wait < 2 * step  # jitter 1.0: each wait in [d, 2d)
        clock.now += min(wait + 50.0, 119.0)  # then an answer, a watch that lived: not calm
    last = clock.now
    assert 30.0 <= delays.next() < 60.0
    clock.now = last + retries.API_SERVER.calm - 1.0  # 119 s after the last failure
    assert not delays.calm() and 30.0 <= delays.next() < 60.0
    clock.now += retries.API_SERVER.calm  # two minutes with no failure: the curve starts again
    assert delays.calm() and 0.8 <= delays.next() < 1.6
    waits = {round(retries.API_SERVER.delays().next(), 6) for _ in range(50)}
    assert len(waits) > 10  # jittered: the nodes of a cluster spread out


def test_retry_after_comes_from_the_header_or_the_status():
    header = ApiError(429, "Too Many Requests", "{}", {"Retry-After": "3"})
    assert 3.0 <= watchstream.retry_after(header) <= 3.6
    status = ApiError(504, "Gateway Timeout", json.dumps(
        {"kind": "Status", "code": 504, "details": {"retryAfterSeconds": 1}}))
    assert 1.0 <= watchstream.retry_after(status) <= 1.2
    assert watchstream.retry_after(ApiError(503, "Unavailable", "")) is None
    huge = ApiError(429, "Too Many Requests", "", {"retry-after": "86400"})
    assert watchstream.retry_after(huge) <= watchstream.RETRY_AFTER_MAX * 1.2


def test_the_default_silence_bound_is_past_the_servers_own_end():
    low, high = reflector_mod.WATCH_TIMEOUT_SECONDS
    assert low > 60  # the server's bookmark cadence
    assert reflector_mod.WATCH_SILENCE_MARGIN > 2  # its pre-timeout bookmark comes 2 s before
