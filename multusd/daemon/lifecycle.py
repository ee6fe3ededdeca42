"""The daemon's life cycle: obtain the socket, serve, tell systemd, drain on SIGTERM.

Started by systemd (multusd.socket) the listening socket is inherited and never unlinked
or chmod'ed: systemd owns it and keeps it open across restarts, so shims queue instead of
failing. Started by hand, multusd makes ``<socketDir>`` (0700) and ``multus.sock`` (0600)
itself, replaces a stale socket file and refuses to start beside a live daemon.

Start-up is cheap (socket activation makes the first shim wait for it): ``/healthz`` is
answered as soon as the request path is imported; the Kubernetes client (reading the
kubeconfig, the transport's imports, the ``kubernetes`` package for exec/auth-provider users)
is built and its watches started on a background thread (``kubestart``), and ``/readyz`` turns
200 once its caches have synced. Every module of ours a request or a background thread can run
is imported by then: during an upgrade the old daemon serves, with the new package's files
already in place, until postinst restarts it, and it must never load one of those
(tests/unit/daemon/test_startup_imports.py reads the code for such imports).

On SIGTERM: the stop of :mod:`multusd.daemon.stopping` (``/readyz`` 500, STOPPING=1, DEL
still served, requests in flight finish until one deadline inside systemd's TimeoutStopSec,
then what still runs is cut and recorded), then the process exits 0, without the
interpreter's tear-down of every imported module (tens of ms with the ``kubernetes`` package
loaded): everything multusd writes is already on disk, and the log handlers are flushed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from typing import Any, Mapping

from multusd import __version__
from multusd.core.request import CmdArgs, decode_body, parse
from multusd.cni.invoke import RunningPlugins
from multusd.daemon import delretry, dynnetworks, metrics, metricsserver, systemd
from multusd.config.daemonconf import DaemonConfig
from multusd.core.effective import EffectiveConfig
from multusd.core.multus import Multus
from multusd.core import delmarks
from multusd.errors import InvalidEnvironment, MultusError
from multusd.config import nodename
from multusd.daemon.kubestart import BackgroundKube
from multusd.daemon.lanes import NODE_COMMANDS, del_lane_workers
from multusd.daemon.log import RequestLogger, request_fields
from multusd.daemon.server import Server
from multusd.daemon.stopping import Stop
from multusd.wire import api

LOG = logging.getLogger(__name__)

# Requests to the API server that may be in flight at once besides the workers' (the pod and
# NAD watches, the event sender): with every worker, what the idle connection pool keeps.
KUBE_STREAMS = 3


def kube_connections(workers: int) -> int:
    """Idle API connections worth keeping: the workers of both lanes (the server's DEL lane
    has :func:`~multusd.daemon.lanes.del_lane_workers`), the STATUS and GC slots' threads
    (a NAD as the cluster network) and :data:`KUBE_STREAMS`."""
    return workers + del_lane_workers(workers) + len(NODE_COMMANDS) + KUBE_STREAMS


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def bind_socket(path: str) -> socket.socket:
    """Listen on ``path`` ourselves (development / no systemd), upstream's modes 0700/0600."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
        os.chmod(directory, 0o700)  # makedirs' mode passes through the umask
    # An existing directory keeps its mode: it may be shared (the operator's /run/...).
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(f"{path} exists and is not a socket: multusd will not remove "
                               "it; move it away or set another \"socketDir\"")
        if _socket_is_live(path):
            raise StartupError(f"another multusd is already serving on {path}; stop it first "
                               "(systemctl stop multusd.socket multusd)")
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    listener.listen(128)
    return listener


