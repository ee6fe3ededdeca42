"""HTTP to one Kubernetes API server with the standard library: TLS, credentials, deadlines, retries.

multusd sends a handful of requests (list and watch pods and NADs, GET a pod or NAD, PUT a
pod's status, POST events, a few DRA reads) and reads their JSON itself, so it needs the
transport of a Kubernetes client and nothing of its generated code. This is that transport,
on ``http.client`` and ``ssl``: nothing of it changes with the ``kubernetes`` or ``urllib3``
release a distribution ships, and a socket-activated daemon does not import urllib3 (~100M
instructions, a third of the client's start-up) for its first ADD.

* kept-alive connections are reused, up to ``pool_size`` idle ones (the daemon passes the
  number of its threads that send requests, so a burst does not pay a TLS handshake per
  request); one the server has closed meanwhile is seen before it is used
  (:func:`~multusd.kube.connections.peer_closed`) or, closed at that very moment, the
  request is sent once more on a new one (a POST only if it had not been written whole);
  one idle for :data:`IDLE_CLOSE` seconds is closed instead of reused;
* every request has a deadline, a ``time.monotonic()`` instant (the caller's: its CNI
  request's, or a timeout from now): before the connect, the proxy's CONNECT, the TLS
  handshake, the send and the read the socket's timeout is set to what is left, and the
  :data:`~multusd.kube.deadlines.WATCHDOG` shuts the connection down at the instant, so a
  server that trickles its answer (status line late, then a byte now and then) fails it at
  the deadline, never later (:class:`NoAnswerInTime`). Retries and their waits fit inside
  it too. A streamed answer (a list or watch) is bounded so up to its head; its body is read
  with its own per-read bound (a watch's silence bound), as it is not a request with a
  deadline;
* transient answers (429 and ``Retry-After``, 500/502/503/504, refused, reset, TLS EOF) are
  retried with jittered backoff (:data:`~multusd.kube.retries.REQUEST`) inside that
  deadline, a POST only where the server cannot have processed it:
  :mod:`multusd.kube.retries` says what and why; streamed requests (lists and watches) are
  not, unless the caller asks: a reflector waits on the one backoff of every way back to the
  server (:data:`~multusd.kube.retries.API_SERVER`). :attr:`Transport.retries` counts them
  by cause;
* the Authorization header comes from :class:`~multusd.kube.credentials.Credentials` for
  every request; a 401 makes it re-read the credentials and, if any changed (here or in a
  request meanwhile), the request is sent once more; a replaced client certificate makes new
  connections use the new pair;
* TLS as the kubeconfig says (CA, client certificate, ``insecure-skip-tls-verify``,
  ``tls-server-name``); ``proxy-url`` (an ``http://`` proxy; CONNECT for an ``https`` server);
  an IPv6 server (``https://[fd00::1]:6443``) is written in brackets wherever an authority
  goes (:mod:`multusd.kube.connections`);
* a non-2xx answer raises :class:`ApiError` (status, reason, body, ``Retry-After``); a stream
  that stays silent past its read timeout raises :class:`IdleTimeout`; a request whose
  deadline passed without a whole answer raises :class:`NoAnswerInTime` (an ``OSError``: a
  timeout). Other failures are ``OSError`` (refused, cut, TLS) or
  ``http.client.HTTPException``; each carries ``attempts``, how many times it was sent;
  :meth:`multusd.kube.clientconfig.ClientConfig.failure` translates them all.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from multusd import __version__
from multusd.kube import retries
from multusd.kube.connections import (HTTPConnection, HTTPSConnection, authority, bound,
                                      peer_closed)
from multusd.kube.credentials import Credentials
from multusd.kube.deadlines import SocketCut, within
from multusd.kube.kubeconfig import KubeconfigError, Settings

LOG = logging.getLogger(__name__)

USER_AGENT = f"multusd/{__version__}"
POOL_SIZE = 8  # idle connections kept when the caller does not say (tools, tests)
IDLE_CLOSE = 80.0  # below the 90 s after which kube-apiserver closes an idle connection
READ_CHUNK = 65536

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
        self.attempts = 1

    @property
    def retry_after(self) -> Optional[float]:
        """The answer's ``Retry-After``, in seconds (None without a readable one)."""
        value = next((v for k, v in self.headers.items() if k.lower() == "retry-after"), None)
        return retries.retry_after_seconds(value)

    def status_object(self) -> Dict[str, Any]:
        """The metav1.Status the server sent ({} if the body is not one)."""
        try:
            value = json.loads(self.body) if self.body else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class IdleTimeout(Exception):
    """A streaming answer (a watch) sent nothing within its read timeout."""


