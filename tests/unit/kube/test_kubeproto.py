"""The fake API server takes client-go's protobuf bodies (tests/kubeproto.py)."""

from __future__ import annotations

import json
import urllib.request

import kubeproto


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, value) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version) + _field(2, kind)
    return kubeproto.MAGIC + _field(1, type_meta) + _field(2, raw) + _field(4, "")


def _pod_status_body(pod: dict, annotations: dict) -> bytes:
    meta = pod["metadata"]
    encoded = (_field(1, meta["name"]) + _field(3, meta["namespace"]) + _field(5, meta["uid"])
               + _field(6, meta["resourceVersion"]) + _field(7, 0)
               + b"".join(_field(12, _field(1, k) + _field(2, v)) for k, v in annotations.items())
               + _field(14, "f1"))
    status = _field(1, "Running") + _field(3, "") + _field(9, "BestEffort")
    return _envelope("v1", "Pod", _field(1, encoded) + _field(2, b"") + _field(3, status))


def test_decode_pod_skips_empty_values_and_unknown_fields():
    pod = {"metadata": {"name": "web", "namespace": "default", "uid": "u1",
                        "resourceVersion": "7"}}
    obj = kubeproto.decode(_pod_status_body(pod, {"a": "1"}))
    assert obj == {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                                "resourceVersion": "7", "annotations": {"a": "1"},
                                "finalizers": ["f1"]},
                   "status": {"phase": "Running", "qosClass": "BestEffort"}}


def test_decode_event_with_times():
    meta = _field(1, "web.1") + _field(3, "default")
    ref = _field(1, "Pod") + _field(2, "default") + _field(3, "web")
    raw = (_field(1, meta) + _field(2, ref) + _field(3, "AddedInterface") + _field(8, 1)
           + _field(6, _field(1, 1764586800)) + _field(10, b""))
    obj = kubeproto.decode(_envelope("v1", "Event", raw))
    assert obj["involvedObject"] == {"kind": "Pod", "namespace": "default", "name": "web"}
    assert obj["firstTimestamp"] == "2025-12-01T11:00:00Z" and obj["count"] == 1
    assert "eventTime" not in obj  # a zero time: an empty message, null in JSON


def test_not_protobuf():
    assert not kubeproto.is_protobuf("application/json")
    assert kubeproto.is_protobuf("application/vnd.kubernetes.protobuf; charset=x")


def test_fake_api_takes_a_protobuf_status_update(kube_api):
    pod = kube_api.add_pod("default", "web")
    body = _pod_status_body(pod, {"k8s.v1.cni.cncf.io/network-status": "[]"})
    request = urllib.request.Request(
        f"{kube_api.url}/api/v1/namespaces/default/pods/web/status", data=body, method="PUT",
        headers={"Authorization": f"Bearer {kube_api.token}",
                 "Content-Type": kubeproto.CONTENT_TYPE,
                 "Accept": "application/vnd.kubernetes.protobuf,application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"
        answered = json.load(response)
    stored = kube_api.pod("default", "web")
    assert stored["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"] == "[]"
    assert stored["spec"] == pod["spec"] and stored["status"]["phase"] == "Running"
    assert answered["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
