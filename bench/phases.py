"""Phases measured against one running daemon: latency, direct POST, plugins alone, pods/s.

Sequential ADD/DEL latency with the API requests each costs, the daemon alone (the /cni body
POSTed to its socket), the plugins alone (the CNI engine in this process), pods/s at a
concurrency.

Each phase works for multusd and for upstream's daemon (bench/upstream.py): a daemon object
with ``proc``, ``socket_path``, ``shim_conf()`` and optionally ``shim_argv`` (its own shim).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

from rig import (IFNAMES, NAMESPACE, SHIM_TIMEOUT, Cluster, DaemonProcess, Pod, Scratch,
                 check, shim)
from stats import CpuMeter, Interrupted, log, percentiles, timed
from testlib import PLUGIN_DIR, wait_for

from multusd.wire import api

CONCURRENCY = (1, 4, 8, 16)  # pods/s measured at each
EVENTS_PER_ADD = 3  # one AddedInterface event per attached network


# ---- API request accounting (Kubernetes mode) -----------------------------------------------

def request_kind(method: str, path: str) -> str:
    if path.endswith("/status"):
        return f"{method} pods/status"
    if "/events" in path:
        return f"{method} events"
    if "network-attachment-definitions" in path:
        return f"{method} nad"
    if "/pods" in path:
        return f"{method} pod" if path.rstrip("/").split("/")[-2] == "pods" else f"{method} pods"
    return f"{method} {path}"


class RequestWindow:
    """The fake API server's non-watch requests from now until :meth:`close`."""

    def __init__(self, kube_api) -> None:
        self.kube_api = kube_api
        self.start = len(kube_api.requests) if kube_api is not None else 0
        self.events_start = len(kube_api.events) if kube_api is not None else 0

    def close(self, expected_events: int) -> Optional[Dict[str, int]]:
        if self.kube_api is None:
            return None
        want = self.events_start + expected_events
        try:  # events are sent by a background thread: give them a bounded moment
            wait_for(lambda: len(self.kube_api.events) >= want, 10.0, what="events")
        except AssertionError:
            log(f"only {len(self.kube_api.events) - self.events_start} of {expected_events} "
                "events arrived within 10s")
        kinds: Dict[str, int] = {}
        for method, path, query in list(self.kube_api.requests)[self.start:]:
            if query.get("watch", "").lower() in ("true", "1"):
                continue
            kind = request_kind(method, path)
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds


def per_pod(kinds: Optional[Dict[str, int]], pods: int) -> Optional[Dict[str, Any]]:
    if kinds is None or not pods:
        return None
    return {"per_pod": round(sum(kinds.values()) / pods, 2),
            "by_kind_per_pod": {k: round(v / pods, 2) for k, v in sorted(kinds.items())}}


# ---- the phases -----------------------------------------------------------------------------

def latency(daemon: DaemonProcess, cluster: Cluster, count: int,
            failures: List[str]) -> Dict[str, Any]:
    """ADD every pod one after the other, then DEL them; API requests counted per batch."""
    conf, argv = daemon.shim_conf(), getattr(daemon, "shim_argv", None)
    pods = cluster.make_pods(count)
    add_ms: List[float] = []
    del_ms: List[float] = []
    try:
        window = RequestWindow(cluster.kube_api)
        meter = CpuMeter(daemon.proc.pid)
        added = []
        for pod in pods:
            if cluster.scratch.stopping.is_set():
                raise Interrupted()
            ms, out = timed(lambda: shim("ADD", conf, pod, argv))
            if check(out, f"ADD {pod.name}", failures):
                add_ms.append(ms)
                added.append(pod)
        add_cpu = meter.per_pod(len(added))
        add_requests = window.close(EVENTS_PER_ADD * len(added))
        window = RequestWindow(cluster.kube_api)
        meter = CpuMeter(daemon.proc.pid)
        for pod in pods:
            if cluster.scratch.stopping.is_set():
                raise Interrupted()
            ms, out = timed(lambda: shim("DEL", conf, pod, argv))
            if check(out, f"DEL {pod.name}", failures):
                del_ms.append(ms)
        del_cpu = meter.per_pod(len(del_ms))
        del_requests = window.close(0)
    finally:
        cluster.remove_pods(pods)
    return {"add_ms": percentiles(add_ms), "del_ms": percentiles(del_ms),
            "cpu_ms_per_add": add_cpu, "cpu_ms_per_del": del_cpu,
            "api_requests_add": per_pod(add_requests, len(added)),
            "api_requests_del": per_pod(del_requests, len(del_ms))}


