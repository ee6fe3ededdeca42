"""multusd.kube.connections: the CONNECT tunnel, IPv6 authorities, TLS names, keep-alive probes,
and telling an idle connection the server closed.

Over real local sockets: a socket pair for the proxy's side of a CONNECT (the test writes
exactly what a proxy might answer), a piping CONNECT proxy in front of the stand-in API server
over TLS (tests/kubeapi.py, IPv4 and IPv6), and plain listeners for idle connections.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import struct
import subprocess
import sys
import threading
from typing import Iterator, List, Optional

import pytest

from multusd.kube.connections import (CONNECT_HEAD_LIMIT, HTTPConnection, HTTPSConnection,
                                      TunnelError, authority, open_tunnel, peer_closed)
from testlib import bind_in_private_mounts, wait_for


# ---- authority ---------------------------------------------------------------------------------

@pytest.mark.parametrize("host,port,expected", [
    ("fd00::1", 6443, "[fd00::1]:6443"), ("::1", 443, "[::1]:443"),
    ("10.0.0.1", 6443, "10.0.0.1:6443"), ("api.example", 443, "api.example:443")])
def test_an_ipv6_literal_is_bracketed_in_an_authority(host, port, expected):
    assert authority(host, port) == expected


# ---- open_tunnel: the CONNECT as a proxy sees it -------------------------------------------------

class ProxySide:
    """The proxy's end of a socket pair whose other end open_tunnel() talks on."""

    def __init__(self) -> None:
        self.client, self.proxy = socket.socketpair()
        self.client.settimeout(10)
        self.proxy.settimeout(10)

    def head(self) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.proxy.recv(4096)
            assert chunk, "the client closed before its CONNECT was whole"
            data += chunk
        return data

    def close(self) -> None:
        self.client.close()
        self.proxy.close()


@pytest.fixture
def pair() -> Iterator[ProxySide]:
    side = ProxySide()
    yield side
    side.close()


def tunnel(pair: ProxySide, *answers: bytes, target: str = "[fd00::1]:6443",
           user_agent: str = "", close: bool = False) -> bytes:
    """open_tunnel() on the client end while the proxy end answers; the CONNECT it read."""
    seen: List[bytes] = []

    def proxy() -> None:
        seen.append(pair.head())
        for answer in answers:
            pair.proxy.sendall(answer)
        if close:
            pair.proxy.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    try:
        open_tunnel(pair.client, target, user_agent)
    finally:
        thread.join(10)
    return seen[0]


def test_the_connect_names_the_target_in_its_line_and_host_header(pair):
    sent = tunnel(pair, b"HTTP/1.1 200 Connection established\r\n\r\n", user_agent="multusd/9")
    assert sent == (b"CONNECT [fd00::1]:6443 HTTP/1.1\r\nHost: [fd00::1]:6443\r\n"
                    b"User-Agent: multusd/9\r\n\r\n")


def test_without_a_user_agent_the_connect_has_none(pair):
    sent = tunnel(pair, b"HTTP/1.0 200 OK\r\n\r\n", target="10.0.0.1:6443")
    assert sent == b"CONNECT 10.0.0.1:6443 HTTP/1.1\r\nHost: 10.0.0.1:6443\r\n\r\n"


@pytest.mark.parametrize("answer", [
    [b"HTTP/1.1 204 No Content\r\nVia: squid\r\n\r\n"],  # any 2xx opens the tunnel
    [bytes([b]) for b in b"HTTP/1.1 200 Connection established\r\n\r\n"],  # byte by byte
])
def test_any_2xx_opens_the_tunnel_however_it_arrives(pair, answer):
    tunnel(pair, *answer)
    pair.proxy.sendall(b"tls bytes")  # the socket is the tunnel's now, nothing was read ahead
    assert pair.client.recv(100) == b"tls bytes"