def _socket_is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class Daemon:
    """multusd serve: one instance per process."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.kube: BackgroundKube | None = None
        self.multus = None
        self.server: Server | None = None
        self.metrics: metrics.DaemonMetrics | metrics.NullMetrics = metrics.NullMetrics()
        self.metrics_server = None
        self.retrier: delretry.DelRetrier | None = None
        self.running_plugins = RunningPlugins()  # the stop kills what still runs
        self.stop: Stop | None = None
        self.dynamic: dynnetworks.DynamicNetworks | None = None  # enableDynamicNetworks
        self._owns_socket = False
        self._stopping = threading.Event()
        self._stop_lock = threading.RLock()  # a signal handler may take it: reentrant
        self._started = time.time()

    def run(self) -> int:
        listener = systemd.inherited_unix_listener()
        if listener is None:
            listener = bind_socket(self.config.socket_path)
            self._owns_socket = True
        if self.config.metrics_port is not None:
            self.metrics = metrics.DaemonMetrics()  # imports prometheus_client
        self.multus = self._make_multus()
        log_configuration(self.config, self.multus.node.current())
        self._start_metrics()
        self.server = Server(listener, self.handle, workers=self.config.workers,
                             request_timeout=self.config.request_timeout,
                             readiness=self.multus.ready, after_request=self._report_status,
                             observe_http=self.metrics.observe_http,
                             describe=self._describe)
        if self.dynamic is not None:
            self.dynamic.start(self.server.lanes)
            LOG.info("dynamic networks on: a running pod's network-selection changes are applied")
        # made before the handlers, so that a stop always finds it (started below: once
        # stopped, its thread ends at once)
        self.retrier = delretry.DelRetrier(
            self.config, self.multus, delretry.through_socket(listener.getsockname()))
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._start_watchdog()
        LOG.info("multusd %s serving on %s (%s)", __version__, self.config.socket_path,
                 "socket from systemd" if not self._owns_socket else "socket bound by multusd")
        systemd.notify(f"READY=1\nSTATUS=serving on {self.config.socket_path}")
        if self.kube is not None:
            self.kube.start_building()
        self.retrier.start()
        try:
            self.server.serve_forever()
            if self.stop is not None:
                self.stop.finish()
        finally:
            self._close(listener)
        if self.kube is not None and self.kube.failure is not None:
            raise StartupError(self.kube.failure)
        LOG.info("multusd stopped")
        exit_without_teardown(0)
        return 0  # not reached

    def _make_multus(self) -> Multus:
        if self.config.kubeconfig:
            dynamic = self.config.enable_dynamic_networks
            self.kube = BackgroundKube(self.config.kubeconfig, self.config.node_name,
                                       on_failure=self._on_kube_failure,
                                       on_built=self._report_status,
                                       pool_size=kube_connections(self.config.workers),
                                       pod_listener=self._pod_changed if dynamic else None)
        observer = self.metrics.observe_plugin if self.metrics.enabled else None
        multus = Multus(self.config, self.kube, plugin_observer=observer,
                        running_plugins=self.running_plugins)
        if self.kube is not None and self.config.enable_dynamic_networks:
            self.dynamic = dynnetworks.DynamicNetworks(
                multus, request_timeout=self.config.request_timeout)
        return multus

    def _pod_changed(self, pod: Any) -> None:
        if self.dynamic is not None:
            self.dynamic.pod_changed(pod)

    @property
    def node(self) -> nodename.NodeName | None:
        """The node name in use and its source, once the Kubernetes client resolved it."""
        return self.kube.node if self.kube is not None else None

    def _on_kube_failure(self) -> None:
        systemd.notify(f"STATUS=cannot start: {self.kube.failure}")
        self._begin_stop(f"cannot start: {self.kube.failure}")

    def _start_metrics(self) -> None:
        if self.config.metrics_port is None:
            return
        try:
            self.metrics_server = metricsserver.serve(self.config.metrics_address,
                                                self.config.metrics_port,
                                                registry=self.metrics.registry)
        except metricsserver.MetricsServerError as exc:
            raise StartupError(str(exc)) from exc
        kube = self.kube

        def from_client(read):  # no sample until the client is built: a scrape never waits
            return None if kube is None else (
                lambda: None if kube.client is None else read(kube.client))

        self.metrics.set_sources(
            cached_pods=from_client(lambda c: c.cache_sizes()[0]),
            cached_nads=from_client(lambda c: c.cache_sizes()[1]),
            cni_dirs=self.multus.node.cni_dirs,
            marks_spare=delmarks.spare_marks_dir(self.config.socket_dir),
            pod_cache_misses=from_client(lambda c: c.cache_misses),
            node_name_mismatch=from_client(lambda c: int(c.node_mismatch is not None)),
            watch_relists=from_client(lambda c: c.relists),
            watch_reopens=from_client(lambda c: c.watch_reopens),
            nad_api_unavailable=from_client(lambda c: int(c.nad_problem() is not None)),
            nad_refusals=from_client(lambda c: c.nad_refusals),
            credential_rotations=from_client(lambda c: c.config.credentials.rotations),
            kube_request_retries=from_client(lambda c: c.api_retries),
            dynamic_reconciliations=self.dynamic.counts if self.dynamic is not None else None)
        LOG.info("metrics on %s/metrics", self.metrics_server.url)

    def _close(self, listener: socket.socket) -> None:
        if self.dynamic is not None:
            # its steps ran in the lanes, which the stop drained or cut by its deadline: what
            # is left is the thread between two steps (not to hold the exit past that deadline)
            self.dynamic.stop(1.0)
        if self.retrier is not None:
            # not joined: a retry waiting on the socket is the next daemon's, and the stop's
            # deadline is not to be passed for it
            self.retrier.stop(timeout=0)
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.kube is not None:
            self.kube.stop()
        if self._owns_socket:
            try:
                os.unlink(self.config.socket_path)
            except OSError:
                pass
        listener.close()

    # -- requests ---------------------------------------------------------------------------
    def handle(self, endpoint: str, body: bytes, deadline: float,
               request_id: str) -> Mapping[str, Any] | None:
        """One /cni, /delegate or /forget request (called on a pool slot by the server)."""
        with self.metrics.track_request(endpoint) as tracked:
            env, config, attributes = decode_body(body)
            request = parse(env, config, self.config)
            tracked.command = request.command
            return self._handle(endpoint, request, env, attributes, deadline, request_id)

    def _handle(self, endpoint: str, request: CmdArgs, env: Mapping[str, str],
                attributes: Mapping[str, Any] | None, deadline: float,
                request_id: str) -> Mapping[str, Any] | None:
        started = time.monotonic()
        log = RequestLogger(LOG, request_fields(env, request.k8s_fields(), request_id))
        log.info("%s starting CNI request %s", request.command, endpoint)
        # One request per sandbox at a time: the server's lanes ran none of this container's
        # other requests beside this one (they are keyed by httpreq.peek_env, its exact ID).
        try:
            if endpoint == api.DELEGATE_ENDPOINT:
                result = self.multus.hotplug(request, attributes or {}, deadline, log)
            elif endpoint == api.FORGET_ENDPOINT:
                result = self._forget(request, deadline, log)
            else:
                result = self.multus.cni(request, deadline, log)
        except MultusError as exc:
            log.error("%s failed: %s", request.command, exc.msg,
                      extra={"DURATION_MS": _ms(started), "CNI_ERROR_CODE": exc.code})
            raise
        log.info("%s finished", request.command, extra={"DURATION_MS": _ms(started)})
        if request.command == "DEL" and endpoint != api.DELEGATE_ENDPOINT and \
                self.retrier is not None:
            self.retrier.after_del(request.container_id)  # the shim's stale mark, if any
        if endpoint == api.FORGET_ENDPOINT:
            return {"networks": result}
        if request.command == "ADD":
            return {"Result": result}
        return None

    def _forget(self, request: CmdArgs, deadline: float, log: Any) -> list:
        """``multusd gc --forget`` of the sandbox ``request`` (the runtime's DEL) names, in the
        sandbox's turn like any request of it."""
        if request.command != "DEL":
            raise InvalidEnvironment(f"/forget takes the sandbox's DEL request, not "
                                     f"CNI_COMMAND={request.command!r}")
        outcome = self.multus.forget(request, deadline, log)
        return api.forgotten_networks((d.name, d.ifname, why) for d, why in outcome)

    def _describe(self) -> dict:
        """The daemon's facts for ``GET /status`` (``multusd status`` asks for them)."""
        info = {"version": __version__, "pid": os.getpid(), "startedAt": self._started,
                "uptimeSeconds": round(time.time() - self._started, 3),
                "socketActivated": not self._owns_socket, "config": self.config.path,
                "nodeName": self.node.name if self.node else self.config.node_name,
                "nodeNameSource": self.node.source if self.node else "",
                "stopping": self._stopping.is_set()}
        if self.kube is not None:
            client = self.kube.client
            pods, nads = client.cache_sizes() if client is not None else (0, 0)
            problem = client.nad_problem() if client is not None else None
            info["kube"] = {"server": client.server_url if client is not None else "",
                            "synced": self.kube.synced(), "lastError": self.kube.last_error,
                            "cachedPods": pods, "cachedNads": nads,
                            "nadsSynced": client.nads_synced() if client is not None else False,
                            "nadProblem": {"condition": problem[0], "message": problem[1]}
                            if problem else None}
        if self.dynamic is not None:
            info["dynamicNetworks"] = self.dynamic.status()
        return info

    def _report_status(self) -> None:
        counts = self.server.runner.counted()
        systemd.notify(f"STATUS=serving: {counts['ok']} requests done, "
                       f"{counts['failed']} failed, {self.server.in_flight} in flight"
                       f"{self._node_status()}")

    def _node_status(self) -> str:
        """The node part of the status line: its name and source, or the mismatch found."""
        if self.node is None:
            return ""
        client = self.kube.client if self.kube is not None else None
        mismatch = client.node_mismatch if client is not None else None
        if mismatch is not None:
            return (f"; NODE NAME MISMATCH: watching {mismatch[0]!r} ({self.node.source}) but "
                    f"this node's pods are on {mismatch[1]!r}: set nodeName")
        return f"; {self.node.describe()}"

    # -- stopping ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame) -> None:
        self._begin_stop(f"received {signal.Signals(signum).name}")

    def _begin_stop(self, why: str) -> None:
        """The one stop (:mod:`multusd.daemon.stopping`); a second signal changes nothing."""
        with self._stop_lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            if self.retrier is not None:
                self.retrier.stop(timeout=0)  # no new retries; one running ends with the stop
            if self.dynamic is not None:
                self.dynamic.stop(0)  # none starts any more; one running stops between steps
            self.stop = Stop(self.server, self.running_plugins, self.config)
            self.stop.begin(why)

    def _start_watchdog(self) -> None:
        interval = systemd.watchdog_interval()
        if interval is None:
            return

        def ping() -> None:
            while not self._stopping.wait(interval):
                systemd.notify("WATCHDOG=1")

        threading.Thread(target=ping, name="multusd-watchdog", daemon=True).start()


def log_configuration(config: DaemonConfig, node: EffectiveConfig) -> None:
    """The daemon's configuration, once at start, as containerd logs its own: what it resolved
    (no config bodies, no credentials: the kubeconfig's path only)."""
    daemon = {"config": config.path, "socketDir": config.socket_dir,
              "kubeconfig": config.kubeconfig or None, "nodeName": config.node_name or None,
              "workers": config.workers, "requestTimeout": config.request_timeout,
              "deleteRetryWindow": config.delete_retry_window,
              "parallelDelegates": config.parallel_delegates,
              "enableDynamicNetworks": config.enable_dynamic_networks,
              "metrics": f"{config.metrics_address}:{config.metrics_port}"
              if config.metrics_port is not None else None}
    LOG.info("configuration: %s", json.dumps(
        {"daemon": {k: v for k, v in daemon.items() if v is not None},
         "node": node.describe()}, sort_keys=False))


def exit_without_teardown(code: int) -> None:
    """End the process now: flush the logs and stdio, skip the interpreter's tear-down.

    Tearing down ``kubernetes``' thousands of modules and objects takes longer than the
    whole rest of a stop; nothing else is left to flush (files are written atomically, the
    socket belongs to systemd or was unlinked).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _ms(started: float) -> str:
    return f"{(time.monotonic() - started) * 1000:.1f}"
