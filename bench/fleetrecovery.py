"""The fleet's recovery: how a fleet comes back after an API server outage, an ERROR storm, a warm-up.

Each fleet (multusd's, each upstream's) meets each scenario alone, freshly started (all its
nodes at once, then ``settle`` s), so that one herd never queues behind another's and every
node starts from a calm backoff:

* ``outage``: the stand-in stops (every connection cut; connections refused meanwhile) for
  ``outage`` s, while another node's pod changes, and comes back on the same port with a new
  watch cache, as a restarted kube-apiserver does: every resuming watch gets 410 Gone, so every
  node lists again;
* ``storm``: for ``storm`` s every watch ends with an ERROR event 500 "etcdserver: leader
  changed" after delivering what it would first (tests/kubecache.py's ``error_storm``);
* ``warmup``: the stand-in restarts (every connection cut, back on the same port at once)
  while another node's pod changes, and warms up for ``warm_up`` s as a kube-apiserver that
  has just started: 403 to every resource request for half of it (its authorizer has not
  loaded the roles), then 429 "storage is (re)initializing" (Retry-After 1) to every cache
  read and watch; then it is ready, with a new watch cache (a watch resuming from an older
  version gets 410). Measured from its readiness; and the requests of each node in the
  :data:`MINUTE` from the restart.

Measured over the ``window`` s after the server is back (outage), the storm ended or the
server is ready (warmup): when each node's first request came and when its first successful
LIST was served whole, as histograms in 1 s buckets, the fleet's requests per second, its
requests in the window and the most of them the stand-in served at once (a watch counts until
its initial events are out, as in kube-apiserver's max-in-flight); for the storm also each
node's list/watch requests per resource during it. Then the single node: one node of each kind
at once (no herd), fresh for each of ``rounds`` outages, as many storms and as many warm-ups: s
from the server's return (the storm's end, its readiness) to the first LIST served and to every
resource listed, the list/watch requests per resource during a storm, and the requests in the
minute from a warm-up's restart.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import fleetnodes
from fleetnodes import Node
from stats import log

SCENARIOS = (("outage", "the stand-in away (connections refused), back with a new watch "
                        "cache (watches resuming get 410 Gone)"),
             ("storm", "every watch ends with an ERROR event 500 'etcdserver: leader changed'"),
             ("warmup", "the stand-in restarted, warming up (403, then 429 'storage is "
                        "(re)initializing'), then ready with a new watch cache (410 to old "
                        "versions)"))
MINUTE = 60.0  # warmup: each node's requests are counted over this long from the restart
RESOURCES = ("pods", "nads")
LIST_WATCH = ("list", "watchlist", "watch")
MakeNode = Callable[[str, str, str], Node]  # (fleet label, bin dir, node name) -> a node


def selected(args) -> List[Tuple[str, str]]:
    """The :data:`SCENARIOS` ``--scenarios`` asks for, in their order."""
    return [(name, what) for name, what in SCENARIOS if name in args.scenarios]


def node_names(prefix: str, scenario: str, count: int) -> List[str]:
    return [f"{prefix}-{scenario[0]}{number:03d}" for number in range(count)]


def outage(kube_api, other_pod: Sequence[str], seconds: float) -> Tuple[float, float]:
    """The stand-in away for ``seconds`` while another node's pod changes; back with a new
    watch cache. (when it went, when it listened again), on the ledger's clock."""
    clock = kube_api.clients.clock
    went = clock()
    kube_api.update_pod(*other_pod, annotations={"fleet.bench/changed": str(went)})
    return went, kube_api.restart(new_watch_cache=True, down_for=seconds)


def warm_restart(kube_api, other_pod: Sequence[str], seconds: float) -> Tuple[float, float]:
    """The stand-in restarted at once while another node's pod changes (the versions the
    watches hold leave the new watch cache), warming up for ``seconds``: 403 for half of
    it, then 429 (tests/kubefaults.py's ``warm_up``). (when it went, when it was ready), on
    the ledger's clock; returns once it is ready."""
    clock = kube_api.clients.clock
    went = clock()
    kube_api.update_pod(*other_pod, annotations={"fleet.bench/changed": str(went)})
    kube_api.restart(new_watch_cache=True, warm_up=seconds)
    time.sleep(max(0.0, kube_api.ready_at - clock()))  # the warm-up itself
    return went, kube_api.ready_at


def storm(kube_api, seconds: float) -> Tuple[float, float]:
    """An ERROR storm of ``seconds``: (when it began, when it ended), on the ledger's clock
    (the stand-in's storm runs on time.monotonic, as the ledger does)."""
    began = kube_api.clients.clock()
    ended = kube_api.error_storm(seconds)
    time.sleep(max(0.0, ended - kube_api.clients.clock()))  # the storm itself
    return began, ended


