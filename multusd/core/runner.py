"""A request's delegates run through the CNI engine: one delegate's ADD, DEL or CHECK, and DEL of all.

ADD (:mod:`multusd.core.cmdadd`), DEL (:mod:`multusd.core.cmddel`), CHECK and hot-plug
(:mod:`multusd.core.hotplug`) share these steps through this module, not through each other.
What a delegate's plugins get besides its config is :func:`~multusd.core.runtimeconf.
runtime_conf`'s; running the plugins and libcni's result cache is the engine's
(:class:`~multusd.cni.conflist.Engine`). Here, around each run: the device-info file of a
delegate with a device (copied from the device plugin's before ADD, removed after DEL), the
warnings for requests a delegate's config does not declare, and the order in which a
sandbox's delegates are released (:mod:`multusd.core.parallel`'s waves, backwards).
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.cni.result import ip_addresses, is_empty
from multusd.core import parallel
from multusd.core.delegate import Delegate
from multusd.core.request import CmdArgs, pod_prefix
from multusd.core.runtimeconf import runtime_conf, undeclared_requests
from multusd.errors import MultusError, from_exception
from multusd.node import devices
from multusd.store.valueclass import Record, replace

CLEANUP_TIME = 30.0  # what undoing a failed ADD gets at least, even past the ADD's deadline

Failures = List[Tuple[Delegate, BaseException]]


class DelegateRunner(Record):
    """Runs the delegates of one request (``req``) with ``engine``, within ``deadline``.

    ``parallel_delegates`` is the daemon's ``parallelDelegates``: independent delegates are
    attached, and released (:meth:`delete_all`), concurrently. ``auxiliary_chain`` is the
    ``auxiliaryCNIChainName`` chain, which depends on every other delegate.
    """

    engine: Engine
    req: CmdArgs
    deadline: float
    log: Any
    parallel_delegates: bool = False
    auxiliary_chain: str = ""

    def for_cleanup(self) -> "DelegateRunner":
        """This runner with a deadline for undoing a failed ADD: it gets a chance even when
        the ADD used up its own."""
        return replace(self, deadline=cleanup_deadline(self.deadline))

    def waves(self, delegates: Sequence[Delegate], *, adding: bool = True) -> List[List[int]]:
        """The waves ``delegates`` run in (see :func:`multusd.core.parallel.plan`)."""
        return parallel.plan(delegates, parallel=self.parallel_delegates,
                             auxiliary_chain=self.auxiliary_chain, master_first=adding)

    def add(self, delegate: Delegate) -> dict:
        """ADD of one delegate: its plugins run, their result cached (libcni's) and returned."""
        net = NetworkConfigList.load(delegate.conf, source=delegate.name)
        if not delegate.master:
            for line in undeclared_requests(delegate):
                self.log.warning("%s", line)
        rt = runtime_conf(self.req, delegate)
        info_file = rt.capability_args.get("CNIDeviceInfoFile")
        if delegate.device_id and info_file:
            devices.copy_device_plugin_info(
                delegate.resource_name, delegate.device_id, info_file,
                dp_dir=devices.devinfo_dp_dir(self.req.effective.devinfo_dir))
        return self.engine.add(net, rt, self.deadline)

    def delete(self, delegate: Delegate) -> None:
        """DEL of one delegate, its device-info file removed once released."""
        net = NetworkConfigList.load(delegate.conf, source=delegate.name)
        rt = runtime_conf(self.req, delegate)
        self.engine.delete(net, rt, self.deadline)
        info_file = rt.capability_args.get("CNIDeviceInfoFile")
        if delegate.device_id and info_file:
            devices.remove_device_info(info_file)

    def delete_all(self, delegates: Sequence[Delegate],
                   only: Optional[Sequence[int]] = None) -> Failures:
        """DEL every delegate (or those at the indices ``only``), dependents before what they
        depend on; every one gets its DEL, whatever failed before. Returns the failures, in
        reverse ADD order."""
        failures: Failures = []
        for wave in parallel.reverse_waves(self.waves(delegates, adding=False), only=only):
            outcomes = parallel.run_each(self.delete, [delegates[i] for i in wave])
            failures += [(delegates[i], exc) for i, (_, exc) in zip(wave, outcomes)
                         if exc is not None]
        return failures

    def check(self, delegate: Delegate, net: NetworkConfigList) -> None:
        """CHECK of one delegate (``net``: its config, loaded)."""
        self.engine.check(net, runtime_conf(self.req, delegate), self.deadline)


def delegate_error(req: CmdArgs, delegate: Delegate, exc: MultusError) -> MultusError:
    """``exc`` as upstream reports a delegate's failure: the pod, the network, what failed."""
    return exc.with_prefix(f"{pod_prefix(req, delegate.name)}: error adding container to "
                           f"network \"{delegate.name}\": ")


def as_cni_error(exc: BaseException, log: Any) -> MultusError:
    """Any failure as a CNI error; one of ours is logged with its traceback first."""
    if not isinstance(exc, MultusError):
        log.error("unexpected failure during ADD (rolled back)", exc_info=exc)
    return from_exception(exc)


def cleanup_deadline(deadline: float) -> float:
    """A deadline for undoing a failed ADD: at least :data:`CLEANUP_TIME` from now."""
    return max(deadline, time.monotonic() + CLEANUP_TIME)


def emit_added(kube: Any, pod: Any, delegate: Delegate, result: dict) -> None:
    """The pod's ``AddedInterface`` event for a delegate whose ADD gave ``result``."""
    if pod is None or is_empty(result):
        return
    addresses = ",".join(ip_addresses(result))
    source = f" from {delegate.name}" if delegate.name else ""
    kube.emit_event(pod, "Normal", "AddedInterface",
                    f"Add {delegate.ifname} [{addresses}]{source}")

