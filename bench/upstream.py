"""Upstream Multus thick (the Go ``multus-daemon`` + ``multus-shim``), measured as bench.py
measures multusd: ``bench.py --upstream-bin DIR`` runs these phases after its own.

DIR holds upstream's v4.x ``multus-daemon`` and ``multus-shim`` binaries; nothing of upstream
is part of this repository. The daemon runs on the host (no container, no chroot)
with a daemon-config.json whose directories are in the benchmark's scratch directory, the
same real plugins (testlib.PLUGIN_DIR), the same bridges and leases, the same pod shapes (eth0
from a cluster-network conf file + the NADs bench-net1 and bench-net2) and an instance of the
same fake API server (tests/kubeapi.py), which must use TLS here: upstream's daemon only
builds its Kubernetes client from the in-cluster config (``https://$KUBERNETES_SERVICE_HOST``,
the token and CA under /var/run/secrets/kubernetes.io/serviceaccount). Those two files are
bind-mounted into a mount namespace of the daemon's own (created in the child before exec,
mounts under /run/netns still propagate into it); on the host only an empty /run/secrets
directory exists during the run (made if missing, removed at the end). Its client sends
protobuf bodies; the fake decodes them (tests/kubeproto.py).

Measured, as for multusd: cold starts (exec to the socket, to /healthz answered, to the first
ADD answered; idle RSS; SIGTERM to exit), the shim against an instant daemon, sequential ADD
then DEL through upstream's shim with the API requests and CPU per pod, the /cni body POSTed
straight to the socket, pods/s at each concurrency, RSS idle / after warm-up / after load.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import rig  # first: puts tests/ on the path
import phases
from rig import CNI_VERSION, SHIM_TIMEOUT, Cluster, Pod
from shimcost import InstantDaemon, measure_commands
from memory import rss_mb
from stats import Interrupted, log, median, timed
from harness import call_shim, read_log, shim_conf
from testlib import PLUGIN_DIR, bind_in_private_mounts, wait_for

from multusd.wire import api

DAEMON, SHIM = "multus-daemon", "multus-shim"
SECRETS = "/run/secrets"  # /var/run is /run; rest.InClusterConfig's fixed paths are below it
SERVICE_ACCOUNT = os.path.join("kubernetes.io", "serviceaccount")


def missing(bin_dir: str) -> List[str]:
    """The binaries ``bin_dir`` lacks (or cannot execute)."""
    return [name for name in (DAEMON, SHIM)
            if not os.access(os.path.join(bin_dir, name), os.X_OK)]


def version(bin_dir: str) -> str:
    proc = subprocess.run([os.path.join(bin_dir, DAEMON), "-version"], capture_output=True,
                          text=True, timeout=10)
    return proc.stdout.strip()


# ---- the daemon's own mount namespace --------------------------------------------------------


class Secrets:
    """The in-cluster token and CA for one fake API server, and the host's mount point.

    ``token``: another the server accepts (a node of a fleet, bench/fleet.py), not its own."""

    def __init__(self, scratch_dir: str, kube_api, token: Optional[str] = None) -> None:
        self.root = os.path.join(scratch_dir, "secrets")
        folder = os.path.join(self.root, SERVICE_ACCOUNT)
        os.makedirs(folder, mode=0o700)
        with open(os.path.join(folder, "token"), "w") as handle:
            handle.write(token or kube_api.token)
        shutil.copyfile(kube_api.ca_path, os.path.join(folder, "ca.crt"))
        self.made_mount_point = not os.path.lexists(SECRETS)
        if self.made_mount_point:
            os.mkdir(SECRETS, 0o755)
        # in the child, before exec: a private mount namespace with the secrets in it
        self.preexec = bind_in_private_mounts(self.root, SECRETS)

    def cleanup(self) -> None:
        if self.made_mount_point:
            try:
                os.rmdir(SECRETS)
            except OSError:
                pass


class UpstreamDaemon:
    """``multus-daemon -config <workdir>/daemon-config.json``, started and stopped here.

    Looks like harness.DaemonProcess to bench/phases.py (``proc``, ``socket_path``,
    ``shim_conf``) and carries ``shim_argv``: upstream's shim runs instead of multusd's.
    """

    def __init__(self, bin_dir: str, config: Dict[str, Any], workdir: str, kube_api,
                 secrets: Secrets, node: str = "") -> None:
        self.workdir = workdir
        self.socket_dir = os.path.join(workdir, "run")
        self.socket_path = api.socket_path(self.socket_dir)
        self.config_path = os.path.join(workdir, "daemon-config.json")
        self.log_path = os.path.join(workdir, "daemon.log")
        self.argv = [os.path.join(bin_dir, DAEMON), "-config", self.config_path]
        self.shim_argv = [os.path.join(bin_dir, SHIM)]
        self.secrets = secrets
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "MULTUS_NODE_NAME": node or kube_api.node,
                    "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                    "KUBERNETES_SERVICE_PORT": str(kube_api.port)}
        out_dir = os.path.join(workdir, "net.d")  # where the daemon writes its 00-multus.conf
        os.makedirs(out_dir)
        full = dict(config, socketDir=self.socket_dir, cniDir=os.path.join(workdir, "cni"),
                    cniConfigDir=out_dir)
        with open(self.config_path, "w") as handle:
            json.dump(full, handle)
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0.0

    def start(self) -> "UpstreamDaemon":
        with open(self.log_path, "ab") as log_file:
            self.started = time.perf_counter()
            self.proc = subprocess.Popen(self.argv, stdout=log_file, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True,
                                         preexec_fn=self.secrets.preexec)
        return self

    def shim_conf(self, cni_version: str = CNI_VERSION, **extra: Any) -> dict:
        return shim_conf(self.socket_dir, cni_version, **extra)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{DAEMON} exited with {self.proc.returncode}:\n"
                               f"{self.log()[-3000:]}")

    def wait_socket(self, timeout: float = 30.0) -> float:
        """ms from exec until the socket exists (listening; requests wait for the caches)."""
        def listening() -> bool:
            self._check_alive()
            return os.path.exists(self.socket_path)
        wait_for(listening, timeout, interval=0.001, what=f"{DAEMON} socket")
        return round((time.perf_counter() - self.started) * 1000, 1)

    def wait_healthy(self, timeout: float = 30.0) -> float:
        """ms from exec until /healthz answers 200 (served once the informers synced)."""
        def healthy() -> bool:
            self._check_alive()
            try:
                return api.http_request(self.socket_path, "GET", api.HEALTH_ENDPOINT,
                                        timeout=5).status == 200
            except OSError:
                return False
        wait_for(healthy, timeout, interval=0.001, what=f"{DAEMON} /healthz")
        return round((time.perf_counter() - self.started) * 1000, 1)

    def stop(self, timeout: float = 30.0) -> Optional[float]:
        """SIGTERM until the process is gone (ms); SIGKILL the group after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        stopping = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None
        return round((time.perf_counter() - stopping) * 1000, 1)

    def log(self) -> str:
        return read_log(self.log_path)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---- the phases ------------------------------------------------------------------------------

