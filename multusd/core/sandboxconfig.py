"""What a sandbox was attached under, recorded with it in its scratch cache, in keys upstream skips.

A sandbox is judged all its life by the configuration its ADD had (architecture.md, invariant
13), not by the one the daemon has when a later path looks at it: an operator who edits
daemon-config.json between a sandbox's ADD and its DEL must not make that DEL search another
directory or run another auxiliary chain, and a running pod's dynamic attachments follow the
namespace isolation and the default networks it was attached under.

At ADD (:mod:`multusd.core.cmdadd`) its :class:`SandboxConfig` (what later paths need of the
request's :class:`~multusd.core.effective.EffectiveConfig`) is written on the first entry of
the scratch cache ``<cniDir>/<containerID>`` under :data:`CONFIG_KEY`, in upstream's key names::

    "multusdConfig": {"cniDir": "/var/lib/cni/multus", "confDir": "/etc/cni/multus/net.d",
                      "multusNamespace": "kube-system", "namespaceIsolation": true,
                      "globalNamespaces": ["default"], "systemNamespaces": ["kube-system"],
                      "auxiliaryCNIChainName": "", "deviceInfoDir": "/var/run/...",
                      "kubeletRootDir": "/var/lib/kubelet"}

and each entry says what named its delegate (``multusdNamedBy``: ``clusterNetwork``,
``defaultNetworks``, ``delegates``, ``auxiliaryCNIChainName`` or the annotation's key; written
by :mod:`multusd.core.scratch`). Why in the scratch cache rather than a file beside it: the
record then goes with the sandbox (any DEL that removes the scratch cache, upstream's
included, removes it; nothing is left to prune after a move to upstream and back), it is
written by the ADD's one atomic write before any delegate runs (no second file, no second
fsync on the ADD's path), and a delegate's ``multusdNamedBy`` moves with its entry when a
dynamic attachment drops one. Upstream's decoder skips both keys (Go matches a key to a
``DelegateNetConf`` field case-insensitively; these match none), as it skips ``draDevice``
and the dynamic attachments' marks (:mod:`multusd.core.hotplugrecord`); upstream writes the
scratch cache once, at its ADD, and never rewrites one.

Later paths lay the record over the configuration as it resolves now (:func:`applied`): DEL
and CHECK (:func:`sandbox_request`), dynamic attachments (:mod:`multusd.core.podsandbox`).
A sandbox attached by an earlier multusd or by upstream has no record: it is judged by the
configuration as it resolves now, and that is said once per sandbox (:class:`Notices`).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd.core import scratch
from multusd.core.effective import EffectiveConfig
from multusd.core.request import CmdArgs
from multusd.core.settings import MultusSettings
from multusd.errors import MultusError
from multusd.store.valueclass import Record, replace

CONFIG_KEY = "multusdConfig"
NO_RECORD = ("sandbox %s has no record of the configuration it was attached under (attached by "
             "an earlier multusd, or by upstream Multus): it is judged by the configuration as "
             "it resolves now")


class SandboxConfig(Record):
    """The configuration a sandbox was attached under, as later paths need it."""

    cni_dir: str
    conf_dir: str
    multus_namespace: str
    namespace_isolation: bool
    global_namespaces: Tuple[str, ...]
    system_namespaces: Tuple[str, ...]
    auxiliary_chain: str
    devinfo_dir: str
    kubelet_dir: str

    def to_json(self) -> Dict[str, Any]:
        return {key: list(getattr(self, attr)) if isinstance(getattr(self, attr), tuple)
                else getattr(self, attr) for key, attr, _ in _KEYS}

    @classmethod
    def from_json(cls, raw: Any) -> "SandboxConfig":
        """:raises ValueError: naming the key that is missing or of a wrong type."""
        if not isinstance(raw, dict):
            raise ValueError(f"{CONFIG_KEY} is not an object")
        values = {}
        for key, attr, kind in _KEYS:
            value = raw.get(key)
            if kind is tuple:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{CONFIG_KEY}.{key} is not a list of strings")
                value = tuple(value)
            elif not isinstance(value, kind):
                raise ValueError(f"{CONFIG_KEY}.{key} is missing or not a {kind.__name__}")
            values[attr] = value
        return cls(**values)


# (JSON key, field, JSON type) in the order written
_KEYS = (("cniDir", "cni_dir", str), ("confDir", "conf_dir", str),
         ("multusNamespace", "multus_namespace", str),
         ("namespaceIsolation", "namespace_isolation", bool),
         ("globalNamespaces", "global_namespaces", tuple),
         ("systemNamespaces", "system_namespaces", tuple),
         ("auxiliaryCNIChainName", "auxiliary_chain", str),
         ("deviceInfoDir", "devinfo_dir", str), ("kubeletRootDir", "kubelet_dir", str))


def of(config: EffectiveConfig) -> SandboxConfig:
    """What an ADD under ``config`` records (its settings loaded: an ADD has them)."""
    settings = config.require_settings()
    return SandboxConfig(
        cni_dir=config.cni_dir, conf_dir=settings.conf_dir,
        multus_namespace=settings.multus_namespace,
        namespace_isolation=settings.namespace_isolation,
        global_namespaces=settings.global_namespaces,
        system_namespaces=settings.system_namespaces,
        auxiliary_chain=config.auxiliary_chain, devinfo_dir=config.devinfo_dir,
        kubelet_dir=config.kubelet_dir)


def put(entries: List[Dict[str, Any]], config: SandboxConfig) -> None:
    """Record ``config`` in a scratch cache's entries (on the first, the cluster network's,
    which is never removed)."""
    entries[0][CONFIG_KEY] = config.to_json()


def read(entries: Sequence[Mapping[str, Any]]) -> Tuple[Optional[SandboxConfig], str]:
    """``(the record, "")``; ``(None, "")`` when there is none (an earlier multusd's sandbox,
    upstream's); ``(None, why)`` when it does not parse."""
    raw = entries[0].get(CONFIG_KEY) if entries else None
    if raw is None:
        return None, ""
    try:
        return SandboxConfig.from_json(raw), ""
    except ValueError as exc:
        return None, str(exc)


def applied(config: EffectiveConfig, record: SandboxConfig) -> EffectiveConfig:
    """The sandbox's configuration: ``config`` (as it resolves now) with what its record
    holds laid over it. Its settings are the record's namespaces and confDir over the current
    ones (or the defaults, when those do not load: a recorded sandbox needs no more)."""
    settings = replace(
        config.settings or MultusSettings(), conf_dir=record.conf_dir,
        multus_namespace=record.multus_namespace,
        namespace_isolation=record.namespace_isolation,
        global_namespaces=record.global_namespaces, system_namespaces=record.system_namespaces,
        auxiliary_chain=record.auxiliary_chain)
    return replace(config, cni_dir=record.cni_dir, devinfo_dir=record.devinfo_dir,
                   kubelet_dir=record.kubelet_dir, auxiliary_chain=record.auxiliary_chain,
                   settings=settings, problems=())


class Notices:
    """What was already said about a sandbox, so that it is said once, not per look (the
    oldest forgotten past ``limit``: nothing grows with uptime)."""

    def __init__(self, limit: int = 4096) -> None:
        self._said: "collections.OrderedDict[Tuple[str, str], None]" = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, container_id: str, what: str) -> bool:
        """True the first time ``what`` is said of ``container_id``."""
        key = (container_id, what)
        with self._lock:
            if key in self._said:
                return False
            self._said[key] = None
            while len(self._said) > self._limit:
                self._said.popitem(last=False)
            return True


