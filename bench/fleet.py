#!/usr/bin/env python3
"""`make fleet`: K daemons as K nodes against one API server: what each node costs the API.

Every node runs multusd, so what one node asks of the API server, thousands ask at once after
an upgrade or an API server restart. This starts ``--nodes`` daemons (default 50) as that many
nodes, each with its own node name, token, kubeconfig (upstream: in-cluster secrets), cniDir
and socket directory, against ONE stand-in API server (tests/kubeapi.py, on TLS) holding
``--pods`` pods (default 20,000) on ``--other-nodes`` other nodes, ``--pods-per-node`` pods on
each benched node and ``--nads`` NetworkAttachmentDefinitions (default 200). No CNI request is
sent: the figures are the daemons' own API traffic, booked per client by the stand-in (its
ledger, tests/kubeclients.py: the user each node's token names). Per node:

* start: requests and response bytes from the daemon's exec until it is ready (multusd:
  /readyz, upstream: /healthz, both "caches synced") plus ``--settle`` s; how many LISTs were
  watch-cache reads (``resourceVersion=0``, NotOlderThan, WatchList) and how many storage reads
  (etcd reads every object of the resource for each: ``storage objects``), judged from the
  requests themselves, so the figures follow whatever the code does;
* idle: requests and bytes per hour, measured over ``--idle-minutes`` (default 10) of a
  quiet cluster after every fleet has started;
* restart: requests in the ``--after-restart`` s (default 30) after the stand-in's restart
  (every connection cut, the same port back at once, objects and history kept), and when
  each node's first LIST (or WatchList) after it came; then the same after a second restart
  that also compacts the history (``relist``: as on a busy cluster, where the versions the
  watches hold have left the watch cache: every resuming watch gets 410 Gone);
* the daemon's CPU seconds per idle hour, and its RSS at the end of the idle time.

``--upstream-bin DIR`` (repeatable: one fleet per directory, e.g. v4.3.0 and v4.2.4) runs
upstream's ``multus-daemon`` the same way beside multusd's fleet (as bench/upstream.py runs
it). Fleets start one after the other (each fleet all at once, as after an upgrade), then idle
together and meet the restart together.

Then the recovery (bench/fleetrecovery.py): each fleet alone, freshly started, meets an outage
of the stand-in (``--outage`` s, connections refused, back with a new watch cache), an
ERROR storm (``--storm`` s) and a restart that warms up (``--warm-up`` s of 403, then 429,
then ready with a new watch cache): when each node's first request and first successful LIST
came, in 1 s buckets, the stand-in's peak requests in flight and the requests in the window
after (and in the minute from the warm-up's restart); then one node of each fleet through
``--single-rounds`` of each. ``--recovery`` runs only
that (20 nodes per fleet unless ``--nodes`` says otherwise), ``--no-recovery`` skips it.

Prints one JSON line on stdout and the tables on stderr; removes everything it made, on
Ctrl-C and SIGTERM too. Needs root (upstream's private mounts; multusd alone runs without).

    .venv/bin/python bench/fleet.py [--nodes 50] [--upstream-bin DIR ...] [--quick]
    .venv/bin/python bench/fleet.py --recovery [--upstream-bin DIR ...]
    .venv/bin/python bench/fleet.py --recovery --scenarios warmup [--warm-up 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import rig  # noqa: F401 - first: puts tests/ on the path
import fleetnodes
import fleetrecovery
import upstream
from fleetfigures import RESTARTS, node_figures, print_tables, summarise
from fleetnodes import Node, slug
from stats import Interrupted, load_average, log, machine


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None,
                        help="daemons per fleet (default 50; with --recovery 20)")
    parser.add_argument("--pods", type=int, default=20000,
                        help="pods on other nodes (default 20000)")
    parser.add_argument("--pods-per-node", type=int, default=3)
    parser.add_argument("--nads", type=int, default=200)
    parser.add_argument("--other-nodes", type=int, default=400)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--idle-minutes", type=float, default=10.0)
    parser.add_argument("--after-restart", type=float, default=30.0, metavar="S")
    parser.add_argument("--settle", type=float, default=5.0, metavar="S",
                        help="counted as start after a node is ready (default 5)")
    parser.add_argument("--start-timeout", type=float, default=600.0, metavar="S")
    parser.add_argument("--upstream-bin", action="append", default=[], metavar="DIR",
                        help="upstream's multus-daemon in DIR as one more fleet (repeatable)")
    parser.add_argument("--no-multusd", action="store_true", help="upstream's fleets only")
    parser.add_argument("--watch-list", default="serve",
                        choices=("serve", "refused", "no-progress", "ignored"),
                        help="how the stand-in answers a WatchList: streams it (kube-apiserver "
                             "1.34+), refuses it (422: its gate off), refuses it in the stream "
                             "(an etcd without progress requests), ignores it (before 1.19)")
    parser.add_argument("--log-level", default="verbose")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 3 nodes, 2000 pods, 20 NADs, 1 idle minute, "
                             "1 single-node round")
    recovery = parser.add_argument_group("recovery (bench/fleetrecovery.py)")
    recovery.add_argument("--recovery", action="store_true",
                          help="only the recovery: each fleet alone through an outage and an "
                               "ERROR storm, then the single nodes (no start/idle/restart table)")
    recovery.add_argument("--no-recovery", action="store_true",
                          help="only start, idle and the two restarts")
    recovery.add_argument("--outage", type=float, default=10.0, metavar="S",
                          help="how long the stand-in stays away (default 10)")
    recovery.add_argument("--storm", type=float, default=20.0, metavar="S",
                          help="how long every watch ends with an ERROR event (default 20)")
    recovery.add_argument("--warm-up", type=float, default=3.0, metavar="S",
                          help="how long the restarted stand-in warms up: 403 for half of it, "
                               "then 429 'storage is (re)initializing' (default 3)")
    recovery.add_argument("--scenarios", default=",".join(s for s, _ in fleetrecovery.SCENARIOS),
                          metavar="LIST", help="which recovery scenarios to run (default all: "
                          "outage,storm,warmup)")
    recovery.add_argument("--single-rounds", type=int, default=3, metavar="N",
                          help="outages and storms met by one node of each fleet (default 3; "
                               "0: none)")
    recovery.add_argument("--single-wait", type=float, default=90.0, metavar="S",
                          help="how long a single node is followed after each (default 90)")
    args = parser.parse_args(argv)
    if args.nodes is None:
        args.nodes = 20 if args.recovery else 50
    if args.quick:
        args.nodes, args.pods, args.nads, args.idle_minutes = 3, 2000, 20, 1.0
        args.other_nodes, args.namespaces, args.single_rounds = 40, 10, 1
    if args.recovery and args.no_recovery:
        parser.error("--recovery and --no-recovery leave nothing to run")
    args.scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = set(args.scenarios) - {name for name, _ in fleetrecovery.SCENARIOS}
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: {sorted(unknown) or 'none'}: not among "
                     f"{[name for name, _ in fleetrecovery.SCENARIOS]}")
    args.upstream_bin = [os.path.abspath(d) for d in args.upstream_bin]
    for bin_dir in args.upstream_bin:
        if upstream.DAEMON in upstream.missing(bin_dir):
            parser.error(f"--upstream-bin {bin_dir}: no executable {upstream.DAEMON} there")
    if args.no_multusd and not args.upstream_bin:
        parser.error("--no-multusd leaves nothing to run without --upstream-bin")
    return args


def idle(kube_api, nodes: List[Node], minutes: float) -> tuple:
    """``minutes`` of a quiet cluster: (the window, each node's RSS at its end, its CPU
    seconds per hour in it)."""
    clock = kube_api.clients.clock
    log(f"idle for {minutes} minutes")
    began, cpu = clock(), {node.name: node.cpu_s() for node in nodes}
    deadline = time.monotonic() + minutes * 60
    while time.monotonic() < deadline:
        time.sleep(min(60.0, max(0.0, deadline - time.monotonic())))
        gone = [node.name for node in nodes if node.proc.poll() is not None]
        if gone:
            raise RuntimeError(f"daemons exited while idle: {gone}")
    window = (began, clock())
    rss = {node.name: node.rss_mb() for node in nodes}
    hours = (window[1] - window[0]) / 3600
    for node in nodes:
        used, before = node.cpu_s(), cpu[node.name]
        cpu[node.name] = round((used - before) / hours, 1) if None not in (used, before) \
            else None
    return window, rss, cpu


def restarts(kube_api, other_pod: List[str], seconds: float) -> Dict[str, tuple]:
    """The stand-in restarted twice (see RESTARTS); the ``seconds`` after each."""
    clock, windows = kube_api.clients.clock, {}
    for name, what in RESTARTS:
        log(f"{what}; counting for {seconds} s")
        kube_api.stop()
        if name == "relist":  # a busy cluster: other nodes' pods changed, history compacted
            kube_api.update_pod(*other_pod, annotations={"fleet.bench/changed": str(clock())})
            kube_api.compact()  # the versions the watches hold have left the history
        kube_api.start()
        began = clock()
        time.sleep(seconds)  # the window: measured, not waited on
        windows[name] = (began, clock())
    return windows


def run(args: argparse.Namespace, workdir: str, nodes: List[Node], state: Dict[str, Any]):
    from kubeapi import FakeKubeAPI

    report: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(), "options": dict(vars(args)), "fleets": {}}
    os.makedirs(os.path.join(workdir, "kubeapi"))
    kube_api = state["kube_api"] = FakeKubeAPI(os.path.join(workdir, "kubeapi"), tls=True)
    kube_api.port = fleetnodes.quiet_port()  # the same port after every restart
    kube_api.start()
    kube_api.watch_list = args.watch_list
    fleets = ([("multusd", "")] if not args.no_multusd else []) + \
        [(fleetnodes.label_of(d), d) for d in args.upstream_bin]
    names = {label: [] if args.recovery else [f"{slug(label)}-{i:03d}" for i in range(args.nodes)]
             for label, _ in fleets}
    benched = [n for group in names.values() for n in group]
    if not args.no_recovery:
        benched += fleetrecovery.all_names([label for label, _ in fleets], args)
    log(f"filling the stand-in API: {args.pods} pods on {args.other_nodes} other nodes, "
        f"{args.pods_per_node} on each of {len(benched)} benched nodes, {args.nads} NADs")
    started = time.monotonic()
    report["cluster"] = fleetnodes.populate(kube_api, benched, args.pods, args.pods_per_node,
                                            args.nads, args.other_nodes, args.namespaces)
    report["cluster"]["fill_s"] = round(time.monotonic() - started, 1)
    cluster_conf = fleetnodes.cluster_conf(workdir)

    def make_node(label: str, bin_dir: str, name: str) -> Node:
        return Node(kube_api, label, name, os.path.join(workdir, name), cluster_conf, bin_dir,
                    args.log_level)

    if not args.recovery:
        steady(kube_api, args, fleets, names, make_node, nodes, report)
        fleetnodes.stop_fleet(nodes)  # each recovery fleet meets the stand-in alone
    if not args.no_recovery:
        report["recovery"] = fleetrecovery.run(kube_api, fleets, make_node, nodes, args,
                                               report["cluster"]["other_pod"])
    report["machine"]["loadavg_at_end"] = load_average()
    return report


def steady(kube_api, args: argparse.Namespace, fleets: List[Tuple[str, str]],
           names: Dict[str, List[str]], make_node: fleetrecovery.MakeNode, nodes: List[Node],
           report: Dict[str, Any]) -> None:
    """Start, idle and the two restarts, every fleet together (into ``report["fleets"]``)."""
    by_fleet: Dict[str, List[Node]] = {}
    for label, bin_dir in fleets:
        group = by_fleet[label] = [make_node(label, bin_dir, name) for name in names[label]]
        nodes.extend(group)
        report["fleets"][label] = dict(
            fleetnodes.start_fleet(kube_api, label, group, args.start_timeout, args.settle),
            bin_dir=bin_dir or None)
    window, rss, cpu = idle(kube_api, nodes, args.idle_minutes)
    windows = dict(idle=window, **restarts(kube_api, report["cluster"]["other_pod"],
                                           args.after_restart))
    hours = (window[1] - window[0]) / 3600
    report["idle_minutes_measured"] = round(hours * 60, 2)
    for label, group in by_fleet.items():
        rows = []
        for node in group:
            row = node_figures(kube_api, node, args.settle, windows, node is group[0])
            row.update(node=node.name, rss_mb=rss[node.name], idle_cpu_s_per_h=cpu[node.name])
            rows.append(row)
        report["fleets"][label]["per_node"] = rows
        report["fleets"][label]["summary"] = summarise(rows, hours)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("fleet.py needs root (as every benchmark here)", file=sys.stderr)
        return 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a connection per watch
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workdir = tempfile.mkdtemp(prefix="multusd-fleet-")
    nodes: List[Node] = []
    state: Dict[str, Any] = {}

    def on_term(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        report = run(args, workdir, nodes, state)
    except (KeyboardInterrupt, Interrupted):
        log("interrupted: cleaning up")
        return 130
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # the clean-up itself must finish
            signal.signal(signum, signal.SIG_IGN)
        fleetnodes.stop_all(nodes)
        if state.get("kube_api") is not None:
            state["kube_api"].stop()
        shutil.rmtree(workdir, ignore_errors=True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if report["fleets"]:
        print_tables(report)
    if "recovery" in report:
        fleetrecovery.print_recovery(report["recovery"])
    print(json.dumps(report), flush=True)
    failed = [label for label, fleet in report["fleets"].items() if fleet["not_ready"]]
    failed += [f"{label} ({scenario})" for scenario, fleets in
               report.get("recovery", {}).get("scenarios", {}).items()
               for label, fleet in fleets.items() if fleet["not_ready"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
