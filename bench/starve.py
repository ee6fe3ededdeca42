"""A pod's ADD and DEL while the cluster network's STATUS (or GC) hangs and runtimes keep asking.

    .venv/bin/python bench/starve.py [--calls 40] [--over 10] [--hold 100] [--kinds STATUS,GC]

(root: real namespaces and plugins.) The daemon (the packaged launcher, under
systemd-socket-activate, default ``workers`` and ``requestTimeout``) has two networks: the
cluster network, ``stub-hold`` (tests/stubs) at cniVersion 1.1.0, whose STATUS (or GC) is held
for ``--hold`` seconds while its hold file exists (its node agent hangs), and a bridge +
host-local network beside it. For each kind: a pod's ADD and DEL on the quiet daemon (the
reference); then the hold file is made and ``--calls`` shims of that kind start over
``--over`` seconds (a few minutes of kubelet polling through containerd, or a few runtimes);
once they are all started, another pod's ADD and then its DEL, and beside them the DEL of a
pod ADDed before. Meanwhile /healthz is timed
every 0.1 s, and the daemon's threads and plugin processes are counted. Then the hold file
goes (the agent recovers) and one more call of the kind is made.

Prints one JSON line (per kind: ``quiet``/``held`` ADD and DEL ms, ``other_del`` ms, the calls' answer seconds
and codes, /healthz worst ms, threads and plugin processes at most, the plugin runs of the
kind, the call after the recovery) and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List

from rig import CNI_VERSION, NAMESPACE, REPO, SHIM_ARGV, SUBNETS, Pod, Scratch, bridge_conf
from harness import PLUGIN_DIR, call_shim, shim_bound
from memory import children_by_parent
from stats import load_average, log, machine, percentiles

from multusd.wire import api

SAMPLE = 0.1  # how often /healthz, the threads and the plugin processes are looked at


def pod(scratch: Scratch, name: str) -> Pod:
    netns_name, netns_path = scratch.netns()
    return Pod(f"{name}-{scratch.tag}", uuid.uuid4().hex, netns_name, netns_path)


def bin_dir(scratch: Scratch) -> str:
    """The real plugins and the test stubs side by side (as the tests' sandbox has them)."""
    directory = os.path.join(scratch.workdir, "bin")
    if not os.path.isdir(directory):
        os.makedirs(directory)
        for source in (PLUGIN_DIR, os.path.join(REPO, "tests", "stubs")):
            for name in os.listdir(source):
                os.symlink(os.path.join(source, name), os.path.join(directory, name))
    return directory


def threads_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("Threads:"))
    except (OSError, StopIteration):
        return 0


class Watch(threading.Thread):
    """/healthz, the daemon's threads and its child processes, every :data:`SAMPLE` s."""

    def __init__(self, daemon) -> None:
        super().__init__(name="starve-watch", daemon=True)
        self.daemon_process = daemon
        self.done = threading.Event()
        self.healthz_ms: List[float] = []
        self.healthz_failed = 0
        self.threads = 0
        self.plugins = 0

    def run(self) -> None:
        pid = self.daemon_process.proc.pid
        while not self.done.wait(SAMPLE):
            started = time.perf_counter()
            try:
                ok = api.http_request(self.daemon_process.socket_path, "GET",
                                      api.HEALTH_ENDPOINT, timeout=5).status == 200
            except OSError:
                ok = False
            self.healthz_ms.append((time.perf_counter() - started) * 1000)
            self.healthz_failed += not ok
            self.threads = max(self.threads, threads_of(pid))
            self.plugins = max(self.plugins, len(children_by_parent().get(pid, [])))


def node_call(kind: str, conf: dict) -> Dict[str, Any]:
    """One STATUS or GC as a runtime makes it (no sandbox, no CNI_ARGS): its seconds, code."""
    started = time.monotonic()
    try:
        out = call_shim(kind, conf, cni_args="", argv=SHIM_ARGV)
    except subprocess.TimeoutExpired:
        return {"s": round(time.monotonic() - started, 2), "exit": None, "code": None,
                "msg": f"no answer within {shim_bound(kind):.0f}s"}
    output = out.output if isinstance(out.output, dict) else {}
    return {"s": round(time.monotonic() - started, 2), "exit": out.code,
            "code": output.get("code"), "msg": (output.get("msg") or "")[:200]}


def timed_shim(command: str, conf: dict, target: Pod) -> Dict[str, Any]:
    """A pod's ADD or DEL through the packaged shim, given the shim's own bound (rig's is
    shorter: it would cut the ADD that waits behind a hung STATUS)."""
    started = time.perf_counter()
    try:
        out = call_shim(command, conf, container_id=target.container_id,
                        netns=target.netns_path, pod=(NAMESPACE, target.name), uid=target.uid,
                        argv=SHIM_ARGV)
    except subprocess.TimeoutExpired:
        return {"ms": round((time.perf_counter() - started) * 1000, 1), "exit": None,
                "msg": f"no answer within {shim_bound(command):.0f}s"}
    output = out.output if isinstance(out.output, dict) else {}
    return {"ms": round((time.perf_counter() - started) * 1000, 1), "exit": out.code,
            "msg": (output.get("msg") or "")[:200] if out.code else ""}


def runs_of(record: str, command: str) -> tuple:
    """(runs of ``command`` the cluster network's plugin saw, those begun while another was
    held: the most at once is one more than that when they overlap)."""
    try:
        with open(record) as handle:
            lines = [json.loads(line) for line in handle]
    except OSError:
        return 0, 0
    ran = [line for line in lines if line["command"] == command]
    return (sum("overlap" not in line for line in ran), sum("overlap" in line for line in ran))


