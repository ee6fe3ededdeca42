"""The node's sandbox records read back from disk (scratch cache + libcni result cache), read-only.

One :class:`SandboxRecord` per container ID found in ``<cniDir>/<containerID>`` or in
``<cniDir>/results/*-<containerID>-*``: what DEL would release for it. The pod identity and the
network namespace come from the result cache (``cniArgs``, ``netns``), the delegates from the
scratch cache (the result cache alone when it is gone, as DEL falls back to it). A sandbox is
*stale* when the namespace its records name no longer exists: nothing can use its addresses,
and the runtime's DEL was evidently lost (the IP leases leak until it is released). A
sandbox whose DEL failed carries its :class:`~multusd.core.delmarks.FailedDelete`: still
reported to the runtime, or past its window and *unreleased* (DEL answered success, the
records kept until the daemon, or ``multusd gc``, releases it).

The tools read the whole node (:func:`read_node`, :func:`find_sandbox`): every cniDir its
configuration names, where requests may have recorded sandboxes, and the marks wherever they
are kept (:mod:`multusd.core.markadoption`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import CURRENT_VERSION
from multusd.cni import resultcache
from multusd.cni.conflist import NetworkConfigList
from multusd.cni.result import convert_result
from multusd.core import delmarks, markadoption, scratch
from multusd.core.dra import DraDevice
from multusd.core.hotplugrecord import HotplugMark, Removal, read_marks
from multusd.core.request import PodIdentity
from multusd.cni.names import is_valid_name
from multusd.errors import MultusError
from multusd.store.valueclass import Record, field, replace

LOG = logging.getLogger(__name__)

NS_GET_NSTYPE = 0xB703  # ioctl(2) on an nsfs file: which kind of namespace it is
CLONE_NEWNET = 0x40000000
PRESENT, GONE, UNKNOWN = "present", "gone", "unknown"
_SECRET_KEY = re.compile(r"pass(word|wd)?$|token|secret|credential|api_?key|private_?key",
                         re.IGNORECASE)
REDACTED = "<redacted>"


class Attachment(Record):
    """One delegate of a sandbox: its network, interface and what its plugins returned."""

    network: str                       # the delegate's name, as network-status shows it
    net_name: str                      # "name" in its config (the result-cache key)
    ifname: str
    master: bool
    plugins: Tuple[str, ...]           # plugin types, IPAM types included
    conf: bytes
    device_id: str = ""
    resource_name: str = ""
    dra_device: Optional[DraDevice] = None  # the DRA claim and device behind device_id
    cache_file: str = ""               # its libcni result-cache file ('' when there is none)
    result: Optional[dict] = None      # the cached result, at CURRENT_VERSION
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    hotplug: Optional[HotplugMark] = None  # added while the pod ran (enableDynamicNetworks)

    @property
    def ips(self) -> List[str]:
        return [ip.get("address", "") for ip in (self.result or {}).get("ips") or []
                if self._is_ours(ip)]

    @property
    def gateways(self) -> List[str]:
        return [ip["gateway"] for ip in (self.result or {}).get("ips") or []
                if ip.get("gateway") and self._is_ours(ip)]

    @property
    def mac(self) -> str:
        for interface in (self.result or {}).get("interfaces") or []:
            if interface.get("name") == self.ifname and interface.get("sandbox"):
                return str(interface.get("mac", ""))
        return ""

    @property
    def device_info_file(self) -> str:
        return str(self.capability_args.get("CNIDeviceInfoFile") or "")

    def _is_ours(self, ip: Mapping[str, Any]) -> bool:
        """An IP of this attachment's pod interface (results also list host-side links)."""
        interfaces = (self.result or {}).get("interfaces") or []
        index = ip.get("interface")
        if not isinstance(index, int) or not 0 <= index < len(interfaces):
            return True
        return interfaces[index].get("name") == self.ifname


