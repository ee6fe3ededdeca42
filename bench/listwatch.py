#!/usr/bin/env python3
"""What one node's list+watch asks of the API server: start, quiet minutes, an API restart.

Runs :class:`multusd.kube.client.KubeClient` (whichever ``multusd`` is first on
``PYTHONPATH``, so an older tree can be measured the same way) against tests/kubeapi.py's
stand-in API server, in-process, and prints figures (nothing is asserted):

``start``    a node's start against a stand-in holding ``--pods`` pods on other nodes, 5 on
             this node and ``--nads`` NADs: requests and response bytes until both caches
             are synced and both watches are open (bytes counted by a TCP proxy between the
             client and the server), and where each list was read (watch cache or etcd, and
             how many objects etcd read);
``quiet``    watch re-opens per resource over ``--seconds`` of a cluster where only pods of
             other nodes change (one every 10 s of the scaled time); time is scaled down by
             ``--scale`` (10: the server's bookmark every 6 s instead of 60, its end of a watch
             at 30 s instead of 240-300 (its timeoutSeconds), the old client's 50 s idle bound
             at 5 s), so that 60 s stand for 10 minutes;
``restart``  an API server that is down ``--down`` seconds and comes back as kube-apiserver
             does (a new watch cache: watches from older versions get 410; the cache not
             ready for ``--warmup`` s: 429 Retry-After 1): seconds from its coming back to the
             first LIST or WatchList of each resource, and how long ADDs arriving every 0.2 s for
             ``--adds-for`` s meanwhile take (the readiness wait as the shim's, the pod's
             lookup and its network-status PUT).

Usage: ``PYTHONPATH=<tree> python3 bench/listwatch.py start|quiet|restart [options]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "tests"))

from kubeapi import FakeKubeAPI  # noqa: E402 - after the path above
from multusd.kube.client import KubeClient  # noqa: E402

NS = "default"
NAD = '{"cniVersion":"1.0.0","name":"%s","type":"bridge"}'
PODS = "/api/v1/pods"
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
STATUS = json.dumps([{"name": "cbr0", "interface": "eth0", "ips": ["10.1.0.5"],
                      "default": True, "dns": {}}])


class CountingProxy:
    """A TCP forwarder to ``port`` on loopback that counts the bytes the server sends back."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port_to))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if count:
                    with self.lock:
                        self.received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def make_api(workdir: str, pods: int, nads: int) -> FakeKubeAPI:
    api = FakeKubeAPI(workdir).start()
    for index in range(pods):
        api.add_pod(f"ns-{index % 50}", f"pod-{index}", node=f"node-{index % 100:03d}")
    for index in range(5):
        api.add_pod(NS, f"here-{index}")
    for index in range(nads):
        api.add_nad(f"ns-{index % 20}", f"net-{index}", NAD % index)
    return api


def reads(api: FakeKubeAPI, kind: str) -> List[str]:
    with api._cond:
        return [f"{source}({returned} returned, {read} read)"
                for k, source, returned, read in api.list_reads if k == kind]


def opened(api: FakeKubeAPI, kind: str, since: float, watch: bool) -> int:
    """Watches (``watch``) or reads of the whole state (LISTs, WatchLists) of ``kind`` asked
    for since ``since``."""
    with api._cond:
        return sum(1 for at, k, is_watch in api.read_log
                   if k == kind and at >= since and is_watch == watch)