def one_kind(scratch: Scratch, kind: str, calls: int, over: float, hold: float) -> Dict[str, Any]:
    subdir = f"{kind.lower()}-{len(scratch.daemons)}"
    hold_dir = os.path.join(scratch.workdir, subdir + "-hold")
    os.makedirs(hold_dir)
    record = os.path.join(hold_dir, "calls.jsonl")
    cluster = {"cniVersion": "1.1.0", "name": "agent-net", "type": "stub-hold",
               "holdDir": hold_dir, "holdOn": [kind], "holdFor": hold, "recordFile": record}
    secondary = bridge_conf("bench-net1", scratch.bridges[1], SUBNETS[1], scratch.leases,
                            CNI_VERSION)
    daemon = scratch.daemon({"cniVersion": "1.1.0", "logLevel": "error",
                             "binDir": bin_dir(scratch),
                             "delegates": [cluster, secondary]}, subdir).start()
    conf = daemon.shim_conf("1.1.0")
    quiet_pod, held_pod, other_pod = (pod(scratch, name) for name in ("quiet", "held", "other"))
    quiet = {"add": timed_shim("ADD", conf, quiet_pod), "del": timed_shim("DEL", conf, quiet_pod)}
    assert timed_shim("ADD", conf, other_pod)["exit"] == 0, "the other pod's ADD failed"
    threads_idle = threads_of(daemon.proc.pid)

    watch = Watch(daemon)
    watch.start()
    open(os.path.join(hold_dir, "node"), "w").close()  # the agent hangs from now on
    answers: List[Dict[str, Any]] = []
    callers = []
    began = time.monotonic()
    for number in range(calls):
        due = began + over * number / max(calls - 1, 1)
        time.sleep(max(0.0, due - time.monotonic()))
        caller = threading.Thread(target=lambda: answers.append(node_call(kind, conf)),
                                  daemon=True)
        caller.start()
        callers.append(caller)
    held: Dict[str, Any] = {}
    other = threading.Thread(target=lambda: held.update(
        other_del=timed_shim("DEL", conf, other_pod)), daemon=True)
    other.start()  # a pod ADDed before: its DEL beside the new pod's ADD
    held["add"] = timed_shim("ADD", conf, held_pod)
    held["del"] = timed_shim("DEL", conf, held_pod)
    other.join(shim_bound("DEL"))
    os.unlink(os.path.join(hold_dir, "node"))  # the agent recovers
    for caller in callers:
        caller.join(200)
    watch.done.set()
    watch.join(10)
    runs = runs_of(record, kind)  # before the call after the recovery
    recovered = node_call(kind, conf)
    daemon.terminate()
    seconds = [a["s"] for a in answers]
    return {"kind": kind, "calls": calls, "over_s": over, "hold_s": hold,
            "quiet": quiet, "held": held,
            "answers_s": percentiles(seconds) if seconds else {},
            "answer_codes": {code: [str(a["code"]) for a in answers].count(code)
                             for code in sorted({str(a["code"]) for a in answers})},
            "answer_msgs": sorted({a["msg"] for a in answers})[:3],
            "plugin_runs": runs[0], "plugin_runs_begun_beside_another": runs[1],
            "healthz_ms": percentiles(watch.healthz_ms), "healthz_failed": watch.healthz_failed,
            "threads_idle": threads_idle, "threads_max": watch.threads,
            "plugin_processes_max": watch.plugins, "after_recovery": recovered}


def table(report: Dict[str, Any]) -> None:
    for row in report["kinds"]:
        kind, held, quiet = row["kind"], row["held"], row["quiet"]
        log(f"{kind} held {row['hold_s']:.0f}s, {row['calls']} calls over {row['over_s']:.0f}s:")
        log(f"  ADD {held['add']['ms']:.0f} ms (exit {held['add']['exit']}; quiet "
            f"{quiet['add']['ms']:.0f} ms), its DEL {held['del']['ms']:.0f} ms (exit "
            f"{held['del']['exit']}; quiet {quiet['del']['ms']:.0f} ms), another pod's DEL "
            f"beside the ADD {held['other_del']['ms']:.0f} ms (exit {held['other_del']['exit']})")
        answers = row["answers_s"]
        log(f"  {kind} answered in {answers.get('p50')}/{answers.get('max')} s (p50/max), "
            f"codes {row['answer_codes']} (None: success), plugin runs {row['plugin_runs']} "
            f"({row['plugin_runs_begun_beside_another']} begun beside another)")
        log(f"  /healthz p50/max {row['healthz_ms'].get('p50')}/{row['healthz_ms'].get('max')} ms"
            f" ({row['healthz_failed']} failed); threads {row['threads_idle']} idle, "
            f"{row['threads_max']} at most; plugin processes at most {row['plugin_processes_max']}")
        after = row["after_recovery"]
        log(f"  after the recovery: {kind} exit {after['exit']} in {after['s']} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--over", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=100.0)
    parser.add_argument("--kinds", default="STATUS,GC")
    options = parser.parse_args()
    scratch = Scratch()
    report: Dict[str, Any] = {"machine": machine(), "kinds": []}
    try:
        for kind in options.kinds.split(","):
            report["kinds"].append(one_kind(scratch, kind.strip().upper(), options.calls,
                                            options.over, options.hold))
    finally:
        scratch.cleanup()
    report["machine"]["loadavg_at_end"] = load_average()
    print(json.dumps(report))
    table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
