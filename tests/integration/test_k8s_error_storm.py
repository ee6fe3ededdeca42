"""An ERROR storm: every watch ends with an ERROR event for a while (etcd changing leader).

First what the stand-in does during one (tests/kubecache.py's :meth:`error_storm`), then what a
node does: a bounded number of requests per resource, and after the storm open watches and a
working ADD.
"""

from __future__ import annotations

import json
import threading
import urllib.request

from kubecache import LEADER_CHANGED
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"0.4.0","name":"storm-net","type":"bridge"}'
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"


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
