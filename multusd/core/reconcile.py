"""Dynamic attachments: one running pod's sandbox brought in line with its network selections.

With ``enableDynamicNetworks`` the daemon (:mod:`multusd.daemon.dynnetworks`) hands a pod (the
object its watch delivered) and the container ID of the pod's sandbox to :func:`reconcile`, in
that sandbox's lane: never beside its ADD, its DEL or another reconciliation of it. Everything
is read from the node's records, not from memory, so that a restart or a repeated call changes
nothing twice:

1. the sandbox's scratch and result caches (:mod:`multusd.core.records`); none, or a network
   namespace that is gone: the sandbox is released or being released, nothing is done;
2. the plan (:mod:`multusd.core.netchanges`), from the pod's ``k8s.v1.cni.cncf.io/networks``;
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

Refusals (a selection without an interface, an interface name taken, an annotation that does
not parse) change nothing and are said in a Warning event; failures are the caller's to retry.
A pod that starts terminating stops the work between two steps (``stopping``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, List, Optional, Tuple

from multusd import store
from multusd.cni import resultcache
from multusd.cni.conflist import Engine
from multusd.core import dra, netstatus, records, unreleased
from multusd.core.delegate import Delegate
from multusd.core.hotplugrecord import ADDED, ADDING, HotplugMark, Removal, ScratchEntries
from multusd.core.netchanges import Plan, Recorded, plan, selection_name
from multusd.core.podnetworks import NadNotFound, nad_getter, selection_delegate
from multusd.core.request import CmdArgs
from multusd.core.runner import DelegateRunner, as_cni_error, emit_added
from multusd.core.scratch import cache_path, delegates_from_cache, read_cache
from multusd.core.selection import NETWORKS_ANNOTATION, NETWORK_STATUS_ANNOTATION, \
    NetworkSelection, parse_selections
from multusd.core.effective import EffectiveConfig
from multusd.core.settings import MultusSettings
from multusd.errors import DecodeFailure, MultusError
from multusd.node import devices
from multusd.node.netns import PodNetns
from multusd.store.valueclass import Record

# outcomes, the label of multusd_dynamic_reconciliations_total
CHANGED, UNCHANGED, REFUSED, FAILED, GONE, STOPPED = (
    "changed", "unchanged", "refused", "failed", "gone", "stopped")
OUTCOMES = (CHANGED, UNCHANGED, REFUSED, FAILED, GONE, STOPPED)
ADD_FAILED, REMOVE_FAILED = "FailedAddingInterface", "FailedRemovingInterface"
REMOVED_REASON = "RemovedInterface"
# what a request carries of the sandbox's CNI_ARGS (the rest is each delegate's own)
_POD_ARGS = ("IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID",
             "K8S_POD_UID")


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
              engine: Engine, kube: Any, stopping: Callable[[], bool] = lambda: False) -> Outcome:
    """Bring the sandbox ``container_id`` of ``pod`` in line with its network selections.

    :param pod: the pod as the watch delivered it (namespace, name, uid, annotations, source).
    :param kube: NAD lookups, network-status and events (the daemon's client).
    :param stopping: True once the work must stop between steps (daemon stopping, pod
        terminating).
    """
    work = _Sandbox(pod, container_id, node, deadline, log, engine=engine, kube=kube)
    if not work.load():
        return Outcome(result=GONE)
    try:
        selections = parse_selections(pod.annotations.get(NETWORKS_ANNOTATION, ""),
                                      pod.namespace, pod=f"{pod.namespace}/{pod.name}")
    except MultusError as exc:
        work.warn(ADD_FAILED, f"{exc.msg}; no interface was added or removed")
        return Outcome(result=REFUSED, problems=(exc.msg,))
    changes = plan(selections, work.recorded(), protected=work.protected())
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


class _Sandbox:
    """One reconciliation's view of the sandbox: its records, kept current as it edits them."""

    def __init__(self, pod: Any, container_id: str, node: EffectiveConfig, deadline: float,
                 log: Any, *, engine: Optional[Engine], kube: Any) -> None:
        self.pod, self.kube, self.log = pod, kube, log
        self.node, self.deadline, self.engine = node, deadline, engine
        self.cni_dir = node.cni_dir
        self.path = cache_path(self.cni_dir, container_id)
        self.container_id = container_id
        self.added: List[str] = []
        self.removed: List[str] = []
        self.failures: List[str] = []
        self.stopped = False
        self.touched = False  # the records changed: network-status is written
        self.settings = MultusSettings()
        self.history = False  # the records show changes made while the pod ran

    # -- reading ----------------------------------------------------------------------------
    def load(self) -> bool:
        """Read the records; False when there is nothing to reconcile (released, no netns)."""
        record = records.read_sandbox(self.cni_dir, self.container_id)
        data = read_cache(self.path)
        if record is None or data is None or record.netns_state() != records.PRESENT:
            return False
        if self.node.settings is not None:
            self.settings = self.node.settings
        else:
            self.log.warning("dynamic networks: the node's multus settings do not load (%s); "
                             "using the defaults to tell the cluster's networks",
                             self.node.why_no_settings)
        args = tuple((k, v) for k, v in record.cni_args if k in _POD_ARGS)
        self.req = CmdArgs("ADD", self.container_id, record.netns, record.master_ifname, args,
                           self.node, b"")
        try:
            self.entries = ScratchEntries.parse(data)
            self.delegates = delegates_from_cache(data, top_cni_version=self.req.cni_version,
                                                  cni_ifname=record.master_ifname)
        except DecodeFailure as exc:  # never edited: the runtime's DEL falls back as it can
            self.log.warning("dynamic networks: the sandbox's scratch cache %s is unreadable "
                             "(%s): its attachments are left as they are", self.path, exc.msg)
            return False
        self.marks = self.entries.marks()
        self.history = any(self.marks) or bool(self.entries.removals())
        return True

    def recorded(self) -> List[Recorded]:
        return [Recorded(delegate=d, mark=m, cached=self._cached(d))
                for d, m in zip(self.delegates, self.marks)]

    def protected(self) -> Tuple[str, ...]:
        """The names the ``defaultNetworks`` entries get (a NAD in multusNamespace)."""
        return tuple(f"{self.settings.multus_namespace}/{ref}"
                     for ref in self.settings.default_networks if "/" not in ref)

    def _cached(self, delegate: Delegate) -> bool:
        try:
            return resultcache.read(self.cni_dir, delegate.conf_name, self.container_id,
                                    delegate.ifname) is not None
        except MultusError:  # a name that cannot name a cache file: nothing is cached
            return False

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
        if not (self.touched or self.history or changed):
            return
        if self.pod.namespace in self.settings.system_namespaces:
            return
        record = records.read_sandbox(self.cni_dir, self.container_id)
        if record is None:
            return
        value = status_of(record)
        if self.pod.annotations.get(NETWORK_STATUS_ANNOTATION) == value:
            return
        try:
            self.kube.set_network_status(self.pod, value, deadline=self.deadline)
        except MultusError as exc:
            self.failures.append(f"network-status not written: {exc.msg}")
            self.log.warning("dynamic networks: network-status not written: %s", exc.msg)


def status_of(record: Any) -> str:
    """The network-status annotation of a sandbox's records, as its ADD writes it: one entry
    per interface of each attachment whose result is cached, in the records' order."""
    entries: List[dict] = []
    for attachment in record.attachments:
        if attachment.result is None:
            continue
        info = None
        if attachment.device_id:
            path = attachment.device_info_file
            info = devices.load_device_info(path) if path else None
            if info is None and attachment.dra_device is not None:
                info = dra.device_info(attachment.device_id)
        entries.extend(netstatus.status_entries(
            attachment.network, attachment.result, default=attachment.master,
            device_info=info))
    return netstatus.format_network_status(entries)


def needs_reconciling(pod: Any, container_id: str, node: EffectiveConfig, log: Any) -> bool:
    """Whether :func:`reconcile` would do anything (read-only, outside the lane): a change
    planned, a refusal to say, or network-status behind the records."""
    work = _Sandbox(pod, container_id, node, 0.0, log, engine=None, kube=None)
    try:
        if not work.load():
            return False
        selections = parse_selections(pod.annotations.get(NETWORKS_ANNOTATION, ""),
                                      pod.namespace)
    except MultusError:
        return True  # the reconciliation says what is wrong
    changes = plan(selections, work.recorded(), protected=work.protected())
    if changes.changes or changes.refused:
        return True
    if not work.history or pod.namespace in work.settings.system_namespaces:
        return False
    record = records.read_sandbox(work.cni_dir, container_id)
    return record is not None and \
        pod.annotations.get(NETWORK_STATUS_ANNOTATION) != status_of(record)


def sandbox_of(pod: Any, entries: List[dict], cni_dir: str, *, spare: str = ""
               ) -> Optional[str]:
    """The container ID of the pod's sandbox, as the node's records name it; None if none.

    ``entries``: libcni's result cache (:func:`multusd.cni.resultcache.list_entries`). A
    sandbox of the pod's namespace, name and UID (any UID for a static pod: its mirror's
    differs), with a scratch cache, no failed DEL (its mark in ``<cniDir>`` or in ``spare``,
    :func:`~multusd.core.unreleased.spare_marks_dir`) and its network namespace present; of
    several (a sandbox being replaced), the one recorded last.
    """
    netns_of = {}
    for entry in entries:
        args = dict(pair for pair in entry.get("cniArgs") or []
                    if isinstance(pair, list) and len(pair) == 2)
        if args.get("K8S_POD_NAMESPACE") != pod.namespace or \
                args.get("K8S_POD_NAME") != pod.name:
            continue
        uid = args.get("K8S_POD_UID")
        if uid and uid != pod.uid and not pod.is_static:
            continue
        if entry.get("netns"):
            netns_of.setdefault(str(entry["containerId"]), str(entry["netns"]))
    found = []
    for container_id, netns in netns_of.items():
        path = cache_path(cni_dir, container_id)
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if unreleased.read(cni_dir, container_id, spare=spare) is None and \
                records.netns_state(netns) == records.PRESENT:
            found.append((mtime, container_id))
    return max(found)[1] if found else None
