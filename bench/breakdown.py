#!/usr/bin/env python3
"""Where an ADD's and a DEL's time goes in the daemon: py-spy samples of its threads, by activity.

    .venv/bin/python -m pip install py-spy      # not a project dependency
    .venv/bin/python bench/breakdown.py [--pods 60] [--rate 250] [--cpu] [--raw FILE]

A daemon as packaged (bench.py's, Kubernetes mode, eth0 + 2 NADs, strict delegates) serves
``--pods`` sequential ADDs, then their DELs, through the packaged shim, while ``py-spy record
--idle --threads`` samples every thread (waiting included), one recording per command. Each
sample of a request thread (the reactor, the workers, the netns helper threads) goes to one
activity by its innermost multusd frame, with the standard library it called (logging and
json count as themselves, wherever called from); the table gives each activity's wall ms per
request (samples / rate / requests). An idle worker and the reactor's epoll wait are listed
apart. One JSON line on stdout, the table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import rig  # noqa: E402  (puts tests/ on the path)
import stats  # noqa: E402
from harness import PYTHON  # noqa: E402

# A sample goes to an activity by its innermost multusd frame (the code that was running, with
# the standard library it called), except that a stack whose innermost frames are in logging or
# json counts there, wherever it was called from.
IDLE = {"Lanes._work": "waiting for work (idle worker)",
        "Server.serve_forever": "reactor: epoll wait"}
STDLIB: List[Tuple[str, str]] = [("logging/", "logging"), ("json/", "JSON encode/decode")]
FUNCTIONS: List[Tuple[str, str]] = [
    ("_PluginRun.start", "plugin: fork/exec"),
    ("_PluginRun.communicate", "plugin: running (waiting for its output)"),
    ("_Output.exchange", "plugin: running (waiting for its output)"),
    ("_Output._pump", "plugin: running (waiting for its output)"),  # its select(): the wait
]
MODULES: List[Tuple[str, str]] = [
    ("multusd/kube/", "API: requests, caches, events"),
    ("multusd/store/", "cache files and fsync"),
    ("multusd/node/netns.py", "pod netns (setns thread, ioctl)"),
    ("multusd/daemon/log.py", "logging"),
    ("multusd/daemon/server.py", "server: reading and answering"),
    ("multusd/daemon/reactor.py", "server: reading and answering"),
    ("multusd/daemon/httpreq.py", "server: reading and answering"),
    ("multusd/daemon/lanes.py", "server: queueing"),
    ("multusd/core/request.py", "request decoding and validation"),
    ("multusd/wire/", "request decoding and validation"),
    ("multusd/cni/invoke.py", "plugin: other (env, decode)"),
    ("multusd/__init__.py", "results, network-status"),
    ("multusd/core/netstatus.py", "results, network-status"),
]
REQUEST_THREADS = ("MainThread", "multusd-worker", "multusd-netns")


def categorize(stack: str) -> str:
    frames = stack.split(";")[1:]  # the first entry is the thread
    last = max((i for i, frame in enumerate(frames) if "multusd/" in frame), default=-1)
    if last < 0:
        return "other (interpreter, threading)"
    frame, inner = frames[last], frames[last + 1:]
    function = frame.split(" (", 1)[0]
    if function in IDLE:
        return IDLE[function]
    for needle, name in STDLIB:
        if any(needle in f for f in inner):
            return name
    for prefix, name in FUNCTIONS:
        if function == prefix:
            return name
    for prefix, name in MODULES:
        if prefix in frame:
            return name
    return "delegates, configs, records (other multusd)"


def read_raw(path: str) -> Dict[str, Dict[str, int]]:
    """thread name -> activity -> samples, from py-spy's raw (collapsed) output."""
    by_thread: Dict[str, Dict[str, int]] = {}
    with open(path) as handle:
        for line in handle:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            thread = stack.split(";", 1)[0]  # "thread (TID): NAME"
            name = thread.partition("): ")[2] or "unnamed"
            activities = by_thread.setdefault(name, {})
            activity = categorize(stack)
            activities[activity] = activities.get(activity, 0) + int(count)
    return by_thread


class Spy:
    """``py-spy record`` of one process into a collapsed-stacks file, until :meth:`stop`."""

    def __init__(self, spy: str, pid: int, rate: int, path: str, idle: bool) -> None:
        self.path = path
        self.proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(rate),
                                      "--format", "raw", "--output", path, "--threads",
                                      "--nonblocking"] + (["--idle"] if idle else []),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> Dict[str, Dict[str, int]]:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        self.proc.wait(60)
        return read_raw(self.path)


