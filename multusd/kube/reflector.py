"""List+watch reflectors, one cache each, reading the API server as client-go's reflector does.

A reflector lists, then watches from the list's resourceVersion, until it is stopped.

*Lists come from the API server's watch cache, never from etcd unless the server asks for it.*
The first list asks for ``resourceVersion=0`` (any version the cache holds; pages of
:data:`LIST_PAGE` with ``continue`` where the server pages, as a watch cache not yet ready
does); a relist asks for the last version this reflector synced to (not older than what it has
already seen: never back in time, and still a cache read). Only when the server answers that
this version is unavailable (410 Expired, or 504 "Too large resource version") it lists
consistently (``resourceVersion`` unset: a read from etcd). A ``continue`` token that expired
while paging (410) makes it list the whole at the requested version once, as client-go's pager
does. A list replaces the cache, so objects deleted while no watch could see them leave it.

*Watches live as long as the server lets them.* Each watch asks for bookmarks and ends after
``timeoutSeconds`` (:data:`WATCH_TIMEOUT_SECONDS`); the server sends a bookmark about once a
minute and one 2 s before that end, and every bookmark or event advances the version the next
watch resumes from. The silence bound of a stream is longer than its ``timeoutSeconds``, so a
healthy quiet watch is always ended by the server; a dead peer is found by the transport's TCP
keep-alive. A watch that expires (HTTP 410 at its start, an ERROR event 410 in the stream: etcd
compacted the history) leads to a relist at the last version; "too large resource version" (a
server whose history restarted below ours) to a consistent list; any other ERROR event to a
relist. Every end of a watch is counted by cause (:data:`REOPEN_CAUSES`).

*Recovery without a herd.* Failed requests back off exponentially with jitter up to
:data:`BACKOFF_MAX` (so the first list after an API server comes back follows within seconds),
and the first answer resets the backoff; a 429 (or any answer) carrying Retry-After waits that
long; a watch that ends at once without news backs off on its own scale; a relist after an
expiry waits a random part of :data:`RELIST_SPREAD`, so that the nodes of a cluster whose
watches expire together (an API server restart, a compaction) do not relist in the same
second. Readers do not wait for it (see below).

WatchList (``sendInitialEvents=true``) is not used: client-go's form of it (no version) makes
a server whose etcd cannot answer progress requests wait up to 3 s for a quiet resource and
then answer 504; the form with ``resourceVersion=0`` saves one request per start but works
by default only on servers of 1.34 or later (earlier ones refuse it while their WatchList gate
is off, and those before 1.27 ignore it and never send the end-of-initial-events bookmark,
which only a timeout could tell).

While a cache is known stale (expired, until its relist completes) it does not count as synced
and its readers ask the API server instead. A failing list keeps its HTTP status (404: the
resource type is not installed, 403: forbidden) for the readers to name, and a reader that
finds the API working again can cut the backoff short.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from multusd.kube.clientconfig import ClientConfig, WatchError
from multusd.kube.objects import Key, Obj, key_of
from multusd.kube.transport import IdleTimeout

LOG = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = (240, 300)  # the server ends a watch after this (random, as client-go)
WATCH_SILENCE_MARGIN = 30.0  # a stream silent this long past its timeoutSeconds is dead
LIST_PAGE = 500  # client-go's pager size
BACKOFF_INITIAL = 0.25
BACKOFF_MAX = 3.0  # a server back after an outage is asked again within this
RETRY_AFTER_MAX = 60.0
RELIST_SPREAD = 1.5  # a relist after an expiry waits up to this long (at random)
YOUNG_WATCH = 1.0  # a watch that ends sooner without news ended "at once" (client-go's rule)
# why a watch ended and another was opened (the label of multusd_watch_reopens_total)
REOPEN_CAUSES = ("ended", "expired", "error", "connection", "silence")

# send(query, timeout, read_timeout) -> the open (streaming) transport Response of a LIST/WATCH
Send = Callable[[Dict[str, Any], float, Optional[float]], Any]


class Expired(Exception):
    """The watch's resourceVersion is not in the server's history (410): list again."""


class TooLarge(Expired):
    """The server's history is behind our version ("Too large resource version"): list
    consistently, the version we know is of no use to it."""


class Backoff:
    """Exponential backoff with jitter (each delay at random between half and all of the
    current step, so that many nodes spread out), reset after a success."""

    def __init__(self, initial: float = BACKOFF_INITIAL, maximum: float = BACKOFF_MAX) -> None:
        self.initial, self.maximum = initial, maximum
        self.current = initial

    def next(self) -> float:
        delay = self.current * random.uniform(0.5, 1.0)
        self.current = min(self.current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.current = self.initial


class WatchState:
    """What the reflectors share with their readers: one lock, sync flags, failures, counts."""

    def __init__(self, kinds: tuple = ("pods", "nads")) -> None:
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        # synced: the cache holds a complete list not known to be stale; listed: it did once
        self.synced: Dict[str, bool] = {kind: False for kind in kinds}
        self.listed: Dict[str, bool] = {kind: False for kind in kinds}
        self.errors: Dict[str, Optional[str]] = {kind: None for kind in kinds}
        self.error_status: Dict[str, Optional[int]] = {kind: None for kind in kinds}
        self.relists: Dict[str, int] = {kind: 0 for kind in kinds}  # after expiry
        self.reopens: Dict[Tuple[str, str], int] = {}  # (kind, cause): watch ends
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
    :param watch_idle: seconds a watch stream may stay silent before it is resumed anew;
        None: its ``timeoutSeconds`` and :data:`WATCH_SILENCE_MARGIN`.
    """

    def __init__(self, state: WatchState, kind: str, what: str, send: Send,
                 trim: Callable[[Obj], Any], store: Dict[Key, Any], config: ClientConfig,
                 request_timeout: float, watch_idle: Optional[float] = None) -> None:
        self.state, self.kind, self.what = state, kind, what
        self.send, self.trim, self.store = send, trim, store
        self.config, self.request_timeout = config, request_timeout
        self.watch_idle = watch_idle
        self.version = ""  # the last version synced to ("": none yet)
        self.version_unavailable = False  # the server said it cannot serve self.version
        self.backoff = Backoff()  # requests that got no answer; reset by any answer
        self.churn = Backoff()  # watches that end at once without news; reset by one that lives
        self._watching = False  # a watch was asked for in this round
        self._opened: Optional[float] = None  # when it got its answer
        self._news = False  # it delivered an event or bookmark

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        state = self.state
        need_list = True
        while not state.stopping.is_set():
            self._opened, self._news, self._watching = None, False, False
            try:
                if need_list:
                    self._list()
                    need_list = False
                cause = self._watch()
                pause = self._young_pause()
            except Expired as exc:
                cause, need_list = "expired", True
                self.version_unavailable = isinstance(exc, TooLarge)
                LOG.info("%s watch at version %s expired (%s); listing again", self.kind,
                         self.version, exc)
                self._stale()
                pause = max(self._young_pause(), random.uniform(0.0, RELIST_SPREAD))
            except WatchError as exc:
                cause, need_list = "error", True  # client-go: an error event ends in a LIST
                self._report(exc)
                pause = max(self._young_pause(), _retry_after(exc) or 0.0)
            except self.config.request_errors() as exc:
                if state.stopping.is_set():
                    break
                if self._watching and self._opened is None and _gone(exc):  # 410 at its start
                    cause, need_list = "expired", True
                    LOG.info("%s watch at version %s answered 410 Gone; listing again",
                             self.kind, self.version)
                    self._stale()
                    # it never lived: as a watch that ended at once
                    pause = max(self.churn.next(), random.uniform(0.0, RELIST_SPREAD))
                else:
                    cause = "error" if getattr(exc, "status", None) else "connection"
                    self._report(exc)
                    pause = max(self._young_pause(), _retry_after(exc) or self.backoff.next())
            except Exception:  # noqa: BLE001 - the watch thread must not die
                LOG.exception("%s watch failed unexpectedly", self.kind)
                cause, pause = "error", self.backoff.next()
            if state.stopping.is_set():
                break
            if self._watching:  # a failed LIST is no watch of its own
                self._count_reopen(cause)
            if pause > 0:
                self._pause(pause)

    def _young_pause(self) -> float:
        """A watch that got its answer and ended within :data:`YOUNG_WATCH` without news backs
        off on its own scale (a server that ends every watch at once must not get a loop);
        one that lived resets it."""
        if self._opened is None:
            return 0.0
        if not self._news and time.monotonic() - self._opened < YOUNG_WATCH:
            return self.churn.next()
        self.churn.reset()
        return 0.0

    def _count_reopen(self, cause: str) -> None:
        with self.state.cond:
            key = (self.kind, cause)
            self.state.reopens[key] = self.state.reopens.get(key, 0) + 1

    def _pause(self, seconds: float) -> None:
        """Wait; :meth:`WatchState.stop` or a reader's wake-up ends it early."""
        wake = self.state.wake[self.kind]
        wake.wait(seconds)
        wake.clear()

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

    # ---- lists ---------------------------------------------------------------------------------

    def _list(self) -> None:
        """List into the store (replacing it) and remember the list's version."""
        wanted = "" if self.version_unavailable else (self.version or "0")
        try:
            fresh, version = self._read_pages(wanted)
        except self.config.request_errors() as exc:
            if wanted == "" or not (_gone(exc) or _too_large_error(exc)):
                raise
            LOG.info("the API server cannot list %s at version %s (%s); listing them "
                     "consistently", self.kind, wanted, getattr(exc, "status", exc))
            self.version_unavailable = True
            wanted = ""
            fresh, version = self._read_pages(wanted)
        self.version_unavailable = False
        with self.state.cond:
            self.store.clear()
            self.store.update(fresh)
            self.state.synced[self.kind] = self.state.listed[self.kind] = True
            self._recovered()
            self.state.cond.notify_all()
        self.version = version
        LOG.debug("listed %d %s at version %s (asked for %s)", len(fresh), self.kind, version,
                  repr(wanted) if wanted else "a consistent read")

    def _read_pages(self, wanted: str) -> Tuple[Dict[Key, Any], str]:
        """The objects of a (paged) list at ``wanted`` and the list's version, as client-go's
        pager reads it: ``limit`` only where the cache ignores it or etcd serves it ("0", "");
        an expired ``continue`` token: the whole list at ``wanted`` once."""
        query: Dict[str, Any] = {"resourceVersion": wanted} if wanted else {}
        if wanted in ("", "0"):
            query["limit"] = LIST_PAGE
        fresh: Dict[Key, Any] = {}
        version: Optional[str] = None
        while True:
            try:
                data = self._get_json(query)
            except self.config.request_errors() as exc:
                if "continue" not in query or not _gone(exc):
                    raise
                LOG.info("the %s list's continue token expired; listing them whole", self.kind)
                fresh.clear()
                whole = {"resourceVersion": wanted} if wanted else {}
                data = self._get_json(whole)
                version = None
                query = whole
            meta = data.get("metadata") or {}
            if version is None:
                version = str(meta.get("resourceVersion") or "")
            for item in data.get("items") or []:
                fresh[key_of(item)] = self.trim(item)
            token = meta.get("continue") if "limit" in query else ""
            if not token:
                return fresh, version
            query = {"limit": LIST_PAGE, "continue": token}

    def _get_json(self, query: Dict[str, Any]) -> Obj:
        response = self.send(query, max(30.0, self.request_timeout), None)
        try:
            data = json.loads(response.data)
        finally:
            response.release_conn()
        self.backoff.reset()  # the first answer ends the backoff
        return data if isinstance(data, dict) else {}

    # ---- watches -------------------------------------------------------------------------------

    def _silence_bound(self, timeout_seconds: int) -> float:
        if self.watch_idle is not None:
            return self.watch_idle
        return (timeout_seconds or WATCH_TIMEOUT_SECONDS[1]) + WATCH_SILENCE_MARGIN

    def _watch(self) -> str:
        """Follow one watch stream until it ends: "ended" by the server, or "silence"."""
        state = self.state
        timeout_seconds = random.randint(*WATCH_TIMEOUT_SECONDS)
        query = {"watch": True, "resourceVersion": self.version, "allowWatchBookmarks": True,
                 "timeoutSeconds": timeout_seconds}
        silence = self._silence_bound(timeout_seconds)
        self._watching = True
        response = self.send(query, self.request_timeout, silence)
        self._opened = time.monotonic()
        self.backoff.reset()
        with state.cond:
            state.open_watches[self.kind] = response
            self._recovered()
        if state.stopping.is_set():
            shutdown_response(response)
        completed = False
        try:
            for event in watch_events(response):
                self._apply(event)
            completed = True
        except IdleTimeout:
            if state.stopping.is_set():
                raise
            LOG.info("the %s watch sent nothing for %.0fs; resuming it from version %s",
                     self.kind, silence, self.version)
            return "silence"
        finally:
            with state.cond:
                state.open_watches.pop(self.kind, None)
            if completed:
                response.release_conn()  # a cleanly ended stream leaves a reusable connection
            else:
                response.close()
        return "ended"

    def _apply(self, event: Obj) -> None:
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            code, message = int(obj.get("code") or 500), str(obj.get("message", ""))
            if _too_large(obj):
                raise TooLarge(message or f"ERROR event {code}")
            if code == 410:
                raise Expired(message or f"ERROR event {code}")
            error = WatchError(code, message, str(obj.get("reason", "")))
            error.retry_after = (obj.get("details") or {}).get("retryAfterSeconds")
            raise error
        self._news = True
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if etype == "BOOKMARK":
            self.version = new_version or self.version
            return
        key = key_of(obj)
        trimmed = self.trim(obj) if etype in ("ADDED", "MODIFIED") else None  # outside the lock
        with self.state.cond:
            if etype == "DELETED":
                self.store.pop(key, None)
            elif trimmed is not None:
                self.store[key] = trimmed
            self._recovered()
            self.state.cond.notify_all()
        self.version = new_version or self.version


