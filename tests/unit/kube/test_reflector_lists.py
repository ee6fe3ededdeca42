"""multusd.kube.reflector against a server that does not stream lists: LIST, then WATCH.

The stand-in refuses WatchList here as a server with its WatchList gate off does (422), so
every test also shows the fallback: after that one refusal, lists and watches only. Each test
runs one real :class:`Reflector` thread over the real transport (tests/unit/kube/conftest.py);
what it asked for is read off the server's request log, what it holds off its store.
"""

from __future__ import annotations

import pytest

from multusd.kube import reflector as reflector_mod
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'


@pytest.fixture(autouse=True)
def no_watch_list(kube_api) -> None:
    kube_api.watch_list = "refused"


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
    assert len(pods.watch_lists()) == 1 and pods.state.watch_list is False  # refused once


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
    assert len(nads.watch_lists()) == 1  # the refusal is remembered: no WatchList again


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
