"""A TCP peer that answers one byte at a time: a slow TLS server, proxy or HTTP server for tests.

Not an API server (tests/kubeapi.py is that, and its ``trickle`` slows the API's own answers):
this one slows what comes before an answer, the TLS handshake and a proxy's CONNECT, for the
unit tests of the transport's deadline. Each accepted connection either relays to
``upstream`` (what the client sends goes on at once, what upstream sends comes back one byte
every ``interval`` seconds: a TLS handshake that takes minutes), or sends ``answer`` the same
way after reading what the client sends (an empty ``answer``: silence, a handshake that never
ends). :attr:`SlowPeer.client_gone` counts the connections the client ended; :meth:`stop`
ends them all.
"""

from __future__ import annotations

import socket
import threading
from typing import List, Optional, Tuple


class SlowPeer:
    """See the module docstring. :attr:`port` is where it listens, on 127.0.0.1."""

    def __init__(self, *, upstream: Optional[Tuple[str, int]] = None, answer: bytes = b"",
                 interval: float = 0.05) -> None:
        self.upstream, self.answer, self.interval = upstream, answer, interval
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.client_gone = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: List[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._stop.is_set():
                conn.close()
                return
            with self._lock:
                self.accepted += 1
                self._sockets.append(conn)
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        upstream: Optional[socket.socket] = None
        try:
            if self.upstream is not None:
                upstream = socket.create_connection(self.upstream, timeout=10)
                with self._lock:
                    self._sockets.append(upstream)
                threading.Thread(target=self._forward, args=(conn, upstream),
                                 daemon=True).start()
                self._trickle_from(lambda: upstream.recv(65536), conn)
            else:
                threading.Thread(target=self._drain, args=(conn,), daemon=True).start()
                data = [self.answer]
                self._trickle_from(lambda: data.pop() if data else b"", conn)
        finally:
            conn.close()
            if upstream is not None:
                upstream.close()

    def _trickle_from(self, read, conn: socket.socket) -> None:
        """Send what ``read`` gives to ``conn`` one byte per interval, until stopped."""
        while not self._stop.is_set():
            try:
                data = read()
            except OSError:
                return
            if not data:
                # nothing more to send: stay silent (the client must give up by itself)
                while not self._stop.wait(self.interval):
                    if _closed_by_peer(conn):
                        self._gone()
                        return
                return
            for index in range(len(data)):
                if self._stop.wait(self.interval):
                    return
                try:
                    conn.sendall(data[index:index + 1])
                except OSError:
                    self._gone()
                    return

    def _gone(self) -> None:
        with self._lock:
            self.client_gone += 1

    @staticmethod
    def _forward(conn: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                upstream.sendall(data)
        except OSError:
            pass
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def stop(self) -> None:
        self._stop.set()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                pass
        except OSError:
            pass
        self._thread.join(timeout=5)
        self.listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether the client has closed its end (readable with nothing to read, or reset)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
