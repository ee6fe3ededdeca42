"""multusd.kube under a real cluster's conditions: no NAD CRD, no NAD permission, rotating
credentials (token file, kubelet certificate, exec plugin), NodeRestriction, a dead API server.

Each test runs the real client against the stand-in API server made as unkind as the real one
(tests/kubeapi.py, tests/kubeauth.py); what is asserted is the outcome a node would see.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from harness import watch_bound
from kubeapi import FakeKubeAPI
from multusd.errors import DeadlineExceeded, MultusError, TryAgainLater
from multusd.kube.client import NETWORK_STATUS_ANNOTATION, KubeClient
from multusd.kube.clientconfig import ClientConfig
from testlib import wait_for

NS = "default"
NAD_CONFIG = '{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'
NADS = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
STATUS = json.dumps([{"name": "cbr0", "interface": "eth0", "ips": ["10.1.0.5"],
                      "default": True, "dns": {}}])


@pytest.fixture
def make_client():
    made = []

    def make(api: FakeKubeAPI, **options) -> KubeClient:
        options.setdefault("request_timeout", 5.0)
        client = KubeClient(options.pop("kubeconfig", api.kubeconfig_path), api.node, **options)
        made.append(client)
        client.start()
        return client

    yield make
    for client in made:
        client.stop()


# ---- the NAD API: not installed, forbidden, failing ---------------------------------------------

def test_a_missing_nad_crd_blocks_no_pod_and_names_the_fix(kube_api, make_client):
    kube_api.nad_crd_installed = False
    kube_api.add_pod(NS, "web")
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound()), client.last_error  # readiness: the pod cache only
    wait_for(lambda: client.nad_problem() is not None, watch_bound(), what="the NAD list to fail")
    condition, message = client.nad_problem()
    assert condition == "crd-missing" and "kubectl apply -f" in message
    assert client.get_pod(NS, "web") is not None
    with pytest.raises(MultusError) as info:
        client.get_nad(NS, "net1")
    assert "CRD" in info.value.msg and "network-attachment-definition-crd.yaml" in info.value.msg
    assert not isinstance(info.value, TryAgainLater) and client.nad_refusals == 1
    # the CRD appears: the next lookup is served and wakes the watch out of its backoff
    kube_api.nad_crd_installed = True
    kube_api.add_nad(NS, "net1", NAD_CONFIG)
    assert client.get_nad(NS, "net1").config == NAD_CONFIG
    assert client.wait_synced(watch_bound(), nads=True) and client.nad_problem() is None


def test_nads_the_node_may_not_read_name_the_rbac_file(kube_api, make_client):
    for verb in ("get", "list", "watch"):
        kube_api.deny(verb, "network-attachment-definitions", "k8s.cni.cncf.io")
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound())
    wait_for(lambda: client.nad_problem() is not None, watch_bound(), what="the NAD list to fail")
    assert client.nad_problem()[0] == "forbidden"
    with pytest.raises(MultusError) as info:
        client.get_nad(NS, "net1")
    assert "403" in info.value.msg and "/usr/share/multusd/rbac.yaml" in info.value.msg


def test_a_failing_nad_api_is_asked_live_and_tried_again_later(kube_api, make_client):
    kube_api.fail_next("GET", NADS, 503, times=None)
    client = make_client(kube_api)
    assert client.wait_synced(watch_bound())
    wait_for(lambda: client.nad_problem() is not None, watch_bound(), what="the NAD list to fail")
    assert client.nad_problem()[0] == "unavailable"
    kube_api.fail_next("GET", "/apis/k8s.cni.cncf.io/v1/namespaces", 503, times=None)
    with pytest.raises(TryAgainLater):  # 503 to every retry until the deadline's end
        client.get_nad(NS, "net1", deadline=time.monotonic() + 1.0)
    kube_api.clear_failures()
    assert client.wait_synced(watch_bound(), nads=True)


# ---- credentials that rotate ---------------------------------------------------------------------

def test_a_rotated_token_file_is_read_again(make_kube_api, make_client):
    api = make_kube_api(token_file=True)
    api.add_pod(NS, "web")
    client = make_client(api)
    assert client.wait_synced(watch_bound(), nads=True)
    old = api.token
    api.rotate_token()  # the old token is refused from now on
    api.add_pod(NS, "second", node="elsewhere")  # not in the cache: a live GET
    assert client.get_pod(NS, "second", not_found_wait=0) is not None
    assert client.config.credentials.rotations == 1
    # the watches, cut and reconnected, authenticate with the new token too
    api.restart()
    api.add_pod(NS, "third")
    wait_for(lambda: client.cached_pod(NS, "third") is not None, watch_bound(),
             what="watch after restart")
    assert client.config.redact(f"{old} {api.token}") == "<redacted> <redacted>"


def test_a_401_rereads_the_token_file(make_kube_api, make_client, tmp_path):
    api = make_kube_api(token_file=True)
    client = make_client(api)
    assert client.wait_synced(watch_bound())
    token_path = api.kubeconfig_path + ".token"
    info = os.stat(token_path)
    new = api.rotate_token("rotated-token-same-length-000000", write_files=False)
    with open(token_path, "r+") as handle:  # in place, same size, same mtime: stat sees nothing
        handle.write(new + "\n")
    os.utime(token_path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert os.stat(token_path).st_size == info.st_size
    api.add_pod(NS, "other", node="elsewhere")
    assert client.get_pod(NS, "other", not_found_wait=0) is not None  # 401, re-read, resent
    assert client.config.credentials.rotations == 1


def test_a_rotated_kubelet_certificate_is_used_for_new_connections(make_kube_api, make_client):
    api = make_kube_api(client_certs=True)
    client = make_client(api)
    assert client.wait_synced(watch_bound()), client.last_error
    assert client.config.node_identity() == api.node
    first = os.readlink(api.certs.current)
    api.rotate_client_cert()  # the old certificate is revoked
    assert os.readlink(api.certs.current) != first
    api.add_pod(NS, "other", node="elsewhere")
    assert client.get_pod(NS, "other", not_found_wait=0) is not None
    assert client.config.credentials.tls_generation == 1
    api.restart()  # the watches come back with the new certificate
    api.add_pod(NS, "third")
    wait_for(lambda: client.cached_pod(NS, "third") is not None, watch_bound(),
             what="watch after restart")


def test_a_connection_opened_before_a_certificate_rotation_is_not_reused_after_it(make_kube_api):
    api = make_kube_api(client_certs=True)
    config = ClientConfig(api.kubeconfig_path)
    pods = "/api/v1/namespaces/default/pods"
    try:
        # a request in flight on the old certificate (its answer not read yet) ...
        before = config.transport.request("GET", pods, timeout=5, stream=True)
        api.rotate_client_cert()  # the old certificate is revoked
        # ... while another request sees the rotation and connects with the new pair
        config.transport.request("GET", pods, timeout=5).release_conn()
        assert config.credentials.tls_generation == 1
        before.data  # noqa: B018 - read whole: its connection goes back to the pool
        before.release_conn()
        for _ in range(3):  # neither idle connection may present the revoked certificate
            config.transport.request("GET", pods, timeout=5).release_conn()
    finally:
        config.close()


EXEC_PLUGIN = """#!{python}
import json, sys
token = open({token_file!r}).read().strip()
with open({count_file!r}, "a") as handle:
    handle.write("x")
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": token}}}}))
"""


def test_an_exec_plugin_runs_again_after_a_401_and_its_tokens_are_redacted(
        make_kube_api, make_client, tmp_path):
    api = make_kube_api()
    token_file, count_file = tmp_path / "plugin-token", tmp_path / "runs"
    token_file.write_text(api.token)
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, token_file=str(token_file),
                                         count_file=str(count_file)))
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    document = json.loads(open(api.kubeconfig_path).read())
    document["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
        "interactiveMode": "Never"}}
    kubeconfig = tmp_path / "exec-kubeconfig"
    kubeconfig.write_text(json.dumps(document))
    client = make_client(api, kubeconfig=str(kubeconfig))
    assert client.wait_synced(watch_bound()), client.last_error
    runs = len(count_file.read_text())
    new = api.rotate_token()
    token_file.write_text(new)
    api.add_pod(NS, "other", node="elsewhere")
    assert client.get_pod(NS, "other", not_found_wait=0) is not None
    assert len(count_file.read_text()) == runs + 1
    assert client.config.redact(f"a {new} b") == "a <redacted> b"


# ---- NodeRestriction ------------------------------------------------------------------------------

def test_a_label_changed_since_the_watch_never_fails_the_status_write(make_kube_api,
                                                                        make_client):
    api = make_kube_api(user="system:node:node-a")
    api.add_pod(NS, "web", labels={"app": "web"})
    client = make_client(api)
    assert client.wait_synced(watch_bound())
    pod = client.cached_pod(NS, "web")
    api.update_pod(NS, "web", labels={"app": "web", "rollout": "2"})  # after the watch's copy
    client.set_network_status(pod, STATUS)
    stored = api.pod(NS, "web")
    assert stored["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] == STATUS
    assert stored["metadata"]["labels"] == {"app": "web", "rollout": "2"}


def test_a_pod_of_another_node_is_refused_with_the_servers_reason(make_kube_api, make_client):
    api = make_kube_api(user="system:node:node-a")
    api.add_pod(NS, "web", node="node-b")
    client = make_client(api)
    pod = client.get_pod(NS, "web", not_found_wait=0)
    with pytest.raises(MultusError) as info:
        client.set_network_status(pod, STATUS)
    assert "403" in info.value.msg and "its own node name" in info.value.msg


# ---- a dead API server ----------------------------------------------------------------------------

def test_a_blackholed_api_server_never_holds_a_lookup_past_its_deadline(kube_api, make_client):
    client = make_client(kube_api, request_timeout=30.0)
    assert client.wait_synced(watch_bound())
    kube_api.blackhole()
    try:
        started = time.monotonic()
        with pytest.raises(TryAgainLater) as info:
            client.get_pod(NS, "not-cached", deadline=started + 1.0)
        assert "no answer" in info.value.msg
        # the request's deadline ended it, not the client's 30 s timeout
        assert time.monotonic() - started < client.request_timeout
        with pytest.raises(DeadlineExceeded) as info:  # a deadline already passed: none sent
            client.get_nad(NS, "net1", deadline=time.monotonic() - 1)
        assert "deadline passed" in info.value.msg
    finally:
        kube_api.blackhole(False)


def test_a_silent_watch_is_resumed_without_a_relist(kube_api, make_client):
    client = make_client(kube_api, watch_idle=1.0)
    assert client.wait_synced(watch_bound(), nads=True) and kube_api.wait_for_watchers(2)
    kube_api.blackhole()
    wait_for(lambda: client.watch_reopens.get(("pods", "silence")) and
             client.watch_reopens.get(("network-attachment-definitions", "silence")), watch_bound(),
             what="both watches noticed silent")
    kube_api.blackhole(False)
    kube_api.add_pod(NS, "after")
    wait_for(lambda: client.cached_pod(NS, "after") is not None, watch_bound(),
             what="the resumed watch")
    assert kube_api.count_list_reads("pods") == 1  # resumed, never relisted


# ---- through the daemon and the shim ---------------------------------------------------------------

def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no sample of {name}")


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_the_node_serves_pods_while_the_nad_crd_is_missing(sandbox, kube_api, tmp_path):
    import uuid

    from harness import Cluster, STATUS_KEY
    from multusd.wire import api
    from testlib import free_port

    kube_api.nad_crd_installed = False
    cluster = Cluster(sandbox, kube_api, tmp_path)
    port = free_port()
    cluster.start(metricsPort=port)  # waits for /readyz: the pod cache alone makes it ready
    plain = cluster.pod("plain")
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert cluster.shim("ADD", plain, ns_path, cid).code == 0
    assert STATUS_KEY in kube_api.pod("default", "plain")["metadata"]["annotations"]
    wants = cluster.pod("wants-net", annotations={"k8s.v1.cni.cncf.io/networks": "storage"})
    ns2_name, ns2_path = sandbox.netns()
    cid2 = uuid.uuid4().hex
    refused = cluster.shim("ADD", wants, ns2_path, cid2)
    assert refused.code == 1 and "CRD" in refused.output["msg"]
    assert "kubectl apply -f /usr/share/multusd/network-attachment-definition-crd.yaml" in \
        refused.output["msg"]
    status = json.loads(api.http_request(cluster.daemon.socket_path, "GET", "/status",
                                         timeout=5).body)
    assert status["kube"]["nadProblem"]["condition"] == "crd-missing"
    assert _metric(port, "multusd_nad_api_unavailable") == 1
    assert _metric(port, "multusd_nad_refusals_total") == 1
    # the CRD is installed and the NAD created: the same pod's retried ADD is served
    kube_api.nad_crd_installed = True
    cluster.nad("storage", "10.86.0.0/24")
    added = cluster.shim("ADD", wants, ns2_path, cid2)
    assert added.code == 0, added.output
    wait_for(lambda: _metric(port, "multusd_nad_api_unavailable") == 0, watch_bound(),
             what="the NAD watch to recover")
    for pod, path, container in ((plain, ns_path, cid), (wants, ns2_path, cid2)):
        assert cluster.shim("DEL", pod, path, container).code == 0
    assert sandbox.leases_held() == []


# ---- kubeconfig keys client-go honours ---------------------------------------------------------

@pytest.mark.parametrize("server_name, works", [("localhost", True), ("other.example", False)])
def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
        make_kube_api, tmp_path, server_name, works):
    api = make_kube_api(tls=True)  # its certificate names 127.0.0.1 and localhost
    document = json.loads(open(api.kubeconfig_path).read())
    document["clusters"][0]["cluster"]["tls-server-name"] = server_name
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(document))
    api.add_pod(NS, "web")
    client = KubeClient(str(kubeconfig), api.node, request_timeout=5.0)
    try:
        if works:
            assert client.get_pod(NS, "web", not_found_wait=0) is not None
        else:
            with pytest.raises(MultusError) as info:
                client.get_pod(NS, "web", not_found_wait=0)
            assert "TLS handshake" in info.value.msg
    finally:
        client.stop()


class _Proxy:
    """A forward proxy on loopback: absolute-URI requests forwarded, CONNECT tunnels piped."""

    def __init__(self) -> None:
        import http.server
        import select
        import socket
        import threading
        import urllib.request

        self.seen: list = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - an absolute URI (plain http)
                proxy.seen.append(("GET", self.path, self.headers.get("Host")))
                request = urllib.request.Request(self.path, headers=dict(self.headers))
                with urllib.request.urlopen(request, timeout=5) as answer:
                    body = answer.read()
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def do_CONNECT(self):  # noqa: N802 - a tunnel (https)
                proxy.seen.append(("CONNECT", self.path, self.headers.get("Host")))
                host, port = self.path.rsplit(":", 1)
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
                self.send_response(200, "Connection established")
                self.end_headers()
                ends = [self.connection, upstream]
                while True:
                    readable, _, _ = select.select(ends, [], [], 5)
                    if not readable:
                        break
                    data = readable[0].recv(65536)
                    if not data:
                        break
                    (upstream if readable[0] is self.connection else self.connection).sendall(data)
                upstream.close()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https-through-connect"])
def test_proxy_url_sends_every_request_through_the_proxy(make_kube_api, tmp_path, tls, host):
    api = make_kube_api(tls=tls, host=host)
    authority = f"[{host}]:{api.port}" if ":" in host else f"{host}:{api.port}"
    proxy = _Proxy()
    try:
        document = json.loads(open(api.kubeconfig_path).read())
        document["clusters"][0]["cluster"]["proxy-url"] = proxy.url
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(document))
        api.add_pod(NS, "web")
        client = KubeClient(str(kubeconfig), api.node, request_timeout=5.0)
        try:
            assert client.get_pod(NS, "web", not_found_wait=0) is not None
        finally:
            client.stop()
        assert proxy.seen == ([("CONNECT", authority, authority)] if tls else
                              [("GET", f"{api.url}/api/v1/namespaces/{NS}/pods/web", authority)])
    finally:
        proxy.stop()


def test_a_kept_alive_connection_the_server_closed_is_replaced(kube_api):
    kube_api.add_pod(NS, "web")
    client = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    try:
        assert client.get_pod(NS, "web", not_found_wait=0) is not None  # kept alive after
        kube_api.restart()  # cuts every connection: the kept one is dead
        assert client.get_pod(NS, "web", not_found_wait=0) is not None  # resent on a new one
    finally:
        client.stop()