def daemon_config(scratch, kube_api, log_level: str) -> Dict[str, Any]:
    """Upstream's daemon-config.json keys for bench.py's networks (NADs added to ``kube_api``)."""
    ours = rig.daemon_config(scratch, kube_api, log_level)
    return {"cniVersion": CNI_VERSION, "logLevel": log_level, "logToStderr": True,
            "binDir": PLUGIN_DIR, "kubeconfig": kube_api.kubeconfig_path,
            "clusterNetwork": ours["clusterNetwork"], "confDir": ours["confDir"],
            "multusAutoconfigDir": ours["confDir"], "multusConfigFile": "auto"}


def shim_call(daemon, command: str, pod: Pod):
    return rig.shim(command, daemon.shim_conf(), pod, daemon.shim_argv)


def cold_starts(run: Dict[str, Any], cluster: Cluster, repeats: int,
                failures: List[str]) -> Dict[str, Any]:
    """Fresh daemons: exec to socket, to /healthz, to the first ADD answered; RSS; stop."""
    rows = []
    for index in range(repeats):
        if cluster.scratch.stopping.is_set():
            raise Interrupted()
        daemon = new_daemon(run, f"cold{index}")
        pod = cluster.make_pods(1)[0]
        row: Dict[str, Any] = {}
        try:
            daemon.start()
            row["socket_ms"] = daemon.wait_socket()
            row["healthz_ms"] = daemon.wait_healthy()
            ms, out = timed(lambda: shim_call(daemon, "ADD", pod))
            row["cold_add_ms"] = round((time.perf_counter() - daemon.started) * 1000, 1)
            row["first_add_shim_ms"] = round(ms, 1)
            row["ok"] = rig.check(out, f"upstream cold-start ADD {pod.name}", failures)
            rig.check(shim_call(daemon, "DEL", pod), f"upstream cold-start DEL {pod.name}",
                        failures)
            time.sleep(0.3)  # idle: as lifecycle.py lets multusd settle before reading VmRSS
            row["rss_idle_mb"] = rss_mb(daemon.proc.pid)
            row["stop_ms"] = daemon.stop()
        except (RuntimeError, AssertionError) as exc:
            failures.append(f"upstream cold start {index}: {str(exc)[:500]}")
            row["ok"] = False
        finally:
            daemon.cleanup()
            cluster.remove_pods([pod])
        rows.append(row)
    out: Dict[str, Any] = {"repeats": repeats}
    for key in ("cold_add_ms", "socket_ms", "healthz_ms", "first_add_shim_ms", "rss_idle_mb",
                "stop_ms"):
        values = [row.get(key) for row in rows]
        out[key] = median(values)
        out[f"{key}_all"] = values
    out["failed"] = sum(1 for row in rows if not row.get("ok"))
    return out


