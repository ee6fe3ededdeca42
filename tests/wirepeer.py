"""A TCP peer that records the bytes a client sends and answers from a script: framing tests.

Not an API server (tests/kubeapi.py is that): the unit tests of multusd/kube/transport.py
use it to see exactly what goes on the wire (request line, Host header, the proxy's absolute
URI or CONNECT line) and to answer with what a real server or proxy might send. Each
accepted connection reads one request head (and its ``Content-Length`` body), records it in
:attr:`WirePeer.heads`, and writes the next queued answer (bytes); with no answer queued it
answers ``200 {}``. It listens on ``127.0.0.1`` or ``::1``, in a thread; :meth:`stop` ends it.
"""

from __future__ import annotations

import socket
import threading
from typing import List, Optional

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Head:
    """One request as it arrived: its first line, headers (lower-case names) and body."""

    def __init__(self, raw: bytes, body: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        self.line = lines[0]
        self.headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                self.headers[name.strip().lower()] = value.strip()
        self.body = body


class WirePeer:
    """See the module docstring. :attr:`url` is ``http://<host>:<port>``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind((host, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        self.heads: List[Head] = []
        self.answers: List[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def answer(self, *answers: bytes) -> "WirePeer":
        """Queue answers for the next requests, in order."""
        with self._lock:
            self.answers.extend(answers)
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._stopped:
                conn.close()
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        pending = b""
        try:
            while True:
                while b"\r\n\r\n" not in pending:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                raw, pending = pending.split(b"\r\n\r\n", 1)
                head = Head(raw, b"")
                length = int(head.headers.get("content-length") or 0)
                while len(pending) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                head.body, pending = pending[:length], pending[length:]
                with self._lock:
                    self.heads.append(head)
                    answer: Optional[bytes] = self.answers.pop(0) if self.answers else OK
                conn.sendall(answer)
        except OSError:
            return
        finally:
            conn.close()

    def stop(self) -> None:
        self._stopped = True
        try:
            # wake accept(): a connection to ourselves, then close the listener
            family = self.listener.family
            with socket.socket(family, socket.SOCK_STREAM) as poke:
                poke.connect(self.listener.getsockname()[:2])
        except OSError:
            pass
        self._thread.join(timeout=5)
        self.listener.close()
