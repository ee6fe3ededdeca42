"""The real daemon's reads of the API server: one WatchList per resource, or LIST then WATCH.

The daemon and the shim against the stand-in serving WatchList as kube-apiserver 1.34+ does,
and as the servers that do not: one with its WatchList gate off (422), one over an etcd that
cannot answer progress requests (an ERROR event in the stream), one too old to know the
parameters (a plain watch, no end bookmark). Every read comes from the watch cache; the
fallback costs one request once (the pod reflector's; the NAD reflector waits for its
verdict) and is remembered (a relist after an API server
restart that compacted the history asks no WatchList again); readiness follows the pod
cache's first sync as before, and pods are served.
"""

from __future__ import annotations

import uuid
from typing import Dict, List

import pytest

from harness import Cluster, watch_bound
from kubeapi import NAD_GROUP_PATH
from multusd.kube.reflector import WATCH_TIMEOUT_SECONDS
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

PATHS = {"pods": "/api/v1/pods", "nads": NAD_GROUP_PATH + "/network-attachment-definitions"}
FALLBACK = "does not stream lists"


def asked(kube, kind: str) -> List[Dict[str, str]]:
    return [q for _m, path, q in list(kube.requests) if path == PATHS[kind]]


def is_watch_list(query: Dict[str, str]) -> bool:
    return query.get("sendInitialEvents") == "true"


def ready(cluster: Cluster) -> bool:
    return api.http_request(cluster.daemon.socket_path, "GET", "/readyz", timeout=2).status == 200


def add_and_delete(cluster: Cluster, sandbox, name: str) -> None:
    pod = cluster.pod(name, annotations={"k8s.v1.cni.cncf.io/networks": "wl-net"})
    _ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    added = cluster.shim("ADD", pod, ns_path, cid)
    assert added.code == 0, added.output
    assert [s["name"] for s in cluster.status("default", name)] == ["cluster-net",
                                                                   "default/wl-net"]
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


@pytest.mark.parametrize("server", ["serve", "refused", "no-progress", "ignored"])
def test_the_daemon_reads_with_one_watch_list_per_resource_or_falls_back_for_good(
        sandbox, kube_api, tmp_path, server):
    kube_api.watch_list = server
    for index in range(30):
        kube_api.add_pod("default", f"elsewhere-{index}", node="node-z")
    cluster = Cluster(sandbox, kube_api, tmp_path)
    cluster.nad("wl-net", "10.87.0.0/24")
    cluster.start()  # waits for /readyz
    assert kube_api.count_list_reads("pods") == 1  # ready once the pod cache is read, not before
    for kind in PATHS:
        first = asked(kube_api, kind)
        # the pod reflector asks whether the server streams lists; the NAD reflector waits
        # for its verdict, so a server that does not is asked once, not once per resource
        if server == "serve" or kind == "pods":
            assert is_watch_list(first[0]) and first[0]["resourceVersion"] == "0"
            assert first[0]["resourceVersionMatch"] == "NotOlderThan"
            assert WATCH_TIMEOUT_SECONDS[0] <= int(first[0]["timeoutSeconds"])
        if server == "serve":  # one request, which goes on as the watch
            wait_for(lambda: kube_api.wait_for_watchers(2, 0), watch_bound(),
                     what="both streams open")
            assert len(asked(kube_api, kind)) == 1
        else:  # the fallback: a LIST from the cache, then a watch from its version
            tried = 1 if kind == "pods" else 0
            wait_for(lambda: len(asked(kube_api, kind)) == tried + 2, watch_bound(),
                     what=f"{kind} watched")
            listed, watched = asked(kube_api, kind)[tried:]
            assert listed["resourceVersion"] == "0" and "watch" not in listed
            assert watched["watch"] == "true" and not is_watch_list(watched)
        assert kube_api.count_list_reads(kind, "storage") == 0
    add_and_delete(cluster, sandbox, "wl-1")

    # the API server comes back with a compacted history: both watches get 410 and relist
    kube_api.stop()
    kube_api.add_pod("default", "while-away", node="node-z")
    kube_api.compact()
    kube_api.start()
    wait_for(lambda: all(kube_api.count_list_reads(kind) == 2 for kind in PATHS), watch_bound(),
             what="both relisted")
    for kind in PATHS:
        watch_lists = [q for q in asked(kube_api, kind) if is_watch_list(q)]
        if server == "serve":  # the relist is a WatchList not older than the last version
            assert len(watch_lists) == 2 and watch_lists[1]["resourceVersion"] != "0"
        else:
            assert len(watch_lists) == (1 if kind == "pods" else 0)  # remembered: never again
        assert kube_api.count_list_reads(kind, "storage") == 0
    assert ready(cluster)
    add_and_delete(cluster, sandbox, "wl-2")
    log = cluster.daemon.log()
    assert log.count(FALLBACK) == (0 if server == "serve" else 1)
    if server == "refused":
        assert "422" in log and "WatchList feature gate" in log
    if server == "no-progress":
        assert "RequestWatchProgress" in log
    assert sandbox.leases_held() == []
