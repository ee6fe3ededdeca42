"""multusd.kube.clientconfig: the one translation of request failures into CNI errors, redacted.

Each failure is produced by a real request (the stand-in API server, a byte recorder, a
stopped or silent server, a wrong CA) and translated by :meth:`ClientConfig.failure`.
"""

from __future__ import annotations

import json

import pytest

from multusd.errors import MultusError, TryAgainLater
from multusd.kube.clientconfig import RBAC_FILE, ClientConfig, WatchError
from wirepeer import WirePeer

POD = "/api/v1/namespaces/default/pods/web"
ACTION = "get pod default/web"


@pytest.fixture
def configs():
    made = []

    def make(path: str) -> ClientConfig:
        made.append(ClientConfig(path))
        return made[-1]

    yield make
    for config in made:
        config.close()


def failure_of(config: ClientConfig, *, timeout: float = 5.0, path: str = POD) -> MultusError:
    """Send a GET that must fail; its translation."""
    with pytest.raises(config.request_errors()) as caught:
        config.transport.request("GET", path, timeout=timeout)
    return config.failure(caught.value, ACTION)


def with_server(config_path: str, tmp_path, **cluster) -> str:
    document = json.loads(open(config_path).read())
    document["clusters"][0]["cluster"].update(cluster)
    path = tmp_path / "edited.kubeconfig"
    path.write_text(json.dumps(document))
    return str(path)


def test_a_rejected_token_names_the_kubeconfig(kube_api, configs, tmp_path):
    path = kube_api.write_kubeconfig(str(tmp_path / "wrong"), token="wrong-token-123456")
    error = failure_of(configs(path))
    assert type(error) is MultusError and "401 Unauthorized" in error.msg
    assert repr(path) in error.msg and "wrong-token-123456" not in error.msg


def test_forbidden_names_the_permissions_and_the_rbac_file(kube_api, configs):
    kube_api.deny("get", "pods")
    error = failure_of(configs(kube_api.kubeconfig_path))
    assert type(error) is MultusError and "403 Forbidden" in error.msg
    assert 'cannot get resource "pods"' in error.msg and RBAC_FILE in error.msg


def test_a_missing_object_is_not_retried_and_not_try_again(kube_api, configs):
    error = failure_of(configs(kube_api.kubeconfig_path))
    assert type(error) is MultusError and "answered 404" in error.msg
    assert kube_api.count("GET", POD) == 1


def test_overload_is_try_again_later_after_the_retries(kube_api, configs):
    kube_api.fail_next("GET", POD, 429, times=None, retry_after=0)
    error = failure_of(configs(kube_api.kubeconfig_path), timeout=1.0)
    sent = kube_api.count("GET", POD)
    assert isinstance(error, TryAgainLater) and "answered 429" in error.msg
    assert f"after {sent} attempts" in error.msg and "overloaded or restarting" in error.msg


def test_a_stopped_server_is_unreachable_try_again_later(kube_api, configs):
    config = configs(kube_api.kubeconfig_path)
    kube_api.stop()
    error = failure_of(config, timeout=0.5)
    assert isinstance(error, TryAgainLater) and "is unreachable" in error.msg
    assert "refused" in error.msg and "attempts" in error.msg


def test_a_silent_server_is_no_answer_in_time(kube_api, configs):
    config = configs(kube_api.kubeconfig_path)
    kube_api.blackhole()
    try:
        error = failure_of(config, timeout=0.3)
    finally:
        kube_api.blackhole(False)
    assert isinstance(error, TryAgainLater)
    assert "no answer within the request's time" in error.msg


def test_a_wrong_ca_is_a_tls_failure_to_fix(make_kube_api, configs, tmp_path):
    api = make_kube_api(tls=True)
    other = make_kube_api(tls=True)  # its certificate is not the server's
    error = failure_of(configs(with_server(api.kubeconfig_path, tmp_path,
                                           **{"certificate-authority": other.ca_path})))
    assert type(error) is MultusError and "failed the TLS handshake" in error.msg
    assert "self-signed certificate" in error.msg and "certificate-authority" in error.msg


def test_a_tls_connection_cut_every_time_is_try_again_later(make_kube_api, configs):
    api = make_kube_api(tls=True)
    api.fail_connections("close", times=1000)
    error = failure_of(configs(api.kubeconfig_path), timeout=0.5)
    api.clear_failures()
    assert isinstance(error, TryAgainLater) and "the TLS connection was cut" in error.msg
    assert "TLS handshake" not in error.msg


def test_an_answer_that_is_not_json_names_the_server_setting(configs, tmp_path, kube_api):
    peer = WirePeer().answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    try:
        config = configs(with_server(kube_api.kubeconfig_path, tmp_path, server=peer.url))
        response = config.transport.request("GET", POD, timeout=5)
        with pytest.raises(ValueError) as caught:
            json.loads(response.data)
    finally:
        peer.stop()
    error = config.failure(caught.value, ACTION)
    assert "not JSON" in error.msg and "'server'" in error.msg


def test_a_token_that_cannot_be_a_header_is_not_quoted(kube_api, configs, tmp_path):
    secret = "tok-line-one\ntok-line-two"
    path = kube_api.write_kubeconfig(str(tmp_path / "broken"), token="x")
    document = json.loads(open(path).read())
    document["users"][0]["user"]["token"] = secret
    with open(path, "w") as handle:
        json.dump(document, handle)
    error = failure_of(configs(path))
    assert "could not be built (ValueError)" in error.msg
    assert "tok-line" not in error.msg


def test_the_servers_own_message_is_redacted(kube_api, configs, tmp_path):
    token = kube_api.token
    status = json.dumps({"kind": "Status", "code": 403, "message": f"token {token} is banned"})
    peer = WirePeer().answer(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(status), status.encode()))
    try:
        error = failure_of(configs(with_server(kube_api.kubeconfig_path, tmp_path,
                                               server=peer.url)))
    finally:
        peer.stop()
    assert "token <redacted> is banned" in error.msg and token not in error.msg


def test_a_watch_error_event_is_translated_as_the_status_it_carries(kube_api, configs):
    config = configs(kube_api.kubeconfig_path)
    gone = config.failure(WatchError(410, "too old resource version: 5 (9)", "Expired"),
                          "watch pods")
    assert type(gone) is MultusError and "answered 410 (too old resource version" in gone.msg
    leader = config.failure(WatchError(500, "etcdserver: leader changed"), "watch pods")
    assert isinstance(leader, TryAgainLater) and "etcdserver: leader changed" in leader.msg
