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

Any other failure of a WatchList is a failure as that of any request (below).

*Lists.* The first asks for ``resourceVersion=0`` (pages of :data:`LIST_PAGE` with
``continue`` where the server pages, as a watch cache not yet ready does); a relist for the
last version synced to. Only when the server answers that this version is unavailable (410
Expired, or 504 "Too large resource version") it lists consistently (``resourceVersion``
unset: a read from etcd, paged; a consistent WatchList would wait for the cache to catch up,
which a server without progress requests cannot do), never the same request again: after a
LIST at once, as client-go's ``list``; after a WatchList that said so (also as an ERROR
event) in the next round, after the backoff's wait, as client-go's ``watchList``. A
``continue`` token that expired while paging (410) makes it list the whole at the requested
version once, as client-go's pager does. A list replaces the cache, so objects deleted while
no watch could see them leave it.

*Watches live as long as the server lets them.* Each watch asks for bookmarks and ends after
``timeoutSeconds`` (:data:`WATCH_TIMEOUT_SECONDS`); the server sends a bookmark about once a
minute and one 2 s before that end, and every bookmark or event advances the version the next
watch resumes from. The silence bound of a stream is longer than its ``timeoutSeconds``, so a
healthy quiet watch is always ended by the server; a dead peer is found by the transport's TCP
keep-alive. A watch that expires (HTTP 410 at its start, an ERROR event 410 in the stream: etcd
compacted the history, or the server restarted with a new watch cache) leads to a relist at the
last version; "too large resource version" (a
server whose history restarted below ours) to a consistent list; any other ERROR event to a
relist. Every end of a watch is counted by cause (:data:`REOPEN_CAUSES`).

