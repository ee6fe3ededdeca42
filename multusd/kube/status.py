"""Writes to the API server: the network-status annotation (pods/status) and pod events.

The network-status annotation is one PUT of ``pods/<name>/status`` of the pod as the watch
delivered it (a GET first only after that was refused): the verbs upstream's ClusterRole
grants (a PATCH would need a ``patch`` grant that operators' existing RBAC does not have).
The watch's copy may be behind the server: its resourceVersion makes the server refuse it
with 409, or, for a node's own credentials, NodeRestriction refuses it with 403 first when
another client changed the pod's labels since (admission runs before the version check);
either way a fresh GET and PUT follow, so a concurrent label or status change never fails
an ADD. The transport retries transient answers (:mod:`multusd.kube.retries`): a PUT sent
again after its answer was lost, when the first one had been applied, answers 409, and the
GET that follows finds the annotation written. Events go out from a background thread and
never fail or slow an ADD; an event POST is sent again only when the server cannot have
processed it (429, a refused connection, a cut before the request was written whole).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Callable, Optional

from multusd.errors import PodNotFound, TryAgainLater
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import (EVENTS_PATH, NETWORK_STATUS_ANNOTATION, POD_PATH, Obj, Pod,
                                  is_static_pod)
from multusd.kube.transport import path_of

LOG = logging.getLogger(__name__)

EVENT_COMPONENT = "multus"
EVENT_TYPES = ("Normal", "Warning")
STATUS_UPDATE_ATTEMPTS = 5  # like upstream's retry-on-conflict
STATUS_CONFLICT_PAUSE = 0.01
EVENT_QUEUE_SIZE = 256
EVENT_MESSAGE_LIMIT = 1024  # what kube-apiserver accepts in an event message

JsonCall = Callable[..., Obj]  # (method, path, body=, deadline=, decode=, action=) -> JSON


def set_network_status(send: JsonCall, config: ClientConfig, pod: Pod, status: str,
                       stopping: threading.Event, *, deadline: Optional[float] = None) -> None:
    """Write ``status`` as the pod's network-status annotation through pods/status.

    The first PUT sends the pod as the watch (or the ADD's live GET) delivered it. After a
    409 (the pod changed since) or a 403 of that stale copy (NodeRestriction: another client
    changed its labels), or when that copy already carries the annotation, a fresh GET,
    then a PUT; a 409 repeats both (up to STATUS_UPDATE_ATTEMPTS in all). A 403 of a fresh
    copy is a real refusal. A pod that is gone is logged and skipped.

    :raises PodNotFound: the pod was replaced (another UID) and is not a static pod.
    :raises TryAgainLater: unreachable, overloaded, out of time, or conflicts on every attempt.
    :raises MultusError: the API server refused the request (401, 403, ...).
    """
    action = f"set the network-status of pod {pod.namespace}/{pod.name}"
    path = path_of(POD_PATH, namespace=pod.namespace, name=pod.name)
    known = pod.source
    for attempt in range(1, STATUS_UPDATE_ATTEMPTS + 1):
        from_known = bool(known)
        try:
            if from_known:
                current = json.loads(known)
                current.setdefault("apiVersion", "v1")  # list items come without them
                current.setdefault("kind", "Pod")
            else:
                current = send("GET", path, deadline=deadline, action=action)
            known = ""
            if not _status_update_needed(pod, current, status):
                if from_known:
                    continue  # the copy may be behind the server: ask it
                return
            send("PUT", path + "/status", body=current, deadline=deadline, decode=False,
                 action=action)
            return
        except config.request_errors() as exc:
            code = getattr(exc, "status", None)
            if code == 404:
                LOG.info("pod %s/%s is gone; its network-status was not written",
                         pod.namespace, pod.name)
                return
            if code == 403 and from_known:
                LOG.debug("the watch's copy of %s/%s was refused (403: %s); writing a fresh "
                          "copy", pod.namespace, pod.name, config.redact(str(exc)))
                continue
            if code != 409:
                raise config.failure(exc, action) from exc
            LOG.debug("conflict writing network-status of %s/%s (attempt %d); retrying",
                      pod.namespace, pod.name, attempt)
        if not from_known and stopping.wait(STATUS_CONFLICT_PAUSE * attempt):
            break
    raise TryAgainLater(f"cannot {action}: the pod changed under every one of "
                        f"{STATUS_UPDATE_ATTEMPTS} attempts at {config.server_url}; try again")


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


class EventSender:
    """A bounded queue of pod events and the thread that creates them (never raises)."""

    def __init__(self, send: JsonCall, config: ClientConfig, node_name: str,
                 stopping: threading.Event) -> None:
        self._send, self._config = send, config
        self.node_name = node_name
        self._stopping = stopping
        self._events: "queue.Queue[Optional[Obj]]" = queue.Queue(maxsize=EVENT_QUEUE_SIZE)
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def emit(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        """Queue an event about ``pod`` (sent by the background thread); never raises."""
        try:
            if event_type not in EVENT_TYPES:
                LOG.warning("event %r for pod %s/%s dropped: type %r is not one of %s", reason,
                            pod.namespace, pod.name, event_type, EVENT_TYPES)
                return
            self.ensure_thread()
            self._events.put_nowait(self._body(pod, event_type, reason, message))
        except queue.Full:
            LOG.warning("event %r for pod %s/%s dropped: %d events are already waiting for the "
                        "API server", reason, pod.namespace, pod.name, EVENT_QUEUE_SIZE)
        except Exception:  # noqa: BLE001 - an event must never fail the caller
            LOG.exception("event %r for pod %s/%s dropped", reason, pod.namespace, pod.name)

    def _body(self, pod: Pod, event_type: str, reason: str, message: str) -> Obj:
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

    def ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="multusd-k8s-events",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            body = self._events.get()
            if body is None:
                return
            try:
                namespace = body["metadata"]["namespace"]
                self._send("POST", path_of(EVENTS_PATH, namespace=namespace), body=body,
                           decode=False, action=f"record event {body['reason']!r}")
            except self._config.request_errors() as exc:
                failure = self._config.failure(exc, f"record event {body['reason']!r}")
                LOG.warning("%s", failure.msg)
            except Exception:  # noqa: BLE001 - the sender thread must survive anything
                LOG.exception("sending event %r failed", body.get("reason"))

    def stop(self, timeout: float) -> None:
        """Let queued events go out for a moment, then end the thread."""
        if self._thread is None:
            return
        try:
            self._events.put(None, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(timeout=timeout)