def buckets(seconds: List[Optional[float]], width: int) -> List[int]:
    """How many of ``seconds`` fall in each 1 s bucket [0, 1), [1, 2) ... up to ``width``."""
    counts = [0] * width
    for value in seconds:
        if value is not None and 0 <= value < width:
            counts[int(value)] += 1
    return counts


def spread(values: List[Optional[float]]) -> Optional[Dict[str, float]]:
    """Median, min and max of the values that are there, and how many are not (None: none
    are)."""
    there = [v for v in values if v is not None]
    if not there:
        return None
    return {"median": round(statistics.median(there), 2), "min": round(min(there), 2),
            "max": round(max(there), 2), "missing": len(values) - len(there)}


def per_resource(by_kind: Dict[str, int]) -> Dict[str, int]:
    """List, WatchList and watch requests per resource (``pods watch`` counts for pods)."""
    counts = {resource: 0 for resource in RESOURCES}
    for kind, count in by_kind.items():
        resource, _, how = kind.partition(" ")
        if resource in counts and how in LIST_WATCH:
            counts[resource] += count
    return counts


def listed(kube_api, node: Node, since: float) -> Tuple[Optional[float], Optional[float]]:
    """s from ``since`` until a LIST of ``node`` was served (one asked earlier but served
    after counts), and until one of every resource was (None: not yet)."""
    served = kube_api.clients.listed_since(node.client, since)
    first = round(min(served.values()) - since, 2) if served else None
    if any(resource not in served for resource in RESOURCES):
        return first, None
    return first, round(max(served[resource] for resource in RESOURCES) - since, 2)


def recovery_figures(kube_api, group: List[Node], during: Tuple[float, float],
                     after: Tuple[float, float]) -> Dict[str, Any]:
    """A fleet's recovery from the ledger: ``during`` the trouble and the window ``after``."""
    ledger = kube_api.clients
    back, width = after[0], int(round(after[1] - after[0]))
    rows, times = [], []
    for node in group:
        then, now = ledger.window(node.client, *during), ledger.window(node.client, *after)
        first_listed, all_listed = listed(kube_api, node, back)
        rows.append({"node": node.name, "during_requests": then["requests"],
                     "during_per_resource": per_resource(then["by_kind"]),
                     "first_s": None if now["first"] is None else round(now["first"] - back, 2),
                     "first_listed_s": first_listed if first_listed is not None and
                     first_listed < width else None,
                     "all_listed_s": all_listed if all_listed is not None and
                     all_listed < width else None,
                     "requests": now["requests"], "by_kind": now["by_kind"]})
        times.extend(t - back for t, _kind, _query in now["trace"])
    clients = [node.client for node in group]
    return {
        "nodes": len(group), "per_node": rows,
        "requests": sum(row["requests"] for row in rows),
        "requests_per_node": spread([row["requests"] for row in rows]),
        "peak_in_flight": ledger.peak_in_flight(clients, *after),
        "peak_in_flight_during": ledger.peak_in_flight(clients, *during),
        "first_s": spread([row["first_s"] for row in rows]),
        "first_listed_s": spread([row["first_listed_s"] for row in rows]),
        "not_listed": sum(1 for row in rows if row["first_listed_s"] is None),
        "all_listed_s": spread([row["all_listed_s"] for row in rows]),
        "not_all_listed": sum(1 for row in rows if row["all_listed_s"] is None),
        "first_histogram": buckets([row["first_s"] for row in rows], width),
        "listed_histogram": buckets([row["first_listed_s"] for row in rows], width),
        "requests_histogram": buckets(times, width),
        "during_per_resource": {resource: spread([row["during_per_resource"][resource]
                                                  for row in rows]) for resource in RESOURCES},
        "during_s": round(during[1] - during[0], 1)}


def measure(kube_api, label: str, group: List[Node], scenario: str, args,
            other_pod: Sequence[str]) -> Dict[str, Any]:
    """One fleet, freshly started, through one scenario; stopped after its window."""
    start = fleetnodes.start_fleet(kube_api, f"{label}, {scenario}", group, args.start_timeout,
                                   args.settle)
    during = trouble(kube_api, label, scenario, args, other_pod)
    after = (during[1], during[1] + args.after_restart)
    end = max(after[1], during[0] + MINUTE) if scenario == "warmup" else after[1]
    time.sleep(max(0.0, end - kube_api.clients.clock()))  # the window: measured
    fleetnodes.stop_fleet(group)
    figures = dict(recovery_figures(kube_api, group, during, after), **start)
    if scenario == "warmup":
        figures["minute_requests_per_node"] = spread([kube_api.clients.window(
            node.client, during[0], during[0] + MINUTE)["requests"] for node in group])
    return figures


