"""One-shot API checks for ``multusd doctor``: reachability, the Node, pods here, access reviews.

:class:`ApiProbe` is a :class:`~multusd.kube.client.KubeClient` that is never started (no
watches): every call is one live request with the client's own timeouts, credential
handling and error translation, so doctor sees the API server exactly as the daemon would.
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

from multusd.kube.client import KubeClient, Pod, pod_from_object

AUTHZ_GROUP = "authorization.k8s.io"


class ApiProbe(KubeClient):
    """Single requests to the API server of a kubeconfig (see the module docstring)."""

    @property
    def _core(self):
        """The generated CoreV1Api (doctor reads Nodes too; the daemon does not load it)."""
        from kubernetes import client

        return client.CoreV1Api(self._api_client)

    def version(self) -> Tuple[str, float]:
        """(gitVersion, seconds the answer took).

        :raises MultusError: unreachable, refused credentials, or not an API server.
        """
        from kubernetes import client

        started = time.monotonic()
        try:
            data = self._json(client.VersionApi(self._api_client).get_code)
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, "get the API server's version") from exc
        return str(data.get("gitVersion", "?")), time.monotonic() - started

    def node_exists(self) -> Optional[bool]:
        """Whether a Node named :attr:`node_name` exists; None when reading Nodes is forbidden.

        :raises MultusError: any other failure.
        """
        try:
            self._json(self._core.read_node, self.node_name)
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
            data = self._json(self._core.list_pod_for_all_namespaces,
                              field_selector=f"spec.nodeName={self.node_name}")
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, f"list the pods on node {self.node_name}") from exc
        return [pod_from_object(item) for item in data.get("items") or []]

    def pod_node(self, namespace: str, name: str) -> Optional[str]:
        """The node a pod is scheduled on, '' when unscheduled, None when there is no such pod.

        :raises MultusError: the request failed.
        """
        try:
            data = self._json(self._core.read_namespaced_pod, name, namespace)
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self.config.failure(exc, f"get pod {namespace}/{name}") from exc
        return str((data.get("spec") or {}).get("nodeName") or "")

    def pod(self, namespace: str, name: str) -> Optional[Pod]:
        """The pod (one live GET), or None when the API server has no such pod."""
        return self.get_pod(namespace, name, wait=0)

    def can(self, verb: str, group: str, resource: str) -> Tuple[bool, str]:
        """A SelfSubjectAccessReview: may this kubeconfig's user ``verb`` ``resource``?

        ``resource`` may name a subresource (``pods/status``). Returns (allowed, reason).

        :raises MultusError: the review itself could not be made.
        """
        from kubernetes import client

        name, _, sub = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": name}
        if sub:
            attributes["subresource"] = sub
        body = {"apiVersion": f"{AUTHZ_GROUP}/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        try:
            data = self._json(client.AuthorizationV1Api(self._api_client)
                              .create_self_subject_access_review, body)
        except self.config.request_errors() as exc:
            raise self.config.failure(exc, f"review access to {verb} {resource}") from exc
        status = data.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or
                                                status.get("evaluationError") or "")
