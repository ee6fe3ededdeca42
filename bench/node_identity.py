#!/usr/bin/env python3
"""ADD wall time and API requests per ADD with the node name given each way, and wrong.

For issue 11: the real daemon (under systemd-socket-activate) and the real shim against
tests/kubeapi.py's FakeKubeAPI, pods on node ``worker-7.example`` (not the host name) with only
the cluster network (bridge + host-local, real plugins, real namespaces). Cases: ``nodeName``,
``MULTUS_NODE_NAME``, the kubeconfig's kubelet client certificate (HTTPS), the host name
(pods on the lowercased host name), and a wrong ``nodeName``. Per case: ``--pods`` ADDs one
after the other (wall time of the shim process, nearest-rank percentiles), then the non-watch
API requests per ADD by kind (events included, waited for), then DELs. Prints one JSON line on
stdout and a table on stderr. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)

from phases import RequestWindow  # noqa: E402
from stats import percentiles, timed  # noqa: E402
from harness import Cluster, Sandbox  # noqa: E402
from kubeapi import FakeKubeAPI  # noqa: E402
from test_node_identity import NODE, kubeconfig_with_certificate  # noqa: E402

HOST = socket.gethostname().strip().lower()
CASES = ["nodeName", "MULTUS_NODE_NAME", "certificate", "hostname", "wrong nodeName"]


def run_case(case: str, pods: int, workdir: str) -> dict:
    os.makedirs(workdir)
    node = HOST if case == "hostname" else NODE
    os.makedirs(os.path.join(workdir, "api"))
    kube = FakeKubeAPI(os.path.join(workdir, "api"), node=node,
                       tls=case == "certificate").start()
    sandbox = Sandbox(os.path.join(workdir, "sandbox"))
    os.makedirs(os.path.join(workdir, "tmp"))
    cluster = Cluster(sandbox, kube, Path(workdir, "tmp"))
    try:
        config: dict = {"nodeName": None}
        env: dict = {}
        if case == "nodeName":
            config["nodeName"] = NODE
        elif case == "MULTUS_NODE_NAME":
            env["MULTUS_NODE_NAME"] = NODE
        elif case == "certificate":
            config["kubeconfig"] = kubeconfig_with_certificate(kube, workdir, NODE, inline=False)
        elif case == "wrong nodeName":
            config["nodeName"] = "wrong-node"
        config["logLevel"] = "verbose"
        made = [cluster.pod(f"p{i}") for i in range(pods)]
        cluster.start(env=env, **config)
        sandboxes = []
        for _ in range(pods):
            sandboxes.append((sandbox.netns()[1], uuid.uuid4().hex))
        window = RequestWindow(kube)
        times = []
        for pod, (ns_path, cid) in zip(made, sandboxes):
            ms, out = timed(lambda: cluster.shim("ADD", pod, ns_path, cid))
            if out.code != 0:
                raise SystemExit(f"{case}: ADD failed: {out.output}")
            times.append(ms)
        kinds = window.close(expected_events=pods) or {}
        for pod, (ns_path, cid) in zip(made, sandboxes):
            cluster.shim("DEL", pod, ns_path, cid)
        mismatch = "node name mismatch" in cluster.daemon.log()
        return {"case": case, "add_ms": percentiles(times),
                "api_requests_per_add": round(sum(kinds.values()) / pods, 2),
                "by_kind_per_add": {k: round(v / pods, 2) for k, v in sorted(kinds.items())},
                "mismatch_reported": mismatch}
    finally:
        sandbox.cleanup()
        kube.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    args = parser.parse_args()
    top = tempfile.mkdtemp(prefix="multusd-bench-node-")
    results = []
    try:
        for index, case in enumerate(CASES):
            results.append(run_case(case, args.pods, os.path.join(top, str(index))))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(json.dumps({"pods": args.pods, "results": results}))
    sys.stderr.write(f"{'case':<18} {'ADD p50':>8} {'p95':>8} {'API req/ADD':>12}  by kind\n")
    for r in results:
        sys.stderr.write(f"{r['case']:<18} {r['add_ms']['p50']:>8} {r['add_ms']['p95']:>8} "
                         f"{r['api_requests_per_add']:>12}  {r['by_kind_per_add']}"
                         f"{'  (mismatch reported)' if r['mismatch_reported'] else ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
