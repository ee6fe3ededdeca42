"""multusd.kube.transport: a request's deadline holds whole, at every step a server can stall.

A socket timeout bounds one ``recv``; these servers send a byte now and then, so only a cut at
the deadline ends the request (each would answer in full, in tens of seconds, to a client that
waited). The servers are real: the stand-in API server trickling its answer
(tests/kubeapi.py), a listener whose queue is full, a TLS server or proxy behind a peer that
relays one byte at a time (tests/slowpeer.py).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from multusd.kube.clientconfig import ClientConfig
from multusd.kube.deadlines import WATCHDOG
from multusd.kube.transport import NoAnswerInTime, Transport
from multusd.kube.watchstream import watch_events
from slowpeer import SlowPeer
from testlib import token_kubeconfig, wait_for

POD = "/api/v1/namespaces/default/pods/web"
TOKEN = "tok-77e1d0c2b3a49586"


def kubeconfig(tmp_path, server: str, **cluster) -> str:
    return token_kubeconfig(tmp_path / f"kubeconfig-{len(list(tmp_path.iterdir()))}", TOKEN,
                            server=server, **cluster)


@pytest.fixture
def transport_of():
    made = []

    def make(path: str) -> Transport:
        config = ClientConfig(path)
        made.append(config)
        return config.transport

    yield make
    for config in made:
        config.close()


@pytest.fixture
def slow_peer():
    made = []

    def make(**options) -> SlowPeer:
        made.append(SlowPeer(**options))
        return made[-1]

    yield make
    for peer in made:
        peer.stop()


def no_answer(transport: Transport, seconds: float, path: str = POD) -> NoAnswerInTime:
    """The NoAnswerInTime of a GET given ``seconds``."""
    with pytest.raises(NoAnswerInTime) as caught:
        transport.request("GET", path, deadline=time.monotonic() + seconds)
    return caught.value


def test_a_trickled_answer_is_cut_at_the_deadline(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    kube_api.trickle("GET", POD, head_after=0.1, interval=0.05)  # whole in ~30 s
    transport = transport_of(kube_api.kubeconfig_path)
    error = no_answer(transport, 1.0)
    assert error.server == f"127.0.0.1:{kube_api.port}"
    assert error.stage == "waiting for the answer"  # its headers were still trickling
    assert str(error).startswith(f"127.0.0.1:{kube_api.port} did not answer within")
    # the server sees its client go: the connection was cut, not left to the server
    wait_for(lambda: kube_api.trickled == [(POD, "client gone")], 10, what="the cut")
    assert kube_api.count("GET", POD) == 1  # a timeout is not retried: the time is up
    # the next request gets a new connection and its answer; no alarm is left armed
    response = transport.request("GET", POD, deadline=time.monotonic() + 10)
    assert json.loads(response.data)["metadata"]["name"] == "web"
    response.release_conn()
    assert WATCHDOG.pending() == 0


def test_a_trickle_of_many_requests_ends_each_at_its_own_deadline(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    kube_api.trickle("GET", POD, seconds=600, head_after=0.0, interval=0.05)
    transport = transport_of(kube_api.kubeconfig_path)
    for _ in range(3):
        no_answer(transport, 0.3)
    kube_api.clear_failures()
    wait_for(lambda: len(kube_api.trickled) == 3, 10, what="three trickles to end")
    assert all(outcome != "whole" for _, outcome in kube_api.trickled)


def full_listener() -> tuple:
    """A listener whose accept queue is full: the kernel drops the next SYNs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    while True:
        filler = socket.socket()
        filler.setblocking(False)
        fillers.append(filler)
        if filler.connect_ex(listener.getsockname()) not in (0, 115):  # EINPROGRESS
            break
        try:
            wait_for(lambda: _connected(filler), 0.5, what="a filler connection")
        except AssertionError:
            break  # this one waits: the queue is full
    return listener, fillers


def _connected(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and _peer(sock)


def _peer(sock: socket.socket) -> bool:
    try:
        sock.getpeername()
        return True
    except OSError:
        return False


def test_a_connect_that_is_never_accepted_is_cut_at_the_deadline(tmp_path, transport_of):
    listener, fillers = full_listener()
    try:
        port = listener.getsockname()[1]
        transport = transport_of(kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
        error = no_answer(transport, 0.5)
        assert error.stage == "connecting" and error.server == f"127.0.0.1:{port}"
    finally:
        for sock in fillers + [listener]:
            sock.close()


def test_a_tls_handshake_that_never_ends_is_cut_at_the_deadline(tmp_path, transport_of,
                                                                  slow_peer):
    silent = slow_peer()  # accepts, reads the ClientHello, says nothing
    transport = transport_of(kubeconfig(tmp_path, f"https://127.0.0.1:{silent.port}"))
    error = no_answer(transport, 0.5)
    assert error.stage == "the TLS handshake"
    wait_for(lambda: silent.client_gone == 1, 10, what="the client to hang up")


def test_a_tls_handshake_that_trickles_is_cut_at_the_deadline(make_kube_api, tmp_path,
                                                              transport_of, slow_peer):
    api = make_kube_api(tls=True)
    api.add_pod("default", "web")
    relay = slow_peer(upstream=("127.0.0.1", api.port))  # the server's hello, byte by byte
    transport = transport_of(kubeconfig(tmp_path, f"https://127.0.0.1:{relay.port}",
                                        **{"certificate-authority": api.ca_path}))
    error = no_answer(transport, 1.0)
    assert error.stage == "the TLS handshake"
    wait_for(lambda: relay.client_gone == 1, 10, what="the client to hang up")


def test_a_proxy_that_trickles_its_connect_answer_is_cut_at_the_deadline(tmp_path,
                                                                         transport_of,
                                                                         slow_peer):
    proxy = slow_peer(answer=b"HTTP/1.1 200 Connection established\r\n\r\n")
    transport = transport_of(kubeconfig(tmp_path, "https://api.invalid:6443",
                                        **{"proxy-url": f"http://127.0.0.1:{proxy.port}"}))
    error = no_answer(transport, 0.5)
    assert error.stage == "the proxy's CONNECT" and error.server == "api.invalid:6443"


def test_a_watch_is_bounded_up_to_its_head_and_then_by_its_read_timeout(kube_api,
                                                                        transport_of):
    transport = transport_of(kube_api.kubeconfig_path)
    deadline = time.monotonic() + 0.3
    response = transport.request("GET", "/api/v1/pods", query={"watch": True},
                                 deadline=deadline, read_timeout=30, stream=True)
    try:
        wait_for(lambda: time.monotonic() > deadline + 0.2, 5, what="the deadline to pass")
        kube_api.add_pod("default", "late")
        event = next(watch_events(response))
        assert event["object"]["metadata"]["name"] == "late"
    finally:
        response.close()
    assert WATCHDOG.pending() == 0


def test_a_request_needs_a_deadline_or_a_timeout(kube_api, transport_of):
    with pytest.raises(TypeError):
        transport_of(kube_api.kubeconfig_path).request("GET", POD)
