"""The shim's DEL through its packaged launcher: answered at once, and failing (the mark written).

    .venv/bin/python bench/shimdel.py [--repeats 100] [--shim LAUNCHER ...]

Each ``--shim`` is a launcher as the packages install it (default: ``.venv/bin/multus-shim``,
the ``python3 -IS`` copy ``make setup`` writes; another checkout's copy compares two trees).
Two cases per launcher, in alternating rounds so that a busy machine weighs on each alike:

* ``answered``: a stand-in daemon answers the DEL at once (what nearly every DEL is);
* ``failed``: no daemon listens, so the shim marks the sandbox (a fresh container ID each
  time: the first failure, written durably) and imports :mod:`multusd.wire.delwindow`.

Besides wall and CPU ms (p50/p95/p99, mean, min, max, n), each case is run with
``python3 -X importtime`` and the cumulative import time of ``multusd`` (the package the
shim loads first), ``multusd.wire.shim`` and ``multusd.wire.delwindow`` is kept (median µs).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from typing import Dict, List

from rig import CNI_VERSION, REPO  # first: tests/ on the path
from harness import shim_conf
from shimcost import InstantDaemon
from stats import machine, percentiles, timed

DEFAULT_SHIM = os.path.join(REPO, ".venv", "bin", "multus-shim")
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "DEL", "CNI_NETNS": "/dev/null",
       "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
       "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=instant"}
MODULES = ("multusd", "multusd.wire.shim", "multusd.wire.delwindow")
CASES = ("answered", "failed")


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def import_times(stderr: str) -> Dict[str, int]:
    """Cumulative µs of :data:`MODULES` from ``-X importtime``'s lines."""
    found: Dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = [part.strip() for part in line[len("import time:"):].split("|")]
        if len(fields) == 3 and fields[2].strip() in MODULES and fields[1].isdigit():
            found[fields[2].strip()] = int(fields[1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=100, help="DELs per launcher and case")
    parser.add_argument("--shim", action="append", default=[], metavar="LAUNCHER",
                        help="a packaged launcher to run (repeatable; default: .venv's)")
    options = parser.parse_args()
    shims = options.shim or [DEFAULT_SHIM]
    workdir = tempfile.mkdtemp(prefix="multusd-shimdel-")
    daemon = InstantDaemon(os.path.join(workdir, "run"))
    stdin = {"answered": json.dumps(shim_conf(daemon.socket_dir, CNI_VERSION)).encode(),
             "failed": json.dumps(shim_conf(os.path.join(workdir, "nobody"), CNI_VERSION,
                                            cniDir=os.path.join(workdir, "cni"))).encode()}
    keys = [(shim, case) for shim in shims for case in CASES]
    wall: Dict[tuple, List[float]] = {key: [] for key in keys}
    cpu: Dict[tuple, List[float]] = {key: [] for key in keys}
    imports: Dict[tuple, Dict[str, List[int]]] = {key: {m: [] for m in MODULES} for key in keys}
    failures = 0

    def run(argv: List[str], case: str) -> subprocess.CompletedProcess:
        env = dict(ENV, CNI_CONTAINERID=uuid.uuid4().hex)
        return subprocess.run(argv, input=stdin[case], env=env, capture_output=True,
                              timeout=60)

    try:
        for _ in range(options.repeats):
            for shim, case in keys:
                want = 0 if case == "answered" else 1  # within its window: an error
                before = children_cpu_ms()
                ms, proc = timed(lambda: run([shim], case))
                if proc.returncode != want:
                    failures += 1
                    continue
                wall[(shim, case)].append(ms)
                cpu[(shim, case)].append(children_cpu_ms() - before)
                traced = run(["/usr/bin/python3", "-IS", "-X", "importtime", shim], case)
                for module, micros in import_times(traced.stderr.decode()).items():
                    imports[(shim, case)][module].append(micros)
    finally:
        daemon.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"machine": machine(), "failures": failures, "shims": {
        shim: {case: {"wall": percentiles(wall[(shim, case)]),
                      "cpu": percentiles(cpu[(shim, case)]),
                      "import_us_p50": {m: int(statistics.median(v))
                                        for m, v in imports[(shim, case)].items() if v}}
               for case in CASES} for shim in shims}}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
