"""``multusd gc [--dry-run | --release | --forget ID]``: retry unreleased sandboxes, list or
release stale ones, or drop one sandbox's records.

Unreleased sandboxes (:mod:`multusd.core.unreleased`: their DEL kept failing past
``deleteRetryWindow`` and was answered success, their records kept; the daemon retries them by
itself, with a backoff) get their DEL again at once on every run but ``--dry-run``: the runtime
asked for it already, so running it is never a surprise; the runtime's own request is run
again as it was sent (only the delegates still held run). Stale sandboxes (their
netns is gone, no DEL failed) are listed, and released with ``--release`` by a DEL built from
the sandbox's own records, exactly as the runtime would send it. Either goes through the
daemon's socket when it answers (so its per-sandbox lock holds), else by the daemon's own
DEL path (:meth:`multusd.core.multus.Multus.delete`) in this process. A stale sandbox whose
network namespace exists, or cannot be told, is never touched.

``--forget CONTAINER_ID`` is for the one sandbox whose DEL cannot succeed (a plugin binary
that is gone for good keeps the runtime's DEL failing, and the pod Terminating): every
delegate gets its DEL and the records are dropped whatever failed; what a failed delegate set
up is reported and left as it is. It runs only when asked, by exact ID. When the daemon
answers it runs there (``POST /forget``), in the sandbox's turn: never beside a DEL of the
same sandbox, the runtime's or the daemon's own retry. Otherwise (no daemon, or one without
``/forget``: upstream's, or an older multusd) it runs in this process, and says so.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from multusd import clock_now, go_field, go_loads
from multusd.cni.args import format_cni_args
from multusd.cni.invoke import search_path
from multusd.core import delmarks, effective, markadoption, records
from multusd.tools import common

LOG = logging.getLogger("multusd.gc")


def run(config_path: str, *, release: bool = False, dry_run: bool = False,
        as_json: bool = False) -> int:
    try:
        config = common.load_config(config_path)
        sandboxes = common.load_records(config)
    except common.ToolError as exc:
        print(f"multusd gc: {exc}", file=sys.stderr)
        return exc.code
    now = clock_now()
    left = [r for r in sandboxes if r.is_unreleased(now)]
    stale = [r for r in sandboxes if r.netns_state() == records.GONE and not r.is_unreleased(now)]
    via = ""
    if (left and not dry_run) or (release and stale):
        via = "daemon" if common.healthz(config.socket_path)[0] else "in-process"
    if not dry_run:
        for problem in markadoption.tidy(common.cni_dirs(config),
                                         common.spare_of(config)).problems:
            print(f"multusd gc: {problem}", file=sys.stderr)
    retried = [retry_one(config, r, via) for r in left] if not dry_run else []
    outcomes = [release_one(config, r, via) for r in stale] if release else []
    unreleased_docs = _docs(left, retried)
    docs = _docs(stale, outcomes)
    failed = [d for d in docs if release and not d["released"]] + \
        [d for d in unreleased_docs if not d["released"]]
    summary = {"dryRun": not release, "via": via, "stale": docs, "unreleased": unreleased_docs,
               "released": sum(1 for d in docs + unreleased_docs if d["released"]),
               "failed": len(failed)}
    if as_json:
        common.emit_json(summary)
    else:
        print(render(summary))
    return common.EXIT_PROBLEM if failed else common.EXIT_OK


def forget(config_path: str, container_id: str, *, as_json: bool = False) -> int:
    """``multusd gc --forget CONTAINER_ID``: DEL what can be released, drop every record."""
    try:
        config = common.load_config(config_path)
        cni_dirs = common.cni_dirs(config)
        record = records.find_sandbox(cni_dirs, container_id, spare=common.spare_of(config))
    except common.ToolError as exc:
        print(f"multusd gc: {exc}", file=sys.stderr)
        return exc.code
    if record is None:
        print(f"multusd gc: no sandbox {container_id!r} is recorded in {', '.join(cni_dirs)} "
              "(give the full container ID the DEL error names)", file=sys.stderr)
        return common.EXIT_NOT_FOUND
    env, conf = del_request(config, record)
    try:
        via, why, networks = _forget_via_daemon(config, env, conf)
    except ForgetFailed as exc:
        print(f"multusd gc: multusd could not forget sandbox {container_id}: {exc}; nothing "
              "was run here (it may still be running in multusd): see `multusd show "
              f"{container_id}`, and run this again", file=sys.stderr)
        return common.EXIT_PROBLEM
    if networks is None:
        networks = _forget_in_process(config, env, conf)
        # a copy of its mark in another cniDir than its records (a shim's): the daemon drops
        # it once it answered, here it is this process's to drop
        markadoption.drop_if_released(cni_dirs, container_id, common.spare_of(config))
    left = records.read_sandbox(record.cni_dir, container_id)
    doc = {"containerId": container_id,
           "pod": {"namespace": record.pod_namespace, "name": record.pod_name},
           "via": via, **({"viaReason": why} if why else {}),
           "networks": networks, "recordsLeft": left.files if left is not None else []}
    if as_json:
        common.emit_json(doc)
    else:
        print("run by multusd, in the sandbox's turn" if via == "daemon" else
              f"run in this process, outside multusd's lanes: {why}")
        for net in networks:
            print(f"released: {net['network']} ({net['interface']})" if net["released"] else
                  f"NOT released, record dropped: {net['network']} ({net['interface']}): "
                  f"{net['error']}")
        released = sum(1 for n in networks if n["released"])
        print(f"{container_id}: {released} of {len(networks)} network(s) released; "
              + ("its records are gone: the runtime's next DEL succeeds" if left is None else
                 "records left: " + ", ".join(left.files)))
    return common.EXIT_OK if left is None else common.EXIT_PROBLEM


class ForgetFailed(Exception):
    """The daemon took ``/forget`` and did not carry it out (its CNI error, or no answer)."""


def _forget_via_daemon(config, env: Dict[str, str], conf: bytes
                       ) -> Tuple[str, str, Optional[List[Dict[str, Any]]]]:
    """``(via, why not the daemon, networks)``: the daemon's answer to ``/forget``; networks
    None when it is to run in this process instead (no daemon answers, or one without
    ``/forget``).

    :raises ForgetFailed: the daemon refused it or did not answer in time (it may still run
        there: never run beside it here).
    """
    from multusd.wire import api

    answered, why = common.healthz(config.socket_path)
    if not answered:
        return "in-process", f"multusd does not answer on {config.socket_path} ({why})", None
    try:
        response = api.http_request(config.socket_path, "POST", api.FORGET_ENDPOINT,
                                    api.encode_request(env, conf),
                                    timeout=config.request_timeout + 10)
    except OSError as exc:
        raise ForgetFailed(f"no answer on {config.socket_path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if response.status in (404, 405):  # upstream's daemon, or a multusd older than /forget
        return "in-process", (f"the daemon on {config.socket_path} has no {api.FORGET_ENDPOINT} "
                              f"(upstream's, or an older multusd): HTTP {response.status}"), None
    try:
        answer = go_loads(response.body)
    except ValueError:
        answer = None
    if response.status != 200 or not isinstance(answer, dict) or \
            not isinstance(answer.get("networks"), list):
        msg = answer.get("msg") if isinstance(answer, dict) else None
        raise ForgetFailed(str(msg or f"HTTP {response.status} from the daemon"))
    return "daemon", "", answer["networks"]


def _forget_in_process(config, env: Dict[str, str], conf: bytes) -> List[Dict[str, Any]]:
    """The daemon's own ``forget`` (:meth:`multusd.core.multus.Multus.forget`), run here."""
    from multusd.core import request
    from multusd.core.multus import Multus
    from multusd.wire import api

    req = request.parse(env, conf, config)
    outcome = Multus(config, None).forget(req, time.monotonic() + config.request_timeout,
                                          logging.LoggerAdapter(LOG, {}))
    return api.forgotten_networks((d.name, d.ifname, why) for d, why in outcome)