class NoAnswerInTime(socket.timeout):
    """The API server gave no whole answer before the request's deadline (it was cut there).

    :attr:`server` is its ``host:port``, :attr:`waited` the seconds the request took,
    :attr:`stage` the step that was under way ("waiting for the answer", "the TLS
    handshake", ...).
    """

    def __init__(self, server: str, waited: float, stage: str) -> None:
        super().__init__(f"{server} did not answer within {waited:.1f}s ({stage})")
        self.server = server
        self.waited = waited
        self.stage = stage
        self.attempts = 1


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
                 answer: http.client.HTTPResponse, sock: Optional[socket.socket] = None) -> None:
        self._transport = transport
        self.connection = connection
        # the socket the body is read from (what shutdown_response shuts down); an answer
        # with "Connection: close" takes it over and leaves connection.sock None
        self.sock = sock or connection.sock
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

    def set_read_timeout(self, seconds: Optional[float]) -> None:
        """The read timeout of the rest of a streamed body (a watch's idle bound)."""
        if self.sock is not None:
            self.sock.settimeout(seconds)

    def release_conn(self) -> None:
        if self._answer.isclosed() and not self._answer.will_close:
            self._transport.put_back(self.connection)
        else:
            self.close()

    def close(self) -> None:
        self._answer.close()
        self.connection.close()


class _Failure(NamedTuple):
    """An attempt that got no answer: the exception, where it happened, on a reused connection."""

    error: BaseException
    phase: str
    reused: bool