@pytest.mark.parametrize("answer,status,message", [
    (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n", 407,
     "Tunnel connection failed: 407 Proxy Authentication Required"),
    (b"HTTP/1.1 502\r\n\r\n", 502, "Tunnel connection failed: 502"),
    (b"HTTP/1.1 301 Moved\r\n\r\n", 301, "Tunnel connection failed: 301 Moved"),
])
def test_a_refused_connect_is_a_tunnel_error_with_the_proxys_status(pair, answer, status,
                                                                   message):
    with pytest.raises(TunnelError) as caught:
        tunnel(pair, answer)
    assert caught.value.status == status and str(caught.value) == message
    assert isinstance(caught.value, OSError)  # a connection failure for the transport


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 OK fine\r\n\r\n",
                                    b"\r\n\r\n"])
def test_an_answer_that_is_not_http_is_a_tunnel_error(pair, answer):
    with pytest.raises(TunnelError) as caught:
        tunnel(pair, answer)
    assert caught.value.status == 0 and "is not HTTP" in str(caught.value)


def test_a_proxy_that_closes_during_the_connect_is_a_remote_disconnect(pair):
    with pytest.raises(http.client.RemoteDisconnected):
        tunnel(pair, b"HTTP/1.1 200 Conn", close=True)


def test_an_endless_answer_head_is_cut_off(pair):
    with pytest.raises(TunnelError) as caught:
        tunnel(pair, b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"a" * CONNECT_HEAD_LIMIT)
    assert caught.value.status == 0 and "too long" in str(caught.value)


# ---- HTTPSConnection: TLS, through a tunnel or not -------------------------------------------

class TunnelProxy:
    """A CONNECT proxy on 127.0.0.1 that pipes each tunnel to its target; :attr:`heads` holds
    the CONNECT requests as they arrived."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.heads: List[bytes] = []
        self.sockets: List[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(conn)
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        self.heads.append(head)
        target = head.split(b" ")[1].decode()
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        self.sockets.append(upstream)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
        _pipe(conn, upstream)

    def stop(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def proxy() -> Iterator[TunnelProxy]:
    made = TunnelProxy()
    yield made
    made.stop()


def https_to(api, *, server_name: str, via: Optional[TunnelProxy] = None) -> HTTPSConnection:
    context = ssl.create_default_context(cafile=api.ca_path)
    if via is None:
        return HTTPSConnection(api.host, api.port, timeout=10, context=context,
                               server_name=server_name)
    return HTTPSConnection("127.0.0.1", via.port, timeout=10, context=context,
                           server_name=server_name, tunnel_to=authority(api.host, api.port),
                           user_agent="multusd/test")


def version_over(connection: http.client.HTTPConnection, api) -> int:
    connection.request("GET", "/version",
                       headers={"Authorization": f"Bearer {api.token}",
                                "Host": authority(api.host, api.port)})
    response = connection.getresponse()
    response.read()
    return response.status


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["ipv4", "ipv6"])
def test_tls_through_the_tunnel_reaches_the_server_the_connect_names(make_kube_api, proxy,
                                                                      host):
    api = make_kube_api(tls=True, host=host)
    connection = https_to(api, server_name="localhost", via=proxy)
    try:
        assert version_over(connection, api) == 200
        assert isinstance(connection.sock, ssl.SSLSocket)
    finally:
        connection.close()
    target = authority(host, api.port).encode()
    assert proxy.heads == [b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target +
                           b"\r\nUser-Agent: multusd/test\r\n\r\n"]
    assert api.connections_accepted == 1


def test_the_certificate_is_checked_against_the_server_name(make_kube_api, proxy):
    api = make_kube_api(tls=True)
    for server_name in ("127.0.0.1", "localhost"):  # an IP literal is checked too
        connection = https_to(api, server_name=server_name)
        try:
            assert version_over(connection, api) == 200
        finally:
            connection.close()
    for via in (None, proxy):
        connection = https_to(api, server_name="not-the-apiserver.example", via=via)
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            connection.connect()
        connection.close()
        assert "not-the-apiserver.example" in str(caught.value)


def test_a_refused_connect_fails_the_connection(make_kube_api):
    api = make_kube_api(tls=True)
    refusing = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = refusing.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(4096):
                pass
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    context = ssl.create_default_context(cafile=api.ca_path)
    connection = HTTPSConnection("127.0.0.1", refusing.getsockname()[1], timeout=10,
                                 context=context, server_name="localhost",
                                 tunnel_to=authority(api.host, api.port))
    try:
        with pytest.raises(TunnelError) as caught:
            connection.connect()
        assert caught.value.status == 403
    finally:
        connection.close()
        thread.join(10)
        refusing.close()
    assert api.connections_accepted == 0


# ---- keep-alive probes ---------------------------------------------------------------------------

def keepalive_options(sock: socket.socket) -> tuple:
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))


def test_both_connections_turn_on_keepalive_probes(make_kube_api, proxy):
    plain = make_kube_api()
    connection = HTTPConnection(plain.host, plain.port, timeout=10)
    try:
        connection.connect()
        assert keepalive_options(connection.sock) == (1, 15, 5, 3)
    finally:
        connection.close()
    api = make_kube_api(tls=True)
    for via in (None, proxy):
        tls = https_to(api, server_name="localhost", via=via)
        try:
            tls.connect()
            assert keepalive_options(tls.sock) == (1, 15, 5, 3)
        finally:
            tls.close()


# ---- peer_closed ---------------------------------------------------------------------------------

class Listener:
    """A plain TCP listener whose accepted connections the test holds (:attr:`accepted`)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]

    def connect(self) -> tuple:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        server, _ = self.socket.accept()
        return client, server


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    yield made
    made.socket.close()


