"""Pod and NetworkAttachmentDefinition views: the fields multusd reads, and a Pod's whole object.

Each view holds the fields multusd reads, taken from the API's dicts. A :class:`Pod` also keeps
the object whole as the server sent it (``source``, compact JSON, left out of ``repr`` and
comparisons): it is the body of the network-status PUT of ``pods/<name>/status``
(:mod:`multusd.kube.status`), which replaces the pod's status, so a trimmed copy would erase what
the kubelet wrote there; its resourceVersion makes the server refuse it if the pod changed since.
"""

from __future__ import annotations

import json
import types
from typing import Any, Dict, List, Mapping, Optional, Tuple

from multusd.store.valueclass import Record, field

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


class ExtendedResourceClaim(Record):
    """``status.extendedResourceClaimStatus``: the claim the scheduler made for a pod's
    extended resources, and which of its requests stands for which resource name."""

    claim: str  # resourceClaimName
    # (containerName, resourceName, requestName) of every requestMappings entry
    mappings: Tuple[Tuple[str, str, str], ...] = ()


class Pod(Record):
    """The part of a pod multusd reads (``annotations`` is a read-only mapping), and the whole
    object it came from (``source``)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    is_static: bool
    resource_version: str
    node_name: str = ""  # spec.nodeName: which node the scheduler put it on
    # DRA: (pod-local name, ResourceClaim name) of each claim the pod holds, from
    # status.resourceClaimStatuses (claims made from a template) and spec.resourceClaims
    # (claims named directly); and status.extendedResourceClaimStatus.
    resource_claims: Tuple[Tuple[str, str], ...] = ()
    extended_claim: Optional[ExtendedResourceClaim] = None
    # The whole object as the API server sent it (compact JSON): the body of a pods/status
    # PUT, which its resourceVersion makes fail with 409 if the pod changed since.
    source: str = field(default="", repr=False, compare=False)
    phase: str = ""  # status.phase: Pending, Running, Succeeded, Failed, Unknown
    deleting: bool = False  # metadata.deletionTimestamp is set: the pod is terminating


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
    """The :class:`Pod` of a pod as the API returns it (a dict), which it keeps as JSON."""
    meta = obj.get("metadata") or {}
    annotations = dict(meta.get("annotations") or {})
    return Pod(namespace=meta.get("namespace", ""), name=meta.get("name", ""),
               uid=meta.get("uid", ""), annotations=types.MappingProxyType(annotations),
               is_static=is_static_pod(annotations),
               resource_version=str(meta.get("resourceVersion", "")),
               node_name=str((obj.get("spec") or {}).get("nodeName") or ""),
               phase=str((obj.get("status") or {}).get("phase") or ""),
               deleting=bool(meta.get("deletionTimestamp")),
               resource_claims=resource_claims_of(obj), extended_claim=extended_claim_of(obj),
               source=json.dumps(obj, separators=(",", ":")))


def resource_claims_of(obj: Obj) -> Tuple[Tuple[str, str], ...]:
    """(pod-local name, ResourceClaim name) of every claim a pod dict holds, each claim once.

    ``status.resourceClaimStatuses`` names the claims generated from a
    ResourceClaimTemplate (an entry without ``resourceClaimName`` needed none);
    ``spec.resourceClaims[].resourceClaimName`` names an existing claim directly, which
    never appears in the status. Malformed entries are ignored (a watch must not fail).
    """
    found: List[Tuple[str, str]] = []
    seen = set()
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    for entries in (status.get("resourceClaimStatuses"), spec.get("resourceClaims")):
        for entry in entries if isinstance(entries, list) else ():
            claim = entry.get("resourceClaimName") if isinstance(entry, dict) else None
            if isinstance(claim, str) and claim and claim not in seen:
                seen.add(claim)
                found.append((str(entry.get("name") or ""), claim))
    return tuple(found)


def extended_claim_of(obj: Obj) -> Optional[ExtendedResourceClaim]:
    """``status.extendedResourceClaimStatus`` of a pod dict, None when it has none."""
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    extended = status.get("extendedResourceClaimStatus")
    if not isinstance(extended, dict) or not isinstance(extended.get("resourceClaimName"), str) \
            or not extended["resourceClaimName"]:
        return None
    mappings = extended.get("requestMappings")
    return ExtendedResourceClaim(
        claim=extended["resourceClaimName"],
        mappings=tuple((str(m.get("containerName") or ""), str(m.get("resourceName") or ""),
                        str(m.get("requestName") or ""))
                       for m in (mappings if isinstance(mappings, list) else ())
                       if isinstance(m, dict)))


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
