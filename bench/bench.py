#!/usr/bin/env python3
"""`make bench`: multusd's latency, throughput, memory and API cost, measured end to end.

Starts its own daemon under ``systemd-socket-activate`` (the real activation protocol) and
drives it with the real ``multus-shim`` exactly as a container runtime does, for pods with
``eth0`` plus two secondary networks (bridge + host-local each, real plugins, real network
namespaces). The daemon runs as the package installs it (``/usr/bin/python3 -I`` launcher).
Measured, in this order:

1. cold starts (bench/lifecycle.py, median of ``--cold-repeats``): the first ADD into a
   daemon that is not running until the shim connects, /healthz and /readyz after
   activation, idle RSS, and the stop (SIGTERM, nothing in flight); plus the largest imports
   (``-X importtime``) and the RSS of each import step;
2. the shim on its own: interpreter start-up, a VERSION call, and an ADD and a DEL against an
   in-process stand-in daemon that answers at once (so the shim's share is visible);
3. daemon RSS idle after start;
4. ADD and DEL latency as the runtime sees it (wall time of the shim process), and in
   Kubernetes mode the API requests each ADD and DEL cost (the fake API server's request log,
   watch streams excluded);
5. the daemon alone: the shim's /cni body POSTed straight to the socket;
6. the same three network configurations run directly through the CNI engine, one after the
   other, without multusd, so that "multusd overhead = ADD - plugin time" can be printed;
7. pods/s at concurrency 1, 4, 8 and 16 (ADD then DEL per pod, one netns per pod);
8. daemon RSS after the load.

Each figure of issue 13's table is printed beside upstream's (from that table) with the
ratio multusd / upstream. With ``--upstream-bin DIR`` (upstream's Go ``multus-daemon`` and
``multus-shim`` v4.x), bench/upstream.py then runs the same phases against
upstream's daemon, and the upstream column is that measurement (the table's figures stay in
the JSON as ``upstream_table``).

Kubernetes mode (``--k8s``, the default when it works) gives the daemon a kubeconfig for
tests/kubeapi.py's FakeKubeAPI on 127.0.0.1; pods are created there with the
``k8s.v1.cni.cncf.io/networks`` annotation naming two NetworkAttachmentDefinitions, and
``clusterNetwork`` is a conf file. Delegates mode (``--no-k8s``) lists the three networks in
the daemon config's ``delegates``. When the default Kubernetes mode fails, the failure is
reported (``k8s_error``) and the run continues in delegates mode.

Prints ONE JSON line on stdout and a table on stderr (bench/README.md explains the figures).
Everything it creates (namespaces, bridges, leases, daemons, files) is removed at the end,
also on Ctrl-C or SIGTERM. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from harness import (PYTHON, DaemonProcess, ShimOutput, bridge_conf, call_shim,  # noqa: E402
                     del_link, del_netns, new_netns, shim_conf)
from testlib import PLUGIN_DIR, REPO, wait_for  # noqa: E402

import lifecycle  # noqa: E402
from multusd.wire import api  # noqa: E402

CNI_VERSION = "0.3.1"
NAMESPACE = "default"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
SECONDARY = ("bench-net1", "bench-net2")
SUBNETS = ("10.231.0.0/16", "10.232.0.0/16", "10.233.0.0/16")
IFNAMES = ("eth0", "net1", "net2")
CONCURRENCY = (1, 4, 8, 16)
SHIM_TIMEOUT = 60.0
EVENTS_PER_ADD = 3  # one AddedInterface event per attached network

# The bar: upstream's Go Multus thick v4.2.4 daemon + shim, measured side by side with
# multusd in one run on this 2-core machine (issue 13's table; same fake API server, same real
# plugins, eth0 + 2 NADs, N=100, C=8).
UPSTREAM = {"add_p50_ms": 35.1, "del_p50_ms": 78.2, "pods_per_s_c8": 15.6,
            "daemon_add_p50_ms": 27.1, "shim_add_ms": 9.5, "shim_del_ms": 13.3,
            "cold_start_add_ms": 162, "rss_idle_mb": 41.2, "stop_ms": 16,
            "api_requests_per_add": 5, "api_requests_per_del": 0,
            # not a multusd figure: the three plugins run one after the other without any
            # Multus ("~24 ms of the 35 ms" in issue 13); a higher value here means a slower
            # or busier machine than the one upstream's column was measured on.
            "plugins_add_ms": 24}


# ---- small utilities ------------------------------------------------------------------------

def percentiles(samples: Sequence[float]) -> Dict[str, Any]:
    """p50/p95/p99 (nearest rank), mean, min, max and n of millisecond samples."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 1)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99),
            "mean": round(sum(ordered) / len(ordered), 1), "min": round(ordered[0], 1),
            "max": round(ordered[-1], 1), "n": len(ordered)}


