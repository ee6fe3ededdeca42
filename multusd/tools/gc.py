"""``multusd gc [--release | --forget ID]``: list or release stale sandboxes, or drop one's records.

Releasing is a CNI DEL for each sandbox whose netns is gone, from the sandbox's own records,
exactly as the runtime would send it: through the daemon's socket when it answers (so its
per-sandbox lock holds), else by the daemon's own DEL path
(:meth:`multusd.core.sandbox.Multus.delete`) in this process. A sandbox whose network
namespace exists, or cannot be told, is never touched.

``--forget CONTAINER_ID`` is for the one sandbox whose DEL cannot succeed (a plugin binary
that is gone for good keeps the runtime's DEL failing, and the pod Terminating): every
delegate gets its DEL, in this process, and the records are dropped whatever failed; what a
failed delegate set up is reported and left as it is. It runs only when asked, by exact ID.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Dict, List, Tuple

from multusd.cni.args import format_cni_args
from multusd.cni.invoke import search_path
from multusd.core import records
from multusd.tools import common

LOG = logging.getLogger("multusd.gc")


def run(config_path: str, *, release: bool = False, as_json: bool = False) -> int:
    try:
        config = common.load_config(config_path)
        stale = [r for r in common.load_records(config) if r.netns_state() == records.GONE]
    except common.ToolError as exc:
        print(f"multusd gc: {exc}", file=sys.stderr)
        return exc.code
    outcomes: List[Dict[str, Any]] = []
    via = ""
    if release and stale:
        via = "daemon" if common.healthz(config.socket_path)[0] else "in-process"
        for record in stale:
            outcomes.append(release_one(config, record, via))
    docs = []
    for index, record in enumerate(stale):
        doc = common.record_json(record)
        doc["released"] = outcomes[index]["released"] if outcomes else False
        if outcomes and outcomes[index]["error"]:
            doc["error"] = outcomes[index]["error"]
        docs.append(doc)
    failed = [d for d in docs if release and not d["released"]]
    summary = {"dryRun": not release, "via": via, "stale": docs,
               "released": sum(1 for d in docs if d["released"]), "failed": len(failed)}
    if as_json:
        common.emit_json(summary)
    else:
        print(render(summary))
    return common.EXIT_PROBLEM if failed else common.EXIT_OK


def forget(config_path: str, container_id: str, *, as_json: bool = False) -> int:
    """``multusd gc --forget CONTAINER_ID``: DEL what can be released, drop every record."""
    from multusd.core import request
    from multusd.core.sandbox import Multus

    try:
        config = common.load_config(config_path)
        cni_dir = records.cni_dir_of(config.raw)
        record = records.read_sandbox(cni_dir, container_id)
    except common.ToolError as exc:
        print(f"multusd gc: {exc}", file=sys.stderr)
        return exc.code
    if record is None:
        print(f"multusd gc: no sandbox {container_id!r} is recorded in {cni_dir} (give the "
              "full container ID the DEL error names)", file=sys.stderr)
        return common.EXIT_NOT_FOUND
    env, conf = del_request(config, record)
    req = request.parse(env, conf, config)
    outcome = Multus(config, None).forget(req, time.monotonic() + config.request_timeout,
                                          logging.LoggerAdapter(LOG, {}))
    left = records.read_sandbox(cni_dir, container_id)
    doc = {"containerId": container_id,
           "pod": {"namespace": record.pod_namespace, "name": record.pod_name},
           "networks": [{"network": d.name, "interface": d.ifname, "released": not why,
                         **({"error": why} if why else {})} for d, why in outcome],
           "recordsLeft": left.files if left is not None else []}
    if as_json:
        common.emit_json(doc)
    else:
        for net in doc["networks"]:
            print(f"released: {net['network']} ({net['interface']})" if net["released"] else
                  f"NOT released, record dropped: {net['network']} ({net['interface']}): "
                  f"{net['error']}")
        released = sum(1 for n in doc["networks"] if n["released"])
        print(f"{container_id}: {released} of {len(outcome)} network(s) released; "
              + ("its records are gone: the runtime's next DEL succeeds" if left is None else
                 "records left: " + ", ".join(left.files)))
    return common.EXIT_OK if left is None else common.EXIT_PROBLEM


def render(summary: Dict[str, Any]) -> str:
    stale = summary["stale"]
    if not stale:
        return "no stale sandboxes: every recorded sandbox's network namespace exists"
    lines = []
    for doc in stale:
        pod = f"{doc['pod']['namespace']}/{doc['pod']['name']}" if doc["pod"]["name"] else "?"
        nets = ", ".join(f"{a['interface']}={a['network']}({','.join(a['ips']) or '-'})"
                         for a in doc["attachments"])
        verdict = ("released" if doc["released"] else
                   f"NOT released: {doc['error']}" if doc.get("error") else "stale")
        lines.append(f"{verdict}: {pod} {doc['containerId']} netns {doc['netns']} (gone); "
                     f"{nets}")
        if summary["dryRun"]:
            lines.extend(f"    {path}" for path in doc["files"])
    if summary["dryRun"]:
        lines.append(f"{len(stale)} stale sandbox(es); nothing was changed (dry run). "
                     "Release them with: multusd gc --release")
    else:
        lines.append(f"released {summary['released']} of {len(stale)} stale sandbox(es) "
                     f"({summary['via']})" + (f"; {summary['failed']} failed: they stay recorded,"
                                              " fix the cause and run it again"
                                              if summary["failed"] else ""))
    return "\n".join(lines)


def del_request(config, record: records.SandboxRecord) -> Tuple[Dict[str, str], bytes]:
    """The env and config of the DEL the runtime would send for ``record``."""
    pairs = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", record.pod_namespace),
             ("K8S_POD_NAME", record.pod_name),
             ("K8S_POD_INFRA_CONTAINER_ID", record.arg("K8S_POD_INFRA_CONTAINER_ID")
              or record.container_id),
             ("K8S_POD_UID", record.pod_uid)]
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": record.container_id,
           "CNI_NETNS": record.netns, "CNI_IFNAME": record.master_ifname,
           "CNI_ARGS": format_cni_args(pairs),
           "CNI_PATH": ":".join(search_path(str(config.raw.get("binDir") or "")))}
    return env, common.runtime_conf(config)


def release_one(config, record: records.SandboxRecord, via: str) -> Dict[str, Any]:
    """DEL one stale sandbox; ``{"released": bool, "error": str}``."""
    if records.netns_state(record.netns) != records.GONE:  # it came back: never touch it
        return {"released": False, "error": f"its netns {record.netns} exists again"}
    if not record.pod_name:
        return {"released": False, "error": "its records name no pod (no K8S_POD_NAME)"}
    env, conf = del_request(config, record)
    try:
        error = _via_daemon(config, env, conf) if via == "daemon" else _in_process(
            config, env, conf)
    except Exception as exc:  # noqa: BLE001 - one sandbox's failure must not stop the rest
        error = f"{type(exc).__name__}: {exc}"
    if error:
        return {"released": False, "error": error}
    left = records.read_sandbox(records.cni_dir_of(config.raw), record.container_id)
    if left is not None:
        return {"released": False, "error": "DEL succeeded but records remain: "
                + ", ".join(left.files)}
    return {"released": True, "error": ""}


def _via_daemon(config, env: Dict[str, str], conf: bytes) -> str:
    from multusd.wire import api

    response = api.http_request(config.socket_path, "POST", api.CNI_ENDPOINT,
                                api.encode_request(env, conf),
                                timeout=config.request_timeout + 10)
    if response.status == 200:
        return ""
    try:
        return str(json.loads(response.body).get("msg") or response.status)
    except (ValueError, AttributeError):
        return f"HTTP {response.status} from the daemon"


def _in_process(config, env: Dict[str, str], conf: bytes) -> str:
    from multusd.core import request
    from multusd.core.sandbox import Multus
    from multusd.errors import MultusError

    try:
        req = request.parse(env, conf, config)
        deadline = time.monotonic() + config.request_timeout
        Multus(config, None).delete(req, deadline, logging.LoggerAdapter(LOG, {}))
    except MultusError as exc:
        return exc.msg
    return ""
