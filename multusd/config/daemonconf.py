"""daemon-config.json: loading, validation (every problem at once) and the per-request overlay.

The file is upstream's (``/etc/cni/net.d/multus.d/daemon-config.json``) with every upstream
key accepted but ``chrootDir`` and an enabled ``perNodeCertificate`` (multusd runs on the host,
executes plugins directly and uses the ``kubeconfig`` it is given), plus host keys of ours:
``nodeName``, ``requestTimeout``, ``workers``, ``parallelDelegates`` (an opt-in, default false:
with true a pod's independent secondary networks are attached concurrently),
``deleteRetryWindow`` (how long a failing DEL is reported to the runtime before it is answered
success and kept as unreleased), ``enableDynamicNetworks`` (an opt-in, default false: with true
multusd itself adds and removes the interfaces of a running pod whose network-selection
annotation changes, the job of upstream's multus-dynamic-networks-controller), and for device
plugins ``kubeletRootDir`` (/var/lib/kubelet) and ``deviceInfoDir``
(/var/run/k8s.cni.cncf.io/devinfo). The whole file is also overlaid on every request's config,
as upstream does (F09).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from multusd import GoObject, go_field, go_fields, go_fold, go_loads, overlaid
from multusd.config.reader import ConfigReader
from multusd.errors import ConfigError, ConfigProblem
from multusd.store.valueclass import Record, field
from multusd.wire.delwindow import DEFAULT_WINDOW

LOG = logging.getLogger(__name__)
DEFAULT_METRICS_ADDRESS = "127.0.0.1"  # upstream: every interface

DEFAULT_CONFIG_PATH = "/etc/cni/net.d/multus.d/daemon-config.json"
LOG_LEVELS = ("debug", "verbose", "error", "panic")

SERVER_KEYS = {"chrootDir", "socketDir", "logFile", "logLevel", "logToStderr", "metricsPort",
               "metricsAddress", "enablePprof", "connectionLimit", "perNodeCertificate"}
CONFGEN_KEYS = {"multusConfigFile", "multusAutoconfigDir", "multusMasterCNI", "cniConfigDir",
                "cniVersion", "forceCNIVersion", "overrideNetworkName", "readinessindicatorfile",
                "type", "capabilities", "binDir", "cniDir", "daemonSocketDir", "logOptions",
                "namespaceIsolation", "globalNamespaces", "auxiliaryCNIChainName", "name"}
OVERLAY_KEYS = {"confDir", "clusterNetwork", "defaultNetworks", "delegates", "multusNamespace",
                "systemNamespaces", "retryDeleteOnError", "runtimeConfig", "kubeconfig"}
HOST_KEYS = {"nodeName", "requestTimeout", "workers", "kubeletRootDir", "deviceInfoDir",
             "parallelDelegates", "deleteRetryWindow", "enableDynamicNetworks"}
KNOWN_KEYS = SERVER_KEYS | CONFGEN_KEYS | OVERLAY_KEYS | HOST_KEYS
_KNOWN_KEY_ORDER = tuple(sorted(KNOWN_KEYS))
_FOLDED_KNOWN_KEYS = frozenset(go_fold(key) for key in KNOWN_KEYS)
_OBJECT_KEYS = ("capabilities", "logOptions", "perNodeCertificate", "runtimeConfig")
_POINTER_KEYS = _OBJECT_KEYS + ("defaultNetworks", "delegates", "systemNamespaces")


class DaemonConfig(Record):
    """The validated daemon configuration; ``raw`` is the file as written (the overlay)."""

    path: str
    raw: Mapping[str, Any]
    socket_dir: str = "/run/multus/"
    log_file: str = ""
    log_level: str = "verbose"
    log_to_stderr: bool = True
    log_options: Mapping[str, Any] = field(default_factory=dict)
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    kubeconfig: str = ""
    node_name: str = ""
    request_timeout: float = 110.0
    workers: int = 16
    parallel_delegates: bool = False
    delete_retry_window: float = DEFAULT_WINDOW
    enable_dynamic_networks: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, "multus.sock")


def load(path: str = DEFAULT_CONFIG_PATH) -> DaemonConfig:
    """Read and validate ``path``.

    :raises ConfigError: listing every problem found, each with what to write instead.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(path, [ConfigProblem(
            "(file)", f"cannot read it: {exc.strerror}; create it or pass --config")]) from exc
    try:
        raw = go_loads(data)
    except ValueError as exc:
        raise ConfigError(path, [ConfigProblem("(file)", f"not valid JSON: {exc}")]) from exc
    if not isinstance(raw, dict):
        raise ConfigError(path, [ConfigProblem("(file)", "must be a JSON object {...}")])
    return from_dict(raw, path)


