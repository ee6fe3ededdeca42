"""ADD of a pod sandbox: its delegates resolved, recorded, attached in order, and reported.

The rules it keeps (architecture.md):

* an ADD for a container that has attachments recorded is refused (DEL must come first), and
  one whose interface names are taken in the netns runs nothing (F37);
* the request's configuration was resolved once (:mod:`multusd.core.effective`); every step
  reads it from the request, and it is recorded with the sandbox
  (:mod:`multusd.core.sandboxconfig`) for the later paths;
* the scratch cache ``<cniDir>/<containerID>`` is written before the first delegate runs;
* delegates run in order (libcni's and upstream's rule); with ``"parallelDelegates": true``
  the master runs first, then the secondaries concurrently where none depends on another
  (:mod:`multusd.core.parallel`); results, events and network-status keep the delegates'
  order whatever order they finish in;
* after each delegate's ADD, its ``default-route`` requests (:mod:`multusd.core.defaultroute`),
  in the request's one opening of the pod's network namespace;
* an ADD that fails part-way deletes, in reverse, everything it added (the failed delegate
  included) and its scratch cache before answering: it never half-succeeds; what its
  rollback could not release keeps the scratch cache, so that the runtime's DEL finishes;
* a container that is not a pod (no K8S_POD_NAMESPACE: podman, nerdctl) gets the daemon's
  own networks (``clusterNetwork`` + ``defaultNetworks``, or ``delegates``), never a pod
  lookup; a pod the API does not know gets upstream's empty result (F44);
* the pod's network-status annotation is written once, after every delegate, unless the
  pod's namespace is a system one (F49).

The Kubernetes side comes through the ``kube`` object it is handed (pods, NADs, DRA devices,
events, network-status); the delegates' plugins run through a
:class:`~multusd.core.runner.DelegateRunner`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from multusd import CURRENT_VERSION, go_field, store
from multusd.cni.conflist import Engine
from multusd.cni.result import convert_result
from multusd.cni.resultcache import RESULTS_DIR
from multusd.core import dra, netstatus, parallel, sandboxconfig, scratch
from multusd.core.defaultroute import apply_default_routes
from multusd.core.delegate import Delegate
from multusd.core.podnetworks import NadNotFound, build_delegates, nad_getter
from multusd.core.request import CmdArgs, pod_prefix
from multusd.core.runner import DelegateRunner, as_cni_error, delegate_error, emit_added
from multusd.core.runtimeconf import runtime_conf
from multusd.core.settings import MultusSettings, require_delegates
from multusd.errors import InvalidEnvironment, MultusError, PodNotFound, TryAgainLater
from multusd.node import devices
from multusd.node.netns import PodNetns

READINESS_TIMEOUT = 45.0

Results = List[Tuple[Delegate, dict]]


def cmd_add(req: CmdArgs, deadline: float, log: Any, *, engine: Engine, kube: Any,
            parallel_delegates: bool = False) -> dict:
    """ADD of the sandbox ``req`` names; returns the master's result at CURRENT_VERSION.

    :param kube: the Kubernetes client (None without a kubeconfig).
    :param parallel_delegates: the daemon's ``parallelDelegates``.
    """
    conf = req.config
    require_delegates(conf)
    refuse_repeated_add(req)
    wait_for_readiness_file(conf, deadline)
    pod = pod_for_add(req, kube, deadline, log)
    if kube is not None and pod is None and req.has_pod:
        log.warning("pod %s/%s not found in the API: returning an empty result",
                    req.pod_namespace, req.pod_name)
        return empty_result(req)
    try:
        settings = req.effective.require_settings()
        delegates = resolve(req, settings, pod, kube, deadline)
    except MultusError as exc:
        raise exc.with_prefix(f"{pod_prefix(req)}: ")
    runner = DelegateRunner(engine, req, deadline, log, parallel_delegates=parallel_delegates,
                            auxiliary_chain=settings.auxiliary_chain)
    cache_path = scratch.cache_path(req.effective.cni_dir, req.container_id)
    results = attach(runner, delegates, cache_path, kube, pod)
    # F49: no network-status for pods whose *namespace* is a system one (upstream
    # compares the pod name, a bug); defaultNetworks follow the same rule
    if pod is not None and req.pod_namespace not in settings.system_namespaces:
        try:
            write_network_status(req, pod, results, kube, deadline)
        except Exception as exc:
            roll_back(runner, delegates, cache_path)
            raise as_cni_error(exc, log).with_prefix(
                f"{pod_prefix(req)}: error setting the network-status annotation: ") from exc
    master = next((r for d, r in results if d.master), results[0][1])
    log.info("ADD: %d network(s) attached: %s", len(results),
             ", ".join(f"{d.name}:{d.ifname}" for d, _ in results))
    return convert_result(master, CURRENT_VERSION)


def refuse_repeated_add(req: CmdArgs) -> None:
    """Refuse an ADD for a container that still has attachments recorded, before any work.

    The spec forbids a second ADD without a DEL in between; running it anyway would fail on
    the first interface and its rollback would delete the first ADD's attachment.
    """
    directory = req.effective.cni_dir
    recorded = os.path.exists(scratch.cache_path(directory, req.container_id))
    if not recorded:
        marker = f"-{req.container_id}-"
        try:
            recorded = any(marker in name
                           for name in os.listdir(os.path.join(directory, RESULTS_DIR)))
        except OSError:
            recorded = False
    if recorded:
        raise MultusError(f"{pod_prefix(req)}: container {req.container_id} already has "
                          f"network attachments recorded in {directory}: the runtime must "
                          "call DEL for it before another ADD (a repeated ADD is refused so "
                          "that the first one's attachments stay intact)")


def readiness_file(conf: Mapping[str, Any]) -> str:
    """The merged config's ``readinessindicatorfile`` (only present in non-auto mode, F28) as
    upstream's NetConf struct reads it (``"ReadinessIndicatorFile"`` too); "" when unset."""
    path = go_field(conf, "readinessindicatorfile")
    return path if isinstance(path, str) else ""


