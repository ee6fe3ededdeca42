"""The fleet's cluster and nodes: a stand-in API server filled like a large cluster, and daemons.

:func:`populate` fills tests/kubeapi.py's server with NADs and pods on many other nodes, then
forgets the change history (no daemon starts from an older version). A :class:`Node` is one
daemon as one node: its own node name, token (the ledger's client: ``system:node:<name>``),
kubeconfig or in-cluster secrets, cniDir and socket directory. multusd runs as packaged
(``.venv/bin/multusd serve``, binding its socket itself in the node's directory: no systemd);
upstream's ``multus-daemon`` runs as bench/upstream.py runs it (in-cluster config from a
private /run/secrets mount). Neither is ever sent a CNI request: only its API traffic counts.
:func:`start_fleet` starts a fleet all at once and waits for it, :func:`stop_fleet` stops one,
:func:`quiet_port` finds the stand-in a port no client connection can take while it is away.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional

from rig import DAEMON_ARGV  # first: puts tests/ on the path
from memory import rss_mb
from stats import log
from testlib import PLUGIN_DIR
import upstream

from multusd.wire import api

NODE_USER = "system:node:"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def populate(kube_api, benched: List[str], pods: int, pods_per_node: int, nads: int,
             other_nodes: int, namespaces: int) -> Dict[str, object]:
    """``nads`` NADs and ``pods`` pods spread over ``other_nodes`` nodes and ``namespaces``
    namespaces, plus ``pods_per_node`` pods on each benched node; history compacted."""
    spaces = [f"team-{n:03d}" for n in range(namespaces)]
    for number in range(nads):
        subnet = f"10.{number // 250}.{number % 250}.0/24"
        conf = {"cniVersion": "0.3.1", "type": "macvlan", "master": "eth1", "mode": "bridge",
                "ipam": {"type": "whereabouts", "range": subnet}}
        kube_api.add_nad(spaces[number % namespaces], f"net-{number:03d}", json.dumps(conf))
    for number in range(pods):
        space = spaces[number % namespaces]
        kube_api.add_pod(space, f"app-{number:05d}", node=f"other-{number % other_nodes:04d}",
                         annotations={NETWORKS_ANNOTATION: f"{space}/net-{number % nads:03d}"})
    for node in benched:
        kube_api.add_node(node)
        for number in range(pods_per_node):
            kube_api.add_pod("default", f"{node}-pod-{number}", node=node,
                             annotations={NETWORKS_ANNOTATION: f"{spaces[0]}/net-000"})
    kube_api.compact()  # no watch resumes from before the fleet started
    return {"pods": pods + pods_per_node * len(benched), "nads": nads,
            "other_nodes": other_nodes, "namespaces": namespaces,
            "other_pod": [spaces[0], "app-00000"]}  # on another node: no daemon watches it


def quiet_port(host: str = "127.0.0.1") -> int:
    """A free TCP port below the kernel's ephemeral range. While the stand-in is away, the
    fleet's daemons connect to its port again and again; a client's connection given that very
    port as its own source port connects to itself (TCP's simultaneous open), and then holds
    the port the stand-in must come back on. Outside the ephemeral range no client gets it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(max(1025, low // 2), low), 200):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below {low} for the stand-in API server")


def cluster_conf(workdir: str) -> str:
    """The clusterNetwork file every node's config names (never run: no CNI request)."""
    conf_dir = os.path.join(workdir, "net.d")
    os.makedirs(conf_dir)
    path = os.path.join(conf_dir, "10-fleet.conf")
    with open(path, "w") as handle:
        json.dump({"cniVersion": "0.3.1", "name": "fleet-cluster", "type": "bridge",
                   "bridge": "fleetbr0", "ipam": {"type": "host-local",
                                                  "subnet": "10.250.0.0/16"}}, handle)
    return path


def slug(label: str) -> str:
    """A fleet's label as a node-name prefix: ``upstream v4.3.0`` -> ``upstream-v4-3-0``."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def label_of(bin_dir: str) -> str:
    """``upstream v4.3.0`` from the daemon's -version output (the directory's name else)."""
    found = re.search(r"v\d+\.\d+\.\d+[\w.+-]*", upstream.version(bin_dir))
    return f"upstream {found.group(0) if found else os.path.basename(bin_dir.rstrip('/'))}"


class Node:
    """One daemon as one node; ``bin_dir`` empty: multusd, else upstream's daemon there."""

    def __init__(self, kube_api, fleet: str, name: str, workdir: str, cluster_conf: str,
                 bin_dir: str = "", log_level: str = "verbose") -> None:
        self.fleet, self.name, self.workdir = fleet, name, workdir
        self.client = NODE_USER + name  # who the API server's ledger books it to
        token = f"fleet-{uuid.uuid4().hex}"
        kube_api.auth.add_token(token, self.client)
        os.makedirs(workdir)
        self.socket_dir = os.path.join(workdir, "run")
        self.socket_path = api.socket_path(self.socket_dir)
        self.log_path = os.path.join(workdir, "daemon.log")
        self.proc: Optional[subprocess.Popen] = None
        self.upstream: Optional[upstream.UpstreamDaemon] = None
        self.secrets: Optional[upstream.Secrets] = None
        self.launched = self.ready = 0.0
        conf_dir = os.path.dirname(cluster_conf)
        if bin_dir:
            self.secrets = upstream.Secrets(workdir, kube_api, token)
            config = {"cniVersion": "0.3.1", "logLevel": log_level, "logToStderr": True,
                      "binDir": PLUGIN_DIR, "clusterNetwork": cluster_conf, "confDir": conf_dir,
                      "multusAutoconfigDir": conf_dir, "multusConfigFile": "auto"}
            self.upstream = upstream.UpstreamDaemon(bin_dir, config, os.path.join(
                workdir, "daemon"), kube_api, self.secrets, node=name)
            self.socket_path = self.upstream.socket_path
            self.log_path = self.upstream.log_path
            return
        kubeconfig = kube_api.write_kubeconfig(os.path.join(workdir, "kubeconfig"), token=token)
        config = {"cniVersion": "0.3.1", "logLevel": log_level, "logToStderr": True,
                  "socketDir": self.socket_dir, "cniDir": os.path.join(workdir, "cni"),
                  "binDir": PLUGIN_DIR, "kubeconfig": kubeconfig, "nodeName": name,
                  "confDir": conf_dir, "clusterNetwork": cluster_conf}
        self.config_path = os.path.join(workdir, "daemon-config.json")
        with open(self.config_path, "w") as handle:
            json.dump(config, handle)

    def start(self, clock) -> None:
        self.launched = clock()
        if self.upstream is not None:
            self.proc = self.upstream.start().proc
            return
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "STATE_DIRECTORY": os.path.join(self.workdir, "state")}
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(DAEMON_ARGV + ["serve", "--config", self.config_path],
                                         stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def check_ready(self, clock) -> bool:
        """Whether the daemon says its caches have synced (multusd: /readyz; upstream: its
        /healthz, served once its informers synced); records when it first did."""
        if self.ready:
            return True
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.fleet} {self.name} exited with "
                               f"{self.proc.returncode if self.proc else None}:\n"
                               f"{self.log()[-2000:]}")
        path = api.HEALTH_ENDPOINT if self.upstream is not None else api.READY_ENDPOINT
        try:
            ok = api.http_request(self.socket_path, "GET", path, timeout=2).status == 200
        except OSError:
            ok = False
        if ok:
            self.ready = clock()
        return ok

    def rss_mb(self) -> Optional[float]:
        return rss_mb(self.proc.pid) if self.proc is not None else None

    def cpu_s(self) -> Optional[float]:
        """CPU seconds the daemon has used so far (all its threads, user and system)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, AttributeError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                return handle.read()
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL of its process group after ``timeout``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def cleanup(self) -> None:
        self.stop()
        if self.secrets is not None:
            self.secrets.cleanup()


def start_fleet(kube_api, label: str, group: List[Node], timeout: float,
                settle: float) -> Dict[str, object]:
    """Every node of one fleet started at once (an upgrade); wait until each is ready, then
    ``settle`` s (the start window's tail): which nodes were not ready, when all were."""
    clock = kube_api.clients.clock
    log(f"{label}: {len(group)} daemons started at once")
    launched = clock()
    for node in group:
        node.start(clock)
    late = wait_all_ready(group, clock, timeout)
    ready = [node.ready for node in group if node.ready]
    out = {"not_ready": late, "all_ready_s": round(max(ready) - launched, 1) if ready else None}
    log(f"{label}: ready in {out['all_ready_s']} s" + (f"; not ready: {late}" if late else ""))
    time.sleep(settle)  # measured, not waited on
    return out


def wait_all_ready(nodes: List[Node], clock, timeout: float) -> List[str]:
    """Poll every node until all are ready or ``timeout`` s pass; the names of those not."""
    deadline = time.monotonic() + timeout
    waiting = list(nodes)
    while waiting and time.monotonic() < deadline:
        waiting = [node for node in waiting if not node.check_ready(clock)]
        if waiting:
            time.sleep(0.05)  # a poll interval: readiness is each daemon's own answer
    return [node.name for node in waiting]


def stop_fleet(nodes: List[Node]) -> None:
    """SIGTERM every node at once and wait for each (SIGKILL after the timeout); their
    secrets stay until :func:`stop_all` (another fleet may still use the mount point)."""
    for node in nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in nodes:
        node.stop()


def stop_all(nodes: List[Node]) -> None:
    """SIGTERM every node at once, wait for each (SIGKILL after the timeout), then remove
    the in-cluster secrets' mount point (once no daemon's mount namespace holds it)."""
    stop_fleet(nodes)
    for node in nodes:
        node.cleanup()