def test_an_idle_open_connection_is_usable(listener):
    client, server = listener.connect()
    with client, server:
        assert not peer_closed(client)


@pytest.mark.parametrize("how", ["close", "reset", "unasked bytes"])
def test_a_connection_the_server_ended_or_spoke_on_is_not_reused(listener, how):
    client, server = listener.connect()
    with client:
        assert not peer_closed(client)
        if how == "unasked bytes":
            server.sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        elif how == "reset":
            server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()
        wait_for(lambda: peer_closed(client), what=f"the server's {how} to arrive")


def test_a_closed_socket_counts_as_closed(listener):
    client, server = listener.connect()
    with server:
        client.close()
        assert peer_closed(client)


def test_tls_bytes_already_decrypted_count_though_the_socket_is_drained(make_kube_api, tmp_path):
    api = make_kube_api(tls=True)  # for its certificate and key
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(api.ca_path, api.ca_path.replace(".crt", ".key"))
    listening = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listening.accept()
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(b"ab")  # one TLS record
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cafile=api.ca_path)
    raw = socket.create_connection(listening.getsockname(), timeout=10)
    try:
        with client_context.wrap_socket(raw, server_hostname="localhost") as client:
            assert client.recv(1) == b"a"  # the record is read whole: "b" waits inside TLS
            assert client.pending() == 1
            assert peer_closed(client)
    finally:
        done.set()
        thread.join(10)
        listening.close()


# ---- a name resolved within the deadline ---------------------------------------------------------

RESOLVE_IN_CHILD = """
import socket, time
from multusd.kube.connections import open_tcp
try:
    open_tcp("api.cluster.multusd-test", 6443, deadline=time.monotonic() + 0.5, timeout=60)
except socket.timeout as exc:
    print("timeout:", exc)
except OSError as exc:
    print("other:", type(exc).__name__, exc)
"""


def test_a_name_the_resolver_does_not_answer_fails_at_the_deadline(tmp_path):
    # a name server that reads every query and answers none, named by a resolv.conf that only
    # the child sees (a mount namespace of its own); getaddrinfo would wait its 30 s
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for last in range(77, 100):
        try:
            silent.bind((f"127.0.0.{last}", 53))
            break
        except OSError:
            continue
    else:
        pytest.fail("no free 127.0.0.x:53 for the silent name server")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver 127.0.0.{last}\noptions timeout:30 attempts:1\n")
    try:
        done = subprocess.run([sys.executable, "-c", RESOLVE_IN_CHILD], capture_output=True,
                              text=True, timeout=120,
                              preexec_fn=bind_in_private_mounts(str(resolv), "/etc/resolv.conf"))
        silent.setblocking(False)
        query = silent.recv(512)  # the child's lookup did reach the name server
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    assert query
    assert done.stdout.strip() == ("timeout: resolving 'api.cluster.multusd-test' did not end "
                                   "before the request's deadline")