class SandboxRecord(PodIdentity, Record):
    """Everything the node has recorded about one sandbox (container ID)."""

    container_id: str
    scratch_file: str                  # '' when there is no scratch cache
    scratch_error: str                 # why the scratch cache could not be read ('' if it could)
    netns: str                         # '' when no record names it
    cni_args: Tuple[Tuple[str, str], ...]
    attachments: Tuple[Attachment, ...]
    result_files: Tuple[str, ...]
    mtime: float                       # when the sandbox's oldest record was written
    failed_delete: Optional[delmarks.FailedDelete] = None  # its DEL failed (see delmarks)
    removed: Tuple[Removal, ...] = ()  # attachments removed while the pod ran
    cni_dir: str = ""                  # the cniDir its records are in

    def is_unreleased(self, now: Any = None) -> bool:
        """Its DEL failed past the window: answered success, its records kept until the
        daemon (or ``multusd gc``) releases it; ``now`` as :func:`multusd.as_instant` takes
        it."""
        return self.failed_delete is not None and self.failed_delete.is_unreleased(now)

    @property
    def pod(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}" if self.pod_name else ""

    @property
    def master_ifname(self) -> str:
        return next((a.ifname for a in self.attachments if a.master), "eth0")

    def netns_state(self) -> str:
        """:data:`PRESENT`, :data:`GONE` or :data:`UNKNOWN` (no record names a namespace)."""
        return netns_state(self.netns)

    @property
    def files(self) -> List[str]:
        """Every file DEL removes for this sandbox once it released everything."""
        return ([self.scratch_file] if self.scratch_file else []) + list(self.result_files)


def netns_state(path: str) -> str:
    """Whether the network namespace file ``path`` still holds a network namespace.

    ``ip netns del`` and the runtimes unmount and remove the file; a file that is left but
    is no longer an nsfs mount (an empty placeholder) does not count as a namespace either.
    """
    if not path:
        return UNKNOWN
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return GONE
    except OSError as exc:
        LOG.debug("cannot open netns %s: %s", path, exc)
        return UNKNOWN
    try:
        return PRESENT if fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET else GONE
    except OSError as exc:
        return GONE if exc.errno in (errno.ENOTTY, errno.EINVAL) else UNKNOWN
    finally:
        os.close(fd)


def container_ids(cni_dir: str) -> List[str]:
    """Container IDs with records under ``cni_dir``: scratch files and result-cache entries."""
    found = set()
    try:
        with os.scandir(cni_dir) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False) and is_valid_name(entry.name):
                    found.add(entry.name)
    except FileNotFoundError:
        return []
    for entry in resultcache.list_entries(cni_dir):
        found.add(str(entry["containerId"]))
    return sorted(found)


def read_sandboxes(cni_dir: str, *, spare: str = "") -> List[SandboxRecord]:
    """Every sandbox recorded under ``cni_dir``, oldest first, with the marks of failed DELs
    from there and from ``spare`` (:func:`~multusd.core.delmarks.spare_marks_dir`).

    :raises IOFailure: ``cni_dir`` or its ``results/`` cannot be listed.
    """
    entries = resultcache.list_entries(cni_dir)
    marks = delmarks.read_all(cni_dir, spare=spare)
    records = [_read(cni_dir, cid, entries, marks.get(cid)) for cid in container_ids(cni_dir)]
    return sorted(records, key=lambda r: (r.mtime, r.container_id))


def read_node(cni_dirs: Sequence[str], *, spare: str = "") -> List[SandboxRecord]:
    """Every sandbox recorded in any of ``cni_dirs`` (every cniDir the node names:
    :func:`multusd.core.effective.node_cni_dirs`), oldest first, each with the mark of its
    failed DEL wherever the node keeps it (:func:`~multusd.core.markadoption.node_marks`).

    :raises IOFailure: a cniDir or its ``results/`` cannot be listed.
    """
    marks = markadoption.node_marks(cni_dirs, spare)
    found: Dict[str, SandboxRecord] = {}
    for cni_dir in dict.fromkeys(cni_dirs):
        entries = resultcache.list_entries(cni_dir)
        for cid in container_ids(cni_dir):
            if cid not in found:
                found[cid] = _read(cni_dir, cid, entries, marks.get(cid))
    return sorted(found.values(), key=lambda r: (r.mtime, r.container_id))


