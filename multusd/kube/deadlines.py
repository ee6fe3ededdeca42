"""Deadlines of requests to the API server: time left, and a watchdog that cuts a socket at one.

A deadline is a ``time.monotonic()`` instant, the house's convention (a CNI request's
``Job.deadline``, :mod:`multusd.cni.invoke`'s plugin deadline): passed down, never turned into
"seconds" on the way, so that a nested wait takes the earlier of its own bound and its
caller's (:func:`within`) and none starts a new clock of its own.

A socket's timeout bounds each ``recv``, not a request: ``http.client`` reads an answer
through a buffered file, one ``recv`` at a time, so a server that sends a byte every half
second never trips it. :class:`SocketCut` makes the deadline hold anyway: the
:data:`WATCHDOG` thread shuts the connection down at the instant, which ends whatever read,
write, connect or TLS handshake is blocked on it (as ``watchstream.shutdown_response`` does
to a watch), and the caller then sees :attr:`SocketCut.fired`.

Standard library only. (Not a top-level ``multusd/deadline.py``: the layers of
architecture.md let ``kube/`` import only ``kube``, ``errors`` and ``store``.)
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
from typing import Callable, List, Optional, Tuple

LOG = logging.getLogger(__name__)


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (negative once it passed)."""
    return deadline - time.monotonic()


def within(seconds: float, deadline: Optional[float] = None) -> float:
    """The deadline ``seconds`` from now, or ``deadline`` if that comes first."""
    mine = time.monotonic() + seconds
    return mine if deadline is None else min(mine, deadline)


class Alarm:
    """One action the :class:`Watchdog` runs at :attr:`at`, unless cancelled first."""

    __slots__ = ("at", "action", "cancelled")

    def __init__(self, at: float, action: Callable[[], None]) -> None:
        self.at = at
        self.action = action
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run the action (a no-op once it ran; the action must tolerate that race).
        What the action holds is let go now, not when the alarm's instant comes."""
        self.cancelled = True
        self.action = _nothing


def _nothing() -> None:
    pass


class Watchdog:
    """One daemon thread that runs actions at their instants (a heap of :class:`Alarm`).

    Started at the first :meth:`arm`; an action that raises is logged and forgotten. Actions
    must be quick and never block (shutting a socket down is).
    """

    def __init__(self, name: str = "multusd-deadlines") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def arm(self, at: float, action: Callable[[], None]) -> Alarm:
        alarm = Alarm(at, action)
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._order), alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is alarm:
                self._cond.notify()  # earlier than what the thread waits for
        return alarm

    def pending(self) -> int:
        """Alarms not yet due and not cancelled (for tests)."""
        with self._cond:
            return sum(1 for _, _, alarm in self._heap if not alarm.cancelled)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                alarm = heapq.heappop(self._heap)[2]
            action = alarm.action
            if alarm.cancelled:
                continue
            try:
                action()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any action
                LOG.exception("a deadline action failed")


WATCHDOG = Watchdog()


class SocketCut:
    """Shuts the socket of one attempt down at its deadline, from the :data:`WATCHDOG` thread.

    ``describe()``, if given, says what the attempt is doing when the cut fires
    (:attr:`fired_during`: a read cut short may look like an ended one to its caller).
    :meth:`hold` a socket as soon as it exists (before it connects): the cut keeps a
    duplicate of its descriptor, so it shuts down that connection and no other, even when
    the attempt closed its socket meanwhile and the number was reused. :meth:`release` when
    the attempt is over (in a ``finally``); it says whether the cut fired.
    """

    def __init__(self, deadline: float, *, watchdog: Watchdog = WATCHDOG,
                 describe: Optional[Callable[[], str]] = None) -> None:
        self.deadline = deadline
        self.fired = False
        self._describe = describe
        #: what ``describe()`` said when the cut fired (the step it interrupted)
        self.fired_during = ""
        self._lock = threading.Lock()
        self._dup: Optional[socket.socket] = None
        self._done = False
        self._alarm = watchdog.arm(deadline, self.fire)

    def hold(self, sock: socket.socket) -> None:
        """Cut ``sock`` at the deadline (at once if it passed); replaces a socket held before."""
        dup = socket.socket(sock.family, sock.type, sock.proto, fileno=_dup_fd(sock))
        with self._lock:
            old, self._dup = self._dup, dup
            if self._done:
                self._dup = None
                old, dup = dup, None
            elif self.fired:
                _shutdown(dup)
        if old is not None:
            old.close()

    def fire(self) -> None:
        """The deadline came: shut the held socket down (the watchdog calls this)."""
        with self._lock:
            if self._done:
                return
            self.fired = True
            if self._describe is not None:
                self.fired_during = self._describe()
            if self._dup is not None:
                _shutdown(self._dup)

    def release(self) -> bool:
        """The attempt is over: cancel the cut, let go of the socket; whether it fired."""
        self._alarm.cancel()
        with self._lock:
            self._done = True
            dup, self._dup = self._dup, None
            fired = self.fired
            self._describe = None
        if dup is not None:
            dup.close()
        return fired


def _dup_fd(sock: socket.socket) -> int:
    return os.dup(sock.fileno())


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected yet (the connect's own timeout ends it) or already closed
