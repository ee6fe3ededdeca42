"""The HTTP server on the unix socket: routing, limits, worker pool, per-sandbox locks, deadlines.

One thread per connection (reused, :class:`ConnectionThreads`) parses the HTTP request
(cheap); the CNI work itself runs only
while holding a slot of a bounded pool and the lock of its container ID, so that one
sandbox's ADD/DEL/CHECK never interleave and a burst of pods queues instead of exhausting
memory. Every request carries a deadline; time spent waiting for a slot counts against it.
Every failure is answered 400 with CNI error JSON, as upstream's daemon does, and the
server keeps serving. ``/healthz``, ``/readyz`` and ``/status`` never wait for the pool.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import socket
import threading
import time
from typing import Any, Callable, Mapping, Optional

from multusd.wire import api
from multusd.errors import (DecodeFailure, InvalidEnvironment, MultusError, TryAgainLater,
                     from_exception)

LOG = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
READ_TIMEOUT = 30.0
# A /readyz asked while the daemon starts is answered when it becomes ready, or after this
# long: the shim then does not sleep between polls through a cold start.
READY_HOLD = 0.5
READY_CHECK = 0.005

# handler(endpoint, body, deadline, request_id) -> response object (dict) or None
Handler = Callable[[str, bytes, float, str], Optional[Mapping[str, Any]]]


class KeyedLocks:
    """One lock per key (container ID), created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}

    def acquire(self, key: str, deadline: float) -> bool:
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        acquired = entry[0].acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not acquired:
            self._release_ref(key)
        return acquired

    def release(self, key: str) -> None:
        with self._guard:
            self._locks[key][0].release()
        self._release_ref(key)

    def _release_ref(self, key: str) -> None:
        with self._guard:
            entry = self._locks[key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


class ConnectionThreads:
    """The threads that serve connections, reused: one is started only when none is idle,
    and up to KEEP_IDLE wait for the next connection instead of ending (a new thread costs
    ~0.1 ms and a round of the GIL for every one of a pod's requests)."""

    KEEP_IDLE = 16

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._serve = serve
        self._waiting: "queue.SimpleQueue[Optional[socket.socket]]" = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, conn: socket.socket) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that thread takes this connection off the queue
        if start:
            threading.Thread(target=self._run, args=(conn,), name="multusd-conn",
                             daemon=True).start()
        else:
            self._waiting.put(conn)

    def close(self) -> None:
        """End the idle threads (the busy ones end after their connection)."""
        with self._lock:
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._waiting.put(None)

    def _run(self, conn: Optional[socket.socket]) -> None:
        while conn is not None:
            self._serve(conn)
            with self._lock:
                if self._idle >= self.KEEP_IDLE:
                    return
                self._idle += 1
            conn = self._waiting.get()


