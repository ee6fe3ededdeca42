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
together and meet the restart together. Prints one JSON line on stdout and the tables on
stderr; removes everything it made, on Ctrl-C and SIGTERM too. Needs root (upstream's private
mounts; multusd alone runs without).

    .venv/bin/python bench/fleet.py [--nodes 50] [--upstream-bin DIR ...] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import rig  # noqa: F401 - first: puts tests/ on the path
import fleetnodes
import upstream
from fleetnodes import Node
from stats import Interrupted, load_average, log, machine

# the per-node columns of the table: (JSON key, heading, width)
COLUMNS = [("ready_s", "ready s", 7), ("start_requests", "start req", 9),
           ("start_kb", "start KB", 8), ("start_lists", "lists c/s", 9),
           ("start_storage_objects", "stor.obj", 8), ("idle_requests_per_h", "idle req/h", 10),
           ("idle_kb_per_h", "idle KB/h", 9), ("idle_cpu_s_per_h", "CPU s/h", 7),
           ("restart_requests", "rst req", 7),
           ("restart_lists", "rst c/s", 7), ("restart_first_list_s", "rst 1st", 7),
           ("relist_requests", "410 req", 7), ("relist_lists", "410 c/s", 7),
           ("relist_storage_objects", "410 st.obj", 10), ("relist_first_list_s", "410 1st", 7),
           ("rss_mb", "RSS MB", 7)]
# the windows after the start, common to every node: (name, what happened at its start)
RESTARTS = (("restart", "the stand-in restarted (history kept: watches resume)"),
            ("relist", "the stand-in restarted and compacted (watches resuming get 410 Gone)"))
SUMMARY_ROWS = (
    ("ready_s", "s until ready"), ("start_requests", "requests at start"),
    ("start_kb", "KB at start"), ("start_cache_lists", "cache LISTs at start"),
    ("start_storage_lists", "storage LISTs at start"),
    ("start_storage_objects", "objects read from storage"),
    ("idle_requests_per_h", "requests per idle hour"), ("idle_kb_per_h", "KB per idle hour"),
    ("idle_cpu_s_per_h", "daemon CPU s per idle hour"),
    ("restart_requests", "requests, 30 s after restart"),
    ("restart_storage_objects", "  objects read from storage"),
    ("restart_first_list_s", "  first LIST after, s"),
    ("relist_requests", "requests, 30 s after rst+410"),
    ("relist_kb", "  KB"), ("relist_storage_objects", "  objects read from storage"),
    ("relist_first_list_s", "  first LIST after, s"), ("rss_mb", "RSS MB (end of idle)"))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50, help="daemons per fleet (default 50)")
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
                        help="a smoke run: 3 nodes, 2000 pods, 20 NADs, 1 idle minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.nads, args.idle_minutes = 3, 2000, 20, 1.0
        args.other_nodes, args.namespaces = 40, 10
    args.upstream_bin = [os.path.abspath(d) for d in args.upstream_bin]
    for bin_dir in args.upstream_bin:
        if upstream.DAEMON in upstream.missing(bin_dir):
            parser.error(f"--upstream-bin {bin_dir}: no executable {upstream.DAEMON} there")
    if args.no_multusd and not args.upstream_bin:
        parser.error("--no-multusd leaves nothing to run without --upstream-bin")
    return args


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def window_figures(prefix: str, window: Dict[str, Any], since: float) -> Dict[str, Any]:
    """One ledger window as ``<prefix>_*`` figures (first LIST: s after ``since``)."""
    first = window["first_list"]
    return {f"{prefix}_requests": window["requests"],
            f"{prefix}_kb": round(window["bytes"] / 1024, 1),
            f"{prefix}_lists": f"{window['cache_lists']}/{window['storage_lists']}",
            f"{prefix}_cache_lists": window["cache_lists"],
            f"{prefix}_storage_lists": window["storage_lists"],
            f"{prefix}_storage_objects": window["storage_objects"],
            f"{prefix}_first_list_s": round(first - since, 2) if first is not None else None,
            f"{prefix}_by_kind": window["by_kind"]}


