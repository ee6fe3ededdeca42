"""The server's connections, on one thread (the reactor): accepted, timed, answered, closed.

:class:`Reactor` holds every connection the server accepted and has not handed to a worker:
non-blocking sockets on epoll, each with a deadline (a heap of timers), accepted up to
``max_connections`` (at the cap the oldest idle one is closed for a new one, or accepting
pauses and the rest wait in the socket's backlog). An answer is written without blocking;
a refused client that is still sending is read away (bounded, :data:`LINGER_TIMEOUT`,
:data:`LINGER_BYTES`) before the close, so that it reads the answer instead of a broken pipe.
Every connection is counted from its accept to its close, a worker's too (:meth:`wait_idle`).
What a request is and where it goes is :class:`~multusd.daemon.server.Server`'s, built on it.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import select
import selectors
import socket
import threading
import time
from collections import OrderedDict
from typing import Callable, List, Optional

from multusd.daemon import httpreq
from multusd.daemon.cnirun import MemoryBound, error_answer
from multusd.daemon.httpreq import LINGER, READ_TIMEOUT, READING, READY_WAIT, WRITING, Connection
from multusd.errors import TryAgainLater

LOG = logging.getLogger(__name__)

LINGER_TIMEOUT = 5.0
LINGER_BYTES = 16 * httpreq.MAX_BODY


class Reactor:
    """The connections of a listening socket (see the module docstring); the reading is the
    subclass's (:meth:`_read`)."""

    def __init__(self, listener: socket.socket, *, max_connections: int, head_timeout: float,
                 read_timeout: float, memory: MemoryBound,
                 observe_http: Callable[[str, str, int], None]) -> None:
        self.listener = listener
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.read_timeout = read_timeout
        self.memory = memory
        self.observe_http = observe_http  # (path, method, status) of every answer: metrics
        self._open = 0  # connections accepted and not yet closed, reactor's or a worker's
        self._idle = threading.Condition()
        self._conns: "OrderedDict[int, Connection]" = OrderedDict()  # the reactor's, oldest first
        self._timers: List[tuple] = []  # (deadline, sequence, conn) heap, stale entries skipped
        self._sequence = itertools.count()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector: Optional[selectors.BaseSelector] = None
        self._accepting = False
        self._stopped = False
        self._family = listener.family

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no connection is open; False if some still are after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._open:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    @property
    def in_flight(self) -> int:
        return self._open

    def _wake(self) -> None:
        with self._idle:
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._wake_w < 0:
            return  # the reactor has ended
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already pending

    def _listen(self, on: bool) -> None:
        if on and not self._accepting and not self._stopped:
            self._selector.register(self.listener, selectors.EVENT_READ, self.listener)
            self._accepting = True
        elif not on and self._accepting:
            self._selector.unregister(self.listener)
            self._accepting = False

    def _set_deadline(self, conn: Connection, deadline: float) -> None:
        conn.deadline = deadline
        heapq.heappush(self._timers, (deadline, next(self._sequence), conn))

    def _accept(self) -> None:
        batch = next(self._sequence)  # connections accepted from here on are not evicted now
        for attempt in range(64):  # then let the connections already accepted be read
            if self._open >= self.max_connections:
                if attempt and not self._pending():
                    return  # nothing more to accept: no idle connection is closed for it
                if not self._evict(batch):
                    if not any(conn.idle for conn in self._conns.values()):
                        self._listen(False)  # until one closes: the rest wait in the backlog
                    return
            try:
                # _accept + a socket of the known family: socket.accept() converts the
                # family and type to enums for every connection (~0.1 ms of GIL each)
                sock = socket.socket(self._family, socket.SOCK_STREAM, 0,
                                     self.listener._accept()[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._evict(batch):
                    continue
                LOG.error("accept failed on the multusd socket: %s", exc)
                return
            sock.setblocking(False)
            conn = Connection(sock, time.monotonic(), self.head_timeout, self.read_timeout)
            conn.serial = next(self._sequence)
            with self._idle:
                self._open += 1
            self._conns[conn.fd] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._set_deadline(conn, conn.deadline)

    def _pending(self) -> bool:
        """A connection waits in the listening socket's backlog."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        return bool(poller.poll(0))

    def _evict(self, batch: int) -> bool:
        """Close the oldest idle connection accepted before ``batch`` for a new one; False
        if there is none (one accepted since may have its request waiting to be read)."""
        for conn in self._conns.values():
            if conn.serial >= batch:
                return False
            if conn.idle:
                LOG.debug("%d connections open: closing an idle one for a new one",
                          self._open)
                self._close(conn)
                return True
        return False

    def _ready_io(self, conn: Connection, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and conn.phase == WRITING:
            self._flush(conn)
        elif mask & selectors.EVENT_READ:
            if conn.phase == LINGER:
                self._discard(conn)
            elif conn.phase == READING:
                self._read(conn)

    def _expire(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._timers)
            if conn.deadline != deadline or self._conns.get(conn.fd) is not conn:
                continue
            if conn.phase == READING and conn.parser.received:
                LOG.debug("a client did not send its request in time")
                limit = (self.read_timeout if conn.parser.state != httpreq.HEAD
                         else min(self.head_timeout, self.read_timeout))
                self._answer(conn, 408, error_answer(TryAgainLater(
                    f"the request was not received within {limit:.0f}s"))[1])
            else:  # sent nothing, did not read its answer, or lingered long enough
                self._close(conn)

    def _answer(self, conn: Connection, status: int, body: bytes,
                content_type: str = "application/json") -> None:
        """Answer without blocking, then close, or read away what the client still sends."""
        if conn.phase not in (READING, READY_WAIT):
            return
        conn.out = httpreq.response(status, body, content_type)
        conn.linger = not conn.eof and conn.parser.state != httpreq.DONE
        conn.phase = WRITING
        self.observe_http(conn.parser.path, conn.parser.method, status)
        self._set_deadline(conn, time.monotonic() + READ_TIMEOUT)
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return self._close(conn)
        conn.out = conn.out[sent:]
        if conn.out:
            return self._modify(conn, selectors.EVENT_WRITE)
        if not conn.linger:
            return self._close(conn)
        # A refused request the client may still be sending: read it away (bounded) so its
        # write does not fail before it reads the answer.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return self._close(conn)
        conn.phase = LINGER
        self.memory.refund(conn)
        self._modify(conn, selectors.EVENT_READ)
        self._set_deadline(conn, time.monotonic() + LINGER_TIMEOUT)

    def _discard(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        conn.discarded += len(data)
        if not data or conn.discarded >= LINGER_BYTES:
            self._close(conn)

    def _modify(self, conn: Connection, events: int) -> None:
        if events == conn.events:
            return
        if conn.events and events:
            self._selector.modify(conn.sock, events, conn)
        elif events:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.unregister(conn.sock)
        conn.events = events

    def _disown(self, conn: Connection) -> None:
        """Hand the connection to a worker: the reactor forgets it."""
        self._modify(conn, 0)
        del self._conns[conn.fd]
        conn.deadline = -1.0

    def _close(self, conn: Connection) -> None:
        if self._conns.pop(conn.fd, None) is None:
            return
        self._modify(conn, 0)
        conn.deadline = -1.0
        self._forget(conn)
        try:
            conn.sock.close()
        except OSError:
            pass
        self.memory.refund(conn)
        self._closed()

    def _closed(self) -> None:
        with self._idle:
            self._open -= 1
            self._idle.notify_all()
            if not self._accepting and not self._stopped:
                self._wake_locked()  # a connection slot is free: the reactor may accept

    def _read(self, conn: Connection) -> None:
        raise NotImplementedError  # the server's

    def _forget(self, conn: Connection) -> None:
        """``conn`` is being closed: drop what the subclass holds of it."""

    def _next_timer(self) -> Optional[float]:
        """When the earliest connection deadline is due; None when there is none."""
        while self._timers and self._timers[0][2].deadline != self._timers[0][0]:
            heapq.heappop(self._timers)  # a conn closed, handed on or given a new deadline
        return self._timers[0][0] if self._timers else None
