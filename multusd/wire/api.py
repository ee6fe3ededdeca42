"""The shim <-> daemon wire contract, identical to upstream Multus thick (standard library only).

HTTP/1.1 over the unix socket ``<socketDir>/multus.sock``:

* ``POST /cni`` with ``{"env": {...}, "config": "<stdin bytes, base64>"}``, ``env`` being the
  shim's whole environment (the ``CNI_*`` variables and the rest, as upstream's shim sends
  ``os.Environ()``); ADD answers 200 ``{"Result": <result>}`` at the daemon's newest version
  (1.1.0 from multusd, 1.0.0 from upstream's), the other commands 200 with an empty body, a
  failure 400 with CNI error JSON. multusd answers a request it did not start because it is
  stopping :data:`NOT_STARTED` (503) with the same CNI error JSON: nothing was done for it,
  and the socket (systemd's) keeps the next connection for the next daemon, so a client may
  send it again once ``/readyz`` answers 200 (multusd's shim does, for ADD, CHECK and GC).
  Upstream's daemon never answers 503, and upstream's shim reports every answer but 200 alike.
* ``POST /delegate``: the same plus ``"interfaceAttributes"`` (hot-plug of one interface).
* ``GET|POST /healthz`` (always 200 while serving), ``/readyz`` (500 once stopping).
* ``GET /status``: the daemon's own facts as JSON (version, uptime, request counts), for
  ``multusd status``; read-only, multusd's own (upstream has no such endpoint).
* ``POST /forget``: ``multusd gc --forget``, multusd's own (upstream's daemon answers 404,
  and its shim never sends it): the body of the runtime's DEL of the sandbox, as for
  ``/cni``; the daemon runs every delegate's DEL and drops the sandbox's records whatever
  failed, in the sandbox's turn (one request per sandbox at a time, the runtime's DEL and the
  daemon's own retries included); 200 ``{"networks": [...]}`` (:func:`forgotten_networks`),
  a failure 400 with CNI error JSON.

The client here is deliberately tiny (a raw request on a unix socket, ``Connection: close``)
because the shim runs it once per pod sandbox and must start fast. Its ``timeout`` bounds the
whole request, not each read: before every connect, send and read the socket's timeout is
what is left (a daemon that answers a byte at a time cannot hold it longer); ``extend`` is
asked once, when the time is up, whether to wait longer (how the shim honours a
``requestTimeout`` longer than the default without reading the daemon's config for every
pod).
"""

import binascii
import time

# _socket, not socket: socket.py imports selectors and enum, which the shim pays for per pod.
import _socket

from multusd import ascii_json, go_field, go_loads

CNI_ENDPOINT = "/cni"
DELEGATE_ENDPOINT = "/delegate"
HEALTH_ENDPOINT = "/healthz"
READY_ENDPOINT = "/readyz"
STATUS_ENDPOINT = "/status"
FORGET_ENDPOINT = "/forget"
#: a request the daemon refused without starting it (it is stopping): safe to send again
NOT_STARTED = 503
DEFAULT_SOCKET_DIR = "/run/multus/"
SOCKET_NAME = "multus.sock"
#: what a request that ran out of time raises (socket.timeout: TimeoutError from 3.10)
Timeout = _socket.timeout


def socket_path(socket_dir: str = "") -> str:
    """``<socket_dir>/multus.sock`` (upstream's rule; an empty dir means /run/multus/).

    Joined as ``os.path.join`` does, without importing ``os`` (the shim's largest import).
    """
    directory = socket_dir or DEFAULT_SOCKET_DIR
    return directory + SOCKET_NAME if directory.endswith("/") else f"{directory}/{SOCKET_NAME}"


def encode_request(env: dict, config: bytes,
                   interface_attributes: "dict | None" = None) -> bytes:
    """The JSON body of a /cni or /delegate request (config base64, as Go encodes []byte)."""
    body: dict = {"env": dict(env),
                  "config": binascii.b2a_base64(config, newline=False).decode()}
    if interface_attributes is not None:
        body["interfaceAttributes"] = dict(interface_attributes)
    return ascii_json(body).encode()


def forgotten_networks(outcome) -> list:
    """What ``/forget`` answers (and ``multusd gc --forget --json`` shows), from ``outcome``:
    ``(network, interface, why not released)`` of each delegate ("" when it was)."""
    return [{"network": network, "interface": ifname, "released": not why,
             **({"error": why} if why else {})} for network, ifname, why in outcome]