def node_figures(kube_api, node: Node, settle: float, windows: Dict[str, tuple],
                 trace: bool = False) -> Dict[str, Any]:
    """One node's figures from the stand-in's ledger: its own start window, then the common
    ones (``trace``: every request's time in its window, kind and query too)."""
    ledger = kube_api.clients
    end = node.ready + settle if node.ready else float("inf")
    spans = {"start": (node.launched, end), **windows}
    seen = {name: ledger.window(node.client, *span) for name, span in spans.items()}
    row: Dict[str, Any] = {"ready_s": round(node.ready - node.launched, 2) if node.ready
                           else None}
    for name, window in seen.items():
        row.update(window_figures(name, window, spans[name][0]))
    hours = (windows["idle"][1] - windows["idle"][0]) / 3600
    row["idle_requests_per_h"] = round(row["idle_requests"] / hours, 1)
    row["idle_kb_per_h"] = round(row["idle_kb"] / hours, 1)
    if trace:
        row["trace"] = {name: [(round(t - spans[name][0], 2), kind, query)
                               for t, kind, query in window["trace"]]
                        for name, window in seen.items()}
    return row


def summarise(rows: List[Dict[str, Any]], hours: float) -> Dict[str, Any]:
    """Median, min, max and total of each number over a fleet's nodes; request kinds per node
    (per node and hour for the idle window)."""
    out: Dict[str, Any] = {"nodes": len(rows)}
    for key in sorted(rows[0]):
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
        if values and not isinstance(rows[0][key], str):
            out[key] = {"median": round(statistics.median(values), 2), "min": min(values),
                        "max": max(values), "total": round(sum(values), 1), "n": len(values)}
    for window in ("start", "idle") + tuple(name for name, _ in RESTARTS):
        kinds: Dict[str, float] = {}
        for row in rows:
            for kind, count in row[f"{window}_by_kind"].items():
                kinds[kind] = kinds.get(kind, 0) + count
        scale = len(rows) * (hours if window == "idle" else 1) or 1
        out[f"{window}_by_kind_per_node"] = {k: round(v / scale, 2)
                                             for k, v in sorted(kinds.items())}
    return out