def wait_for_readiness_file(conf: Mapping[str, Any], deadline: float) -> None:
    """Upstream's readinessindicatorfile wait (:func:`readiness_file`)."""
    path = readiness_file(conf)
    if not path:
        return
    limit = min(deadline, time.monotonic() + READINESS_TIMEOUT)
    while not os.path.exists(path):
        if time.monotonic() >= limit:
            raise TryAgainLater(f"have you checked that your default network is ready? still "
                                f"waiting for readinessindicatorfile @ {path}")
        time.sleep(0.2)  # polling a file that another component creates


def pod_for_add(req: CmdArgs, kube: Any, deadline: float, log: Any) -> Any:
    """The pod of the sandbox from the API; None for a container that is not a pod, without
    Kubernetes, or for a pod the API does not know.

    :raises PodNotFound: the API's pod has another UID (deleted and re-created meanwhile).
    """
    if not req.has_pod:
        # podman, nerdctl, Nomad...: a container, not a pod. With a kubeconfig this is
        # also what a runtime that lost the pod's identity sends: say it loudly.
        log.log(logging.WARNING if kube is not None else logging.INFO,
                "ADD for a container that is not a Kubernetes pod (no K8S_POD_NAMESPACE "
                "in CNI_ARGS): attaching the daemon's networks only%s",
                "; no network-selection annotation applies and no network-status is "
                "written" if kube is not None else "")
        return None
    if kube is None:
        return None
    pod = kube.get_pod(req.pod_namespace, req.pod_name, expected_uid=req.pod_uid,
                       deadline=deadline)
    if pod is None:
        return None
    if req.pod_uid and pod.uid != req.pod_uid and not pod.is_static:
        raise PodNotFound(f"expected pod UID \"{req.pod_uid}\" but got \"{pod.uid}\" from "
                          "Kube API: the pod was deleted and re-created while its sandbox "
                          "was being set up")
    return pod


def resolve(req: CmdArgs, settings: MultusSettings, pod: Any, kube: Any,
            deadline: float) -> List[Delegate]:
    """The sandbox's delegates, with the devices the kubelet or DRA allocated to the pod.

    :raises NadNotFound: a NAD the pod selects does not exist (the pod gets the
        ``NoNetworkFound`` event).
    """
    kubelet = req.effective.kubelet_dir
    allocator = devices.DeviceAllocator(
        req.pod_namespace, req.pod_name, req.pod_uid,
        pod_resources_socket=devices.pod_resources_socket(kubelet),
        checkpoint=devices.checkpoint_file(kubelet),
        extra=dra.device_lookup(kube, pod, deadline) if pod is not None else None)
    try:
        delegates = build_delegates(
            settings, pod_namespace=req.pod_namespace, pod_name=req.pod_name,
            annotations=dict(pod.annotations) if pod is not None else {},
            cni_ifname=req.ifname, get_nad=nad_getter(kube, deadline),
            device_id_for=allocator)
    except NadNotFound as exc:
        if pod is not None:
            kube.emit_event(pod, "Warning", "NoNetworkFound", exc.event_message)
        raise
    return dra.with_origins(delegates, allocator.origin)


