"""Kubernetes access: pod and NetworkAttachmentDefinition caches, network-status, events.

The only module that imports ``kubernetes``, and only inside functions, so that
``import multusd.kube.client`` stays cheap (the daemon imports it when a kubeconfig is configured).

What it keeps off the request path (architecture invariant 7):

* pods on this node (``fieldSelector=spec.nodeName=<node>``) and NADs in all namespaces are
  held in caches fed by list+watch threads, trimmed to what multusd reads; a lookup that
  misses waits briefly for the watch, then makes one live GET;
* the network-status annotation is one GET and one PUT of ``pods/<name>/status``, the verbs
  upstream's ClusterRole grants (a PATCH would be one request but needs a ``patch`` grant that
  operators' existing RBAC does not have);
* events go out from a background thread and never fail or slow an ADD.

Requests go through the client's REST layer with ``_preload_content=False`` and the JSON is
read as plain dicts: the generated models are slow to build and drop fields they do not know,
which a PUT of the whole pod would then erase on a newer API server.

Foreign exceptions (``ApiException``, urllib3 and socket errors) are translated in one place,
:meth:`KubeClient._failure`: 404 becomes None or :class:`~multusd.errors.PodNotFound`, 429/5xx
and connection errors :class:`~multusd.errors.TryAgainLater`, naming the API server URL.
Credentials (tokens, kubeconfig contents, keys) never reach a log line or an error message.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import socket
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from multusd.errors import (InvalidNetworkConfig, MultusError, PodNotFound, TryAgainLater)

LOG = logging.getLogger(__name__)

NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
NAD_GROUP = "k8s.cni.cncf.io"
NAD_VERSION = "v1"
NAD_PLURAL = "network-attachment-definitions"
EVENT_COMPONENT = "multus"
EVENT_TYPES = ("Normal", "Warning")

WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we resume from its last version
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0
STATUS_UPDATE_ATTEMPTS = 5  # like upstream's retry-on-conflict
STATUS_CONFLICT_PAUSE = 0.01
EVENT_QUEUE_SIZE = 256
EVENT_MESSAGE_LIMIT = 1024  # what kube-apiserver accepts in an event message
REDACTED = "<redacted>"

Key = Tuple[str, str]
Obj = Dict[str, Any]


@dataclass(frozen=True)
class Pod:
    """The part of a pod multusd reads; ``annotations`` is a read-only mapping."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    is_static: bool
    resource_version: str


@dataclass(frozen=True)
class NetworkAttachmentDefinition:
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
               resource_version=str(meta.get("resourceVersion", "")))


def nad_from_object(obj: Obj) -> NetworkAttachmentDefinition:
    """Trim a NetworkAttachmentDefinition dict to a :class:`NetworkAttachmentDefinition`."""
    meta = obj.get("metadata") or {}
    config = (obj.get("spec") or {}).get("config") or ""
    return NetworkAttachmentDefinition(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), config=str(config),
        annotations=types.MappingProxyType(dict(meta.get("annotations") or {})))