def timed(call: Callable[[], Any]) -> tuple:
    """(milliseconds, return value) of one call."""
    started = time.perf_counter()
    value = call()
    return (time.perf_counter() - started) * 1000, value


class CpuMeter:
    """CPU time (ms) spent between construction and :meth:`per_pod`, by whom.

    daemon: multusd's own threads; plugins: its waited-for children (the CNI plugins);
    shims: this process's waited-for children (the shim processes, and nothing else runs
    while a phase is measured); bench: this process (in Kubernetes mode the fake API server).
    """

    TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self._sample()

    def _sample(self) -> Dict[str, float]:
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # fields from #3 (state) on
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {"daemon": (int(fields[11]) + int(fields[12])) * self.TICK_MS,
                "plugins": (int(fields[13]) + int(fields[14])) * self.TICK_MS,
                "shims": (children.ru_utime + children.ru_stime) * 1000,
                "bench": (own.ru_utime + own.ru_stime) * 1000}

    def per_pod(self, pods: int) -> Dict[str, float]:
        end = self._sample()
        return {key: round((end[key] - self.start[key]) / max(pods, 1), 1) for key in end}


def machine() -> Dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": load_average()}


def load_average() -> List[float]:
    """1/5/15-minute load: other work on the machine inflates every figure."""
    return [round(x, 2) for x in os.getloadavg()]


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM (or Ctrl-C) asked the benchmark to stop: clean up and exit."""


# ---- everything the run creates, removed at the end -----------------------------------------

class Scratch:
    """The run's working directory, bridges, namespaces, daemons and fake API server."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.workdir = tempfile.mkdtemp(prefix="multusd-bench-")
        self.leases = os.path.join(self.workdir, "leases")
        self.bridges = [f"mbb{self.tag}{i}" for i in range(len(SUBNETS))]
        self.daemons: List[DaemonProcess] = []
        self.kube_api = None
        self.stopping = threading.Event()
        self._netns: set = set()
        self._lock = threading.Lock()

    def networks(self) -> List[dict]:
        """eth0 (default route) and the two secondary networks, leases under the workdir."""
        names = ("bench-cluster",) + SECONDARY
        return [bridge_conf(name, bridge, subnet, self.leases, CNI_VERSION, gateway=(i == 0))
                for i, (name, bridge, subnet) in enumerate(zip(names, self.bridges, SUBNETS))]

    def netns(self) -> tuple:
        name, path = new_netns()
        with self._lock:
            self._netns.add(name)
        return name, path

    def drop_netns(self, name: str) -> None:
        del_netns(name)
        with self._lock:
            self._netns.discard(name)

    def daemon(self, config: dict, subdir: str) -> DaemonProcess:
        proc = DaemonProcess(config, workdir=os.path.join(self.workdir, subdir),
                             command=lifecycle.DAEMON_ARGV)
        self.daemons.append(proc)
        return proc

    def cleanup(self) -> None:
        self.stopping.set()
        for daemon in self.daemons:
            daemon.cleanup()
        if self.kube_api is not None:
            self.kube_api.stop()
        with self._lock:
            left = list(self._netns)
        for name in left:
            self.drop_netns(name)
        for bridge in self.bridges:
            del_link(bridge)
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---- pods -----------------------------------------------------------------------------------

@dataclass
class Pod:
    name: str
    container_id: str
    netns_name: str
    netns_path: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


class Cluster:
    """How pods come to exist: only a netns (delegates mode) or also a pod in the fake API."""

    def __init__(self, scratch: Scratch, kube_api=None) -> None:
        self.scratch = scratch
        self.kube_api = kube_api
        self._count = 0
        self._lock = threading.Lock()

    def make_pods(self, count: int) -> List[Pod]:
        pods = []
        for _ in range(count):
            with self._lock:
                self._count += 1
                number = self._count
            netns_name, netns_path = self.scratch.netns()
            pod = Pod(f"bench-{self.scratch.tag}-{number}", uuid.uuid4().hex, netns_name,
                      netns_path)
            if self.kube_api is not None:
                created = self.kube_api.add_pod(
                    NAMESPACE, pod.name, annotations={NETWORKS_ANNOTATION: ",".join(SECONDARY)})
                pod.uid = created["metadata"]["uid"]
            pods.append(pod)
        return pods

    def remove_pods(self, pods: Sequence[Pod]) -> None:
        for pod in pods:
            self.scratch.drop_netns(pod.netns_name)
            if self.kube_api is not None and self.kube_api.pod(NAMESPACE, pod.name) is not None:
                self.kube_api.delete_pod(NAMESPACE, pod.name)


