#!/usr/bin/env python3
"""The reboot burst: N sandboxes ADDed by N shims at once, then DELed, beside upstream's daemon.

    make burst                                            # 200 pods, multusd only (root)
    make burst UPSTREAM_BIN=/path/to/bin ROUNDS=2         # beside upstream's daemon
    .venv/bin/python bench/burst.py --pods 200 --upstream-bin DIR --rounds 2

After a node reboots or drains, the runtime starts every pod's sandbox at once. Per round and
per daemon (the order flips each round): a fresh daemon (multusd under systemd-socket-activate
as packaged, upstream's ``multus-daemon`` as bench/upstream.py runs it) with its own fake API
server; ``--pods`` pods created there first (``k8s.v1.cni.cncf.io/networks``: two NADs), each
with a real netns; then all their ADDs at once through the daemon's own shim (a thread per
shim, released together), then all their DELs at once (a DEL that fails is retried as a
runtime does, every 0.5 s, and counted). Meanwhile a separate process asks ``/healthz`` every
``--probe-interval`` s (5 s timeout, as the shim's own probe; at ``--probe-nice``), another asks
the same of a trivial responder (one Python thread that answers 200: what this machine allows
any process at that moment, to read the daemon's figure against), and the memory of the daemon
(RSS) and of the whole tree (PSS of the daemon, its plugins and the shims) is sampled.

Reported per daemon (JSON on stdout, a table on stderr): failed ADDs, DELs that failed their
first attempt and for good, what leaked (links left in the pods' namespaces, veths on the
bridges, host-local leases, scratch and result cache files), ADD and DEL latency as the runtime
sees it, each phase's wall time and pods/s over both, the daemon's peak RSS (VmHWM), the
sampled peak of the tree, and /healthz latency during the burst beside the responder's. Exit 1 on any failure or
leak. Everything it made is removed, on Ctrl-C too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import rig  # noqa: E402  (puts tests/ on the path)
import harness  # noqa: E402
from memory import Sampler, peak_rss_mb  # noqa: E402
from stats import Interrupted, log, percentiles  # noqa: E402
import upstream  # noqa: E402
from testlib import wait_for  # noqa: E402
from multusd.wire import api  # noqa: E402

DEL_RETRIES = 20
DEL_RETRY_PAUSE = 0.5
PROBE_TIMEOUT = 5.0  # what the shim allows its /healthz and /readyz probes


# ---- /healthz from another process (the benchmark's threads must not skew it) -----------------

def probe_main(socket_path: str, interval: float) -> int:
    """``burst.py --probe``: GET /healthz every ``interval`` s until SIGTERM, then print the
    latencies in ms (None for a probe that failed) as JSON."""
    samples: List[Optional[float]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        started = time.perf_counter()
        try:
            ok = api.http_request(socket_path, "GET", api.HEALTH_ENDPOINT,
                                  timeout=PROBE_TIMEOUT).status == 200
        except OSError:
            ok = False
        samples.append(round((time.perf_counter() - started) * 1000, 2) if ok else None)
        stop.wait(interval)
    print(json.dumps(samples), flush=True)
    return 0


def responder_main(socket_path: str) -> int:
    """``burst.py --responder``: the least a daemon can do, the machine's baseline: answer
    every request on ``socket_path`` with 200 from one thread (no GIL to share), until
    SIGTERM."""
    import selectors
    import socket

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            data = conn.recv(65536)
            if not data or b"\r\n\r\n" in data:
                if data:
                    conn.sendall(answer)
                selector.unregister(conn)
                conn.close()


class Baseline:
    """``responder_main`` in its own process, probed beside the daemon during a burst."""

    def __init__(self, workdir: str, interval: float, nice: int) -> None:
        self.path = os.path.join(workdir, "baseline.sock")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--responder",
                                      self.path])
        wait_for(lambda: os.path.exists(self.path), 10, what="the baseline responder")
        self.prober = Prober(self.path, interval, nice)

    def stop(self) -> Dict[str, Any]:
        stats = self.prober.stop()
        self.proc.terminate()
        self.proc.wait(10)
        os.unlink(self.path)
        return stats


class Prober:
    """The /healthz prober process, at ``nice`` (negative: ahead of the burst's shims and
    plugins in the run queue, so that its figures are the daemon's and not its own wait for
    a CPU on an overloaded machine; the same for both daemons)."""

    def __init__(self, socket_path: str, interval: float, nice: int) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--probe",
                                      socket_path, "--probe-interval", str(interval)],
                                     stdout=subprocess.PIPE)
        os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)

    def stop(self) -> Dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        samples = json.loads(out or b"[]")
        answered = [s for s in samples if s is not None]
        stats = percentiles(answered)
        stats["failed"] = len(samples) - len(answered)
        stats["over_100ms"] = sum(1 for s in answered if s > 100)
        return stats


# ---- one burst -------------------------------------------------------------------------------

class Side:
    """One daemon's setup: how to start a fresh one, its shim and its cluster."""

    def __init__(self, name: str, cluster: rig.Cluster, start, argv: Optional[List[str]]):
        self.name, self.cluster, self.start, self.argv = name, cluster, start, argv
        self.rounds: List[Dict[str, Any]] = []