def start_fleet(kube_api, label: str, group: List[Node], args: argparse.Namespace) -> dict:
    """Every node of one fleet started at once (an upgrade); wait until each is ready."""
    clock = kube_api.clients.clock
    log(f"{label}: {len(group)} daemons started at once")
    launched = clock()
    for node in group:
        node.start(clock)
    late = fleetnodes.wait_all_ready(group, clock, args.start_timeout)
    ready = [node.ready for node in group if node.ready]
    out = {"not_ready": late, "all_ready_s": round(max(ready) - launched, 1) if ready else None}
    log(f"{label}: ready in {out['all_ready_s']} s" + (f"; not ready: {late}" if late else ""))
    time.sleep(args.settle)  # the start window's tail: measured, not waited on
    return out


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
        "machine": machine(), "options": dict(vars(args))}
    os.makedirs(os.path.join(workdir, "kubeapi"))
    kube_api = state["kube_api"] = FakeKubeAPI(os.path.join(workdir, "kubeapi"), tls=True).start()
    kube_api.watch_list = args.watch_list
    fleets = ([("multusd", "")] if not args.no_multusd else []) + \
        [(fleetnodes.label_of(d), d) for d in args.upstream_bin]
    names = {label: [f"{slug(label)}-{i:03d}" for i in range(args.nodes)] for label, _ in fleets}
    log(f"filling the stand-in API: {args.pods} pods on {args.other_nodes} other nodes, "
        f"{args.pods_per_node} on each of {args.nodes * len(fleets)} benched nodes, "
        f"{args.nads} NADs")
    started = time.monotonic()
    report["cluster"] = fleetnodes.populate(
        kube_api, [n for group in names.values() for n in group], args.pods, args.pods_per_node,
        args.nads, args.other_nodes, args.namespaces)
    report["cluster"]["fill_s"] = round(time.monotonic() - started, 1)
    cluster_conf = fleetnodes.cluster_conf(workdir)
    by_fleet: Dict[str, List[Node]] = {}
    report["fleets"] = {}
    for label, bin_dir in fleets:
        group = by_fleet[label] = [
            Node(kube_api, label, name, os.path.join(workdir, name), cluster_conf, bin_dir,
                 args.log_level) for name in names[label]]
        nodes.extend(group)
        report["fleets"][label] = dict(start_fleet(kube_api, label, group, args),
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
    report["machine"]["loadavg_at_end"] = load_average()
    return report


def print_tables(report: Dict[str, Any]) -> None:
    err = sys.stderr
    cluster = report["cluster"]
    print(f"\nfleet benchmark, {report['date']}: {cluster['pods']} pods, {cluster['nads']} NADs; "
          f"idle {report['idle_minutes_measured']} min; load average "
          f"{report['machine']['loadavg_at_start'][0]} at start, "
          f"{report['machine']['loadavg_at_end'][0]} at end", file=err)
    print("  c/s: LISTs read from the watch cache / from storage; st.obj: the objects etcd "
          "read for them;\n  rst: the 30 s after a restart; 410: after a restart that also "
          "compacted; 1st: s to the first LIST", file=err)
    head = " ".join(f"{title:>{width}}" for _key, title, width in COLUMNS)
    for label, fleet in report["fleets"].items():
        late = f"; NOT READY: {fleet['not_ready']}" if fleet["not_ready"] else ""
        print(f"\n  {label} ({fleet['summary']['nodes']} nodes, all ready in "
              f"{fleet['all_ready_s']} s{late})", file=err)
        print(f"  {'node':22} {head}", file=err)
        for row in fleet["per_node"]:
            cells = " ".join(f"{str(row.get(key)):>{width}}" for key, _t, width in COLUMNS)
            print(f"  {row['node']:22} {cells}", file=err)
    labels = list(report["fleets"])
    print("\n  per node: median (min-max) over each fleet", file=err)
    print(f"  {'figure':30}" + "".join(f"{label:>28}" for label in labels), file=err)
    for key, title in SUMMARY_ROWS:
        cells = []
        for label in labels:
            stats = report["fleets"][label]["summary"].get(key)
            cells.append(f"{stats['median']} ({stats['min']}-{stats['max']})" if stats else "-")
        print(f"  {title:30}" + "".join(f"{cell:>28}" for cell in cells), file=err)
    for window in ("start", "idle") + tuple(name for name, _ in RESTARTS):
        print(f"\n  {window}: requests by kind per node{' and hour' if window == 'idle' else ''}",
              file=err)
        for label in labels:
            kinds = report["fleets"][label]["summary"][f"{window}_by_kind_per_node"]
            print(f"    {label}: {json.dumps(kinds).replace(chr(34), '')}", file=err)
    for label in labels:
        first = report["fleets"][label]["per_node"][0]
        print(f"\n  {label}, {first['node']}: its requests (s into the window, kind, query)",
              file=err)
        for window, requests in first["trace"].items():
            for seconds, kind, query in requests[:8]:
                print(f"    {window:8} {seconds:7.2f}  {kind:16} "
                      f"{'&'.join(f'{k}={v}' for k, v in query.items())}", file=err)
            if len(requests) > 8:
                print(f"    {window:8} ... {len(requests) - 8} more", file=err)


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
    print_tables(report)
    print(json.dumps(report), flush=True)
    failed = [label for label, fleet in report["fleets"].items() if fleet["not_ready"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