*One backoff for every way back to the server* (architecture invariant 9):
:mod:`multusd.kube.rounds` says how a round ends, what the next one asks for and how long it
waits (a watch's 410 after a working watch: a relist at once; a server that is starting: asked
again on the curve's first step, with a relist).

While a cache is known stale (expired, until its relist completes) it does not count as synced
and its readers ask the API server instead (they do not wait for it). A failing list keeps its
HTTP status (404: the resource type is not installed, 403: forbidden) for the readers to name,
and a reader that finds the API answering again may end one wait of the NAD reflector early
(:meth:`Reflector._pause`: once per run of failures).
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any, Callable, Dict, Optional, Tuple

from multusd.kube import failures
from multusd.kube.clientconfig import ClientConfig, WatchError
from multusd.kube.failures import NoWatchList, Unfinished
from multusd.kube.objects import Key, Obj, key_of
from multusd.kube.retries import API_SERVER, Delays, retry_after_seconds
from multusd.kube.rounds import REOPEN_CAUSES, YOUNG_WATCH, Outcome, Rounds
from multusd.kube.transport import IdleTimeout
from multusd.kube.watchstream import (Expired, TooLarge, WatchState, answer, gone,
                                      shutdown_response, too_large, watch_events)

__all__ = ["Reflector", "Outcome", "NoWatchList", "REOPEN_CAUSES", "YOUNG_WATCH"]

LOG = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = (240, 300)  # the server ends a watch after this (random, as client-go)
WATCH_SILENCE_MARGIN = 30.0  # a stream silent this long past its timeoutSeconds is dead
LIST_PAGE = 500  # client-go's pager size
# a WatchList's end bookmark comes within this of the stream's start or of its last ADDED event
WATCHLIST_END_WAIT = 5.0
VERDICT_WAIT = WATCHLIST_END_WAIT + 3.0  # the other reflectors wait this long for the first's
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of that bookmark (KEP-3157)
# what a server whose storage cannot answer progress requests says to every WatchList
NO_PROGRESS_REQUESTS = "RequestWatchProgress"

# send(query, timeout, read_timeout) -> the open (streaming) transport Response of a LIST/WATCH
Send = Callable[[Dict[str, Any], float, Optional[float]], Any]


class Reflector(Rounds):
    """List, then watch from the list's resourceVersion, into one cache; forever, until stop.

    :param send: sends the LIST (and with ``watch`` in the query the WATCH) and returns the
        open response (:class:`multusd.kube.transport.Response`).
    :param trim: turns an object dict into what the cache holds.
    :param watch_idle: seconds a watch stream may stay silent before it is resumed anew;
        None: its ``timeoutSeconds`` and :data:`WATCH_SILENCE_MARGIN`.
    :param list_end_wait: seconds a WatchList's end bookmark may take after the stream's
        start or its last ADDED event (:data:`WATCHLIST_END_WAIT`).
    :param delays: the state of its one backoff (default: a fresh one of
        :data:`~multusd.kube.retries.API_SERVER`; a test passes one on its own clock).
    """

    def __init__(self, state: WatchState, kind: str, what: str, send: Send,
                 trim: Callable[[Obj], Any], store: Dict[Key, Any], config: ClientConfig,
                 request_timeout: float, watch_idle: Optional[float] = None,
                 list_end_wait: float = WATCHLIST_END_WAIT, *,
                 delays: Optional[Delays] = None) -> None:
        self.state, self.kind, self.what = state, kind, what
        self.send, self.trim, self.store = send, trim, store
        self.config, self.request_timeout = config, request_timeout
        self.watch_idle, self.list_end_wait = watch_idle, list_end_wait
        self.delays = delays if delays is not None else API_SERVER.delays()
        self.version = ""  # the last version synced to ("": none yet)
        self.version_unavailable = False  # the server said it cannot serve self.version
        self.need_list = True  # the next round reads the whole state (first sync, relist)
        self.initial_events = 0  # events of the last WatchList before its end bookmark
        self._watching = False  # a watch was asked for in this round
        self._opened: Optional[float] = None  # when it got its answer
        self._following: Optional[float] = None  # when it began following changes
        self._woken: Optional[int] = None  # the run of failures a reader's wake-up cut short
        self._served = False  # the server answered a list or watch of this reflector once
        # a watch's expiry may be relisted at once: a watch has worked since the last that was
        self._relist_at_once = True

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
                raise  # a failure as any: the LIST follows after the backoff's wait
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
        self.version_unavailable = False
        self._served = True

    def _list(self) -> None:
        """List into the store (replacing it) and remember the list's version. A version the
        server cannot serve (410, too large) is listed from the current state at once, as
        client-go's ``list`` does: another request, never the same one again."""
        wanted = "" if self.version_unavailable else (self.version or "0")
        try:
            fresh, version = self._read_pages(wanted)
        except self.config.request_errors() as exc:
            if wanted == "" or failures.kind_of(exc) not in (failures.EXPIRED,
                                                            failures.TOO_LARGE):
                raise
            LOG.info("the API server cannot list %s at version %s (%s); listing them "
                     "consistently", self.kind, wanted, getattr(exc, "status", exc))
            self.version_unavailable, wanted = True, ""
            fresh, version = self._read_pages(wanted)
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
        return data if isinstance(data, dict) else {}

    # ---- watches -------------------------------------------------------------------------------

    def _silence_bound(self, timeout_seconds: int) -> float:
        if self.watch_idle is not None:
            return self.watch_idle
        return (timeout_seconds or WATCH_TIMEOUT_SECONDS[1]) + WATCH_SILENCE_MARGIN

    def _watch(self, initial: bool = False) -> str:
        """Follow one watch stream until the server ends it ("ended").

        With ``initial`` it is a WatchList: its initial events build a fresh state that
        replaces the store when the bookmark that ends them arrives (:meth:`_initial`), and
        the stream goes on as the watch. :raises NoWatchList: the server does not stream
        lists (see the module docstring); :raises IdleTimeout: the stream fell silent (a
        WatchList: no end of its initial events in time, where WatchLists worked before)."""
        state = self.state
        timeout_seconds = random.randint(*WATCH_TIMEOUT_SECONDS)
        query: Dict[str, Any] = {"watch": True}
        if initial:  # "any version the cache holds", or not older than the last synced one
            query.update(sendInitialEvents=True, resourceVersionMatch="NotOlderThan")
        query.update(resourceVersion=self.version or ("0" if initial else ""),
                     allowWatchBookmarks=True, timeoutSeconds=timeout_seconds)
        silence = self._silence_bound(timeout_seconds)
        self._watching = True
        self._opened = self._following = None
        try:
            response = self.send(query, self.request_timeout,
                                 self.list_end_wait if initial else silence)
        except self.config.request_errors() as exc:
            if initial and (getattr(exc, "status", None) in (400, 422) or
                            NO_PROGRESS_REQUESTS in answer(exc)):
                raise NoWatchList(f"{self.what}: answered {answer(exc)}") from exc
            raise
        self._opened = time.monotonic()
        self._following = None if initial else self._opened
        self._served = True
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
                    fresh, self._following = None, time.monotonic()
                    response.set_read_timeout(silence)
            completed = True
        except IdleTimeout:
            if fresh is not None and not state.stopping.is_set():
                self._no_end()
            raise
        finally:
            with state.cond:
                state.open_watches.pop(self.kind, None)
            if completed:
                response.release_conn()  # a cleanly ended stream leaves a reusable connection
            else:
                response.close()
        if fresh is not None:  # ended cleanly before its initial events did
            raise Unfinished(f"{self.what}: the WatchList ended before its initial events did")
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

    def _no_end(self) -> None:
        """A WatchList without its end bookmark in time: a server that ignores
        ``sendInitialEvents`` (:class:`NoWatchList`), or, where WatchLists worked before, a
        stream that stalled (the caller raises IdleTimeout: the next round asks again)."""
        with self.state.cond:
            worked = self.state.watch_list is True
        if not worked:
            raise NoWatchList(f"{self.what}: no bookmark ending the initial events within "
                              f"{self.list_end_wait:g}s (it ignores sendInitialEvents)")

    def _apply(self, event: Obj) -> None:
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            code, message = int(obj.get("code") or 500), str(obj.get("message", ""))
            error: Exception
            if too_large(obj):
                error = TooLarge(message or f"ERROR event {code}")
            elif code == 410:
                error = Expired(message or f"ERROR event {code}")
            else:
                error = WatchError(code, message, str(obj.get("reason", "")))
            # the Status's retryAfterSeconds, by the one rule of a Retry-After
            error.retry_after = retry_after_seconds(  # type: ignore[attr-defined]
                (obj.get("details") or {}).get("retryAfterSeconds"))
            raise error
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
