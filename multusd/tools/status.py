"""``multusd status``: the daemon, the node, the config, and one line per sandbox on disk."""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from multusd.tools import common


def run(config_path: str, *, as_json: bool = False) -> int:
    try:
        config = common.load_config(config_path)
        sandboxes = common.load_records(config)
    except common.ToolError as exc:
        print(f"multusd status: {exc}", file=sys.stderr)
        return exc.code
    daemon = common.daemon_state(config)
    multus_conf = common.multus_conf_state(config)
    problems = _problems(config, daemon, multus_conf, sandboxes)
    doc: Dict[str, Any] = {
        "daemon": _daemon_json(daemon),
        "node": _node_json(config, daemon),
        "api": _api_json(config, daemon),
        "config": {"path": config.path, "valid": True, "warnings": list(config.warnings)},
        "multusConf": multus_conf,
        "cniDirs": list(common.cni_dirs(config)),
        "sandboxes": [common.record_json(r) for r in sandboxes],
        "problems": problems,
    }
    if as_json:
        common.emit_json(doc)
    else:
        print(render(doc))
    return common.EXIT_PROBLEM if problems else common.EXIT_OK


def render(doc: Dict[str, Any]) -> str:
    lines: List[str] = []
    daemon = doc["daemon"]
    if daemon["running"] and daemon.get("version"):
        requests = daemon.get("requests") or {}
        lines.append(f"daemon:     running, multusd {daemon['version']}, pid {daemon.get('pid')}, "
                     f"up {_duration(daemon.get('uptimeSeconds') or 0)}"
                     + (", socket-activated" if daemon.get("socketActivated") else ""))
        lines.append(f"requests:   {requests.get('ok', 0)} done, {requests.get('failed', 0)} "
                     f"failed, {daemon.get('inFlight', 0)} in flight")
    elif daemon["running"]:
        lines.append(f"daemon:     answering ({daemon['reason']})")
    else:
        lines.append(f"daemon:     not running ({daemon['reason']})")
    sock = daemon["socket"]
    lines.append(f"socket:     {sock['path']}" + (
        f" (mode {sock['mode']}, directory {sock['dirMode']})" if sock["exists"] else " (absent)"))
    for unit, props in (daemon.get("systemd") or {}).items():
        lines.append(f"{unit + ':':<12}{props.get('ActiveState', '?')} "
                     f"({props.get('SubState', '?')})")
    node = doc["node"]
    lines.append(f"node:       {node['name']} (from {node['source']})")
    api = doc["api"]
    lines.append(f"API server: {api['summary']}")
    lines.append(f"config:     {doc['config']['path']}: valid"
                 + "".join(f"\n            warning: {w}" for w in doc["config"]["warnings"]))
    conf = doc["multusConf"]
    lines.append(f"runtime:    {conf['path'] or '00-multus.conf'}: {conf['state']}"
                 + (f" ({conf['detail']})" if conf["detail"] else ""))
    lines.append(f"records:    {', '.join(doc['cniDirs'])} (every cniDir the node's "
                 "configuration names)")
    sandboxes = doc["sandboxes"]
    stale = sum(1 for s in sandboxes if s["netnsState"] == "gone")
    failed = [s["failedDelete"]["state"] for s in sandboxes if s.get("failedDelete")]
    lines.append(f"sandboxes:  {len(sandboxes)}" + (f", {stale} stale (netns gone: "
                                                     "`multusd gc` lists them)" if stale else "")
                 + (f", {failed.count('unreleased')} unreleased (DEL failed past "
                    "deleteRetryWindow: `multusd gc` retries them)"
                    if "unreleased" in failed else "")
                 + (f", {failed.count('reporting')} with a failing DEL"
                    if "reporting" in failed else ""))
    if sandboxes:
        rows = [[s["pod"]["namespace"] + "/" + s["pod"]["name"] if s["pod"]["name"] else "?",
                 common.short(s["containerId"]), _interfaces(s),
                 common.age(s["recordedAt"]), _netns(s)] for s in sandboxes]
        lines.append("")
        lines.append(common.table(rows, ["POD", "CONTAINER", "INTERFACES", "AGE", "NETNS"]))
    for problem in doc["problems"]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def _interfaces(sandbox: Dict[str, Any]) -> str:
    parts = []
    for a in sandbox["attachments"]:
        parts.append(f"{a['interface']}={a['network']}"
                     + (f"({','.join(a['ips'])})" if a["ips"] else ""))
    return " ".join(parts) or "-"