def find_sandbox(cni_dirs: Sequence[str], container_id: str, *, spare: str = ""
                 ) -> Optional[SandboxRecord]:
    """The records of ``container_id`` in the first of ``cni_dirs`` that has any, with the
    mark of its failed DEL wherever the node keeps it; None when nothing is recorded."""
    for cni_dir in dict.fromkeys(cni_dirs):
        record = read_sandbox(cni_dir, container_id)
        if record is not None:
            return replace(record, failed_delete=markadoption.mark_of(cni_dirs, container_id,
                                                                      spare))
    return None


def read_sandbox(cni_dir: str, container_id: str, *, spare: str = ""
                 ) -> Optional[SandboxRecord]:
    """The records of one container ID, or None when nothing is recorded for it."""
    if not is_valid_name(container_id):
        return None
    record = _read(cni_dir, container_id, resultcache.list_entries(cni_dir, container_id),
                   delmarks.read(cni_dir, container_id, spare=spare))
    return record if record.scratch_file or record.result_files else None


def stale_sandboxes(cni_dir: str, *, spare: str = "") -> List[SandboxRecord]:
    """The sandboxes whose network namespace is gone (what ``multusd gc`` releases)."""
    return [r for r in read_sandboxes(cni_dir, spare=spare) if r.netns_state() == GONE]


def count_stale_sandboxes(cni_dir: str) -> Optional[int]:
    """How many sandboxes under ``cni_dir`` name a network namespace that no longer exists.

    For the ``multusd_stale_sandboxes`` gauge, so it reads only the result cache (which
    names the netns), not the scratch caches: the same count as :func:`stale_sandboxes` at
    a fraction of the cost. None when the records cannot be read (the sample is then left
    out rather than wrong).
    """
    try:
        netns_of: Dict[str, str] = {}
        for entry in resultcache.list_entries(cni_dir):
            if entry.get("netns"):
                netns_of.setdefault(str(entry["containerId"]), str(entry["netns"]))
    except (OSError, MultusError) as exc:
        LOG.debug("cannot count the stale sandboxes in %s: %s", cni_dir, exc)
        return None
    states: Dict[str, str] = {}
    return sum(1 for netns in netns_of.values()
               if states.setdefault(netns, netns_state(netns)) == GONE)