def shim_share(scratch, bin_dir: str, repeats: int, failures: List[str]) -> Dict[str, Any]:
    """Upstream's shim against bench.py's instant daemon: its own wall and CPU ms."""
    instant = InstantDaemon(os.path.join(scratch.workdir, "upstream-instant"))
    conf = shim_conf(instant.socket_dir, CNI_VERSION)
    fake_pod = Pod("instant", "bench-instant", "", "/dev/null")
    argv = [os.path.join(bin_dir, SHIM)]
    variants = {"version": lambda: call_shim("VERSION", conf, argv=argv,
                                             timeout=SHIM_TIMEOUT).code,
                "add_instant": lambda: rig.shim("ADD", conf, fake_pod, argv).code,
                "del_instant": lambda: rig.shim("DEL", conf, fake_pod, argv).code}
    try:
        return measure_commands(variants, repeats, scratch, failures,
                                      "upstream shim measurement")
    finally:
        instant.close()


def new_daemon(run: Dict[str, Any], name: str) -> UpstreamDaemon:
    daemon = UpstreamDaemon(run["bin_dir"], run["config"],
                            os.path.join(run["workdir"], name), run["kube_api"], run["secrets"])
    run["daemons"].append(daemon)
    return daemon


def measure(options, scratch) -> Dict[str, Any]:
    """Every upstream phase; failures are listed in the result (``failures``)."""
    from kubeapi import FakeKubeAPI

    failures: List[str] = []
    workdir = os.path.join(scratch.workdir, "upstream")
    os.makedirs(os.path.join(workdir, "kubeapi"))
    kube_api = FakeKubeAPI(os.path.join(workdir, "kubeapi"), tls=True).start()
    run: Dict[str, Any] = {"bin_dir": options.upstream_bin, "workdir": workdir,
                           "kube_api": kube_api, "daemons": [], "secrets": None}
    report: Dict[str, Any] = {"version": version(options.upstream_bin),
                              "bin_dir": options.upstream_bin}
    try:
        run["secrets"] = Secrets(workdir, kube_api)
        run["config"] = daemon_config(scratch, kube_api, options.log_level)
        report["daemon_config"] = run["config"]
        cluster = Cluster(scratch, kube_api)

        log(f"upstream: {options.cold_repeats} cold starts")
        report["cold_start"] = cold_starts(run, cluster, options.cold_repeats, failures)

        log("upstream: the shim on its own")
        report["shim"] = shim_share(scratch, options.upstream_bin, options.shim_repeats,
                                    failures)

        log("upstream: starting the daemon under test")
        daemon = new_daemon(run, "daemon").start()
        report["start"] = {"socket_ms": daemon.wait_socket(),
                           "healthz_ms": daemon.wait_healthy()}
        pid = daemon.proc.pid
        report["rss_mb"] = {"idle_after_start": rss_mb(pid)}
        warm = cluster.make_pods(2)
        for pod in warm:
            shim_call(daemon, "ADD", pod)
            shim_call(daemon, "DEL", pod)
        cluster.remove_pods(warm)
        report["rss_mb"]["after_warmup"] = rss_mb(pid)

        log(f"upstream: latency: {options.pods} pods ADD, then DEL, one at a time")
        report["latency"] = phases.latency(daemon, cluster, options.pods, failures)
        log(f"upstream: daemon alone: {options.pods} pods, /cni POSTed directly")
        report["direct"] = phases.direct_post(daemon, cluster, options.pods, failures)
        report["throughput"] = {}
        for concurrency in phases.CONCURRENCY:
            count = max(options.throughput_pods, concurrency)
            log(f"upstream: throughput: {count} pods at concurrency {concurrency}")
            report["throughput"][str(concurrency)] = phases.throughput(
                daemon, cluster, concurrency, count, failures)
        report["rss_mb"]["after_load"] = rss_mb(pid)
        time.sleep(0.3)
        report["stop_after_load_ms"] = daemon.stop()
    except (RuntimeError, AssertionError, OSError) as exc:
        failures.append(f"upstream: {str(exc)[:1500]}")
        log(f"upstream phases failed: {str(exc)[:1500]}")
    finally:
        for daemon in run["daemons"]:
            if failures and daemon.proc is not None:
                report.setdefault("log_tail", daemon.log()[-3000:])
            daemon.cleanup()
        kube_api.stop()
        if run["secrets"] is not None:
            run["secrets"].cleanup()
    report["failures"] = failures[:20]
    report["failure_count"] = len(failures)
    return report