# The shim exactly as the package installs it: packaging/multus-shim.launcher, which
# `make setup` writes to .venv/bin/multus-shim (#!/usr/bin/python3 -IS).
SHIM_LAUNCHER = os.path.join(REPO, ".venv", "bin", "multus-shim")
SHIM_ARGV = [SHIM_LAUNCHER] if os.access(SHIM_LAUNCHER, os.X_OK) else None


def shim(command: str, conf: dict, pod: Pod, argv: Optional[List[str]] = None) -> ShimOutput:
    """The shim's call for ``pod``; ``argv``: another shim (upstream's, bench/upstream.py)."""
    return call_shim(command, conf, container_id=pod.container_id, netns=pod.netns_path,
                     pod=(NAMESPACE, pod.name), uid=pod.uid, timeout=SHIM_TIMEOUT,
                     argv=argv or SHIM_ARGV)


def check(output: ShimOutput, what: str, failures: List[str]) -> bool:
    """Record a failed shim call (its CNI error) and say whether it succeeded."""
    if output.code == 0:
        return True
    message = (output.output or {}).get("msg") if isinstance(output.output, dict) else None
    failures.append(f"{what}: exit {output.code}: {message or output.stderr.strip()[:300]}")
    return False


# ---- the daemon under test ------------------------------------------------------------------

def daemon_config(scratch: Scratch, kube_api, log_level: str) -> dict:
    # Strict (sequential) delegates, said explicitly: the default is becoming false (drop-in
    # defaults) and the figures must not depend on which default the checkout has.
    config: Dict[str, Any] = {"cniVersion": CNI_VERSION, "logLevel": log_level,
                              "parallelDelegates": False}
    networks = scratch.networks()
    if kube_api is None:
        config["delegates"] = networks
        return config
    conf_dir = os.path.join(scratch.workdir, "net.d")
    os.makedirs(conf_dir, exist_ok=True)
    cluster_conf = os.path.join(conf_dir, "10-bench-cluster.conf")
    with open(cluster_conf, "w") as handle:
        json.dump(networks[0], handle)
    for nad_name, conf in zip(SECONDARY, networks[1:]):
        kube_api.add_nad(NAMESPACE, nad_name, json.dumps(conf))
    config.update({"kubeconfig": kube_api.kubeconfig_path, "nodeName": kube_api.node,
                   "clusterNetwork": cluster_conf, "confDir": conf_dir})
    return config


def wait_ready(daemon: DaemonProcess, timeout: float = 30.0) -> None:
    """/readyz answers 200 (in Kubernetes mode: the caches have synced)."""
    def ready() -> bool:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            raise RuntimeError(f"multusd exited with {daemon.proc.returncode}:\n{daemon.log()}")
        try:
            return api.http_request(daemon.socket_path, "GET", api.READY_ENDPOINT,
                                    timeout=2).status == 200
        except OSError:
            return False

    wait_for(ready, timeout, what="multusd /readyz")


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

def first_add(cluster: Cluster) -> Callable[[DaemonProcess], Optional[float]]:
    """A cold start's first ADD: a new pod's shim ADD timed (spawn to exit), then its DEL."""
    def add(daemon: DaemonProcess) -> Optional[float]:
        pod = cluster.make_pods(1)[0]
        try:
            ms, out = timed(lambda: shim("ADD", daemon.shim_conf(), pod))
            if out.code != 0:
                log(f"cold-start ADD failed: {out.output}")
                return None
            shim("DEL", daemon.shim_conf(), pod)
            return round(ms, 1)
        finally:
            cluster.remove_pods([pod])
    return add


def cold_start(scratch: Scratch, cluster: Cluster, config: dict, repeats: int,
               failures: List[str]) -> Dict[str, Any]:
    """Cold starts (bench/lifecycle.py): first ADD, /healthz, /readyz, idle RSS, stop."""
    figures = lifecycle.measure(config, os.path.join(scratch.workdir, "cold"), repeats,
                                first_add(cluster))
    figures["ok"] = not figures["failed"] and figures.get("cold_add_ms") is not None
    if not figures["ok"]:
        failures.append(f"{figures['failed']} cold start(s) failed")
    figures["add_ms"] = figures.get("cold_add_ms")
    return figures


