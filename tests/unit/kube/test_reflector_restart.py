"""multusd.kube.reflector through an API server's restart: a warm-up that answers 403, then
429, then 410 to every old version; and a watch's expiry, relisted at once.

Real reflectors (pods and NADs, one WatchState, as KubeClient runs them) over the stand-in
(tests/unit/kube/conftest.py). What they asked and how each request was answered (its status,
an ERROR event in its stream) is read off the stand-in's ledger (tests/kubeclients.py), in
order; what they waited off their one backoff's state. Nothing is timed by the wall clock:
bench/fleet.py --recovery measures how soon the nodes are back.
"""

from __future__ import annotations

from kubeapi import RBAC_USER
from multusd.kube.reflector import WATCHLIST_END_WAIT, YOUNG_WATCH
from multusd.kube.retries import API_SERVER
from multusd.kube.watchstream import WatchState
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'
WARM_UP, FORBIDDEN_FOR = 3.0, 1.5  # 403 for 1.5 s, then 429 "(re)initializing" for 1.5 s
REQUEST_TIMEOUT = 5.0  # the reflectors' (conftest's Running)
# main before issue 40, in this very shape: 3 list/watch requests per resource, at most 4
# (a 403, a 429 or two, a watch answered 410, the relist)
TODAYS_MOST = 4


def test_after_a_warm_up_that_expires_every_version_each_reflector_relists_once_when_ready(
        kube_api, run):
    kube_api.add_pod(NS, "web")
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    state = WatchState()
    pods, nads = run("pods", state=state), run("nads", state=state)
    assert pods.synced() and nads.synced() and kube_api.wait_for_watchers(2)
    # the cluster moves on: the new watch cache begins after every version the watches hold
    kube_api.add_pod(NS, "elsewhere", node="another-node")
    began = kube_api.clients.clock()
    kube_api.restart(new_watch_cache=True, warm_up=WARM_UP, forbidden_for=FORBIDDEN_FOR)
    ready = kube_api.ready_at
    # the work's own bound: the warm-up, the longest first step a starting answer is waited
    # on, the relist's head and its end bookmark
    bound = WARM_UP + 2 * API_SERVER.initial + REQUEST_TIMEOUT + WATCHLIST_END_WAIT
    wait_for(lambda: set(kube_api.clients.listed_since(RBAC_USER, ready)) == {"pods", "nads"}
             and kube_api.wait_for_watchers(2, timeout=0), timeout=bound,
             what="both resources listed and watched again after the warm-up")
    answers = kube_api.clients.answers(RBAC_USER, began)
    for kind, running in (("pods", pods), ("nads", nads)):
        mine = [(how.split()[1], status, error) for _, how, status, error in answers
                if how.startswith(kind + " ")]
        refused = mine[:-1]
        # every request the warming server refused, then one relist it served whole, from
        # the watch cache: no watch resumed from a version it no longer has (410), nothing
        # asked twice after it was ready
        assert refused and all(status in (403, 429) for _, status, _ in refused), mine
        assert mine[-1] == ("watchlist", 200, None), mine
        assert len(mine) <= TODAYS_MOST, mine
        delays = running.reflector.delays
        # the warm-up's answers were waited on the first step, never grown: only the cut
        # connection (and a refused one, if it came back late) stepped the curve
        assert delays.starts == len(refused)
        assert delays.failures == running.reopens("connection") >= 1
        assert running.reflector.version and state.synced[kind]


def test_a_watchs_expiry_is_relisted_at_once_and_again_only_after_a_working_watch(kube_api,
                                                                                   run):
    kube_api.watch_timeout_cap = YOUNG_WATCH + 1.0  # the server ends a watch that lived
    kube_api.add_nad(NS, "a", NAD_CONFIG)
    nads = run()
    assert nads.synced() and kube_api.wait_for_watchers(1)
    version = nads.reflector.version
    assert kube_api.expire_watches() == 1
    wait_for(lambda: len(nads.watch_lists()) == 2 and nads.synced(),
             timeout=REQUEST_TIMEOUT + WATCHLIST_END_WAIT, what="the relist, at once")
    assert nads.watch_lists()[1]["resourceVersion"] == version  # never back in time
    assert nads.reflector.delays.failures == 0  # no wait: the curve was not stepped
    assert kube_api.wait_for_watchers(1)
    # a second 410 before a watch worked (lived its YOUNG_WATCH): a failure, on the curve
    assert kube_api.expire_watches() == 1
    wait_for(lambda: len(nads.watch_lists()) == 3 and nads.synced(),
             timeout=2 * API_SERVER.initial + REQUEST_TIMEOUT + WATCHLIST_END_WAIT,
             what="the relist after the backoff's first step")
    assert nads.reflector.delays.failures == 1
    assert nads.reopens("expired") == 2 and len(nads.watches()) == 0
    # the server ends the watch after it lived: it worked, and the 410 of the watch resuming
    # from it is relisted at once again
    wait_for(lambda: nads.reopens("ended") == 1 and len(nads.watches()) == 1 and
             kube_api.wait_for_watchers(1, timeout=0),
             timeout=kube_api.watch_timeout_cap + REQUEST_TIMEOUT, what="the watch resumed")
    assert kube_api.expire_watches() == 1
    wait_for(lambda: len(nads.watch_lists()) == 4 and nads.synced(),
             timeout=REQUEST_TIMEOUT + WATCHLIST_END_WAIT, what="the relist, at once again")
    assert nads.reflector.delays.failures == 1 and nads.reopens("expired") == 3
