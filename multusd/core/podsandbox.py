"""A running pod's sandbox as its records say it, read only: what a dynamic reconciliation acts on.

``enableDynamicNetworks`` (:mod:`multusd.core.reconcile` acts, :mod:`multusd.daemon.dynnetworks`
decides when) judges a pod by the sandbox's records, never by memory: :func:`read_view` reads
them once into a :class:`SandboxView` (its scratch and result caches, its network namespace,
the configuration it was attached under); :func:`changes_of` plans what the pod's
network-selection annotation asks of it; :func:`needs_reconciling` says whether a
reconciliation would do anything, without changing anything (the daemon asks it outside the
lanes).

The sandbox is judged by the configuration it was attached under
(:mod:`multusd.core.sandboxconfig`): an attachment named by ``clusterNetwork`` or
``defaultNetworks`` is never the annotation's to remove, and a new selection is refused as the
sandbox's ADD would have refused it (``namespaceIsolation``, with the ADD's message). A sandbox
without that record (an earlier multusd's, upstream's) is judged by the node's configuration as
it resolves now (said once); when neither can be established (the record does not parse, or
there is none and the node's settings do not load), :class:`Unestablished` says why and
nothing is changed.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from multusd import go_field
from multusd.cni import resultcache
from multusd.core import delmarks, dra, netstatus, records, sandboxconfig
from multusd.core.delegate import Delegate
from multusd.core.effective import EffectiveConfig
from multusd.core.hotplugrecord import HotplugMark, ScratchEntries
from multusd.core.netchanges import Plan, Recorded, plan
from multusd.core.podnetworks import check_namespace_isolation
from multusd.core.request import CmdArgs
from multusd.core.scratch import cache_path, delegates_from_cache, read_cache
from multusd.core.selection import NETWORKS_ANNOTATION, NETWORK_STATUS_ANNOTATION, \
    NetworkSelection, parse_selections
from multusd.core.settings import MultusSettings
from multusd.errors import DecodeFailure, MultusError
from multusd.node import devices
from multusd.store.valueclass import Record, replace

# what a reconciliation's request carries of the sandbox's CNI_ARGS (the rest is each
# delegate's own)
_POD_ARGS = ("IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID",
             "K8S_POD_UID")


class Unestablished(MultusError):
    """The configuration the sandbox is to be judged by cannot be established: nothing is
    changed (the msg says why)."""


class SandboxView(Record):
    """One reading of a running pod's sandbox (see the module docstring)."""

    container_id: str
    path: str                          # its scratch cache
    data: bytes                        # the scratch cache's bytes, as read
    record: records.SandboxRecord      # its records (netns, CNI_ARGS, attachments)
    effective: EffectiveConfig         # the configuration it is judged by
    recorded: bool                     # ... which is its own record (else the node's, now)
    delegates: Tuple[Delegate, ...]    # in the scratch cache's order
    marks: Tuple[Optional[HotplugMark], ...]
    cached: Tuple[bool, ...]           # libcni's result cache holds each one's result
    history: bool                      # the records show changes made while the pod ran

    @property
    def settings(self) -> MultusSettings:
        return self.effective.require_settings()

    def attachments(self) -> List[Recorded]:
        return [Recorded(delegate=d, mark=m, cached=c)
                for d, m, c in zip(self.delegates, self.marks, self.cached)]

    def protected(self) -> Tuple[str, ...]:
        """For attachments whose record does not say what named them: the names the
        ``defaultNetworks`` entries get (a NAD in multusNamespace), as configured now."""
        return tuple(f"{self.settings.multus_namespace}/{ref}"
                     for ref in self.settings.default_networks if "/" not in ref)

    def request(self) -> CmdArgs:
        """The request a reconciliation's delegates run under (the sandbox's ADD's)."""
        args = tuple((k, v) for k, v in self.record.cni_args if k in _POD_ARGS)
        return CmdArgs("ADD", self.container_id, self.record.netns, self.record.master_ifname,
                       args, self.effective, b"")


