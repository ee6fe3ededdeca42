"""The Multus orchestration (:class:`Multus`): each CNI request of a sandbox to its command.

ADD is :mod:`multusd.core.cmdadd`'s, DEL (and ``multusd gc --forget``) is
:mod:`multusd.core.cmddel`'s, ``/delegate`` (hot-plug) is :mod:`multusd.core.hotplug`'s, a
running pod's changed network selections (``enableDynamicNetworks``) are
:mod:`multusd.core.reconcile`'s; the
commands that attach and release nothing are here: CHECK (every attachment the scratch cache
records, each delegate whose version has CHECK), STATUS (answered within its deadline, a
few seconds: the readiness indicator file present, the pod cache synced, the cluster
network's plugins ready, else code 50 saying what is missing or which network did not
answer) and GC (the cluster network's plugins told which attachments
libcni's result cache still holds; it waits for the readiness file as ADD does, within the
request's deadline). Each command
uses the engine of its request (:meth:`Multus.engine`); ADD, DEL and CHECK run their
delegates through a :class:`~multusd.core.runner.DelegateRunner`. No HTTP, no systemd: the
daemon hands each parsed request in, with its deadline and logger.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, List, Mapping, Tuple

from multusd.cni import resultcache
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.cni.invoke import PluginObserver, RunningPlugins, search_path
from multusd.cni.version import supports_check
from multusd.config.daemonconf import DaemonConfig
from multusd.core import (cmdadd, cmddel, delmarks, effective, hotplug, podsandbox,
                          reconcile, sandboxconfig, scratch)
from multusd.core.delegate import Delegate
from multusd.core.podnetworks import build_delegates, nad_getter
from multusd.core.request import CmdArgs
from multusd.core.runner import DelegateRunner, delegate_error
from multusd.core.settings import require_delegates
from multusd.errors import DeadlineExceeded, MultusError, NotReady
from multusd.node.netns import check_namespace

# CNI 1.1 STATUS codes: the plugin is not available (50), and existing containers may have
# limited connectivity as well (51)
NOT_AVAILABLE = (50, 51)

LOG = logging.getLogger(__name__)
WARNED_PODS = 1024  # pods a /delegate warning was logged for, remembered (then forgotten)


class Multus:
    """The Multus semantics for one daemon; safe to call from many threads at once."""

    def __init__(self, config: DaemonConfig, kube: Any = None, *,
                 plugin_observer: PluginObserver | None = None,
                 running_plugins: RunningPlugins | None = None) -> None:
        self.config = config
        self.node = effective.NodeConfig(config)  # for the paths no runtime request carries
        self.notices = sandboxconfig.Notices()  # what was said once per sandbox
        self.kube = kube
        self.plugin_observer = plugin_observer  # handed to every Engine (metrics)
        self.running_plugins = running_plugins  # and this (the daemon's stop ends them)
        self._daemon_cni_path = [p for p in os.environ.get("CNI_PATH", "").split(":") if p]
        self._delegate_warned: set = set()
        self._warn_lock = threading.Lock()

    def ready(self) -> bool:
        """Ready to serve ADD: the pod cache (if any) has listed once (stale: live GETs)."""
        return self.kube is None or self.kube.ready()

    def cni(self, req: CmdArgs, deadline: float, log: Any) -> dict | None:
        """A ``/cni`` request: ADD (returns its result), DEL, CHECK, STATUS or GC."""
        handler = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check,
                   "STATUS": self.status, "GC": self.gc}[req.command]
        return handler(req, deadline, log)

    def engine(self, conf: Mapping[str, Any]) -> Engine:
        """The engine of a request: its ``binDir`` (or the default ones), then the daemon's
        CNI_PATH; every plugin run is told to the metrics, and registered in the daemon's
        :class:`~multusd.cni.invoke.RunningPlugins` (its stop kills what still runs)."""
        return Engine(search_path(str(conf.get("binDir") or ""), self._daemon_cni_path),
                      observer=self.plugin_observer, running=self.running_plugins)

    def add(self, req: CmdArgs, deadline: float, log: Any) -> dict:
        """ADD: see :func:`multusd.core.cmdadd.cmd_add`."""
        engine = self.engine(req.config)
        return cmdadd.cmd_add(req, deadline, log, engine=engine, kube=self.kube,
                              parallel_delegates=self.config.parallel_delegates)

    def delete(self, req: CmdArgs, deadline: float, log: Any) -> None:
        """DEL: see :func:`multusd.core.cmddel.cmd_del`."""
        engine = self.engine(req.config)
        cmddel.cmd_del(req, deadline, log, engine=engine, kube=self.kube,
                       parallel_delegates=self.config.parallel_delegates,
                       window=self.config.delete_retry_window,
                       spare=delmarks.spare_marks_dir(self.config.socket_dir),
                       notices=self.notices, other_dirs=self.node.cni_dirs)

    def forget(self, req: CmdArgs, deadline: float, log: Any) -> List[Tuple[Delegate, str]]:
        """``multusd gc --forget``: see :func:`multusd.core.cmddel.forget`."""
        engine = self.engine(req.config)
        return cmddel.forget(req, deadline, log, engine=engine,
                             parallel_delegates=self.config.parallel_delegates,
                             spare=delmarks.spare_marks_dir(self.config.socket_dir),
                             other_dirs=self.node.cni_dirs)

    def hotplug(self, req: CmdArgs, attributes: Mapping[str, Any], deadline: float,
                log: Any) -> dict | None:
        """A ``/delegate`` request (hot-plug): see :mod:`multusd.core.hotplug`."""
        if self.config.enable_dynamic_networks and req.has_pod:
            self._warn_delegate_caller(req)
        engine = self.engine(req.config)
        return hotplug.handle_delegate(req, attributes, deadline, log, engine=engine,
                                       kube=self.kube)

    def reconcile(self, pod: Any, container_id: str, deadline: float, log: Any,
                  stopping: Callable[[], bool]) -> reconcile.Outcome:
        """A running pod's network selections applied to its sandbox (``enableDynamicNetworks``):
        see :mod:`multusd.core.reconcile`."""
        node = self.node.current()
        return reconcile.reconcile(pod, container_id, node, deadline, log,
                                   engine=self.engine(node.merged), kube=self.kube,
                                   stopping=stopping, notices=self.notices)

    def needs_reconciling(self, pod: Any, container_id: str, log: Any) -> bool:
        """Whether :meth:`reconcile` would do anything (read-only, outside the lanes).

        :raises Unestablished: the configuration to judge the sandbox by cannot be
            established (:mod:`multusd.core.podsandbox`).
        """
        view = podsandbox.read_view(container_id, self.node.current(), log,
                                    notices=self.notices)
        return view is not None and podsandbox.needs_reconciling(view, pod)

    def _warn_delegate_caller(self, req: CmdArgs) -> None:
        """Say once per pod that something else hot-plugs while multusd does it too."""
        pod = f"{req.pod_namespace}/{req.pod_name}"
        with self._warn_lock:
            if pod in self._delegate_warned:
                return
            if len(self._delegate_warned) >= WARNED_PODS:
                self._delegate_warned.clear()
            self._delegate_warned.add(pod)
        LOG.warning("a /delegate %s request for pod %s came from another component while "
                    "enableDynamicNetworks is on: if multus-dynamic-networks-controller runs on "
                    "this node, it and multusd both act on the pod's network-selection changes; "
                    "run one of them (remove the controller from this node, or set "
                    "\"enableDynamicNetworks\": false)", req.command, pod)

    # -- CHECK, STATUS, GC ------------------------------------------------------------------
    def check(self, req: CmdArgs, deadline: float, log: Any) -> None:
        """CHECK, judged by the configuration the sandbox was attached under."""
        req = sandboxconfig.sandbox_request(req, log, notices=self.notices,
                                            other_dirs=self.node.cni_dirs)
        path = scratch.cache_path(req.effective.cni_dir, req.container_id)
        data = scratch.read_cache(path)
        if data is None:
            raise MultusError(f"CHECK: no attachments recorded for container {req.container_id} "
                              f"({path} is missing): was ADD run?")
        delegates = scratch.delegates_from_cache(data, top_cni_version=req.cni_version,
                                                 cni_ifname=req.ifname)
        check_namespace(req.netns)
        runner = DelegateRunner(self.engine(req.config), req, deadline, log)
        for delegate in delegates:
            net = NetworkConfigList.load(delegate.conf, source=delegate.name)
            if not supports_check(net.cni_version):
                log.info("CHECK skipped for %s: cniVersion %s has no CHECK", delegate.name,
                         net.cni_version)
                continue
            try:
                runner.check(delegate, net)
            except MultusError as exc:
                raise delegate_error(req, delegate, exc).with_prefix("CHECK: ") from exc

    def status(self, req: CmdArgs, deadline: float, log: Any) -> None:
        """STATUS (CNI 1.1), answered by ``deadline`` (the server gives it a few seconds):
        nothing here waits for anything to appear, and the cluster network's plugins are killed
        at the deadline.

        Ready is success. Not ready is :class:`~multusd.errors.NotReady` (code 50) whose msg
        names what is missing: the readiness indicator file, the pod watch's first list (when
        Kubernetes is configured), or the cluster network itself (it cannot be loaded, its
        STATUS did not answer by the deadline, or it failed: its code and msg are in ours). A
        cluster network answering 50 or 51 itself (51: existing attachments may have limited
        connectivity too) is passed on unchanged, as upstream does.
        """
        started = time.monotonic()
        path = cmdadd.readiness_file(req.config)
        if path and not os.path.exists(path):
            raise NotReady(f"multusd cannot serve ADD yet: the readiness indicator file {path} "
                           "(readinessindicatorfile) does not exist; the cluster network "
                           "writes it once it is ready on this node")
        if not self.ready():
            reason = self.kube.last_error or "the first list has not completed yet"
            raise NotReady(f"multusd cannot serve ADD yet: its pod watch on "
                           f"{self.kube.server_url} has not synced ({reason})")
        try:
            net = self._cluster_network(req, deadline)
        except MultusError as exc:
            raise NotReady(f"multusd cannot serve ADD: its cluster network cannot be loaded: "
                           f"{exc.msg}", exc.details) from exc
        try:
            self.engine(req.config).status(net, deadline)
        except MultusError as exc:
            if exc.code in NOT_AVAILABLE:
                raise  # the plugin's own "not available": it says what is missing
            if isinstance(exc, DeadlineExceeded) and time.monotonic() >= deadline:
                plugin = os.path.basename(getattr(exc, "plugin_path", "")) or "its plugin"
                raise NotReady(f"multusd cannot serve ADD: its cluster network {net.name!r} "
                               f"did not answer STATUS within {deadline - started:.0f}s "
                               f"(plugin {plugin!r} was killed); the network's node agent may "
                               "be stuck", exc.details) from exc
            raise NotReady(f"multusd cannot serve ADD: its cluster network {net.name!r} is not "
                           f"ready: its STATUS failed with code {exc.code}: {exc.msg}",
                           exc.details) from exc

    def gc(self, req: CmdArgs, deadline: float, log: Any) -> None:
        cmdadd.wait_for_readiness_file(req.config, deadline)
        directory = req.effective.cni_dir
        if not os.path.isdir(os.path.join(directory, resultcache.RESULTS_DIR)):
            raise MultusError(f"error in gather valid attachments: {directory}/results does "
                              "not exist")
        valid = [{"containerID": e["containerId"], "ifname": e["ifName"]}
                 for e in resultcache.list_entries(directory)
                 if e.get("containerId") and e.get("ifName")]
        net = self._cluster_network(req, deadline)
        self.engine(req.config).gc(net, directory, valid, deadline)

    def _cluster_network(self, req: CmdArgs, deadline: float) -> NetworkConfigList:
        """The master network of the daemon's config (STATUS and GC act on it alone)."""
        require_delegates(req.config)
        delegates = build_delegates(
            req.effective.require_settings(), pod_namespace="", pod_name="", annotations=None,
            cni_ifname=req.ifname or "eth0", get_nad=nad_getter(self.kube, deadline))
        return NetworkConfigList.load(delegates[0].conf, source=delegates[0].name)

