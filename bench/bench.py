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
This module holds the options and the order of the run; the phases live in bench/phases.py,
bench/shimcost.py and bench/lifecycle.py, the table in bench/table.py.
Everything it creates (namespaces, bridges, leases, daemons, files) is removed at the end,
also on Ctrl-C or SIGTERM. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from rig import (CNI_VERSION, Cluster, Scratch, daemon_config, shim,  # first: tests/ on the path
                 start_kube_api, wait_ready)
import lifecycle
import phases
import shimcost
import table
import upstream
from memory import rss_mb
from stats import Interrupted, load_average, log, machine
from harness import PYTHON


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
        args.upstream_bin = os.path.abspath(args.upstream_bin)
        if upstream.missing(args.upstream_bin):
            parser.error(f"--upstream-bin {args.upstream_bin}: no executable "
                         f"{' or '.join(upstream.missing(args.upstream_bin))} there")
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
        "cni_version": CNI_VERSION, "log_level": options.log_level,
        "upstream": table.UPSTREAM}
    mode = "k8s" if options.k8s is not False else "delegates"
    kube_api = None
    if mode == "k8s":
        log("Kubernetes mode: starting the fake API server, cold-start ADD")
        try:
            kube_api = start_kube_api(scratch)
            cluster = Cluster(scratch, kube_api)
            config = daemon_config(scratch, kube_api, options.log_level)
            cold = lifecycle.cold_start_figures(scratch, cluster, config,
                                               options.cold_repeats, failures)
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
        cold = lifecycle.cold_start_figures(scratch, cluster, config,
                                               options.cold_repeats, failures)
    report["mode"] = mode
    report["cold_start"] = cold

    log("the shim on its own")
    report["shim"] = shimcost.shim_share(scratch, options.shim_repeats, failures)

    log("starting the daemon under test")
    daemon = scratch.daemon(config, "daemon").start(activate=True)
    wait_ready(daemon)
    pid = daemon.proc.pid
    report["rss_mb"] = {"idle_after_start": rss_mb(pid)}
    warm = cluster.make_pods(2)
    for pod in warm:  # first-request costs (lazy imports, connection pools) stay out
        shim("ADD", daemon.shim_conf(), pod)
        shim("DEL", daemon.shim_conf(), pod)
    cluster.remove_pods(warm)
    report["rss_mb"]["after_warmup"] = rss_mb(pid)

    log(f"latency: {options.pods} pods ADD, then DEL, one at a time")
    profiler = Profiler(pid, options.profile, scratch.workdir) if options.profile else None
    try:
        report["latency"] = phases.latency(daemon, cluster, options.pods, failures)
    finally:
        if profiler is not None:
            profiler.stop()

    log(f"daemon alone: {options.pods} pods, /cni POSTed directly")
    report["direct"] = phases.direct_post(daemon, cluster, options.pods, failures)

    log(f"plugins alone: {options.pods} pods through the CNI engine")
    report["plugins"] = phases.plugins_direct(scratch, options.pods, failures)

    report["throughput"] = {}
    for concurrency in phases.CONCURRENCY:
        count = max(options.throughput_pods, concurrency)
        log(f"throughput: {count} pods at concurrency {concurrency}")
        report["throughput"][str(concurrency)] = phases.throughput(
            daemon, cluster, concurrency, count, failures)
    report["rss_mb"]["after_load"] = rss_mb(pid)
    if options.upstream_bin:
        daemon.terminate()  # multusd's figures are all taken: upstream's daemon runs alone
        report["upstream_measured"] = upstream.measure(options, scratch)
        report["upstream_table"] = table.UPSTREAM
        report["upstream"] = upstream.bar(report["upstream_measured"], table.UPSTREAM)
        failures.extend(report["upstream_measured"]["failures"])
    report["machine"]["loadavg_at_end"] = load_average()
    report["summary"] = table.summary(report)
    report["versus_upstream"] = [dict(zip(("figure", "multusd", "upstream", "ratio", "target"),
                                          row)) for row in table.versus_upstream(report)]
    report["failures"] = failures[:20]
    report["failure_count"] = len(failures)
    return report


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
    table.print_table(report)
    print(json.dumps(report), flush=True)
    return 1 if report["failure_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
