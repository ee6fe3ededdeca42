"""multusd and upstream's Go daemon in alternating rounds: the figures that drift between runs.

On a shared 2-core VM one phase of ``bench.py --upstream-bin`` can land in a slow minute and
the other in a fast one (the plugins-alone row moves by 1.5x within an hour). This keeps
both daemons running at once, each with its own fake API server (upstream's on TLS, as its
in-cluster config requires), and alternates them phase by phase, ``--rounds`` times:

* ``add_ms``/``del_ms``: sequential ADDs of ``--pods`` pods, then their DELs (bench.py's
  latency phase; upstream's client-side rate limit shows here, see bench/README.md);
* ``paced_add_ms``: ADD then DEL of each pod, one pod at a time (its DEL lets upstream's
  rate limit refill: the daemons' own work);
* ``pods_per_s``: ``--pods`` pods at ``--concurrency``, each ADD then DEL;
* ``overhead_add_ms``: the paced ADD minus the same three plugins run alone one after the
  other (``plugins_add_ms``, through multusd.cni.conflist.Engine, right before that side's
  paced phase): everything each Multus adds, shim included;
* ``paired_overhead_ms``: the same without the machine's drift between phases: per pod, the
  plugins alone, then multusd's ADD and upstream's (order flipping), each minus that plugins
  run; the p50 over the pods;
* ``direct_add_ms``: the shim's /cni body POSTed straight to the daemon's socket;
* ``cold_add_ms``: a fresh daemon's first ADD (multusd socket-activated by it; upstream
  started, then asked once /healthz answers, timed from its exec);
* ``shim_add_ms``: each shim's ADD against bench.py's instant daemon;
* ``rss_after_round_mb`` (and the idle RSS after start, once): the daemon under test.

Delegates run strictly one after the other for multusd (``"parallelDelegates": false`` in
bench.py's config) as they always do for upstream. Upstream's column is whatever
``--upstream-bin`` holds (v4.2.x or v4.3.x: v4.3's client-go streams its informers' lists with
WatchList, which tests/kubeapi.py serves).

Prints the medians over the rounds and the ratio multusd / upstream (a JSON line on stdout,
a table on stderr), and removes everything it made. Needs ``--upstream-bin DIR``
(upstream's v4.x ``multus-daemon`` and ``multus-shim``).

    .venv/bin/python bench/alternate.py --upstream-bin DIR [--rounds 3] [--pods 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import lifecycle
import memory
import phases
import rig
import shimcost
import stats
import upstream

FIGURES = ("add_ms", "del_ms", "plugins_add_ms", "plugins_del_ms", "paced_add_ms",
           "overhead_add_ms", "paired_overhead_ms", "direct_add_ms", "direct_del_ms",
           "pods_per_s", "cold_add_ms", "shim_add_ms", "rss_after_round_mb")
LABELS = {"add_ms": "sequential ADD p50 ms", "del_ms": "sequential DEL p50 ms",
          "paced_add_ms": "paced ADD p50 ms (ADD, DEL, next)",
          "overhead_add_ms": "overhead per ADD ms (paced - plugins)",
          "paired_overhead_ms": "overhead per ADD ms, paired per pod",
          "direct_add_ms": "daemon only ADD p50 ms (direct POST)",
          "direct_del_ms": "daemon only DEL p50 ms (direct POST)",
          "plugins_del_ms": "plugins alone DEL p50 ms (just before)",
          "pods_per_s": "pods/s at C=N (ADD then DEL)",
          "cold_add_ms": "first ADD after a cold start ms", "shim_add_ms": "shim ADD, instant daemon ms",
          "rss_after_round_mb": "daemon RSS MB after the round",
          "plugins_add_ms": "plugins alone ADD p50 ms (just before)"}


class Side:
    """One daemon under test with its cluster: multusd's or upstream's."""

    def __init__(self, name: str, daemon: Any, cluster: rig.Cluster,
                 cold: Callable[[], Optional[float]], shim: Callable[[], Optional[float]]) -> None:
        self.name, self.daemon, self.cluster = name, daemon, cluster
        self.cold, self.shim = cold, shim
        self.figures: Dict[str, List[float]] = {key: [] for key in FIGURES}

    def round(self, scratch: rig.Scratch, pods: int, concurrency: int,
              failures: List[str]) -> None:
        latency = phases.latency(self.daemon, self.cluster, pods, failures)
        # the plugins alone right before the paced ADDs: the pair shares the machine's minute
        alone = phases.plugins_direct(scratch, pods, failures)
        plugins_ms = alone["add_ms"].get("p50")
        paced = phases.throughput(self.daemon, self.cluster, 1, pods, failures)
        direct = phases.direct_post(self.daemon, self.cluster, pods, failures)
        loaded = phases.throughput(self.daemon, self.cluster, concurrency, pods, failures)
        paced_ms = paced["add_ms"].get("p50")
        values = {"add_ms": latency["add_ms"].get("p50"), "del_ms": latency["del_ms"].get("p50"),
                  "plugins_add_ms": plugins_ms, "plugins_del_ms": alone["del_ms"].get("p50"),
                  "paced_add_ms": paced_ms,
                  "overhead_add_ms": (round(paced_ms - plugins_ms, 1)
                                      if None not in (paced_ms, plugins_ms) else None),
                  "direct_add_ms": direct["add_ms"].get("p50"),
                  "direct_del_ms": direct["del_ms"].get("p50"),
                  "pods_per_s": loaded["pods_per_s"], "cold_add_ms": self.cold(),
                  "shim_add_ms": self.shim(),
                  "rss_after_round_mb": memory.rss_mb(self.daemon.proc.pid)}
        for key, value in values.items():
            if value is not None:
                self.figures[key].append(value)
        stats.log(f"{self.name}: " + ", ".join(f"{k} {v}" for k, v in values.items()))


def ours(scratch: rig.Scratch, failures: List[str]) -> Side:
    kube_api = rig.start_kube_api(scratch)
    cluster = rig.Cluster(scratch, kube_api)
    config = rig.daemon_config(scratch, kube_api, "verbose")
    daemon = scratch.daemon(config, "alternate").start(activate=True)
    rig.wait_ready(daemon)
    count = [0]

    def cold() -> Optional[float]:
        count[0] += 1
        run = lifecycle.cold_start(config, os.path.join(scratch.workdir, f"cold{count[0]}"),
                                   lifecycle.first_add(cluster), rig.DAEMON_ARGV)
        return run.get("cold_add_ms")

    def shim() -> Optional[float]:
        return shimcost.shim_share(scratch, 10, failures)["packaged_add_instant"].get("p50")

    return Side("multusd", daemon, cluster, cold, shim)


def theirs(scratch: rig.Scratch, bin_dir: str, run: Dict[str, Any],
           failures: List[str]) -> Side:
    from kubeapi import FakeKubeAPI

    workdir = os.path.join(scratch.workdir, "upstream")
    os.makedirs(os.path.join(workdir, "kubeapi"))
    kube_api = FakeKubeAPI(os.path.join(workdir, "kubeapi"), tls=True).start()
    run.update({"bin_dir": bin_dir, "workdir": workdir, "kube_api": kube_api, "daemons": []})
    run["secrets"] = upstream.Secrets(workdir, kube_api)
    run["config"] = upstream.daemon_config(scratch, kube_api, "verbose")
    cluster = rig.Cluster(scratch, kube_api)
    daemon = upstream.new_daemon(run, "alternate").start()
    daemon.wait_socket()
    daemon.wait_healthy()

    def cold() -> Optional[float]:
        return upstream.cold_starts(run, cluster, 1, failures).get("cold_add_ms")

    def shim() -> Optional[float]:
        return upstream.shim_share(scratch, bin_dir, 10, failures)["add_instant"].get("p50")

    return Side("upstream", daemon, cluster, cold, shim)


def paired_overhead(sides: Sequence[Side], scratch: rig.Scratch, count: int,
                    failures: List[str]) -> Dict[str, Optional[float]]:
    """The overhead per ADD without the machine's drift: per pod, the three plugins alone,
    then each side's ADD (and DEL) of a pod of its own, the order flipping pod by pod; the
    p50 over the pods of (ADD - plugins alone, measured moments before)."""
    pods = {side.name: side.cluster.make_pods(count) for side in sides}
    diffs: Dict[str, List[float]] = {side.name: [] for side in sides}
    try:
        for index in range(count):
            alone = phases.plugins_direct(scratch, 1, failures)["add_ms"].get("p50")
            for side in sides if index % 2 == 0 else list(reversed(sides)):
                pod, conf = pods[side.name][index], side.daemon.shim_conf()
                argv = getattr(side.daemon, "shim_argv", None)
                ms, out = stats.timed(lambda: rig.shim("ADD", conf, pod, argv))
                ok = rig.check(out, f"{side.name} paired ADD {pod.name}", failures)
                rig.check(rig.shim("DEL", conf, pod, argv),
                            f"{side.name} paired DEL {pod.name}", failures)
                if ok and alone is not None:
                    diffs[side.name].append(ms - alone)
    finally:
        for side in sides:
            side.cluster.remove_pods(pods[side.name])
    return {name: stats.percentiles(values).get("p50") for name, values in diffs.items()}


def warm_up(side: Side) -> None:
    argv = getattr(side.daemon, "shim_argv", None)
    pods = side.cluster.make_pods(2)
    for pod in pods:
        rig.shim("ADD", side.daemon.shim_conf(), pod, argv)
        rig.shim("DEL", side.daemon.shim_conf(), pod, argv)
    side.cluster.remove_pods(pods)


def summary(sides: Sequence[Side]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key in FIGURES:
        medians = [round(statistics.median(s.figures[key]), 2) if s.figures[key] else None
                   for s in sides]
        ratio = (round(medians[0] / medians[1], 2) if None not in medians and medians[1]
                 else None)
        out[key] = {"multusd": medians[0], "upstream": medians[1], "ratio": ratio,
                    "multusd_all": sides[0].figures[key], "upstream_all": sides[1].figures[key]}
    return out


def print_table(report: Dict[str, Any]) -> None:
    err = sys.stderr
    print(f"\nmultusd and upstream alternating, {report['rounds']} rounds of {report['pods']} "
          f"pods (C={report['concurrency']}), load {report['load_start']} -> "
          f"{report['load_end']}; upstream: {report['upstream_bin']} ({report['upstream_version']}"
          f"); strict delegates; medians over the rounds", file=err)
    print(f"  {'figure':40} {'multusd':>9} {'upstream':>9} {'ratio':>6}   rounds (multusd | "
          "upstream)", file=err)
    for key, row in report["figures"].items():
        label = LABELS.get(key, key).replace("C=N", f"C={report['concurrency']}")
        print(f"  {label:40} {row['multusd']!s:>9} {row['upstream']!s:>9} {row['ratio']!s:>6}   "
              f"{row['multusd_all']} | {row['upstream_all']}", file=err)
    idle = report.get("rss_idle_mb", {})
    print(f"  {'idle RSS MB after start':40} {idle.get('multusd')!s:>9} "
          f"{idle.get('upstream')!s:>9}", file=err)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-bin", required=True, metavar="DIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    missing = upstream.missing(args.upstream_bin)
    if missing:
        parser.error(f"{', '.join(missing)} not found in {args.upstream_bin}")
    scratch = rig.Scratch()
    failures: List[str] = []
    run: Dict[str, Any] = {"daemons": [], "secrets": None}
    report: Dict[str, Any] = {"rounds": args.rounds, "pods": args.pods,
                              "concurrency": args.concurrency,
                              "load_start": round(os.getloadavg()[0], 2)}
    try:
        sides = [ours(scratch, failures), theirs(scratch, args.upstream_bin, run, failures)]
        report["upstream_bin"] = args.upstream_bin
        report["upstream_version"] = upstream.version(args.upstream_bin)
        report["rss_idle_mb"] = {side.name: memory.rss_mb(side.daemon.proc.pid)
                                 for side in sides}
        for side in sides:
            warm_up(side)
        for number in range(args.rounds):
            for side in sides if number % 2 == 0 else reversed(sides):  # neither always first
                side.round(scratch, args.pods, args.concurrency, failures)
            paired = paired_overhead(sides, scratch, args.pods, failures)
            for side in sides:
                if paired[side.name] is not None:
                    side.figures["paired_overhead_ms"].append(paired[side.name])
            stats.log(f"paired overhead per ADD: {paired}")
        report["figures"] = summary(sides)
    finally:
        for daemon in run["daemons"]:
            daemon.cleanup()
        if run.get("kube_api") is not None:
            run["kube_api"].stop()
        if run["secrets"] is not None:
            run["secrets"].cleanup()
        scratch.cleanup()
    report["load_end"] = round(os.getloadavg()[0], 2)
    report["failures"] = failures[:20]
    print(json.dumps(report))
    print_table(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