def _too_large(status: Obj) -> bool:
    """kube-apiserver's "Too large resource version": its history starts after ours."""
    causes = (status.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "ResourceVersionTooLarge" for c in causes if
               isinstance(c, dict)) or "too large resource version" in \
        str(status.get("message", "")).lower()


def _status_of(exc: BaseException) -> Obj:
    status_object = getattr(exc, "status_object", None)
    return status_object() if callable(status_object) else {}


def _too_large_error(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 504 and _too_large(_status_of(exc))


def _gone(exc: BaseException) -> bool:
    """410: Expired (or Gone, as servers before 1.18 said)."""
    return getattr(exc, "status", None) == 410


def _retry_after(exc: BaseException) -> Optional[float]:
    """Seconds the server asked us to wait (Retry-After, or the Status's retryAfterSeconds),
    with a little jitter so that the nodes it told the same do not come back together."""
    value: Any = None
    headers = getattr(exc, "headers", None) or {}
    for name, text in headers.items():
        if name.lower() == "retry-after":
            value = text
    if value is None:
        value = getattr(exc, "retry_after", None)
    if value is None:
        value = (_status_of(exc).get("details") or {}).get("retryAfterSeconds")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None  # absent, or an HTTP date (kube-apiserver sends seconds)
    if seconds <= 0:
        return None
    return min(seconds, RETRY_AFTER_MAX) * random.uniform(1.0, 1.2)


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