class InstantDaemon:
    """A stand-in for multusd on a unix socket that answers every request at once.

    /readyz and /healthz get 200; /cni gets a fixed ADD result at the wire version, so the
    shim does all its usual work (connect twice, encode, decode, convert the result).
    """

    RESULT = {"Result": {"cniVersion": "1.1.0",
                         "interfaces": [{"name": "eth0", "mac": "0a:58:0a:e7:00:02",
                                         "sandbox": "/var/run/netns/x"}],
                         "ips": [{"address": "10.231.0.2/16", "gateway": "10.231.0.1",
                                  "interface": 0}],
                         "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}}

    def __init__(self, socket_dir: str) -> None:
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        self.socket_dir = socket_dir
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(api.socket_path(socket_dir))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="bench-instant", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        body = json.dumps(self.RESULT).encode()
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    request = self._read_request(conn)
                    payload = body if request.startswith(b"POST /cni") else b""
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (len(payload), payload))
                except OSError:
                    pass

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return head

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()
        try:
            os.unlink(api.socket_path(self.socket_dir))  # so that another can bind it
        except FileNotFoundError:
            pass


def packaged_shim(command: str, conf: dict, *, site: bool = False) -> int:
    """The shim as the packages install it (packaging/multus-shim.launcher: ``python3 -IS``);
    returns its exit code. ``site``: with ``-I`` only, for what the site module costs."""
    launcher = (f"import sys; sys.path.insert(0, {REPO!r}); "
                "from multusd.wire.shim import main; sys.exit(main())")
    flags = "-I" if site else "-IS"
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": command, "CNI_CONTAINERID": "bench-instant", "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=instant"}
    proc = subprocess.run([os.path.realpath(PYTHON), flags, "-c", launcher],
                          input=json.dumps(conf).encode(), env=env, capture_output=True,
                          timeout=SHIM_TIMEOUT)
    return proc.returncode


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def shim_share(scratch: Scratch, repeats: int, failures: List[str]) -> Dict[str, Any]:
    """What the shim costs on its own (wall and CPU ms), with a daemon that answers at once.

    ``venv_*`` is the shim as this benchmark (harness.call_shim) runs it; ``packaged_*`` as
    the packages install it; ``python_*`` an interpreter that does nothing, for reference.
    """
    instant = InstantDaemon(os.path.join(scratch.workdir, "instant"))
    conf = shim_conf(instant.socket_dir, CNI_VERSION)
    fake_pod = Pod("instant", "bench-instant", "", "/dev/null")
    real_python = os.path.realpath(PYTHON)

    def exit_code(argv: List[str]) -> Callable[[], int]:
        return lambda: subprocess.run(argv, capture_output=True).returncode

    variants: Dict[str, Callable[[], int]] = {
        "python_venv_startup": exit_code([PYTHON, "-c", "pass"]),
        "python_isolated_startup": exit_code([real_python, "-I", "-c", "pass"]),
        "python_isolated_nosite_startup": exit_code([real_python, "-I", "-S", "-c", "pass"]),
        "venv_version": lambda: call_shim("VERSION", conf, timeout=SHIM_TIMEOUT).code,
        "venv_add_instant": lambda: shim("ADD", conf, fake_pod).code,
        "packaged_version": lambda: packaged_shim("VERSION", conf),
        "packaged_add_instant": lambda: packaged_shim("ADD", conf),
        "packaged_del_instant": lambda: packaged_shim("DEL", conf),
        "site_add_instant": lambda: packaged_shim("ADD", conf, site=True),
    }
    try:
        return measure_commands(variants, repeats, scratch, failures, "shim measurement")
    finally:
        instant.close()


def measure_commands(variants: Dict[str, Callable[[], int]], repeats: int, scratch: Scratch,
                     failures: List[str], what: str) -> Dict[str, Any]:
    """Wall and CPU ms (children's) of each command, ``repeats`` rounds of all in turn; a
    non-zero exit code is a failure, left out of the figures."""
    wall: Dict[str, List[float]] = {key: [] for key in variants}
    cpu: Dict[str, List[float]] = {key: [] for key in variants}
    for _ in range(repeats):
        for key, call in variants.items():
            if scratch.stopping.is_set():
                raise Interrupted()
            cpu_before = children_cpu_ms()
            ms, code = timed(call)
            if code != 0:
                failures.append(f"{what} {key}: exit {code}")
                continue
            wall[key].append(ms)
            cpu[key].append(children_cpu_ms() - cpu_before)
    return {key: dict(percentiles(wall[key]), cpu_p50=percentiles(cpu[key]).get("p50"))
            for key in variants}


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


# ---- the run --------------------------------------------------------------------------------

@dataclass
class Options:
    pods: int
    throughput_pods: int
    shim_repeats: int
    k8s: Optional[bool]  # None: try Kubernetes mode, fall back to delegates mode
    log_level: str
    profile: str
    cold_repeats: int = 5
    upstream_bin: str = ""  # bench/upstream.py: upstream's daemon + shim measured too


def parse_args(argv: Optional[Sequence[str]] = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=40,
                        help="pods per latency phase and per concurrency level (default 40)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few pods per phase")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--k8s", dest="k8s", action="store_true", default=None,
                      help="Kubernetes mode only (fail rather than fall back)")
    mode.add_argument("--no-k8s", dest="k8s", action="store_false",
                      help="delegates mode: no API server, daemon config lists the networks")
    parser.add_argument("--log-level", default="verbose",
                        choices=("debug", "verbose", "error", "panic"),
                        help="the daemon's logLevel (default verbose, upstream's default)")
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="record the daemon with py-spy during the latency phase into FILE "
                             "(.svg flame graph, else collapsed stacks); py-spy must be on PATH "
                             "or in the venv")
    parser.add_argument("--cold-repeats", type=int, default=5,
                        help="cold starts measured (median; default 5)")
    parser.add_argument("--upstream-bin", default="", metavar="DIR",
                        help="also measure upstream's Go multus-daemon + multus-shim found in "
                             "DIR, after multusd, in Kubernetes mode (bench/upstream.py)")
    args = parser.parse_args(argv)
    if args.upstream_bin:
        from upstream import missing
        args.upstream_bin = os.path.abspath(args.upstream_bin)
        if missing(args.upstream_bin):
            parser.error(f"--upstream-bin {args.upstream_bin}: no executable "
                         f"{' or '.join(missing(args.upstream_bin))} there")
        if args.k8s is False:
            parser.error("--upstream-bin needs Kubernetes mode (upstream's thick daemon has no "
                         "delegates-only mode)")
    pods = 4 if args.quick else max(1, args.pods)
    throughput_pods = 4 if args.quick else pods
    return Options(pods=pods, throughput_pods=throughput_pods,
                   shim_repeats=3 if args.quick else 15, k8s=args.k8s,
                   log_level=args.log_level, profile=args.profile,
                   cold_repeats=2 if args.quick else args.cold_repeats,
                   upstream_bin=args.upstream_bin)