def from_dict(raw: Mapping[str, Any], path: str = "(inline)") -> DaemonConfig:
    """Validate an already parsed configuration.

    Its keys are read as upstream's daemon reads them into its structs: ``"SocketDir"`` is a
    ``socketDir`` (Go's field matching), ``null`` leaves a setting at its default, the last of
    a key given twice wins. ``raw`` itself (the overlay) keeps every key as written.
    """
    problems = _Problems()
    warnings = [f"{key}: unknown key, ignored (check its spelling)"
                for key in sorted(set(raw)) if go_fold(key) not in _FOLDED_KNOWN_KEYS]
    conf = go_fields(raw, _KNOWN_KEY_ORDER, nils=_POINTER_KEYS, merges=_OBJECT_KEYS)
    if conf.get("chrootDir"):
        problems.add("chrootDir", "multusd runs on the host and executes plugins directly; "
                                  "remove this key (it only exists for the daemon-in-a-pod)")
    cert = conf.get("perNodeCertificate")
    if isinstance(cert, dict) and go_field(cert, "enabled"):
        problems.add("perNodeCertificate.enabled",
                     "per-node certificates are not supported; set \"kubeconfig\" to the "
                     "node's kubeconfig (e.g. /etc/kubernetes/kubelet.conf) instead")
    if conf.get("enablePprof"):
        warnings.append("enablePprof: Go profiling does not exist in multusd; ignored")
    if conf.get("retryDeleteOnError") is False:
        warnings.append("retryDeleteOnError: false is not followed: multusd keeps a sandbox's "
                        "records until every delegate's DEL succeeded (what upstream does with "
                        "true), so a failed DEL is retried instead of leaking (by the runtime "
                        "for deleteRetryWindow, then by multusd itself); drop a record knowingly "
                        "with `multusd gc --forget CONTAINER_ID`")
    if conf.get("enableDynamicNetworks") is True and not conf.get("kubeconfig"):
        warnings.append("enableDynamicNetworks: it follows the pods' network-selection "
                        "annotations through the API server, and there is no \"kubeconfig\": "
                        "ignored")
    values = {
        "socket_dir": problems.absolute_path(conf, "socketDir", "/run/multus/"),
        "log_file": problems.string(conf, "logFile", ""),
        "log_level": problems.log_level(conf),
        "log_to_stderr": problems.boolean(conf, "logToStderr", True),
        "log_options": problems.log_options(conf) or {},
        "metrics_port": problems.port(conf, "metricsPort"),
        "metrics_address": problems.string(conf, "metricsAddress", DEFAULT_METRICS_ADDRESS),
        "kubeconfig": problems.string(conf, "kubeconfig", ""),
        "node_name": problems.string(conf, "nodeName", ""),  # "" = resolved by the daemon
        "request_timeout": problems.positive(conf, "requestTimeout", 110.0, float),
        "workers": problems.positive(conf, "workers", 16, int),
        "parallel_delegates": problems.boolean(conf, "parallelDelegates", False),
        "delete_retry_window": problems.positive(conf, "deleteRetryWindow", DEFAULT_WINDOW,
                                                 float),
        "enable_dynamic_networks": problems.boolean(conf, "enableDynamicNetworks", False),
    }
    limit = conf.get("connectionLimit")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            problems.add("connectionLimit", f"must be greater than 0, got {limit!r}")
        else:
            values["workers"] = limit
    for key in ("cniVersion", "multusConfigFile", "multusAutoconfigDir", "cniConfigDir",
                "binDir", "cniDir", "confDir", "clusterNetwork", "multusNamespace"):
        problems.string(conf, key, "")
    if problems:
        raise ConfigError(path, problems)
    return DaemonConfig(path=path, raw=dict(raw), warnings=tuple(warnings), **values)


def overlay(request_conf: Mapping[str, Any], daemon: DaemonConfig) -> dict[str, Any]:
    """The request's config with the whole daemon config laid over it (upstream F09).

    Top-level daemon keys win and nested values are replaced whole. In ``auto`` mode the
    readiness indicator is dropped from both sides, as upstream does: the generated config
    exists only once the file did. As upstream's: two maps (keys exactly as written), and the
    result written out with its keys sorted and read into its NetConf struct, so a struct read
    of it (:func:`multusd.go_field`) meets its members in that order.
    """
    merged = overlaid(request_conf, daemon.raw)
    if daemon.raw.get("multusConfigFile", "auto") == "auto":
        merged = GoObject([(k, v) for k, v in merged.pairs if k != "readinessindicatorfile"])
    return merged


class _Problems(ConfigReader):
    """The shared typed reader, plus daemon-config.json's own logLevel rule."""

    def log_level(self, raw: Mapping[str, Any]) -> str:
        value = self.string(raw, "logLevel", "verbose") or "verbose"
        if value.lower() not in LOG_LEVELS:
            self.add("logLevel", f"unknown level {value!r}; use one of {', '.join(LOG_LEVELS)}")
            return "verbose"
        return value.lower()
