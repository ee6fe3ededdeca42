"""The HTTP server on the unix socket: one reactor reads every request, workers run CNI work.

One thread (the reactor: non-blocking sockets on epoll) accepts connections and reads every
request head and body as its bytes arrive, so a connection that sends nothing or trickles
holds no thread and no worker: it is closed when its head has not arrived within
``head_timeout`` (5 s), or its whole request within ``read_timeout``. The reactor itself
answers ``/healthz``, ``/readyz`` and ``/status`` (they never wait behind CNI work) and every
refusal; a complete ``/cni``, ``/delegate`` or ``/forget`` request goes to
:class:`~multusd.daemon.lanes.Lanes` (pod work: a DEL lane beside the general one, one
sandbox's requests in order, one at a time; STATUS and GC: a slot each, one run at a time,
shared by the identical requests that come meanwhile), whose thread runs and answers it
(:mod:`multusd.daemon.cnirun`). A request's deadline is ``request_timeout`` after it was read,
a STATUS's :data:`STATUS_TIMEOUT`: below the shim's own bound, so that the runtime hears the
daemon's "not available" (code 50, naming the cluster network that did not answer) rather
than the shim's "no answer". Bounded: open connections (at the cap the oldest idle one is
closed for a new one), waiting requests, each request's head and body, and bytes of request
held in all (:class:`~multusd.daemon.cnirun.MemoryBound`: a declared body counts in full once
its head is read, a chunked one as it comes; past the bound either is refused "busy, retry").
A refused request is answered 400 with CNI error JSON (the connections themselves, their
timers, answers and closing: :mod:`multusd.daemon.reactor`). At the daemon's stop
(:meth:`Server.begin_stop`) ``/readyz`` answers 500 and only DEL and STATUS are still run;
the others are answered 503 (not started: the shim sends them again to the next daemon).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import time
from typing import Any, Callable, List, Mapping

from multusd.daemon import httpreq
from multusd.daemon.httpreq import LINGER, READ_TIMEOUT, READING, READY_WAIT, Connection
from multusd.daemon.cnirun import (CniRunner, Handler, MemoryBound, error_answer,
                                   not_started_answer)
from multusd.daemon.lanes import NODE_COMMANDS, Job, Lanes, del_lane_workers
from multusd.daemon.reactor import LINGER_BYTES, LINGER_TIMEOUT, Reactor  # noqa: F401 (were here)
from multusd.errors import DecodeFailure, MultusError, TryAgainLater
from multusd.wire import api
from multusd.wire.shim import STATUS_TIMEOUT as SHIM_STATUS_TIMEOUT

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
STOP_GRACE = 1.0  # at stop: how long an accepted connection may still take to send a request
MAX_BUFFERED = 64 * 1024 * 1024
SWEEP_INTERVAL = 1.0  # how often waiting requests are checked against their deadline
# A STATUS is answered within STATUS_TIMEOUT after it was read: the shim waits
# SHIM_STATUS_TIMEOUT (5 s) for the whole call, STATUS_MARGIN of it is left for a loaded node
# (the shim's start and connect, the answer's way back; up to SWEEP_INTERVAL more when it
# comes from the sweep). The cluster network's STATUS plugins are killed at this deadline: a
# run holds the STATUS slot no longer, whether its callers are still there or not.
STATUS_MARGIN = 2.0
STATUS_TIMEOUT = SHIM_STATUS_TIMEOUT - STATUS_MARGIN
SERVED_WHILE_STOPPING = ("DEL", "STATUS")


class Server(Reactor):
    """Serves the Multus API on a listening unix socket until :meth:`stop`."""

    def __init__(self, listener: socket.socket, handler: Handler, *, workers: int = 16,
                 request_timeout: float = 110.0,
                 readiness: Callable[[], bool] = lambda: True,
                 after_request: Callable[[], None] = lambda: None,
                 observe_http: Callable[[str, str, int], None] = lambda *answer: None,
                 describe: Callable[[], Mapping[str, Any]] = dict,
                 max_connections: int = 0, read_timeout: float = 0.0,
                 head_timeout: float = 0.0, del_workers: int = 0, max_queued: int = 0,
                 max_buffered: int = 0, status_timeout: float = STATUS_TIMEOUT) -> None:
        super().__init__(listener, max_connections=max_connections or max(512, 8 * workers),
                         head_timeout=head_timeout or HEAD_TIMEOUT,
                         read_timeout=read_timeout or READ_TIMEOUT,
                         memory=MemoryBound(max_buffered or MAX_BUFFERED),
                         observe_http=observe_http)
        self.handler = handler
        self.request_timeout = request_timeout
        self.status_timeout = min(status_timeout, request_timeout)
        self.readiness = readiness
        self.after_request = after_request
        self.describe = describe
        fast_workers = del_workers or del_lane_workers(workers)
        # CNI requests, running or waiting, never hold the connection slots probes need
        room = self.max_connections - workers - fast_workers - len(NODE_COMMANDS) - PROBE_ROOM
        self.runner = CniRunner(handler, self.memory, request_timeout=request_timeout,
                                observe_http=observe_http, after_request=after_request,
                                finished=lambda job: self._closed())
        self.lanes = Lanes(self.runner.run_job, workers=workers, fast_workers=fast_workers,
                           max_queued=max(1, min(max_queued or max(256, 4 * workers), room)),
                           share=self.runner.run_shared)
        self.ready = True
        self.stopping = False  # see begin_stop
        self._ready_waiters: List[tuple] = []  # (conn, hold deadline)

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

    def begin_stop(self) -> None:
        """The daemon is stopping: ``/readyz`` answers 500, and of the CNI requests read from
        now on only DEL and STATUS run; the others are answered "stopping, retry" with 503
        (not started: the next daemon serves the retry, multusd's shim sends it again).
        Probes are answered until :meth:`stop`."""
        self.ready = False
        self.stopping = True

    def stop(self) -> None:
        """Stop accepting; connections not yet accepted stay queued in the socket."""
        if not self._stopped:
            self._stopped = True
            self._wake()

    def status(self) -> dict:
        """What ``GET /status`` answers: request counts and in flight, plus :attr:`describe`."""
        info = {"requests": self.runner.counted(),
                "inFlight": max(0, self._open - 1),  # not this request itself
                "queued": self.lanes.queued, "running": self.lanes.running,
                "ready": bool(self.ready and self.readiness())}
        info.update(self.describe())
        return info

    # -- the reactor ------------------------------------------------------------------------
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

    def _timeout(self) -> float:
        if self._ready_waiters:
            return READY_CHECK
        due = self._next_timer()
        if due is None:
            return SWEEP_INTERVAL
        return min(SWEEP_INTERVAL, max(0.0, due - time.monotonic()))

    def _forget(self, conn: Connection) -> None:
        self._ready_waiters = [w for w in self._ready_waiters if w[0] is not conn]

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
        elif path in (api.CNI_ENDPOINT, api.DELEGATE_ENDPOINT, api.FORGET_ENDPOINT):
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
        if self.stopping and command not in SERVED_WHILE_STOPPING:
            self.runner.count("failed")
            return self._answer(conn, *not_started_answer(TryAgainLater(
                f"multusd is stopping: {command or 'the request'} was not started; retry it "
                "(the socket stays open: the next multusd serves it)")))
        node = command in NODE_COMMANDS
        bound = self.status_timeout if command == "STATUS" else self.request_timeout
        job = Job(conn.sock, parser.path, parser.method, parser.body, time.monotonic() + bound,
                  command, key, conn.charged,
                  share=(parser.path, parser.body) if node else None)  # identical ones: one run
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
        self._answer(conn, *self.runner.too_late(job))