def _docs(sandboxes: List[records.SandboxRecord],
          outcomes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    docs = []
    for index, record in enumerate(sandboxes):
        doc = common.record_json(record)
        doc["released"] = outcomes[index]["released"] if outcomes else False
        if outcomes and outcomes[index]["error"]:
            doc["error"] = outcomes[index]["error"]
        docs.append(doc)
    return docs


def render(summary: Dict[str, Any]) -> str:
    lines = []
    for doc in summary["unreleased"]:
        pod = f"{doc['pod']['namespace']}/{doc['pod']['name']}" if doc["pod"]["name"] else "?"
        failed = doc["failedDelete"]
        if doc["released"]:
            lines.append(f"released: {pod} {doc['containerId']} (unreleased since "
                         f"{_stamp(failed['until'])})")
        else:
            lines.append(f"{'NOT released' if doc.get('error') else 'unreleased'}: {pod} "
                         f"{doc['containerId']}, DEL failing since "
                         f"{_stamp(failed['firstFailure'])} ({failed['attempts']} attempt(s)): "
                         f"{doc.get('error') or _what_failed(failed)}")
    if summary["unreleased"]:
        done = sum(1 for d in summary["unreleased"] if d["released"])
        lines.append(f"released {done} of {len(summary['unreleased'])} unreleased sandbox(es)"
                     + (f" ({summary['via']})" if summary["via"] else " (dry run)")
                     + ("; the rest stay recorded: fix what failed and run `multusd gc` again "
                        "(or drop one with `multusd gc --forget CONTAINER_ID`)"
                        if done < len(summary["unreleased"]) else ""))
    stale = summary["stale"]
    if not stale:
        lines.append("no stale sandboxes: every recorded sandbox's network namespace exists")
        return "\n".join(lines)
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
        done = sum(1 for d in stale if d["released"])
        lines.append(f"released {done} of {len(stale)} stale sandbox(es) ({summary['via']})"
                     + (f"; {len(stale) - done} failed: they stay recorded, fix the cause and "
                        "run it again" if done < len(stale) else ""))
    return "\n".join(lines)


def _stamp(epoch: float) -> str:
    return delmarks.stamp(epoch)


def _what_failed(failed: Dict[str, Any]) -> str:
    if failed.get("failures"):
        return " / ".join(f"{f['interface']} ({f['network']}): {f['error']}"
                          for f in failed["failures"])
    return str(failed.get("error") or "")


def retry_one(config, record: records.SandboxRecord, via: str) -> Dict[str, Any]:
    """The DEL of one unreleased sandbox once more (the runtime's request, as it sent it);
    ``{"released": bool, "error": str}``.

    The daemon answers such a DEL with success whatever its delegates did (the window is
    over), so whether it released the sandbox is read from its records afterwards.
    """
    mark = record.failed_delete
    env = dict(mark.request_env, CNI_COMMAND="DEL") if mark is not None else {}
    conf = str((mark.request or {}).get("config") or "").encode() if mark is not None else b""
    if not env.get("CNI_CONTAINERID") or not conf:
        env, conf = del_request(config, record)  # a mark without the request: from records
    try:
        error = _via_daemon(config, env, conf) if via == "daemon" else _in_process(
            config, env, conf)
    except Exception as exc:  # noqa: BLE001 - one sandbox's failure must not stop the rest
        error = f"{type(exc).__name__}: {exc}"
    if records.read_sandbox(record.cni_dir, record.container_id) is None:
        return {"released": True, "error": ""}
    if not error:
        again = markadoption.mark_of(common.cni_dirs(config), record.container_id,
                                     common.spare_of(config))
        error = ("DEL failed again: " + again.what_failed() if again is not None else
                 "DEL succeeded but records remain")
    return {"released": False, "error": error}


def del_request(config, record: records.SandboxRecord) -> Tuple[Dict[str, str], bytes]:
    """The env and config of the DEL the runtime would send for ``record``: the runtime's
    multus config as it is on disk, ``CNI_PATH`` its ``binDir`` (daemon-config.json's over
    it). The daemon judges it by the configuration the sandbox recorded."""
    pairs = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", record.pod_namespace),
             ("K8S_POD_NAME", record.pod_name),
             ("K8S_POD_INFRA_CONTAINER_ID", record.arg("K8S_POD_INFRA_CONTAINER_ID")
              or record.container_id),
             ("K8S_POD_UID", record.pod_uid)]
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": record.container_id,
           "CNI_NETNS": record.netns, "CNI_IFNAME": record.master_ifname,
           "CNI_ARGS": format_cni_args(pairs),
           "CNI_PATH": ":".join(search_path(str(
               go_field(effective.for_node(config).merged, "binDir") or "")))}
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
    left = records.read_sandbox(record.cni_dir, record.container_id)
    if left is not None:
        return {"released": False, "error": "DEL succeeded but records remain: "
                + ", ".join(left.files)}
    return {"released": True, "error": ""}


def _via_daemon(config, env: Dict[str, str], conf: bytes) -> str:
    from multusd.wire import api

    return api.post_failure(config.socket_path, api.CNI_ENDPOINT, api.encode_request(env, conf),
                            timeout=config.request_timeout + 10)


def _in_process(config, env: Dict[str, str], conf: bytes) -> str:
    from multusd.core import request
    from multusd.core.multus import Multus
    from multusd.errors import MultusError

    try:
        req = request.parse(env, conf, config)
        deadline = time.monotonic() + config.request_timeout
        Multus(config, None).delete(req, deadline, logging.LoggerAdapter(LOG, {}))
    except MultusError as exc:
        return exc.msg
    return ""
