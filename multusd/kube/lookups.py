"""A node's pod and NAD lookups: from the watch caches, else one live GET; misses and a wrong node name.

Mixed into :class:`multusd.kube.client.KubeClient` (:class:`Lookups`), whose caches and
requests they use:

* a lookup that misses costs one live GET at once, never a blind wait, and so does every
  lookup while its cache is known stale (its watch expired and the relist has not completed);
  only when that GET answers 404 the watch gets a short while to deliver the pod
  (:data:`NOT_FOUND_WAIT`: a static pod's mirror comes after its sandbox);
* a pod that asks for a NAD gets the live GET's answer at once, or an error naming the cause
  and the fix (:func:`nad_condition`: the CRD not installed, 404; the node may not read NADs,
  403); a live GET that works again wakes the failing NAD watch, once per run of its failures;
* a live GET that finds this node's sandbox on a pod of another ``spec.nodeName`` means the
  watched node name is wrong: logged once, with both names and the fix, and kept in
  :attr:`Lookups.node_mismatch` for the metrics and the status line; an empty pod cache while
  ADDs arrive (:data:`EMPTY_CACHE_MISSES` live GETs in a row) is warned about too.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Tuple

from multusd.errors import MultusError
from multusd.kube.clientconfig import RBAC_FILE
from multusd.kube.objects import (NAD_GROUP, NAD_PATH, POD_PATH, NetworkAttachmentDefinition,
                                  Pod, nad_from_object, pod_from_object)
from multusd.kube.transport import ApiError, path_of

__all__ = ["Lookups", "nad_condition", "EMPTY_CACHE_MISSES", "NOT_FOUND_WAIT", "NAD_CRD_FILE"]

LOG = logging.getLogger("multusd.kube.client")  # the client's one log
EMPTY_CACHE_MISSES = 3  # live GETs with an empty pod cache before that is called suspicious
# After the API server said 404: how long the watch may still deliver the pod (upstream
# retries NotFound on ADD for ~2.5 s; a static pod's mirror is created after its sandbox).
NOT_FOUND_WAIT = 2.0
NAD_CRD_FILE = "/usr/share/multusd/network-attachment-definition-crd.yaml"


class Lookups:
    """The lookups of :class:`multusd.kube.client.KubeClient` (mixed in: it holds the caches,
    their state and lock, the counters and :meth:`_json`)."""

    def get_pod(self, namespace: str, name: str, *, wait: float = 0.0,
                expected_uid: str = "", not_found_wait: float = NOT_FOUND_WAIT,
                deadline: Optional[float] = None) -> Optional[Pod]:
        """The pod from the cache (unless it is known stale), else one live GET at once
        (after ``wait`` s, if given).

        Only when that GET answers 404 (a pod not created yet, a static pod whose mirror is
        on its way) the watch gets up to ``not_found_wait`` s to deliver it, then one more GET.
        Waits and requests end by ``deadline`` (``time.monotonic()``), if given.

        :param expected_uid: the runtime's K8S_POD_UID; a cached pod with another UID (a pod
            recreated under the same name) counts as a miss. The caller still checks the UID.
        :returns: the pod, or None when the API server does not have it.
        :raises TryAgainLater: the API server is unreachable or overloaded.
        :raises MultusError: the API server refused the request (401, 403, ...).
        """
        key = (namespace, name)

        def cached() -> Optional[Pod]:  # a cache known stale answers nothing
            pod = self._pods.get(key) if self._state.synced["pods"] else None
            if pod is None or (expected_uid and pod.uid != expected_uid and not pod.is_static):
                return None
            return pod

        def waitable(seconds: float) -> float:  # seconds, not a deadline
            return seconds if deadline is None else \
                max(0.0, min(seconds, deadline - time.monotonic() - 0.1))

        with self._cond:
            pod = cached()
            if pod is None and self._threads and wait > 0:
                self._cond.wait_for(lambda: cached() is not None or self._stopping.is_set(),
                                    waitable(wait))
                pod = cached()
            cache_empty = not self._pods and self._state.synced["pods"]
        if pod is not None:
            return pod
        LOG.debug("pod %s/%s not in the cache; asking the API server", namespace, name)
        pod = self._read_pod(namespace, name, deadline)
        if pod is None and self._threads and waitable(not_found_wait) > 0:
            with self._cond:
                self._cond.wait_for(lambda: cached() is not None or self._stopping.is_set(),
                                    waitable(not_found_wait))
                pod = cached()
            if pod is not None:
                return pod
            # the watch may not see it (wrong node name)
            pod = self._read_pod(namespace, name, deadline)
        if pod is not None:
            self._missed(pod, cache_empty)
        return pod

    def _read_pod(self, namespace: str, name: str, deadline: Optional[float]) -> Optional[Pod]:
        """One live GET of a pod; None on 404."""
        action = f"get pod {namespace}/{name}"
        try:
            return pod_from_object(self._json(
                "GET", path_of(POD_PATH, namespace=namespace, name=name), deadline=deadline,
                action=action))
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self.config.failure(exc, action) from exc

    def _missed(self, pod: Pod, cache_empty: bool) -> None:
        """Account for a live GET and detect a wrong node name (warned about once)."""
        with self._cond:
            self._misses += 1
            self._empty_misses = self._empty_misses + 1 if cache_empty else 0
            mismatch = bool(pod.node_name) and pod.node_name != self.node_name
            first = mismatch and self._mismatch != (self.node_name, pod.node_name)
            if mismatch:
                self._mismatch = (self.node_name, pod.node_name)
            empty = (not mismatch and self._mismatch is None and not self._warned_empty
                     and self._empty_misses >= EMPTY_CACHE_MISSES)
            if empty:
                self._warned_empty = True
        if first:
            LOG.warning(
                "node name mismatch: pod %s/%s, whose sandbox this node is setting up, is "
                "scheduled on node %r (its spec.nodeName) but multusd watches the pods of node "
                "%r (node name from %s), so every ADD pays a live GET; set \"nodeName\": %r in "
                "daemon-config.json, or Environment=MULTUS_NODE_NAME=%s in a drop-in for "
                "multusd.service, and restart multusd", pod.namespace, pod.name, pod.node_name,
                self.node_name, self.node_source, pod.node_name, pod.node_name)
        elif empty:
            LOG.warning(
                "the pod watch for node %r (node name from %s) holds no pods while ADDs arrive "
                "(%d live GETs in a row); if the kubelet registers this node under another "
                "name, set \"nodeName\" in daemon-config.json or MULTUS_NODE_NAME",
                self.node_name, self.node_source, self._empty_misses)

    @property
    def cache_misses(self) -> int:
        """Pod lookups the watch cache could not answer (each cost one live GET)."""
        with self._cond:
            return self._misses

    @property
    def node_mismatch(self) -> Optional[Tuple[str, str]]:
        """(watched name, name the pods are on) once a live GET has shown the name is wrong."""
        with self._cond:
            return self._mismatch

    def cached_pod(self, namespace: str, name: str) -> Optional[Pod]:
        """The pod as the watch cache has it now; no waiting, no request."""
        with self._cond:
            return self._pods.get((namespace, name))

    def cached_nad(self, namespace: str, name: str) -> Optional[NetworkAttachmentDefinition]:
        """The NetworkAttachmentDefinition as the watch cache has it now; no request."""
        with self._cond:
            return self._nads.get((namespace, name))

    def get_nad(self, namespace: str, name: str, *,
                deadline: Optional[float] = None) -> Optional[NetworkAttachmentDefinition]:
        """The NetworkAttachmentDefinition from the cache (unless it is known stale), else
        one live GET; None if absent.

        While the NAD watch fails the GET is still made (the CRD or permission may have just
        appeared, then the watch is woken); when it answers 404 for the resource type (the
        CRD is not installed) or 403, the error says so and names the fix.

        :raises TryAgainLater: the API server is unreachable or overloaded.
        :raises MultusError: the API server refused the request, or has no NAD API.
        """
        with self._cond:
            synced = self._state.synced["nads"]
            nad = self._nads.get((namespace, name)) if synced else None
            failing = self._state.errors["nads"] is not None
        if nad is not None:
            return nad
        action = f"get NetworkAttachmentDefinition {namespace}/{name}"
        try:
            obj = self._json("GET", path_of(NAD_PATH, namespace=namespace, name=name),
                             deadline=deadline, action=action)
        except self.config.request_errors() as exc:
            status = getattr(exc, "status", None)
            if status == 404 and not _resource_type_missing(exc):
                self._wake_nads(failing)
                return None
            if status in (403, 404):
                with self._count_lock:
                    self._nad_refusals += 1
                _, message = nad_condition(status, "")
                raise MultusError(f"cannot {action}: {message}") from exc
            raise self.config.failure(exc, action) from exc
        self._wake_nads(failing)
        return nad_from_object(obj)

    def _wake_nads(self, failing: bool) -> None:
        """The NAD API answers: a failing NAD watch lists again now, not after its backoff's
        wait; once per run of failures (the reflector keeps count,
        :meth:`multusd.kube.reflector.Reflector._pause`), so lookups cannot make a loop."""
        if failing:
            self._state.wake["nads"].set()

    @property
    def nad_refusals(self) -> int:
        """ADDs refused because the NAD API was not usable (CRD missing, forbidden)."""
        with self._count_lock:
            return self._nad_refusals


def _resource_type_missing(exc: BaseException) -> bool:
    """A 404 for the resource type itself (no such API), not for one object of it.

    kube-apiserver names the object (``details.name``) when only the object is missing.
    """
    if not isinstance(exc, ApiError):
        return False
    details = exc.status_object().get("details")
    return not (isinstance(details, dict) and details.get("name"))


def nad_condition(status: Optional[int], message: Optional[str]) -> Tuple[str, str]:
    """(condition, message with the fix) of a failing NAD API."""
    if status == 404:
        return "crd-missing", (
            "the NetworkAttachmentDefinition CRD (network-attachment-definitions."
            f"{NAD_GROUP}) is not installed in this cluster; install it once per cluster: "
            f"`kubectl apply -f {NAD_CRD_FILE}` (pods that ask for no NAD are not affected)")
    if status == 403:
        return "forbidden", (
            "this node's credentials may not read NetworkAttachmentDefinitions (403 "
            "Forbidden); grant them once per cluster: "
            f"`kubectl apply -f {RBAC_FILE}` (pods that ask for no NAD are not affected)")
    return "unavailable", message or "the NetworkAttachmentDefinition API is not answering"
