"""multusd.daemon.reactor: connections counted from accept to close, closed when silent past
their head timeout, the oldest idle one closed at the cap, an answer written without blocking
and what a refused client still sends read away before the close.

Through the real :class:`~multusd.daemon.server.Server` (the reactor's one subclass) on a real
unix socket; the many-connection cases are tests/integration/test_connections.py's.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterator, List

import pytest

from multusd.daemon.server import Server
from testlib import wait_for


class Node:
    def __init__(self, path: str, **options) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(64)
        self.server = Server(self.listener, lambda *request: None, workers=1, **options)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.clients: List[socket.socket] = []

    def connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(30)
        conn.connect(self.path)
        self.clients.append(conn)
        return conn

    def close(self) -> None:
        for conn in self.clients:
            conn.close()
        self.server.stop()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def node(tmp_path) -> Iterator:
    made: List[Node] = []

    def make(**options) -> Node:
        made.append(Node(str(tmp_path / f"s{len(made)}.sock"), **options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def closed_by_server(conn: socket.socket) -> bool:
    try:
        return conn.recv(100) == b""
    except ConnectionResetError:
        return True


def test_wait_idle_follows_the_open_connections(node):
    made = node()
    conn = made.connect()
    wait_for(lambda: made.server.in_flight == 1, 10, what="the connection accepted")
    assert not made.server.wait_idle(0.05)
    conn.close()
    assert made.server.wait_idle(10)
    assert made.server.in_flight == 0


def test_a_connection_silent_past_its_head_timeout_is_closed(node):
    made = node(head_timeout=0.2)
    silent = made.connect()
    assert closed_by_server(silent)
    assert made.server.wait_idle(10)


def test_at_the_cap_the_oldest_idle_connection_is_closed_for_a_new_one(node):
    made = node(max_connections=2)
    first, second = made.connect(), made.connect()
    wait_for(lambda: made.server.in_flight == 2, 10, what="two connections")
    third = made.connect()
    assert closed_by_server(first)  # the oldest idle one made room, and only that one
    third.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert third.recv(100).startswith(b"HTTP/1.1 200")
    second.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert second.recv(100).startswith(b"HTTP/1.1 200")


def test_a_refused_client_still_sending_reads_its_answer(node):
    made = node()
    conn = made.connect()
    conn.sendall(b"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                 % (api_max_body() + 1))
    conn.sendall(b"x" * 65536)  # more of a body it will not read: read away, no reset
    answer = conn.recv(65536)  # the whole answer: one small write
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert b"over the limit" in answer
    conn.sendall(b"x" * 65536)  # still read away after the answer
    conn.shutdown(socket.SHUT_WR)
    assert closed_by_server(conn)


def api_max_body() -> int:
    from multusd.daemon.httpreq import MAX_BODY

    return MAX_BODY
