"""Kubernetes protobuf request bodies, decoded into the JSON form the fake API server stores.

client-go clients built with ``ContentType: application/vnd.kubernetes.protobuf`` (upstream
Multus's are) send the bodies of their writes in Kubernetes' protobuf envelope: the magic
``k8s\\x00`` and a ``runtime.Unknown`` holding the apiVersion, the kind and the object's
generated-protobuf bytes. :func:`decode` turns such a body into a dict like the JSON one, for
the kinds and fields tests/kubeapi.py reads or keeps (a Pod for ``PUT .../status``, an Event);
other fields are skipped, other kinds keep only their metadata. Answers stay JSON: the client
asks for ``application/vnd.kubernetes.protobuf,application/json`` and decodes what it gets.

Field numbers are those of k8s.io/api/core/v1 and k8s.io/apimachinery's generated.proto.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Tuple

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# A schema maps a field number to (JSON name, type); a type is "string", "int", "bool",
# "time", "map" (map<string,string>), "strings" (repeated string), or a nested schema dict;
# a name ending in "[]" is a repeated message.
Schema = Dict[int, Tuple[str, Any]]

TIME = "time"
OWNER_REFERENCE: Schema = {5: ("apiVersion", "string"), 1: ("kind", "string"),
                           3: ("name", "string"), 4: ("uid", "string"),
                           6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")}
OBJECT_META: Schema = {
    1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
    4: ("selfLink", "string"), 5: ("uid", "string"), 6: ("resourceVersion", "string"),
    7: ("generation", "int"), 8: ("creationTimestamp", TIME), 9: ("deletionTimestamp", TIME),
    10: ("deletionGracePeriodSeconds", "int"), 11: ("labels", "map"), 12: ("annotations", "map"),
    13: ("ownerReferences[]", OWNER_REFERENCE), 14: ("finalizers", "strings"),
}
POD_STATUS: Schema = {1: ("phase", "string"), 3: ("message", "string"), 4: ("reason", "string"),
                      11: ("nominatedNodeName", "string"), 5: ("hostIP", "string"),
                      6: ("podIP", "string"), 7: ("startTime", TIME), 9: ("qosClass", "string"),
                      17: ("observedGeneration", "int")}
POD: Schema = {1: ("metadata", OBJECT_META), 3: ("status", POD_STATUS)}  # spec: the stored one
OBJECT_REFERENCE: Schema = {1: ("kind", "string"), 2: ("namespace", "string"),
                            3: ("name", "string"), 4: ("uid", "string"),
                            5: ("apiVersion", "string"), 6: ("resourceVersion", "string"),
                            7: ("fieldPath", "string")}
EVENT: Schema = {
    1: ("metadata", OBJECT_META), 2: ("involvedObject", OBJECT_REFERENCE),
    3: ("reason", "string"), 4: ("message", "string"),
    5: ("source", {1: ("component", "string"), 2: ("host", "string")}),
    6: ("firstTimestamp", TIME), 7: ("lastTimestamp", TIME), 8: ("count", "int"),
    9: ("type", "string"), 10: ("eventTime", "microtime"),
    11: ("series", {1: ("count", "int"), 2: ("lastObservedTime", "microtime")}),
    12: ("action", "string"), 13: ("related", OBJECT_REFERENCE),
    14: ("reportingComponent", "string"), 15: ("reportingInstance", "string"),
}
KINDS: Dict[str, Schema] = {"Pod": POD, "Event": EVENT}


class DecodeError(ValueError):
    """Not a Kubernetes protobuf body."""


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> List[Tuple[int, int, Any]]:
    """(field number, wire type, value) of one message; length-delimited values as bytes."""
    out: List[Tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise DecodeError("truncated field")
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise DecodeError(f"wire type {wire} is not supported")
        out.append((number, wire, value))
    return out


def _time(data: bytes, micro: bool) -> Optional[str]:
    if not data:  # a zero time goes out as an empty message: JSON's null
        return None
    parts = {number: value for number, _, value in fields(data)}
    seconds, nanos = parts.get(1, 0), parts.get(2, 0)
    if seconds >= 1 << 63:
        seconds -= 1 << 64
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanos // 1000:06d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def message(data: bytes, schema: Schema) -> Dict[str, Any]:
    """One message as a JSON-shaped dict (fields absent from ``schema`` are skipped)."""
    out: Dict[str, Any] = {}
    for number, _wire, value in fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, dict):
            decoded = message(value, kind)
            if name.endswith("[]"):
                out.setdefault(name[:-2], []).append(decoded)
            else:
                out[name] = decoded
        elif kind in ("string", "int", "bool", TIME, "microtime"):
            if kind == "string":
                scalar: Any = value.decode("utf-8")
            elif kind == "int":
                scalar = value - (1 << 64) if value >= 1 << 63 else value
            elif kind == "bool":
                scalar = bool(value)
            else:
                scalar = _time(value, kind == "microtime")
            if scalar:  # Go's protobuf writes empty values, its JSON omits them
                out[name] = scalar
        elif kind == "strings":
            out.setdefault(name, []).append(value.decode("utf-8"))
        elif kind == "map":
            entry = {n: v for n, _, v in fields(value)}
            out.setdefault(name, {})[entry.get(1, b"").decode("utf-8")] = \
                entry.get(2, b"").decode("utf-8")
    return out


def decode(raw: bytes) -> Dict[str, Any]:
    """A ``k8s\\x00`` + runtime.Unknown body as the JSON object it stands for."""
    if not raw.startswith(MAGIC):
        raise DecodeError("no k8s protobuf magic")
    envelope: Dict[int, Any] = {}
    for number, _wire, value in fields(raw[len(MAGIC):]):
        envelope[number] = value
    type_meta = {n: v.decode("utf-8") for n, _, v in fields(envelope.get(1, b""))}
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    obj = message(envelope.get(2, b""), KINDS.get(kind, {1: ("metadata", OBJECT_META)}))
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj


def is_protobuf(content_type: Optional[str]) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == CONTENT_TYPE
