"""The stand-in API server's reads as kube-apiserver serves them: its watch cache, or etcd.

Mixed into tests/kubeapi.py's :class:`FakeKubeAPI` (:class:`ReadPaths`). What decides where
a LIST is read from, as kube-apiserver (v1.34/v1.35, with an etcd that cannot answer
progress requests, so no consistent read from the cache) decides it
(:func:`kubeclients.read_source`, the one statement of the rule, which the per-client
ledger uses too):

* ``resourceVersion=0`` and ``resourceVersion=N`` without ``limit`` (or with
  ``resourceVersionMatch=NotOlderThan``) are **watch-cache reads**: the cache's state, which may
  be older than the newest write (:meth:`ReadPaths.hold_watch_cache`); ``limit`` is ignored
  for ``0``, as the cacher does. A version the cache has not reached is waited for
  (:attr:`ReadPaths.too_large_wait`, 3 s on the real server), then answered 504 Timeout
  "Too large resource version" (cause ResourceVersionTooLarge, Retry-After 1);
* ``resourceVersion`` unset is a **consistent read from etcd** (a storage list), and so are
  ``resourceVersionMatch=Exact`` and the legacy exact form (``resourceVersion=N`` with
  ``limit``); these honour ``limit`` and answer ``continue`` tokens, whose version etcd may
  have compacted away since (410 Expired, with kube-apiserver's message);
* a watch cache that is not ready (right after an API server start,
  :attr:`ReadPaths.watch_cache_ready` False, or a restart's ``warm_up``) answers cache reads and watches 429 with
  Retry-After, except a list without selectors with ``limit``, which goes to etcd.

Every list answered is recorded in :attr:`ReadPaths.list_reads` as (kind, "cache" or
"storage", objects returned, objects read): a storage list of pods with a field selector
reads every pod of the cluster, as ``apiserver_storage_list_fetched_objects_total`` counts;
every read of the whole state (a LIST or a WatchList) and every watch asked for, with its
arrival time, in :attr:`ReadPaths.read_log`.
Faults of its own: :meth:`ReadPaths.hold_watch_cache`, :attr:`ReadPaths.watch_cache_ready`,
:attr:`ReadPaths.between_pages` (a write and a compaction between two pages),
:attr:`ReadPaths.watch_timeout_cap` (watches that end sooner), :meth:`ReadPaths.error_storm`
(every watch ends with an ERROR event for a while, as when etcd changes leader).

Every LIST, WatchList and watch asked for is booked on arrival, before authentication or an
injected failure, per resource: :meth:`ReadPaths.count_list_watch` (in a time window).

Watches are served from the same cache: they deliver nothing newer than it has seen, and with
``allowWatchBookmarks`` get a BOOKMARK about every :attr:`ReadPaths.bookmark_interval` seconds
(60 on the real server) and one 2 s before their ``timeoutSeconds``, each carrying the cache's
newest version, sent only when that is newer than the last the watcher got.

A WatchList (``watch`` with ``sendInitialEvents=true``, KEP-3157) is a cache read too
(:meth:`ReadPaths._initial_events`, recorded in :attr:`ReadPaths.list_reads`): with
``resourceVersion=0`` the cache's state as it is (it may lag), with ``N`` once the cache has
reached N (else, after :attr:`ReadPaths.too_large_wait`, an ERROR event "Too large resource
version"), unset once it has reached the newest write; as ADDED events, then the BOOKMARK
annotated ``k8s.io/initial-events-end``. Its options are validated as kube-apiserver does (422
Invalid); :attr:`ReadPaths.watch_list` makes it answer as servers that do not stream lists.
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import kubeclients

Obj = Dict[str, Any]
Key = Tuple[str, str]
Entry = Tuple[int, str, str, Optional[Obj], Optional[Obj]]
# what kube-apiserver ends every watch with while etcd elects a new leader
LEADER_CHANGED = "Internal error occurred: etcdserver: leader changed"

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list.")


class History:
    """Every change, by resourceVersion, for watches to replay and for reads at an older
    revision; etcd compacts it (watches and reads below :attr:`compacted` get 410)."""

    def __init__(self) -> None:
        self.entries: List[Entry] = []
        self.versions: List[int] = []  # of the entries, in order
        self.compacted = 0

    def record(self, rv: int, kind: str, etype: str, old: Optional[Obj],
               new: Optional[Obj]) -> None:
        self.entries.append((rv, kind, etype, copy.deepcopy(old), copy.deepcopy(new)))
        self.versions.append(rv)

    def since(self, rv: int, upto: Optional[int] = None) -> List[Entry]:
        """The changes after ``rv`` (and not after ``upto``), oldest first."""
        first = bisect.bisect_right(self.versions, rv)
        last = len(self.versions) if upto is None else bisect.bisect_right(self.versions, upto)
        return self.entries[first:last]

    def compact(self, upto: int, keep_after: Optional[int] = None) -> None:
        """Compact at ``upto``; entries after ``keep_after`` stay (a watch cache that has not
        seen them yet still delivers them, as the real one holds its own copy)."""
        first = bisect.bisect_right(self.versions, upto if keep_after is None
                                    else min(upto, keep_after))
        del self.entries[:first], self.versions[:first]
        self.compacted = upto


def key_of(obj: Obj) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


class ReadPaths:
    """The watch cache and etcd reads of :class:`FakeKubeAPI` (mixed in); test controls."""

    #: False: as right after an API server start, before its watch cache is initialised
    watch_cache_ready = True
    #: seconds a cache read at a version the cache has not reached waits before its 504
    too_large_wait = 3.0
    #: seconds between the bookmarks of a quiet watch (kube-apiserver: one minute)
    bookmark_interval = 60.0
    #: the longest a watch lasts whatever its timeoutSeconds (a proxy that ends them sooner)
    watch_timeout_cap = float("inf")
    #: called once, after the next page that has a ``continue`` token went out (a test's
    #: write and compaction between two pages)
    between_pages: Optional[Callable[[], None]] = None
    #: how a WatchList is answered: "serve" (1.32, 1.34+ over an etcd that answers progress
    #: requests); "refused" (its WatchList gate off, as 1.27-1.31 and 1.33 by default: 422
    #: Invalid); "no-progress" (1.31+ over an etcd before 3.4.31 or 3.5.0-3.5.12: a 200 stream
    #: of one ERROR event 500); "ignored" (before 1.19, that knew neither parameter: the
    #: request is a plain watch)
    watch_list = "serve"

    def _init_reads(self) -> None:
        self._history = History()
        self._cache_held: Optional[Tuple[int, Dict[str, Dict[Key, Obj]]]] = None
        self.list_reads: List[Tuple[str, str, int, int]] = []
        # (monotonic time, kind, a watch (True) or a read of the whole state: LIST, WatchList)
        self.read_log: List[Tuple[float, str, bool]] = []
        # (monotonic time, kind, "list" | "watchlist" | "watch"): every one asked for, on arrival
        self.list_watch_log: List[Tuple[float, str, str]] = []
        self._storm: Optional[Tuple[float, Obj]] = None  # (until, the ERROR's Status)
        self.storm_errors = 0  # watches opened during an ERROR storm, ended by its event

    # ---- test controls: an ERROR storm ---------------------------------------------------------

    def error_storm(self, seconds: float, *, code: int = 500, reason: str = "InternalError",
                    message: str = LEADER_CHANGED) -> float:
        """For the next ``seconds``, end every watch with an ERROR event carrying this Status
        (kube-apiserver when etcd changes leader): the watches open now at once, and every watch
        (WatchList or plain) that opens meanwhile after it delivered what it would first: the
        initial events and the bookmark ending them, a replay from its version or, with nothing
        to replay, a bookmark. Returns the ``time.monotonic()`` instant the storm ends."""
        until = time.monotonic() + seconds
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}
        with self._cond:  # type: ignore[attr-defined]
            self._storm = (until, status)
            self._expiries += 1  # type: ignore[attr-defined]
            self._expiry = status  # type: ignore[attr-defined]
            self._cond.notify_all()  # type: ignore[attr-defined]
        return until

    def end_error_storm(self) -> None:
        """Watches opened from now on live again."""
        with self._cond:  # type: ignore[attr-defined]
            self._storm = None

    def count_list_watch(self, kind: str, since: float = 0.0, until: float = float("inf"),
                         how: Optional[str] = None) -> int:
        """LISTs, WatchLists and watches of ``kind`` ("pods", "nads") that arrived in [since,
        until) (``time.monotonic()``), whatever their answer; ``how``: only "list",
        "watchlist" or "watch"."""
        with self._cond:  # type: ignore[attr-defined]
            return sum(1 for at, k, h in self.list_watch_log
                       if k == kind and since <= at < until and (how is None or h == how))

    def _book_list_watch(self, method: str, path: str, query: Dict[str, str]) -> None:
        """Book a request on arrival if it lists or watches pods or NADs (_cond held)."""
        resource, _, how = kubeclients.request_kind(method, path, query).partition(" ")
        if resource in ("pods", "nads") and how in ("list", "watchlist", "watch"):
            self.list_watch_log.append((time.monotonic(), resource, how))

    def _storm_status(self) -> Optional[Obj]:
        """The ERROR Status that ends a watch now, while a storm lasts (_cond held)."""
        if self._storm is None or time.monotonic() >= self._storm[0]:
            return None
        return copy.deepcopy(self._storm[1])

    # ---- test controls ---------------------------------------------------------------------

    def hold_watch_cache(self) -> int:
        """The watch cache stops following writes (it lags behind etcd): cache reads answer the
        state of now, and watches deliver nothing newer, until :meth:`release_watch_cache`.
        Returns the version it holds."""
        with self._cond:  # type: ignore[attr-defined]
            stores = {"pods": self._pods, "nads": self._nads}  # type: ignore[attr-defined]
            self._cache_held = (self._rv, {kind: copy.deepcopy(store)  # type: ignore
                                           for kind, store in stores.items()})
            return self._rv  # type: ignore[attr-defined]

    def release_watch_cache(self) -> None:
        """The watch cache catches up with every write (and keeps following them)."""
        with self._cond:  # type: ignore[attr-defined]
            self._cache_held = None
            self._cond.notify_all()  # type: ignore[attr-defined]

    def count_list_reads(self, kind: str, source: Optional[str] = None) -> int:
        """How many lists of ``kind`` ("pods", "nads") were answered from ``source``
        ("cache", "storage"; None: either)."""
        with self._cond:  # type: ignore[attr-defined]
            return sum(1 for k, s, _, _ in self.list_reads
                       if k == kind and (source is None or s == source))

    def storage_objects_read(self, kind: str) -> int:
        """Objects of ``kind`` read from etcd by lists so far."""
        with self._cond:  # type: ignore[attr-defined]
            return sum(read for k, s, _, read in self.list_reads if k == kind and s == "storage")

    # ---- where a list is read from (all called with _cond held) ----------------------------

    def _cache_ready(self) -> bool:
        """The watch cache serves reads and watches: :attr:`watch_cache_ready`, and not
        initialising after a restart (tests/kubefaults.py's ``warm_up``)."""
        return self.watch_cache_ready and self._warming() != "storage"  # type: ignore


    def _error(self, code: int, reason: str, message: str, details: Optional[Obj] = None) -> Any:
        """tests/kubeapi.py's ApiError (its module, whatever name it was imported under)."""
        return sys.modules[type(self).__module__].ApiError(code, reason, message, details)

    def _horizon(self) -> int:
        """The newest version the watch cache has seen."""
        return self._rv if self._cache_held is None else self._cache_held[0]  # type: ignore

    def _cache_objects(self, kind: str, store: Dict[Key, Obj]) -> Dict[Key, Obj]:
        return store if self._cache_held is None else self._cache_held[1].get(kind, {})

    def _state_at(self, kind: str, store: Dict[Key, Obj], rv: int) -> Dict[Key, Obj]:
        """The objects of ``kind`` as etcd had them at revision ``rv`` (not compacted)."""
        state = dict(store)
        for _, entry_kind, _, old, new in reversed(self._history.since(rv)):
            if entry_kind != kind:
                continue
            key = key_of(new if new is not None else old)  # type: ignore[arg-type]
            if old is None:
                state.pop(key, None)
            else:
                state[key] = old
        return state

    def _answer_list(self, kind: str, store: Dict[Key, Obj], selector: Any,
                     query: Dict[str, str], selects: bool) -> Tuple[List[Obj], Obj]:
        """(items, list metadata) of a LIST, read where kube-apiserver reads it."""
        rv = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        limit = int(query.get("limit") or 0)
        token = query.get("continue", "")
        if match not in ("", "NotOlderThan", "Exact"):
            raise self._error(422, "Invalid", f"resourceVersionMatch: Unsupported value: {match!r}")
        if match and not rv:
            raise self._error(422, "Invalid", "resourceVersionMatch: Forbidden: "
                              "resourceVersionMatch is forbidden unless resourceVersion is provided")
        if token:
            if rv:
                raise self._error(400, "BadRequest", "specifying resource version is not "
                                  "allowed when using continue")
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                at, after = int(decoded["rv"]), tuple(decoded["start"])
            except (ValueError, KeyError, TypeError):
                raise self._error(400, "BadRequest", "continue key is not valid") from None
            if at < self._history.compacted:
                raise self._error(410, "Expired", CONTINUE_EXPIRED)
            return self._storage_list(kind, store, selector, at, limit, after)
        if kubeclients.read_source("GET", query) == kubeclients.STORAGE:
            return self._storage_list(kind, store, selector, int(rv) if rv else None, limit, None)
        if not self._cache_ready():  # the cacher delegates only what etcd pages cheaply
            if not selects and limit:
                return self._storage_list(kind, store, selector, None, limit, None)
            raise self._error(429, "TooManyRequests", "storage is (re)initializing",
                              {"retryAfterSeconds": 1})
        wanted = int(rv)
        if wanted > self._horizon():
            self._cond.wait_for(lambda: self._horizon() >= wanted,  # type: ignore[attr-defined]
                                self.too_large_wait)
            if wanted > self._horizon():
                raise self._error(504, "Timeout", f"Timeout: Too large resource version: "
                                  f"{wanted}, current: {self._horizon()}", _too_large_details())
        items = [copy.deepcopy(o) for o in self._cache_objects(kind, store).values()
                 if selector.matches(o)]
        self.list_reads.append((kind, "cache", len(items), len(items)))
        return items, {"resourceVersion": str(self._horizon())}

    def _watch_list(self, query: Dict[str, str]) -> bool:
        """Whether a watch streams its initial state (WatchList), after kube-apiserver's
        validation of its options (apimachinery's ValidateListOptions: 422 Invalid)."""
        initial, match = query.get("sendInitialEvents", ""), query.get("resourceVersionMatch", "")
        if self.watch_list == "ignored" or not (initial or match):
            return False
        causes: List[Tuple[str, str, str]] = []  # (field, reason, detail)
        if initial and match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueForbidden", "sendInitialEvents "
                           "requires setting resourceVersionMatch to NotOlderThan"))
        if initial and self.watch_list == "refused":
            causes.append(("sendInitialEvents", "FieldValueForbidden", "sendInitialEvents is "
                           "forbidden for watch unless the WatchList feature gate is enabled"))
        if match and not initial:
            causes.append(("resourceVersionMatch", "FieldValueForbidden", "resourceVersionMatch "
                           "is forbidden for watch unless sendInitialEvents is provided"))
        if not causes:
            return initial.lower() == "true"
        texts = [f"{field}: Forbidden: {detail}" for field, _, detail in causes]
        raise self._error(422, "Invalid", 'ListOptions.meta.k8s.io "" is invalid: ' + (
            texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"),
            {"group": "meta.k8s.io", "kind": "ListOptions",
             "causes": [{"reason": reason, "message": f"Forbidden: {detail}", "field": field}
                        for field, reason, detail in causes]})

    def _initial_events(self, kind: str, store: Dict[Key, Obj], selector: Any,
                        type_meta: Tuple[str, str], requested: str,
                        ) -> Tuple[List[Tuple[str, Obj]], int, bool]:
        """A WatchList's first events (called with _cond held): (events, the version they
        bring the watcher to, whether the stream goes on)."""
        if self.watch_list == "no-progress":  # the cacher's answer (kubernetes #125667)
            return [("ERROR", {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "a watch stream was requested by the client but the required "
                           "storage feature RequestWatchProgress is disabled",
                "reason": "InternalError", "code": 500})], self._rv, False  # type: ignore
        wanted = int(requested) if requested else self._rv  # type: ignore[attr-defined]
        if wanted > self._horizon():
            self._cond.wait_for(lambda: self._horizon() >= wanted,  # type: ignore[attr-defined]
                                self.too_large_wait)
            if wanted > self._horizon():
                return [("ERROR", {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"Timeout: Too large resource version: {wanted}, current: "
                               f"{self._horizon()}", "reason": "Timeout", "code": 504,
                    "details": _too_large_details()})], self._rv, False  # type: ignore
        horizon = self._horizon()
        items = [copy.deepcopy(o) for o in self._cache_objects(kind, store).values()
                 if selector.matches(o)]
        self.list_reads.append((kind, "cache", len(items), len(items)))
        end = bookmark(type_meta, horizon)
        end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
        return [("ADDED", o) for o in items] + [("BOOKMARK", end)], horizon, True

    def _storage_list(self, kind: str, store: Dict[Key, Obj], selector: Any, at: Optional[int],
                      limit: int, after: Optional[Tuple[str, ...]]) -> Tuple[List[Obj], Obj]:
        """etcd: the objects at revision ``at`` (None: the newest), in key order, after key
        ``after``, at most ``limit`` of them; every object looked at counts as read."""
        if at is not None and at < self._history.compacted:
            raise self._error(410, "Expired", f"too old resource version: {at} "
                              f"({self._history.compacted})")
        if at is not None and at > self._rv:  # type: ignore[attr-defined]
            raise self._error(504, "Timeout", f"Timeout: Too large resource version: {at}, "
                              f"current: {self._rv}", _too_large_details())  # type: ignore
        at = self._rv if at is None else at  # type: ignore[attr-defined]
        state = self._state_at(kind, store, at) if at < self._rv else store  # type: ignore
        keys = sorted(key for key in state if after is None or key > after)
        items: List[Obj] = []
        read = 0
        for key in keys:
            if limit and len(items) >= limit:
                break
            read += 1
            if selector.matches(state[key]):
                items.append(copy.deepcopy(state[key]))
        meta: Obj = {"resourceVersion": str(at)}
        if read < len(keys):
            token = {"v": "meta.k8s.io/v1", "rv": at, "start": list(keys[read - 1])}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(keys) - read
        self.list_reads.append((kind, "storage", len(items), read))
        return items, meta


def _too_large_details() -> Obj:
    return {"causes": [{"reason": "ResourceVersionTooLarge",
                        "message": "Too large resource version"}], "retryAfterSeconds": 1}


def next_bookmark(now: float, deadline: float, interval: float) -> Optional[float]:
    """When a watch's next bookmark is due: in ``interval``, or 2 s before its deadline if
    that is sooner; None once that moment has passed (as kube-apiserver schedules them)."""
    due = min(now + interval, deadline - 2.0)
    return due if due > now else None


def bookmark(type_meta: Tuple[str, str], version: int) -> Obj:
    """A BOOKMARK event's object: the kind, and only ``metadata.resourceVersion``."""
    return {"kind": type_meta[0], "apiVersion": type_meta[1],
            "metadata": {"resourceVersion": str(version)}}