def start_kube_api(scratch: Scratch):
    from kubeapi import FakeKubeAPI  # imports pytest: only in Kubernetes mode

    workdir = os.path.join(scratch.workdir, "kubeapi")
    os.makedirs(workdir)
    scratch.kube_api = FakeKubeAPI(workdir).start()
    return scratch.kube_api


class Profiler:
    """py-spy recording the daemon's threads (waiting included) until :meth:`stop`."""

    def __init__(self, pid: int, path: str, workdir: str) -> None:
        candidates = [os.path.join(os.path.dirname(PYTHON), "py-spy"), shutil.which("py-spy")]
        binary = next((c for c in candidates if c and os.path.exists(c)), None)
        if binary is None:
            raise RuntimeError("--profile needs py-spy: .venv/bin/python -m pip install py-spy")
        fmt = "flamegraph" if path.endswith(".svg") else "raw"
        self.log_path = os.path.join(workdir, "py-spy.log")
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--rate", "200", "--format", fmt,
                 "--output", path, "--idle", "--threads"],
                stdout=log_file, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode:
            with open(self.log_path, errors="replace") as handle:
                log(f"py-spy exited with {self.proc.returncode}: {handle.read()[-500:]}")


def run(options: Options, scratch: Scratch) -> Dict[str, Any]:
    failures: List[str] = []
    report: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(), "pods": options.pods, "throughput_pods": options.throughput_pods,
        "cni_version": CNI_VERSION, "log_level": options.log_level, "upstream": UPSTREAM}
    mode = "k8s" if options.k8s is not False else "delegates"
    kube_api = None
    if mode == "k8s":
        log("Kubernetes mode: starting the fake API server, cold-start ADD")
        try:
            kube_api = start_kube_api(scratch)
            cluster = Cluster(scratch, kube_api)
            config = daemon_config(scratch, kube_api, options.log_level)
            cold = cold_start(scratch, cluster, config, options.cold_repeats, failures)
            if not cold["ok"]:
                raise RuntimeError(f"cold-start ADD failed: {failures[-1]}")
        except Exception as exc:  # noqa: BLE001 - reported, then delegates mode
            if options.k8s or isinstance(exc, Interrupted):
                raise
            report["k8s_error"] = str(exc)
            log(f"Kubernetes mode failed, continuing in delegates mode: {exc}")
            failures.clear()
            mode, kube_api = "delegates", None
    if mode == "delegates":
        log("delegates mode: cold-start ADD")
        cluster = Cluster(scratch, None)
        config = daemon_config(scratch, None, options.log_level)
        cold = cold_start(scratch, cluster, config, options.cold_repeats, failures)
    report["mode"] = mode
    report["cold_start"] = cold

    log("the shim on its own")
    report["shim"] = shim_share(scratch, options.shim_repeats, failures)

    log("starting the daemon under test")
    daemon = scratch.daemon(config, "daemon").start(activate=True)
    wait_ready(daemon)
    pid = daemon.proc.pid
    report["rss_mb"] = {"idle_after_start": lifecycle.rss_mb(pid)}
    warm = cluster.make_pods(2)
    for pod in warm:  # first-request costs (lazy imports, connection pools) stay out
        shim("ADD", daemon.shim_conf(), pod)
        shim("DEL", daemon.shim_conf(), pod)
    cluster.remove_pods(warm)
    report["rss_mb"]["after_warmup"] = lifecycle.rss_mb(pid)

    log(f"latency: {options.pods} pods ADD, then DEL, one at a time")
    profiler = Profiler(pid, options.profile, scratch.workdir) if options.profile else None
    try:
        report["latency"] = latency(daemon, cluster, options.pods, failures)
    finally:
        if profiler is not None:
            profiler.stop()

    log(f"daemon alone: {options.pods} pods, /cni POSTed directly")
    report["direct"] = direct_post(daemon, cluster, options.pods, failures)

    log(f"plugins alone: {options.pods} pods through the CNI engine")
    report["plugins"] = plugins_direct(scratch, options.pods, failures)

    report["throughput"] = {}
    for concurrency in CONCURRENCY:
        count = max(options.throughput_pods, concurrency)
        log(f"throughput: {count} pods at concurrency {concurrency}")
        report["throughput"][str(concurrency)] = throughput(daemon, cluster, concurrency, count,
                                                            failures)
    report["rss_mb"]["after_load"] = lifecycle.rss_mb(pid)
    if options.upstream_bin:
        import upstream

        daemon.terminate()  # multusd's figures are all taken: upstream's daemon runs alone
        report["upstream_measured"] = upstream.measure(options, scratch)
        report["upstream_table"] = UPSTREAM
        report["upstream"] = upstream.bar(report["upstream_measured"], UPSTREAM)
        failures.extend(report["upstream_measured"]["failures"])
    report["machine"]["loadavg_at_end"] = load_average()
    report["summary"] = summary(report)
    report["versus_upstream"] = [dict(zip(("figure", "multusd", "upstream", "ratio", "target"),
                                          row)) for row in versus_upstream(report)]
    report["failures"] = failures[:20]
    report["failure_count"] = len(failures)
    return report


