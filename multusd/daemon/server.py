"""The HTTP server on the unix socket: one reactor reads every request, workers run CNI work.

One thread (the reactor: non-blocking sockets on epoll) accepts connections and reads every
request head and body as its bytes arrive, so a connection that sends nothing or trickles
holds no thread and no worker: it is closed when its head has not arrived within
``head_timeout`` (5 s), or its whole request within ``read_timeout``. The reactor itself
answers ``/healthz``, ``/readyz`` and ``/status`` (they never wait behind CNI work) and every
refusal; a complete ``/cni`` or ``/delegate`` request goes to
:class:`~multusd.daemon.lanes.Lanes` (a DEL lane beside the general one, one sandbox's
requests in order, one at a time), whose worker runs and answers it
(:mod:`multusd.daemon.cnirun`). Bounded: open connections (at the cap the oldest idle one is
closed for a new one), waiting requests, each request's head and body, and bytes of request
held in all (:class:`~multusd.daemon.cnirun.MemoryBound`: a declared body counts in full once
its head is read, a chunked one as it comes; past the bound either is refused "busy, retry").
A refused request is answered 400 with CNI error JSON, then what the client still sends is
read away (bounded) before the close, so that it reads the answer instead of a broken pipe.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, List, Mapping, Optional

from multusd.daemon import httpreq
from multusd.daemon.httpreq import (LINGER, READ_TIMEOUT, READING, READY_WAIT, WRITING,
                                    Connection)
from multusd.daemon.cnirun import CniRunner, Handler, MemoryBound, error_answer
from multusd.daemon.lanes import Job, Lanes, del_lane_workers
from multusd.errors import DecodeFailure, MultusError, TryAgainLater
from multusd.wire import api

LOG = logging.getLogger(__name__)

MAX_BODY = httpreq.MAX_BODY
HEAD_TIMEOUT = 5.0  # a connection's request head; a shim sends it at once
# A /readyz asked while the daemon starts is answered when it becomes ready, or after this
# long: the shim then does not sleep between polls through a cold start.
READY_HOLD = 0.5
READY_CHECK = 0.005
PROBE_BODY = 65536  # a probe's body is read before the answer up to this size (upstream's
#                     shim POSTs "null" to /readyz), beyond it read away after the answer
PROBE_ROOM = 64  # connection slots CNI requests leave free (probes, idle ones, answers)
LINGER_TIMEOUT = 5.0
STOP_GRACE = 1.0  # at stop: how long an accepted connection may still take to send a request
LINGER_BYTES = 16 * MAX_BODY
MAX_BUFFERED = 64 * 1024 * 1024
SWEEP_INTERVAL = 1.0  # how often waiting requests are checked against their deadline


class Server:
    """Serves the Multus API on a listening unix socket until :meth:`stop`."""

    def __init__(self, listener: socket.socket, handler: Handler, *, workers: int = 16,
                 request_timeout: float = 110.0,
                 readiness: Callable[[], bool] = lambda: True,
                 after_request: Callable[[], None] = lambda: None,
                 observe_http: Callable[[str, str, int], None] = lambda *answer: None,
                 describe: Callable[[], Mapping[str, Any]] = dict,
                 max_connections: int = 0, read_timeout: float = 0.0,
                 head_timeout: float = 0.0, del_workers: int = 0, max_queued: int = 0,
                 max_buffered: int = 0) -> None:
        self.listener = listener
        self.handler = handler
        self.request_timeout = request_timeout
        self.readiness = readiness
        self.after_request = after_request
        self.observe_http = observe_http  # (path, method, status) of every answer: metrics
        self.describe = describe
        self.read_timeout = read_timeout or READ_TIMEOUT
        self.head_timeout = head_timeout or HEAD_TIMEOUT
        self.max_connections = max_connections or max(512, 8 * workers)
        fast_workers = del_workers or del_lane_workers(workers)
        # CNI requests, running or waiting, never hold the connection slots probes need
        room = self.max_connections - workers - fast_workers - PROBE_ROOM
        self.memory = MemoryBound(max_buffered or MAX_BUFFERED)
        self.runner = CniRunner(handler, self.memory, request_timeout=request_timeout,
                                observe_http=observe_http, after_request=after_request,
                                finished=lambda job: self._closed())
        self.lanes = Lanes(self.runner.run_job, workers=workers, fast_workers=fast_workers,
                           max_queued=max(1, min(max_queued or max(256, 4 * workers), room)))
        self.ready = True
        self._open = 0  # connections accepted and not yet closed, reactor's or a worker's
        self._idle = threading.Condition()
        self._conns: "OrderedDict[int, Connection]" = OrderedDict()  # the reactor's, oldest first
        self._timers: List[tuple] = []  # (deadline, sequence, conn) heap, stale entries skipped
        self._sequence = itertools.count()
        self._ready_waiters: List[tuple] = []  # (conn, hold deadline)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector: Optional[selectors.BaseSelector] = None
        self._accepting = False
        self._stopped = False
        self._family = listener.family

    # -- life cycle -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Accept and read connections until :meth:`stop`, then until the accepted ones are
        handed on or closed (connections not yet accepted stay queued in the socket)."""
        self.listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._listen(True)
        next_sweep = time.monotonic() + SWEEP_INTERVAL
        try:
            while not (self._stopped and not self._conns):
                accept = False
                for key, mask in self._selector.select(self._timeout()):
                    if key.data is None:
                        self._woken()
                    elif key.data is self.listener:
                        accept = True  # after reading: a connection read is no longer idle
                    else:
                        try:
                            self._ready_io(key.data, mask)
                        except Exception:  # one connection's bug must not stop the server
                            LOG.exception("a connection failed in the reactor")
                            self._close(key.data)
                if accept and self._accepting:
                    self._accept()
                now = time.monotonic()
                self._expire(now)
                if self._ready_waiters:
                    self._answer_ready_waiters(now)
                if now >= next_sweep:
                    next_sweep = now + SWEEP_INTERVAL
                    for job in self.lanes.take_expired(now):
                        self._answer_expired(job)
        finally:
            self.lanes.close()
            self._selector.close()
            with self._idle:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1

    def stop(self) -> None:
        """Stop accepting; connections not yet accepted stay queued in the socket."""
        if not self._stopped:
            self._stopped = True
            self._wake()

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

    def status(self) -> dict:
        """What ``GET /status`` answers: request counts and in flight, plus :attr:`describe`."""
        info = {"requests": self.runner.counted(), "inFlight": max(0, self._open - 1),  # not this one
                "queued": self.lanes.queued, "running": self.lanes.running,
                "ready": bool(self.ready and self.readiness())}
        info.update(self.describe())
        return info

    # -- the reactor ------------------------------------------------------------------------
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

    def _woken(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        if self._stopped:
            self._listen(False)
            # A connection accepted but silent may be a shim that has not sent its request
            # yet (a restart's race): it gets STOP_GRACE to send it, then is closed; one whose
            # answer is out has nothing left to lose.
            now = time.monotonic()
            for conn in [c for c in self._conns.values()
                         if c.idle and not c.parser.received]:
                if conn.phase == LINGER:
                    self._close(conn)
                elif conn.deadline > now + STOP_GRACE:
                    self._set_deadline(conn, now + STOP_GRACE)
        elif not self._accepting and self._open < self.max_connections:
            self._listen(True)

    def _listen(self, on: bool) -> None:
        if on and not self._accepting and not self._stopped:
            self._selector.register(self.listener, selectors.EVENT_READ, self.listener)
            self._accepting = True
        elif not on and self._accepting:
            self._selector.unregister(self.listener)
            self._accepting = False

    def _timeout(self) -> float:
        if self._ready_waiters:
            return READY_CHECK
        while self._timers and self._timers[0][2].deadline != self._timers[0][0]:
            heapq.heappop(self._timers)  # a conn closed, handed on or given a new deadline
        if not self._timers:
            return SWEEP_INTERVAL
        return min(SWEEP_INTERVAL, max(0.0, self._timers[0][0] - time.monotonic()))

    def _set_deadline(self, conn: Connection, deadline: float) -> None:
        conn.deadline = deadline
        heapq.heappush(self._timers, (deadline, next(self._sequence), conn))

    def _accept(self) -> None:
        batch = next(self._sequence)  # connections accepted from here on are not evicted now
        for _ in range(64):  # then let the connections already accepted be read
            if self._open >= self.max_connections and not self._evict(batch):
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

    # -- reading ----------------------------------------------------------------------------
    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        parser = conn.parser
        try:
            if not data:
                conn.eof = True
                parser.at_eof()
                return self._close(conn)  # nothing sent, or nothing more expected
            self.memory.charge(conn, len(data))
            before = parser.state
            parser.feed(data)
            if parser.parse() != httpreq.HEAD and before == httpreq.HEAD:
                self._set_deadline(conn, conn.read_deadline)
                self._route(conn)
            if conn.metered and conn.phase == READING and self.memory.over():
                raise self.memory.busy()
            if conn.phase == READING and parser.state == httpreq.DONE:
                self._complete(conn)
        except httpreq.BadRequest as exc:
            LOG.debug("malformed HTTP request: %s", exc)
            self._answer(conn, *error_answer(DecodeFailure(f"malformed HTTP request: {exc}")))
        except MultusError as exc:
            self._answer(conn, *error_answer(exc))

    def _route(self, conn: Connection) -> None:
        """The head is in: answer at once, or say which body to read."""
        parser = conn.parser
        path, method = parser.path, parser.method
        if path in (api.HEALTH_ENDPOINT, api.READY_ENDPOINT):
            if method not in ("GET", "POST"):
                return self._answer(conn, 405, b"Method not allowed\n", "text/plain")
            try:
                length = parser.body_length(required=False) or 0
            except MultusError:
                length = 0  # a probe is answered whatever its framing; the rest read away
            if 0 <= length <= PROBE_BODY:
                self._continue(conn)
                parser.expect_body(length)
            else:
                self._complete(conn)  # answered now, its body read away after
        elif path == api.STATUS_ENDPOINT:
            if method != "GET":
                return self._answer(conn, 405, b"Method not allowed\n", "text/plain")
            self._no_body(conn)
            self._answer(conn, 200, json.dumps(self.status()).encode())
        elif path in (api.CNI_ENDPOINT, api.DELEGATE_ENDPOINT):
            if method != "POST":
                return self._answer(conn, 405, b"Method not allowed\n", "text/plain")
            length = parser.body_length()
            if length > MAX_BODY:
                raise DecodeFailure(f"request body of {length} bytes is over the limit of "
                                    f"{MAX_BODY} bytes; a CNI config should be far smaller")
            to_come = length - len(parser.buffer)  # what came with the head is charged
            if length < 0:
                conn.metered = True  # chunked: charged as it comes, up to the bound
            elif self.memory.over(to_come):
                raise self.memory.busy()
            elif to_come > 0:  # charged now, so that bodies still to come count in the bound
                self.memory.charge(conn, to_come)
                conn.reserved = to_come
            self._continue(conn)
            parser.expect_body(length)
        else:
            self._no_body(conn)
            self._answer(conn, 404, b"")

    @staticmethod
    def _no_body(conn: Connection) -> None:
        """A request answered without reading a body: finished unless it declared one."""
        try:
            if not conn.parser.body_length(required=False):
                conn.parser.expect_body(0)
        except MultusError:
            pass  # its framing is broken: what it sends is read away after the answer

    def _continue(self, conn: Connection) -> None:
        if conn.parser.expects_continue:
            try:
                conn.sock.send(httpreq.CONTINUE)  # curl asks before a large body
            except OSError:
                pass

    def _complete(self, conn: Connection) -> None:
        """The whole request is in (or all of it that will be read)."""
        parser = conn.parser
        if parser.path in (api.HEALTH_ENDPOINT, api.READY_ENDPOINT):
            if parser.path == api.HEALTH_ENDPOINT or (self.ready and self.readiness()):
                return self._answer(conn, 200, b"")
            if not self.ready or self._stopped:
                return self._answer(conn, 500, b"")
            conn.phase = READY_WAIT  # answered when ready, or after READY_HOLD
            self._modify(conn, 0)
            self._ready_waiters.append((conn, time.monotonic() + READY_HOLD))
            return
        command, key = httpreq.peek_env(parser.body)
        job = Job(conn.sock, parser.path, parser.method, parser.body,
                  time.monotonic() + self.request_timeout, command, key, conn.charged)
        if not self.lanes.submit(job):
            return self._answer(conn, *error_answer(TryAgainLater(
                f"multusd is busy: {self.lanes.max_queued} requests are waiting for a worker; "
                "retry, or raise \"workers\" in daemon-config.json")))
        self._disown(conn)

    def _answer_ready_waiters(self, now: float) -> None:
        ready = self.ready and self.readiness()
        waiting, self._ready_waiters = self._ready_waiters, []
        for conn, hold in waiting:
            if ready or now >= hold or not self.ready or self._stopped:
                conn.phase = READING
                self._answer(conn, 200 if ready else 500, b"")
            else:
                self._ready_waiters.append((conn, hold))

    # -- answering from the reactor ---------------------------------------------------------
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

    def _answer_expired(self, job: Job) -> None:
        """A waiting request whose deadline passed: answered busy by the reactor."""
        sock = job.conn
        sock.setblocking(False)
        conn = Connection(sock, time.monotonic(), READ_TIMEOUT, READ_TIMEOUT)
        conn.parser.state, conn.parser.path, conn.parser.method = httpreq.DONE, job.path, \
            job.method
        conn.charged = job.charged
        self._conns[conn.fd] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        conn.events = selectors.EVENT_READ
        self._answer(conn, *self.runner.too_late())

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
        self._ready_waiters = [w for w in self._ready_waiters if w[0] is not conn]
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
