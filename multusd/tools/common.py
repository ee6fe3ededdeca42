"""What the operator tools share: the config, the daemon's state (systemd, socket, /status), output.

Exit codes of every tool: :data:`EXIT_OK` all is well, :data:`EXIT_PROBLEM` something needs
the operator (the output says what), :data:`EXIT_USAGE` the config cannot be read or the
arguments are wrong, :data:`EXIT_NOT_FOUND` (``show``) no sandbox matches.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from multusd import MARKED_BY_SHIM, as_instant, clock_now, go_field, go_loads
from multusd.config import daemonconf, nodename
from multusd.errors import ConfigError
from multusd.wire import api

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3
SOCKET_UNIT, SERVICE_UNIT = "multusd.socket", "multusd.service"
DAEMON_TIMEOUT = 5.0


class ToolError(Exception):
    """A tool cannot do its job; ``code`` is the exit code, the message says what to do."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def load_config(path: str) -> daemonconf.DaemonConfig:
    """daemon-config.json, or :class:`ToolError` listing its problems (as check-config does)."""
    try:
        return daemonconf.load(path)
    except ConfigError as exc:
        problems = "; ".join(p.format() for p in exc.problems)
        raise ToolError(f"{path}: {problems} (run `multusd check-config --config {path}`)") \
            from None


def node_identity(config: daemonconf.DaemonConfig) -> nodename.NodeName:
    """The node name the daemon uses and where it comes from, resolved as the daemon does.

    The operator's shell lacks the service's environment, so ``MULTUS_NODE_NAME`` is also
    read from multusd.service's ``Environment=`` (a drop-in) when systemd has the unit.
    """
    environ = dict(service_environment())
    environ.update(os.environ)

    def certificate_identity() -> Optional[str]:
        from multusd.kube.clientconfig import ClientConfig

        try:
            return ClientConfig(config.kubeconfig).node_identity()
        except Exception:  # an unreadable kubeconfig is doctor's finding, not a crash here
            return None

    return nodename.resolve(config.node_name, environ,
                            certificate_identity if config.kubeconfig else None)


