"""One-shot API checks for ``multusd doctor``: reachability, the Node, pods here, access reviews.

:class:`ApiProbe` is a :class:`~multusd.kube.client.KubeClient` that is never started (no
watches): every call is one live request with the client's own timeouts, credential
handling and error translation, so doctor sees the API server exactly as the daemon would.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from multusd.kube.client import KubeClient
from multusd.kube.lookups import nad_condition
from multusd.kube.objects import NADS_PATH, POD_PATH, PODS_PATH, Pod, pod_from_object
from multusd.kube.transport import path_of

AUTHZ_GROUP = "authorization.k8s.io"
REVIEWS_PATH = f"/apis/{AUTHZ_GROUP}/v1/selfsubjectaccessreviews"
GRANTED_BY_NODE, GRANTED_BY_RBAC = "node authorizer", "rbac.yaml"

#: Every (API group, resource, verb) the daemon uses, and what grants it to a node's own
#: credentials: the Node authorizer, or /usr/share/multusd/rbac.yaml. `multusd doctor`
#: reviews exactly these.
PERMISSIONS: List[Tuple[str, str, str, str]] = [
    ("", "pods", "get", GRANTED_BY_NODE),
    ("", "pods", "list", GRANTED_BY_NODE),  # fieldSelector spec.nodeName=<this node>
    ("", "pods", "watch", GRANTED_BY_NODE),
    ("", "pods/status", "update", GRANTED_BY_NODE),
    ("", "events", "create", GRANTED_BY_NODE),
    ("k8s.cni.cncf.io", "network-attachment-definitions", "get", GRANTED_BY_RBAC),
    ("k8s.cni.cncf.io", "network-attachment-definitions", "list", GRANTED_BY_RBAC),
    ("k8s.cni.cncf.io", "network-attachment-definitions", "watch", GRANTED_BY_RBAC),
]


class ApiProbe(KubeClient):
    """Single requests to the API server of a kubeconfig (see the module docstring)."""

    def version(self) -> Tuple[str, float]:
        """(gitVersion, seconds the answer took).

        :raises MultusError: unreachable, refused credentials, or not an API server.
        """
        started = time.monotonic()
        try:
            data = self.get_json("/version")
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, "get the API server's version") from exc
        return str(data.get("gitVersion", "?")), time.monotonic() - started

    def node_exists(self) -> Optional[bool]:
        """Whether a Node named :attr:`node_name` exists; None when reading Nodes is forbidden.

        :raises MultusError: any other failure.
        """
        try:
            self.get_json(path_of("/api/v1/nodes/{name}", name=self.node_name))
        except self.config.request_errors() as exc:
            status = getattr(exc, "status", None)
            if status == 404:
                return False
            if status == 403:
                return None
            raise self.config.failure(exc, f"get node {self.node_name}") from exc
        return True

    def pods_on_node(self) -> List[Pod]:
        """The pods the API schedules on :attr:`node_name` (what the daemon's cache holds).

        :raises MultusError: the list failed.
        """
        try:
            data = self.get_json(PODS_PATH, {"fieldSelector": f"spec.nodeName={self.node_name}"})
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, f"list the pods on node {self.node_name}") from exc
        return [pod_from_object(item) for item in data.get("items") or []]

    def pod_node(self, namespace: str, name: str) -> Optional[str]:
        """The node a pod is scheduled on, '' when unscheduled, None when there is no such pod.

        :raises MultusError: the request failed.
        """
        try:
            data = self.get_json(path_of(POD_PATH, namespace=namespace, name=name))
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self.config.failure(exc, f"get pod {namespace}/{name}") from exc
        return str((data.get("spec") or {}).get("nodeName") or "")

    def pod(self, namespace: str, name: str) -> Optional[Pod]:
        """The pod (one live GET), or None when the API server has no such pod."""
        return self.get_pod(namespace, name, wait=0)

    def nad_api(self) -> Optional[Tuple[str, str]]:
        """(condition, message with the fix) when NADs cannot be listed, else None."""
        try:
            self.get_json(NADS_PATH, {"limit": 1})
        except self.config.request_errors() as exc:
            status = getattr(exc, "status", None)
            if status in (403, 404):
                return nad_condition(status, "")
            return "unavailable", self.config.failure(exc, "list NetworkAttachmentDefinitions").msg
        return None

    def can(self, verb: str, group: str, resource: str) -> Tuple[bool, str]:
        """A SelfSubjectAccessReview: may this kubeconfig's user ``verb`` ``resource``?

        ``resource`` may name a subresource (``pods/status``). Returns (allowed, reason).

        :raises MultusError: the review itself could not be made.
        """
        name, _, sub = resource.partition("/")
        attributes: Dict[str, Any] = {"verb": verb, "group": group, "resource": name}
        if sub:
            attributes["subresource"] = sub
        if resource == "pods" and verb in ("list", "watch"):
            # the daemon lists this node's pods only, as the Node authorizer requires (1.31+;
            # older API servers ignore the field and review the verb alone)
            attributes["fieldSelector"] = {"requirements": [
                {"key": "spec.nodeName", "operator": "In", "values": [self.node_name]}]}
        body = {"apiVersion": f"{AUTHZ_GROUP}/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        try:
            data = self._json("POST", REVIEWS_PATH, body=body)
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, f"review access to {verb} {resource}") from exc
        status = data.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or
                                                status.get("evaluationError") or "")
