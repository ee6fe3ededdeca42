"""multusd.wire.api: the shim's unix-socket client (request framing, the three ways an answer
ends, what it raises) and post_failure's reading of an answer.

Over a real unix socket: :class:`UnixPeer` records the bytes each request carried and writes
an answer scripted byte for byte (as our daemon or upstream's Go server would frame it), then
keeps the connection open unless told to close, so a client that waits for EOF where it should
not would time out. (socket_path is tested in test_shim_process.py.)
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import socket
import struct
import termios
import threading
from typing import Iterator, List

import pytest

from multusd.wire import api
from testlib import wait_for


class UnixPeer:
    """A unix-socket server for one connection at a time: reads one request (head and
    ``Content-Length`` body), keeps its bytes in :attr:`requests`, answers the next scripted
    answer, then closes the connection only if that answer says so."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        self.requests: List[bytes] = []
        self.answers: List[tuple] = []
        self.release = threading.Event()  # ends every connection kept open
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def answer(self, *pieces: bytes, close: bool = False, silent: bool = False,
               read_apart: bool = False) -> "UnixPeer":
        """Queue the answer to the next request (sent piece by piece); ``silent``: none;
        ``read_apart``: each piece only once the client has read the one before, so that
        its reads end where the pieces do."""
        self.answers.append((pieces, close, silent, read_apart))
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            while len(data.split(b"\r\n\r\n", 1)[1]) < length:
                data += conn.recv(65536)
            self.requests.append(data)
            pieces, close, silent, read_apart = self.answers.pop(0) if self.answers else \
                ((b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",), False, False, False)
            if not silent:
                for piece in pieces:
                    if read_apart:
                        wait_for(lambda: unread(conn) == 0, what="the client to read")
                    conn.sendall(piece)
            if not close:
                self.release.wait(30)

    def stop(self) -> None:
        self.release.set()
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self.listener.close()
        self.thread.join(5)


def unread(conn: socket.socket) -> int:
    """Bytes sent on ``conn`` that its peer has not read yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


@pytest.fixture
def peer(tmp_path) -> Iterator[UnixPeer]:
    made = UnixPeer(str(tmp_path / "multus.sock"))
    yield made
    made.stop()


def request(peer: UnixPeer, method: str = "GET", path: str = "/healthz", body: bytes = b"",
            timeout: float = 10.0) -> api.HTTPResponse:
    return api.http_request(peer.path, method, path, body, timeout=timeout)


# ---- the request ----------------------------------------------------------------------------

def test_a_request_is_one_http_1_1_message_that_closes_the_connection(peer):
    body = api.encode_request({"CNI_COMMAND": "ADD"}, b"{}")
    request(peer, "POST", api.CNI_ENDPOINT, body)
    assert peer.requests == [
        b"POST /cni HTTP/1.1\r\nHost: dummy\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)]


def test_a_get_carries_an_empty_body(peer):
    request(peer, "GET", api.READY_ENDPOINT)
    assert peer.requests[0].endswith(b"Content-Length: 0\r\n\r\n")
    assert peer.requests[0].startswith(b"GET /readyz HTTP/1.1\r\n")


def test_the_body_is_env_and_config_in_go_s_base64():
    config = bytes([0xFB, 0xFF, 0x00]) + b'{"type":"bridge"}'  # '+', '/' and padding
    env = {"CNI_COMMAND": "ADD", "PATH": "/usr/bin", "ODD": "caf\xe9"}
    body = json.loads(api.encode_request(env, config))
    assert list(body) == ["env", "config"]  # no interfaceAttributes unless given
    assert body["env"] == env
    assert body["config"] == base64.standard_b64encode(config).decode()
    assert "\n" not in body["config"] and body["config"].startswith("+/8A")


def test_a_delegate_request_carries_the_interface_attributes():
    attributes = {"ipRequest": ["10.1.1.5/24"], "macRequest": "02:00:00:00:00:01"}
    body = json.loads(api.encode_request({}, b"", attributes))
    assert body == {"env": {}, "config": "", "interfaceAttributes": attributes}


# ---- the answer ---------------------------------------------------------------------------------

def test_content_length_ends_the_body_without_waiting_for_eof(peer):
    peer.answer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
                b"Content-Length: 13\r\n\r\n{\"Result\"",
                b":{}}trailing bytes past the length")
    response = request(peer, "POST", api.CNI_ENDPOINT, b"{}")
    assert (response.status, response.body) == (200, b'{"Result":{}}')


def test_a_body_larger_than_one_read(peer):
    payload = b"x" * (3 * 65536 + 17)
    peer.answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload), payload)
    assert request(peer).body == payload


def test_a_chunked_answer_is_reassembled_without_waiting_for_eof(peer):
    # Go's net/http sends a large answer chunked; the extension is legal and ignored
    peer.answer(b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\n{\"msg\r\n", b"c;ext=1\r\n\":\"0\\r\\n\\r\\n\r\n",
                b"2\r\n\"}\r\n", b"0\r\n\r\n")
    response = request(peer)
    assert response.status == 400
    assert response.body == b'{"msg":"0\\r\\n\\r\\n"}'


def test_a_chunk_ending_in_what_looks_like_the_last_chunk_does_not_end_the_body(peer):
    # a read that ends after "...0\r\n" + the chunk's CRLF: the data seen so far ends in
    # "0\r\n\r\n", as a whole chunked body does; the body goes on in the next read
    peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab0\r\n\r\n",
                b"10\r\n", b"\r\n-sixteen-bytes\r\n", b"0\r\n\r\n", read_apart=True)
    assert request(peer).body == b"ab0\r\n\r\n-sixteen-bytes"


def test_a_chunked_answer_cut_short_is_what_arrived(peer):
    peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\nbody\r\n8\r\ncut", close=True)
    assert request(peer).body == b"bodycut"


def test_a_chunked_answer_with_trailers_ends_at_its_last_chunk(peer):
    peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
                b"4\r\nbody\r\n0\r\nX-Trailer: yes\r\n\r\n")
    assert request(peer).body == b"body"


def test_an_answer_without_framing_ends_at_eof(peer):
    peer.answer(b"HTTP/1.0 200 OK\r\n\r\n", b"until ", b"the end", close=True)
    response = request(peer)
    assert (response.status, response.body) == (200, b"until the end")


def test_a_connection_closed_before_the_answer_is_a_connection_error(peer):
    peer.answer(b"HTTP/1.1 200 OK\r\nContent-", close=True)
    with pytest.raises(ConnectionError) as caught:
        request(peer)
    assert "closed the connection before answering" in str(caught.value)


@pytest.mark.parametrize("line", [b"HTTP/1.1", b"HTTP/1.1 OK", b"SSH-2.0-OpenSSH"])
def test_a_malformed_status_line_is_a_connection_error(peer, line):
    peer.answer(line + b"\r\nContent-Length: 0\r\n\r\n", close=True)
    with pytest.raises(ConnectionError) as caught:
        request(peer)
    assert "malformed HTTP status line" in str(caught.value)


@pytest.mark.parametrize("framing", [b"Content-Length: ten", b"Content-Length: -4",
                                     b"Transfer-Encoding: chunked\r\n\r\nzz\r\nbody"])
def test_a_malformed_length_is_a_connection_error(peer, framing):
    # a ValueError would reach the runtime as "failed unexpectedly", and the tools' checks
    # for an unreachable daemon (OSError) would not catch it
    peer.answer(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n", close=True)
    with pytest.raises(ConnectionError) as caught:
        request(peer)
    assert "malformed" in str(caught.value) and "in multusd's answer" in str(caught.value)


def test_a_daemon_that_does_not_answer_is_a_timeout(peer):
    peer.answer(silent=True)
    with pytest.raises(OSError) as caught:
        request(peer, timeout=0.2)
    assert isinstance(caught.value, socket.timeout)


def test_no_socket_and_no_listener_are_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        api.http_request(str(tmp_path / "absent.sock"), "GET", "/healthz", timeout=5)
    stale = str(tmp_path / "stale.sock")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(stale)
    bound.close()  # the file stays, nothing listens: what a stopped daemon leaves
    assert os.path.exists(stale)
    with pytest.raises(ConnectionRefusedError):
        api.http_request(stale, "GET", "/healthz", timeout=5)


# ---- post_failure -------------------------------------------------------------------------------

def answer(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status.encode(), len(body), body)


def test_post_failure_is_empty_for_200_and_posts_the_body(peer):
    peer.answer(answer("200 OK", b""))
    assert api.post_failure(peer.path, api.DELEGATE_ENDPOINT, b'{"env":{}}', 5.0) == ""
    assert peer.requests[0].startswith(b"POST /delegate HTTP/1.1\r\n")
    assert peer.requests[0].endswith(b'\r\n\r\n{"env":{}}')


def test_post_failure_is_the_cni_errors_msg(peer):
    error = {"cniVersion": "1.0.0", "code": 7, "msg": "cannot find NAD default/net1",
             "details": "x"}
    peer.answer(answer("400 Bad Request", json.dumps(error).encode()))
    assert api.post_failure(peer.path, api.CNI_ENDPOINT, b"{}", 5.0) == \
        "cannot find NAD default/net1"


@pytest.mark.parametrize("status,body", [
    ("500 Internal Server Error", b"panic: runtime error"),
    ("400 Bad Request", b'{"code": 7, "msg": ""}'),
    ("400 Bad Request", b'["not", "an", "object"]'),
    ("503 Service Unavailable", b""),
])
def test_post_failure_without_a_msg_is_the_http_status(peer, status, body):
    peer.answer(answer(status, body))
    assert api.post_failure(peer.path, api.CNI_ENDPOINT, b"{}", 5.0) == \
        f"HTTP {status.split()[0]} from the daemon"


def test_post_failure_raises_when_the_daemon_is_unreachable(tmp_path):
    with pytest.raises(OSError):
        api.post_failure(str(tmp_path / "absent.sock"), api.CNI_ENDPOINT, b"{}", 5.0)
