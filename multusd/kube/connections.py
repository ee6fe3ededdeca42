"""Connections to the API server: TCP keep-alive, TLS, an HTTP proxy's CONNECT tunnel, IPv6 literals.

:class:`HTTPConnection` and :class:`HTTPSConnection` are ``http.client`` connections that
:mod:`multusd.kube.transport` opens, keeps alive and reuses. What they add:

* TCP keep-alive probes (first after 15 s idle, then every 5 s, given up after 3), so a peer
  that vanished without a word is noticed within about a minute;
* TLS checked against ``tls-server-name`` (else the server's host, an IP literal included);
* through an ``http://`` proxy, the CONNECT of an ``https`` server is sent here, not by
  ``http.client.HTTPConnection.set_tunnel``: up to Python 3.11 that sends
  ``CONNECT fd00::1:6443 HTTP/1.0`` for an IPv6 server, without brackets and without a Host
  header, which a proxy reads as host ``fd00::1:6443`` (3.12 changed both); this sends
  ``CONNECT [fd00::1]:6443 HTTP/1.1`` and ``Host: [fd00::1]:6443`` on every Python;
* :func:`authority` writes ``host:port`` with an IPv6 literal in brackets, for the Host header,
  a proxy's absolute URI and the CONNECT line alike;
* :func:`peer_closed` tells an idle kept-alive connection the server has closed meanwhile
  (readable while idle: its FIN, RST or TLS close_notify) before a request is sent on it;
* the request's deadline (:attr:`HTTPConnection.deadline`, a ``time.monotonic()`` instant
  the transport sets before each attempt) bounds the connect, the proxy's CONNECT and the
  TLS handshake: each starts with the socket's timeout set to what is left, each address of
  the host is tried only while time is left (``socket.create_connection`` gives every
  address the whole timeout), and the socket is handed to the attempt's
  :class:`~multusd.kube.deadlines.SocketCut` before it connects, so a proxy or TLS peer
  that trickles its bytes is cut at the instant. :attr:`HTTPConnection.stage` says which
  step a connection is in, for the message when the deadline passes;
* a host name is resolved within the deadline too (:func:`addresses`): ``getaddrinfo`` has no
  timeout, so a resolver that does not answer would hold a request for its own retries.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from typing import Optional

from multusd.kube.deadlines import SocketCut, left

CONNECT_HEAD_LIMIT = 65536
# TCP keep-alive: first probe after 15 s idle, then every 5 s, given up after 3 unanswered
_KEEPALIVE = [(socket.IPPROTO_TCP, getattr(socket, name), value)
              for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
              if hasattr(socket, name)]


class TunnelError(OSError):
    """The proxy refused or failed the CONNECT (its status is in :attr:`status`)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"Tunnel connection failed: {status} {reason}".strip())
        self.status = status


def authority(host: str, port: int) -> str:
    """``host:port``, an IPv6 literal in brackets (``[fd00::1]:6443``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def keepalive(sock: socket.socket) -> None:
    """Turn on TCP keep-alive probes (see the module docstring)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for level, option, value in _KEEPALIVE:
        sock.setsockopt(level, option, value)


