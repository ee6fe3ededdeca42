"""The Pod and NetworkAttachmentDefinition views multusd reads, trimmed from the API's dicts."""

from __future__ import annotations

import json
import types
from typing import Any, Dict, Mapping, Tuple

from multusd.store.record import Record, field

NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
NAD_GROUP = "k8s.cni.cncf.io"
NAD_VERSION = "v1"
NAD_PLURAL = "network-attachment-definitions"

# The API paths multusd sends to ({name} parts are filled by transport.path_of)
PODS_PATH = "/api/v1/pods"
POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"
EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
NADS_PATH = f"/apis/{NAD_GROUP}/{NAD_VERSION}/{NAD_PLURAL}"
NAD_PATH = f"/apis/{NAD_GROUP}/{NAD_VERSION}/namespaces/{{namespace}}/{NAD_PLURAL}/{{name}}"

Key = Tuple[str, str]
Obj = Dict[str, Any]


class Pod(Record):
    """The part of a pod multusd reads; ``annotations`` is a read-only mapping."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    is_static: bool
    resource_version: str
    node_name: str = ""  # spec.nodeName: which node the scheduler put it on
    # The whole object as the API server sent it (compact JSON): the body of a pods/status
    # PUT, which its resourceVersion makes fail with 409 if the pod changed since.
    source: str = field(default="", repr=False, compare=False)


class NetworkAttachmentDefinition(Record):
    """A NetworkAttachmentDefinition: ``config`` is spec.config ("" when the NAD has none)."""

    namespace: str
    name: str
    config: str
    annotations: Mapping[str, str]


def is_static_pod(annotations: Mapping[str, str]) -> bool:
    """True for a kubelet static pod (config source present and not "api").

    The API server holds a mirror of a static pod with a UID other than the one the runtime
    sees, so UID checks must let these pods through.
    """
    source = annotations.get(CONFIG_SOURCE_ANNOTATION)
    return source is not None and source != "api"


def pod_from_object(obj: Obj) -> Pod:
    """Trim a pod as the API returns it (a dict) to a :class:`Pod`."""
    meta = obj.get("metadata") or {}
    annotations = dict(meta.get("annotations") or {})
    return Pod(namespace=meta.get("namespace", ""), name=meta.get("name", ""),
               uid=meta.get("uid", ""), annotations=types.MappingProxyType(annotations),
               is_static=is_static_pod(annotations),
               resource_version=str(meta.get("resourceVersion", "")),
               node_name=str((obj.get("spec") or {}).get("nodeName") or ""),
               source=json.dumps(obj, separators=(",", ":")))


def nad_from_object(obj: Obj) -> NetworkAttachmentDefinition:
    """Trim a NetworkAttachmentDefinition dict to a :class:`NetworkAttachmentDefinition`."""
    meta = obj.get("metadata") or {}
    config = (obj.get("spec") or {}).get("config") or ""
    return NetworkAttachmentDefinition(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), config=str(config),
        annotations=types.MappingProxyType(dict(meta.get("annotations") or {})))


def key_of(obj: Obj) -> Key:
    """(namespace, name) of an API object dict."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")
