"""Which node multusd watches: nodeName, MULTUS_NODE_NAME, the kubelet certificate, the host name.

The real daemon and shim against the fake API server, with the pods on a node whose name is
not the host name (except for the host-name case). A right name means the pod comes from
the watch cache and an ADD sends no pod GET at all (the network-status PUT sends the watch's
copy); a wrong one is reported (log, metric) and the ADD still succeeds by one live GET.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import tempfile
import urllib.request
import uuid

import pytest

from harness import Cluster, NotifyListener, watch_bound
from testlib import free_port, wait_for

from multusd.kube import kubeconfig as kubeconfig_reader

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NODE = "worker-7.example"  # never this machine's host name


def node_certificate(directory: str, node: str) -> tuple[str, str]:
    """A kubelet-style client certificate (O=system:nodes, CN=system:node:<node>) and key."""
    cert, key = os.path.join(directory, "kubelet.crt"), os.path.join(directory, "kubelet.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", f"/O=system:nodes/CN=system:node:{node}",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


def kubeconfig_with_certificate(kube, directory: str, node: str, *, inline: bool) -> str:
    """The fake API's kubeconfig plus a kubelet client certificate (file or -data)."""
    path = kube.write_kubeconfig(os.path.join(directory, "kubelet.conf"))
    cert, key = node_certificate(directory, node)
    with open(path) as handle:
        config = json.load(handle)
    user = config["users"][0]["user"]
    if inline:
        import base64

        for field, source in (("client-certificate-data", cert), ("client-key-data", key)):
            with open(source, "rb") as handle:
                user[field] = base64.b64encode(handle.read()).decode()
    else:
        user["client-certificate"], user["client-key"] = cert, key
    with open(path, "w") as handle:
        json.dump(config, handle)
    return path


@pytest.fixture
def cluster(sandbox, make_kube_api, tmp_path, request) -> Cluster:
    node = getattr(request, "param", NODE)
    return Cluster(sandbox, make_kube_api(node=node), tmp_path)


@pytest.fixture
def tls_cluster(sandbox, make_kube_api, tmp_path) -> Cluster:
    """Over HTTPS: a client certificate is only loaded (and presented) for an https server."""
    return Cluster(sandbox, make_kube_api(node=NODE, tls=True), tmp_path)


def pod_gets(kube, pod: dict) -> int:
    meta = pod["metadata"]
    return kube.count("GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")


def add_and_del(cluster: Cluster, pod: dict) -> int:
    """ADD then DEL through the real shim; returns the pod GETs the ADD cost."""
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    before = pod_gets(cluster.kube, pod)
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    gets = pod_gets(cluster.kube, pod) - before
    assert cluster.status(pod["metadata"]["namespace"], pod["metadata"]["name"])
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    return gets


def watched_node(kube) -> set:
    return {query.get("fieldSelector") for method, path, query in kube.requests
            if path == "/api/v1/pods"}


def cached_pods(cluster: Cluster) -> int:
    """How many pods the daemon's watch cache holds (its /status)."""
    from multusd.wire import api

    status = api.http_request(cluster.daemon.socket_path, "GET", "/status", timeout=5)
    return json.loads(status.body)["kube"]["cachedPods"]


def check_node(cluster: Cluster, node: str, source: str) -> None:
    pod = cluster.pod("web-id")
    # the watch delivers the pod first: an ADD racing that event would pay a live GET
    wait_for(lambda: cached_pods(cluster) == 1, watch_bound(),
             what="the pod in the daemon's cache")
    add_gets = add_and_del(cluster, pod)
    assert watched_node(cluster.kube) == {f"spec.nodeName={node}"}
    assert f'node name "{node}" from {source}' in cluster.daemon.log()
    assert add_gets == 0  # from the cache; the status PUT sends the watch's copy
    assert "node name mismatch" not in cluster.daemon.log()


def test_node_name_from_multus_node_name(cluster):
    cluster.start(nodeName=None, env={"MULTUS_NODE_NAME": NODE})
    check_node(cluster, NODE, "MULTUS_NODE_NAME")