class HTTPResponse:
    """Status and body of one response."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class _Clock:
    """The deadline of one request, extended at most once (see the module docstring)."""

    __slots__ = ("deadline", "extend")

    def __init__(self, timeout: "float | None", extend) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.extend = extend

    def bound(self, conn: _socket.socket) -> None:
        """Set ``conn``'s timeout to what is left; raise ``socket.timeout`` when nothing is."""
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0 and self.extend is not None:
            extend, self.extend = self.extend, None
            left += extend() or 0.0
            self.deadline = time.monotonic() + left
        if left <= 0:
            raise Timeout("timed out")
        conn.settimeout(left)


def http_request(sock_path: str, method: str, path: str, body: bytes = b"",
                 timeout: "float | None" = None, extend=None) -> HTTPResponse:
    """One HTTP/1.1 request over a unix socket, whole within ``timeout`` seconds (None: no
    bound); ``extend()``, if given, is asked once when they are up for more seconds to wait.

    :raises socket.timeout: no whole answer in time (an OSError, as the rest).
    :raises OSError: the daemon is unreachable or its answer is not HTTP.
    """
    clock = _Clock(timeout, extend)
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        clock.bound(conn)
        conn.connect(sock_path)
        head = (f"{method} {path} HTTP/1.1\r\nHost: dummy\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        clock.bound(conn)
        conn.sendall(head.encode() + body)
        return _read_response(_Reader(conn, clock))
    finally:
        conn.close()


class _Reader:
    """``recv`` of one connection, each within what is left of the request's time."""

    __slots__ = ("conn", "clock")

    def __init__(self, conn: _socket.socket, clock: _Clock) -> None:
        self.conn = conn
        self.clock = clock

    def recv(self, size: int) -> bytes:
        while True:
            self.clock.bound(self.conn)  # asks extend() once the time is up
            try:
                return self.conn.recv(size)
            except Timeout:
                if self.clock.extend is None:
                    raise


def post_failure(sock_path: str, endpoint: str, body: bytes, timeout: float) -> str:
    """POST one request to the daemon: "" when it succeeded, else why not (its CNI error's
    msg, or the HTTP status); raises OSError when the daemon is unreachable."""
    response = http_request(sock_path, "POST", endpoint, body, timeout=timeout)
    if response.status == 200:
        return ""
    try:
        answer = go_loads(response.body)
    except ValueError:
        answer = None
    msg = go_field(answer, "msg")
    return str(msg or f"HTTP {response.status} from the daemon")


def _read_response(conn: _Reader) -> HTTPResponse:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("multusd closed the connection before answering")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise ConnectionError(f"malformed HTTP status line from multusd: {lines[0]!r}") from None
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return HTTPResponse(status, _read_chunked(conn, rest))
    length = headers.get("content-length")
    if length is not None:
        want = _number(length, 10, "Content-Length")
        while len(rest) < want:
            chunk = conn.recv(max(65536, want - len(rest)))
            if not chunk:
                break
            rest += chunk
        return HTTPResponse(status, rest[:want])
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return HTTPResponse(status, rest)
        rest += chunk


def _number(text: str, base: int, what: str) -> int:
    """A framing number of the daemon's answer; a malformed one is a broken connection
    (ConnectionError, an OSError as every other failure to get an answer), not a ValueError."""
    try:
        value = int(text.strip(), base)
    except ValueError:
        value = -1
    if value < 0:
        raise ConnectionError(f"malformed {what} in multusd's answer: {text[:40]!r}")
    return value


def _read_chunked(conn: _Reader, data: bytes) -> bytes:
    """The body of a chunked answer, read chunk by chunk to the last (size 0) chunk, its
    trailers not waited for; what arrived if the daemon closes first. (The chunks are parsed
    as they come: a read may end inside the body where the data looks like the end.)"""
    body = b""
    while True:
        while b"\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return body
            data += chunk
        size_line, _, data = data.partition(b"\r\n")
        size = _number(size_line.split(b";")[0].decode("latin-1") or "0", 16, "chunk size")
        if size == 0:
            return body
        while len(data) < size + 2:
            chunk = conn.recv(max(65536, size + 2 - len(data)))
            if not chunk:
                return body + data[:size]
            data += chunk
        body += data[:size]
        data = data[size + 2:]
