"""``multusd show POD|CONTAINER_ID``: one sandbox's records beside the API's network-status."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Tuple

from multusd import go_loads
from multusd.tools import common

NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def run(config_path: str, query: str, *, as_json: bool = False, use_api: bool = True) -> int:
    try:
        config = common.load_config(config_path)
        matches = match(common.load_records(config), query)
    except common.ToolError as exc:
        print(f"multusd show: {exc}", file=sys.stderr)
        return exc.code
    docs = []
    for record in matches:
        doc = common.record_json(record, with_conf=True)
        doc["api"] = compare_with_api(config, record) if use_api else {"state": "not asked"}
        docs.append(doc)
    if as_json:
        common.emit_json(docs[0] if len(docs) == 1 else docs)
    else:
        print("\n\n".join(render(doc) for doc in docs))
    disagree = any(d["api"]["state"] == "disagree" or d["scratchError"] for d in docs)
    return common.EXIT_PROBLEM if disagree else common.EXIT_OK


def match(sandboxes: List[Any], query: str) -> List[Any]:
    """The sandboxes ``query`` names: a container ID (or a unique prefix of one), a pod
    ``namespace/name``, or a pod name found in one namespace only.

    :raises ToolError: nothing matches (exit 3), or a prefix or name is ambiguous (exit 2).
    """
    exact = [r for r in sandboxes if r.container_id == query]
    if exact:
        return exact
    if "/" in query:
        found = [r for r in sandboxes if r.pod == query]
    else:
        found = [r for r in sandboxes if r.pod_name == query]
        if len({r.pod for r in found}) > 1:
            raise common.ToolError(f"{query!r} names pods in several namespaces: "
                                   + ", ".join(sorted({r.pod for r in found}))
                                   + "; give NAMESPACE/NAME", common.EXIT_USAGE)
    if found:
        return found
    prefixed = [r for r in sandboxes if len(query) >= 4 and r.container_id.startswith(query)]
    if len(prefixed) > 1:
        raise common.ToolError(f"container ID prefix {query!r} is ambiguous: "
                               + ", ".join(r.container_id for r in prefixed), common.EXIT_USAGE)
    if prefixed:
        return prefixed
    raise common.ToolError(f"no sandbox on this node matches {query!r} (pod namespace/name, pod "
                           "name or container ID); `multusd status` lists them",
                           common.EXIT_NOT_FOUND)


def compare_with_api(config, record) -> Dict[str, Any]:
    """The pod's network-status from the API beside the node's records.

    ``state``: ``agree``, ``disagree`` (``differences`` says how), ``no-pod`` (the API has no
    such pod), ``unavailable`` (no kubeconfig, or the API server did not answer).
    """
    if not config.kubeconfig:
        return {"state": "unavailable", "reason": "no kubeconfig in daemon-config.json"}
    if not record.pod_name:
        return {"state": "unavailable", "reason": "the records name no pod"}
    from multusd.errors import MultusError
    from multusd.kube.access import ApiProbe

    try:
        probe = ApiProbe(config.kubeconfig, common.node_identity(config).name,
                         request_timeout=5.0)
        pod = probe.pod(record.pod_namespace, record.pod_name)
    except MultusError as exc:
        return {"state": "unavailable", "reason": exc.msg}
    if pod is None:
        return {"state": "no-pod", "reason": f"the API server has no pod {record.pod}: the "
                f"sandbox outlived it (`multusd gc` releases it once its netns is gone)"}
    doc: Dict[str, Any] = {"state": "agree", "uid": pod.uid, "networkStatus": None,
                           "differences": []}
    raw = pod.annotations.get(NETWORK_STATUS)
    differences = doc["differences"]
    if record.pod_uid and pod.uid != record.pod_uid and not pod.is_static:
        differences.append(f"the API's pod {record.pod} has UID {pod.uid}, the records "
                           f"{record.pod_uid}: the pod was re-created")
    try:
        status = go_loads(raw) if raw else []
    except ValueError:
        status = None
        differences.append(f"the {NETWORK_STATUS} annotation is not valid JSON")
    if isinstance(status, list):
        doc["networkStatus"] = status
        differences.extend(_differences(status, record))
    if differences:
        doc["state"] = "disagree"
    return doc


def _differences(status: List[Any], record) -> List[str]:
    api = {_key(e.get("name"), e.get("interface")): e for e in status if isinstance(e, dict)}
    node = {_key(a.network, a.ifname): a for a in record.attachments}
    found = []
    for key in sorted(set(api) | set(node)):
        entry, attachment = api.get(key), node.get(key)
        label = f"{key[0]} ({key[1] or 'no interface'})"
        if attachment is None:
            found.append(f"{label}: in network-status but not in the node's records")
        elif entry is None:
            found.append(f"{label}: recorded on the node but not in network-status")
        else:
            api_ips = sorted(str(ip) for ip in entry.get("ips") or [])
            node_ips = sorted(ip.split("/")[0] for ip in attachment.ips)
            if api_ips != node_ips:
                found.append(f"{label}: network-status has IPs {api_ips}, the node {node_ips}")
            mac = str(entry.get("mac") or "").lower()
            if mac and attachment.mac and mac != attachment.mac.lower():
                found.append(f"{label}: network-status has MAC {mac}, the node {attachment.mac}")
    return found


def _key(name: Any, interface: Any) -> Tuple[str, str]:
    return str(name or ""), str(interface or "")


def _stamp(epoch: float) -> str:
    from multusd.core.delmarks import stamp

    return stamp(epoch)


def render(doc: Dict[str, Any]) -> str:
    pod = doc["pod"]
    lines = [f"pod:        {pod['namespace']}/{pod['name']} (uid {pod['uid'] or '?'})"
             if pod["name"] else "pod:        ? (no record names it)",
             f"container:  {doc['containerId']}",
             f"netns:      {doc['netns'] or '?'} ({doc['netnsState']})",
             f"recorded:   {common.age(doc['recordedAt'])} ago",
             "files:      " + ("\n            ".join(doc["files"]) or "-")]
    if doc["scratchError"]:
        lines.append(f"problem:    {doc['scratchError']}")
    failed = doc.get("failedDelete")
    if failed:
        what = " / ".join(f"{f['interface']} ({f['network']}): {f['error']}"
                          for f in failed["failures"]) or failed["error"]
        since = f"failing since {_stamp(failed['firstFailure'])}, {failed['attempts']} attempt(s)"
        if failed["state"] == "unreleased":
            lines.append(f"DEL:        UNRELEASED: {since}, answered success since "
                         f"{_stamp(failed['until'])} (`multusd gc` retries it): {what}")
        else:
            lines.append(f"DEL:        {since}, reported to the runtime until "
                         f"{_stamp(failed['until'])}: {what}")
    for a in doc["attachments"]:
        lines.append("")
        lines.append(f"{a['interface']}: network {a['network']}"
                     + (" (default)" if a["default"] else "")
                     + (f", NAD {a['network']}" if "/" in a["network"] else "")
                     + _hotplug_note(a.get("hotplug")))
        lines.append(f"  mac {a['mac'] or '-'}  ips {', '.join(a['ips']) or '-'}  "
                     f"gateway {', '.join(a['gateways']) or '-'}")
        lines.append(f"  plugins {', '.join(a['plugins']) or '?'}")
        if a["deviceID"] or a["deviceInfoFile"]:
            lines.append(f"  device {a['deviceID'] or '-'} ({a['resourceName'] or '-'}), "
                         f"device-info {a['deviceInfoFile'] or '-'}")
        if a.get("dra"):
            lines.append(_dra_line(a["dra"]))
        lines.append(f"  result cache {a['resultFile'] or '(none)'}")
        lines.append("  config " + _indent(json.dumps(a["config"], indent=2), "  "))
        if a.get("result") is not None:
            lines.append("  result " + _indent(json.dumps(a["result"], indent=2), "  "))
    for removal in doc.get("removed") or ():
        lines.append("")
        lines.append(f"{removal['interface']}: network {removal['name']}, REMOVED while the pod "
                     f"ran, at {_stamp(removal['at'])}")
    lines.append("")
    lines.append(_api_line(doc["api"]))
    return "\n".join(lines)


def _hotplug_note(mark: Any) -> str:
    """How an attachment made while the pod ran (``enableDynamicNetworks``) is marked."""
    if not mark:
        return ""
    if mark["state"] == "added":
        return f", ADDED while the pod ran, at {_stamp(mark['since'])}"
    return (f", being ADDED since {_stamp(mark['since'])} (unfinished: multusd finishes or "
            "undoes it)")


def _dra_line(dra: Dict[str, Any]) -> str:
    """Where a DRA-allocated device came from: its claim and request, driver, pool, device."""
    request = f" request {dra['request']}" if dra.get("request") else ""
    return (f"  DRA claim {dra['claim']}{request}: driver {dra['driver']}, pool {dra['pool']}, "
            f"device {dra['device']}")


def _api_line(api: Dict[str, Any]) -> str:
    state = api["state"]
    if state == "agree":
        return "API:        network-status agrees with the node's records"
    if state == "disagree":
        return ("API:        network-status DISAGREES with the node's records:\n"
                + "\n".join(f"  - {d}" for d in api["differences"]))
    return f"API:        {state}: {api.get('reason', '')}"


def _indent(text: str, prefix: str) -> str:
    first, _, rest = text.partition("\n")
    return first + ("\n" + "\n".join(prefix + line for line in rest.split("\n")) if rest else "")

