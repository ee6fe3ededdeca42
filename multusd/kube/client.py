"""KubeClient: the daemon's narrow Kubernetes client (pod/NAD caches, lookups, status, events).

The only user of the API server, through :mod:`multusd.kube.transport` (http.client) and
:mod:`multusd.kube.clientconfig`. What it keeps off the request path (architecture
invariant 7), and what it asks of the API server (invariant 9):

* pods on this node (``fieldSelector=spec.nodeName=<node>``) and NADs in all namespaces are
  held in caches fed by list+watch reflectors (:mod:`multusd.kube.reflector`: lists served
  from the API server's watch cache, watches that live until the server ends them; their
  rounds and the one backoff: :mod:`multusd.kube.rounds`), trimmed to what multusd reads
  (:mod:`multusd.kube.objects`);
* lookups: the caches, else one live GET at once (:mod:`multusd.kube.lookups`: misses, the
  not-found wait, a wrong node name, the NAD API's failures and their fixes);
* readiness needs the pod cache's first list only (:meth:`KubeClient.ready`): a NAD API that
  fails (the CRD not installed: 404; the node's credentials may not read NADs: 403; 5xx)
  never delays a pod that asks for no NAD (:meth:`KubeClient.nad_problem`); a live GET that
  works again wakes the NAD watch, so it does not wait out its backoff (once per run of
  failures: however many lookups work, a failing NAD list is not asked again sooner than the
  one backoff says, but for that one wake-up);
* every lookup and write is bounded by the CNI request's deadline, whole: a server that
  trickles its answer is cut at it (:mod:`multusd.kube.transport`), and the cache keeps
  serving other requests meanwhile;
* the network-status write and events: :mod:`multusd.kube.status`;
* whoever registered with :meth:`KubeClient.add_pod_listener` is handed every pod the watch
  delivers (dynamic attachments follow annotation changes that way).

The JSON is read as plain dicts: a PUT of the whole pod must not drop fields a newer API
server has and an older model lacks.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from multusd.errors import DeadlineExceeded
from multusd.kube import draclaims
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.deadlines import within
from multusd.kube.lookups import Lookups, nad_condition
from multusd.kube.objects import (NADS_PATH, NETWORK_STATUS_ANNOTATION, PODS_PATH, Key,
                                  NetworkAttachmentDefinition, Obj, Pod, nad_from_object,
                                  pod_from_object)
from multusd.kube.reflector import Reflector
from multusd.kube.status import EventSender, set_network_status
from multusd.kube.transport import Query
from multusd.kube.watchstream import WatchState, shutdown_response

__all__ = ["KubeClient", "Pod", "NetworkAttachmentDefinition", "NETWORK_STATUS_ANNOTATION"]

LOG = logging.getLogger(__name__)
# the resource label of each cache in the metrics
RESOURCES = {"pods": "pods", "nads": "network-attachment-definitions"}


class KubeClient(Lookups):
    """Narrow Kubernetes client of the daemon. See the module docstring.

    :param kubeconfig: path of a kubeconfig, or a :class:`ClientConfig` already loaded.
    :param node_name: this node's name; only pods scheduled here are cached.
    :param node_source: where ``node_name`` came from, for messages ("nodeName", ...).
    :param request_timeout: seconds each request may take at most, whole (a CNI request's
        deadline shortens it); the time to the head of a watch (of a list: at least 30 s).
    :param watch_idle: seconds a watch may stay silent before it is resumed anew (default:
        past the server's own end of it, see :mod:`multusd.kube.reflector`).
    :raises InvalidNetworkConfig: the kubeconfig cannot be loaded (the message says why,
        without its contents).
    """

    def __init__(self, kubeconfig: Union[str, ClientConfig], node_name: str, *,
                 node_source: str = "", request_timeout: float = 10.0,
                 watch_idle: Optional[float] = None) -> None:
        self.config = kubeconfig if isinstance(kubeconfig, ClientConfig) else \
            ClientConfig(kubeconfig)
        self.kubeconfig = self.config.kubeconfig
        self.server_url = self.config.server_url
        self.node_name = node_name
        self.node_source = node_source or "the caller"
        self.request_timeout = float(request_timeout)
        self.watch_idle = None if watch_idle is None else float(watch_idle)
        self._transport = self.config.transport
        self._count_lock = threading.Lock()
        self._request_count = 0
        self._nad_refusals = 0
        self._state = WatchState()
        self._cond = self._state.cond
        self._stopping = self._state.stopping
        self._pods: Dict[Key, Pod] = {}
        self._nads: Dict[Key, NetworkAttachmentDefinition] = {}
        self._threads: List[threading.Thread] = []
        self._events = EventSender(self._json, self.config, node_name, self._stopping)
        self._misses = 0
        self._empty_misses = 0
        self._mismatch: Optional[Tuple[str, str]] = None
        self._warned_empty = False
        self._dra_slices = draclaims.SliceCache()
        self._pod_listeners: List[Callable[[Pod], None]] = []

    # ---- requests ------------------------------------------------------------------------------

    @property
    def api_requests(self) -> int:
        """How many requests this client has sent (lists, watches, GETs, PUTs, events)."""
        with self._count_lock:
            return self._request_count

    @property
    def api_retries(self) -> Dict[str, int]:
        """Requests sent again after a transient failure, by cause (:mod:`multusd.kube.retries`)."""
        return self._transport.retries.snapshot()

    def _deadline(self, deadline: Optional[float], action: str) -> float:
        """When the next request must be over: the client's timeout from now, or the
        caller's deadline if that comes first (``time.monotonic()`` instants)."""
        if deadline is None:
            return time.monotonic() + self.request_timeout
        if deadline <= time.monotonic():
            raise DeadlineExceeded(f"cannot {action}: the request's deadline passed before the "
                                   f"Kubernetes API server at {self.server_url} was asked")
        return within(self.request_timeout, deadline)

    def _raw(self, method: str, path: str, *, query: Query = None, body: Any = None,
             deadline: Optional[float] = None, timeout: Optional[float] = None,
             read_timeout: Optional[float] = None, stream: bool = False) -> Any:
        """Send one request, over by ``deadline`` (or ``timeout`` seconds from now); return
        the open response (body read unless ``stream``; a streamed one is bounded by the
        deadline up to its head)."""
        with self._count_lock:
            self._request_count += 1
        return self._transport.request(method, path, query=query, body=body, deadline=deadline,
                                       timeout=timeout, read_timeout=read_timeout,
                                       stream=stream)

    def _json(self, method: str, path: str, *, query: Query = None, body: Any = None,
              deadline: Optional[float] = None, decode: bool = True, action: str = "") -> Obj:
        """Send one request; its JSON answer (``{}`` with ``decode=False``: a write's answer is
        read off the connection, which goes back to the pool, but not parsed)."""
        until = self._deadline(deadline, action or f"{method} {path}")
        response = self._raw(method, path, query=query, body=body, deadline=until)
        try:
            return json.loads(response.data) if decode else {}
        finally:
            response.release_conn()

    def get_json(self, path: str, query: Query = None, *, deadline: Optional[float] = None) -> Obj:
        """One live GET of an API path; its JSON.

        :raises: what :meth:`ClientConfig.request_errors` lists (``.status`` 404 ...);
            :meth:`ClientConfig.failure` translates them.
        """
        return self._json("GET", path, query=query, deadline=deadline)

    def _lister(self, path: str, query: Dict[str, Any]):
        def send(extra: Dict[str, Any], timeout: float, read_timeout: Optional[float]) -> Any:
            # up to its answer's head within ``timeout``; then each read of the stream within
            # ``read_timeout`` (a watch's silence bound), else ``timeout`` (a list's: the
            # transport's default)
            return self._raw("GET", path, query={**query, **extra}, timeout=timeout,
                             read_timeout=read_timeout, stream=True)
        return send

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the list+watch threads (this node's pods, all NADs) and the event sender."""
        if self._threads:
            return
        reflectors = [
            Reflector(self._state, "pods", f"pods on node {self.node_name}",
                      self._lister(PODS_PATH, {"fieldSelector": f"spec.nodeName={self.node_name}"}),
                      self._delivered_pod, self._pods, self.config, self.request_timeout,
                      self.watch_idle),
            Reflector(self._state, "nads", "NetworkAttachmentDefinitions",
                      self._lister(NADS_PATH, {}), nad_from_object, self._nads, self.config,
                      self.request_timeout, self.watch_idle)]
        self._threads = [threading.Thread(target=r.run, name=f"multusd-k8s-{r.kind}", daemon=True)
                         for r in reflectors]
        for thread in self._threads:
            thread.start()
        self._events.ensure_thread()
        LOG.info("watching pods on node %s and NetworkAttachmentDefinitions at %s",
                 self.node_name, self.server_url)

    def add_pod_listener(self, listener: Callable[[Pod], None]) -> None:
        """Hand ``listener`` every pod the watch delivers (listed, added, modified), on the
        watch's thread, as it arrives; before :meth:`start`. It must not block."""
        self._pod_listeners.append(listener)

    def _delivered_pod(self, obj: Dict[str, Any]) -> Pod:
        pod = pod_from_object(obj)
        for listener in self._pod_listeners:
            try:
                listener(pod)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the watch
                LOG.exception("a pod listener failed on %s/%s", pod.namespace, pod.name)
        return pod

    def cache_sizes(self) -> Tuple[int, int]:
        """(pods, NADs) held in the watch caches (for metrics)."""
        with self._cond:
            return len(self._pods), len(self._nads)

    def ready(self) -> bool:
        """Ready to serve ADD: the pod cache has completed its first list (readiness).

        A cache known stale later on does not make it unready: its lookups are live GETs until
        the relist completes. The NAD cache is not waited for: see the module docstring and
        :meth:`nad_problem`.
        """
        with self._cond:
            return self._state.listed["pods"]

    def synced(self) -> bool:
        """The pod cache holds a complete list and is not known to be stale."""
        with self._cond:
            return self._state.synced["pods"]

    def wait_synced(self, timeout: float, *, nads: bool = False) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`synced` (and with ``nads`` for the NAD
        cache too); returns whether it is."""
        kinds = ("pods", "nads") if nads else ("pods",)
        with self._cond:
            return self._cond.wait_for(lambda: all(self._state.synced[k] for k in kinds),
                                       timeout)

    def nads_synced(self) -> bool:
        """The NAD cache holds a complete list (else lookups ask the API server)."""
        with self._cond:
            return self._state.synced["nads"]

    @property
    def relists(self) -> int:
        """How many times a watch expired (410 Gone, history lost) and its cache was relisted."""
        with self._cond:
            return sum(self._state.relists.values())

    @property
    def watch_reopens(self) -> Dict[Tuple[str, str], int]:
        """How many times a watch ended and another was opened, by (resource, cause); the
        causes are :data:`multusd.kube.rounds.REOPEN_CAUSES`."""
        with self._cond:
            return {(RESOURCES[kind], cause): count
                    for (kind, cause), count in self._state.reopens.items()}

    @property
    def last_error(self) -> Optional[str]:
        """Why a watch is failing now (for start-up diagnostics), or None while all is well."""
        with self._cond:
            problems = [f"{kind}: {msg}" for kind, msg in self._state.errors.items() if msg]
        return "; ".join(problems) or None

    def nad_problem(self) -> Optional[Tuple[str, str]]:
        """(condition, message) while the NAD watch fails, else None.

        The condition is ``crd-missing`` (the list answers 404), ``forbidden`` (403) or
        ``unavailable`` (anything else); the message names the fix.
        """
        with self._cond:
            if self._state.synced["nads"] or self._state.errors["nads"] is None:
                return None
            status, message = self._state.error_status["nads"], self._state.errors["nads"]
        return nad_condition(status, message)

    def stop(self) -> None:
        """Stop the watches and the event sender (queued events get a short chance to go out,
        without retries)."""
        self._state.stop()
        self._transport.stop_retrying()
        with self._cond:
            self._cond.notify_all()
            watches = list(self._state.open_watches.values())
        for response in watches:
            shutdown_response(response)
        for thread in self._threads:
            thread.join(timeout=self.request_timeout)
        self._events.stop(self.request_timeout)
        self.config.close()

    # ---- writes --------------------------------------------------------------------------------

    def set_network_status(self, pod: Pod, status: str, *,
                           deadline: Optional[float] = None) -> None:
        """Write the pod's network-status annotation
        (:func:`multusd.kube.status.set_network_status`)."""
        set_network_status(self._json, self.config, pod, status, self._stopping,
                           deadline=deadline)

    def emit_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        """Queue an event about ``pod`` (sent by a background thread); never raises."""
        self._events.emit(pod, event_type, reason, message)

    # ---- DRA devices (through get_json, the one request kube/draclaims.py sends) ----------------

    def pod_dra_devices(self, pod: Pod, *,
                        deadline: Optional[float] = None) -> List[draclaims.AllocatedDevice]:
        """The DRA devices of ``pod`` a NAD's resourceName can name (:mod:`multusd.kube.draclaims`).

        No request for a pod without ResourceClaims; each claim is read once, ResourceSlices
        come from a cache per (node, driver). Searched on the pod's node (its spec.nodeName;
        this node's name when it has none).

        :raises MultusError: a claim is missing or unallocated, an extended-resource device
            does not match, or a request failed.
        """
        return draclaims.pod_devices(pod, self.get_json, self.config, self._dra_slices,
                                     node=pod.node_name or self.node_name, deadline=deadline)

    @property
    def dra_slice_lists(self) -> int:
        """ResourceSlice lists sent so far (one per (node, driver), plus refreshes)."""
        return self._dra_slices.lists
