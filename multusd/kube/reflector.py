"""List+watch reflectors, one cache each, reading the API server as client-go's reflector does.

A reflector reads the whole state into its cache, then watches from that state's
resourceVersion, until it is stopped. Every read is served from the API server's watch cache,
never from etcd unless the server asks for it.

*One request per resource where the server streams lists (WatchList, KEP-3157).* The first
sync asks for ``watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan`` with
``resourceVersion=0``: any state the watch cache holds, at once (client-go's form without a
version waits for the cache to catch up with etcd, which a server whose etcd cannot answer
progress requests refuses); a relist asks for the last version this reflector synced to (not
older than what it has seen: never back in time). Its ADDED events, and the changes a server
of 1.27-1.31 may send before the end, build a fresh state that replaces the cache when the
bookmark annotated ``k8s.io/initial-events-end`` arrives; until then the cache stays as it was
(not synced, if known stale), as during a LIST. The stream then goes on as the watch.

*Else LIST then WATCH, for the life of the process* (:attr:`~multusd.kube.watchstream.WatchState.watch_list`, shared by
the reflectors of one server; logged once), where the server does not stream lists; the pod
reflector finds out, and the NAD reflector waits for its verdict (at most
:data:`VERDICT_WAIT`), so that such a server is asked once per start, not once per resource:

* it refuses the request: 422 Invalid, "sendInitialEvents: Forbidden: sendInitialEvents is
  forbidden for watch unless the WatchList feature gate is enabled" (1.27-1.31 and 1.33, whose
  gate is off by default) or "resourceVersionMatch: Forbidden: resourceVersionMatch is
  forbidden for watch" (1.19-1.26); or 400 (a proxy that does not take it);
* it refuses it in the stream: 1.31 and later over an etcd that cannot answer progress
  requests (before 3.4.31, or 3.5.0-3.5.12) send one ERROR event, 500 "a watch stream was
  requested by the client but the required storage feature RequestWatchProgress is disabled";
* it ignores it (before 1.19): a plain watch from 0 sends the state as ADDED events but never
  the end bookmark, which must come within :data:`WATCHLIST_END_WAIT` of the stream's answer
  or of its last ADDED event. A server that streams lists sends it right after them (1.27-1.31:
  at its next bookmark tick, about a second later), having waited for its cache (at most 3 s)
  before it answered; one that ignores the parameters sends its first bookmark after a minute.
  Where a WatchList worked before, a late end bookmark is a stalled stream, asked again.

Any other failure of a WatchList backs off as that of any request.

*Lists.* The first asks for ``resourceVersion=0`` (pages of :data:`LIST_PAGE` with
``continue`` where the server pages, as a watch cache not yet ready does); a relist for the
last version synced to. Only when the server answers that this version is unavailable (410
Expired, or 504 "Too large resource version", also as an ERROR event of a WatchList) it lists
consistently (``resourceVersion`` unset: a read from etcd, paged; a consistent WatchList would
wait for the cache to catch up, which a server without progress requests cannot do). A
``continue`` token that expired while paging (410) makes it list the whole at the requested
version once, as client-go's pager does. A list replaces the cache, so objects deleted while
no watch could see them leave it.

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

While a cache is known stale (expired, until its relist completes) it does not count as synced
and its readers ask the API server instead. A failing list keeps its HTTP status (404: the
resource type is not installed, 403: forbidden) for the readers to name, and a reader that
finds the API working again can cut the backoff short.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any, Callable, Dict, Optional, Tuple

from multusd.kube.clientconfig import ClientConfig, WatchError
from multusd.kube.objects import Key, Obj, key_of
from multusd.kube.retries import Backoff
from multusd.kube.transport import IdleTimeout
from multusd.kube.watchstream import (Expired, TooLarge, WatchState, answer, gone,
                                      retry_after, shutdown_response, too_large,
                                      too_large_error, watch_events)

LOG = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = (240, 300)  # the server ends a watch after this (random, as client-go)
WATCH_SILENCE_MARGIN = 30.0  # a stream silent this long past its timeoutSeconds is dead
LIST_PAGE = 500  # client-go's pager size
BACKOFF_INITIAL = 0.25
BACKOFF_MAX = 3.0  # a server back after an outage is asked again within this
RELIST_SPREAD = 1.5  # a relist after an expiry waits up to this long (at random)
YOUNG_WATCH = 1.0  # a watch that ends sooner without news ended "at once" (client-go's rule)
# why a watch ended and another was opened (the label of multusd_watch_reopens_total)
REOPEN_CAUSES = ("ended", "expired", "error", "connection", "silence")
# a WatchList's end bookmark comes within this of the stream's start or of its last ADDED event
WATCHLIST_END_WAIT = 5.0
VERDICT_WAIT = WATCHLIST_END_WAIT + 3.0  # the other reflectors wait this long for the first's
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of that bookmark (KEP-3157)
# what a server whose storage cannot answer progress requests says to every WatchList
NO_PROGRESS_REQUESTS = "RequestWatchProgress"

# send(query, timeout, read_timeout) -> the open (streaming) transport Response of a LIST/WATCH
Send = Callable[[Dict[str, Any], float, Optional[float]], Any]


class NoWatchList(Exception):
    """The server does not stream lists (WatchList): it refused the request, refused it in
    the stream, or ignored ``sendInitialEvents`` (no end bookmark in time)."""


class Reflector:
    """List, then watch from the list's resourceVersion, into one cache; forever, until stop.

    :param send: sends the LIST (and with ``watch`` in the query the WATCH) and returns the
        open response (:class:`multusd.kube.transport.Response`).
    :param trim: turns an object dict into what the cache holds.
    :param watch_idle: seconds a watch stream may stay silent before it is resumed anew;
        None: its ``timeoutSeconds`` and :data:`WATCH_SILENCE_MARGIN`.
    :param list_end_wait: seconds a WatchList's end bookmark may take after the stream's
        start or its last ADDED event (:data:`WATCHLIST_END_WAIT`).
    """

    def __init__(self, state: WatchState, kind: str, what: str, send: Send,
                 trim: Callable[[Obj], Any], store: Dict[Key, Any], config: ClientConfig,
                 request_timeout: float, watch_idle: Optional[float] = None,
                 list_end_wait: float = WATCHLIST_END_WAIT) -> None:
        self.state, self.kind, self.what = state, kind, what
        self.send, self.trim, self.store = send, trim, store
        self.config, self.request_timeout = config, request_timeout
        self.watch_idle, self.list_end_wait = watch_idle, list_end_wait
        self.version = ""  # the last version synced to ("": none yet)
        self.version_unavailable = False  # the server said it cannot serve self.version
        # requests that got no answer; reset by any answer
        self.backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        # watches that end at once without news; reset by one that lives
        self.churn = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        self.need_list = True  # the next round reads the whole state (first sync, relist)
        self.initial_events = 0  # events of the last WatchList before its end bookmark
        self._watching = False  # a watch was asked for in this round
        self._opened: Optional[float] = None  # when it got its answer
        self._news = False  # it delivered an event or bookmark

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        state = self.state
        while not state.stopping.is_set():
            self._opened, self._news, self._watching = None, False, False
            try:
                cause = self._sync() if self.need_list else self._watch()
                pause = self._young_pause()
            except Expired as exc:
                cause, self.need_list = "expired", True
                self.version_unavailable = isinstance(exc, TooLarge)
                LOG.info("%s watch at version %s expired (%s); listing again", self.kind,
                         self.version, exc)
                self._stale()
                pause = max(self._young_pause(), random.uniform(0.0, RELIST_SPREAD))
            except WatchError as exc:
                cause, self.need_list = "error", True  # client-go: an error event ends in a LIST
                self._report(exc)
                pause = max(self._young_pause(), retry_after(exc) or 0.0)
            except self.config.request_errors() as exc:
                if state.stopping.is_set():
                    break
                if self._watching and self._opened is None and gone(exc):  # 410 at its start
                    cause, self.need_list = "expired", True
                    LOG.info("%s watch at version %s answered 410 Gone; listing again",
                             self.kind, self.version)
                    self._stale()
                    # it never lived: as a watch that ended at once
                    pause = max(self.churn.next(), random.uniform(0.0, RELIST_SPREAD))
                else:
                    cause = "error" if getattr(exc, "status", None) else "connection"
                    self._report(exc)
                    pause = max(self._young_pause(), retry_after(exc) or self.backoff.next())
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

    def _sync(self) -> str:
        """Read the whole state into the store and follow it: one WatchList where the server
        streams lists, else a LIST, then a watch from its version."""
        if self.state.watch_list is None and self.kind != self.state.prober:
            self._await_verdict()
        if self.state.watch_list is not False and not self.version_unavailable:
            try:
                return self._watch(initial=True)
            except NoWatchList as exc:
                with self.state.cond:
                    first = self.state.set_watch_list(False)
                if first:  # once per process: both reflectors read the same server
                    LOG.info("the API server does not stream lists (WatchList): %s; listing, "
                             "then watching, from now on", exc)
            except TooLarge as exc:
                if not self.need_list:
                    raise  # the watch that followed the initial events: as any watch
                LOG.info("the API server cannot stream %s at version %s (%s); listing them "
                         "consistently", self.kind, self.version, exc)
                self.version_unavailable = True
        self._list()
        return self._watch()

    def _await_verdict(self) -> None:
        """Let the first reflector find out whether the server streams lists: where it does
        not, that costs the server one refused request, not one per resource. Bounded (a
        first reflector whose requests fail says nothing): then this one asks itself."""
        with self.state.cond:
            self.state.cond.wait_for(lambda: self.state.watch_list is not None or
                                     self.state.stopping.is_set(), VERDICT_WAIT)

    def _install(self, fresh: Dict[Key, Any], version: str) -> None:
        """Replace the store by a complete state read at ``version``."""
        with self.state.cond:
            self.store.clear()
            self.store.update(fresh)
            self.state.synced[self.kind] = self.state.listed[self.kind] = True
            self._recovered()
            self.state.cond.notify_all()
        self.version = version
        self.need_list = False

    def _list(self) -> None:
        """List into the store (replacing it) and remember the list's version."""
        wanted = "" if self.version_unavailable else (self.version or "0")
        try:
            fresh, version = self._read_pages(wanted)
        except self.config.request_errors() as exc:
            if wanted == "" or not (gone(exc) or too_large_error(exc)):
                raise
            LOG.info("the API server cannot list %s at version %s (%s); listing them "
                     "consistently", self.kind, wanted, getattr(exc, "status", exc))
            self.version_unavailable = True
            wanted = ""
            fresh, version = self._read_pages(wanted)
        self.version_unavailable = False
        self._install(fresh, version)
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
                if "continue" not in query or not gone(exc):
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

    def _watch(self, initial: bool = False) -> str:
        """Follow one watch stream until it ends: "ended" by the server, or "silence".

        With ``initial`` it is a WatchList: its initial events build a fresh state that
        replaces the store when the bookmark that ends them arrives (:meth:`_initial`), and
        the stream goes on as the watch. :raises NoWatchList: the server does not stream
        lists (see the module docstring)."""
        state = self.state
        timeout_seconds = random.randint(*WATCH_TIMEOUT_SECONDS)
        query: Dict[str, Any] = {"watch": True}
        if initial:  # "any version the cache holds", or not older than the last synced one
            query.update(sendInitialEvents=True, resourceVersionMatch="NotOlderThan")
        query.update(resourceVersion=self.version or ("0" if initial else ""),
                     allowWatchBookmarks=True, timeoutSeconds=timeout_seconds)
        silence = self._silence_bound(timeout_seconds)
        self._watching = True
        self._opened, self._news = None, False
        try:
            response = self.send(query, self.request_timeout,
                                 self.list_end_wait if initial else silence)
        except self.config.request_errors() as exc:
            if initial and (getattr(exc, "status", None) in (400, 422) or
                            NO_PROGRESS_REQUESTS in answer(exc)):
                raise NoWatchList(f"{self.what}: answered {answer(exc)}") from exc
            raise
        self._opened = time.monotonic()
        self.backoff.reset()
        with state.cond:
            state.open_watches[self.kind] = response
            self._recovered()
        if state.stopping.is_set():
            shutdown_response(response)
        fresh: Optional[Dict[Key, Any]] = {} if initial else None
        last_added, self.initial_events = self._opened, 0
        completed = False
        try:
            for event in watch_events(response):
                if fresh is None:
                    self._apply(event)
                    continue
                if event.get("type") == "ADDED":
                    last_added = time.monotonic()
                elif event.get("type") in ("MODIFIED", "DELETED") and \
                        time.monotonic() - last_added > self.list_end_wait:
                    raise IdleTimeout()  # changes, but no end of the initial events in time
                if self._initial(event, fresh):
                    fresh = None
                    response.set_read_timeout(silence)
            completed = True
        except IdleTimeout:
            if state.stopping.is_set():
                raise
            if fresh is not None:
                return self._no_end()
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

    def _initial(self, event: Obj, fresh: Dict[Key, Any]) -> bool:
        """Apply an event of a WatchList's initial phase to ``fresh``; True once the bookmark
        that ends it arrived and ``fresh`` replaced the store. Until then the store stays as
        it is (not synced if it was known stale), as during a LIST. Changes may come before
        that bookmark (servers of 1.27-1.31 send it with their next bookmark tick)."""
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            if NO_PROGRESS_REQUESTS in str(obj.get("message", "")):
                raise NoWatchList(f"{self.what}: answered in the stream "
                                  f"{obj.get('code')} {obj.get('message')}")
            self._apply(event)  # raises, as any ERROR event
        self._news = True
        meta = obj.get("metadata") or {}
        if etype == "BOOKMARK" and (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == \
                "true":
            version = str(meta.get("resourceVersion") or "")
            self._install(dict(fresh), version)
            fresh.clear()
            with self.state.cond:
                if self.state.watch_list is None:
                    self.state.watch_list = True
            LOG.debug("streamed %d %s at version %s", len(self.store), self.kind, version)
            return True
        if etype == "DELETED":
            fresh.pop(key_of(obj), None)
        elif etype in ("ADDED", "MODIFIED"):
            fresh[key_of(obj)] = self.trim(obj)
        self.initial_events += 1  # a bookmark without the annotation counts, changes nothing
        return False

    def _no_end(self) -> str:
        """A WatchList without its end bookmark in time: a server that ignores
        ``sendInitialEvents`` (:class:`NoWatchList`), or, where WatchLists worked before, a
        stream that stalled ("silence": the next round asks again)."""
        with self.state.cond:
            worked = self.state.watch_list is True
        if not worked:
            raise NoWatchList(f"{self.what}: no bookmark ending the initial events within "
                              f"{self.list_end_wait:g}s (it ignores sendInitialEvents)")
        LOG.info("the %s WatchList did not end its initial events within %gs; asking "
                 "again", self.kind, self.list_end_wait)
        return "silence"

    def _apply(self, event: Obj) -> None:
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            code, message = int(obj.get("code") or 500), str(obj.get("message", ""))
            if too_large(obj):
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
