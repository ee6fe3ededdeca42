"""A benchmark run's rig: its scratch, pods, the daemon's launcher and config, the shim's call.

The scratch holds the run's bridges, namespaces, daemons and fake API server and removes them
at the end.

Puts tests/ on the import path (the harness, testlib and the fake API server live there):
import it before ``harness``, ``testlib`` or ``kubeapi``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)

from harness import (DaemonProcess, ShimOutput, bridge_conf, call_shim, del_link,  # noqa: E402
                     del_netns, new_netns)
from testlib import wait_for  # noqa: E402

from multusd.wire import api  # noqa: E402

CNI_VERSION = "0.3.1"
NAMESPACE = "default"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
SECONDARY = ("bench-net1", "bench-net2")
SUBNETS = ("10.231.0.0/16", "10.232.0.0/16", "10.233.0.0/16")
IFNAMES = ("eth0", "net1", "net2")
SHIM_TIMEOUT = 60.0

SYSTEM_PYTHON = "/usr/bin/python3"
LAUNCHER = os.path.join(REPO, ".venv", "bin", "multusd")


def _launcher_argv(path: str) -> Optional[List[str]]:
    """The launcher's interpreter, flags (its #! line, as the kernel runs it) and path."""
    try:
        with open(path) as handle:
            shebang, text = handle.readline(), handle.read()
    except OSError:
        return None
    if not shebang.startswith("#!") or "sys.path.insert" not in text:
        return None
    return shebang[2:].split() + [path]


# The packaged launcher when make setup made it (python3 -IS, the distribution's package
# directories added without their .pth files), else the same thing spelled out.
DAEMON_ARGV = _launcher_argv(LAUNCHER) or [
    SYSTEM_PYTHON, "-IS", "-c", f"import sys, site; sys.path.insert(0, {REPO!r}); "
    "sys.path.extend(p for p in site.getsitepackages() if p not in sys.path); "
    "from multusd.__main__ import main; sys.exit(main())"]


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
                             command=DAEMON_ARGV)
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


def start_kube_api(scratch: Scratch):
    from kubeapi import FakeKubeAPI  # imports pytest: only in Kubernetes mode

    workdir = os.path.join(scratch.workdir, "kubeapi")
    os.makedirs(workdir)
    scratch.kube_api = FakeKubeAPI(workdir).start()
    return scratch.kube_api