def direct_post(daemon: DaemonProcess, cluster: Cluster, count: int,
                failures: List[str]) -> Dict[str, Any]:
    """The daemon alone: the shim's /cni body POSTed straight to the socket (no shim process)."""
    stdin = json.dumps(daemon.shim_conf()).encode()
    pods = cluster.make_pods(count)
    add_ms: List[float] = []
    del_ms: List[float] = []

    def post(command: str, pod: Pod) -> Any:
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": pod.container_id,
               "CNI_NETNS": pod.netns_path, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};"
                           f"K8S_POD_NAME={pod.name};K8S_POD_INFRA_CONTAINER_ID="
                           f"{pod.container_id};K8S_POD_UID={pod.uid}"}
        return api.http_request(daemon.socket_path, "POST", api.CNI_ENDPOINT,
                                api.encode_request(env, stdin), timeout=SHIM_TIMEOUT)

    try:
        for samples, command in ((add_ms, "ADD"), (del_ms, "DEL")):
            for pod in pods:
                if cluster.scratch.stopping.is_set():
                    raise Interrupted()
                ms, response = timed(lambda: post(command, pod))
                if response.status == 200:
                    samples.append(ms)
                else:
                    failures.append(f"direct POST {command} {pod.name}: {response.status} "
                                    f"{response.body[:300]!r}")
    finally:
        cluster.remove_pods(pods)
    return {"add_ms": percentiles(add_ms), "del_ms": percentiles(del_ms)}


def plugins_direct(scratch: Scratch, count: int, failures: List[str]) -> Dict[str, Any]:
    """The three networks run straight through the CNI engine: the plugins' own time."""
    from multusd.cni.resultcache import RuntimeConf
    from multusd.cni.conflist import Engine, NetworkConfigList
    from multusd.errors import MultusError

    engine = Engine([PLUGIN_DIR])
    nets = [NetworkConfigList.load(json.dumps(conf).encode(), source=conf["name"])
            for conf in scratch.networks()]
    cache_dir = os.path.join(scratch.workdir, "engine-cache")
    add_ms: List[float] = []
    del_ms: List[float] = []
    for _ in range(count):
        if scratch.stopping.is_set():
            raise Interrupted()
        netns_name, netns_path = scratch.netns()
        cid = uuid.uuid4().hex
        runtimes = [RuntimeConf(container_id=cid, netns=netns_path, ifname=ifname,
                                args=(("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", NAMESPACE),
                                      ("K8S_POD_NAME", f"direct-{cid[:8]}")),
                                cache_dir=cache_dir)
                    for ifname in IFNAMES]
        try:
            deadline = time.monotonic() + SHIM_TIMEOUT
            pairs = list(zip(nets, runtimes))
            ms, _ = timed(lambda: [engine.add(net, rt, deadline) for net, rt in pairs])
            add_ms.append(ms)
            ms, _ = timed(lambda: [engine.delete(net, rt, deadline) for net, rt in reversed(pairs)])
            del_ms.append(ms)
        except MultusError as exc:
            failures.append(f"direct plugin run: {exc.msg}")
        finally:
            scratch.drop_netns(netns_name)
    return {"add_ms": percentiles(add_ms), "del_ms": percentiles(del_ms)}


def throughput(daemon: DaemonProcess, cluster: Cluster, concurrency: int, count: int,
               failures: List[str]) -> Dict[str, Any]:
    """pods/s with ``concurrency`` runtimes at once, each pod ADD then DEL."""
    conf, argv = daemon.shim_conf(), getattr(daemon, "shim_argv", None)
    pods = cluster.make_pods(count)
    add_ms: List[float] = []
    done = [0]
    lock = threading.Lock()

    def one(pod: Pod) -> None:
        if cluster.scratch.stopping.is_set():
            return
        ms, out = timed(lambda: shim("ADD", conf, pod, argv))
        ok = check(out, f"ADD {pod.name} (c={concurrency})", failures)
        ok = check(shim("DEL", conf, pod, argv), f"DEL {pod.name} (c={concurrency})",
                   failures) and ok
        with lock:
            if ok:
                done[0] += 1
                add_ms.append(ms)

    try:
        meter = CpuMeter(daemon.proc.pid)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(one, pods))
        elapsed = time.perf_counter() - started
        cpu = meter.per_pod(done[0])
    finally:
        cluster.remove_pods(pods)
    if cluster.scratch.stopping.is_set():
        raise Interrupted()
    return {"pods": count, "ok": done[0], "seconds": round(elapsed, 2),
            "pods_per_s": round(done[0] / elapsed, 2), "add_ms": percentiles(add_ms),
            "cpu_ms_per_pod": cpu}
