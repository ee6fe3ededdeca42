"""ADD / DEL / CHECK / STATUS / GC of a pod sandbox: the Multus orchestration.

No I/O of its own beyond the scratch cache: delegates are resolved by podnetworks.py, their
runtime config by runtimeconf.py, executed by the CNI engine, and the pod's network-status
written through the Kubernetes object it is handed. The rules it keeps (architecture.md):

* an ADD for a container that has attachments recorded is refused (DEL must come first), and
  one whose interface names are taken in the netns runs nothing (F37);
* the scratch cache ``<cniDir>/<containerID>`` is written before the first delegate runs;
* delegates run in order (libcni's and upstream's rule); with ``"parallelDelegates": true``
  the master runs first, then the secondaries concurrently where none depends on another
  (:mod:`multusd.core.parallel`); results, events and network-status keep the delegates'
  order whatever order they finish in;
* an ADD that fails part-way deletes, in reverse, everything it added (the failed delegate
  included) and its scratch cache before answering: it never half-succeeds; what its
  rollback could not release keeps the scratch cache, so that the runtime's DEL finishes;
* DEL is idempotent and best-effort complete: gone pod, NAD, netns or cache do not stop
  it; a missing or corrupt scratch cache falls back to libcni's result cache;
* a delegate's DEL error is returned, so that the runtime retries instead of leaking, for
  the sandbox's ``deleteRetryWindow`` (:mod:`multusd.core.unreleased`); after it, DEL answers
  success so that the pod can terminate, and the sandbox's records stay, marked unreleased,
  for ``multusd gc``; a DEL that succeeds drops the mark;
* a container that is not a pod (no K8S_POD_NAMESPACE: podman, nerdctl) gets the daemon's
  own networks (``clusterNetwork`` + ``defaultNetworks``, or ``delegates``), never a pod lookup.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Mapping, Sequence

from multusd.core import podnetworks
from multusd.core.defaultroute import DefaultRoutes
from multusd.core.delegate import cleanup_deadline
from multusd.node import devices
from multusd.node.netns import PodNetns
from multusd.core import dra, netstatus, parallel, runtimeconf, scratch, unreleased
from multusd.core.settings import cni_dir_of, devinfo_dir_of, kubelet_dir_of, require_delegates
from multusd import CURRENT_VERSION, store
from multusd.core.request import CmdArgs
from multusd.cni import resultcache
from multusd.cni.args import build_delegate_args
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.invoke import PluginObserver, missing_plugin, search_path
from multusd.cni.result import convert_result, ip_addresses, is_empty
from multusd.cni.version import supports_check
from multusd.config.daemonconf import DaemonConfig
from multusd.errors import (InvalidEnvironment, MultusError,
                            PodNotFound, TryAgainLater, UnknownContainer,
                            from_exception)
from multusd.store.valueclass import replace

LOG = logging.getLogger(__name__)

WIRE_VERSION = CURRENT_VERSION  # what ADD answers with
READINESS_TIMEOUT = 45.0


class Multus:
    """The Multus semantics for one daemon; safe to call from many threads at once."""

    def __init__(self, config: DaemonConfig, kube=None, *,
                 plugin_observer: PluginObserver | None = None) -> None:
        self.config = config
        self.kube = kube
        self.plugin_observer = plugin_observer  # handed to every Engine (metrics)
        self._daemon_cni_path = [p for p in os.environ.get("CNI_PATH", "").split(":") if p]

    def ready(self) -> bool:
        """Ready to serve ADD: the Kubernetes caches (if any) have synced."""
        return self.kube is None or self.kube.synced()

    # -- dispatch ---------------------------------------------------------------------------
    def cni(self, req: CmdArgs, deadline: float, log: logging.LoggerAdapter) -> dict | None:
        handler = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check,
                   "STATUS": self.status, "GC": self.gc}[req.command]
        return handler(req, deadline, log)

    def engine(self, conf: Mapping[str, Any]) -> Engine:
        return Engine(search_path(str(conf.get("binDir") or ""), self._daemon_cni_path),
                      observer=self.plugin_observer)

    # -- ADD --------------------------------------------------------------------------------
    def add(self, req: CmdArgs, deadline: float, log) -> dict:
        conf = req.config
        require_delegates(conf)
        refuse_repeated_add(req)
        wait_for_readiness_file(conf, deadline)
        pod = self._pod_for_add(req, log, deadline)
        if self.kube is not None and pod is None and req.has_pod:
            log.warning("pod %s/%s not found in the API: returning an empty result",
                        req.pod_namespace, req.pod_name)
            return empty_result(req)
        delegates = self._resolve(req, pod, deadline)
        cache_path = scratch_path(conf, req.container_id)
        engine = self.engine(conf)
        results: list[tuple[Any, dict]] = []
        routes = DefaultRoutes(req.netns, cni_dir_of(conf), req.container_id)
        waves = self._plan(req, delegates)
        flush = None
        try:
            # Every name free before anything runs: a rollback then only undoes what this
            # request made, never an interface the pod already had (F37).
            require_ifnames_free(routes.namespace(), req, delegates, self._delegate_error)
            # On disk before any delegate runs; durable (fsync) before the ADD answers, the
            # disk working while the plugins do.
            store.atomic_write(cache_path, scratch.delegates_to_cache(delegates), durable=False)
            flush = store.Flush(cache_path)
            for number, wave in enumerate(waves):
                outcomes = parallel.run_calls(
                    [functools.partial(self._add_one, engine, req, delegates[i], deadline, log)
                     for i in wave], parallel.DEFAULT_LIMIT)
                for index, (result, exc) in zip(wave, outcomes):
                    delegate = delegates[index]
                    if exc is None:
                        try:
                            routes.apply(delegate, result)
                        except Exception as route_exc:
                            exc = route_exc
                    if exc is not None:  # whatever failed, nothing half-made stays behind
                        started = [i for w in waves[: number + 1] for i in w]
                        if self._roll_back(engine, req, [delegates[i] for i in sorted(started)],
                                           deadline, log):
                            store.remove(cache_path)  # else kept: the runtime's DEL finishes
                        raise self._delegate_error(req, delegate,
                                                   _as_cni_error(exc, log)) from exc
                    results.append((delegate, result))
                    self.event_added(pod, delegate, result)
        finally:
            routes.close()
            if flush is not None:
                flush.wait()
        # F49: no network-status for pods whose *namespace* is a system one (upstream
        # compares the pod name, a bug); defaultNetworks follow the same rule
        if pod is not None and req.pod_namespace not in \
                podnetworks.load_settings(conf).system_namespaces:
            try:
                self._write_network_status(req, pod, results, deadline)
            except Exception as exc:
                if self._roll_back(engine, req, delegates, deadline, log):
                    store.remove(cache_path)
                raise _as_cni_error(exc, log).with_prefix(
                    f"{pod_prefix(req)}: error setting the network-status annotation: ") from exc
        master = next((r for d, r in results if d.master), results[0][1])
        log.info("ADD: %d network(s) attached: %s", len(results),
                 ", ".join(f"{d.name}:{d.ifname}" for d, _ in results))
        return convert_result(master, WIRE_VERSION)

    def _pod_for_add(self, req: CmdArgs, log, deadline: float):
        if not req.has_pod:
            # podman, nerdctl, Nomad...: a container, not a pod. With a kubeconfig this is
            # also what a runtime that lost the pod's identity sends: say it loudly.
            log.log(logging.WARNING if self.kube is not None else logging.INFO,
                    "ADD for a container that is not a Kubernetes pod (no K8S_POD_NAMESPACE "
                    "in CNI_ARGS): attaching the daemon's networks only%s",
                    "; no network-selection annotation applies and no network-status is "
                    "written" if self.kube is not None else "")
            return None
        if self.kube is None:
            return None
        pod = self.kube.get_pod(req.pod_namespace, req.pod_name, expected_uid=req.pod_uid,
                                deadline=deadline)
        if pod is None:
            return None
        if req.pod_uid and pod.uid != req.pod_uid and not pod.is_static:
            raise PodNotFound(f"expected pod UID \"{req.pod_uid}\" but got \"{pod.uid}\" from "
                              "Kube API: the pod was deleted and re-created while its sandbox "
                              "was being set up")
        return pod

    def _resolve(self, req: CmdArgs, pod, deadline: float) -> list:
        get_nad = self._nad_getter(deadline)
        kubelet = kubelet_dir_of(req.config)
        allocator = devices.DeviceAllocator(
            req.pod_namespace, req.pod_name, req.pod_uid,
            pod_resources_socket=devices.pod_resources_socket(kubelet),
            checkpoint=devices.checkpoint_file(kubelet),
            extra=dra.device_lookup(self.kube, pod, deadline) if pod is not None else None)
        try:
            return dra.with_origins(podnetworks.build_delegates(
                req.config, pod_namespace=req.pod_namespace, pod_name=req.pod_name,
                annotations=dict(pod.annotations) if pod is not None else {},
                cni_ifname=req.ifname, get_nad=get_nad, device_id_for=allocator),
                allocator.origin)
        except MultusError as exc:
            if isinstance(exc, podnetworks.NadNotFound) and pod is not None:
                self.kube.emit_event(pod, "Warning", "NoNetworkFound", exc.event_message)
            raise exc.with_prefix(f"{pod_prefix(req)}: ")

    def _add_one(self, engine: Engine, req: CmdArgs, delegate, deadline: float, log) -> dict:
        net = NetworkConfigList.load(delegate.conf, source=delegate.name)
        if not delegate.master:
            for line in runtimeconf.undeclared_requests(delegate):
                log.warning("%s", line)
        rt = self.runtime_conf(req, delegate)
        info_file = rt.capability_args.get("CNIDeviceInfoFile")
        if delegate.device_id and info_file:
            devices.copy_device_plugin_info(delegate.resource_name, delegate.device_id, info_file,
                                            dp_dir=devices.devinfo_dp_dir(devinfo_dir_of(req.config)))
        return engine.add(net, rt, deadline)

    def runtime_conf(self, req: CmdArgs, delegate) -> RuntimeConf:
        global_rc = req.config.get("runtimeConfig") or {}
        capability_args = runtimeconf.delegate_capability_args(
            global_rc, delegate, container_id=req.container_id,
            devinfo_dir=devices.devinfo_cni_dir(devinfo_dir_of(req.config)))
        args = build_delegate_args(req.pod_namespace, req.pod_name, req.infra_container_id,
                                   req.pod_uid, runtimeconf.legacy_cni_args(delegate))
        return RuntimeConf(container_id=req.container_id, netns=req.netns, ifname=delegate.ifname,
                           args=tuple(args), capability_args=capability_args,
                           cache_dir=cni_dir_of(req.config))

    def _roll_back(self, engine: Engine, req: CmdArgs, added: Sequence, deadline: float,
                   log) -> bool:
        """DEL, in reverse, what an ADD set up (the failed delegate included); errors logged.

        ``added`` is in ADD order; independent delegates are released concurrently. True when
        every delegate was released; False when one was not, so that the caller keeps the
        scratch cache for the runtime's DEL (upstream keeps it until CmdDel).
        """
        failures = self._delete_all(engine, req, added, cleanup_deadline(deadline))
        for delegate, exc in failures:
            log.error("rolling back %s (%s) failed: %s; the scratch cache is kept for the "
                      "runtime's DEL", delegate.name, delegate.ifname, _as_cni_error(exc, log).msg)
        return not failures

    def _plan(self, req: CmdArgs, delegates: Sequence, *, adding: bool = True) -> list[list[int]]:
        """The waves the delegates run in (see :mod:`multusd.core.parallel`)."""
        return parallel.plan(delegates, parallel=self.config.parallel_delegates,
                             auxiliary_chain=str(req.config.get("auxiliaryCNIChainName") or ""),
                             master_first=adding)

    def _delete_all(self, engine: Engine, req: CmdArgs, delegates: Sequence,
                    deadline: float) -> list[tuple[Any, BaseException]]:
        """DEL every delegate, dependents before what they depend on; every delegate gets its
        DEL. Returns the failures, in reverse ADD order."""
        failures = []
        for wave in parallel.reverse_waves(self._plan(req, delegates, adding=False)):
            outcomes = parallel.run_calls(
                [functools.partial(self._delete_one, engine, req, delegates[i], deadline)
                 for i in wave], parallel.DEFAULT_LIMIT)
            failures += [(delegates[i], exc) for i, (_, exc) in zip(wave, outcomes)
                         if exc is not None]
        return failures

    def _delete_one(self, engine: Engine, req: CmdArgs, delegate, deadline: float) -> None:
        net = NetworkConfigList.load(delegate.conf, source=delegate.name)
        rt = self.runtime_conf(req, delegate)
        engine.delete(net, rt, deadline)
        info_file = rt.capability_args.get("CNIDeviceInfoFile")
        if delegate.device_id and info_file:
            devices.remove_device_info(info_file)

    def _delegate_error(self, req: CmdArgs, delegate, exc: MultusError) -> MultusError:
        return exc.with_prefix(
            f"{pod_prefix(req, delegate.name)}: error adding container to network "
            f"\"{delegate.name}\": ")

    def event_added(self, pod, delegate, result: dict) -> None:
        if pod is None or is_empty(result):
            return
        addresses = ",".join(ip_addresses(result))
        source = f" from {delegate.name}" if delegate.name else ""
        self.kube.emit_event(pod, "Normal", "AddedInterface",
                             f"Add {delegate.ifname} [{addresses}]{source}")

    def _write_network_status(self, req: CmdArgs, pod, results: Sequence[tuple[Any, dict]],
                              deadline: float) -> None:
        entries: list[dict] = []
        for delegate, result in results:
            info = None
            if delegate.device_id:
                info_file = self.runtime_conf(req, delegate).capability_args.get(
                    "CNIDeviceInfoFile")
                info = devices.load_device_info(info_file) if info_file else None
                if info is None and delegate.dra_device is not None:
                    info = dra.device_info(delegate.device_id)  # ours: upstream has none
            entries.extend(netstatus.status_entries(
                delegate.name, convert_result(result, WIRE_VERSION), default=delegate.master,
                device_info=info))
        if entries:
            self.kube.set_network_status(pod, netstatus.format_network_status(entries),
                                         deadline=deadline)

    # -- DEL --------------------------------------------------------------------------------
    def delete(self, req: CmdArgs, deadline: float, log) -> None:
        if not req.container_id:
            log.warning("DEL without CNI_CONTAINERID: nothing can be found to delete")
            return
        req = netns_for_del(req, log)
        conf = req.config
        path = scratch_path(conf, req.container_id)
        delegates = self._delegates_for_del(req, path, log)
        engine = self.engine(conf)
        # best-effort complete: a failed delegate does not stop the others
        failures = self._delete_all(engine, req, delegates, deadline)
        if failures:
            # kept until every delegate's DEL succeeds (upstream's retryDeleteOnError, always);
            # the error reaches the runtime for the sandbox's window, then DEL answers success
            found = [unreleased.Failure(network=delegate.name, ifname=delegate.ifname,
                                        error=_as_cni_error(exc, log).msg)
                     for delegate, exc in failures]
            unreleased.report(cni_dir_of(conf), req, found, f"{pod_prefix(req)}: DEL failed for "
                              f"{len(found)} network(s), the runtime will retry: "
                              + " / ".join(f"{f.network} ({f.ifname}): {f.error}" for f in found)
                              + missing_plugin_hint(req, failures),
                              window=self.config.delete_retry_window, kube=self.kube, log=log)
            return
        store.remove(path)
        if unreleased.clear(cni_dir_of(conf), req.container_id):
            log.info("DEL: the sandbox's earlier DEL failures are over")
        log.info("DEL: %d network(s) released", len(delegates))

    def forget(self, req: CmdArgs, deadline: float, log) -> list[tuple[Any, str]]:
        """DEL every delegate of the sandbox, then drop its records whatever failed.

        For ``multusd gc --forget``: the operator's knowing decision for a sandbox whose DEL
        cannot succeed (a plugin binary that is gone for good). Returns ``(delegate, "")``
        for each delegate released and ``(delegate, why not)`` for each that was not.
        """
        req = netns_for_del(req, log)
        conf = req.config
        path = scratch_path(conf, req.container_id)
        delegates = self._delegates_for_del(req, path, log)
        failed = {id(d): _as_cni_error(exc, log).msg
                  for d, exc in self._delete_all(self.engine(conf), req, delegates, deadline)}
        for entry in resultcache.list_entries(cni_dir_of(conf)):
            if entry.get("containerId") == req.container_id:
                resultcache.delete(cni_dir_of(conf), str(entry["networkName"]), req.container_id,
                                   str(entry["ifName"]))
        store.remove(path)
        unreleased.clear(cni_dir_of(conf), req.container_id)
        outcome = [(d, failed.get(id(d), "")) for d in delegates]
        for delegate, why in outcome:
            if why:
                log.warning("gc --forget %s: %s (%s) NOT released, its records dropped: %s",
                            req.container_id, delegate.name, delegate.ifname, why)
        log.info("gc --forget %s: %d of %d network(s) released, every record dropped",
                 req.container_id, sum(1 for _, why in outcome if not why), len(outcome))
        return outcome

    def _delegates_for_del(self, req: CmdArgs, path: str, log) -> list:
        try:
            data = read_scratch(path)
            if data is not None:
                return scratch.delegates_from_cache(data, top_cni_version=req.cni_version,
                                                    cni_ifname=req.ifname)
        except MultusError as exc:
            log.error("scratch cache %s is unreadable (%s): deleting what libcni's result "
                      "cache still knows about", path, exc.msg)
        return self._delegates_from_result_cache(req, log)

    def _delegates_from_result_cache(self, req: CmdArgs, log) -> list:
        """Rebuild the delegates from ``<cniDir>/results/*-<containerID>-*`` (no scratch cache)."""
        found = []
        for entry in resultcache.list_entries(cni_dir_of(req.config)):
            if entry.get("containerId") != req.container_id:
                continue
            config = resultcache.decode_config(entry)
            found.append(podnetworks.Delegate(
                name=str(entry.get("networkName", "")), conf=config,
                ifname=str(entry.get("ifName", "")), master=entry.get("ifName") == req.ifname))
        found.sort(key=lambda d: (not d.master, d.ifname))
        if found:
            log.warning("no scratch cache for %s: deleting %d attachment(s) found in the "
                        "result cache", req.container_id, len(found))
        return found

    # -- CHECK, STATUS, GC ------------------------------------------------------------------
    def check(self, req: CmdArgs, deadline: float, log) -> None:
        path = scratch_path(req.config, req.container_id)
        data = read_scratch(path)
        if data is None:
            raise MultusError(f"CHECK: no attachments recorded for container {req.container_id} "
                              f"({path} is missing): was ADD run?")
        delegates = scratch.delegates_from_cache(data, top_cni_version=req.cni_version,
                                                 cni_ifname=req.ifname)
        require_netns(req.netns)
        engine = self.engine(req.config)
        for delegate in delegates:
            net = NetworkConfigList.load(delegate.conf, source=delegate.name)
            if not supports_check(net.cni_version):
                log.info("CHECK skipped for %s: cniVersion %s has no CHECK", delegate.name,
                         net.cni_version)
                continue
            try:
                engine.check(net, self.runtime_conf(req, delegate), deadline)
            except MultusError as exc:
                raise self._delegate_error(req, delegate, exc).with_prefix("CHECK: ") from exc

    def status(self, req: CmdArgs, deadline: float, log) -> None:
        wait_for_readiness_file(req.config, deadline)
        if not self.ready():
            reason = self.kube.last_error or "the first list has not completed yet"
            raise MultusError(f"multusd cannot serve ADD yet: its pod cache from "
                              f"{self.kube.server_url} has not synced ({reason})", code=50)
        net = self._cluster_network(req, deadline)
        self.engine(req.config).status(net, deadline)

    def gc(self, req: CmdArgs, deadline: float, log) -> None:
        wait_for_readiness_file(req.config, deadline)
        directory = cni_dir_of(req.config)
        if not os.path.isdir(os.path.join(directory, "results")):
            raise MultusError(f"error in gather valid attachments: {directory}/results does "
                              "not exist")
        valid = [{"containerID": e["containerId"], "ifname": e["ifName"]}
                 for e in resultcache.list_entries(directory)
                 if e.get("containerId") and e.get("ifName")]
        net = self._cluster_network(req, deadline)
        self.engine(req.config).gc(net, directory, valid, deadline)

    def _cluster_network(self, req: CmdArgs, deadline: float) -> NetworkConfigList:
        require_delegates(req.config)
        delegates = podnetworks.build_delegates(
            req.config, pod_namespace="", pod_name="", annotations=None,
            cni_ifname=req.ifname or "eth0", get_nad=self._nad_getter(deadline))
        return NetworkConfigList.load(delegates[0].conf, source=delegates[0].name)

    def _nad_getter(self, deadline: float):
        """The NAD lookup of this request (bounded by its deadline), None without Kubernetes."""
        if self.kube is None:
            return None
        return lambda namespace, name: self.kube.get_nad(namespace, name, deadline=deadline)


def missing_plugin_hint(req: CmdArgs, failures: Sequence[tuple[Any, BaseException]]) -> str:
    """The two ways out when a DEL failed because a plugin binary is gone; "" otherwise."""
    missing = [found for found in (missing_plugin(exc) for _, exc in failures) if found]
    if not missing:
        return ""
    names = ", ".join(sorted({name for name, _ in missing}))
    dirs = ", ".join(dict.fromkeys(d for _, searched in missing for d in searched))
    return (f". Plugin {names} is not installed (searched {dirs}), so this sandbox cannot be "
            f"released and its records stay: install {names} again, or drop the records "
            f"knowingly with `multusd gc --forget {req.container_id}` (it releases what the "
            f"other plugins can; what {names} set up stays as it is)")


def pod_prefix(req: CmdArgs, network: str = "") -> str:
    """Upstream's ``[namespace/pod/uid:network]`` in front of an error message.

    ``[container <name>:network]`` for a container that is not a pod (podman's
    K8S_POD_NAME is the container's name).
    """
    suffix = f":{network}" if network else ""
    if not req.has_pod:
        return f"[container {req.pod_name or req.container_id}{suffix}]"
    return f"[{req.pod_namespace}/{req.pod_name}/{req.pod_uid}{suffix}]"


def _as_cni_error(exc: BaseException, log) -> MultusError:
    if not isinstance(exc, MultusError):
        log.error("unexpected failure during ADD (rolled back)", exc_info=exc)
    return from_exception(exc)


def refuse_repeated_add(req: CmdArgs) -> None:
    """Refuse an ADD for a container that still has attachments recorded, before any work.

    The spec forbids a second ADD without a DEL in between; running it anyway would fail on
    the first interface and its rollback would delete the first ADD's attachment.
    """
    directory = cni_dir_of(req.config)
    recorded = os.path.exists(scratch_path(req.config, req.container_id))
    if not recorded:
        marker = f"-{req.container_id}-"
        try:
            recorded = any(marker in name for name in os.listdir(os.path.join(directory,
                                                                               "results")))
        except OSError:
            recorded = False
    if recorded:
        raise MultusError(f"{pod_prefix(req)}: container {req.container_id} already has "
                          f"network attachments recorded in {directory}: the runtime must "
                          "call DEL for it before another ADD (a repeated ADD is refused so "
                          "that the first one's attachments stay intact)")


def require_ifnames_free(netns, req: CmdArgs, delegates: Sequence, wrap) -> None:
    """Upstream's validateIfName for every delegate, before any runs (F37)."""
    for delegate in delegates:
        kind = delegate.plugin_type
        prefix = f"DelegateAdd: cannot set \"{kind}\" interface name to \"{delegate.ifname}\": "
        try:
            exists = netns.interface_exists(delegate.ifname)
        except MultusError as exc:
            raise wrap(req, delegate, exc.with_prefix(
                f"{prefix}validateIfName: no net namespace {req.netns} found: ")) from exc
        if exists:
            raise wrap(req, delegate, InvalidEnvironment(
                f"{prefix}validateIfName: interface name {delegate.ifname} already exists"))


def require_netns(path: str) -> None:
    """CNI_NETNS opens as a network namespace, within a bound (not a FIFO, file or hung mount)."""
    with PodNetns(path) as netns:
        netns.interface_exists("lo")


def netns_for_del(req: CmdArgs, log) -> CmdArgs:
    """The request, with CNI_NETNS dropped when it is there but is not a namespace.

    A FIFO, a plain file or a hung mount would hold every delegate's DEL until the deadline;
    the spec allows DEL without a netns, so IPAM and host-side state are still released. A
    netns that is gone is passed on: plugins handle that themselves.
    """
    if not req.netns:
        return req
    try:
        require_netns(req.netns)
    except UnknownContainer:
        return req
    except MultusError as exc:
        log.warning("DEL: %s; running the delegates without a network namespace", exc.msg)
        return replace(req, netns="")
    return req


def wait_for_readiness_file(conf: Mapping[str, Any], deadline: float) -> None:
    """Upstream's readinessindicatorfile wait (only present in non-auto mode, F28)."""
    path = conf.get("readinessindicatorfile")
    if not path:
        return
    limit = min(deadline, time.monotonic() + READINESS_TIMEOUT)
    while not os.path.exists(path):
        if time.monotonic() >= limit:
            raise TryAgainLater(f"have you checked that your default network is ready? still "
                                f"waiting for readinessindicatorfile @ {path}")
        time.sleep(0.2)  # polling a file that another component creates


def read_scratch(path: str) -> bytes | None:
    """The scratch cache's bytes; None when there is none.

    :raises IOFailure: it exists but cannot be read.
    """
    return store.read_or_none(path, "the scratch cache")


def scratch_path(conf: Mapping[str, Any], container_id: str) -> str:
    return os.path.join(cni_dir_of(conf), container_id)


def empty_result(req: CmdArgs) -> dict:
    """Upstream's answer for a pod that is not in the API (no delegate runs, F44)."""
    return {"cniVersion": WIRE_VERSION,
            "interfaces": [{"name": req.ifname, "sandbox": req.netns}],
            "ips": [{"address": "0.0.0.0/0", "gateway": "0.0.0.0"}]}