class Server:
    """Serves the Multus API on a listening unix socket until :meth:`stop`."""

    def __init__(self, listener: socket.socket, handler: Handler, *, workers: int = 16,
                 request_timeout: float = 110.0,
                 readiness: Callable[[], bool] = lambda: True,
                 after_request: Callable[[], None] = lambda: None,
                 observe_http: Callable[[str, str, int], None] = lambda *answer: None,
                 describe: Callable[[], Mapping[str, Any]] = dict,
                 max_connections: int = 0, read_timeout: float = 0.0) -> None:
        self.listener = listener
        self.read_timeout = read_timeout or READ_TIMEOUT
        self.max_connections = max_connections or max(64, 4 * workers)
        self._connection_slots = threading.BoundedSemaphore(self.max_connections)
        self.readiness = readiness
        self.describe = describe
        self.after_request = after_request
        self.observe_http = observe_http  # (path, method, status) of every answer: metrics
        self._counts_lock = threading.Lock()
        self.handler = handler
        self.request_timeout = request_timeout
        self.pool = threading.BoundedSemaphore(workers)
        self.sandbox_locks = KeyedLocks()
        self.ready = True
        self.counts = {"ok": 0, "failed": 0}
        self._in_flight = 0
        self._idle = threading.Condition()
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = False
        self._family = listener.family
        self._threads = ConnectionThreads(self._serve_connection)

    # -- life cycle -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Accept connections until :meth:`stop`; each one is served on its own thread.

        At most ``max_connections`` at once: the rest wait in the socket's backlog (where
        systemd's socket keeps them across restarts), not in threads of ours.
        """
        self.listener.setblocking(False)
        while True:
            if not self._connection_slots.acquire(timeout=0.5):
                if self._stopped:
                    return
                continue
            readable, _, _ = select.select([self.listener, self._stop_r], [], [])
            if self._stop_r in readable:
                self._connection_slots.release()
                return
            try:
                # _accept + a socket of the known family: socket.accept() converts the
                # family and type to enums for every connection (~0.1 ms of GIL each)
                conn = socket.socket(self._family, socket.SOCK_STREAM, 0,
                                     self.listener._accept()[0])
            except (BlockingIOError, InterruptedError):
                self._connection_slots.release()
                continue
            except OSError as exc:
                self._connection_slots.release()
                LOG.error("accept failed on the multusd socket: %s", exc)
                continue
            conn.setblocking(True)
            with self._idle:
                self._in_flight += 1
            self._threads.submit(conn)

    def stop(self) -> None:
        """Stop accepting; connections not yet accepted stay queued in the socket."""
        if not self._stopped:
            self._stopped = True
            os.write(self._stop_w, b"x")
            self._threads.close()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if some still are after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def wait_ready(self, timeout: float) -> bool:
        """Ready to serve ADD; while starting, wait up to ``timeout`` s for it (never while
        stopping), so that a shim polling /readyz learns it the moment it happens."""
        deadline = time.monotonic() + timeout
        while self.ready:
            if self.readiness():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(READY_CHECK)  # readiness is a cache flag set on another thread
        return False

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # -- one connection ---------------------------------------------------------------------
    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_TIMEOUT)  # the answer's writes; reads have their own deadline
            _Connection(conn, self).handle()
        except Exception:  # a broken client must never take a thread's error further
            LOG.debug("connection ended with an error", exc_info=True)
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
            self._connection_slots.release()

    def status(self) -> dict:
        """What ``GET /status`` answers: request counts and in flight, plus :attr:`describe`."""
        with self._counts_lock:
            counts = dict(self.counts)
        info = {"requests": counts, "inFlight": max(0, self._in_flight - 1),  # not this one
                "ready": bool(self.ready and self.readiness())}
        info.update(self.describe())
        return info

    def _count(self, outcome: str) -> None:
        with self._counts_lock:
            self.counts[outcome] += 1
        self.after_request()

    def run_cni(self, endpoint: str, body: bytes) -> tuple[int, bytes]:
        """Run one /cni or /delegate request through the pool; (status, body) to answer."""
        request_id = os.urandom(8).hex()  # not uuid: it imports platform
        deadline = time.monotonic() + self.request_timeout
        if not self.pool.acquire(timeout=self.request_timeout):
            return _error_response(TryAgainLater(
                f"multusd is busy: no worker became free within {self.request_timeout:.0f}s; "
                "raise \"workers\" in daemon-config.json or retry"))
        try:
            response = self.handler(endpoint, body, deadline, request_id)
        except Exception as exc:  # every failure reaches the runtime as a CNI error
            error = from_exception(exc)
            if not isinstance(exc, MultusError):
                LOG.exception("request %s failed unexpectedly", request_id)
            self._count("failed")
            return _error_response(error)
        finally:
            self.pool.release()
        self._count("ok")
        if response is None:
            return 200, b""
        return 200, json.dumps(response).encode()


def _error_response(error: MultusError) -> tuple[int, bytes]:
    return 400, json.dumps(error.to_cni_error()).encode()


STATUS_PHRASES = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found",
                  405: "Method Not Allowed", 408: "Request Timeout",
                  500: "Internal Server Error"}
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100
MAX_HEAD = 65536  # request line and headers together


class _BadRequest(Exception):
    """The bytes on the connection are not an HTTP/1.x request."""


class _ReadTimeout(Exception):
    """The client did not send its whole request within the server's read_timeout."""


