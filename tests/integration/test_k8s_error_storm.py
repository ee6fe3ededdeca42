"""An ERROR storm: every watch ends with an ERROR event for a while (etcd changing leader).

First what the stand-in does during one (tests/kubecache.py's :meth:`error_storm`), then what a
node does: a bounded number of requests per resource, and after the storm open watches and a
working ADD.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid

import pytest

from harness import Cluster, watch_bound
from kubecache import LEADER_CHANGED
from multusd.wire import api
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"0.4.0","name":"storm-net","type":"bridge"}'
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


def watch_events(kube_api, query: str):
    request = urllib.request.Request(kube_api.url + NADS + "?" + query,
                                     headers={"Authorization": f"Bearer {kube_api.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]


def test_during_a_storm_every_watch_delivers_its_news_then_ends_with_an_error(kube_api):
    kube_api.add_nad(NS, "storm-net", NAD_CONFIG)
    version = kube_api.add_nad(NS, "later-net", NAD_CONFIG)["metadata"]["resourceVersion"]
    kube_api.error_storm(60)
    watch_list = watch_events(kube_api, "watch=true&sendInitialEvents=true&allowWatchBookmarks"
                                        "=true&resourceVersionMatch=NotOlderThan"
                                        "&resourceVersion=0&timeoutSeconds=30")
    assert [e["type"] for e in watch_list] == ["ADDED", "ADDED", "BOOKMARK", "ERROR"]
    status = watch_list[-1]["object"]
    assert (status["code"], status["reason"], status["message"]) == \
        (500, "InternalError", LEADER_CHANGED)
    replay = watch_events(kube_api, f"watch=true&allowWatchBookmarks=true&resourceVersion="
                                    f"{int(version) - 1}&timeoutSeconds=30")
    assert [e["type"] for e in replay] == ["ADDED", "ERROR"]
    assert replay[0]["object"]["metadata"]["name"] == "later-net"
    quiet = watch_events(kube_api, f"watch=true&allowWatchBookmarks=true&resourceVersion="
                                   f"{version}&timeoutSeconds=30")
    assert [e["type"] for e in quiet] == ["BOOKMARK", "ERROR"]
    assert kube_api.storm_errors == 3
    assert kube_api.count_list_watch("nads") == 3
    assert kube_api.count_list_watch("nads", how="watchlist") == 1
    assert kube_api.count_list_watch("pods") == 0
    kube_api.end_error_storm()
    assert [e["type"] for e in watch_events(kube_api, f"watch=true&resourceVersion={version}"
                                                      "&timeoutSeconds=1")] == []


def test_a_storm_ends_the_watches_open_when_it_begins(kube_api):
    got = []
    reader = threading.Thread(target=lambda: got.extend(watch_events(
        kube_api, "watch=true&resourceVersion=1&timeoutSeconds=30")), daemon=True)
    reader.start()
    assert kube_api.wait_for_watchers(1)
    kube_api.error_storm(5, code=500, message="etcd watch channel closed")
    reader.join(10)
    assert not reader.is_alive()
    assert [e["type"] for e in got] == ["ERROR"]
    assert got[0]["object"]["message"] == "etcd watch channel closed"


STORM = 20.0  # seconds of watches ending in ERROR events
MOST_PER_RESOURCE = 6  # list/watch requests per resource the storm may cost (upstream: 5)


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_a_daemon_under_an_error_storm_asks_a_handful_then_recovers_and_serves(
        sandbox, kube_api, tmp_path):
    """20 s of watches that end in ERROR 500 after their news (etcd changing leader): the
    daemon's two reflectors step one backoff each, so each resource costs the server a handful
    of requests (main: thousands); after the storm both watches are open again and an ADD
    with a NAD works."""
    for index in range(20):
        kube_api.add_pod("default", f"elsewhere-{index}", node="node-z")
    cluster = Cluster(sandbox, kube_api, tmp_path)
    cluster.nad("storm-net", "10.86.0.0/24")
    cluster.start()  # waits for /readyz
    assert kube_api.wait_for_watchers(2)
    began = time.monotonic()
    until = kube_api.error_storm(STORM)
    wait_for(lambda: time.monotonic() >= until, STORM + 10, what="the storm to pass")
    asked = {kind: kube_api.count_list_watch(kind, began, until) for kind in ("pods", "nads")}
    assert all(1 <= count <= MOST_PER_RESOURCE for count in asked.values()), asked
    # after it, each reflector is back within its current wait (at most 2 x 30 s)
    wait_for(lambda: kube_api.wait_for_watchers(2, 0), watch_bound(),
             what="both watches open again")
    assert ready(cluster)
    pod = cluster.pod("after-storm", annotations={NETWORKS_KEY: "storm-net"})
    _ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    added = cluster.shim("ADD", pod, ns_path, cid)
    assert added.code == 0, added.output
    assert [s["name"] for s in cluster.status("default", "after-storm")] == \
        ["cluster-net", "default/storm-net"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert sandbox.leases_held() == []
    assert "leader changed" in cluster.daemon.log()


def ready(cluster: Cluster) -> bool:
    return api.http_request(cluster.daemon.socket_path, "GET", "/readyz", timeout=2).status == 200