def bar(measured: Dict[str, Any], table: Dict[str, Any]) -> Dict[str, Any]:
    """The measured figures under table.UPSTREAM's keys (plugins alone: from ``table``)."""
    lat = measured.get("latency", {})
    shim = measured.get("shim", {})

    def get(stats: Optional[Dict[str, Any]], key: str = "p50") -> Any:
        return (stats or {}).get(key)

    api_add, api_del = lat.get("api_requests_add"), lat.get("api_requests_del")
    return {"measured": True,
            "add_p50_ms": get(lat.get("add_ms")), "del_p50_ms": get(lat.get("del_ms")),
            "pods_per_s_c8": get(measured.get("throughput", {}).get("8"), "pods_per_s"),
            "daemon_add_p50_ms": get(measured.get("direct", {}).get("add_ms")),
            "shim_add_ms": get(shim.get("add_instant")),
            "shim_del_ms": get(shim.get("del_instant")),
            "cold_start_add_ms": measured.get("cold_start", {}).get("cold_add_ms"),
            "rss_idle_mb": measured.get("rss_mb", {}).get("idle_after_start"),
            "stop_ms": measured.get("cold_start", {}).get("stop_ms"),
            "api_requests_per_add": get(api_add, "per_pod"),
            "api_requests_per_del": get(api_del, "per_pod"),
            "plugins_add_ms": table["plugins_add_ms"]}


# ---- the side-by-side table ------------------------------------------------------------------