class _Reader:
    """Buffered reads from the connection against one deadline for the head and body.

    A per-read timeout would let a client that sends a byte at a time hold a thread for
    ever; here every ``recv`` gets only what is left of the request's read timeout.
    """

    def __init__(self, conn: socket.socket, timeout: float) -> None:
        self.conn = conn
        self.deadline = time.monotonic() + timeout
        self.buffer = bytearray()

    def _fill(self) -> bool:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _ReadTimeout()
        self.conn.settimeout(remaining)
        try:
            data = self.conn.recv(65536)
        except socket.timeout:
            raise _ReadTimeout() from None
        finally:
            self.conn.settimeout(READ_TIMEOUT)
        self.buffer += data
        return bool(data)

    def readline(self, limit: int) -> bytes:
        """One line with its newline, at most ``limit`` bytes; b"" at EOF."""
        while True:
            end = self.buffer.find(b"\n", 0, limit)
            if end >= 0:
                return self._take(end + 1)
            if len(self.buffer) >= limit or not self._fill():
                return self._take(min(limit, len(self.buffer)))

    def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer if the client closed its side first."""
        while len(self.buffer) < size and self._fill():
            pass
        return self._take(min(size, len(self.buffer)))

    def _take(self, size: int) -> bytes:
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


class _Connection:
    """One HTTP/1.1 exchange on an accepted connection: parse, route, answer, close.

    A small parser of our own rather than http.server: that module (with email and html)
    costs the daemon ~30 ms of imports on every socket-activated start, and the shims'
    requests are one simple shape. ``Connection: close`` is always answered, as upstream's
    daemon disables keep-alive.
    """

    def __init__(self, conn: socket.socket, server: Server) -> None:
        self.conn = conn
        self.server = server
        self.rfile = _Reader(conn, server.read_timeout)
        self.method = ""
        self.path = ""
        self.headers: dict = {}

    def handle(self) -> None:
        try:
            if self._read_head():
                self._route()
        except _BadRequest as exc:
            LOG.debug("malformed HTTP request: %s", exc)
            self._send(*_error_response(DecodeFailure(f"malformed HTTP request: {exc}")))
        except _ReadTimeout:
            LOG.debug("a client did not send its request within %.0fs",
                      self.server.read_timeout)
            self._send(408, _error_response(TryAgainLater(
                f"the request was not received within {self.server.read_timeout:.0f}s"))[1])

    def _read_head(self) -> bool:
        line = self.rfile.readline(MAX_HEADER_LINE + 1)
        if not line:
            return False  # a probe that connected and went away
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(f"malformed request line {line[:100]!r}")
        self.method, self.path = parts[0], parts[1].split("?", 1)[0]
        head_size, count = len(line), 0
        while True:
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if line in (b"\r\n", b"\n"):
                return True
            if not line.endswith(b"\n"):
                raise _BadRequest("the request head ended before its blank line"
                                  if len(line) <= MAX_HEADER_LINE else "header line too long")
            head_size, count = head_size + len(line), count + 1
            if head_size > MAX_HEAD or count > MAX_HEADERS:
                raise _BadRequest(f"request head too large: at most {MAX_HEADERS} header "
                                  f"lines and {MAX_HEAD} bytes")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequest(f"malformed header line {line[:100]!r}")
            key, value = name.strip().lower(), value.strip()
            if key in _SINGLE_HEADERS and self.headers.get(key, value) != value:
                raise _BadRequest(f"conflicting {name.strip()} headers")
            self.headers[key] = value

    def _route(self) -> None:
        path, method = self.path, self.method
        if path in (api.HEALTH_ENDPOINT, api.READY_ENDPOINT):
            if method not in ("GET", "POST"):
                return self._send(405, b"Method not allowed\n", "text/plain")
            self._drain_body()
            ok = path == api.HEALTH_ENDPOINT or self.server.wait_ready(READY_HOLD)
            return self._send(200 if ok else 500, b"")
        if path == api.STATUS_ENDPOINT:
            if method != "GET":
                return self._send(405, b"Method not allowed\n", "text/plain")
            return self._send(200, json.dumps(self.server.status()).encode())
        if path in (api.CNI_ENDPOINT, api.DELEGATE_ENDPOINT):
            if method != "POST":
                return self._send(405, b"Method not allowed\n", "text/plain")
            try:
                body = self._read_body()
            except MultusError as exc:
                return self._send(*_error_response(exc))
            status, payload = self.server.run_cni(path, body)
            return self._send(status, payload)
        return self._send(404, b"")

    def _read_body(self) -> bytes:
        if self.headers.get("expect", "").lower() == "100-continue":
            self.conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl asks for large bodies
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked()
        length_header = self.headers.get("content-length")
        if length_header is None:
            raise InvalidEnvironment("the request has no Content-Length")
        length = _decimal(length_header)
        if length is None:
            raise DecodeFailure(f"bad Content-Length {length_header[:40]!r}: it must be a "
                                "non-negative decimal number")
        if length > MAX_BODY:
            self._discard(length)
            raise DecodeFailure(f"request body of {length} bytes is over the limit of "
                                f"{MAX_BODY} bytes; a CNI config should be far smaller")
        return self._read_exactly(length)

    def _read_exactly(self, length: int) -> bytes:
        body = self.rfile.read(length)
        if len(body) != length:
            raise DecodeFailure(f"the request body ended after {len(body)} of its {length} "
                                "bytes: the request was not run")
        return body

    def _discard(self, length: int) -> None:
        """Read an oversized body away (bounded) so the client gets our answer, not EPIPE."""
        remaining = min(length, 16 * MAX_BODY)
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                return
            remaining -= len(chunk)

    def _read_chunked(self) -> bytes:
        body = b""
        while True:
            line = self.rfile.readline(MAX_HEADER_LINE)
            digits = line.split(b";")[0].strip()
            if not line.endswith(b"\n") or not digits or digits.strip(_HEX_DIGITS):
                raise DecodeFailure("malformed chunked request body: a chunk size must be "
                                    "hexadecimal digits on a line of its own")
            size = int(digits, 16)
            if size == 0:
                self.rfile.readline(MAX_HEADER_LINE)
                return body
            if len(body) + size > MAX_BODY:
                raise DecodeFailure(f"request body is over the limit of {MAX_BODY} bytes")
            body += self._read_exactly(size)
            if self.rfile.readline(MAX_HEADER_LINE) not in (b"\r\n", b"\n"):
                raise DecodeFailure("malformed chunked request body: a chunk is longer than "
                                    "its size")

    def _drain_body(self) -> None:
        length = _decimal(self.headers.get("content-length") or "0")
        if length is not None and 0 < length <= MAX_BODY:
            self.rfile.read(length)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = (f"HTTP/1.1 {status} {STATUS_PHRASES.get(status, '')}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        self.conn.sendall(head + body)  # one write: no Nagle delay between head and body
        self.server.observe_http(self.path, self.method, status)


_HEX_DIGITS = b"0123456789abcdefABCDEF"
_SINGLE_HEADERS = ("content-length", "transfer-encoding")


def _decimal(text: str) -> Optional[int]:
    """A Content-Length as RFC 9110 has it (digits only: no sign, no spaces); None if not."""
    text = text.strip()
    if not text or len(text) > 18 or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