def _key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class _Backoff:
    """Exponential backoff with jitter, reset after a success."""

    def __init__(self, initial: float = BACKOFF_INITIAL, maximum: float = BACKOFF_MAX) -> None:
        self.initial, self.maximum = initial, maximum
        self.current = initial

    def next(self) -> float:
        delay = self.current * random.uniform(0.8, 1.2)
        self.current = min(self.current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.current = self.initial


class KubeClient:
    """Narrow Kubernetes client of the daemon. See the module docstring.

    :param kubeconfig: path of a kubeconfig (token, tokenFile, client certificate, CA).
    :param node_name: this node's name; only pods scheduled here are cached.
    :param request_timeout: connect and read timeout of each request, in seconds.
    :raises InvalidNetworkConfig: the kubeconfig cannot be loaded (the message says why,
        without its contents).
    """

    def __init__(self, kubeconfig: str, node_name: str, *, request_timeout: float = 10.0) -> None:
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.request_timeout = float(request_timeout)
        self._secrets: Set[str] = set()
        self._configuration = self._load_configuration(kubeconfig)
        self.server_url: str = self._configuration.host
        from kubernetes import client  # lazy: see the module docstring

        self._api_client = client.ApiClient(self._configuration)
        self._core = client.CoreV1Api(self._api_client)
        self._custom = client.CustomObjectsApi(self._api_client)
        self._count_lock = threading.Lock()
        self._request_count = 0
        self._cond = threading.Condition()
        self._pods: Dict[Key, Pod] = {}
        self._nads: Dict[Key, NetworkAttachmentDefinition] = {}
        self._synced: Dict[str, bool] = {"pods": False, "nads": False}
        self._errors: Dict[str, Optional[str]] = {"pods": None, "nads": None}
        self._stopping = threading.Event()
        self._threads: List[threading.Thread] = []
        self._open_watches: Dict[str, Any] = {}
        self._events: "queue.Queue[Optional[Obj]]" = queue.Queue(maxsize=EVENT_QUEUE_SIZE)
        self._event_thread: Optional[threading.Thread] = None
        self._event_lock = threading.Lock()

    # ---- configuration ---------------------------------------------------------------------

    def _load_configuration(self, kubeconfig: str) -> Any:
        """A private client Configuration from the kubeconfig (never the global default)."""
        import urllib3
        from kubernetes import client, config

        configuration = client.Configuration()
        configuration.host = ""  # stays empty when the kubeconfig names no server
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
        except config.ConfigException as exc:
            # The loader's own messages name keys and files, not values, so they are kept.
            # Nothing is chained (from None): a traceback in the journal must not carry more.
            reason = str(exc)
            raise InvalidNetworkConfig(
                f"cannot use kubeconfig {kubeconfig!r}: {reason}; point 'kubeconfig' in "
                "daemon-config.json at a kubeconfig with a server and credentials for this node"
            ) from None
        except Exception as exc:  # noqa: BLE001 - OSError, YAML errors, bad base64 ...
            # parser errors quote the offending line, which may hold the token: type only
            raise InvalidNetworkConfig(
                f"cannot use kubeconfig {kubeconfig!r}: {type(exc).__name__} while reading it; "
                "check that the file exists, is readable by root and is a valid kubeconfig"
            ) from None
        if not configuration.host:
            raise InvalidNetworkConfig(
                f"kubeconfig {kubeconfig!r} has no 'server' in the cluster of its current "
                "context; add the API server's URL (https://<host>:<port>)")
        for name, value in list(configuration.api_key.items()):
            # a tokenFile usually ends in a newline, which no HTTP header may carry
            value = configuration.api_key[name] = value.strip()
            self._secrets.add(value)
            self._secrets.add(value.split(" ", 1)[-1])  # the bare token after "Bearer "
        configuration.debug = False  # http.client would print request headers (the token)
        # One quick retry covers a pooled keep-alive connection the server already closed;
        # longer waits are the callers' business (backoff in the watches, TryAgainLater).
        configuration.retries = urllib3.Retry(total=1, connect=1, read=1, redirect=0, status=0,
                                              raise_on_status=False)
        configuration.connection_pool_maxsize = 8
        return configuration

    def _redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            if len(secret) >= 4:
                text = text.replace(secret, REDACTED)
        return text

    # ---- requests and error mapping ----------------------------------------------------------

    @property
    def api_requests(self) -> int:
        """How many requests this client has sent (lists, watches, GETs, PUTs, events)."""
        with self._count_lock:
            return self._request_count

    def _timeout(self, read: Optional[float] = None) -> Tuple[float, float]:
        return (self.request_timeout, self.request_timeout if read is None else read)

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Send one request through the client's REST layer; return the open urllib3 response."""
        with self._count_lock:
            self._request_count += 1
        kwargs.setdefault("_request_timeout", self._timeout())
        return call(*args, _preload_content=False, **kwargs)

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        response = self._raw(call, *args, **kwargs)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    def _failure(self, exc: BaseException, action: str) -> MultusError:
        """The MultusError for a failed request (the one translation point of this module)."""
        from kubernetes.client.exceptions import ApiException

        where = f"the Kubernetes API server at {self.server_url}"
        if isinstance(exc, json.JSONDecodeError):
            return MultusError(f"cannot {action}: {where} answered with something that is not "
                               "JSON; check that 'server' in kubeconfig "
                               f"{self.kubeconfig!r} points at a Kubernetes API server")
        if isinstance(exc, ValueError):  # its text may quote a header, that is the token
            return MultusError(f"cannot {action}: the request to {where} could not be built "
                               f"({type(exc).__name__}); check the credentials in kubeconfig "
                               f"{self.kubeconfig!r}")
        if isinstance(exc, (ApiException, _WatchError)):
            status = int(exc.status or 0)
            detail = self._redact(_status_detail(exc))
            if status == 0 and "SSL" in str(exc.reason):
                err: MultusError = MultusError(
                    f"cannot {action}: {where} failed the TLS handshake ({detail}); check "
                    f"'certificate-authority' and the client certificate in {self.kubeconfig!r}")
            elif status == 401:
                err = MultusError(
                    f"cannot {action}: {where} rejected multusd's credentials (401 Unauthorized);"
                    f" check the token or client certificate in kubeconfig {self.kubeconfig!r}")
            elif status == 403:
                err = MultusError(
                    f"cannot {action}: {where} forbids it (403 Forbidden: {detail}); grant the "
                    "user of kubeconfig the multus ClusterRole rules (pods and pods/status: get, "
                    "list, watch, update; network-attachment-definitions: get, list, watch; "
                    "events: create)")
            elif status == 429 or status >= 500:
                err = TryAgainLater(f"cannot {action}: {where} answered {status} ({detail}); "
                                    "it is overloaded or restarting, try again")
            else:
                err = MultusError(f"cannot {action}: {where} answered {status} ({detail})")
            return err
        reason = self._redact(_connection_reason(exc))
        return TryAgainLater(
            f"cannot {action}: {where} is unreachable ({reason}); check that it is running and "
            f"that the 'server' of kubeconfig {self.kubeconfig!r} is right")

    def _request_errors(self) -> Tuple[type, ...]:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        return (ApiException, _WatchError, urllib3.exceptions.HTTPError, OSError, ValueError)

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the list+watch threads (pods on this node, NADs everywhere) and the event sender."""
        if self._threads:
            return
        pods = _Reflector(self, "pods", self._list_pods, pod_from_object, self._pods)
        nads = _Reflector(self, "nads", self._list_nads, nad_from_object, self._nads)
        self._threads = [threading.Thread(target=r.run, name=f"multusd-k8s-{r.kind}", daemon=True)
                         for r in (pods, nads)]
        for thread in self._threads:
            thread.start()
        self._ensure_event_thread()
        LOG.info("watching pods on node %s and NetworkAttachmentDefinitions at %s",
                 self.node_name, self.server_url)

    def cache_sizes(self) -> Tuple[int, int]:
        """(pods, NADs) held in the watch caches (for metrics)."""
        with self._cond:
            return len(self._pods), len(self._nads)

    def synced(self) -> bool:
        """Both caches have completed their first list."""
        with self._cond:
            return all(self._synced.values())

    def wait_synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`synced`; returns whether it is."""
        with self._cond:
            return self._cond.wait_for(lambda: all(self._synced.values()), timeout)

    @property
    def last_error(self) -> Optional[str]:
        """Why a watch is failing now (for start-up diagnostics), or None while all is well."""
        with self._cond:
            problems = [f"{kind}: {msg}" for kind, msg in self._errors.items() if msg]
        return "; ".join(problems) or None

    def stop(self) -> None:
        """Stop the watches and the event sender (queued events get a short chance to go out)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            watches = list(self._open_watches.values())
        for response in watches:
            _shutdown_response(response)
        for thread in self._threads:
            thread.join(timeout=self.request_timeout)
        if self._event_thread is not None:
            try:
                self._events.put(None, timeout=1.0)
            except queue.Full:
                pass
            self._event_thread.join(timeout=self.request_timeout)
        self._api_client.close()

    # ---- lookups -------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str, *, wait: float = 2.0,
                expected_uid: str = "") -> Optional[Pod]:
        """The pod from the cache, waiting up to ``wait`` s for the watch, then one live GET.

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
        if pod is not None:
            return pod
        LOG.debug("pod %s/%s not in the cache; asking the API server", namespace, name)
        try:
            return pod_from_object(self._json(self._core.read_namespaced_pod, name, namespace))
        except self._request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._failure(exc, f"get pod {namespace}/{name}") from exc

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
            obj = self._json(self._custom.get_namespaced_custom_object, NAD_GROUP, NAD_VERSION,
                             namespace, NAD_PLURAL, name)
        except self._request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._failure(
                exc, f"get NetworkAttachmentDefinition {namespace}/{name}") from exc
        return nad_from_object(obj)

    # ---- network-status ----------------------------------------------------------------------

    def set_network_status(self, pod: Pod, status: str) -> None:
        """Write ``status`` as the pod's network-status annotation through pods/status.

        A fresh GET, then a PUT of the whole pod; a 409 conflict repeats both (up to
        STATUS_UPDATE_ATTEMPTS times). A pod that is gone is logged and skipped.

        :raises PodNotFound: the pod was replaced (another UID) and is not a static pod.
        :raises TryAgainLater: unreachable, overloaded, or conflicts on every attempt.
        :raises MultusError: the API server refused the request (401, 403, ...).
        """
        action = f"set the network-status of pod {pod.namespace}/{pod.name}"
        for attempt in range(1, STATUS_UPDATE_ATTEMPTS + 1):
            try:
                current = self._json(self._core.read_namespaced_pod, pod.name, pod.namespace)
                if not self._status_update_needed(pod, current, status):
                    return
                self._json(self._core.replace_namespaced_pod_status, pod.name, pod.namespace,
                           current)
                return
            except self._request_errors() as exc:
                code = getattr(exc, "status", None)
                if code == 404:
                    LOG.info("pod %s/%s is gone; its network-status was not written",
                             pod.namespace, pod.name)
                    return
                if code != 409:
                    raise self._failure(exc, action) from exc
                LOG.debug("conflict writing network-status of %s/%s (attempt %d); retrying",
                          pod.namespace, pod.name, attempt)
            if self._stopping.wait(STATUS_CONFLICT_PAUSE * attempt):
                break
        raise TryAgainLater(f"cannot {action}: the pod changed under every one of "
                            f"{STATUS_UPDATE_ATTEMPTS} attempts at {self.server_url}; try again")

    @staticmethod
    def _status_update_needed(pod: Pod, current: Obj, status: str) -> bool:
        """Check the UID and put the annotation into ``current``; False if already there."""
        meta = current.setdefault("metadata", {})
        annotations = meta.get("annotations") or {}
        uid = meta.get("uid", "")
        if pod.uid and uid != pod.uid and not is_static_pod(annotations):
            raise PodNotFound(
                f"pod {pod.namespace}/{pod.name} was replaced: expected UID {pod.uid!r} but the "
                f"API server has {uid!r}; the sandbox belongs to a pod that no longer exists")
        if annotations.get(NETWORK_STATUS_ANNOTATION) == status:
            return False
        annotations[NETWORK_STATUS_ANNOTATION] = status
        meta["annotations"] = annotations
        return True

    # ---- events --------------------------------------------------------------------------------

    def emit_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        """Queue an event about ``pod`` (sent by a background thread); never raises."""
        try:
            if event_type not in EVENT_TYPES:
                LOG.warning("event %r for pod %s/%s dropped: type %r is not one of %s", reason,
                            pod.namespace, pod.name, event_type, EVENT_TYPES)
                return
            self._ensure_event_thread()
            self._events.put_nowait(self._event_body(pod, event_type, reason, message))
        except queue.Full:
            LOG.warning("event %r for pod %s/%s dropped: %d events are already waiting for the "
                        "API server", reason, pod.namespace, pod.name, EVENT_QUEUE_SIZE)
        except Exception:  # noqa: BLE001 - an event must never fail the caller
            LOG.exception("event %r for pod %s/%s dropped", reason, pod.namespace, pod.name)

    def _event_body(self, pod: Pod, event_type: str, reason: str, message: str) -> Obj:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "apiVersion": "v1", "kind": "Event",
            # the same naming as client-go's recorder: <object>.<hex timestamp>
            "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                               "name": pod.name, "uid": pod.uid,
                               "resourceVersion": pod.resource_version},
            "type": event_type, "reason": reason, "message": message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": EVENT_COMPONENT, "host": self.node_name},
            "reportingComponent": EVENT_COMPONENT, "reportingInstance": self.node_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }

    def _ensure_event_thread(self) -> None:
        with self._event_lock:
            if self._event_thread is None and not self._stopping.is_set():
                self._event_thread = threading.Thread(target=self._send_events,
                                                      name="multusd-k8s-events", daemon=True)
                self._event_thread.start()

    def _send_events(self) -> None:
        while True:
            body = self._events.get()
            if body is None:
                return
            try:
                self._json(self._core.create_namespaced_event, body["metadata"]["namespace"],
                           body)
            except self._request_errors() as exc:
                failure = self._failure(exc, f"record event {body['reason']!r}")
                LOG.warning("%s", failure.msg)
            except Exception:  # noqa: BLE001 - the sender thread must survive anything
                LOG.exception("sending event %r failed", body.get("reason"))

    # ---- list and watch ------------------------------------------------------------------------

    def _list_pods(self, **kwargs: Any) -> Any:
        return self._raw(self._core.list_pod_for_all_namespaces,
                         field_selector=f"spec.nodeName={self.node_name}", **kwargs)

    def _list_nads(self, **kwargs: Any) -> Any:
        return self._raw(self._custom.list_cluster_custom_object, NAD_GROUP, NAD_VERSION,
                         NAD_PLURAL, **kwargs)