def start(args: argparse.Namespace, workdir: str) -> Dict[str, Any]:
    api = make_api(workdir, args.pods, args.nads)
    proxy = CountingProxy(api.port)
    kubeconfig = os.path.join(workdir, "via-proxy")
    api.write_kubeconfig(kubeconfig)
    with open(kubeconfig) as handle:
        document = json.load(handle)
    document["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{proxy.port}"
    with open(kubeconfig, "w") as handle:
        json.dump(document, handle)
    before = len(api.requests)
    began = time.monotonic()
    client = KubeClient(kubeconfig, api.node, request_timeout=30.0)
    client.start()
    try:
        synced = client.wait_synced(120, nads=True)
        api.wait_for_watchers(2, timeout=30)
        took = time.monotonic() - began
        time.sleep(0.2)  # the watch answers' heads are in flight
        requests = [(m, p, q) for m, p, q in api.requests[before:]]
        return {"synced": synced, "seconds": round(took, 3), "requests": len(requests),
                "response_bytes": proxy.received,
                "requests_detail": [f"{m} {p}?{'&'.join(f'{k}={v}' for k, v in q.items())}"
                                    for m, p, q in requests],
                "pod_lists": reads(api, "pods"), "nad_lists": reads(api, "nads"),
                "etcd_objects_read": {"pods": api.storage_objects_read("pods"),
                                      "nads": api.storage_objects_read("nads")}}
    finally:
        client.stop()
        proxy.close()
        api.stop()


def quiet(args: argparse.Namespace, workdir: str) -> Dict[str, Any]:
    api = make_api(workdir, 50, 10)
    api.bookmark_interval = 60.0 / args.scale
    api.watch_timeout_cap = 300.0 / args.scale
    old = not hasattr(KubeClient, "ready")
    options = {"watch_idle": 50.0 / args.scale} if old else {}
    client = KubeClient(api.kubeconfig_path, api.node, request_timeout=10.0, **options)
    client.start()
    stop = threading.Event()

    def churn() -> None:  # pods of other nodes change now and then
        index = 0
        while not stop.wait(10.0 / args.scale):
            api.update_pod("ns-0", "pod-0", annotations={"tick": str(index)})
            index += 1

    try:
        client.wait_synced(30, nads=True)
        api.wait_for_watchers(2)
        began = time.monotonic()
        writer = threading.Thread(target=churn, daemon=True)
        writer.start()
        time.sleep(args.seconds)
        stop.set()
        writer.join()
        result: Dict[str, Any] = {
            "scaled_seconds": args.seconds, "stands_for_minutes": args.seconds * args.scale / 60,
            "watch_opens": {path: opened(api, kind, began, watch=True)
                            for path, kind in ((PODS, "pods"), (NADS, "nads"))},
            "relists": {path: opened(api, kind, began, watch=False)  # LISTs and WatchLists
                        for path, kind in ((PODS, "pods"), (NADS, "nads"))}}
        reopens = getattr(client, "watch_reopens", None)
        if reopens is not None:
            result["reopens_by_cause"] = {f"{r}/{c}": n for (r, c), n in sorted(reopens.items())}
        else:
            result["idle_restarts"] = client.watch_idle_restarts
        return result
    finally:
        stop.set()
        client.stop()
        api.stop()


def restart(args: argparse.Namespace, workdir: str) -> Dict[str, Any]:
    api = make_api(workdir, 200, 20)
    client = KubeClient(api.kubeconfig_path, api.node, request_timeout=10.0)
    client.start()
    ready = getattr(client, "ready", client.synced)  # what /readyz follows
    try:
        client.wait_synced(30, nads=True)
        api.wait_for_watchers(2)
        api.stop()
        time.sleep(args.down)
        count = int(args.adds_for / 0.2)
        for index in range(count):  # created while the node could not watch
            api.add_pod(NS, f"new-{index}")
        api.watch_cache_ready = False
        api.restart(new_watch_cache=True)
        back = time.monotonic()
        threading.Timer(args.warmup, lambda: setattr(api, "watch_cache_ready", True)).start()
        adds: List[float] = []
        for index in range(count):
            arrives = back + 0.2 * (index + 1)
            time.sleep(max(0.0, arrives - time.monotonic()))
            while not ready():
                time.sleep(0.01)
            pod = client.get_pod(NS, f"new-{index}", not_found_wait=0)
            client.set_network_status(pod, STATUS)
            adds.append(round(time.monotonic() - arrives, 3))
        first: Dict[str, Optional[float]] = {}
        for path, kind in ((PODS, "pods"), (NADS, "nads")):
            deadline = time.monotonic() + 60
            times: List[float] = []
            while not times and time.monotonic() < deadline:
                with api._cond:
                    times = [at for at, k, watch in api.read_log if k == kind and not watch
                             and at >= back]
                time.sleep(0.05)
            first[path] = round(times[0] - back, 3) if times else None
        client.wait_synced(60, nads=True)
        adds.sort()
        return {"down_seconds": args.down, "warmup_seconds": args.warmup,
                "first_list_after_back": first, "adds": len(adds),
                "add_seconds_median": adds[len(adds) // 2] if adds else None,
                "add_seconds_max": adds[-1] if adds else None,
                "adds_over_1s": sum(1 for add in adds if add > 1.0)}
    finally:
        client.stop()
        api.stop()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("start", "quiet", "restart"))
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nads", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--down", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--adds-for", type=float, default=15.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="listwatch-") as workdir:
        result = {"start": start, "quiet": quiet, "restart": restart}[args.what](args, workdir)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
