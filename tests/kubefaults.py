"""The stand-in API server's faults: failed answers, cuts, trickles, expiries, restarts, silence.

Mixed into tests/kubeapi.py's :class:`FakeKubeAPI` (:class:`Faults`); the handler
(tests/kubehandler.py) takes what a request meets (:meth:`Faults._take_failure`,
:meth:`Faults._take_trickle`), the watches (tests/kubewatch.py) end with the ERROR event
:meth:`Faults.expire_watches` or :meth:`Faults.fail_watches` sends:

* :meth:`~Faults.fail_next`: an error status (with or without ``Retry-After``), or a
  connection cut after the request was read (RST, or a close without an answer: a TLS EOF
  over TLS); :meth:`~Faults.fail_connections`: the next connections cut as they are accepted;
* :meth:`~Faults.trickle`: answers sent slowly (the status line late, then a byte every half
  second), :attr:`trickled` says how each ended;
* :meth:`~Faults.expire_watches` (ERROR 410 in every open stream), :meth:`~Faults.fail_watches`
  (any ERROR event), :attr:`expired_as_http` (HTTP 410 at the start of a watch from a
  compacted version);
* :meth:`~Faults.restart` (same port; ``down_for``: connections refused meanwhile, until
  :meth:`~Faults.resume`; ``lose_history``; ``new_watch_cache``; ``warm_up``: a server that
  answers 403, then 429, for a while: :meth:`~Faults.warm_up`);
* :meth:`~Faults.blackhole`: a server that stops answering but keeps its connections.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import kubecache
from kuberequests import Obj, is_watch, status_object


class Faults:
    """The fault controls of :class:`FakeKubeAPI` (mixed in; ``_cond`` is its lock)."""

    def _init_faults(self) -> None:
        self._failures: List[Dict[str, Any]] = []
        self._trickles: List[Dict[str, Any]] = []
        self._trickle_epoch = 0  # bumped by clear_failures(): answers trickling now stop
        self.trickles_begun = 0  # trickled answers begun so far
        # (path, "whole" | "client gone" | "stopped") of each trickled answer, once it ended
        self.trickled: List[Tuple[str, str]] = []
        self._connection_faults: List[str] = []  # cuts of the next accepted connections
        self._blackholed = False
        self._resume = threading.Event()  # set: restart(down_for=...) comes back now
        self._expiries = 0  # bumped by expire_watches()/fail_watches(): open watches end ...
        self._expiry: Optional[Obj] = None  # ... with this ERROR event (None: 410 Expired)
        # expired_as_http: a watch from a compacted version is answered HTTP 410 at its
        # start instead of a 200 stream carrying an ERROR event (both happen in real clusters)
        self.expired_as_http = False
        self._warming_until = (0.0, 0.0)  # warm_up(): (403 until, 429 until), ledger clock
        self.ready_at: Optional[float] = None  # when the last warm-up ended (ledger clock)

    def blackhole(self, on: bool = True) -> None:
        """An API server that stops answering but keeps connections open: requests wait
        without an answer and open watches fall silent, until ``blackhole(False)``."""
        with self._cond:
            self._blackholed = on
            self._cond.notify_all()

    # ---- test controls: watch expiry (410 Gone in its three forms) --------------------------

    def expire_watches(self) -> int:
        """Send an ERROR event with code 410 into every open watch stream now, then end them
        (etcd compacted the history while they were open); returns how many were open."""
        with self._cond:
            self._history.compact(self._rv, self._horizon())
            self._expiries += 1
            self._expiry = None
            self._cond.notify_all()
            return self._watchers

    def fail_watches(self, code: int, reason: str, message: str) -> int:
        """Send an ERROR event with this Status into every open watch stream now, then end
        them (what kube-apiserver sends when a watch fails: etcd or the cacher broke it);
        returns how many were open."""
        with self._cond:
            self._expiries += 1
            self._expiry = status_object(code, reason, message)
            self._cond.notify_all()
            return self._watchers

    def restart(self, *, lose_history: bool = False, new_watch_cache: bool = False,
                down_for: float = 0.0, warm_up: float = 0.0,
                forbidden_for: Optional[float] = None) -> float:
        """Stop and start on the same port; with ``lose_history`` the API server comes back
        with a new etcd: objects kept, resourceVersions restarted from 1, no watch history.
        Returns the instant (the ledger's clock) just before it listened again.

        With ``warm_up`` it listens at once but is ready only that many seconds later
        (:meth:`warm_up`: 403 for ``forbidden_for`` s, then 429 "storage is (re)initializing";
        :attr:`ready_at`).

        With ``down_for`` it stays away that many seconds first (an API server's restart
        takes its time: clients meanwhile get connection refused), or until :meth:`resume`.

        A watch resuming from a version the new history does not reach gets what
        kube-apiserver sends: an ERROR event "Too large resource version" (code 504, cause
        ResourceVersionTooLarge) when it is ahead, 410 Gone when it is behind.

        With ``new_watch_cache`` it comes back as a real kube-apiserver does after a restart
        (etcd kept): its new watch cache starts at the newest version, so a watch resuming
        from an older one gets 410 (the reflectors relist).
        """
        self.stop()
        with self._cond:
            if lose_history:
                self._rv = 1
                for store in (self._pods, self._nads):
                    for obj in store.values():
                        obj["metadata"]["resourceVersion"] = self._bump()
                self._history = kubecache.History()
                self._history.compacted = self._rv
                self._cache_held = None
            if new_watch_cache:
                self._history.compact(self._rv)
                self._cache_held = None
        if down_for > 0:
            self._resume.wait(down_for)  # the outage itself
        self._resume.clear()
        back = self.clients.clock()
        if warm_up > 0:
            self.warm_up(warm_up, forbidden_for)
        self.start()
        return back

    def warm_up(self, seconds: float, forbidden_for: Optional[float] = None) -> float:
        """From now on, for ``seconds``, answer as a kube-apiserver that has just started:
        first, for ``forbidden_for`` s (default half of it), 403 Forbidden to every resource
        request, with RBAC's usual message (its authorizer has not loaded the roles yet: a
        client cannot tell it from a refusal that lasts), then, its watch cache initialising,
        429 "storage is (re)initializing" with Retry-After 1 to every read the cache serves and
        every watch (tests/kubecache.py); /readyz answers 500 until then. Returns
        :attr:`ready_at`, the instant (the ledger's clock) it is ready."""
        forbidden = seconds / 2 if forbidden_for is None else min(forbidden_for, seconds)
        now = self.clients.clock()
        with self._cond:
            self._warming_until = (now + forbidden, now + seconds)
            self.ready_at = now + seconds
            self._cond.notify_all()
        return self.ready_at

    def _warming(self) -> str:
        """What a restart's warm-up still lacks now: "authorizer" (its roles not loaded: 403),
        "storage" (its watch cache initialising: 429), or "" (ready)."""
        forbidden_until, ready = self._warming_until
        now = self.clients.clock()
        return "authorizer" if now < forbidden_until else "storage" if now < ready else ""

    def resume(self) -> None:
        """End the outage of a :meth:`restart` with ``down_for`` now."""
        self._resume.set()

    # ---- test controls: requests and failures ----------------------------------------------

    def fail_next(self, method: str, path_prefix: str, status: int = 0, *,
                  times: Optional[int] = 1, watch: Optional[bool] = None,
                  retry_after: Optional[Any] = None, drop: str = "",
                  processed: bool = False, initial_events: Optional[bool] = None) -> None:
        """Answer the next ``times`` matching requests (None: all of them) with ``status``.

        ``watch`` narrows the match to watch (True) or non-watch (False) requests,
        ``initial_events`` to WatchLists (True: ``sendInitialEvents=true``) or others.
        ``retry_after`` adds a ``Retry-After`` header (and, as kube-apiserver, the Status's
        ``details.retryAfterSeconds`` when it is a number). Instead of an answer, ``drop``
        cuts the connection once the request was read: ``"reset"`` (RST: SO_LINGER 0) or
        ``"close"`` (FIN without an answer; over TLS without close_notify: a TLS EOF); with
        ``processed`` the request is carried out first and only its answer is lost.
        Failures queued for the same requests are used in the order queued.
        """
        assert drop in ("", "reset", "close") and (status or drop), (status, drop)
        with self._cond:
            self._failures.append({"method": method.upper(), "prefix": path_prefix,
                                   "status": status, "times": times, "watch": watch,
                                   "retry_after": retry_after, "drop": drop,
                                   "processed": processed, "initial_events": initial_events})

    def trickle(self, method: str, path_prefix: str, *, times: Optional[int] = 1,
                seconds: Optional[float] = None, head_after: float = 1.0,
                interval: float = 0.5) -> None:
        """Answer the next ``times`` matching requests (lists and GETs, not watches) slowly;
        with ``seconds``, every matching request for that long instead.

        The answer is the right one, but its status line goes out ``head_after`` seconds
        late and then the rest one byte every ``interval`` seconds: a client that bounds
        each read, not the whole request, waits as long as the server likes. How each one
        ended is appended to :attr:`trickled` (``"whole"``, ``"client gone"``, or
        ``"stopped"`` by :meth:`clear_failures` or :meth:`stop`).
        """
        with self._cond:
            self._trickles.append({
                "method": method.upper(), "prefix": path_prefix,
                "times": None if seconds is not None else times,
                "until": None if seconds is None else time.monotonic() + seconds,
                "head_after": head_after, "interval": interval})

    def wait_trickling(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until ``count`` trickled answers have begun (a synchronisation point)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.trickles_begun >= count, timeout)

    def fail_connections(self, how: str, times: int = 1) -> None:
        """Cut the next ``times`` connections as they are accepted, before reading a
        request or starting TLS: ``"reset"`` (RST) or ``"close"`` (FIN; over TLS the client's
        handshake meets EOF: what a load balancer in front of a restarting server does)."""
        assert how in ("reset", "close"), how
        with self._cond:
            self._connection_faults.extend([how] * times)

    def clear_failures(self) -> None:
        """Forget the failures queued, and stop trickling (answers trickling now are cut)."""
        with self._cond:
            self._failures.clear()
            self._connection_faults.clear()
            self._trickles.clear()
            self._trickle_epoch += 1
            self._cond.notify_all()

    def _take_trickle(self, method: str, path: str,
                      query: Dict[str, str]) -> Optional[Dict[str, Any]]:
        """The trickle a request's answer gets (call with ``_cond`` held), or None."""
        if is_watch(query):
            return None
        now = time.monotonic()
        self._trickles[:] = [t for t in self._trickles if t["until"] is None or now < t["until"]]
        for trickle in self._trickles:
            if trickle["method"] != method or not path.startswith(trickle["prefix"]):
                continue
            if trickle["times"] is not None:
                trickle["times"] -= 1
                if trickle["times"] <= 0:
                    self._trickles.remove(trickle)
            return dict(trickle, epoch=self._trickle_epoch)
        return None

    def _take_failure(self, method: str, path: str,
                      query: Dict[str, str]) -> Optional[Dict[str, Any]]:
        for failure in self._failures:
            if failure["method"] != method or not path.startswith(failure["prefix"]):
                continue
            if failure["watch"] is not None and failure["watch"] != is_watch(query):
                continue
            if failure["initial_events"] is not None and failure["initial_events"] != (
                    query.get("sendInitialEvents", "").lower() == "true"):
                continue
            if failure["times"] is not None:
                failure["times"] -= 1
                if failure["times"] <= 0:
                    self._failures.remove(failure)
            return dict(failure)
        return None
