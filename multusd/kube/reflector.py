"""List+watch reflectors that keep one cache each, relisting as client-go does on expiry.

A reflector lists, then watches from the list's resourceVersion, forever. The watch is
resumed from the last version it saw when the server ends it or the connection drops; it
is replaced by a new LIST when the server says that version is gone: HTTP 410 at the start
of the watch, an ERROR event with code 410 in the stream (etcd compaction), or "too large
resource version" (an API server whose history restarted). Until that LIST completes the
cache counts as not synced: it is known to be stale. Any other ERROR event also leads to a
LIST, after the backoff, like client-go's ListAndWatch.
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

LOG = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we resume from its last version
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0


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
        self.relists: Dict[str, int] = {kind: 0 for kind in kinds}  # after expiry
        self.open_watches: Dict[str, Any] = {}

    def all_synced(self) -> bool:
        """Every cache holds a complete, not known stale, list (call with ``cond`` held)."""
        return all(self.synced.values())


class Reflector:
    """List, then watch from the list's resourceVersion, into one cache; forever, until stop.

    :param list_call: sends the LIST (and with ``watch=True`` the WATCH) and returns the open
        urllib3 response.
    :param trim: turns an object dict into what the cache holds.
    """

    def __init__(self, state: WatchState, kind: str, what: str, list_call: Callable[..., Any],
                 trim: Callable[[Obj], Any], store: Dict[Key, Any], config: ClientConfig,
                 request_timeout: float) -> None:
        self.state, self.kind, self.what = state, kind, what
        self.list_call, self.trim, self.store = list_call, trim, store
        self.config, self.request_timeout = config, request_timeout
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
                version = self._watch(version)
                if time.monotonic() - opened > 1.0:
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
            state.stopping.wait(self.backoff.next())

    def _pause_if_young(self, opened: float) -> None:
        """A server that expires every fresh watch at once must not get a LIST loop."""
        if time.monotonic() - opened < 1.0:
            self.state.stopping.wait(self.backoff.next())

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
        # the same failure again is logged quietly: the backoff already spaces the attempts
        LOG.log(logging.WARNING if first else logging.DEBUG, "%s; retrying", failure.msg)

    def _recovered(self) -> None:
        """Forget the last failure (called with the state's lock held)."""
        if self.state.errors[self.kind] is not None:
            self.state.errors[self.kind] = None
            LOG.info("the %s watch is working again", self.kind)

    def _timeout(self, read: float) -> tuple:
        return (self.request_timeout, read)

    def _list(self) -> str:
        response = self.list_call(_request_timeout=self._timeout(max(30.0,
                                                                     self.request_timeout)))
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

    def _watch(self, version: str) -> str:
        """Follow one watch stream; returns the last resourceVersion seen."""
        state = self.state
        response = self.list_call(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            _request_timeout=self._timeout(WATCH_TIMEOUT_SECONDS + self.request_timeout))
        with state.cond:
            state.open_watches[self.kind] = response
            self._recovered()
        if state.stopping.is_set():
            shutdown_response(response)
        completed = False
        try:
            for event in watch_events(response):
                version = self._apply(event, version)
                self.backoff.reset()
            completed = True
        finally:
            with state.cond:
                state.open_watches.pop(self.kind, None)
            if completed:
                response.release_conn()  # a cleanly ended stream leaves a reusable connection
            else:
                response.close()
        return version

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
    for chunk in response.stream(amt=None, decode_content=False):
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
