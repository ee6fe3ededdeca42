"""The /metrics endpoint: multusd's registry served over HTTP on ``metricsAddress:metricsPort``.

A threading WSGI server with prometheus_client's exposition, on a daemon thread that sleeps
until a scrape arrives; the ``*_created`` samples are left out (upstream's Go client has none);
a port in use or an address not on this host is refused with the key to change. Upstream
binds its metrics port on every interface without authentication; multusd binds 127.0.0.1
unless ``metricsAddress`` in daemon-config.json says otherwise.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import sys
import threading
from typing import Any, Callable, Dict, Tuple

from multusd.config.daemonconf import DEFAULT_METRICS_ADDRESS as DEFAULT_ADDRESS
from multusd.daemon.metrics import WithoutCreated

LOG = logging.getLogger(__name__)


class MetricsServerError(Exception):
    """The metrics endpoint cannot listen; the message names the key to change."""


def _make_http_server(address: Tuple[str, int], registry: Any) -> Any:
    """A bound threading WSGI server answering /metrics with prometheus_client's app."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    scrape = make_wsgi_app(WithoutCreated(registry))
    plain = [("Content-Type", "text/plain; charset=utf-8")]

    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> list:
        def respond(status: str, headers: list, exc_info: Any = None) -> Any:
            # "multusd", not wsgiref's default naming the Python version to the network
            return start_response(status, headers + [("Server", "multusd")], exc_info)

        if environ.get("PATH_INFO") != "/metrics":
            respond("404 Not Found", plain)
            return [b"404 page not found\n"]
        try:
            return scrape(environ, respond)
        except Exception:
            LOG.exception("rendering the metrics failed")
            respond("500 Internal Server Error", plain, sys.exc_info())
            return [b"rendering the metrics failed; see the multusd log\n"]

    class Handler(WSGIRequestHandler):
        timeout = 10.0  # a scraper that stalls mid-request must not hold a thread for ever

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib
            LOG.debug("metrics http: " + format, *args)

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

    return make_server(address[0], address[1], app, Server, Handler)


class MetricsServer:
    """GET /metrics served on a daemon thread; :meth:`close` stops it and frees the port.

    The accept loop waits on the listening socket and a wake-up pipe, so closing is
    immediate and an idle daemon never wakes up to poll (``serve_forever`` would, twice a
    second).
    """

    def __init__(self, httpd: Any) -> None:
        self._httpd = httpd
        self.address: str = httpd.server_address[0]
        self.port: int = httpd.server_address[1]
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="multusd-metrics",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        # a selector, not select.select(): that one fails on descriptors above 1023
        with selectors.DefaultSelector() as selector:
            selector.register(self._httpd.fileno(), selectors.EVENT_READ, "listener")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while True:
                events = selector.select()
                if any(key.data == "wake" for key, _ in events):
                    return
                self._httpd.handle_request()  # accepts one connection; a thread answers it

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._httpd.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(address: str = DEFAULT_ADDRESS, port: int = 0, *, registry: Any) -> MetricsServer:
    """Serve ``registry`` (a ``prometheus_client.CollectorRegistry``) at /metrics.

    :param address: where to listen; "" means 127.0.0.1. "0.0.0.0" or "::" expose the
        endpoint to the network, unauthenticated, as upstream always does.
    :param port: the TCP port (``metricsPort``); 0 picks a free one, see ``.port``.
    :returns: a running :class:`MetricsServer`.
    :raises MetricsServerError: the port is taken or the address is not on this host.
    """
    address = address or DEFAULT_ADDRESS
    try:
        httpd = _make_http_server((address, port), registry)
    except OSError as exc:
        raise MetricsServerError(_bind_failure(address, port, exc)) from exc
    server = MetricsServer(httpd)
    LOG.info("serving metrics on %s", server.url)
    return server


def _bind_failure(address: str, port: int, exc: OSError) -> str:
    where = f"{address}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot serve metrics on {where}: port {port} is already in use by another "
                f"process; set \"metricsPort\" in daemon-config.json to a free port, or remove "
                f"it to turn the metrics endpoint off")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
        return (f"cannot serve metrics on {where}: {address!r} is not an address of this host "
                f"({exc.strerror or exc}); fix \"metricsAddress\" in daemon-config.json "
                f"(default {DEFAULT_ADDRESS})")
    return (f"cannot serve metrics on {where}: {exc.strerror or exc}; check \"metricsAddress\" "
            f"and \"metricsPort\" in daemon-config.json")
