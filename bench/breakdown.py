#!/usr/bin/env python3
"""Where an ADD's and a DEL's time goes in the daemon: py-spy samples of its threads, by activity.

    .venv/bin/python -m pip install py-spy      # not a project dependency
    .venv/bin/python bench/breakdown.py [--pods 60] [--rate 1000] [--raw FILE]

A daemon as packaged (bench.py's, Kubernetes mode, eth0 + 2 NADs, strict delegates) serves
``--pods`` sequential ADDs, then their DELs, through the packaged shim, while ``py-spy record
--idle --threads`` samples every thread (waiting included). Each sample of a request thread
(the reactor, the workers and the threads they start) is put in one activity by the frames
on its stack, first match wins (ACTIVITIES), and the table gives each activity's share of the
request threads' samples and its wall ms per request (samples / rate / requests). The
reactor's own line shows what reading and answering costs; "waiting for work" is an idle
worker. One JSON line on stdout, the table on stderr.
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
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402

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
    ("KeyedLocks.acquire", "sandbox lock wait"),
]
MODULES: List[Tuple[str, str]] = [
    ("multusd/kube/", "API: requests, caches, events"),
    ("multusd/store/", "cache files and fsync"),
    ("multusd/node/netns.py", "pod netns (setns thread, ioctl)"),
    ("multusd/daemon/log.py", "logging"),
    ("multusd/daemon/server.py", "server: reading and answering"),
    ("multusd/daemon/httpreq.py", "server: reading and answering"),
    ("multusd/daemon/lanes.py", "server: queueing"),
    ("multusd/core/request.py", "request decoding and validation"),
    ("multusd/wire/", "request decoding and validation"),
    ("multusd/cni/invoke.py", "plugin: other (env, decode)"),
    ("multusd/cni/result.py", "results, network-status"),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--raw", default="", help="keep py-spy's collapsed stacks here")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(bench.PYTHON), "py-spy")
    if not os.path.exists(spy):
        parser.error("needs py-spy: .venv/bin/python -m pip install py-spy")
    scratch = bench.Scratch()
    failures: List[str] = []
    raw = args.raw or os.path.join(scratch.workdir, "profile.txt")
    try:
        kube_api = bench.start_kube_api(scratch)
        cluster = bench.Cluster(scratch, kube_api)
        config = bench.daemon_config(scratch, kube_api, "verbose")
        daemon = scratch.daemon(config, "profiled").start(activate=True)
        bench.wait_ready(daemon)
        warm = cluster.make_pods(3)
        for pod in warm:
            bench.shim("ADD", daemon.shim_conf(), pod)
            bench.shim("DEL", daemon.shim_conf(), pod)
        cluster.remove_pods(warm)
        spy_proc = subprocess.Popen([spy, "record", "--pid", str(daemon.proc.pid), "--rate",
                                     str(args.rate), "--format", "raw", "--output", raw,
                                     "--idle", "--threads", "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
        started = time.perf_counter()
        lat = bench.latency(daemon, cluster, args.pods, failures)
        seconds = time.perf_counter() - started
        spy_proc.send_signal(signal.SIGINT)
        spy_proc.wait(60)
        by_thread = read_raw(raw)
    finally:
        scratch.cleanup()
    requests = 2 * args.pods
    report = {"pods": args.pods, "rate": args.rate, "seconds": round(seconds, 2),
              "add_ms": lat["add_ms"], "del_ms": lat["del_ms"], "threads": by_thread,
              "failures": failures[:5]}
    totals: Dict[str, int] = {}
    for name, activities in by_thread.items():
        if name.startswith(REQUEST_THREADS):
            for activity, count in activities.items():
                totals[activity] = totals.get(activity, 0) + count
    idle = sum(c for a, c in totals.items() if a.startswith(("waiting for work",
                                                             "reactor: epoll")))
    busy = sum(totals.values()) - idle
    report["ms_per_request"] = {a: round(c / args.rate / requests * 1000, 2)
                                for a, c in sorted(totals.items(), key=lambda kv: -kv[1])}
    print(json.dumps(report))
    err = sys.stderr
    print(f"\nprofile: {args.pods} ADDs then their DELs in {seconds:.1f}s, ADD p50 "
          f"{lat['add_ms'].get('p50')} ms, DEL p50 {lat['del_ms'].get('p50')} ms; py-spy at "
          f"{args.rate} Hz; wall ms per request (ADD or DEL) of the request threads:", file=err)
    for activity, ms in report["ms_per_request"].items():
        share = "" if activity.startswith(("waiting for work", "reactor: epoll")) else \
            f"{100 * totals[activity] / max(busy, 1):5.1f}%"
        print(f"  {activity:48} {ms:8.2f} {share}", file=err)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