def trouble(kube_api, label: str, scenario: str, args,
            other_pod: Sequence[str]) -> Tuple[float, float]:
    """The stand-in through ``scenario``: (when the trouble began, when it ended: the server
    back, the storm over, the warm-up done)."""
    if scenario == "outage":
        log(f"{label}: the stand-in away for {args.outage} s")
        return outage(kube_api, other_pod, args.outage)
    if scenario == "warmup":
        log(f"{label}: the stand-in restarted, warming up for {args.warm_up} s")
        return warm_restart(kube_api, other_pod, args.warm_up)
    log(f"{label}: an ERROR storm of {args.storm} s")
    return storm(kube_api, args.storm)


def single_node(kube_api, fleets: List[Tuple[str, str]], make_node: MakeNode, args,
                other_pod: Sequence[str]) -> Dict[str, Any]:
    """One node of each fleet at once, fresh each round: ``args.single_rounds`` outages (s
    from the server's return until its first LIST was served, and until every resource's),
    then as many ERROR storms (list/watch requests per resource during the storm, s from its
    end until every resource was listed again)."""
    out: Dict[str, Dict[str, Any]] = {
        label: {"first_listed_s": [], "all_listed_s": [], "storm_requests": [],
                "storm_all_listed_s": [], "warmup_all_listed_s": [],
                "warmup_minute_requests": []} for label, _ in fleets}
    ledger = kube_api.clients
    for scenario, _what in selected(args):
        for number in range(args.single_rounds):
            group = [make_node(label, bin_dir, single_name(label, scenario, number))
                     for label, bin_dir in fleets]
            fleetnodes.start_fleet(kube_api, f"single nodes, {scenario} {number + 1}", group,
                                   args.start_timeout, args.settle)
            during = trouble(kube_api, "single nodes", scenario, args, other_pod)
            back, until = during[1], during[1] + args.single_wait
            while ledger.clock() < until and any(
                    listed(kube_api, node, back)[1] is None for node in group):
                time.sleep(0.1)  # a bench's poll: when each node listed is what is measured
            if scenario == "warmup":  # the minute from the restart: measured, not waited on
                time.sleep(max(0.0, during[0] + MINUTE - ledger.clock()))
            for node in group:
                (first, every), figures = listed(kube_api, node, back), out[node.fleet]
                if scenario == "outage":
                    figures["first_listed_s"].append(first)
                    figures["all_listed_s"].append(every)
                elif scenario == "warmup":
                    figures["warmup_all_listed_s"].append(every)
                    figures["warmup_minute_requests"].append(ledger.window(
                        node.client, during[0], during[0] + MINUTE)["requests"])
                else:
                    figures["storm_requests"].append(per_resource(ledger.window(
                        node.client, *during)["by_kind"]))
                    figures["storm_all_listed_s"].append(every)
            fleetnodes.stop_fleet(group)
    for figures in out.values():
        for key in ("first_listed_s", "all_listed_s", "storm_all_listed_s",
                    "warmup_all_listed_s"):
            figures[key[:-2]] = spread(figures[key])
        figures["warmup_minute"] = spread(figures["warmup_minute_requests"])
        for resource in RESOURCES:
            figures[f"storm_{resource}"] = spread([r[resource] for r in figures["storm_requests"]])
    return out


def single_name(label: str, scenario: str, number: int) -> str:
    return f"{fleetnodes.slug(label)}-1{scenario[0]}{number}"


def run(kube_api, fleets: List[Tuple[str, str]], make_node: MakeNode, nodes: List[Node],
        args, other_pod: Sequence[str]) -> Dict[str, Any]:
    """Every scenario for every fleet in turn, then the single nodes; ``nodes`` collects every
    node made (the caller stops and cleans them all)."""
    report: Dict[str, Any] = {"nodes": args.nodes, "outage_s": args.outage,
                              "storm_s": args.storm, "warm_up_s": args.warm_up,
                              "window_s": args.after_restart,
                              "single_rounds": args.single_rounds,
                              "single_wait_s": args.single_wait, "scenarios": {}}
    for scenario, _what in selected(args):
        report["scenarios"][scenario] = {}
        for label, bin_dir in fleets:
            group = [make_node(label, bin_dir, name) for name in
                     node_names(fleetnodes.slug(label), scenario, args.nodes)]
            nodes.extend(group)
            report["scenarios"][scenario][label] = measure(kube_api, label, group, scenario,
                                                           args, other_pod)
    if args.single_rounds:
        def make_single(label: str, bin_dir: str, name: str) -> Node:
            nodes.append(make_node(label, bin_dir, name))
            return nodes[-1]

        report["single_node"] = single_node(kube_api, fleets, make_single, args, other_pod)
    return report


def all_names(labels: List[str], args) -> List[str]:
    """Every node name the recovery runs, so that the cluster holds their pods from the start."""
    names = []
    for label in labels:
        prefix = fleetnodes.slug(label)
        for scenario, _what in selected(args):
            names.extend(node_names(prefix, scenario, args.nodes))
            names.extend(single_name(label, scenario, n) for n in range(args.single_rounds))
    return names


