"""A stand-in for upstream Multus's Go daemon (v4.2.x) on a unix socket, for mixed-fleet tests.

It serves what upstream's ``multus-daemon`` serves and nothing more: ``GET /healthz`` (200),
``POST /cni`` (ADD answers ``{"Result": <CNI result>}``, DEL and CHECK an empty 200), and a
Go ``net/http`` 404 (``404 page not found``) for everything else, ``/readyz`` included (that
endpoint arrived after v4.2). Every request is recorded in :attr:`UpstreamDaemon.requests`
as ``"METHOD /path"`` (``/cni`` with its CNI_COMMAND), so a test sees how the shim polled.
With :attr:`UpstreamDaemon.del_error` set, DEL fails as upstream's daemon fails it (400 with
the CNI error; upstream's own shim logs it and exits 0).
"""

from __future__ import annotations

import base64
import json
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, List


class UpstreamDaemon:
    """Serve on ``<socket_dir>/multus.sock`` in a thread until :meth:`stop`."""

    def __init__(self, socket_dir: str, result: Dict[str, Any]) -> None:
        self.socket_dir = socket_dir
        self.path = os.path.join(socket_dir, "multus.sock")
        self.result = result
        self.requests: List[str] = []
        self.bodies: List[Dict[str, Any]] = []
        self.del_error: Dict[str, Any] | None = None
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        self._server = _Server(self.path, _Handler)
        self._server.daemon = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    daemon: UpstreamDaemon


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.server.daemon.requests.append(f"GET {self.path}")
        if self.path == "/healthz":
            self._send(200, b"")
        else:  # Go's http.NotFound
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/cni":
            self.server.daemon.requests.append(f"POST {self.path}")
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        body = json.loads(raw)
        env = body.get("env") or {}
        command = env.get("CNI_COMMAND", "")
        body["config"] = json.loads(base64.b64decode(body.get("config") or b"e30="))
        self.server.daemon.requests.append(f"POST /cni {command}")
        self.server.daemon.bodies.append(body)
        if command == "ADD":
            self._send(200, json.dumps({"Result": self.server.daemon.result}).encode())
        elif command == "DEL" and self.server.daemon.del_error is not None:
            self._send(400, json.dumps(self.server.daemon.del_error).encode())
        else:
            self._send(200, b"")
