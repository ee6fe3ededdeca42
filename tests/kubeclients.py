"""What each client asked of the stand-in API server: requests, response bytes, cache reads.

kube-apiserver serves a LIST from its watch cache when the client allows an older snapshot
(``resourceVersion=0``, or ``resourceVersionMatch=NotOlderThan`` with a version) or streams it
as WatchList (``watch=true&sendInitialEvents=true``); any other LIST is a storage read, for
which etcd reads every object of the resource (in the namespace, if the LIST names one) and
the server filters them. :func:`read_source` says which a request was, from the request alone,
so that a benchmark measures what a client does and not what it is assumed to do.

:class:`ClientLedger` (``FakeKubeAPI.clients``) keeps, per client (the user its credentials
authenticate as, else ``anonymous <User-Agent>``), every request with its time, kind and
source, and every byte written back, with its time, so that any window can be summed after
the fact (:meth:`ClientLedger.window`). :class:`CountingWriter` wraps a connection's writer and
books what it writes to the request being answered on it.

Each request is also booked when it was served (its answer written whole; a watch once its
initial events are out, after which it is long-running and no longer counts, as in
kube-apiserver's max-in-flight and priority-and-fairness seats) and with the status it was
answered, so a window also says when the client's first successful LIST was served whole
(``first_listed``), and :meth:`ClientLedger.peak_in_flight` how many requests of a set of
clients the server was serving at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

CACHE, STORAGE, WATCH, OTHER = "cache", "storage", "watch", "other"


def read_source(method: str, query: Dict[str, str]) -> str:
    """``cache`` (a LIST the watch cache serves, or a WatchList), ``storage`` (a LIST read
    from etcd), ``watch`` (a watch from a version) or ``other`` (GET of one object, writes),
    by kube-apiserver's rules for ``resourceVersion``, ``resourceVersionMatch`` and ``limit``."""
    if method != "GET":
        return OTHER
    if query.get("watch", "").lower() in ("true", "1"):
        return CACHE if query.get("sendInitialEvents", "").lower() == "true" else WATCH
    version, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if query.get("continue") or not version or match == "Exact":
        return STORAGE  # a consistent list, its pages, or one exact version: from etcd
    if version == "0" or match == "NotOlderThan":
        return CACHE
    # a version without a match: "not older than" when unpaged, "exact" with a limit
    return STORAGE if query.get("limit") else CACHE


class _Client:
    """One client's requests and the bytes written back to it (time, n)."""

    def __init__(self) -> None:
        self.requests: List[Request] = []
        self.writes: List[Tuple[float, int]] = []


class Request:
    """One booked request: when it came, its kind, source, objects read and query; then the
    status it was answered and when it was served (``listed``: a LIST or WatchList served whole
    with its state)."""

    __slots__ = ("time", "kind", "source", "fetched", "query", "client", "status", "served",
                 "listed", "error")

    def __init__(self, time_: float, kind: str, source: str, fetched: int,
                 query: Dict[str, str], client: _Client) -> None:
        self.time, self.kind, self.source, self.fetched = time_, kind, source, fetched
        self.query, self.client = query, client
        self.status: Optional[int] = None
        self.served: Optional[float] = None
        self.listed = False
        self.error: Optional[int] = None  # the code of the ERROR event that ended its stream


