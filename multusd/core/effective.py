"""The effective configuration (daemon-config.json over the runtime's multus config), resolved here.

Everything multusd decides about a pod is judged by one configuration (architecture.md,
invariant 13): the runtime's multus config (what it sends on stdin: in auto mode the generated
``00-multus.conf``, which alone names ``clusterNetwork``; otherwise the operator's static file)
with the whole of daemon-config.json laid over it (upstream's overlay, F09). This module is the
one place it is computed, and the only caller of :func:`~multusd.config.daemonconf.overlay`;
every path is handed an :class:`EffectiveConfig`, a frozen value:

* :func:`for_request`: a request's (``/cni``, ``/delegate``): the runtime's config from the
  request, the daemon's over it. :mod:`multusd.core.request` resolves it once per request;
* :func:`for_node`: the node's, for the paths no runtime request carries (dynamic attachments,
  the DEL retrier, ``multusd status/show/gc/doctor``): the runtime's config as it is on disk
  now (:func:`read_runtime_conf`); :class:`NodeConfig` keeps it, re-read when that file
  changes;
* :func:`node_cni_dirs`: every ``cniDir`` this node's configuration names (daemon-config.json's,
  the runtime config's on disk, Multus's default), where requests may have recorded sandboxes.

What a sandbox was attached under is recorded with it (:mod:`multusd.core.sandboxconfig`) and
later paths judge it by that record: :func:`multusd.core.sandboxconfig.applied` lays a record
over an :class:`EffectiveConfig`.

The settings (:class:`~multusd.core.settings.MultusSettings`) are read strictly: when they do
not load, :attr:`EffectiveConfig.settings` is None and :attr:`EffectiveConfig.problems` says
why (ADD refuses; DEL never needs them). The directories and the auxiliary chain are read
leniently, whatever else the config gets wrong, so that a DEL always finds a sandbox's records.

Usage::

    node = effective.for_node(daemon)          # daemon: a loaded DaemonConfig
    node.cni_dir, node.settings, node.problems
    effective.node_cni_dirs(daemon)            # ('/var/lib/cni/multus', ...)
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, Mapping, Optional, Tuple

from multusd import DEFAULT_CNI_DIR, cni_dir_of, go_field, go_loads
from multusd.config.daemonconf import DaemonConfig, overlay
from multusd.config.multusconf import runtime_conf_paths, stat_key
from multusd.core.settings import SETTINGS_SOURCE, MultusSettings, load_settings
from multusd.errors import ConfigError, ConfigProblem, IOFailure
from multusd.node.devices import DEVINFO_DIR, KUBELET_DIR
from multusd.store import read_or_none
from multusd.store.valueclass import Record, field

LOG = logging.getLogger(__name__)

FROM_REQUEST = "the runtime's request"  # EffectiveConfig.source of a request's


class EffectiveConfig(Record):
    """The configuration a request, a sandbox or the node is judged by.

    ``merged`` is daemon-config.json over the runtime's multus config (what ``runtimeConfig``,
    ``binDir``, ``readinessindicatorfile`` are read from); the directories and the auxiliary
    chain are resolved here and read from the fields, never from ``merged``.
    """

    merged: Mapping[str, Any] = field(repr=False)
    source: str                      # the runtime's part: FROM_REQUEST, a path, or "" (none)
    cni_dir: str                     # the scratch cache, libcni's result cache, the DEL marks
    devinfo_dir: str                 # deviceInfoDir: the device-info files
    kubelet_dir: str                 # kubeletRootDir: pod-resources socket and checkpoint
    auxiliary_chain: str             # auxiliaryCNIChainName
    settings: Optional[MultusSettings] = None  # None: they do not load (see problems)
    problems: Tuple[ConfigProblem, ...] = ()   # why the settings do not load
    notes: Tuple[str, ...] = ()      # what else to know (the runtime's config not on disk ...)

    def require_settings(self) -> MultusSettings:
        """The settings, for a path that cannot do without them (ADD, STATUS, GC).

        :raises ConfigError: listing every problem of the multus network config.
        """
        if self.settings is None:
            raise ConfigError(SETTINGS_SOURCE, list(self.problems))
        return self.settings

    @property
    def why_no_settings(self) -> str:
        """Why the settings do not load, in one line ("" when they do)."""
        if self.settings is not None:
            return ""
        return "; ".join([p.format() for p in self.problems] + list(self.notes))

    def describe(self) -> Dict[str, Any]:
        """What the log line at start shows: the resolved values, no config bodies (inline
        ``delegates`` are named, never shown: they may hold credentials)."""
        out: Dict[str, Any] = {"runtimeConfig": self.source or None, "cniDir": self.cni_dir,
                               "deviceInfoDir": self.devinfo_dir,
                               "kubeletRootDir": self.kubelet_dir,
                               "auxiliaryCNIChainName": self.auxiliary_chain or None,
                               "binDir": go_field(self.merged, "binDir") or None}
        settings = self.settings
        if settings is None:
            out["settings"] = f"do not load: {self.why_no_settings}"
            return out
        out.update({"clusterNetwork": settings.cluster_network or None,
                    "defaultNetworks": list(settings.default_networks),
                    "delegates": [str(d.get("name") or d.get("type") or "?")
                                  for d in settings.delegates] or None,
                    "confDir": settings.conf_dir, "multusNamespace": settings.multus_namespace,
                    "namespaceIsolation": settings.namespace_isolation,
                    "globalNamespaces": list(settings.global_namespaces),
                    "systemNamespaces": list(settings.system_namespaces)})
        if self.notes:
            out["notes"] = list(self.notes)
        return {key: value for key, value in out.items() if value is not None}


class RuntimeConfOnDisk(Record):
    """The runtime's multus config as the node has it now: ``conf`` None when there is none
    to read (``problem`` says why); ``data`` its bytes, what a runtime sends the shim."""

    path: str
    conf: Optional[Dict[str, Any]]
    problem: str = ""
    data: bytes = field(default=b"", repr=False)


def for_request(runtime_conf: Mapping[str, Any], daemon: DaemonConfig) -> EffectiveConfig:
    """A request's configuration: ``runtime_conf`` (the runtime's, already checked) with
    daemon-config.json laid over it."""
    return _resolve(overlay(runtime_conf, daemon), FROM_REQUEST)


def for_node(daemon: DaemonConfig, runtime: Optional[RuntimeConfOnDisk] = None
             ) -> EffectiveConfig:
    """The node's configuration now: the runtime's multus config as it is on disk
    (``runtime``, else :func:`read_runtime_conf`) with daemon-config.json laid over it; the
    daemon's alone, with a note, while there is none."""
    runtime = runtime if runtime is not None else read_runtime_conf(daemon)
    notes = (runtime.problem,) if runtime.problem else ()
    return _resolve(overlay(runtime.conf or {}, daemon),
                    runtime.path if runtime.conf is not None else "", notes)


