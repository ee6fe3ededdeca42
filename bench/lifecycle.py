#!/usr/bin/env python3
"""The daemon's life-cycle figures: cold start, idle memory, stop, and where they go.

Used by bench.py, and runnable alone (root, the fake API server, real plugins)::

    .venv/bin/python bench/lifecycle.py [--repeats 7]

The daemon runs as the package installs it (``/usr/bin/python3 -I`` launcher, here
``.venv/bin/multusd`` which ``make setup`` makes in that form) under
``systemd-socket-activate``. Printed: one JSON line on stdout, a table on stderr.

* ``cold_add_ms``: a daemon that is not running yet; the real shim's ADD (pod with eth0 +
  two NADs, real plugins) from spawn to exit, activation included;
* ``healthz_ms`` / ``readyz_ms``: from the first connection to the answer of /healthz, and
  until /readyz answers 200 (caches synced);
* ``rss_idle_mb``: VmRSS of an idle daemon after readiness;
* ``stop_ms``: SIGTERM with nothing in flight until the process has exited;
* ``importtime``: the largest cumulative imports of one cold start (``-X importtime``);
* ``rss_by_import``: VmRSS after each step of importing what the daemon holds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from rig import (DAEMON_ARGV, REPO, SYSTEM_PYTHON, Cluster, DaemonProcess, Scratch,
                 shim)
from memory import rss_mb
from stats import log, median, timed
from testlib import wait_for

from multusd.wire import api

IMPORT_STEPS = [
    ("python3 -IS, package directories", ""),
    ("multusd request path", "import multusd.daemon.lifecycle, multusd.core.multus"),
    ("+ multusd.kube.client (http.client, ssl)", "import multusd.kube.client"),
    ("+ yaml (a kubeconfig not parsed before)", "import yaml"),
    ("+ systemd.journal", "import systemd.journal, systemd.daemon"),
    ("+ pyroute2 (default-route only)", "import pyroute2"),
    ("+ prometheus_client (metricsPort only)", "import prometheus_client"),
]


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _status(daemon: DaemonProcess, path: str) -> int:
    try:
        return api.http_request(daemon.socket_path, "GET", path, timeout=5).status
    except OSError:
        return 0


def cold_start(config: dict, workdir: str,
               add: Optional[Callable[[DaemonProcess], Optional[float]]],
               argv: List[str]) -> Dict[str, Any]:
    """One cold start: ``add`` (returns the ADD's ms, None when it failed) or /healthz and
    /readyz, into a daemon not running yet; then idle RSS and the stop."""
    daemon = DaemonProcess(config, workdir=workdir, command=argv)
    daemon.start(activate=False)
    out: Dict[str, Any] = {}
    try:
        started = time.perf_counter()
        if add is not None:
            out["cold_add_ms"] = add(daemon)
            out["ok"] = out["cold_add_ms"] is not None
        else:
            out["ok"] = _status(daemon, api.HEALTH_ENDPOINT) == 200
            out["healthz_ms"] = _ms(started)
            wait_for(lambda: _status(daemon, api.READY_ENDPOINT) == 200, 30, interval=0.002,
                     what="/readyz")
            out["readyz_ms"] = _ms(started)
        wait_for(lambda: _status(daemon, api.READY_ENDPOINT) == 200, 30, what="/readyz")
        time.sleep(0.3)  # idle: let the watch threads settle before reading VmRSS
        out["rss_idle_mb"] = rss_mb(daemon.proc.pid)
        stopping = time.perf_counter()
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.wait(30)
        out["stop_ms"] = _ms(stopping)
        out["log"] = daemon.log()
    finally:
        daemon.cleanup()
    return out


def importtime(config: dict, workdir: str, top: int = 12) -> List[Dict[str, Any]]:
    """The largest cumulative imports of one cold start, from ``-X importtime``."""
    argv = [DAEMON_ARGV[0], "-X", "importtime"] + DAEMON_ARGV[1:]
    run = cold_start(config, workdir, None, argv)
    rows = []
    for line in run.get("log", "").splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if match:
            rows.append({"module": match.group(4), "cumulative_ms": int(match.group(2)) / 1000,
                         "depth": (len(match.group(3)) - 1) // 2})
    seen, best = set(), []
    for row in sorted(rows, key=lambda r: -r["cumulative_ms"]):
        if row["module"] not in seen:
            seen.add(row["module"])
            best.append(row)
    return best[:top]


def rss_by_import() -> List[Dict[str, Any]]:
    """VmRSS after each import step, in one fresh ``python3 -IS`` set up as the launcher does
    (what each layer costs)."""
    script = ["import sys, os, site", f"sys.path.insert(0, {REPO!r})",
              "sys.path.extend(p for p in site.getsitepackages() if p not in sys.path)",
              "out = []",
              "def rss():\n    for l in open('/proc/self/status'):\n"
              "        if l.startswith('VmRSS:'): return int(l.split()[1]) / 1024"]
    for label, code in IMPORT_STEPS:
        script.append(f"try:\n    {code or 'pass'}\n    out.append(({label!r}, rss()))\n"
                      f"except ImportError as e:\n    out.append(({label!r} + ' (absent)', rss()))")
    script.append("import json; print(json.dumps(out))")
    text = subprocess.run([SYSTEM_PYTHON, "-IS", "-c", "\n".join(script)], check=True,
                          capture_output=True, text=True).stdout
    steps, previous = [], 0.0
    for label, value in json.loads(text):
        steps.append({"step": label, "rss_mb": round(value, 1),
                      "delta_mb": round(value - previous, 1)})
        previous = value
    return steps


def measure(config: dict, workdir: str, repeats: int,
            add: Optional[Callable[[DaemonProcess], Optional[float]]]) -> Dict[str, Any]:
    """Median figures over ``repeats`` cold starts (with and without a first ADD)."""
    runs, probes = [], []
    for index in range(repeats):
        if add is not None:
            runs.append(cold_start(config, os.path.join(workdir, f"cold{index}"), add,
                                   DAEMON_ARGV))
        probes.append(cold_start(config, os.path.join(workdir, f"probe{index}"), None,
                                 DAEMON_ARGV))
    out: Dict[str, Any] = {"repeats": repeats, "daemon_argv": DAEMON_ARGV[:3]}
    for key, source in (("cold_add_ms", runs), ("healthz_ms", probes), ("readyz_ms", probes),
                        ("rss_idle_mb", probes), ("stop_ms", probes + runs)):
        values = [r.get(key) for r in source]
        out[key] = median(values)
        out[f"{key}_all"] = values
    out["failed"] = sum(1 for r in runs + probes if not r.get("ok"))
    failed = [r for r in runs + probes if not r.get("ok")]
    if failed:
        out["failed_log_tail"] = failed[0].get("log", "")[-2000:]
    out["importtime_top"] = importtime(config, os.path.join(workdir, "importtime"))
    out["rss_by_import"] = rss_by_import()
    return out


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


def cold_start_figures(scratch: Scratch, cluster: Cluster, config: dict, repeats: int,
               failures: List[str]) -> Dict[str, Any]:
    """Cold starts (bench/lifecycle.py): first ADD, /healthz, /readyz, idle RSS, stop."""
    figures = measure(config, os.path.join(scratch.workdir, "cold"), repeats,
                      first_add(cluster))
    figures["ok"] = not figures["failed"] and figures.get("cold_add_ms") is not None
    if not figures["ok"]:
        failures.append(f"{figures['failed']} cold start(s) failed")
    figures["add_ms"] = figures.get("cold_add_ms")
    return figures


def print_report(figures: Dict[str, Any]) -> None:
    err = sys.stderr
    print(f"\ndaemon life cycle, {figures['repeats']} cold starts each (medians; all runs in "
          "the JSON)", file=err)
    for key in ("cold_add_ms", "healthz_ms", "readyz_ms", "rss_idle_mb", "stop_ms"):
        print(f"  {key:20} {figures.get(key)!s:>8}   {figures.get(key + '_all')}", file=err)
    print("  largest imports of a cold start (cumulative ms):", file=err)
    for row in figures["importtime_top"]:
        print(f"    {'  ' * row['depth']}{row['module']:50} {row['cumulative_ms']:7.1f}", file=err)
    print("  RSS by import step (MB, delta):", file=err)
    for row in figures["rss_by_import"]:
        print(f"    {row['step']:42} {row['rss_mb']:6.1f}  +{row['delta_mb']}", file=err)


def main() -> int:
    import argparse
    import tempfile

    from rig import daemon_config, start_kube_api

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    scratch = Scratch()
    try:
        kube_api = start_kube_api(scratch)
        cluster = Cluster(scratch, kube_api)
        config = daemon_config(scratch, kube_api, "verbose")
        figures = measure(config, tempfile.mkdtemp(dir=scratch.workdir), args.repeats,
                          first_add(cluster))
    finally:
        scratch.cleanup()
    print_report(figures)
    print(json.dumps(figures))
    return 1 if figures["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