def test_node_name_key_wins_over_the_environment(cluster):
    cluster.start(nodeName=NODE, env={"MULTUS_NODE_NAME": "not-this-one"})
    check_node(cluster, NODE, "nodeName in daemon-config.json")


def files_holding(directory: str, content: bytes) -> list:
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    if handle.read(1 << 16) == content:
                        found.append(path)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("inline", [False, True], ids=["client-certificate", "-data"])
def test_node_name_from_the_kubelet_client_certificate(tls_cluster, tmp_path, inline):
    cluster = tls_cluster
    data_dir = kubeconfig_reader.data_dir()
    before = set(os.listdir(data_dir)) if os.path.isdir(data_dir) else set()
    kubeconfig = kubeconfig_with_certificate(cluster.kube, str(tmp_path), NODE, inline=inline)
    cluster.start(nodeName=None, kubeconfig=kubeconfig)
    check_node(cluster, NODE, "the kubeconfig's client certificate (CN=system:node:...)")
    if inline:  # the key went to one root-only file, none to the temp directory
        with open(os.path.join(str(tmp_path), "kubelet.key"), "rb") as handle:
            key = handle.read()
        cluster.daemon.terminate()
        cluster.start(nodeName=None, kubeconfig=kubeconfig)  # a restart reuses it
        assert files_holding(tempfile.gettempdir(), key) == []
        kept = files_holding(data_dir, key)
        assert len(kept) == 1 and stat.S_IMODE(os.stat(kept[0]).st_mode) == 0o600
        cluster.daemon.terminate()
        for name in set(os.listdir(data_dir)) - before:  # the certificate's and the key's
            os.unlink(os.path.join(data_dir, name))


HOST = socket.gethostname().strip().lower()


@pytest.mark.parametrize("cluster", [HOST], indirect=True)
def test_node_name_from_the_host_name_lowercased(cluster):
    cluster.start(nodeName=None)
    check_node(cluster, HOST, "the host name (lowercased as kubelet does)")


def test_a_wrong_node_name_is_reported_and_add_still_succeeds(cluster):
    port = free_port()
    cluster.start(nodeName="wrong-node", metricsPort=port)
    pod = cluster.pod("web-mis")
    assert add_and_del(cluster, pod) == 1  # one live GET for the missing pod
    assert watched_node(cluster.kube) == {"spec.nodeName=wrong-node"}
    log = cluster.daemon.log()
    assert "node name mismatch" in log
    assert f"scheduled on node {NODE!r}" in log and "'wrong-node'" in log
    assert f'"nodeName": {NODE!r}' in log and "MULTUS_NODE_NAME" in log
    second = cluster.pod("web-mis-2")
    assert add_and_del(cluster, second) == 1
    assert cluster.daemon.log().count("node name mismatch") == 1  # warned once
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "multusd_node_name_mismatch 1" in text
    assert "multusd_pod_cache_misses_total 2" in text


def test_the_right_name_shows_no_mismatch_in_the_metrics(cluster):
    port = free_port()
    cluster.start(metricsPort=port)
    add_and_del(cluster, cluster.pod("web-ok"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "multusd_node_name_mismatch 0" in text
    assert "multusd_pod_cache_misses_total 0" in text


def test_status_line_shows_the_node_name_then_the_mismatch(cluster, tmp_path):
    with NotifyListener(str(tmp_path / "notify.sock")) as notify:
        cluster.start(nodeName=None, env={"NOTIFY_SOCKET": notify.path,
                                          "MULTUS_NODE_NAME": "wrong-node"})
        notify.receive_until('STATUS=serving')  # READY before the client (and name) is built
        notify.receive_until('node name "wrong-node" from MULTUS_NODE_NAME')
        assert notify.messages[-1].startswith("STATUS=serving")
        add_and_del(cluster, cluster.pod("web-st"))
        last = notify.receive_until("NODE NAME MISMATCH")
        assert f"{NODE!r}" in last and "'wrong-node'" in last
