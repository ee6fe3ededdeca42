"""DEL when a delegate's plugin binary is gone: the error says which, where it was looked for,
and the two ways out; both ways out work (the binary back, or ``multusd gc --forget``).

Real bridge + host-local plugins, the real daemon, shim and fake API server; the plugin that
disappears is a name in the sandbox's bin dir pointing at a real plugin, removed after ADD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from harness import Cluster, netns_addresses

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def vanishing(cluster: Cluster, name: str, real: str) -> str:
    """``<binDir>/<name>``, the real plugin ``real`` under another name (removed by the test)."""
    path = os.path.join(cluster.sandbox.bin_dir, name)
    os.symlink(os.path.realpath(os.path.join(cluster.sandbox.bin_dir, real)), path)
    return path


def attach(cluster: Cluster, name: str, networks: str):
    pod = cluster.pod(name, annotations={NETWORKS_KEY: networks})
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    add = cluster.shim("ADD", pod, ns_path, cid)
    assert add.code == 0, add.output
    return pod, ns_name, ns_path, cid


def gc(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multusd", "gc", *args, "--config",
                           cluster.daemon.config_path], capture_output=True, text=True,
                          timeout=120)


def test_del_names_the_missing_plugin_and_installing_it_again_releases_everything(cluster):
    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.96.0.0/24", type="bridge-vendor")
    cluster.start()
    pod, ns_name, ns_path, cid = attach(cluster, "gone-1", "vendor")
    target = os.readlink(plugin)
    os.unlink(plugin)  # the package that shipped it was removed

    delete = cluster.shim("DEL", pod, ns_path, cid)

    assert delete.code != 0  # the runtime retries; nothing is forgotten behind its back
    msg = delete.output["msg"]
    assert "'bridge-vendor'" in msg and cluster.sandbox.bin_dir in msg
    assert "install bridge-vendor again" in msg
    assert f"`multusd gc --forget {cid}`" in msg
    assert os.path.exists(os.path.join(cluster.daemon.cni_dir, cid)), "the record must stay"
    assert "eth0" not in netns_addresses(ns_name)  # what could be released was released

    os.symlink(target, plugin)  # way out 1: the plugin is back
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))


def test_a_missing_ipam_plugin_is_named_too(cluster):
    ipam = vanishing(cluster, "ipam-vendor", "host-local")
    conf = cluster.sandbox.net("vendor-ipam", "10.97.0.0/24", cni_version="0.4.0",
                               gateway=False)
    conf["ipam"]["type"] = "ipam-vendor"  # bridge runs it: the plugin's own error says so
    cluster.kube.add_nad("default", "vendor-ipam", json.dumps(conf))
    cluster.start()
    pod, ns_name, ns_path, cid = attach(cluster, "gone-2", "vendor-ipam")
    os.unlink(ipam)

    delete = cluster.shim("DEL", pod, ns_path, cid)

    assert delete.code != 0
    assert "Plugin ipam-vendor is not installed" in delete.output["msg"]
    assert f"`multusd gc --forget {cid}`" in delete.output["msg"]
    assert gc(cluster, "--forget", cid).returncode == 0
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def test_gc_forget_releases_what_it_can_and_drops_the_records(cluster):
    plugin = vanishing(cluster, "bridge-vendor", "bridge")
    cluster.nad("vendor", "10.98.0.0/24", type="bridge-vendor")
    cluster.nad("plain", "10.99.0.0/24")
    cluster.start()
    pod, ns_name, ns_path, cid = attach(cluster, "gone-3", "vendor,plain")
    os.unlink(plugin)
    assert cluster.shim("DEL", pod, ns_path, cid).code != 0

    assert gc(cluster, "--forget", "no-such-container").returncode == 3
    out = gc(cluster, "--forget", cid)

    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("run by multusd, in the sandbox's turn\n")  # it answers
    assert f"gc --forget {cid}: 2 of 3 network(s) released" in cluster.daemon.log()
    assert "NOT released, record dropped: default/vendor (net1)" in out.stdout
    assert "released: default/plain (net2)" in out.stdout
    assert "released: cluster-net (eth0)" in out.stdout  # the runtime's name, not another
    assert "the runtime's next DEL succeeds" in out.stdout
    assert not os.path.exists(os.path.join(cluster.daemon.cni_dir, cid))
    results = os.path.join(cluster.daemon.cni_dir, "results")
    assert not [n for n in os.listdir(results) if f"-{cid}-" in n]
    # what the missing plugin made is left as it is, and said so; the rest is released
    assert set(netns_addresses(ns_name)) == {"lo", "net1"}
    assert len(cluster.sandbox.leases_held()) == 1
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0  # the pod can terminate