class Shim:
    """One shim process for ``pod``, as harness.call_shim runs it, started at once (the config
    written to its stdin then); :meth:`finish` waits for it."""

    def __init__(self, command: str, conf: dict, pod: rig.Pod, argv: Optional[List[str]]):
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "CNI_COMMAND": command, "CNI_CONTAINERID": pod.container_id,
               "CNI_NETNS": pod.netns_path, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={rig.NAMESPACE};"
                           f"K8S_POD_NAME={pod.name};K8S_POD_INFRA_CONTAINER_ID="
                           f"{pod.container_id};K8S_POD_UID={pod.uid}"}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(list(argv or rig.SHIM_ARGV or harness.SHIM_ARGV),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self.proc.stdin.write(json.dumps(conf).encode())  # far below a pipe's buffer
        self.proc.stdin.close()
        self.proc.stdin = None  # written: communicate() only reads

    def finish(self) -> tuple:
        """(ms from start to exit, exit code, the CNI output or stderr)."""
        out, err = self.proc.communicate(timeout=rig.SHIM_TIMEOUT)
        ms = (time.perf_counter() - self.started) * 1000
        text = out.decode().strip()
        return ms, self.proc.returncode, (json.loads(text) if text else None) or err.decode()


def at_once(pods: Sequence[rig.Pod], command: str, conf: dict,
            argv: Optional[List[str]], done) -> Dict[str, Any]:
    """``command``'s shim for every pod, started by a thread per pod, all released together
    (as a runtime's goroutines start them), then ``done(pod, shim)`` on that thread; the wall
    time from the release to the last ``done``, and until the last shim had started."""
    go = threading.Event()
    starts: List[float] = []

    def run(pod: rig.Pod) -> None:
        go.wait()
        shim = Shim(command, conf, pod, argv)
        starts.append(shim.started)
        done(pod, shim)

    threads = [threading.Thread(target=run, args=(pod,)) for pod in pods]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    return {"seconds": round(time.perf_counter() - started, 2),
            "all_started_s": round(max(starts, default=started) - started, 2)}


def links(ns_name: str) -> List[str]:
    out = subprocess.run(["ip", "-n", ns_name, "-j", "link", "show"], capture_output=True,
                         text=True).stdout
    return [link["ifname"] for link in json.loads(out or "[]") if link["ifname"] != "lo"]


def leaks(scratch: rig.Scratch, cni_dir: str, pods: Sequence[rig.Pod]) -> Dict[str, int]:
    ids = {pod.container_id for pod in pods}
    results_dir = os.path.join(cni_dir, "results")
    scratch_files = [f for f in (os.listdir(cni_dir) if os.path.isdir(cni_dir) else [])
                     if f in ids]
    results = [f for f in (os.listdir(results_dir) if os.path.isdir(results_dir) else [])
               if any(cid in f for cid in ids)]
    veths = 0
    for bridge in scratch.bridges:
        out = subprocess.run(["ip", "-o", "link", "show", "master", bridge],
                             capture_output=True, text=True).stdout
        veths += len(out.splitlines())
    leases = sum(1 for _, _, files in os.walk(scratch.leases) for f in files if f[0].isdigit())
    return {"pod_links": sum(len(links(pod.netns_name)) for pod in pods),
            "host_veths": veths, "leases": leases, "scratch_files": len(scratch_files),
            "result_cache_files": len(results)}


def burst(side: Side, scratch: rig.Scratch, count: int, interval: float, nice: int,
          other_daemons: Sequence[int]) -> Dict[str, Any]:
    """One burst against a fresh daemon of ``side``."""
    daemon = side.start()

    pods = side.cluster.make_pods(count)  # namespaces and API objects before the clock
    conf = daemon.shim_conf()
    lock = threading.Lock()
    out: Dict[str, Any] = {"pods": count, "failures": []}
    add_ms: List[float] = []
    del_ms: List[float] = []
    wrong: List[str] = []
    counters = {"add_failed": 0, "del_first_failed": 0, "del_failed": 0, "del_retries": 0}

    def fail(key: str, what: str) -> None:
        with lock:
            counters[key] += 1
            if len(out["failures"]) < 10:
                out["failures"].append(what[:400])

    def add(pod: rig.Pod, shim: Shim) -> None:
        ms, code, output = shim.finish()
        if code != 0:
            return fail("add_failed", f"ADD {pod.name}: {output}")
        with lock:
            add_ms.append(ms)

    def delete(pod: rig.Pod, shim: Shim) -> None:
        for attempt in range(DEL_RETRIES):
            if attempt:
                time.sleep(DEL_RETRY_PAUSE)  # a runtime's retry pace, not synchronisation
                shim = Shim("DEL", conf, pod, side.argv)
            ms, code, output = shim.finish()
            if code == 0:
                with lock:
                    del_ms.append(ms)  # the successful attempt's own time
                return
            if attempt == 0:
                fail("del_first_failed", f"DEL {pod.name}: {output}")
            with lock:
                counters["del_retries"] += 1
        fail("del_failed", f"DEL {pod.name} failed {DEL_RETRIES} times")

    pid = daemon.proc.pid
    prober = Prober(daemon.socket_path, interval, nice)
    baseline = Baseline(scratch.workdir, interval, nice)
    sampler = Sampler(pid, list(other_daemons) + [prober.proc.pid, baseline.proc.pid,
                                                  baseline.prober.proc.pid])
    sampler.start()
    try:
        out["load_before"] = round(os.getloadavg()[0], 2)
        out["add_phase"] = at_once(pods, "ADD", conf, side.argv, add)
        for pod in pods:  # outside the clock: every pod got its three interfaces
            found = sorted(links(pod.netns_name))
            if found != ["eth0", "net1", "net2"]:
                wrong.append(f"{pod.name}: {found}")
        out["del_phase"] = at_once(pods, "DEL", conf, side.argv, delete)
    finally:
        out["healthz_ms"] = prober.stop()
        out["baseline_ms"] = baseline.stop()
        sampler.stop()
    out["peak_rss_mb"] = peak_rss_mb(pid)
    out["peak_rss_sampled_mb"] = round(sampler.peak_daemon_kb / 1024, 1)
    out["peak_tree_pss_mb"] = round(sampler.peak_tree_kb / 1024, 1)
    out.update(counters)
    out["wrong_interfaces"] = len(wrong)
    out["failures"] += wrong[:5]
    out["leaks"] = leaks(scratch, daemon_cni_dir(daemon), pods)
    out["add_ms"], out["del_ms"] = percentiles(add_ms), percentiles(del_ms)
    total = out["add_phase"]["seconds"] + out["del_phase"]["seconds"]
    out["total_s"] = round(total, 2)
    out["pods_per_s"] = round(count / total, 2) if total else None
    side.cluster.remove_pods(pods)
    stop = getattr(daemon, "terminate", None) or daemon.stop
    stop()
    return out


def daemon_cni_dir(daemon) -> str:
    return getattr(daemon, "cni_dir", None) or os.path.join(daemon.workdir, "cni")


# ---- the two daemons -------------------------------------------------------------------------

def ours(scratch: rig.Scratch, log_level: str, workers: int = 0) -> Side:
    kube_api = rig.start_kube_api(scratch)
    cluster = rig.Cluster(scratch, kube_api)
    config = rig.daemon_config(scratch, kube_api, log_level)
    if workers:
        config["workers"] = workers
    count = [0]

    def start():
        count[0] += 1
        daemon = scratch.daemon(config, f"burst{count[0]}").start(activate=True)
        rig.wait_ready(daemon)
        return daemon

    return Side("multusd", cluster, start, None)


def theirs(scratch: rig.Scratch, bin_dir: str, log_level: str, run: Dict[str, Any]) -> Side:
    from kubeapi import FakeKubeAPI

    workdir = os.path.join(scratch.workdir, "upstream")
    os.makedirs(os.path.join(workdir, "kubeapi"))
    kube_api = FakeKubeAPI(os.path.join(workdir, "kubeapi"), tls=True).start()
    run.update({"bin_dir": bin_dir, "workdir": workdir, "kube_api": kube_api, "daemons": []})
    run["secrets"] = upstream.Secrets(workdir, kube_api)
    run["config"] = upstream.daemon_config(scratch, kube_api, log_level)
    run["version"] = upstream.version(bin_dir)
    cluster = rig.Cluster(scratch, kube_api)
    count = [0]

    def start():
        count[0] += 1
        daemon = upstream.new_daemon(run, f"burst{count[0]}").start()
        daemon.wait_socket()
        daemon.wait_healthy()
        return daemon

    return Side("upstream", cluster, start, [os.path.join(bin_dir, upstream.SHIM)])


# ---- report ----------------------------------------------------------------------------------

ROWS = [
    ("failed ADDs", lambda r: r["add_failed"]),
    ("DELs failed at their first attempt", lambda r: r["del_first_failed"]),
    ("DELs failed for good (20 attempts)", lambda r: r["del_failed"]),
    ("pods without eth0, net1, net2 after ADD", lambda r: r["wrong_interfaces"]),
    ("leaks: pod links/veths/leases/scratch/results",
     lambda r: "/".join(str(v) for v in r["leaks"].values())),
    ("ADD s p50/p95/p99 (shim wall time)", lambda r: _pct(r["add_ms"], 1000)),
    ("DEL s p50/p95/p99", lambda r: _pct(r["del_ms"], 1000)),
    ("ADD phase / DEL phase / total s", lambda r: f"{r['add_phase']['seconds']} / "
     f"{r['del_phase']['seconds']} / {r['total_s']}"),
    ("  all shims of a phase started within s", lambda r: f"{r['add_phase']['all_started_s']} / "
     f"{r['del_phase']['all_started_s']}"),
    ("pods/s (ADD and DEL)", lambda r: r["pods_per_s"]),
    ("daemon peak RSS MB (VmHWM)", lambda r: r["peak_rss_mb"]),
    ("daemon + plugins + shims peak PSS MB", lambda r: r["peak_tree_pss_mb"]),
    ("/healthz ms p50/p95/p99 during the burst", lambda r: _pct(r["healthz_ms"], 1)),
    ("/healthz max ms, over 100 ms, failed (of n)", lambda r: (
        f"{r['healthz_ms'].get('max')}, {r['healthz_ms']['over_100ms']}, "
        f"{r['healthz_ms']['failed']} (of {r['healthz_ms'].get('n', 0) + r['healthz_ms']['failed']})")),
    ("baseline responder ms p50/p95/p99 (same time)", lambda r: _pct(r["baseline_ms"], 1)),
    ("load average before the burst", lambda r: r["load_before"]),
]


def _pct(stats: Dict[str, Any], scale: float) -> str:
    if not stats.get("n"):
        return "-"
    return "/".join(str(round(stats[k] / scale, 2 if scale > 1 else 1))
                    for k in ("p50", "p95", "p99"))


def print_table(report: Dict[str, Any]) -> None:
    err = sys.stderr
    names = list(report["sides"])
    print(f"\nburst: {report['pods']} pods (eth0 + 2 NADs) ADDed by {report['pods']} shims at "
          f"once, then DELed; {report['rounds']} round(s); load {report['load_start']} -> "
          f"{report['load_end']}" + (f"; upstream: {report['upstream_bin']} "
                                     f"({report['upstream_version']})"
                                     if report.get("upstream_bin") else ""), file=err)
    for number in range(report["rounds"]):
        print(f"  {'round ' + str(number + 1):46}" + "".join(f"{n:>28}" for n in names),
              file=err)
        for label, get in ROWS:
            cells = []
            for name in names:
                rounds = report["sides"][name]
                cells.append(str(get(rounds[number])) if number < len(rounds) else "-")
            print(f"  {label:46}" + "".join(f"{c:>28}" for c in cells), file=err)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--upstream-bin", default="", metavar="DIR",
                        help="also burst upstream's multus-daemon + multus-shim found in DIR")
    parser.add_argument("--log-level", default="verbose")
    parser.add_argument("--probe-interval", type=float, default=0.02)
    parser.add_argument("--probe-nice", type=int, default=0,
                        help="the /healthz prober's nice value (default 0, as the shims')")
    parser.add_argument("--workers", type=int, default=0,
                        help="multusd's \"workers\" (default: unset, the daemon's default)")
    parser.add_argument("--probe", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("--responder", metavar="SOCKET", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return probe_main(args.probe, args.probe_interval)
    if args.responder:
        return responder_main(args.responder)
    if os.geteuid() != 0:
        parser.error("needs root: it creates network namespaces and bridges")
    if args.upstream_bin:
        args.upstream_bin = os.path.abspath(args.upstream_bin)
        if upstream.missing(args.upstream_bin):
            parser.error(f"{', '.join(upstream.missing(args.upstream_bin))} not found in "
                         f"{args.upstream_bin}")
    scratch = rig.Scratch()
    run: Dict[str, Any] = {"daemons": [], "secrets": None}
    report: Dict[str, Any] = {"pods": args.pods, "rounds": args.rounds,
                              "probe_nice": args.probe_nice,
                              "load_start": round(os.getloadavg()[0], 2), "sides": {}}

    def on_term(signum: int, _frame: Any) -> None:
        scratch.stopping.set()
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    failed = False
    try:
        sides = [ours(scratch, args.log_level, args.workers)]
        if args.upstream_bin:
            sides.append(theirs(scratch, args.upstream_bin, args.log_level, run))
            report["upstream_version"] = run["version"]
            report["upstream_bin"] = args.upstream_bin
        for side in sides:
            report["sides"][side.name] = side.rounds
        for number in range(args.rounds):
            for side in sides if number % 2 == 0 else list(reversed(sides)):
                log(f"round {number + 1}: {side.name}, {args.pods} pods at once")
                others = [d.proc.pid for d in run["daemons"] + scratch.daemons
                          if d.proc is not None and d.proc.poll() is None]
                result = burst(side, scratch, args.pods, args.probe_interval,
                               args.probe_nice, others)
                side.rounds.append(result)
                log(f"{side.name}: {result['add_failed']} failed ADDs, "
                          f"{result['del_first_failed']} first DELs failed, leaks "
                          f"{result['leaks']}, {result['total_s']} s")
                failed = failed or bool(result["add_failed"] or result["del_failed"]
                                        or result["wrong_interfaces"]
                                        or any(result["leaks"].values()))
    except (KeyboardInterrupt, Interrupted):
        log("interrupted: cleaning up")
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for daemon in run["daemons"]:
            daemon.cleanup()
        if run.get("kube_api") is not None:
            run["kube_api"].stop()
        if run["secrets"] is not None:
            run["secrets"].cleanup()
        scratch.cleanup()
    report["load_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report))
    print_table(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