def read_view(container_id: str, node: EffectiveConfig, log: Any, *,
              notices: Optional[sandboxconfig.Notices] = None) -> Optional[SandboxView]:
    """The sandbox's records under ``node.cni_dir``; None when there is nothing to reconcile
    (released, being released, its network namespace gone).

    :raises Unestablished: the configuration to judge it by cannot be established.
    """
    record = records.read_sandbox(node.cni_dir, container_id)
    path = cache_path(node.cni_dir, container_id)
    data = read_cache(path)
    if record is None or data is None or record.netns_state() != records.PRESENT:
        return None
    try:
        entries = ScratchEntries.parse(data)
    except DecodeFailure as exc:  # never edited: the runtime's DEL falls back as it can
        raise Unestablished(f"its scratch cache {path} is unreadable ({exc.msg}): its "
                            "attachments are left as they are") from None
    attached, problem = sandboxconfig.read(entries.entries)
    if problem:
        raise Unestablished(f"its record of the configuration it was attached under does not "
                            f"parse ({problem}): its attachments are left as they are")
    if attached is not None:  # judged where its records are, as DEL judges it
        config = sandboxconfig.applied(node, replace(attached, cni_dir=node.cni_dir))
    elif node.settings is None:
        raise Unestablished("it has no record of the configuration it was attached under, and "
                            f"the node's multus settings do not load ({node.why_no_settings}): "
                            "its attachments are left as they are")
    else:
        if notices is None or notices.first(container_id, "none"):
            log.info(sandboxconfig.NO_RECORD, container_id)
        config = node
    cni_version = str(go_field(config.merged, "cniVersion") or "")  # as CmdArgs reads it
    try:
        delegates = delegates_from_cache(data, top_cni_version=cni_version,
                                         cni_ifname=record.master_ifname)
    except DecodeFailure as exc:
        raise Unestablished(f"its scratch cache {path} is unreadable ({exc.msg}): its "
                            "attachments are left as they are") from None
    marks = entries.marks()
    return SandboxView(
        container_id=container_id, path=path, data=data, record=record, effective=config,
        recorded=attached is not None, delegates=tuple(delegates), marks=tuple(marks),
        cached=tuple(_cached(config.cni_dir, container_id, d) for d in delegates),
        history=any(marks) or bool(entries.removals()))


def changes_of(view: SandboxView, pod: Any) -> Tuple[Plan, str]:
    """What the pod's network-selection annotation asks of the sandbox: ``(plan, "")``, or
    ``(an empty plan, why the annotation is refused)`` (it does not parse: the ADD's message)."""
    try:
        selections = parse_selections(pod.annotations.get(NETWORKS_ANNOTATION, ""),
                                      pod.namespace, pod=f"{pod.namespace}/{pod.name}")
    except MultusError as exc:
        return Plan(), exc.msg
    settings = view.settings

    def refusal(selection: NetworkSelection) -> str:
        try:
            check_namespace_isolation(settings, pod.namespace, selection)
        except MultusError as exc:
            return exc.msg
        return ""

    return plan(selections, view.attachments(), protected=view.protected(),
                refuse=refusal), ""


def needs_reconciling(view: SandboxView, pod: Any) -> bool:
    """Whether a reconciliation would do anything: a change planned, a refusal to say, or
    network-status behind the records."""
    changes, refused = changes_of(view, pod)
    if refused or changes.changes or changes.refused:
        return True
    if not view.history or pod.namespace in view.settings.system_namespaces:
        return False
    return pod.annotations.get(NETWORK_STATUS_ANNOTATION) != status_of(view.record)


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


def sandbox_of(pod: Any, entries: List[dict], cni_dir: str, *, spare: str = ""
               ) -> Optional[str]:
    """The container ID of the pod's sandbox, as the node's records name it; None if none.

    ``entries``: libcni's result cache (:func:`multusd.cni.resultcache.list_entries`). A
    sandbox of the pod's namespace, name and UID (any UID for a static pod: its mirror's
    differs), with a scratch cache, no failed DEL (its mark in ``<cniDir>`` or in ``spare``,
    :func:`~multusd.core.delmarks.spare_marks_dir`) and its network namespace present; of
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
        if delmarks.read(cni_dir, container_id, spare=spare) is None and \
                records.netns_state(netns) == records.PRESENT:
            found.append((mtime, container_id))
    return max(found)[1] if found else None


def _cached(cni_dir: str, container_id: str, delegate: Delegate) -> bool:
    try:
        return resultcache.read(cni_dir, delegate.conf_name, container_id,
                                delegate.ifname) is not None
    except MultusError:  # a name that cannot name a cache file: nothing is cached
        return False
