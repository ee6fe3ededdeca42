"""List+watch reflectors that keep one cache each, relisting as client-go does on expiry.

A reflector lists, then watches from the list's resourceVersion, forever. The watch is
resumed from the last version it saw when the server ends it, the connection drops, or the
stream stays silent longer than its idle bound (a healthy watch carries a bookmark about
every minute; a silently dead one is noticed within that bound instead of at the end of
``timeoutSeconds``). It is replaced by a new LIST when the server says that version is gone:
HTTP 410 at the start of the watch, an ERROR event with code 410 in the stream (etcd
compaction), or "too large resource version" (an API server whose history restarted). Until
that LIST completes the cache counts as not synced: it is known to be stale. Any other ERROR
event also leads to a LIST, after the backoff, like client-go's ListAndWatch. A failing
LIST keeps its HTTP status (404: the resource type is not installed, 403: forbidden) for the
readers to name, and a reader that finds the API working again can cut the backoff short.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

from multusd.kube.clientconfig import ClientConfig, WatchError
from multusd.kube.objects import Key, Obj, key_of
from multusd.kube.transport import IdleTimeout

LOG = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = (240, 300)  # the server ends a watch after this (random, as client-go)
WATCH_IDLE = 50.0  # no byte for this long: the stream is dead, resume from its last version
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0

# send(query, timeout, read_timeout) -> the open (streaming) transport Response of a LIST/WATCH
Send = Callable[[Dict[str, Any], float, Optional[float]], Any]


class Expired(Exception):
    """The watch's resourceVersion is not in the server's history (410 Gone): list again."""


class Backoff:
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


class WatchState:
    """What the reflectors share with their readers: one lock, sync flags, failures, relists."""

    def __init__(self, kinds: tuple = ("pods", "nads")) -> None:
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.synced: Dict[str, bool] = {kind: False for kind in kinds}
        self.errors: Dict[str, Optional[str]] = {kind: None for kind in kinds}
        self.error_status: Dict[str, Optional[int]] = {kind: None for kind in kinds}
        self.relists: Dict[str, int] = {kind: 0 for kind in kinds}  # after expiry
        self.idle_restarts: Dict[str, int] = {kind: 0 for kind in kinds}
        self.wake: Dict[str, threading.Event] = {kind: threading.Event() for kind in kinds}
        self.open_watches: Dict[str, Any] = {}

    def all_synced(self) -> bool:
        """Every cache holds a complete, not known stale, list (call with ``cond`` held)."""
        return all(self.synced.values())

    def stop(self) -> None:
        self.stopping.set()
        for event in self.wake.values():
            event.set()


class Reflector:
    """List, then watch from the list's resourceVersion, into one cache; forever, until stop.

    :param send: sends the LIST (and with ``watch`` in the query the WATCH) and returns the
        open response (:class:`multusd.kube.transport.Response`).
    :param trim: turns an object dict into what the cache holds.
    :param watch_idle: seconds a watch stream may stay silent before it is resumed anew.
    """

    def __init__(self, state: WatchState, kind: str, what: str, send: Send,
                 trim: Callable[[Obj], Any], store: Dict[Key, Any], config: ClientConfig,
                 request_timeout: float, watch_idle: float = WATCH_IDLE) -> None:
        self.state, self.kind, self.what = state, kind, what
        self.send, self.trim, self.store = send, trim, store
        self.config, self.request_timeout = config, request_timeout
        self.watch_idle = watch_idle
        self.backoff = Backoff()

    def run(self) -> None:
        state = self.state
        version: Optional[str] = None
        opened = 0.0
        while not state.stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                opened = time.monotonic()
                version, idle = self._watch(version)
                if idle or time.monotonic() - opened > 1.0:
                    continue  # the server ended a long watch (timeoutSeconds): resume at once
                # a watch that ends at once, again and again, must not spin: back off below
            except Expired as exc:
                LOG.info("%s watch at version %s expired (%s); listing again", self.kind,
                         version, exc)
                self._stale()
                version = None
                self._pause_if_young(opened)
                continue
            except WatchError as exc:
                if state.stopping.is_set():
                    break
                self._report(exc)
                version = None  # client-go: an error in the stream ends in a new LIST
            except self.config.request_errors() as exc:
                if state.stopping.is_set():
                    break
                if getattr(exc, "status", None) == 410:  # 410 Gone at the start of the watch
                    LOG.info("%s watch at version %s answered 410 Gone; listing again",
                             self.kind, version)
                    self._stale()
                    version = None
                    self._pause_if_young(opened)
                    continue
                self._report(exc)
            except Exception:  # noqa: BLE001 - the watch thread must not die
                LOG.exception("%s watch failed unexpectedly", self.kind)
            self._pause(self.backoff.next())

    def _pause(self, seconds: float) -> None:
        """Wait out a backoff; :meth:`WatchState.stop` or a reader's wake-up ends it early."""
        wake = self.state.wake[self.kind]
        wake.wait(seconds)
        wake.clear()

    def _pause_if_young(self, opened: float) -> None:
        """A server that expires every fresh watch at once must not get a LIST loop."""
        if time.monotonic() - opened < 1.0:
            self._pause(self.backoff.next())

    def _stale(self) -> None:
        with self.state.cond:
            self.state.synced[self.kind] = False
            self.state.relists[self.kind] += 1
            self.state.cond.notify_all()

    def _report(self, exc: BaseException) -> None:
        failure = self.config.failure(exc, f"watch {self.what}")
        with self.state.cond:
            first = self.state.errors[self.kind] != failure.msg
            self.state.errors[self.kind] = failure.msg
            self.state.error_status[self.kind] = getattr(exc, "status", None)
            self.state.cond.notify_all()
        # the same failure again is logged quietly: the backoff already spaces the attempts
        LOG.log(logging.WARNING if first else logging.DEBUG, "%s; retrying", failure.msg)

    def _recovered(self) -> None:
        """Forget the last failure (called with the state's lock held)."""
        if self.state.errors[self.kind] is not None:
            self.state.errors[self.kind] = None
            self.state.error_status[self.kind] = None
            LOG.info("the %s watch is working again", self.kind)

    def _list(self) -> str:
        response = self.send({}, max(30.0, self.request_timeout), None)
        try:
            data = json.loads(response.data)
        finally:
            response.release_conn()
        fresh = {}
        for item in data.get("items") or []:
            fresh[key_of(item)] = self.trim(item)
        with self.state.cond:
            self.store.clear()
            self.store.update(fresh)
            self.state.synced[self.kind] = True
            self._recovered()
            self.state.cond.notify_all()
        self.backoff.reset()
        version = str((data.get("metadata") or {}).get("resourceVersion", ""))
        LOG.debug("listed %d %s at version %s", len(fresh), self.kind, version)
        return version

    def _watch(self, version: str) -> tuple:
        """Follow one watch stream: (the last resourceVersion seen, whether it fell silent)."""
        state = self.state
        query = {"watch": True, "resourceVersion": version, "allowWatchBookmarks": True,
                 "timeoutSeconds": random.randint(*WATCH_TIMEOUT_SECONDS)}
        response = self.send(query, self.request_timeout, self.watch_idle)
        with state.cond:
            state.open_watches[self.kind] = response
            self._recovered()
        if state.stopping.is_set():
            shutdown_response(response)
        completed = idle = False
        try:
            for event in watch_events(response):
                version = self._apply(event, version)
                self.backoff.reset()
            completed = True
        except IdleTimeout:
            if state.stopping.is_set():
                raise
            idle = True
            with state.cond:
                state.idle_restarts[self.kind] += 1
            LOG.info("the %s watch sent nothing for %.0fs; resuming it from version %s",
                     self.kind, self.watch_idle, version)
        finally:
            with state.cond:
                state.open_watches.pop(self.kind, None)
            if completed:
                response.release_conn()  # a cleanly ended stream leaves a reusable connection
            else:
                response.close()
        return version, idle

    def _apply(self, event: Obj, version: str) -> str:
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            code, message = int(obj.get("code") or 500), str(obj.get("message", ""))
            if code == 410 or _too_large(obj):
                raise Expired(message or f"ERROR event {code}")
            raise WatchError(code, message, str(obj.get("reason", "")))
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if etype == "BOOKMARK":
            return new_version
        key = key_of(obj)
        trimmed = self.trim(obj) if etype in ("ADDED", "MODIFIED") else None  # outside the lock
        with self.state.cond:
            if etype == "DELETED":
                self.store.pop(key, None)
            elif trimmed is not None:
                self.store[key] = trimmed
            self._recovered()
            self.state.cond.notify_all()
        return new_version


def _too_large(status: Obj) -> bool:
    """kube-apiserver's "Too large resource version": its history starts after ours."""
    causes = (status.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "ResourceVersionTooLarge" for c in causes if
               isinstance(c, dict)) or "too large resource version" in \
        str(status.get("message", "")).lower()


def watch_events(response: Any) -> Iterator[Obj]:
    """The JSON events of a chunked watch response, one per line, as they arrive."""
    pending = b""
    for chunk in response.stream():
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def shutdown_response(response: Any) -> None:
    """Wake a thread blocked reading ``response`` by shutting its socket down."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