def peer_closed(sock: socket.socket) -> bool:
    """Whether an idle connection is readable: the server closed or reset it (or sent
    something unasked, which makes it unusable too)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()  # not select.select: descriptors above 1023
    try:
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def bound(sock: socket.socket, deadline: Optional[float]) -> None:
    """Set ``sock``'s timeout to what is left before ``deadline`` (None: leave it).

    :raises socket.timeout: nothing is left (a timeout of 0 would make the socket
        non-blocking, not bounded).
    """
    if deadline is None:
        return
    remaining = left(deadline)
    if remaining <= 0:
        raise socket.timeout("timed out")
    sock.settimeout(remaining)


def addresses(host: str, port: int, deadline: Optional[float]) -> list:
    """``getaddrinfo``'s TCP addresses of ``host``, a name looked up on a thread of its own that
    is waited for only until ``deadline`` (the thread ends when the resolver gives up).

    :raises socket.timeout: the name was not resolved before the deadline.
    :raises OSError: the resolver's own failure (``socket.gaierror``).
    """
    try:  # an IP literal needs no resolver
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except socket.gaierror:
        if deadline is None:
            return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    answer: dict = {}

    def look_up() -> None:
        try:
            answer["found"] = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except OSError as exc:
            answer["error"] = exc

    thread = threading.Thread(target=look_up, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(max(left(deadline), 0.0))
    if "found" in answer:
        return answer["found"]
    if "error" in answer:
        raise answer["error"]
    raise socket.timeout(f"resolving {host!r} did not end before the request's deadline")


def open_tcp(host: str, port: int, *, deadline: Optional[float], timeout: Optional[float],
             cut: Optional[SocketCut] = None) -> socket.socket:
    """A TCP connection to ``host``:``port`` (each address in turn while time is left), with
    keep-alive probes and without Nagle's delay; held by ``cut`` before it connects.

    :raises OSError: no address answered (the last failure), or the deadline passed.
    """
    error: Optional[OSError] = None
    for family, kind, proto, _, address in addresses(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            if cut is not None:
                cut.hold(sock)
            sock.settimeout(timeout)
            bound(sock, deadline)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            if deadline is not None and deadline <= time.monotonic():
                break
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)
        except OSError:
            sock.close()
            raise
        return sock
    raise error if error is not None else OSError(f"no address found for {host!r}")


class HTTPConnection(http.client.HTTPConnection):
    """A plain connection with TCP keep-alive probes, bounded by :attr:`deadline`."""

    #: the deadline of the attempt under way (set by the transport); None: ``timeout`` only
    deadline: Optional[float] = None
    #: the attempt's cut, which holds the socket as soon as it exists
    cut: Optional[SocketCut] = None
    #: the step under way, for a message when the deadline passes
    stage = "connecting"

    def connect(self) -> None:
        self.stage = "connecting"
        self.sock = open_tcp(self.host, self.port, deadline=self.deadline,
                             timeout=self.timeout, cut=self.cut)


class HTTPSConnection(HTTPConnection):
    """TLS over a keep-alive TCP connection, through a CONNECT tunnel to ``tunnel_to`` when
    ``host``/``port`` are a proxy's, the certificate checked against ``server_name``."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext,
                 server_name: str, tunnel_to: Optional[str] = None,
                 user_agent: str = "") -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = context
        self._server_name = server_name
        self._tunnel_to = tunnel_to
        self._user_agent = user_agent

    def connect(self) -> None:
        super().connect()  # TCP (set_tunnel is never called: the CONNECT is ours)
        if self._tunnel_to:
            self.stage = "the proxy's CONNECT"
            bound(self.sock, self.deadline)
            open_tunnel(self.sock, self._tunnel_to, self._user_agent)
        self.stage = "the TLS handshake"
        bound(self.sock, self.deadline)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def open_tunnel(sock: socket.socket, target: str, user_agent: str = "") -> None:
    """Ask the proxy at the other end of ``sock`` for a tunnel to ``target`` (an authority).

    :raises TunnelError: the proxy answered anything but 2xx.
    :raises http.client.RemoteDisconnected: it closed the connection instead.
    """
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if user_agent:
        head += f"User-Agent: {user_agent}\r\n"
    sock.sendall((head + "\r\n").encode("ascii"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)  # the proxy sends nothing after its answer until TLS starts
        if not chunk:
            raise http.client.RemoteDisconnected("the proxy closed the connection during CONNECT")
        answer += chunk
        if len(answer) > CONNECT_HEAD_LIMIT:
            raise TunnelError(0, "the proxy's answer to CONNECT is too long")
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise TunnelError(0, f"the proxy's answer to CONNECT is not HTTP: {status_line[:80]!r}")
    if not 200 <= int(parts[1]) < 300:  # any 2xx opens the tunnel (RFC 9110)
        raise TunnelError(int(parts[1]), parts[2] if len(parts) > 2 else "")