def redact(value: Any) -> Any:
    """``value`` (a parsed config) with the values of credential-like keys replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and isinstance(v, (str, int))
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


# --- internals -----------------------------------------------------------------------------


def _read(cni_dir: str, container_id: str, all_entries: List[dict],
          failed_delete: Optional[delmarks.FailedDelete] = None) -> SandboxRecord:
    entries = [e for e in all_entries if e.get("containerId") == container_id]
    path = scratch.cache_path(cni_dir, container_id)
    data, error = _scratch_bytes(path)
    delegates: list = []
    if data is not None:
        try:
            delegates = scratch.delegates_from_cache(data)
        except MultusError as exc:
            error = exc.msg
    master_entry = _master_entry(entries, _describe(delegates[0].conf, "")[0]
                                 if delegates else "")
    master_ifname = str(master_entry.get("ifName") or "eth0") if master_entry else "eth0"
    if delegates and master_ifname != "eth0":
        delegates = scratch.delegates_from_cache(data or b"", cni_ifname=master_ifname)
    by_key = {(str(e.get("networkName")), str(e.get("ifName"))): e for e in entries}
    marks, removed = read_marks(data) if delegates else ([], ())
    attachments = []
    for index, delegate in enumerate(delegates):
        net_name, plugins = _describe(delegate.conf, delegate.name)
        entry = by_key.pop((net_name, delegate.ifname), None)
        attachments.append(_attachment(cni_dir, delegate.name, net_name, delegate.ifname,
                                       delegate.master, plugins, delegate.conf, entry,
                                       delegate.device_id, delegate.resource_name,
                                       delegate.dra_device,
                                       marks[index] if index < len(marks) else None))
    for (net_name, ifname), entry in sorted(by_key.items(), key=lambda kv: kv[0][1]):
        # no scratch cache (or an entry it does not list): what DEL's fallback would find
        conf = resultcache.decode_config(entry)
        _, plugins = _describe(conf, net_name)
        attachments.append(_attachment(cni_dir, net_name, net_name, ifname,
                                       not delegates and entry is master_entry, plugins, conf,
                                       entry))
    netns = next((str(e["netns"]) for e in entries if e.get("netns")), "")
    with_args = [master_entry] + entries if master_entry else entries
    raw_args = next((e["cniArgs"] for e in with_args if isinstance(e.get("cniArgs"), list)), [])
    cni_args = tuple((str(pair[0]), str(pair[1])) for pair in raw_args
                     if isinstance(pair, list) and len(pair) == 2)
    has_scratch = data is not None or bool(error)
    result_files = tuple(a.cache_file for a in attachments if a.cache_file)
    times = [_mtime(p) for p in ([path] if has_scratch else []) + list(result_files)]
    return SandboxRecord(container_id=container_id, cni_dir=cni_dir,
                         scratch_file=path if has_scratch else "",
                         scratch_error=error, netns=netns, cni_args=cni_args,
                         attachments=tuple(attachments), result_files=result_files,
                         mtime=min((t for t in times if t), default=0.0),
                         failed_delete=failed_delete, removed=removed)


def _scratch_bytes(path: str) -> Tuple[Optional[bytes], str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(), ""
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot read the scratch cache {path}: {exc.strerror}"


def _master_entry(entries: List[dict], master_net: str) -> Optional[dict]:
    """The entry of the sandbox's first interface (the runtime's CNI_IFNAME, eth0 usually).

    With the scratch cache naming the master's network, only that network's entry: once the
    master is released (a partly failed DEL), another attachment's interface must not be
    taken for the runtime's (a DEL sent with it would delete that attachment's interface).
    """
    candidates = [e for e in entries if master_net and e.get("networkName") == master_net]
    if master_net and not candidates:
        return None
    candidates = candidates or entries
    if not candidates:
        return None
    return next((e for e in candidates if e.get("ifName") == "eth0"),
                min(candidates, key=lambda e: str(e.get("ifName"))))


def _describe(conf: bytes, source: str) -> Tuple[str, Tuple[str, ...]]:
    """(network name, plugin types) of a delegate config; ('', ()) when it does not parse."""
    try:
        net = NetworkConfigList.load(conf, source=source)
    except MultusError:
        return "", ()
    types: List[str] = []
    for plugin in net.plugins:
        types.append(str(plugin.get("type", "")))
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type"):
            types.append(str(ipam["type"]))
    return net.name, tuple(types)


def _attachment(cni_dir: str, network: str, net_name: str, ifname: str,
                master: bool, plugins: Tuple[str, ...], conf: bytes, entry: Optional[dict],
                device_id: str = "", resource_name: str = "",
                dra_device: Optional[DraDevice] = None,
                hotplug: Optional[HotplugMark] = None) -> Attachment:
    result = None
    cache_file = ""
    capability_args: Dict[str, Any] = {}
    if entry is not None:
        cache_file = resultcache.entry_path(cni_dir, entry)
        raw = entry.get("result")
        if isinstance(raw, dict) and raw:
            try:
                result = convert_result(raw, CURRENT_VERSION)
            except MultusError:
                result = raw
        if isinstance(entry.get("capabilityArgs"), dict):
            capability_args = dict(entry["capabilityArgs"])
    return Attachment(network=network, net_name=net_name, ifname=ifname, master=master,
                      plugins=plugins, conf=conf, device_id=device_id,
                      resource_name=resource_name, dra_device=dra_device,
                      cache_file=cache_file, result=result,
                      capability_args=capability_args, hotplug=hotplug)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
