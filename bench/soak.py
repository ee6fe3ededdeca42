#!/usr/bin/env python3
"""Soak: N pods at C concurrent (eth0 + 2 NADs) through the real shim, with R daemon restarts.

    make soak                              # N=1000 C=16 R=5 (root; several minutes)
    .venv/bin/python bench/soak.py -n 50 -c 8 -r 2

The daemon runs under systemd-socket-activate with a kubeconfig for tests/kubeapi.py's fake
API server; each pod is created there with ``k8s.v1.cni.cncf.io/networks: soak-net1,soak-net2``,
gets a real netns, ADD, then DEL (retried, as a runtime does, while the daemon restarts).
A restart is SIGTERM (the daemon drains) and a new daemon on the same socket path and state.
At the end it counts failed calls and what leaked: links in the pod namespaces and on the
host, host-local leases, scratch and result cache files. Prints one JSON line; exit 1 on any
failure or leak. Everything it made is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

from harness import DaemonProcess, Sandbox, call_shim, new_netns, del_netns  # noqa: E402
from kubeapi import FakeKubeAPI  # noqa: E402
from multusd.wire import api  # noqa: E402

DEL_RETRIES = 60


class Soak:
    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.sandbox = Sandbox(os.path.join(workdir, "sandbox"))
        os.makedirs(os.path.join(workdir, "kube"))
        self.kube = FakeKubeAPI(os.path.join(workdir, "kube")).start()
        conf_dir = os.path.join(workdir, "confdir")
        os.makedirs(conf_dir)
        cluster = self.sandbox.net("cluster-net", "10.180.0.0/16", cni_version="0.4.0")
        cluster_path = os.path.join(conf_dir, "10-cluster.conf")
        with open(cluster_path, "w") as handle:
            json.dump(cluster, handle)
        for index, subnet in ((1, "10.181.0.0/16"), (2, "10.182.0.0/16")):
            conf = self.sandbox.net(f"soak-net{index}", subnet, cni_version="0.4.0",
                                    gateway=False)
            conf.pop("name")
            self.kube.add_nad("default", f"soak-net{index}", json.dumps(conf))
        self.config = {"cniVersion": "0.4.0", "kubeconfig": self.kube.kubeconfig_path,
                       "nodeName": self.kube.node, "confDir": conf_dir,
                       "clusterNetwork": cluster_path, "multusNamespace": "kube-system",
                       "binDir": self.sandbox.bin_dir, "logLevel": "error"}
        self.daemon_dir = os.path.join(workdir, "daemon")
        self.daemon: DaemonProcess | None = None
        self.lock = threading.Lock()
        self.failed: list = []
        self.del_retries = 0
        self.namespaces: list = []

    def start_daemon(self) -> None:
        daemon = DaemonProcess(self.config, workdir=self.daemon_dir)
        try:
            os.unlink(daemon.socket_path)  # left by the previous systemd-socket-activate
        except FileNotFoundError:
            pass
        self.daemon = daemon.start()

    def restart(self) -> None:
        old = self.daemon
        old.terminate(60)
        self.start_daemon()

    def pod(self, index: int) -> None:
        name = f"soak-{index}"
        pod = self.kube.add_pod("default", name, annotations={
            "k8s.v1.cni.cncf.io/networks": "soak-net1,soak-net2"})
        ns_name, ns_path = new_netns()
        with self.lock:
            self.namespaces.append(ns_name)
        cid = uuid.uuid4().hex
        conf = self.daemon.shim_conf("0.4.0")
        args = dict(container_id=cid, netns=ns_path, pod=("default", name),
                    uid=pod["metadata"]["uid"])
        add = call_shim("ADD", conf, **args)
        if add.code != 0:
            self.fail(f"ADD {name}: {add.output}")
        elif not (add.output or {}).get("ips"):
            self.fail(f"ADD {name}: no address in the result (pod not found?): {add.output}")
        elif set(_links(ns_name)) - {"lo"} != {"eth0", "net1", "net2"}:
            self.fail(f"ADD {name}: expected eth0, net1, net2; found {_links(ns_name)}")
        for attempt in range(DEL_RETRIES):
            delete = call_shim("DEL", self.daemon.shim_conf("0.4.0"), **args)
            if delete.code == 0:
                break
            with self.lock:
                self.del_retries += 1
            time.sleep(0.5)  # a runtime's retry pace, not synchronisation
        else:
            self.fail(f"DEL {name}: {delete.output}")
        links = set(_links(ns_name)) - {"lo"}
        if links:
            self.fail(f"{name}: links left in its netns: {sorted(links)}")
        self.kube.delete_pod("default", name)

    def fail(self, what: str) -> None:
        with self.lock:
            self.failed.append(what)

    def leaks(self) -> dict:
        cni_dir = self.daemon.cni_dir
        scratch = [f for f in os.listdir(cni_dir) if f != "results"] if os.path.isdir(cni_dir) \
            else []
        results_dir = os.path.join(cni_dir, "results")
        results = os.listdir(results_dir) if os.path.isdir(results_dir) else []
        host_veths = [line for line in subprocess.run(
            ["ip", "-o", "link", "show", "type", "veth"], capture_output=True,
            text=True).stdout.splitlines() if any(b in line for b in self.sandbox._bridges)]
        return {"leases": len(self.sandbox.leases_held()), "scratch_files": len(scratch),
                "result_cache_files": len(results), "host_veths": len(host_veths)}

    def cleanup(self) -> None:
        if self.daemon is not None:
            self.daemon.terminate()
        for name in self.namespaces:
            del_netns(name)
        self.sandbox.cleanup()
        self.kube.stop()


def _links(ns_name: str) -> list:
    out = subprocess.run(["ip", "-n", ns_name, "-j", "link", "show"], capture_output=True,
                         text=True).stdout
    return [link["ifname"] for link in json.loads(out or "[]")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--pods", type=int, default=1000)
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("-r", "--restarts", type=int, default=5)
    options = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="multusd-soak-")
    soak = Soak(workdir)
    started = time.monotonic()
    try:
        soak.start_daemon()
        api.http_request(soak.daemon.socket_path, "GET", "/healthz", timeout=20)
        every = max(1, options.pods // (options.restarts + 1))
        restarts = 0
        with ThreadPoolExecutor(options.concurrency) as pool:
            futures = []
            for index in range(options.pods):
                futures.append(pool.submit(soak.pod, index))
                if index and index % every == 0 and restarts < options.restarts:
                    # Restart while the pods submitted so far are in flight.
                    while sum(not f.done() for f in futures) > options.concurrency:
                        time.sleep(0.05)
                    soak.restart()
                    restarts += 1
            for future in futures:
                try:
                    future.result()
                except Exception as exc:  # a crash of the soak itself is a failure too
                    soak.fail(f"{type(exc).__name__}: {exc}")
        leaks = soak.leaks()
        report = {"pods": options.pods, "concurrency": options.concurrency,
                  "restarts": restarts, "failed_calls": len(soak.failed),
                  "del_retries": soak.del_retries, "leaks": leaks,
                  "seconds": round(time.monotonic() - started, 1),
                  "first_failures": soak.failed[:5]}
        print(json.dumps(report))
        return 1 if soak.failed or any(leaks.values()) else 0
    finally:
        soak.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
