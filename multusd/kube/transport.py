"""HTTP to one Kubernetes API server over urllib3: TLS, credentials, deadlines, keep-alive.

multusd sends a handful of requests (list and watch pods and NADs, GET a pod or NAD, PUT a
pod's status, POST events) and reads their JSON itself, so it needs the transport of a
Kubernetes client and nothing of its generated code. This is that transport, on urllib3's
public API (the library the ``kubernetes`` package itself sends with), the same from
urllib3 1.26 (Debian 12) to 2.x:

* one connection pool per API server (TCP keep-alive probes on every connection, so a
  silently dead peer is noticed within ~a minute);
* every request has a timeout the caller gives (the rest of its CNI request's deadline);
  a request on a kept-alive connection the server had closed is sent once more, if time
  is left; nothing else is retried here;
* the Authorization header comes from :class:`~multusd.kube.credentials.Credentials` for
  every request; a 401 makes it re-read the credentials and, if any changed, the request
  is sent once more; a replaced client certificate opens new connections;
* a non-2xx answer raises :class:`ApiError` (status, reason, body), which
  :meth:`multusd.kube.clientconfig.ClientConfig.failure` translates.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Dict, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode

import urllib3
from urllib3.exceptions import ProtocolError

from multusd import __version__
from multusd.kube.credentials import Credentials
from multusd.kube.kubeconfig import KubeconfigError, Settings

USER_AGENT = f"multusd/{__version__}"
POOL_SIZE = 8
# TCP keep-alive: first probe after 15 s idle, then every 5 s, given up after 3 unanswered
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)]

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


def path_of(template: str, **parts: str) -> str:
    """``template`` with each ``{name}`` replaced by its percent-encoded value."""
    return template.format(**{name: quote(str(value), safe="") for name, value in parts.items()})


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class Transport:
    """Requests to the API server of one kubeconfig (see the module docstring)."""

    def __init__(self, settings: Settings, credentials: Credentials) -> None:
        self.settings = settings
        self.credentials = credentials
        self.base = settings.host.rstrip("/")
        self._lock = threading.Lock()
        self._generation = credentials.tls_generation
        self._pool = self._new_pool()

    def _new_pool(self) -> Any:
        settings = self.settings
        options: Dict[str, Any] = {
            "num_pools": 2, "maxsize": POOL_SIZE, "block": False, "retries": False,
            "headers": {"User-Agent": USER_AGENT, "Accept": "application/json"},
            "socket_options": urllib3.connection.HTTPConnection.default_socket_options
            + _KEEPALIVE}
        if self.base.startswith("https"):
            options.update(cert_reqs="CERT_REQUIRED" if settings.verify else "CERT_NONE",
                           ca_certs=settings.ca_file, cert_file=settings.cert_file,
                           key_file=settings.key_file)
            if not settings.verify:
                options["assert_hostname"] = False
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            elif settings.tls_server_name:
                options.update(server_hostname=settings.tls_server_name,
                               assert_hostname=settings.tls_server_name)
        if settings.proxy_url:
            if not settings.proxy_url.startswith(("http://", "https://")):
                raise KubeconfigError("its 'proxy-url' is not an http:// or https:// URL "
                                      "(SOCKS proxies are not supported)")
            return urllib3.ProxyManager(settings.proxy_url, **options)
        return urllib3.PoolManager(**options)

    def pool(self) -> Any:
        """The connection pool; a new one when the client certificate was replaced."""
        generation = self.credentials.tls_generation
        if generation != self._generation:
            with self._lock:
                if generation != self._generation:
                    old, self._pool = self._pool, self._new_pool()
                    self._generation = generation
                    old.clear()  # idle connections with the old certificate
        return self._pool

    def request(self, method: str, path: str, *, query: Query = None, body: Any = None,
                timeout: float, read_timeout: Optional[float] = None,
                stream: bool = False) -> Any:
        """Send one request; the open urllib3 response (2xx), its body read unless ``stream``.

        :param timeout: connect and read timeout, seconds (the caller's deadline, left).
        :param read_timeout: another read timeout (a watch's idle bound).
        :raises ApiError: the server answered with an error status.
        :raises urllib3.exceptions.HTTPError: no answer (refused, timed out, cut, TLS).
        """
        url = self.base + path
        if query:
            pairs = query.items() if isinstance(query, dict) else query
            url += "?" + urlencode([(k, _query_value(v)) for k, v in pairs if v is not None])
        payload = None if body is None else (
            body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode())
        started = time.monotonic()
        retried_auth = False
        while True:
            sent = self.credentials.header(), self.credentials.tls_generation
            response = self._send(method, url, payload, sent[0], timeout, read_timeout,
                                  stream, started)
            # a 401 after a rotation (found now, or by another request meanwhile): once more
            if response.status == 401 and not retried_auth and (
                    self.credentials.refresh() or
                    (self.credentials.header(), self.credentials.tls_generation) != sent):
                retried_auth = True
                _discard(response)
                continue
            if response.status >= 300:
                raise _error(response)
            return response

    def _send(self, method: str, url: str, payload: Optional[bytes],
              authorization: Optional[str], timeout: float, read_timeout: Optional[float],
              stream: bool, started: float) -> Any:
        headers = {}
        if authorization:
            headers["Authorization"] = authorization
        if payload is not None:
            headers["Content-Type"] = "application/json"
        resent = False
        while True:
            left = max(0.001, timeout - (time.monotonic() - started))
            limits = urllib3.Timeout(connect=left, read=read_timeout or left)
            try:
                return self.pool().urlopen(method, url, body=payload, headers=headers,
                                           timeout=limits, preload_content=not stream,
                                           redirect=False, retries=False)
            except ProtocolError:
                # a kept-alive connection the server had closed: once more, if time is left
                if resent or timeout - (time.monotonic() - started) < 0.05:
                    raise
                resent = True

    def close(self) -> None:
        self._pool.clear()


def _discard(response: Any) -> None:
    try:
        response.read()
    finally:
        response.release_conn()


def _error(response: Any) -> ApiError:
    """The ApiError of an error answer; its body is read and the connection released."""
    try:
        data = response.data
    except Exception:  # noqa: BLE001 - the status is what matters
        data = b""
    finally:
        response.release_conn()
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
    return ApiError(response.status, response.reason or "", text[:65536],
                    dict(response.headers or {}))