def sandbox_request(req: CmdArgs, log: Any, *, notices: Optional[Notices] = None,
                    other_dirs: Callable[[], Sequence[str]] = tuple) -> CmdArgs:
    """``req`` (a DEL, CHECK or ``gc --forget`` of a sandbox) with the configuration the
    sandbox was attached under: its scratch cache in the request's ``cniDir`` or, when not
    there, in one of ``other_dirs()`` (every ``cniDir`` the node's configuration names:
    :meth:`multusd.core.effective.NodeConfig.cni_dirs`), its record laid over the request's.

    Unchanged when nothing is recorded anywhere (DEL then falls back as it does), or the
    scratch cache cannot be read (DEL reports that); a sandbox without a record keeps the
    request's configuration, said once (``notices``).
    """
    where = req.effective.cni_dir
    exists, found = _scratch_of(where, req.container_id)
    if not exists:
        for directory in other_dirs():
            if directory != where:
                exists, found = _scratch_of(directory, req.container_id)
                if exists:
                    where = directory
                    log.info("the sandbox's records are in %s, not in the request's cniDir %s",
                             directory, req.effective.cni_dir)
                    break
    if found is None:
        return replace(req, effective=replace(req.effective, cni_dir=where))
    record, problem = read(found)
    if record is None:
        what = f"its record does not parse ({problem})" if problem else ""
        if notices is None or notices.first(req.container_id, what or "none"):
            if what:
                log.warning("sandbox %s: %s: it is judged by the configuration as it resolves "
                            "now", req.container_id, what)
            else:
                log.info(NO_RECORD, req.container_id)
        return replace(req, effective=replace(req.effective, cni_dir=where))
    return replace(req, effective=applied(req.effective, replace(record, cni_dir=where)))


def _scratch_of(cni_dir: str, container_id: str
                ) -> Tuple[bool, Optional[List[Dict[str, Any]]]]:
    """(whether the sandbox has a scratch cache in ``cni_dir``, its entries: None when there
    is none, or it cannot be read or parsed: DEL says so when it reads it)."""
    path = scratch.cache_path(cni_dir, container_id)
    try:
        data = scratch.read_cache(path)
        return data is not None, scratch.cache_entries(data) if data is not None else None
    except MultusError:
        return True, None