def summary(report: Dict[str, Any]) -> Dict[str, Any]:
    """The headline figures, beside the upstream bar."""
    lat, plugins, shim_parts = report["latency"], report["plugins"], report["shim"]

    def p50(stats: Dict[str, Any]) -> Optional[float]:
        return stats.get("p50")

    add, dele = p50(lat["add_ms"]), p50(lat["del_ms"])
    plug_add, plug_del = p50(plugins["add_ms"]), p50(plugins["del_ms"])
    shim_ms = p50(shim_parts["venv_add_instant"])
    out: Dict[str, Any] = {
        "add_p50_ms": add, "del_p50_ms": dele, "shim_add_instant_p50_ms": shim_ms,
        "plugins_add_p50_ms": plug_add, "plugins_del_p50_ms": plug_del,
        "overhead_add_p50_ms": round(add - plug_add, 1) if None not in (add, plug_add) else None,
        "overhead_del_p50_ms": round(dele - plug_del, 1) if None not in (dele, plug_del) else None,
        "pods_per_s": {c: t["pods_per_s"] for c, t in report["throughput"].items()},
        "rss_idle_mb": report["rss_mb"]["idle_after_start"],
        "rss_after_load_mb": report["rss_mb"]["after_load"],
        "cold_start_add_ms": report["cold_start"]["add_ms"],
    }
    if None not in (add, plug_add, shim_ms):
        out["daemon_overhead_add_p50_ms"] = round(add - plug_add - shim_ms, 1)
    if lat.get("api_requests_add"):
        out["api_requests_per_add"] = lat["api_requests_add"]["per_pod"]
        out["api_requests_per_del"] = lat["api_requests_del"]["per_pod"]
    return out