def service_environment() -> Dict[str, str]:
    """``Environment=`` of multusd.service as systemd holds it; {} off systemd."""
    if not os.path.isdir("/run/systemd/system") or shutil.which("systemctl") is None:
        return {}
    try:
        out = subprocess.run(["systemctl", "show", "--property=Environment", "--value",
                              SERVICE_UNIT], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return {}
    pairs = (word.partition("=") for word in shlex.split(out.stdout) if "=" in word)
    return {key: value for key, _, value in pairs}


def systemd_units() -> Optional[Dict[str, Dict[str, str]]]:
    """ActiveState, SubState, MainPID... of multusd.socket/.service; None off systemd."""
    if not os.path.isdir("/run/systemd/system") or shutil.which("systemctl") is None:
        return None
    units: Dict[str, Dict[str, str]] = {}
    for unit in (SOCKET_UNIT, SERVICE_UNIT):
        try:
            out = subprocess.run(
                ["systemctl", "show", unit, "--property=LoadState,ActiveState,SubState,"
                 "MainPID,ActiveEnterTimestamp,Result"], capture_output=True, text=True,
                timeout=DAEMON_TIMEOUT, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        units[unit] = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if all(u.get("LoadState") == "not-found" for u in units.values()):
        return None  # systemd runs, but multusd is not installed as units here (development)
    return units


def socket_facts(path: str) -> Dict[str, Any]:
    """The socket file and its directory: exists, is a socket, modes."""
    facts: Dict[str, Any] = {"path": path, "exists": False, "isSocket": False, "mode": None,
                             "dirMode": None}
    try:
        info = os.stat(path)
        facts.update(exists=True, isSocket=stat.S_ISSOCK(info.st_mode),
                     mode=f"{stat.S_IMODE(info.st_mode):04o}")
    except OSError:
        pass
    try:
        facts["dirMode"] = f"{stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode):04o}"
    except OSError:
        pass
    return facts


def daemon_state(config: daemonconf.DaemonConfig, *, activate: bool = False) -> Dict[str, Any]:
    """The daemon as far as it can be seen without changing anything.

    Under systemd an idle service is not woken (a connection to the socket would start it)
    unless ``activate``; elsewhere the socket is asked directly. ``running`` is True when
    ``GET /status`` answered; ``info`` is its answer.
    """
    units = systemd_units()
    state: Dict[str, Any] = {"running": False, "info": None, "reason": "",
                             "socket": socket_facts(config.socket_path), "systemd": units}
    if units is not None and not activate:
        service = units[SERVICE_UNIT]
        if service.get("ActiveState") != "active":
            sock = units[SOCKET_UNIT].get("ActiveState")
            state["reason"] = (f"{SERVICE_UNIT} is {service.get('ActiveState', '?')}; "
                               + ("the socket is listening: it starts on the first request"
                                  if sock == "active" else f"{SOCKET_UNIT} is {sock}"))
            return state
    if not state["socket"]["exists"]:
        state["reason"] = f"no socket at {config.socket_path}"
        return state
    try:
        response = api.http_request(config.socket_path, "GET", api.STATUS_ENDPOINT,
                                    timeout=DAEMON_TIMEOUT)
    except (OSError, ConnectionError) as exc:
        state["reason"] = f"nothing answers on {config.socket_path} ({_reason(exc)})"
        return state
    state["running"] = True
    if response.status == 200:
        try:
            state["info"] = go_loads(response.body)
        except ValueError:
            state["info"] = None
    else:  # an older multusd without /status, or upstream's daemon: it answers, that is all
        state["info"] = None
        state["reason"] = f"the daemon answers but has no {api.STATUS_ENDPOINT} ({response.status})"
    return state


def healthz(socket_path: str) -> Tuple[bool, str]:
    """(answered 200, why not) for ``GET /healthz`` on ``socket_path`` (may activate it)."""
    try:
        response = api.http_request(socket_path, "GET", api.HEALTH_ENDPOINT,
                                    timeout=DAEMON_TIMEOUT)
    except (OSError, ConnectionError) as exc:
        return False, _reason(exc)
    return response.status == 200, f"HTTP {response.status}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return f"no answer within {DAEMON_TIMEOUT:.0f}s"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


# --- output ----------------------------------------------------------------------------------


def emit_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def age(mtime: float, now: Optional[float] = None) -> str:
    """``mtime`` as an age like kubectl's: 45s, 12m, 3h, 9d."""
    if not mtime:
        return "?"
    seconds = max(0, int((now or time.time()) - mtime))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def short(container_id: str) -> str:
    return container_id[:12]


def table(rows: List[List[str]], header: List[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header] + rows]
    return "\n".join(lines)


def record_json(record: Any, *, with_conf: bool = False) -> Dict[str, Any]:
    """A :class:`~multusd.core.records.SandboxRecord` as JSON (what --json prints)."""
    from multusd.core import records

    doc: Dict[str, Any] = {
        "containerId": record.container_id, "pod": {"namespace": record.pod_namespace,
                                                    "name": record.pod_name,
                                                    "uid": record.pod_uid},
        "netns": record.netns, "netnsState": record.netns_state(),
        "recordedAt": record.mtime, "scratchFile": record.scratch_file,
        "scratchError": record.scratch_error, "files": record.files,
        "failedDelete": _failed_delete_json(record.failed_delete),
        "attachments": []}
    for attachment in record.attachments:
        item: Dict[str, Any] = {
            "network": attachment.network, "netName": attachment.net_name,
            "interface": attachment.ifname, "default": attachment.master,
            "mac": attachment.mac, "ips": attachment.ips, "gateways": attachment.gateways,
            "plugins": list(attachment.plugins), "deviceID": attachment.device_id,
            "resourceName": attachment.resource_name,
            "dra": attachment.dra_device.to_cache() if attachment.dra_device else None,
            "deviceInfoFile": attachment.device_info_file,
            "resultFile": attachment.cache_file}
        if attachment.hotplug is not None:  # added while the pod ran (enableDynamicNetworks)
            item["hotplug"] = attachment.hotplug.to_json()
        if with_conf:
            item["config"] = _redacted_conf(attachment.conf, records)
            item["result"] = attachment.result
        doc["attachments"].append(item)
    if record.removed:  # removed while the pod ran
        doc["removed"] = [removal.to_json() for removal in record.removed]
    return doc


def _failed_delete_json(mark: Any) -> Optional[Dict[str, Any]]:
    """A sandbox's failed DEL (:class:`~multusd.core.delmarks.FailedDelete`) as JSON."""
    if mark is None:
        return None
    doc = mark.to_json(clock_now())
    doc.pop("request", None)  # the runtime's DEL, kept to run it again: not for reading
    return doc


def failed_delete_line(record: Any, now: Any = None) -> str:
    """One sentence on a sandbox whose DEL failed: since when, how often, until when, what."""
    from multusd.core.delmarks import stamp

    mark = record.failed_delete
    now = as_instant(now)
    who = f"{record.pod or mark.pod or '?'} {record.container_id}"
    history = (f"its DEL has failed since {stamp(mark.first_failure)} "
               f"({mark.attempts} attempt(s)" + (", recorded by the shim: multusd did not "
                                                  "record them" if mark.by == MARKED_BY_SHIM
                                                  else "")
               + f"): {mark.what_failed()}")
    if mark.is_unreleased(now):
        return (f"{who} is UNRELEASED: {history}; DEL answers success since "
                f"{stamp(mark.until)} so that the pod could terminate; multusd "
                "retries its DEL until it is released: fix the cause, and `multusd gc` "
                f"releases it at once (`multusd gc --forget {record.container_id}` drops its "
                "records instead)")
    return (f"{who}: {history}; reported to the runtime, which retries, until "
            f"{stamp(mark.until)}")


def _redacted_conf(conf: bytes, records: Any) -> Any:
    try:
        return records.redact(go_loads(conf))
    except ValueError:
        return "<not JSON>"


def load_records(config: daemonconf.DaemonConfig) -> List[Any]:
    """Every sandbox the node records (:func:`multusd.core.records.read_node`: every cniDir
    its configuration names, the marks wherever they are kept)."""
    from multusd.core import records
    from multusd.errors import MultusError

    try:
        return records.read_node(cni_dirs(config), spare=spare_of(config))
    except MultusError as exc:
        raise ToolError(exc.msg, EXIT_PROBLEM) from None


def cni_dirs(config: daemonconf.DaemonConfig) -> Tuple[str, ...]:
    """Every cniDir the node's configuration names, its own first
    (:func:`multusd.core.effective.node_cni_dirs`): where the tools find sandboxes."""
    from multusd.core import effective

    return effective.node_cni_dirs(config)


def spare_of(config: daemonconf.DaemonConfig) -> str:
    """Where the daemon and the shim keep the marks ``<cniDir>`` cannot take (beside the
    socket): every tool reads them too."""
    from multusd.core.delmarks import spare_marks_dir

    return spare_marks_dir(config.socket_dir)


def mapping_get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def multus_conf_state(config: daemonconf.DaemonConfig) -> Dict[str, Any]:
    """Whether the runtime's config (00-multus.conf) is what generate-config would write now.

    ``state`` is ``current``, ``differs``, ``missing``, ``empty``, ``waiting`` (nothing to
    write yet: no primary network or no readiness indicator) or ``error``.
    """
    from multusd.config import multusconf
    from multusd.errors import IOFailure

    try:
        plan = multusconf.plan(config.raw, source=config.path)
    except ConfigError as exc:
        return {"path": "", "state": "error",
                "detail": "; ".join(p.format() for p in exc.problems)}
    except IOFailure as exc:
        return {"path": "", "state": "error", "detail": exc.msg}
    doc: Dict[str, Any] = {"path": plan.target, "state": "", "detail": ""}
    try:
        with open(plan.target, "rb") as handle:
            current: Optional[bytes] = handle.read()
    except FileNotFoundError:
        current = None
    except OSError as exc:
        return dict(doc, state="error", detail=f"cannot read it: {exc.strerror}")
    if current is None:
        doc["state"] = "missing" if plan.content is not None else "waiting"
        doc["detail"] = (f"waiting for {plan.waiting_for}" if plan.content is None
                         else "not written yet")
    elif not current.strip():
        doc["state"], doc["detail"] = "empty", "the file is empty"
    elif plan.content is None:
        doc["state"], doc["detail"] = "current", f"kept while waiting for {plan.waiting_for}"
    elif current == plan.content:
        doc["state"] = "current"
    else:
        doc["state"], doc["detail"] = "differs", "differs from what generate-config writes now"
    return doc


REGENERATE = ("run `systemctl start multusd-config.service` (or `multusd generate-config`) "
              "to rewrite it")


def runtime_conf(config) -> bytes:
    """What the runtime passes on stdin: its multus config as it is on disk now
    (:func:`multusd.core.effective.read_runtime_conf`), or, while there is none to read, the
    least a shim needs."""
    from multusd.core import effective

    runtime = effective.read_runtime_conf(config)
    if runtime.conf is not None:
        return runtime.data
    return json.dumps({"cniVersion": str(go_field(config.raw, "cniVersion") or "1.0.0"),
                       "name": "multus-cni-network", "type": "multus-shim"}).encode()