def _cell(stats: Optional[Dict[str, float]], missing: str = "") -> str:
    """``median (min-max)``; with ``missing`` (what a value missing means): how many were."""
    if not stats:
        return f"none {missing}" if missing else "-"
    cell = f"{stats['median']} ({stats['min']}-{stats['max']})"
    return cell + (f", {stats['missing']} {missing}" if missing and stats["missing"] else "")


def print_recovery(report: Dict[str, Any]) -> None:
    err = sys.stderr
    print(f"\n  recovery: each fleet of {report['nodes']} nodes alone against the stand-in, "
          f"freshly started; outage {report['outage_s']} s, storm {report['storm_s']} s, "
          f"warm-up {report['warm_up_s']} s, window {report['window_s']} s after", file=err)
    for scenario, what in SCENARIOS:
        if scenario not in report["scenarios"]:
            continue
        fleets = report["scenarios"][scenario]
        labels = list(fleets)
        print(f"\n  {scenario}: {what}", file=err)
        print(f"    {'per fleet':34}" + "".join(f"{label:>22}" for label in labels), file=err)
        rows = [("requests in the window", lambda f: str(f["requests"])),
                ("  per node", lambda f: _cell(f["requests_per_node"])),
                ("peak requests in flight", lambda f: str(f["peak_in_flight"])),
                ("most requests in one second", lambda f: str(max(f["requests_histogram"]))),
                ("first request, s", lambda f: _cell(f["first_s"])),
                ("first LIST served, s", lambda f: _cell(f["first_listed_s"])),
                ("  nodes without one", lambda f: str(f["not_listed"])),
                ("every resource listed, s", lambda f: _cell(f["all_listed_s"])),
                ("  nodes without", lambda f: str(f["not_all_listed"]))]
        if scenario == "storm":
            rows += [(f"{resource} list/watch during, per node",
                      lambda f, r=resource: _cell(f["during_per_resource"][r]))
                     for resource in RESOURCES]
            rows.append(("peak in flight during", lambda f: str(f["peak_in_flight_during"])))
        if scenario == "warmup":
            rows.append((f"requests in the {MINUTE:g} s from it, per node",
                         lambda f: _cell(f["minute_requests_per_node"])))
        for title, cell in rows:
            print(f"    {title:34}" + "".join(f"{cell(fleets[label]):>22}" for label in labels),
                  file=err)
        for key, title in (("first_histogram", "nodes' first request"),
                           ("listed_histogram", "nodes' first LIST served"),
                           ("requests_histogram", "the fleet's requests")):
            histograms = [fleets[label][key] for label in labels]
            shown = max([i + 1 for h in histograms for i, n in enumerate(h) if n] + [10])
            since = {"outage": "the server was back", "storm": "the storm",
                     "warmup": "the server was ready"}[scenario]
            print(f"    {title}, by second after {since}:", file=err)
            print(f"      {'s':18}" + "".join(f"{i:>4}" for i in range(shown)), file=err)
            for label, histogram in zip(labels, histograms):
                print(f"      {label:18}" + "".join(f"{n or '.':>4}" for n in histogram[:shown]),
                      file=err)
    single = report.get("single_node")
    if single:
        rounds, wait = report["single_rounds"], report["single_wait_s"]
        print(f"\n  single nodes (one of each fleet at once, fresh daemons), {rounds} outages of "
              f"{report['outage_s']} s, {rounds} storms of {report['storm_s']} s and {rounds} "
              f"restarts warming up {report['warm_up_s']} s; each followed for up to {wait} s",
              file=err)
        labels = list(single)
        print(f"    {'per node':44}" + "".join(f"{label:>30}" for label in labels), file=err)
        late = f"over {wait} s"
        ran = {"outage", "storm", "warmup"} & set(report["scenarios"])
        for key, title, missing in (
                ("first_listed", "outage: s to the first LIST served", late),
                ("all_listed", "outage: s to every resource listed", late),
                ("storm_pods", "storm: pods list/watch requests", ""),
                ("storm_nads", "storm: nads list/watch requests", ""),
                ("storm_all_listed", "storm: s after it to every resource listed", late),
                ("warmup_all_listed", "warm-up: s after ready to every resource listed", late),
                ("warmup_minute", f"warm-up: requests in the {MINUTE:g} s from it", "")):
            if key.startswith(("outage", "first", "all")) and "outage" not in ran or \
                    key.startswith("storm") and "storm" not in ran or \
                    key.startswith("warmup") and "warmup" not in ran:
                continue
            print(f"    {title:44}" + "".join(f"{_cell(single[label][key], missing):>30}"
                                               for label in labels), file=err)