def versus_upstream(report: Dict[str, Any]) -> List[tuple]:
    """(figure, multusd, upstream, ratio multusd/upstream, target) for issue 13's table."""
    lat, shim_parts, cold = report["latency"], report["shim"], report["cold_start"]
    c8 = report["throughput"].get("8", {})
    rows = [
        ("sequential ADD p50 ms (runtime's view)", lat["add_ms"].get("p50"), "add_p50_ms",
         "<= 0.9"),
        ("sequential DEL p50 ms", lat["del_ms"].get("p50"), "del_p50_ms", "<= 0.9"),
        ("C=8 full cycle pods/s", c8.get("pods_per_s"), "pods_per_s_c8", ">= 1.5"),
        ("daemon only ADD p50 ms (direct POST)",
         report.get("direct", {}).get("add_ms", {}).get("p50"), "daemon_add_p50_ms", ""),
        ("shim share of ADD ms (instant daemon)",
         shim_parts.get("packaged_add_instant", {}).get("p50"), "shim_add_ms", "<= 1.0"),
        ("shim share of DEL ms (instant daemon)",
         shim_parts.get("packaged_del_instant", {}).get("p50"), "shim_del_ms", "<= 1.0"),
        ("first ADD after a cold start ms", cold.get("cold_add_ms"), "cold_start_add_ms",
         "<= 1.0"),
        ("idle RSS MB", report["rss_mb"].get("idle_after_start"), "rss_idle_mb", "low"),
        ("daemon stop ms (SIGTERM, idle)", cold.get("stop_ms"), "stop_ms", ""),
        ("plugins alone ADD p50 ms (machine speed)",
         report.get("plugins", {}).get("add_ms", {}).get("p50"), "plugins_add_ms", "(ref.)"),
    ]
    out = []
    bar = report.get("upstream", UPSTREAM)  # measured in this run with --upstream-bin
    for label, ours, key, target in rows:
        theirs = bar[key]
        ratio = round(ours / theirs, 2) if isinstance(ours, (int, float)) and theirs else None
        out.append((label, ours, theirs, ratio, target))
    return out