def attach(runner: DelegateRunner, delegates: Sequence[Delegate], cache_path: str, kube: Any,
           pod: Any) -> Results:
    """Every delegate's ADD, wave by wave, each followed by its default-route fixup; the
    scratch cache written first. On a failure, what started is rolled back and the error
    raised, naming the delegate."""
    req = runner.req
    results: Results = []
    waves = runner.waves(delegates)
    entries = [scratch.cache_entry(d) for d in delegates]
    sandboxconfig.put(entries, sandboxconfig.of(req.effective))  # what later paths judge it by
    record = scratch.encode_entries(entries)
    flush = None
    try:
        with PodNetns(req.netns) as netns:  # opened on first use, once per request
            # Every name free before anything runs: a rollback then only undoes what this
            # request made, never an interface the pod already had (F37).
            require_ifnames_free(req, delegates, netns)
            # On disk before any delegate runs; durable (fsync) before the ADD answers, the
            # disk working while the plugins do.
            store.atomic_write(cache_path, record, durable=False)
            flush = store.Flush(cache_path)
            for number, wave in enumerate(waves):
                outcomes = parallel.run_each(runner.add, [delegates[i] for i in wave])
                for index, (result, exc) in zip(wave, outcomes):
                    delegate = delegates[index]
                    if exc is None:
                        try:
                            apply_default_routes(delegate, result, netns,
                                                 req.effective.cni_dir, req.container_id)
                        except Exception as route_exc:
                            exc = route_exc
                    if exc is not None:  # whatever failed, nothing half-made stays behind
                        started = sorted(i for w in waves[: number + 1] for i in w)
                        roll_back(runner, [delegates[i] for i in started], cache_path)
                        raise delegate_error(req, delegate,
                                             as_cni_error(exc, runner.log)) from exc
                    results.append((delegate, result))
                    emit_added(kube, pod, delegate, result)
    finally:
        if flush is not None:
            flush.wait()
    return results


def roll_back(runner: DelegateRunner, added: Sequence[Delegate], cache_path: str) -> None:
    """DEL, in reverse, what an ADD set up (the failed delegate included), then its scratch
    cache; errors logged.

    ``added`` is in ADD order; independent delegates are released concurrently. When a
    delegate is not released, the scratch cache is kept for the runtime's DEL (upstream
    keeps it until CmdDel).
    """
    failures = runner.for_cleanup().delete_all(added)
    for delegate, exc in failures:
        runner.log.error("rolling back %s (%s) failed: %s; the scratch cache is kept for the "
                         "runtime's DEL", delegate.name, delegate.ifname,
                         as_cni_error(exc, runner.log).msg)
    if not failures:
        store.remove(cache_path)


def require_ifnames_free(req: CmdArgs, delegates: Sequence[Delegate], netns: PodNetns) -> None:
    """Upstream's validateIfName for every delegate, before any runs (F37)."""
    for delegate in delegates:
        prefix = (f"DelegateAdd: cannot set \"{delegate.plugin_type}\" interface name to "
                  f"\"{delegate.ifname}\": ")
        try:
            exists = netns.interface_exists(delegate.ifname)
        except MultusError as exc:
            raise delegate_error(req, delegate, exc.with_prefix(
                f"{prefix}validateIfName: no net namespace {req.netns} found: ")) from exc
        if exists:
            raise delegate_error(req, delegate, InvalidEnvironment(
                f"{prefix}validateIfName: interface name {delegate.ifname} already exists"))


def write_network_status(req: CmdArgs, pod: Any, results: Results, kube: Any,
                         deadline: float) -> None:
    """The pod's network-status annotation, one entry per attached interface (one write)."""
    entries: List[dict] = []
    for delegate, result in results:
        info: Optional[dict] = None
        if delegate.device_id:
            info_file = runtime_conf(req, delegate).capability_args.get("CNIDeviceInfoFile")
            info = devices.load_device_info(info_file) if info_file else None
            if info is None and delegate.dra_device is not None:
                info = dra.device_info(delegate.device_id)  # ours: upstream has none
        entries.extend(netstatus.status_entries(
            delegate.name, convert_result(result, CURRENT_VERSION), default=delegate.master,
            device_info=info))
    if entries:
        kube.set_network_status(pod, netstatus.format_network_status(entries),
                                deadline=deadline)


def empty_result(req: CmdArgs) -> dict:
    """Upstream's answer for a pod that is not in the API (no delegate runs, F44)."""
    return {"cniVersion": CURRENT_VERSION,
            "interfaces": [{"name": req.ifname, "sandbox": req.netns}],
            "ips": [{"address": "0.0.0.0/0", "gateway": "0.0.0.0"}]}
