"""Dynamic attachments: one running pod's sandbox brought in line with its network selections.

With ``enableDynamicNetworks`` the daemon (:mod:`multusd.daemon.dynnetworks`) hands a pod (the
object its watch delivered) and the container ID of the pod's sandbox to :func:`reconcile`, in
that sandbox's lane: never beside its ADD, its DEL or another reconciliation of it. Everything
is read from the node's records, not from memory, so that a restart or a repeated call changes
nothing twice:

1. the sandbox's records and the configuration it was attached under, read once
   (:func:`multusd.core.podsandbox.read_view`); none, or a network namespace that is gone: the
   sandbox is released or being released, nothing is done; a configuration that cannot be
   established: nothing is done, said once (``notices``), and the caller tries again later;
2. the plan (:func:`multusd.core.podsandbox.changes_of`), from the pod's
   ``k8s.v1.cni.cncf.io/networks``, judged by that configuration;
3. hot-plug ADDs that never finished are undone; then each removal: the delegate's DEL, run
   as the runtime's DEL runs it, then its entry dropped from the scratch cache
   (``RemovedInterface``); a DEL that fails keeps the entry (``FailedRemovingInterface``);
4. each addition: the NAD's delegate as a pod's ADD makes it
   (:func:`~multusd.core.podnetworks.selection_delegate`), its interface name checked free in
   the namespace (an interface multusd did not make is never touched), recorded ``adding`` in
   the scratch cache before its plugins run, then its ADD. One that fails is rolled back as a
   failed ADD is (DEL; its entry dropped once released, else kept for the runtime's DEL) and
   reported with the plugin's error (``FailedAddingInterface``); one that succeeds is marked
   ``added`` (``AddedInterface``). The runtime's DEL of the sandbox releases it with the rest;
5. network-status, written once, from the records (every attachment the namespace holds), when
   something changed or an earlier change's write is missing (a restart, a failed write); not
   for a pod in ``systemNamespaces`` (as ADD).

Refusals (a selection without an interface, an interface name taken, one the sandbox's ADD
would refuse, an annotation that does not parse: the ADD's message) change nothing and are
said in a Warning event; failures are the caller's to retry.
A pod that starts terminating stops the work between two steps (``stopping``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

from multusd import store
from multusd.cni.conflist import Engine
from multusd.core import podsandbox, records, sandboxconfig
from multusd.core.delegate import Delegate
from multusd.core.effective import EffectiveConfig
from multusd.core.hotplugrecord import ADDED, ADDING, HotplugMark, Removal, ScratchEntries
from multusd.core.netchanges import Plan, Recorded, selection_name
from multusd.core.podnetworks import NadNotFound, nad_getter, selection_delegate
from multusd.core.runner import DelegateRunner, as_cni_error, emit_added
from multusd.core.selection import NETWORK_STATUS_ANNOTATION, NetworkSelection
from multusd.errors import MultusError
from multusd.node.netns import PodNetns
from multusd.store.valueclass import Record

# outcomes, the label of multusd_dynamic_reconciliations_total
CHANGED, UNCHANGED, REFUSED, FAILED, GONE, STOPPED = (
    "changed", "unchanged", "refused", "failed", "gone", "stopped")
OUTCOMES = (CHANGED, UNCHANGED, REFUSED, FAILED, GONE, STOPPED)
ADD_FAILED, REMOVE_FAILED = "FailedAddingInterface", "FailedRemovingInterface"
REMOVED_REASON = "RemovedInterface"


class Outcome(Record):
    """What :func:`reconcile` did: ``result`` is one of :data:`OUTCOMES`."""

    result: str
    added: Tuple[str, ...] = ()     # "net2 (default/net-b)"
    removed: Tuple[str, ...] = ()
    problems: Tuple[str, ...] = ()  # refusals and failures, as the events say them

    @property
    def retry(self) -> bool:
        return self.result == FAILED


def reconcile(pod: Any, container_id: str, node: EffectiveConfig, deadline: float, log: Any, *,
              engine: Engine, kube: Any, stopping: Callable[[], bool] = lambda: False,
              notices: Optional[sandboxconfig.Notices] = None) -> Outcome:
    """Bring the sandbox ``container_id`` of ``pod`` in line with its network selections.

    :param pod: the pod as the watch delivered it (namespace, name, uid, annotations, source).
    :param node: the node's configuration now (a sandbox without a record is judged by it).
    :param kube: NAD lookups, network-status and events (the daemon's client).
    :param stopping: True once the work must stop between steps (daemon stopping, pod
        terminating).
    :param notices: what was said of sandboxes already (said once, not per reconciliation).
    """
    try:
        view = podsandbox.read_view(container_id, node, log, notices=notices)
    except podsandbox.Unestablished as exc:
        if notices is None or notices.first(container_id, exc.msg):
            log.warning("dynamic networks: the sandbox's configuration cannot be established: "
                        "%s", exc.msg)
        return Outcome(result=FAILED, problems=(exc.msg,))
    if view is None:
        return Outcome(result=GONE)
    changes, refused = podsandbox.changes_of(view, pod)
    work = _Changes(view, pod, deadline, log, engine=engine, kube=kube)
    if refused:  # the annotation does not parse: the ADD's message
        log.warning("dynamic networks: %s; no interface was added or removed", refused)
        kube.emit_event(pod, "Warning", ADD_FAILED, refused)
        return Outcome(result=REFUSED, problems=(refused,))
    for refusal in changes.refused:
        work.warn(ADD_FAILED, refusal.why)
    if changes.changes:
        work.apply(changes, stopping)
    if not work.stopped:
        work.write_status(changed=changes.changes)
    problems = tuple(r.why for r in changes.refused) + tuple(work.failures)
    if work.failures:
        result = FAILED
    elif work.stopped:
        result = STOPPED
    elif changes.refused:
        result = REFUSED
    else:
        result = CHANGED if work.added or work.removed else UNCHANGED
    return Outcome(result=result, added=tuple(work.added), removed=tuple(work.removed),
                   problems=problems)


class _Changes:
    """One reconciliation's changes to the sandbox: its records (read in ``view``), edited
    and kept current as the plan is carried out."""

    def __init__(self, view: podsandbox.SandboxView, pod: Any, deadline: float, log: Any, *,
                 engine: Engine, kube: Any) -> None:
        self.view, self.pod, self.kube, self.log = view, pod, kube, log
        self.deadline, self.engine = deadline, engine
        self.settings = view.settings
        self.path, self.cni_dir, self.container_id = view.path, view.effective.cni_dir, \
            view.container_id
        self.req = view.request()
        self.entries = ScratchEntries.parse(view.data)  # its own copy, edited in place
        self.delegates: List[Delegate] = list(view.delegates)
        self.marks: List[Optional[HotplugMark]] = list(view.marks)
        self.added: List[str] = []
        self.removed: List[str] = []
        self.failures: List[str] = []
        self.stopped = False
        self.touched = False  # the records changed: network-status is written

    # -- changing ---------------------------------------------------------------------------
    def apply(self, changes: Plan, stopping: Callable[[], bool]) -> None:
        self.runner = DelegateRunner(self.engine, self.req, self.deadline, self.log,
                                     auxiliary_chain=self.settings.auxiliary_chain)
        steps: List[Callable[[], None]] = []
        steps += [lambda r=r: self._undo(r) for r in changes.undo]
        steps += [lambda r=r: self._finish(r) for r in changes.finished]
        steps += [lambda r=r: self._remove(r) for r in changes.remove]
        steps += [lambda s=s: self._add(s) for s in changes.add]
        with PodNetns(self.req.netns) as netns:
            self.netns = netns
            for step in steps:
                if stopping():
                    self.stopped = True
                    self.log.info("dynamic networks: stopped before every change was made "
                                  "(the daemon is stopping or the pod terminating)")
                    return
                if time.monotonic() >= self.deadline:
                    self.failures.append("the reconciliation ran out of time")
                    return
                step()

    def _index(self, delegate: Delegate) -> int:
        return next(i for i, d in enumerate(self.delegates) if d is delegate)

    def _write(self) -> None:
        store.atomic_write(self.path, self.entries.to_bytes())
        self.touched = True

    def _drop(self, delegate: Delegate, removal: Optional[Removal]) -> None:
        index = self._index(delegate)
        self.entries.drop(index, [d.ifname for d in self.delegates], removal)
        del self.delegates[index], self.marks[index]
        self._write()

    def _undo(self, recorded: Recorded) -> None:
        delegate = recorded.delegate
        try:
            self.runner.for_cleanup().delete(delegate)
        except Exception as exc:  # noqa: BLE001 - said as a CNI error; the entry stays
            self._failed(REMOVE_FAILED, delegate, "undoing its unfinished ADD",
                         as_cni_error(exc, self.log))
            return
        self.log.info("dynamic networks: an unfinished ADD of %s (%s) undone", delegate.ifname,
                      delegate.name)
        self._drop(delegate, None)

    def _finish(self, recorded: Recorded) -> None:
        index = self._index(recorded.delegate)
        mark = HotplugMark(state=ADDED, since=recorded.mark.since if recorded.mark else 0.0)
        self.entries.set_mark(index, mark)
        self.marks[index] = mark
        self._write()

    def _remove(self, recorded: Recorded) -> None:
        delegate = recorded.delegate
        try:
            self.runner.delete(delegate)
        except Exception as exc:  # noqa: BLE001 - said as a CNI error; the entry stays
            self._failed(REMOVE_FAILED, delegate, "its DEL failed", as_cni_error(exc, self.log))
            return
        self._drop(delegate, Removal(network=delegate.name, ifname=delegate.ifname,
                                     at=time.time()))
        self.removed.append(f"{delegate.ifname} ({delegate.name})")
        self.log.info("dynamic networks: removed %s (%s)", delegate.ifname, delegate.name)
        self.kube.emit_event(self.pod, "Normal", REMOVED_REASON,
                             f"Remove {delegate.ifname} from {delegate.name}")

    def _add(self, selection: NetworkSelection) -> None:
        name = selection_name(selection)
        try:
            delegate = selection_delegate(
                self.settings, selection, pod_namespace=self.pod.namespace,
                pod_name=self.pod.name, get_nad=nad_getter(self.kube, self.deadline))
            if self.netns.interface_exists(selection.interface):
                raise MultusError(f"interface {selection.interface} already exists in the pod "
                                  "and multusd did not make it: it is left alone; choose "
                                  "another interface name")
        except MultusError as exc:
            if isinstance(exc, NadNotFound):
                self.kube.emit_event(self.pod, "Warning", "NoNetworkFound", exc.event_message)
            self._failed(ADD_FAILED, None, f"{selection.interface} ({name})", exc)
            return
        if selection.default_route is not None:
            self.log.warning("dynamic networks: the default-route of %s is not applied to a "
                             "running pod", name)
        mark = HotplugMark(state=ADDING, since=time.time())
        self.entries.append(delegate, mark)
        self.delegates.append(delegate)
        self.marks.append(mark)
        self._write()
        try:
            result = self.runner.add(delegate)
        except Exception as exc:  # whatever failed, nothing half-made stays behind
            error = as_cni_error(exc, self.log)
            try:
                self.runner.for_cleanup().delete(delegate)
            except Exception as cleanup:  # noqa: BLE001 - kept for the runtime's DEL
                self.log.error("dynamic networks: rolling back %s (%s) failed: %s; its records "
                               "are kept for the runtime's DEL", delegate.ifname, name,
                               as_cni_error(cleanup, self.log).msg)
            else:
                self._drop(delegate, None)
            self._failed(ADD_FAILED, delegate, "its ADD failed and was rolled back", error)
            return
        self._finish(Recorded(delegate=delegate, mark=mark))
        self.added.append(f"{delegate.ifname} ({name})")
        self.log.info("dynamic networks: added %s (%s)", delegate.ifname, name)
        emit_added(self.kube, self.pod, delegate, result)

    def _failed(self, reason: str, delegate: Optional[Delegate], what: str,
                exc: MultusError) -> None:
        label = f"{delegate.ifname} ({delegate.name}): {what}" if delegate is not None else what
        message = f"{label}: {exc.msg}"
        self.failures.append(message)
        self.log.warning("dynamic networks: %s", message)
        self.kube.emit_event(self.pod, "Warning", reason, message)

    def warn(self, reason: str, message: str) -> None:
        self.log.warning("dynamic networks: %s", message)
        self.kube.emit_event(self.pod, "Warning", reason, message)

    # -- network-status ---------------------------------------------------------------------
    def write_status(self, *, changed: bool) -> None:
        """network-status from the records, once, when the records say the pod's differs."""
        if not (self.touched or self.view.history or changed):
            return
        if self.pod.namespace in self.settings.system_namespaces:
            return
        record = records.read_sandbox(self.cni_dir, self.container_id)
        if record is None:
            return
        value = podsandbox.status_of(record)
        if self.pod.annotations.get(NETWORK_STATUS_ANNOTATION) == value:
            return
        try:
            self.kube.set_network_status(self.pod, value, deadline=self.deadline)
        except MultusError as exc:
            self.failures.append(f"network-status not written: {exc.msg}")
            self.log.warning("dynamic networks: network-status not written: %s", exc.msg)