def print_table(report: Dict[str, Any]) -> None:
    s, up = report["summary"], report.get("upstream", UPSTREAM)
    lat, shim_parts = report["latency"], report["shim"]

    def row(label: str, ours: Any, theirs: Any = "") -> None:
        print(f"  {label:44} {str(ours):>22}  {str(theirs):>10}", file=sys.stderr)

    def pct(stats: Dict[str, Any]) -> str:
        if not stats.get("n"):
            return "-"
        return f"{stats.get('p50')}/{stats.get('p95')}/{stats.get('p99')}"

    print(f"\nmultusd benchmark, {report['mode']} mode, {report['pods']} pods, "
          f"{report['machine']['cpus']} CPUs, {report['date']}, load average "
          f"{report['machine']['loadavg_at_start'][0]} at start, "
          f"{report['machine']['loadavg_at_end'][0]} at end", file=sys.stderr)
    if report.get("k8s_error"):
        print(f"  (Kubernetes mode failed: {report['k8s_error'].splitlines()[0]})", file=sys.stderr)
    row("figure", "multusd", "upstream")
    row("ADD ms p50/p95/p99 (shim wall time)", pct(lat["add_ms"]), up["add_p50_ms"])
    row("DEL ms p50/p95/p99 (shim wall time)", pct(lat["del_ms"]), up["del_p50_ms"])
    row("plugins alone ADD ms p50/p95/p99", pct(report["plugins"]["add_ms"]))
    row("plugins alone DEL ms p50/p95/p99", pct(report["plugins"]["del_ms"]))
    row("multusd overhead ADD ms (ADD - plugins)", s["overhead_add_p50_ms"])
    row("multusd overhead DEL ms (DEL - plugins)", s["overhead_del_p50_ms"])
    row("  of which shim ADD, instant daemon ms", s["shim_add_instant_p50_ms"], up["shim_add_ms"])
    row("  of which daemon ms (overhead - shim)", s.get("daemon_overhead_add_p50_ms"))
    for key, label in (("python_venv_startup", "python -c pass, venv"),
                       ("python_isolated_startup", "python3 -I -c pass"),
                       ("python_isolated_nosite_startup", "python3 -I -S -c pass"),
                       ("venv_version", "shim VERSION, venv"),
                       ("packaged_version", "shim VERSION, packaged (-IS)"),
                       ("venv_add_instant", "shim ADD instant daemon, venv"),
                       ("packaged_add_instant", "shim ADD instant daemon, packaged (-IS)"),
                       ("packaged_del_instant", "shim DEL instant daemon, packaged (-IS)"),
                       ("site_add_instant", "shim ADD instant daemon, -I (with site)")):
        stats = shim_parts[key]
        row(f"  {label}: wall/CPU ms", f"{stats.get('p50')} / {stats.get('cpu_p50')}")
    for concurrency, result in report["throughput"].items():
        row(f"pods/s at concurrency {concurrency} (ADD p50 ms)",
            f"{result['pods_per_s']} ({result['add_ms'].get('p50')})",
            up["pods_per_s_c8"] if concurrency == "8" else "")
    for label, cpu in (("ADD", lat["cpu_ms_per_add"]), ("DEL", lat["cpu_ms_per_del"]),
                       ("pod at concurrency 8", report["throughput"].get("8", {}).get(
                           "cpu_ms_per_pod", {}))):
        row(f"CPU ms per {label}: daemon/plugins/shim/bench",
            "/".join(str(cpu.get(k)) for k in ("daemon", "plugins", "shims", "bench")))
    row("API requests per ADD / per DEL",
        f"{s.get('api_requests_per_add', '-')} / {s.get('api_requests_per_del', '-')}",
        f"{up['api_requests_per_add']} / {up['api_requests_per_del']}")
    if lat.get("api_requests_add"):
        row("  ADD requests by kind",
            json.dumps(lat["api_requests_add"]["by_kind_per_pod"]).replace('"', ""))
    row("RSS MB idle / after warm-up / after load",
        f"{s['rss_idle_mb']} / {report['rss_mb']['after_warmup']} / {s['rss_after_load_mb']}",
        up["rss_idle_mb"])
    row("first ADD after cold start ms", s["cold_start_add_ms"], up["cold_start_add_ms"])
    if up.get("measured"):
        print("\n  versus upstream (upstream column MEASURED in this run, same machine, plugins "
              "and pods; plugins-alone row: issue 13's table; ratio = multusd / upstream)",
              file=sys.stderr)
    else:
        print("\n  versus upstream (issue 13's table; ratio = multusd / upstream)",
              file=sys.stderr)
    print(f"  {'figure':44} {'multusd':>10} {'upstream':>10} {'ratio':>7}  target",
          file=sys.stderr)
    for label, ours, theirs, ratio, target in versus_upstream(report):
        print(f"  {label:44} {str(ours):>10} {str(theirs):>10} {str(ratio):>7}  {target}",
              file=sys.stderr)
    if "upstream_measured" in report:
        import upstream

        upstream.print_report(report)
    lifecycle.print_report(report["cold_start"])
    if report["failure_count"]:
        print(f"  {report['failure_count']} failed call(s), first: {report['failures'][0]}",
              file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    if os.geteuid() != 0:
        print("bench needs root: it creates network namespaces and bridges", file=sys.stderr)
        return 1
    options = parse_args(argv)
    scratch = Scratch()

    def on_term(signum: int, _frame: Any) -> None:
        scratch.stopping.set()
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also stop the worker threads of a phase
    try:
        report = run(options, scratch)
    except (KeyboardInterrupt, Interrupted):
        scratch.stopping.set()
        log("interrupted: cleaning up")
        return 130
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # the clean-up itself must finish
            signal.signal(signum, signal.SIG_IGN)
        scratch.cleanup()
    print_table(report)
    print(json.dumps(report), flush=True)
    return 1 if report["failure_count"] else 0


if __name__ == "__main__":
    sys.modules.setdefault("bench", sys.modules[__name__])  # bench/upstream.py imports it
    sys.exit(main())