class _Reflector:
    """List, then watch from the list's resourceVersion, into one cache; forever, until stop."""

    def __init__(self, owner: KubeClient, kind: str, list_call: Callable[..., Any],
                 trim: Callable[[Obj], Any], store: Dict[Key, Any]) -> None:
        self.owner, self.kind, self.list_call, self.trim, self.store = (
            owner, kind, list_call, trim, store)
        self.backoff = _Backoff()

    def run(self) -> None:
        owner = self.owner
        version: Optional[str] = None
        while not owner._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                opened = time.monotonic()
                version = self._watch(version)
                if time.monotonic() - opened > 1.0:
                    continue  # the server ended a long watch (timeoutSeconds): resume at once
                # a watch that ends at once, again and again, must not spin: back off below
            except _Expired:
                LOG.info("%s watch at version %s expired; listing again", self.kind, version)
                version = None
                continue
            except owner._request_errors() as exc:
                if owner._stopping.is_set():
                    break
                self._report(exc)
            except Exception:  # noqa: BLE001 - the watch thread must not die
                LOG.exception("%s watch failed unexpectedly", self.kind)
            owner._stopping.wait(self.backoff.next())

    def _report(self, exc: BaseException) -> None:
        failure = self.owner._failure(exc, f"watch {self._what()}")
        with self.owner._cond:
            first = self.owner._errors[self.kind] != failure.msg
            self.owner._errors[self.kind] = failure.msg
        # the same failure again is logged quietly: the backoff already spaces the attempts
        LOG.log(logging.WARNING if first else logging.DEBUG, "%s; retrying", failure.msg)

    def _recovered(self) -> None:
        """Forget the last failure (called with the owner's lock held)."""
        if self.owner._errors[self.kind] is not None:
            self.owner._errors[self.kind] = None
            LOG.info("the %s watch is working again", self.kind)

    def _what(self) -> str:
        if self.kind == "pods":
            return f"pods on node {self.owner.node_name}"
        return "NetworkAttachmentDefinitions"

    def _list(self) -> str:
        owner = self.owner
        response = self.list_call(_request_timeout=owner._timeout(max(30.0,
                                                                      owner.request_timeout)))
        try:
            data = json.loads(response.data)
        finally:
            response.release_conn()
        fresh = {}
        for item in data.get("items") or []:
            fresh[_key(item)] = self.trim(item)
        with owner._cond:
            self.store.clear()
            self.store.update(fresh)
            owner._synced[self.kind] = True
            self._recovered()
            owner._cond.notify_all()
        self.backoff.reset()
        version = str((data.get("metadata") or {}).get("resourceVersion", ""))
        LOG.debug("listed %d %s at version %s", len(fresh), self.kind, version)
        return version

    def _watch(self, version: str) -> str:
        """Follow one watch stream; returns the last resourceVersion seen."""
        owner = self.owner
        response = self.list_call(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            _request_timeout=owner._timeout(WATCH_TIMEOUT_SECONDS + owner.request_timeout))
        with owner._cond:
            owner._open_watches[self.kind] = response
            self._recovered()
        if owner._stopping.is_set():
            _shutdown_response(response)
        completed = False
        try:
            for event in _watch_events(response):
                version = self._apply(event, version)
                self.backoff.reset()
            completed = True
        finally:
            with owner._cond:
                owner._open_watches.pop(self.kind, None)
            if completed:
                response.release_conn()  # a cleanly ended stream leaves a reusable connection
            else:
                response.close()
        return version

    def _apply(self, event: Obj, version: str) -> str:
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise _WatchError(int(obj.get("code") or 500), str(obj.get("message", "")))
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if etype == "BOOKMARK":
            return new_version
        key = _key(obj)
        with self.owner._cond:
            if etype == "DELETED":
                self.store.pop(key, None)
            elif etype in ("ADDED", "MODIFIED"):
                self.store[key] = self.trim(obj)
            self._recovered()
            self.owner._cond.notify_all()
        return new_version


class _WatchError(Exception):
    """An ERROR event other than 410 in a watch stream (handled like an HTTP error)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = message
        self.body = json.dumps({"message": message})


def _watch_events(response: Any) -> Iterator[Obj]:
    """The JSON events of a chunked watch response, one per line, as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def _shutdown_response(response: Any) -> None:
    """Wake a thread blocked reading ``response`` by shutting its socket down."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _status_detail(exc: Any) -> str:
    """The API server's own message from an error response (its Status body), else the reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
        message = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    text = str(message or exc.reason or "no reason given")
    return text.splitlines()[0][:300] if text else text


def _connection_reason(exc: BaseException) -> str:
    """A short reason for a connection-level failure (the innermost cause of urllib3's error)."""
    import urllib3

    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return "the connection was cut"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "no answer within the read timeout"
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    # urllib3 repeats the connection object's repr; the part after ": " is the OS's words
    if "]" in text and "Errno" in text:
        text = text[text.index("[Errno"):]
    return text[:300]