class ClientLedger:
    """Per-client requests and response bytes, kept for windows summed after the fact."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._clients: Dict[str, _Client] = {}

    def record(self, client: str, method: str, path: str, query: Dict[str, str],
               stored: Callable[[str], int]) -> Request:
        """Book one request of ``client``; ``stored(path)``: how many objects a storage read
        of that collection fetches. Returns the booking (its ``client`` is for
        :class:`CountingWriter`; :meth:`answered` and :meth:`served` complete it)."""
        collection = method == "GET" and _is_collection(path)
        source = read_source(method, query) if collection else OTHER
        kind = request_kind(method, path, query)
        fetched = stored(path) if source == STORAGE else 0
        with self._lock:
            entry = self._clients.setdefault(client, _Client())
            booked = Request(self.clock(), kind, source, fetched, query, entry)
            entry.requests.append(booked)
        return booked

    def answered(self, request: Optional[Request], status: int) -> None:
        """The status line ``request`` got (the first one counts)."""
        if request is not None:
            with self._lock:
                if request.status is None:
                    request.status = status

    def errored(self, request: Optional[Request], code: int) -> None:
        """A watch stream of ``request`` carried an ERROR event with ``code`` (410 ...)."""
        if request is not None:
            with self._lock:
                request.error = code if request.error is None else request.error

    def answers(self, client: str, start: float = 0.0,
                end: float = float("inf")) -> List[Tuple[float, str, int, Optional[int]]]:
        """What ``client`` asked in [start, end), oldest first: (time, kind, status, the code
        of an ERROR event in its stream or None); status 0 for one not answered yet."""
        with self._lock:
            entry = self._clients.get(client) or _Client()
            return [(r.time, r.kind, r.status or 0, r.error) for r in entry.requests
                    if start <= r.time < end]

    def served(self, request: Optional[Request], listed: bool = False) -> None:
        """``request`` is no longer in flight: its answer was written, it was cut, or (a watch)
        its initial events are out. ``listed``: it delivered a LIST's state whole (a LIST
        answered 200, a WatchList's initial events up to their end)."""
        if request is None:
            return
        with self._lock:
            if request.served is None:
                request.served = self.clock()
                request.listed = listed and request.status == 200 and \
                    request.source in (CACHE, STORAGE)

    def wrote(self, client: Optional[_Client], count: int) -> None:
        if client is not None and count:
            with self._lock:
                client.writes.append((self.clock(), count))

    def clients(self) -> List[str]:
        with self._lock:
            return sorted(self._clients)

    def window(self, client: str, start: float = 0.0,
               end: float = float("inf")) -> Dict[str, Any]:
        """What ``client`` asked and got in [start, end): requests (by kind), LISTs by source,
        objects read from storage, response bytes, when the first request and the first LIST
        came and when the first successful LIST was served whole (``first_listed``: a LIST
        asked in the window; the ledger's clock; per resource in ``first_listed_by_resource``),
        and each request's (time, kind, query) in ``trace``."""
        with self._lock:
            entry = self._clients.get(client) or _Client()
            requests = [r for r in entry.requests if start <= r.time < end]
            sent = sum(n for t, n in entry.writes if start <= t < end)
            listed = sorted((r.served, r.kind.partition(" ")[0]) for r in requests
                            if r.listed and r.served is not None)
        by_kind: Dict[str, int] = {}
        sources = {CACHE: 0, STORAGE: 0, WATCH: 0, OTHER: 0}
        for request in requests:
            by_kind[request.kind] = by_kind.get(request.kind, 0) + 1
            sources[request.source] += 1
        return {"requests": len(requests), "bytes": sent, "by_kind": by_kind,
                "cache_lists": sources[CACHE], "storage_lists": sources[STORAGE],
                "watches": sources[WATCH], "storage_objects": sum(r.fetched for r in requests),
                "first": requests[0].time if requests else None,
                "first_list": next((r.time for r in requests if r.source in (CACHE, STORAGE)),
                                   None),
                "first_listed": listed[0][0] if listed else None,
                "first_listed_by_resource": {resource: at for at, resource in reversed(listed)},
                "trace": [(r.time, r.kind, r.query) for r in requests]}

    def listed_since(self, client: str, since: float) -> Dict[str, float]:
        """Per resource (``pods``, ``nads``), when ``client``'s first successful LIST served
        at or after ``since`` was served, whenever it was asked (one asked before ``since``
        and served after it counts: a WatchList under way when an outage or a storm ended)."""
        with self._lock:
            entry = self._clients.get(client) or _Client()
            listed = sorted((r.served, r.kind.partition(" ")[0]) for r in entry.requests
                            if r.listed and r.served is not None and r.served >= since)
        return {resource: at for at, resource in reversed(listed)}

    def peak_in_flight(self, clients: Iterable[str], start: float = 0.0,
                       end: float = float("inf")) -> int:
        """The most requests of ``clients`` the server was serving at one instant in
        [start, end) (a request still unserved counts until ``end``)."""
        edges: List[Tuple[float, int]] = []
        with self._lock:
            for client in clients:
                for request in (self._clients.get(client) or _Client()).requests:
                    done = request.served if request.served is not None else float("inf")
                    if request.time < end and done > start:
                        edges.append((max(request.time, start), 1))
                        edges.append((done, -1))
        peak = now = 0
        for _at, step in sorted(edges):  # at one instant an end (-1) sorts before a start
            now += step
            peak = max(peak, now)
        return peak


def _is_collection(path: str) -> bool:
    """A list/watch path (``.../pods``), not one object (``.../pods/web``) or a subresource."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return False
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:]
    return len(rest) == 1


RESOURCES = {"pods": "pods", "network-attachment-definitions": "nads", "events": "events",
             "nodes": "nodes", "resourceclaims": "resourceclaims",
             "resourceslices": "resourceslices", "selfsubjectaccessreviews": "accessreviews"}
VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_kind(method: str, path: str, query: Dict[str, str]) -> str:
    """``pods list``, ``nads watch``, ``pods watchlist``, ``pods get``, ``pods/status update``,
    ``events create``, or the path for what is none of these (``GET /version``)."""
    parts = [p for p in path.split("/") if p]
    where = next((i for i in range(len(parts) - 1, -1, -1) if parts[i] in RESOURCES), None)
    if where is None:
        return f"{method} {path}"
    kind = RESOURCES[parts[where]]
    if len(parts) - where == 3:
        kind += "/" + parts[-1]  # a subresource: pods/status
    if method == "GET" and _is_collection(path):
        source = read_source(method, query)
        if source == WATCH:
            return f"{kind} watch"
        return f"{kind} {'watchlist' if 'watch' in query else 'list'}"
    return f"{kind} {VERBS.get(method, method)}"


def stored_objects(api: Any, path: str) -> int:
    """How many objects etcd reads for a storage LIST of ``path``: every object of the
    resource, or of the namespace when the path names one (the field selector is applied
    after the read)."""
    parts = [p for p in path.split("/") if p]
    namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else ""
    if parts and parts[-1] == "pods":
        store = api._pods
    elif parts and parts[-1] == "network-attachment-definitions":
        store = api._nads
    else:
        return 0
    with api._cond:
        return sum(1 for ns, _name in store if not namespace or ns == namespace)


class CountingWriter:
    """A connection's writer that books every byte to the request being answered on it."""

    def __init__(self, raw: Any, ledger: ClientLedger) -> None:
        self._raw = raw
        self._ledger = ledger
        self.client: Optional[_Client] = None

    def write(self, data: bytes) -> int:
        written = self._raw.write(data)
        self._ledger.wrote(self.client, len(data))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