def _netns(sandbox: Dict[str, Any]) -> str:
    state = {"present": "ok", "gone": "GONE (stale)", "unknown": "?"}[sandbox["netnsState"]]
    failed = sandbox.get("failedDelete")
    if failed:
        state += ", UNRELEASED" if failed["state"] == "unreleased" else ", DEL FAILING"
    return state


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d"


def _node_json(config, daemon: Dict[str, Any]) -> Dict[str, str]:
    """The running daemon's node name when it answers, else resolved as it would be."""
    info = daemon.get("info") or {}
    if info.get("nodeName") and info.get("nodeNameSource"):
        return {"name": info["nodeName"], "source": info["nodeNameSource"]}
    node = common.node_identity(config)
    return {"name": node.name, "source": node.source}


def _daemon_json(daemon: Dict[str, Any]) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"running": daemon["running"], "reason": daemon["reason"],
                           "socket": daemon["socket"], "systemd": daemon["systemd"]}
    info = daemon.get("info") or {}
    for key in ("version", "pid", "startedAt", "uptimeSeconds", "socketActivated", "requests",
                "inFlight", "ready", "stopping", "nodeName"):
        if key in info:
            doc[key] = info[key]
    return doc


def _api_json(config, daemon: Dict[str, Any]) -> Dict[str, Any]:
    if not config.kubeconfig:
        return {"kubeconfig": "", "summary": "not used (no kubeconfig in daemon-config.json)"}
    kube = common.mapping_get(daemon, "info", "kube")
    doc: Dict[str, Any] = {"kubeconfig": config.kubeconfig}
    if not isinstance(kube, dict):
        doc["summary"] = (f"kubeconfig {config.kubeconfig}; cache state unknown while the daemon "
                          "is not running (`multusd doctor` asks the API server)")
        return doc
    doc.update(kube)
    state = "pod cache synced" if kube.get("synced") else "pod cache NOT synced"
    problem = kube.get("nadProblem")
    nads = (f"NAD API {problem.get('condition')}" if isinstance(problem, dict) else
            f"{kube.get('cachedNads')} NADs")
    doc["summary"] = (f"{kube.get('server')}: {state} ({kube.get('cachedPods')} pods, {nads})"
                      + (f"; {kube['lastError']}" if kube.get("lastError") else ""))
    return doc


def _problems(config, daemon: Dict[str, Any], multus_conf: Dict[str, Any],
              sandboxes: List[Any]) -> List[str]:
    problems = []
    units = daemon.get("systemd")
    if units is not None:
        for unit, props in units.items():
            if props.get("ActiveState") == "failed":
                problems.append(f"{unit} has failed: see `journalctl -u {unit}`, then "
                                f"`systemctl restart {unit}`")
        if units[common.SOCKET_UNIT].get("ActiveState") != "active":
            problems.append(f"{common.SOCKET_UNIT} is not listening: pods cannot be attached; "
                            f"run `systemctl enable --now {common.SOCKET_UNIT}`")
    elif not daemon["running"]:
        problems.append(f"the daemon is not running ({daemon['reason']}): pods cannot be "
                        f"attached; start it (`systemctl start {common.SOCKET_UNIT}`)")
    info = daemon.get("info") or {}
    kube = info.get("kube")
    if isinstance(kube, dict) and not kube.get("synced"):
        problems.append(f"the daemon's pod cache has not synced ({kube.get('lastError')}): "
                        "ADD waits; `multusd doctor` checks the API server")
    problem = kube.get("nadProblem") if isinstance(kube, dict) else None
    if isinstance(problem, dict):
        problems.append(f"pods that ask for a NetworkAttachmentDefinition fail: "
                        f"{problem.get('message')}")
    if multus_conf["state"] not in ("current", "waiting"):
        problems.append(f"{multus_conf['path'] or '00-multus.conf'} is {multus_conf['state']}"
                        f" ({multus_conf['detail']}): {common.REGENERATE}")
    for record in sandboxes:
        if record.scratch_error:
            problems.append(f"sandbox {record.container_id}: {record.scratch_error}")
        if record.failed_delete is not None:
            problems.append(f"sandbox {common.failed_delete_line(record)}")
    return problems
