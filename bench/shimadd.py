"""The shim's ADD through its packaged launcher, against a stand-in daemon that answers at once.

    .venv/bin/python bench/shimadd.py [--repeats 200] [--shim LAUNCHER ...]

Each ``--shim`` is a launcher as the packages install it (default: ``.venv/bin/multus-shim``,
the ``python3 -IS`` copy ``make setup`` writes; another checkout's copy compares two trees).
The launchers run in alternating rounds, so that a busy machine weighs on each alike. Prints
one JSON line (wall and CPU ms per launcher: p50/p95/p99, mean, min, max, n).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Dict, List

from rig import CNI_VERSION, REPO  # first: tests/ on the path
from harness import shim_conf
from shimcost import InstantDaemon
from stats import machine, percentiles, timed

DEFAULT_SHIM = os.path.join(REPO, ".venv", "bin", "multus-shim")
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD",
       "CNI_CONTAINERID": "bench-instant", "CNI_NETNS": "/dev/null", "CNI_IFNAME": "eth0",
       "CNI_PATH": "/opt/cni/bin",
       "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=instant"}


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="ADDs per launcher")
    parser.add_argument("--shim", action="append", default=[], metavar="LAUNCHER",
                        help="a packaged launcher to run (repeatable; default: .venv's)")
    options = parser.parse_args()
    shims = options.shim or [DEFAULT_SHIM]
    workdir = tempfile.mkdtemp(prefix="multusd-shimadd-")
    daemon = InstantDaemon(os.path.join(workdir, "run"))
    stdin = json.dumps(shim_conf(daemon.socket_dir, CNI_VERSION)).encode()
    wall: Dict[str, List[float]] = {shim: [] for shim in shims}
    cpu: Dict[str, List[float]] = {shim: [] for shim in shims}
    failures = 0
    try:
        for _ in range(options.repeats):
            for shim in shims:
                before = children_cpu_ms()
                ms, proc = timed(lambda: subprocess.run([shim], input=stdin, env=ENV,
                                                        capture_output=True, timeout=60))
                if proc.returncode != 0:
                    failures += 1
                    continue
                wall[shim].append(ms)
                cpu[shim].append(children_cpu_ms() - before)
    finally:
        daemon.close()
        os.rmdir(os.path.join(workdir, "run"))
        os.rmdir(workdir)
    print(json.dumps({"machine": machine(), "failures": failures,
                      "shims": {shim: {"wall": percentiles(wall[shim]),
                                       "cpu": percentiles(cpu[shim])} for shim in shims}}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