def per_request(by_thread: Dict[str, Dict[str, int]], rate: int, requests: int,
                threads: Tuple[str, ...] = REQUEST_THREADS) -> Dict[str, float]:
    totals: Dict[str, int] = {}
    for name, activities in by_thread.items():
        if name.startswith(threads):
            for activity, count in activities.items():
                totals[activity] = totals.get(activity, 0) + count
    return {a: round(c / rate / max(requests, 1) * 1000, 2)
            for a, c in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--rate", type=int, default=250,
                        help="samples per second (py-spy keeps 250 up with the daemon's "
                             "threads on this machine; check effective_rate in the JSON)")
    parser.add_argument("--raw", default="", help="keep py-spy's collapsed stacks as "
                        "RAW.add and RAW.del")
    parser.add_argument("--cpu", action="store_true",
                        help="on-CPU samples only (no --idle), of every thread of the daemon "
                             "(the API client's included): where its CPU goes")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(PYTHON), "py-spy")
    if not os.path.exists(spy):
        parser.error("needs py-spy: .venv/bin/python -m pip install py-spy")
    scratch = rig.Scratch()
    failures: List[str] = []
    raw = args.raw or os.path.join(scratch.workdir, "stacks")
    report: Dict[str, Any] = {"pods": args.pods, "rate": args.rate, "load_start":
                              round(os.getloadavg()[0], 2)}
    try:
        kube_api = rig.start_kube_api(scratch)
        cluster = rig.Cluster(scratch, kube_api)
        config = rig.daemon_config(scratch, kube_api, "verbose")
        daemon = scratch.daemon(config, "profiled").start(activate=True)
        rig.wait_ready(daemon)
        warm = cluster.make_pods(3)
        for pod in warm:
            rig.shim("ADD", daemon.shim_conf(), pod)
            rig.shim("DEL", daemon.shim_conf(), pod)
        cluster.remove_pods(warm)
        pods = cluster.make_pods(args.pods)
        for command in ("ADD", "DEL"):
            spy_run = Spy(spy, daemon.proc.pid, args.rate, f"{raw}.{command.lower()}",
                          idle=not args.cpu)
            samples: List[float] = []
            started = time.perf_counter()
            for pod in pods:
                ms, out = stats.timed(lambda: rig.shim(command, daemon.shim_conf(), pod))
                if rig.check(out, f"{command} {pod.name}", failures):
                    samples.append(ms)
            seconds = time.perf_counter() - started
            time.sleep(1.0)  # as before the loop: the recording is the loop plus 2 s idle
            by_thread = spy_run.stop()
            main_samples = sum(by_thread.get("MainThread", {}).values())
            report[command] = {"shim_ms": stats.percentiles(samples), "threads": by_thread,
                               "loop_s": round(seconds, 2),
                               # py-spy falls behind a rate it cannot keep: then this is low
                               "effective_rate": round(main_samples / (seconds + 2.0)),
                               "ms_per_request": per_request(
                                   by_thread, args.rate, len(pods),
                                   ("",) if args.cpu else REQUEST_THREADS)}
        cluster.remove_pods(pods)
    finally:
        scratch.cleanup()
    report["failures"] = failures[:5]
    print(json.dumps(report))
    err = sys.stderr
    print(f"\nbreakdown: {args.pods} sequential ADDs, then their DELs, py-spy at {args.rate} Hz, "
          f"load {report['load_start']}; " + ("on-CPU ms per request, every thread" if args.cpu
                                                else "wall ms per request, request threads"),
          file=err)
    print(f"  {'activity':48} {'ADD':>8} {'DEL':>8}", file=err)
    names = list(dict.fromkeys(list(report["ADD"]["ms_per_request"]) +
                               list(report["DEL"]["ms_per_request"])))
    for name in names:
        print(f"  {name:48} {report['ADD']['ms_per_request'].get(name, 0):8.2f} "
              f"{report['DEL']['ms_per_request'].get(name, 0):8.2f}", file=err)
    print(f"  {'the shim process, spawn to exit: p50':48} {report['ADD']['shim_ms'].get('p50')!s:>8} "
          f"{report['DEL']['shim_ms'].get('p50')!s:>8}", file=err)
    print(f"  {'loop ms per request (wall, mean)':48} "
          f"{1000 * report['ADD']['loop_s'] / args.pods:8.1f} "
          f"{1000 * report['DEL']['loop_s'] / args.pods:8.1f}", file=err)
    print(f"  {'py-spy effective rate (asked ' + str(args.rate) + ')':48} "
          f"{report['ADD']['effective_rate']:8} {report['DEL']['effective_rate']:8}", file=err)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