def read_runtime_conf(daemon: DaemonConfig) -> RuntimeConfOnDisk:
    """The runtime's multus config on disk: in auto mode ``<cniConfigDir>/00-multus.conf``;
    in static mode the copy in ``cniConfigDir``, or the operator's ``multusConfigFile`` while
    there is no copy. Never raises: ``problem`` says what is wrong."""
    paths = runtime_conf_paths(daemon.raw)
    for path in paths:
        try:
            data = read_or_none(path, "the runtime's multus config")
        except IOFailure as exc:
            return RuntimeConfOnDisk(path, None, exc.msg)
        if data is None:
            continue
        try:
            conf = go_loads(data)
        except ValueError as exc:
            return RuntimeConfOnDisk(path, None, f"{path} is not valid JSON: {exc}")
        if not isinstance(conf, dict):
            return RuntimeConfOnDisk(path, None, f"{path} is not a JSON object")
        return RuntimeConfOnDisk(path, conf, data=data)
    return RuntimeConfOnDisk(paths[0], None, f"{' nor '.join(paths)} does not exist (yet): "
                             "the daemon's configuration is read alone")


def node_cni_dirs(daemon: DaemonConfig, runtime: Optional[RuntimeConfOnDisk] = None
                  ) -> Tuple[str, ...]:
    """Every ``cniDir`` this node's configuration names, the node's effective one first:
    daemon-config.json's, the runtime's multus config's (each file of
    :func:`read_runtime_conf`'s, as it is on disk now), and Multus's default. Requests record
    their sandboxes (and the marks of a failed DEL) in their effective ``cniDir``, which is one
    of these."""
    runtime = runtime if runtime is not None else read_runtime_conf(daemon)
    found = [for_node(daemon, runtime).cni_dir, cni_dir_of(daemon.raw)]
    for path in runtime_conf_paths(daemon.raw):
        conf = runtime.conf if path == runtime.path else _read_object(path)
        if conf is not None and go_field(conf, "cniDir"):
            found.append(cni_dir_of(conf))
    found.append(DEFAULT_CNI_DIR)
    return tuple(dict.fromkeys(found))


