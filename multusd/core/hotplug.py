"""``POST /delegate``: add, check or remove one interface in a running pod (hot-plug, F10).

Wire-compatible with upstream (the multus-dynamic-networks-controller calls it): the body is
a /cni body whose ``config`` is the delegate's own CNI config, plus ``interfaceAttributes``
(``ips``, ``mac``, ``cni-args``). There is no scratch cache and no network-status update;
ADD emits an ``AddedInterface`` event. Unlike upstream, the daemon-config overlay is not
laid over the delegate's config (it would overwrite the delegate's own cniVersion), and DEL
works without the pod: removing an interface must not depend on the API server.
"""

from __future__ import annotations

from typing import Any, Mapping

from multusd import CURRENT_VERSION
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.cni.result import convert_result
from multusd.core.delegate import Delegate
from multusd.core.request import CmdArgs
from multusd.core.runner import cleanup_deadline, emit_added
from multusd.core.runtimeconf import inject_cni_args, runtime_conf, undeclared_requests
from multusd.core.selection import NetworkSelection
from multusd.errors import InvalidNetworkConfig, MultusError, PodNotFound

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS")


def handle_delegate(req: CmdArgs, attributes: Mapping[str, Any], deadline: float,
                    log: Any, *, engine: Engine, kube: Any) -> dict | None:
    """Run one hot-plug request; returns the result for ADD, at :data:`CURRENT_VERSION`.

    :param kube: the Kubernetes client (None without a kubeconfig).
    """
    if req.command not in COMMANDS:
        raise InvalidNetworkConfig(f"unknown cmd type: {req.command}; /delegate takes "
                                   f"{', '.join(COMMANDS)}")
    delegate = delegate_from_request(req, attributes)
    net = NetworkConfigList.load(delegate.conf, source=f"/delegate {delegate.name}")
    if req.command == "STATUS":
        engine.status(net, deadline)
        return None
    rt = runtime_conf(req, delegate)
    if req.command == "DEL":
        engine.delete(net, rt, deadline)
        log.info("hot-unplugged %s (%s)", delegate.ifname, delegate.name)
        return None
    if req.command == "CHECK":
        engine.check(net, rt, deadline)
        return None
    if kube is not None and not req.has_pod:
        raise PodNotFound("pod not found during Multus GetPod: /delegate ADD needs the pod's "
                          "K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS")
    pod = kube.get_pod(req.pod_namespace, req.pod_name, deadline=deadline) if kube else None
    if kube is not None and pod is None:
        raise PodNotFound(f"pod not found during Multus GetPod: {req.pod_namespace}/"
                          f"{req.pod_name} does not exist in the API")
    for line in undeclared_requests(delegate):
        log.warning("%s", line)
    try:
        result = engine.add(net, rt, deadline)
    except MultusError:
        _remove_half_made(engine, net, rt, deadline, log)
        raise
    emit_added(kube, pod, delegate, result)
    log.info("hot-plugged %s (%s)", delegate.ifname, delegate.name)
    return convert_result(result, CURRENT_VERSION)


def _remove_half_made(engine, net, rt, deadline: float, log) -> None:
    """DEL what a failed hot-plug ADD may have set up (a conflist can fail half-way)."""
    try:
        engine.delete(net, rt, cleanup_deadline(deadline))
    except MultusError as exc:
        log.error("cleaning up the failed hot-plug of %s failed: %s", rt.ifname, exc.msg)


def delegate_from_request(req: CmdArgs, attributes: Mapping[str, Any]) -> Delegate:
    """The one delegate a /delegate request describes (its config plus the attributes)."""
    conf = req.config_bytes
    cni_args = attributes.get("cni-args")
    if isinstance(cni_args, dict) and cni_args:
        conf = inject_cni_args(conf, cni_args)
    net = NetworkConfigList.load(conf, source="/delegate config")
    ips = tuple(attributes.get("ips") or ())
    mac = str(attributes.get("mac") or "")
    selection = NetworkSelection(name=net.name, namespace=req.pod_namespace,
                                 interface=req.ifname, ips=ips, mac=mac,
                                 cni_args=cni_args if isinstance(cni_args, dict) else None)
    return Delegate(name=net.name, conf=conf, ifname=req.ifname, master=False,
                    selection=selection, mac_request=mac, ip_request=ips)