def print_report(report: Dict[str, Any]) -> None:
    """Every figure of both daemons, one row each (stderr)."""
    up = report["upstream_measured"]
    err = sys.stderr

    def row(label: str, ours: Any, theirs: Any) -> None:
        print(f"  {label:46} {str(ours):>24} {str(theirs):>24}", file=err)

    def pct(stats: Optional[Dict[str, Any]]) -> str:
        if not stats or not stats.get("n"):
            return "-"
        return f"{stats.get('p50')}/{stats.get('p95')}/{stats.get('p99')}"

    def cpu(stats: Optional[Dict[str, Any]]) -> str:
        return "/".join(str((stats or {}).get(k)) for k in ("daemon", "plugins", "shims", "bench"))

    def api_requests(lat: Dict[str, Any]) -> str:
        add, dele = lat.get("api_requests_add") or {}, lat.get("api_requests_del") or {}
        return f"{add.get('per_pod', '-')} / {dele.get('per_pod', '-')}"

    lat, ulat = report["latency"], up.get("latency", {})
    cold, ucold = report["cold_start"], up.get("cold_start", {})
    print(f"\n  side by side, measured in this run ({up.get('version') or 'upstream'}; "
          f"its fake API server on TLS, as in-cluster config requires)", file=err)
    row("figure", "multusd", "upstream (measured)")
    row("ADD ms p50/p95/p99 (shim wall time)", pct(lat["add_ms"]), pct(ulat.get("add_ms")))
    c1 = up.get("throughput", {}).get("1", {}).get("add_ms", {}).get("p50")
    if c1 and (ulat.get("add_ms") or {}).get("p50", 0) > 1.3 * c1:
        print(f"    (upstream's back-to-back ADDs wait for its client-side rate limit: client-go "
              f"at 50 requests/s, burst 50 (pkg/k8sclient), 5 requests per ADD, 3 of them "
              f"events; its ADD p50 at concurrency 1, each DEL letting the bucket refill, is "
              f"{c1} ms)", file=err)
    row("DEL ms p50/p95/p99 (shim wall time)", pct(lat["del_ms"]), pct(ulat.get("del_ms")))
    row("daemon only ADD ms p50/p95/p99 (direct POST)", pct(report["direct"]["add_ms"]),
        pct(up.get("direct", {}).get("add_ms")))
    row("daemon only DEL ms p50/p95/p99 (direct POST)", pct(report["direct"]["del_ms"]),
        pct(up.get("direct", {}).get("del_ms")))
    shim, ushim = report["shim"], up.get("shim", {})
    for ours_key, theirs_key, label in (("packaged_add_instant", "add_instant", "ADD"),
                                        ("packaged_del_instant", "del_instant", "DEL"),
                                        ("packaged_version", "version", "VERSION")):
        ours, theirs = shim.get(ours_key, {}), ushim.get(theirs_key, {})
        row(f"shim {label}, instant daemon: wall/CPU ms", f"{ours.get('p50')} / "
            f"{ours.get('cpu_p50')}", f"{theirs.get('p50')} / {theirs.get('cpu_p50')}")
    for concurrency, result in report["throughput"].items():
        theirs = up.get("throughput", {}).get(concurrency, {})
        row(f"pods/s at concurrency {concurrency} (ADD p50 ms)",
            f"{result['pods_per_s']} ({result['add_ms'].get('p50')})",
            f"{theirs.get('pods_per_s')} ({theirs.get('add_ms', {}).get('p50')})")
    row("CPU ms per ADD: daemon/plugins/shim/bench", cpu(lat.get("cpu_ms_per_add")),
        cpu(ulat.get("cpu_ms_per_add")))
    row("CPU ms per DEL: daemon/plugins/shim/bench", cpu(lat.get("cpu_ms_per_del")),
        cpu(ulat.get("cpu_ms_per_del")))
    for concurrency in report["throughput"]:
        row(f"CPU ms per pod at c={concurrency}: d/p/s/bench",
            cpu(report["throughput"][concurrency].get("cpu_ms_per_pod")),
            cpu(up.get("throughput", {}).get(concurrency, {}).get("cpu_ms_per_pod")))
    row("API requests per ADD / per DEL", api_requests(lat), api_requests(ulat))
    for key in ("api_requests_add", "api_requests_del"):
        ours, theirs = lat.get(key) or {}, ulat.get(key) or {}
        row(f"  {key[13:]} requests by kind", "", "")
        ours, theirs = ours.get("by_kind_per_pod", {}), theirs.get("by_kind_per_pod", {})
        for kind in sorted(set(ours) | set(theirs)):
            row(f"    {kind}", ours.get(kind, 0), theirs.get(kind, 0))
    rss, urss = report["rss_mb"], up.get("rss_mb", {})
    row("RSS MB idle / after warm-up / after load",
        f"{rss.get('idle_after_start')} / {rss.get('after_warmup')} / {rss.get('after_load')}",
        f"{urss.get('idle_after_start')} / {urss.get('after_warmup')} / {urss.get('after_load')}")
    row("first ADD after a cold start ms (median)", cold.get("cold_add_ms"),
        ucold.get("cold_add_ms"))
    row("  all cold starts", cold.get("cold_add_ms_all"), ucold.get("cold_add_ms_all"))
    row("  socket ready ms (multusd: activation socket)", "0 (socket-activated)",
        ucold.get("socket_ms"))
    row("  /healthz ms (multusd: after activation)", cold.get("healthz_ms"),
        ucold.get("healthz_ms"))
    row("  /readyz ms (caches synced)", cold.get("readyz_ms"),
        f"{ucold.get('healthz_ms')} (= /healthz)")
    row("  first ADD itself once ready, shim ms", "-", ucold.get("first_add_shim_ms"))
    row("idle RSS after a cold start's ADD MB", "-", ucold.get("rss_idle_mb"))
    row("daemon stop ms (SIGTERM, idle; median)", cold.get("stop_ms"), ucold.get("stop_ms"))
    row("daemon stop ms after the load", "-", up.get("stop_after_load_ms"))
    if up.get("failure_count"):
        print(f"  upstream: {up['failure_count']} failure(s), first: {up['failures'][0][:300]}",
              file=err)
