"""multusd.kube.transport: framing, Host and proxy lines (IPv6 too), keep-alive, retries, 401.

Driven through real local servers: the stand-in API server (tests/kubeapi.py) for behaviour,
and a byte recorder (tests/wirepeer.py) where the exact bytes on the wire are the point.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading

import pytest

from multusd.kube import retries
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.connections import TunnelError
from multusd.kube.transport import ApiError, Transport, path_of
from testlib import token_kubeconfig, wait_for
from wirepeer import WirePeer

TOKEN = "tok-5e1f0c9a7b3d2e4f"
POD = "/api/v1/namespaces/default/pods/web"
EVENTS = "/api/v1/namespaces/default/events"


def kubeconfig(tmp_path, server: str, *, proxy: str = "", **cluster) -> str:
    cluster = {"server": server, **cluster}
    if proxy:
        cluster["proxy-url"] = proxy
    return token_kubeconfig(tmp_path / "kubeconfig", TOKEN, **cluster)


@pytest.fixture
def peer():
    made = []

    def make(host: str = "127.0.0.1") -> WirePeer:
        made.append(WirePeer(host))
        return made[-1]

    yield make
    for one in made:
        one.stop()


@pytest.fixture
def transport_of():
    made = []

    def make(path: str, **options) -> Transport:
        config = ClientConfig(path, **options)
        made.append(config)
        return config.transport

    yield make
    for config in made:
        config.close()


def event(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web"},
            "reason": "Test", "message": "m", "type": "Normal"}


def get(transport: Transport, path: str = POD, **options) -> int:
    response = transport.request("GET", path, timeout=options.pop("timeout", 10.0), **options)
    status = response.status
    response.data  # noqa: B018
    response.release_conn()
    return status


# ---- framing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_request_is_framed_with_host_credentials_and_a_compact_json_body(peer, tmp_path,
                                                                            transport_of, host):
    wire = peer(host)
    transport = transport_of(kubeconfig(tmp_path, wire.url + "/"))
    path = path_of("/api/v1/namespaces/{ns}/pods/{name}/status", ns="default", name="a b")
    response = transport.request("PUT", path, query=[("dryRun", "All"), ("force", True),
                                                     ("skipped", None)],
                                 body={"metadata": {"name": "a b"}}, timeout=5)
    assert response.status == 200 and json.loads(response.data) == {}
    head = wire.heads[0]
    assert head.line == ("PUT /api/v1/namespaces/default/pods/a%20b/status?dryRun=All&force=true "
                         "HTTP/1.1")
    authority = f"[{host}]:{wire.port}" if ":" in host else f"{host}:{wire.port}"
    assert head.headers["host"] == authority  # an IPv6 literal in brackets
    assert head.headers["authorization"] == f"Bearer {TOKEN}"
    assert head.headers["user-agent"].startswith("multusd/")
    assert head.headers["accept"] == head.headers["content-type"] == "application/json"
    assert head.body == b'{"metadata":{"name":"a b"}}'
    assert head.headers["content-length"] == str(len(head.body))


def test_a_proxy_gets_the_absolute_uri_with_a_bracketed_ipv6_host(peer, tmp_path, transport_of):
    proxy = peer()
    transport = transport_of(kubeconfig(tmp_path, "http://[fd00::1]:6443/base", proxy=proxy.url))
    assert get(transport, "/version") == 200
    head = proxy.heads[0]
    assert head.line == "GET http://[fd00::1]:6443/base/version HTTP/1.1"
    assert head.headers["host"] == "[fd00::1]:6443"


def test_the_connect_line_to_an_ipv6_server_is_bracketed_and_has_a_host(peer, tmp_path,
                                                                         transport_of):
    proxy = peer().answer(b"HTTP/1.1 502 Bad Gateway\r\n\r\n",
                          b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
    transport = transport_of(kubeconfig(tmp_path, "https://[fd00::1]:6443", proxy=proxy.url,
                                        **{"insecure-skip-tls-verify": True}))
    with pytest.raises(TunnelError) as caught:
        get(transport)
    assert caught.value.status == 403
    assert [head.line for head in proxy.heads] == ["CONNECT [fd00::1]:6443 HTTP/1.1"] * 2
    assert proxy.heads[0].headers["host"] == "[fd00::1]:6443"
    assert transport.retries.snapshot() == {"proxy": 1}  # the proxy's 502: tried again


# ---- keep-alive ------------------------------------------------------------------------------

def test_kept_alive_connections_are_reused(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    assert [get(transport) for _ in range(3)] == [200] * 3
    assert kube_api.connections_accepted == 1


def test_a_connection_the_server_closed_while_idle_is_not_used(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    assert get(transport) == 200
    kube_api.restart()  # cuts every connection: the kept one is closed
    assert get(transport) == 200
    assert transport.retries.snapshot() == {}  # seen closed before use, nothing sent again
    assert kube_api.count("GET", POD) == 2


def test_a_kept_alive_connection_cut_as_it_is_used_is_resent_once(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    assert get(transport) == 200
    kube_api.fail_next("GET", POD, drop="close")  # read, then closed without an answer
    assert get(transport, stream=True) == 200  # streamed: no retries, but the one resend
    assert kube_api.count("GET", POD) == 3
    assert transport.retries.snapshot() == {"closed": 1}
    kube_api.fail_next("GET", POD, drop="close", times=2)
    with pytest.raises(http.client.RemoteDisconnected):
        get(transport, stream=True)  # only once
    assert kube_api.count("GET", POD) == 5


def test_the_idle_pool_keeps_pool_size_connections(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path, pool_size=4)

    def six_at_once() -> None:  # six answers unread at once: six connections in use
        held = [transport.request("GET", POD, timeout=5, stream=True) for _ in range(6)]
        for response in held:
            response.data  # noqa: B018
            response.release_conn()

    six_at_once()
    assert kube_api.connections_accepted == 6
    six_at_once()
    assert kube_api.connections_accepted == 6 + 2  # four were kept


# ---- retries ---------------------------------------------------------------------------------

def test_transient_answers_are_retried_until_one_succeeds(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    for status, retry_after in ((503, None), (429, 1), (500, None), (504, "0")):
        kube_api.fail_next("GET", POD, status, retry_after=retry_after)
    assert get(transport, timeout=30) == 200
    assert kube_api.count("GET", POD) == 5
    assert transport.retries.snapshot() == {"503": 1, "429": 1, "500": 1, "504": 1}


@pytest.mark.parametrize("status,retry_after,resent", [
    (503, None, False), (500, None, False), (502, None, False),  # it may have been processed
    (503, 0, True), (500, "0", True),  # the server asks for it
    (429, None, True), (429, 0, True),  # API Priority and Fairness: not processed
])
def test_a_post_is_resent_only_when_the_server_cannot_have_processed_it(
        kube_api, transport_of, status, retry_after, resent):
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.fail_next("POST", EVENTS, status, retry_after=retry_after)
    if resent:
        assert transport.request("POST", EVENTS, body=event("e"), timeout=10).status == 201
        assert len(kube_api.events) == 1
    else:
        with pytest.raises(ApiError) as caught:
            transport.request("POST", EVENTS, body=event("e"), timeout=10)
        assert caught.value.status == status and caught.value.attempts == 1
        assert kube_api.events == []
    assert kube_api.count("POST", EVENTS) == (2 if resent else 1)


def test_a_put_is_retried_on_a_server_error(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    pod = kube_api.pod("default", "web")
    pod["metadata"]["annotations"]["a"] = "b"
    kube_api.fail_next("PUT", POD + "/status", 500)
    assert transport.request("PUT", POD + "/status", body=pod, timeout=10).status == 200
    assert kube_api.pod("default", "web")["metadata"]["annotations"]["a"] == "b"
    assert kube_api.count("PUT", POD + "/status") == 2


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_post_cut_after_it_was_read_is_not_resent(make_kube_api, transport_of, tls, how):
    api = make_kube_api(tls=tls)
    transport = transport_of(api.kubeconfig_path)
    api.fail_next("POST", EVENTS, drop=how)  # over TLS, "close" is a TLS EOF
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError)):
        transport.request("POST", EVENTS, body=event("e"), timeout=10)
    assert api.count("POST", EVENTS) == 1 and api.events == []


@pytest.mark.parametrize("how,cause", [("reset", "reset"), ("close", "tls-eof")])
def test_a_connection_cut_before_the_request_is_retried_for_every_verb(make_kube_api,
                                                                       transport_of, how, cause):
    api = make_kube_api(tls=True)  # cut before the TLS handshake ends: nothing was sent
    transport = transport_of(api.kubeconfig_path)
    api.fail_connections(how, times=2)
    assert transport.request("POST", EVENTS, body=event("e"), timeout=10).status == 201
    assert len(api.events) == 1 and api.connections_accepted == 3
    assert transport.retries.snapshot() == {cause: 2}


def test_a_get_cut_after_it_was_read_is_retried(make_kube_api, transport_of):
    api = make_kube_api(tls=True)
    api.add_pod("default", "web")
    transport = transport_of(api.kubeconfig_path)
    api.fail_next("GET", POD, drop="reset")  # on a new connection: not a stale one
    api.fail_next("GET", POD, drop="close")
    assert get(transport) == 200
    assert api.count("GET", POD) == 3


def test_refused_connections_are_retried_until_the_server_is_back(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.stop()
    result = {}
    thread = threading.Thread(target=lambda: result.update(status=get(transport, timeout=30)))
    thread.start()
    wait_for(lambda: transport.retries.snapshot().get("refused", 0) >= 2, 20,
             what="two refused attempts")
    kube_api.start()
    thread.join(30)
    assert result == {"status": 200}


def test_retry_after_beyond_the_deadline_fails_at_once(kube_api, transport_of):
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.fail_next("GET", POD, 429, retry_after=30)
    with pytest.raises(ApiError) as caught:
        get(transport, timeout=5)
    assert caught.value.status == 429 and caught.value.retry_after == 30.0
    assert caught.value.attempts == 1 and kube_api.count("GET", POD) == 1


def test_retries_end_with_the_deadline(kube_api, transport_of):
    kube_api.add_pod("default", "web")
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.fail_next("GET", POD, 503, times=None)
    with pytest.raises(ApiError) as caught:
        get(transport, timeout=1.0)
    sent = kube_api.count("GET", POD)
    assert caught.value.status == 503 and caught.value.attempts == sent
    assert 1 < sent <= retries.MAX_RETRIES + 1


def test_streamed_requests_are_retried_only_when_asked(kube_api, transport_of):
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.fail_next("GET", "/api/v1/pods", 503, times=2)
    with pytest.raises(ApiError):
        transport.request("GET", "/api/v1/pods", timeout=5, stream=True)
    response = transport.request("GET", "/api/v1/pods", timeout=5, stream=True, retry=True)
    assert json.loads(response.data)["kind"] == "PodList"
    assert kube_api.count("GET", "/api/v1/pods") == 3


# ---- credentials -----------------------------------------------------------------------------

def test_a_replaced_token_file_is_read_before_the_next_request(make_kube_api, transport_of):
    api = make_kube_api(token_file=True)
    api.add_pod("default", "web")
    transport = transport_of(api.kubeconfig_path)
    assert get(transport) == 200
    api.rotate_token()  # the kubelet writes a new token, the old one is revoked
    assert get(transport) == 200
    assert api.count("GET", POD) == 2 and transport.credentials.rotations == 1


def test_a_401_rereads_the_token_file_and_resends_once(make_kube_api, transport_of):
    api = make_kube_api(token_file=True)
    api.add_pod("default", "web")
    path = api.kubeconfig_path + ".token"
    transport = transport_of(api.kubeconfig_path)
    assert get(transport) == 200
    api.rotate_token(write_files=False)  # the server rejects the old token ...
    with pytest.raises(ApiError) as caught:  # ... and the file still has it: no resend
        get(transport)
    assert caught.value.status == 401 and api.count("GET", POD) == 2
    # a rotation stat() cannot see (same inode, size and mtime): only the 401 tells
    before = os.stat(path)
    new = api.rotate_token("fake-kube-token-" + "7" * 16, write_files=False)
    assert len(new) == before.st_size - 1
    with open(path, "r+") as handle:
        handle.write(new + "\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert get(transport) == 200  # 401, the file read again, the request sent once more
    assert api.count("GET", POD) == 4 and transport.credentials.rotations == 1


def test_a_request_waiting_to_be_retried_gives_up_when_the_client_stops(kube_api,
                                                                         transport_of):
    transport = transport_of(kube_api.kubeconfig_path)
    kube_api.fail_next("GET", POD, 503, times=None)
    failed = []

    def send() -> None:
        try:
            get(transport, timeout=60)
        except ApiError as exc:
            failed.append(exc.status)

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: transport.retries.snapshot().get("503", 0) >= 2, 20, what="two retries")
    transport.stop_retrying()  # what KubeClient.stop does first
    thread.join(20)
    assert not thread.is_alive() and failed == [503]