class NodeConfig:
    """The node's effective configuration and every cniDir it names, kept: resolved again
    only when the runtime's multus config on disk changes (a ``stat`` of its files a look);
    each new resolution logged once.

    :param daemon: the daemon's configuration (loaded once, at start).
    """

    def __init__(self, daemon: DaemonConfig, log: logging.Logger = LOG) -> None:
        self.daemon = daemon
        self._log = log
        self._lock = threading.Lock()
        self._key: Optional[tuple] = None
        self._current: Optional[EffectiveConfig] = None
        self._cni_dirs: Tuple[str, ...] = ()

    def current(self) -> EffectiveConfig:
        """The node's configuration as it resolves now (see :func:`for_node`)."""
        return self._resolved()[0]

    def cni_dirs(self) -> Tuple[str, ...]:
        """Every cniDir the node names now (see :func:`node_cni_dirs`), its own first."""
        return self._resolved()[1]

    def _resolved(self) -> Tuple[EffectiveConfig, Tuple[str, ...]]:
        key = tuple(stat_key(path) for path in runtime_conf_paths(self.daemon.raw))
        with self._lock:
            if self._current is not None and key == self._key:
                return self._current, self._cni_dirs
            runtime = read_runtime_conf(self.daemon)
            resolved = for_node(self.daemon, runtime)
            changed = self._current is not None and resolved != self._current
            self._key, self._current = key, resolved
            self._cni_dirs = node_cni_dirs(self.daemon, runtime)
            cni_dirs = self._cni_dirs
        if changed:
            self._log.info("the runtime's multus config changed on disk; the node's "
                           "configuration is now %s", json.dumps(resolved.describe()))
        return resolved, cni_dirs


# --- internals -----------------------------------------------------------------------------


def _resolve(merged: Dict[str, Any], source: str, notes: Tuple[str, ...] = ()
             ) -> EffectiveConfig:
    try:
        settings: Optional[MultusSettings] = load_settings(merged)
        problems: Tuple[ConfigProblem, ...] = ()
    except ConfigError as exc:
        settings, problems = None, tuple(exc.problems)
    return EffectiveConfig(
        merged=merged, source=source, cni_dir=cni_dir_of(merged),
        devinfo_dir=_directory(merged, "deviceInfoDir", DEVINFO_DIR),
        kubelet_dir=_directory(merged, "kubeletRootDir", KUBELET_DIR),
        auxiliary_chain=_string(merged, "auxiliaryCNIChainName"),
        settings=settings, problems=problems, notes=notes)


def _directory(merged: Mapping[str, Any], key: str, default: str) -> str:
    return _string(merged, key) or default


def _string(merged: Mapping[str, Any], key: str) -> str:
    value = go_field(merged, key)  # as upstream's NetConf struct reads it
    return value if isinstance(value, str) else ""


def _read_object(path: str) -> Optional[Dict[str, Any]]:
    try:
        data = read_or_none(path)
        conf = go_loads(data) if data is not None else None
    except (IOFailure, ValueError):  # unreadable: it names no cniDir
        return None
    return conf if isinstance(conf, dict) else None

