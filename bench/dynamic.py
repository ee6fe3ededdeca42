#!/usr/bin/env python3
"""enableDynamicNetworks: time from a running pod's annotation change to its interface and to
its network-status.

For issue 34: the real daemon (the packaged launcher under systemd-socket-activate) and the real
shim against tests/kubeapi.py's FakeKubeAPI, bridge + host-local in real namespaces. ``--pods``
pods are attached with eth0 only and reported Running; then, one pod after the other, its
``k8s.v1.cni.cncf.io/networks`` is patched to ``bench-net1@dyn1`` (the clock starts at the
write to the stand-in), and the benchmark polls the pod's namespace for ``dyn1`` with its
address (``ip -j``, a few ms a look) and the stand-in's stored pod for a network-status that
lists it; then the annotation is emptied and the same is timed for its removal. Last, the daemon
is restarted and the time until it has looked at every pod's records (each has the history of
an interface added and removed, the costliest look: network-status recomputed and compared) is
taken from its start, with the daemon's CPU time. Prints one JSON line on stdout and a table on
stderr; removes everything it made. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

from rig import NAMESPACE, NETWORKS_ANNOTATION, Scratch, daemon_config, start_kube_api, wait_ready
from stats import percentiles

from harness import call_shim  # noqa: E402 - rig put tests/ on the path
from multusd.wire import api  # noqa: E402

STATUS = "k8s.v1.cni.cncf.io/network-status"
IFNAME = "dyn1"
POLL = 0.002


def address_of(netns_name: str) -> str:
    """The IPv4 address of dyn1 in the namespace ("" while it has none or is not there)."""
    out = subprocess.run(["ip", "-n", netns_name, "-j", "addr", "show", "dev", IFNAME],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return ""
    for link in json.loads(out.stdout):
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet":
                return addr["local"]
    return ""


def listed(kube_api, name: str) -> bool:
    value = (kube_api.pod(NAMESPACE, name)["metadata"]["annotations"]).get(STATUS) or "[]"
    return any(entry.get("interface") == IFNAME for entry in json.loads(value))


def until(condition, timeout: float = 30.0) -> float:
    """Poll ``condition`` from now; the ms until it held (raises after ``timeout`` s)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit("timed out: the daemon did not follow the annotation")
        time.sleep(POLL)
    return (time.monotonic() - started) * 1000.0


def daemon_state(daemon) -> dict:
    """The daemon's dynamicNetworks state from its /status ({} while it has none)."""
    return json.loads(api.http_request(daemon.socket_path, "GET", "/status",
                                       timeout=5).body).get("dynamicNetworks") or {}


def restart_look(daemon, pods: int) -> dict:
    """Restart the daemon; ms from its start until every pod was looked at, its CPU ms then."""
    daemon.terminate()
    started = time.monotonic()
    daemon.start()

    def looked() -> bool:
        state = daemon_state(daemon)
        return state.get("podsChecked", 0) >= pods and state.get("pending") == 0

    until(looked)
    elapsed = (time.monotonic() - started) * 1000.0
    with open(f"/proc/{daemon.proc.pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    cpu_ms = (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")
    return {"all_looked_at_ms": round(elapsed, 1), "daemon_cpu_ms": round(cpu_ms, 1)}


def run(pods: int) -> dict:
    scratch = Scratch()
    try:
        kube_api = start_kube_api(scratch)
        config = dict(daemon_config(scratch, kube_api, "verbose"), enableDynamicNetworks=True)
        daemon = scratch.daemon(config, "daemon").start()
        wait_ready(daemon)
        made = []
        for index in range(pods):
            name = f"dyn-{index}"
            meta = kube_api.add_pod(NAMESPACE, name)["metadata"]
            netns_name, netns_path = scratch.netns()
            cid = uuid.uuid4().hex
            out = call_shim("ADD", daemon.shim_conf("0.3.1"), container_id=cid,
                            netns=netns_path, pod=(NAMESPACE, name), uid=meta["uid"])
            if out.code != 0:
                raise SystemExit(f"ADD failed: {out.output}")
            kube_api.update_pod(NAMESPACE, name, phase="Running")
            made.append((name, netns_name, netns_path, cid, meta["uid"]))
        times = {"add_interface_ms": [], "add_status_ms": [], "remove_interface_ms": [],
                 "remove_status_ms": []}
        for name, netns_name, _, _, _ in made:
            kube_api.update_pod(NAMESPACE, name, annotations={NETWORKS_ANNOTATION:
                                                              f"bench-net1@{IFNAME}"})
            started = time.monotonic()
            times["add_interface_ms"].append(until(lambda: address_of(netns_name)))
            until(lambda: listed(kube_api, name))
            times["add_status_ms"].append((time.monotonic() - started) * 1000.0)
            kube_api.update_pod(NAMESPACE, name, annotations={NETWORKS_ANNOTATION: ""})
            started = time.monotonic()
            times["remove_interface_ms"].append(until(lambda: not address_of(netns_name)))
            until(lambda: not listed(kube_api, name))
            times["remove_status_ms"].append((time.monotonic() - started) * 1000.0)
        until(lambda: daemon_state(daemon).get("pending") == 0)  # the last one counted
        status = {"dynamicNetworks": daemon_state(daemon)}
        restart = restart_look(daemon, pods)
        for name, _, netns_path, cid, uid in made:
            call_shim("DEL", daemon.shim_conf("0.3.1"), container_id=cid, netns=netns_path,
                      pod=(NAMESPACE, name), uid=uid)
        return {"pods": pods, **{k: percentiles(v) for k, v in times.items()},
                "reconciliations": status.get("dynamicNetworks", {}).get("reconciliations"),
                "restart": restart}
    finally:
        scratch.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    args = parser.parse_args()
    figures = run(args.pods)
    print(json.dumps(figures))
    for key in ("add_interface_ms", "add_status_ms", "remove_interface_ms", "remove_status_ms"):
        row = figures[key]
        print(f"{key:22} " + "  ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
    print(f"reconciliations        {figures['reconciliations']}", file=sys.stderr)
    print(f"after a restart        {figures['restart']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