class Transport:
    """Requests to the API server of one kubeconfig (see the module docstring).

    :param pool_size: idle kept-alive connections to keep at most (the daemon: its threads
        that may send a request at the same time).
    """

    def __init__(self, settings: Settings, credentials: Credentials, *,
                 pool_size: int = POOL_SIZE) -> None:
        self.settings = settings
        self.credentials = credentials
        self.pool_size = max(1, int(pool_size))
        parts = urlsplit(settings.host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KubeconfigError(f"its 'server' {settings.host!r} is not an http:// or "
                                  "https:// URL")
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.authority = authority(self.host, self.port)
        self.prefix = parts.path.rstrip("/")  # a server URL may carry a path (a proxy's)
        self._proxy: Optional[Tuple[str, int]] = None
        if settings.proxy_url:
            proxy = urlsplit(settings.proxy_url)
            if proxy.scheme != "http" or not proxy.hostname:
                raise KubeconfigError("its 'proxy-url' is not an http:// URL (https:// and "
                                      "SOCKS proxies are not supported)")
            self._proxy = (proxy.hostname, proxy.port or 80)
        self.retries = retries.RetryCounts()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._idle: List[Tuple[int, float, http.client.HTTPConnection]] = []
        self._generation = credentials.tls_generation
        self._context = self._tls_context() if self.https else None

    # ---- connections ---------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        settings = self.settings
        context = ssl.create_default_context(cafile=settings.ca_file)
        if not settings.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert_file, key_file = self.credentials.client_certificate()
        if cert_file:
            context.load_cert_chain(cert_file, key_file or None)
        return context

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        """An idle kept-alive connection still open, else a new one (with a replaced
        certificate's successor when the client certificate changed); bounded by
        ``deadline`` (:attr:`~multusd.kube.connections.HTTPConnection.deadline`)."""
        generation = self.credentials.tls_generation
        now = time.monotonic()
        with self._lock:
            if generation != self._generation and self.https:
                self._context = self._tls_context()
                stale, self._idle = self._idle, []
                for _, _, old in stale:
                    old.close()
            self._generation = generation
            while self._idle:
                made_for, since, connection = self._idle.pop()
                if made_for == generation and connection.sock is not None and \
                        now - since < IDLE_CLOSE and not peer_closed(connection.sock):
                    connection.deadline = deadline  # type: ignore[attr-defined]
                    return connection
                connection.close()
            context = self._context
        host, port = self._proxy or (self.host, self.port)
        timeout = max(0.001, deadline - now)  # what http.client keeps; ours is the deadline
        if self.https:
            connection: http.client.HTTPConnection = HTTPSConnection(
                host, port, timeout=timeout, context=context,
                server_name=self.settings.tls_server_name or self.host,
                tunnel_to=self.authority if self._proxy else None, user_agent=USER_AGENT)
        else:
            connection = HTTPConnection(host, port, timeout=timeout)
        connection.deadline = deadline  # type: ignore[attr-defined]
        connection.tls_generation = generation  # put_back must not give it a newer one
        return connection

    def put_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size and connection.sock is not None:
                self._idle.append((getattr(connection, "tls_generation", -1), time.monotonic(),
                                   connection))
                return
        connection.close()

    def stop_retrying(self) -> None:
        """From now on a failed request is not retried, and one waiting to be gives up (the
        daemon is stopping: nothing waits out a backoff)."""
        self._closing.set()

    def close(self) -> None:
        """Close the idle connections; no retries from now on (:meth:`stop_retrying`)."""
        self._closing.set()
        with self._lock:
            idle, self._idle = self._idle, []
        for _, _, connection in idle:
            connection.close()

    # ---- requests ------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Query = None, body: Any = None,
                deadline: Optional[float] = None, timeout: Optional[float] = None,
                read_timeout: Optional[float] = None, stream: bool = False,
                retry: Optional[bool] = None) -> Response:
        """Send one request; the response (2xx), its body read unless ``stream``.

        :param deadline: when the whole request, retries included, must be over (a
            ``time.monotonic()`` instant; see the module docstring).
        :param timeout: seconds from now, when no ``deadline`` is given (or the earlier of
            the two); one of them is required.
        :param read_timeout: the read timeout of a streamed body (a watch's idle bound);
            by default the time the request was given.
        :param retry: retry transient failures (:mod:`multusd.kube.retries`); by default
            yes, except for a ``stream``.
        :raises ApiError: the server answered with an error status.
        :raises NoAnswerInTime: no whole answer (or head of a streamed one) by the deadline.
        :raises OSError: no answer (refused, cut, TLS); also ``http.client.HTTPException``
            for an answer that is not HTTP.
        """
        if deadline is None and timeout is None:
            raise TypeError("request() needs a deadline or a timeout")
        started = time.monotonic()
        deadline = within(timeout, deadline) if timeout is not None else deadline
        assert deadline is not None
        target = self.prefix + path
        if query:
            pairs = query.items() if isinstance(query, dict) else query
            target += "?" + urlencode([(k, _query_value(v)) for k, v in pairs if v is not None])
        if self._proxy and not self.https:
            target = f"http://{self.authority}{target}"  # absolute: the proxy forwards
        payload = None if body is None else (
            body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode())
        retry = not stream if retry is None else retry
        attempts = retries.Attempts(deadline)
        retried_auth = resent_stale = False
        sends = 0
        while True:
            sent = self.credentials.header(deadline), self.credentials.tls_generation
            sends += 1
            outcome = self._attempt(method, target, payload, sent[0], deadline,
                                    read_body=not stream, started=started)
            if isinstance(outcome, _Failure):
                error = outcome.error
                cause = retries.connection_cause(error, outcome.phase, method)
                # a kept-alive connection closed as it was reused: once more at once
                if cause and outcome.reused and not resent_stale and \
                        attempts.left() >= retries.MIN_ATTEMPT:
                    resent_stale = True
                    self.retries.add(cause)
                    continue
                if retry and cause and self._pause(attempts, cause, None, method, path):
                    continue
                error.attempts = sends  # type: ignore[attr-defined]
                raise error
            response = outcome
            # a 401 after a rotation (found now, or by another request meanwhile): once more
            if response.status == 401 and not retried_auth and (
                    self.credentials.refresh(deadline) or
                    (self.credentials.header(deadline), self.credentials.tls_generation) != sent):
                retried_auth = True
                response.data  # noqa: B018 - read away, so the connection can be reused
                response.release_conn()
                continue
            if response.status >= 300:
                failure = _error(response)
                cause = retries.status_cause(method, failure.status, failure.retry_after)
                if retry and cause and self._pause(attempts, cause, failure.retry_after,
                                                   method, path):
                    continue
                failure.attempts = sends
                raise failure
            if stream:
                response.set_read_timeout(read_timeout or max(0.001, deadline - started))
            return response

    def _pause(self, attempts: retries.Attempts, cause: str, retry_after: Optional[float],
               method: str, path: str) -> bool:
        """Wait before the next attempt; False when no retry fits or the transport closes."""
        delay = attempts.pause(retry_after)
        if delay is None or self._closing.is_set():
            return False
        self.retries.add(cause)
        LOG.debug("%s %s: %s; sending it again in %.2fs (attempt %d)", method, path,
                  _CAUSE_TEXT.get(cause, f"answered {cause}"), delay, attempts.count)
        return not self._closing.wait(delay)

    def _attempt(self, method: str, target: str, payload: Optional[bytes],
                 authorization: Optional[str], deadline: float, read_body: bool,
                 started: float) -> Union[Response, _Failure]:
        """Send the request once, cut at ``deadline``; its response (its head only unless
        ``read_body``), or where and how it failed."""
        headers = {"Host": self.authority, "User-Agent": USER_AGENT,
                   "Accept": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        if payload is not None:
            headers["Content-Type"] = "application/json"
        connection = self._connection(deadline)
        reused = connection.sock is not None
        phase = retries.SEND if reused else retries.CONNECT
        cut = SocketCut(deadline, describe=lambda: getattr(connection, "stage", ""))
        connection.cut = cut  # type: ignore[attr-defined]
        response: Optional[Response] = None
        try:
            if reused:
                cut.hold(connection.sock)
            else:
                connection.connect()
                phase = retries.SEND
            connection.stage = "sending the request"  # type: ignore[attr-defined]
            bound(connection.sock, deadline)
            connection.request(method, target, body=payload, headers=headers)
            phase = retries.ANSWER
            connection.stage = "waiting for the answer"  # type: ignore[attr-defined]
            sock = connection.sock
            bound(sock, deadline)
            response = Response(self, connection, connection.getresponse(), sock)
            if read_body:
                connection.stage = "reading the answer"  # type: ignore[attr-defined]
                response.data  # noqa: B018 - the whole body, within the deadline
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if cut.release() or deadline <= time.monotonic():
                exc = self._no_answer(connection, cut, started, exc)
            return _Failure(exc, phase, reused)
        except BaseException:
            cut.release()
            connection.close()
            raise
        finally:
            connection.cut = None  # type: ignore[attr-defined]
        if cut.release():  # fired as the answer came in, or cut it short: http.client
            response.close()  # reads headers up to EOF, so a cut head may look whole
            return _Failure(self._no_answer(connection, cut, started, None), phase, reused)
        return response

    def _no_answer(self, connection: http.client.HTTPConnection, cut: SocketCut,
                   started: float, cause: Optional[BaseException]) -> NoAnswerInTime:
        error = NoAnswerInTime(self.authority, time.monotonic() - started,
                               cut.fired_during or getattr(connection, "stage", "connecting"))
        error.__cause__ = cause
        return error


_CAUSE_TEXT = {"refused": "the connection was refused", "reset": "the connection was reset",
               "closed": "the connection ended without an answer",
               "tls-eof": "the TLS connection ended without an answer",
               "proxy": "the proxy could not reach the server",
               "5xx": "answered a server error with Retry-After"}


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
