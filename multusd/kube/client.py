"""KubeClient: the daemon's narrow Kubernetes client (pod/NAD caches, lookups, status, events).

The only user of ``kubernetes`` with :mod:`multusd.kube.clientconfig`, and only inside
functions, so that ``import multusd.kube.client`` stays cheap. What it keeps off the request
path (architecture invariant 7):

* pods on this node (``fieldSelector=spec.nodeName=<node>``) and NADs in all namespaces are
  held in caches fed by list+watch reflectors (:mod:`multusd.kube.reflector`), trimmed to
  what multusd reads (:mod:`multusd.kube.objects`); a lookup that misses costs one live GET
  at once, never a blind wait;
* a live GET that finds this node's sandbox on a pod of another ``spec.nodeName`` means the
  watched node name is wrong: it is logged once, with both names and the fix, and kept in
  :attr:`KubeClient.node_mismatch` for the metrics and the status line;
* the network-status write and events: :mod:`multusd.kube.status`.

Requests go through the client's ``ApiClient`` (:mod:`multusd.kube.calls`) and REST layer
with ``_preload_content=False`` and the JSON is read as plain dicts: the generated models are slow to build and drop fields they do not know,
which a PUT of the whole pod would then erase on a newer API server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from multusd.errors import DeadlineExceeded
from multusd.kube import dra
from multusd.kube import status as status_mod
from multusd.kube.calls import ApiCalls
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import (NAD_GROUP, NAD_PLURAL, NAD_VERSION, NETWORK_STATUS_ANNOTATION,
                                  Key, NetworkAttachmentDefinition, Obj, Pod, nad_from_object,
                                  pod_from_object)
from multusd.kube.reflector import Reflector, WatchState, shutdown_response

__all__ = ["KubeClient", "Pod", "NetworkAttachmentDefinition", "NETWORK_STATUS_ANNOTATION"]

LOG = logging.getLogger(__name__)
EMPTY_CACHE_MISSES = 3  # live GETs with an empty pod cache before that is called suspicious
# After the API server said 404: how long the watch may still deliver the pod (upstream
# retries NotFound on ADD for ~2.5 s; a static pod's mirror is created after its sandbox).
NOT_FOUND_WAIT = 2.0


class KubeClient:
    """Narrow Kubernetes client of the daemon. See the module docstring.

    :param kubeconfig: path of a kubeconfig, or a :class:`ClientConfig` already loaded.
    :param node_name: this node's name; only pods scheduled here are cached.
    :param node_source: where ``node_name`` came from, for messages ("nodeName", ...).
    :param request_timeout: connect and read timeout of each request, in seconds.
    :raises InvalidNetworkConfig: the kubeconfig cannot be loaded (the message says why,
        without its contents).
    """

    def __init__(self, kubeconfig: Union[str, ClientConfig], node_name: str, *,
                 node_source: str = "", request_timeout: float = 10.0) -> None:
        self.config = kubeconfig if isinstance(kubeconfig, ClientConfig) else \
            ClientConfig(kubeconfig)
        self.kubeconfig = self.config.kubeconfig
        self.server_url = self.config.server_url
        self.node_name = node_name
        self.node_source = node_source or "the caller"
        self.request_timeout = float(request_timeout)
        from kubernetes import client  # lazy: see the module docstring

        self._api_client = client.ApiClient(self.config.configuration)
        self._calls = ApiCalls(self._api_client)
        self._count_lock = threading.Lock()
        self._request_count = 0
        self._state = WatchState()
        self._cond = self._state.cond
        self._stopping = self._state.stopping
        self._pods: Dict[Key, Pod] = {}
        self._nads: Dict[Key, NetworkAttachmentDefinition] = {}
        self._threads: List[threading.Thread] = []
        self._events = status_mod.EventSender(self._json, self._calls, self.config, node_name,
                                              self._stopping)
        self._misses = 0
        self._empty_misses = 0
        self._mismatch: Optional[Tuple[str, str]] = None
        self._warned_empty = False
        self._dra_slices = dra.SliceCache()

    # ---- requests ------------------------------------------------------------------------------

    @property
    def api_requests(self) -> int:
        """How many requests this client has sent (lists, watches, GETs, PUTs, events)."""
        with self._count_lock:
            return self._request_count

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Send one request through the client's REST layer; return the open urllib3 response."""
        with self._count_lock:
            self._request_count += 1
        kwargs.setdefault("_request_timeout", (self.request_timeout, self.request_timeout))
        return call(*args, _preload_content=False, **kwargs)

    def _json(self, call: Callable[..., Any], *args: Any, decode: bool = True,
              **kwargs: Any) -> Obj:
        """Send one request; its JSON answer (``{}`` with ``decode=False``: a write's answer is
        read off the connection, which goes back to the pool, but not parsed)."""
        response = self._raw(call, *args, **kwargs)
        try:
            data = response.data
            return json.loads(data) if decode else {}
        finally:
            response.release_conn()

    def _list_pods(self, **kwargs: Any) -> Any:
        return self._raw(self._calls.list_pod_for_all_namespaces,
                         field_selector=f"spec.nodeName={self.node_name}", **kwargs)

    def _list_nads(self, **kwargs: Any) -> Any:
        return self._raw(self._calls.list_cluster_custom_object, NAD_GROUP, NAD_VERSION,
                         NAD_PLURAL, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the list+watch threads (this node's pods, all NADs) and the event sender."""
        if self._threads:
            return
        reflectors = [
            Reflector(self._state, "pods", f"pods on node {self.node_name}", self._list_pods,
                      pod_from_object, self._pods, self.config, self.request_timeout),
            Reflector(self._state, "nads", "NetworkAttachmentDefinitions", self._list_nads,
                      nad_from_object, self._nads, self.config, self.request_timeout)]
        self._threads = [threading.Thread(target=r.run, name=f"multusd-k8s-{r.kind}", daemon=True)
                         for r in reflectors]
        for thread in self._threads:
            thread.start()
        self._events.ensure_thread()
        LOG.info("watching pods on node %s and NetworkAttachmentDefinitions at %s",
                 self.node_name, self.server_url)

    def cache_sizes(self) -> Tuple[int, int]:
        """(pods, NADs) held in the watch caches (for metrics)."""
        with self._cond:
            return len(self._pods), len(self._nads)

    def synced(self) -> bool:
        """Both caches hold a complete list and neither is known to be stale."""
        with self._cond:
            return self._state.all_synced()

    def wait_synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`synced`; returns whether it is."""
        with self._cond:
            return self._cond.wait_for(self._state.all_synced, timeout)

    @property
    def relists(self) -> int:
        """How many times a watch expired (410 Gone, history lost) and its cache was relisted."""
        with self._cond:
            return sum(self._state.relists.values())

    @property
    def last_error(self) -> Optional[str]:
        """Why a watch is failing now (for start-up diagnostics), or None while all is well."""
        with self._cond:
            problems = [f"{kind}: {msg}" for kind, msg in self._state.errors.items() if msg]
        return "; ".join(problems) or None

    def stop(self) -> None:
        """Stop the watches and the event sender (queued events get a short chance to go out)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            watches = list(self._state.open_watches.values())
        for response in watches:
            shutdown_response(response)
        for thread in self._threads:
            thread.join(timeout=self.request_timeout)
        self._events.stop(self.request_timeout)
        self._api_client.close()

    # ---- lookups -------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str, *, wait: float = 0.0,
                expected_uid: str = "", not_found_wait: float = NOT_FOUND_WAIT) -> Optional[Pod]:
        """The pod from the cache, else one live GET at once (after ``wait`` s, if given).

        Only when that GET answers 404 (a pod not created yet, a static pod whose mirror is
        on its way) the watch gets up to ``not_found_wait`` s to deliver it, then one more GET.

        :param expected_uid: the runtime's K8S_POD_UID; a cached pod with another UID (a pod
            recreated under the same name) counts as a miss. The caller still checks the UID.
        :returns: the pod, or None when the API server does not have it.
        :raises TryAgainLater: the API server is unreachable or overloaded.
        :raises MultusError: the API server refused the request (401, 403, ...).
        """
        key = (namespace, name)

        def cached() -> Optional[Pod]:
            pod = self._pods.get(key)
            if pod is None or (expected_uid and pod.uid != expected_uid and not pod.is_static):
                return None
            return pod

        with self._cond:
            pod = cached()
            if pod is None and self._threads and wait > 0:
                self._cond.wait_for(lambda: cached() is not None or self._stopping.is_set(), wait)
                pod = cached()
            cache_empty = not self._pods and self._state.synced["pods"]
        if pod is not None:
            return pod
        LOG.debug("pod %s/%s not in the cache; asking the API server", namespace, name)
        pod = self._read_pod(namespace, name)
        if pod is None and self._threads and not_found_wait > 0:
            with self._cond:
                self._cond.wait_for(lambda: cached() is not None or self._stopping.is_set(),
                                    not_found_wait)
                pod = cached()
            if pod is not None:
                return pod
            pod = self._read_pod(namespace, name)  # the watch may not see it (wrong node name)
        if pod is not None:
            self._missed(pod, cache_empty)
        return pod

    def _read_pod(self, namespace: str, name: str) -> Optional[Pod]:
        """One live GET of a pod; None on 404."""
        try:
            return pod_from_object(self._json(self._calls.read_namespaced_pod, name, namespace))
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self.config.failure(exc, f"get pod {namespace}/{name}") from exc

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

    def get_nad(self, namespace: str, name: str) -> Optional[NetworkAttachmentDefinition]:
        """The NetworkAttachmentDefinition from the cache, else one live GET; None if absent.

        :raises TryAgainLater: the API server is unreachable or overloaded.
        :raises MultusError: the API server refused the request.
        """
        with self._cond:
            nad = self._nads.get((namespace, name))
        if nad is not None:
            return nad
        try:
            obj = self._json(self._calls.get_namespaced_custom_object, NAD_GROUP, NAD_VERSION,
                             namespace, NAD_PLURAL, name)
        except self.config.request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self.config.failure(
                exc, f"get NetworkAttachmentDefinition {namespace}/{name}") from exc
        return nad_from_object(obj)

    # ---- writes --------------------------------------------------------------------------------

    def set_network_status(self, pod: Pod, status: str) -> None:
        """Write the pod's network-status annotation (see :func:`status.set_network_status`)."""
        status_mod.set_network_status(self._json, self._calls, self.config, pod, status,
                                      self._stopping)

    def emit_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        """Queue an event about ``pod`` (sent by a background thread); never raises."""
        self._events.emit(pod, event_type, reason, message)

    # ---- generic reads and DRA devices (issue 22) ----------------------------------------------
    # get_json is the one request the DRA lookups (kube/dra.py) send; re-seat it on another
    # transport and they follow. The other two methods only call it.

    def get_json(self, path: str, query: Optional[Dict[str, str]] = None, *,
                 deadline: Optional[float] = None) -> Obj:
        """One GET of ``path`` (already quoted) with ``query`` (API names); the decoded JSON.

        :param deadline: ``time.monotonic()`` by which the answer must be in: the request's
            timeout is cut to what is left of it.
        :raises DeadlineExceeded: the deadline passed before the request was sent.
        :raises: what :meth:`ClientConfig.request_errors` lists (``.status`` is the HTTP
            status), for :meth:`ClientConfig.failure` to translate.
        """
        timeout = self.request_timeout
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"the request's deadline passed before GET {path} "
                                       f"could be sent to {self.server_url}")
            timeout = min(timeout, left)
        return self._json(self._calls.get, path, dict(query or {}),
                          _request_timeout=(timeout, timeout))

    def pod_dra_devices(self, pod: Pod, *,
                        deadline: Optional[float] = None) -> List[dra.AllocatedDevice]:
        """The DRA devices of ``pod`` a NAD's resourceName can name (see :mod:`multusd.kube.dra`).

        No request for a pod without ResourceClaims; each claim is read once, ResourceSlices
        come from a cache per (node, driver). Searched on the pod's node (its spec.nodeName;
        this node's name when it has none).

        :raises MultusError: a claim is missing or unallocated, an extended-resource device
            does not match, or a request failed.
        """
        return dra.pod_devices(pod, self.get_json, self.config, self._dra_slices,
                               node=pod.node_name or self.node_name, deadline=deadline)

    @property
    def dra_slice_lists(self) -> int:
        """ResourceSlice lists sent so far (one per (node, driver), plus refreshes)."""
        return self._dra_slices.lists
