"""HTTP to one Kubernetes API server with the standard library: TLS, credentials, deadlines, keep-alive.

multusd sends a handful of requests (list and watch pods and NADs, GET a pod or NAD, PUT a
pod's status, POST events, a few DRA reads) and reads their JSON itself, so it needs the
transport of a Kubernetes client and nothing of its generated code. This is that transport,
on ``http.client`` and ``ssl``: nothing of it changes with the ``kubernetes`` or ``urllib3``
release a distribution ships, and a socket-activated daemon does not import urllib3 (~100M
instructions, a third of the client's start-up) for its first ADD.

* kept-alive connections are reused (up to :data:`POOL_SIZE` idle), each with TCP keep-alive
  probes so a silently dead peer is noticed within ~a minute;
* every request has the timeout the caller gives (the rest of its CNI request's deadline) for
  the connect and for every read; a request on a kept-alive connection the server had closed
  is sent once more on a new one, if time is left; nothing else is retried here;
* the Authorization header comes from :class:`~multusd.kube.credentials.Credentials` for
  every request; a 401 makes it re-read the credentials and, if any changed (here or in a
  request meanwhile), the request is sent once more; a replaced client certificate makes new
  connections use the new pair;
* TLS as the kubeconfig says (CA, client certificate, ``insecure-skip-tls-verify``,
  ``tls-server-name``); ``proxy-url`` (an ``http://`` proxy; CONNECT for an ``https`` server);
* a non-2xx answer raises :class:`ApiError` (status, reason, body); a stream that stays
  silent past its read timeout raises :class:`IdleTimeout`. Other failures are ``OSError``
  (refused, timed out, cut, TLS) or ``http.client.HTTPException``;
  :meth:`multusd.kube.clientconfig.ClientConfig.failure` translates them all.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from multusd import __version__
from multusd.kube.credentials import Credentials
from multusd.kube.kubeconfig import KubeconfigError, Settings

USER_AGENT = f"multusd/{__version__}"
POOL_SIZE = 8
READ_CHUNK = 65536
# TCP keep-alive: first probe after 15 s idle, then every 5 s, given up after 3 unanswered
_KEEPALIVE = [(socket.IPPROTO_TCP, getattr(socket, name), value)
              for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
              if hasattr(socket, name)]
# what a kept-alive connection the server closed meanwhile looks like when it is reused
_STALE = (http.client.RemoteDisconnected, http.client.CannotSendRequest,
          http.client.BadStatusLine, BrokenPipeError, ConnectionResetError)

Query = Union[Dict[str, Any], Sequence[Tuple[str, Any]], None]


class ApiError(Exception):
    """The API server answered with an error status (its Status object is in :attr:`body`)."""

    def __init__(self, status: int, reason: str, body: str = "",
                 headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = headers or {}

    def status_object(self) -> Dict[str, Any]:
        """The metav1.Status the server sent ({} if the body is not one)."""
        try:
            value = json.loads(self.body) if self.body else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class IdleTimeout(Exception):
    """A streaming answer (a watch) sent nothing within its read timeout."""


def path_of(template: str, **parts: str) -> str:
    """``template`` with each ``{name}`` replaced by its percent-encoded value."""
    return template.format(**{name: quote(str(value), safe="") for name, value in parts.items()})


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class Response:
    """One answer: status, headers, and its body read whole (:attr:`data`) or streamed.

    :meth:`release_conn` hands a fully read connection back for the next request;
    :meth:`close` drops it (an answer left half read must be closed).
    """

    def __init__(self, transport: "Transport", connection: http.client.HTTPConnection,
                 answer: http.client.HTTPResponse) -> None:
        self._transport = transport
        self.connection = connection  # .sock: what shutdown_response shuts down
        self._answer = answer
        self.status = answer.status
        self.reason = answer.reason
        self.headers = answer.headers
        self._data: Optional[bytes] = None

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = self._answer.read()
        return self._data

    def stream(self) -> Iterator[bytes]:
        """The body as it arrives (chunk by chunk of a chunked answer)."""
        while True:
            try:
                chunk = self._answer.read1(READ_CHUNK)
            except socket.timeout:
                raise IdleTimeout() from None
            if not chunk:
                return
            yield chunk

    def release_conn(self) -> None:
        if self._answer.isclosed() and not self._answer.will_close:
            self._transport.put_back(self.connection)
        else:
            self.close()

    def close(self) -> None:
        self._answer.close()
        self.connection.close()


class Transport:
    """Requests to the API server of one kubeconfig (see the module docstring)."""

    def __init__(self, settings: Settings, credentials: Credentials) -> None:
        self.settings = settings
        self.credentials = credentials
        parts = urlsplit(settings.host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KubeconfigError(f"its 'server' {settings.host!r} is not an http:// or "
                                  "https:// URL")
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")  # a server URL may carry a path (a proxy's)
        self._proxy: Optional[Tuple[str, int]] = None
        if settings.proxy_url:
            proxy = urlsplit(settings.proxy_url)
            if proxy.scheme != "http" or not proxy.hostname:
                raise KubeconfigError("its 'proxy-url' is not an http:// URL (https:// and "
                                      "SOCKS proxies are not supported)")
            self._proxy = (proxy.hostname, proxy.port or 80)
        self._lock = threading.Lock()
        self._idle: List[Tuple[int, http.client.HTTPConnection]] = []
        self._generation = credentials.tls_generation
        self._context = self._tls_context() if self.https else None

    # ---- connections ---------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        settings = self.settings
        context = ssl.create_default_context(cafile=settings.ca_file)
        if not settings.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if settings.cert_file:
            context.load_cert_chain(settings.cert_file, settings.key_file or None)
        return context

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """An idle kept-alive connection, else a new one (with a replaced certificate's
        successor when the client certificate changed)."""
        generation = self.credentials.tls_generation
        with self._lock:
            if generation != self._generation and self.https:
                self._context = self._tls_context()
                stale, self._idle = self._idle, []
                for _, old in stale:
                    old.close()
            self._generation = generation
            while self._idle:
                made_for, connection = self._idle.pop()
                if made_for == generation and connection.sock is not None:
                    connection.sock.settimeout(timeout)
                    return connection
                connection.close()
            context = self._context
        host, port = self._proxy or (self.host, self.port)
        if self.https:
            connection: http.client.HTTPConnection = _HTTPSConnection(
                host, port, timeout=timeout, context=context,
                server_name=self.settings.tls_server_name or self.host)
            if self._proxy:
                connection.set_tunnel(self.host, self.port)
        else:
            connection = _HTTPConnection(host, port, timeout=timeout)
        connection.tls_generation = generation  # put_back must not give it a newer one
        return connection

    def put_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < POOL_SIZE and connection.sock is not None:
                self._idle.append((getattr(connection, "tls_generation", -1), connection))
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, connection in idle:
            connection.close()

    # ---- requests ------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Query = None, body: Any = None,
                timeout: float, read_timeout: Optional[float] = None,
                stream: bool = False) -> Response:
        """Send one request; the response (2xx), its body read unless ``stream``.

        :param timeout: connect and read timeout, seconds (the caller's deadline, left).
        :param read_timeout: the read timeout of a streamed body instead (a watch's idle bound).
        :raises ApiError: the server answered with an error status.
        :raises OSError: no answer (refused, timed out, cut, TLS); also
            ``http.client.HTTPException`` for an answer that is not HTTP.
        """
        target = self.prefix + path
        if query:
            pairs = query.items() if isinstance(query, dict) else query
            target += "?" + urlencode([(k, _query_value(v)) for k, v in pairs if v is not None])
        if self._proxy and not self.https:
            target = f"http://{self.host}:{self.port}{target}"  # absolute: the proxy forwards
        payload = None if body is None else (
            body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode())
        started = time.monotonic()
        retried_auth = False
        while True:
            sent = self.credentials.header(), self.credentials.tls_generation
            response = self._send(method, target, payload, sent[0], timeout, started)
            # a 401 after a rotation (found now, or by another request meanwhile): once more
            if response.status == 401 and not retried_auth and (
                    self.credentials.refresh() or
                    (self.credentials.header(), self.credentials.tls_generation) != sent):
                retried_auth = True
                response.data  # noqa: B018 - read away, so the connection can be reused
                response.release_conn()
                continue
            if response.status >= 300:
                raise _error(response)
            if stream:
                if read_timeout and response.connection.sock is not None:
                    response.connection.sock.settimeout(read_timeout)
            else:
                response.data  # noqa: B018 - the whole body, within the timeout
            return response

    def _send(self, method: str, target: str, payload: Optional[bytes],
              authorization: Optional[str], timeout: float, started: float) -> Response:
        headers = {"Host": f"{self.host}:{self.port}", "User-Agent": USER_AGENT,
                   "Accept": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        if payload is not None:
            headers["Content-Type"] = "application/json"
        resent = False
        while True:
            left = max(0.001, timeout - (time.monotonic() - started))
            connection = self._connection(left)
            reused = connection.sock is not None
            try:
                connection.request(method, target, body=payload, headers=headers)
                return Response(self, connection, connection.getresponse())
            except _STALE:
                connection.close()
                # a kept-alive connection the server had closed: once more, if time is left
                if not reused or resent or timeout - (time.monotonic() - started) < 0.05:
                    raise
                resent = True
            except BaseException:
                connection.close()
                raise


class _HTTPConnection(http.client.HTTPConnection):
    """A connection with TCP keep-alive probes."""

    def connect(self) -> None:
        super().connect()
        _keepalive(self.sock)


class _HTTPSConnection(http.client.HTTPConnection):
    """TLS over :class:`_HTTPConnection`, the certificate checked against ``server_name``
    (``tls-server-name``, else the server's host), through a CONNECT tunnel if one is set."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext,
                 server_name: str) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        super().connect()  # TCP, and the proxy's CONNECT when set_tunnel was called
        _keepalive(self.sock)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for level, option, value in _KEEPALIVE:
        sock.setsockopt(level, option, value)


def _error(response: Response) -> ApiError:
    """The ApiError of an error answer; its body is read and the connection released."""
    try:
        data = response.data
    except Exception:  # noqa: BLE001 - the status is what matters
        data = b""
        response.close()
    else:
        response.release_conn()
    return ApiError(response.status, response.reason or "",
                    data.decode("utf-8", "replace")[:65536], dict(response.headers or {}))
