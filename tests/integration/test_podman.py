"""podman's CNI backend with multusd as the network: real podman, the real shim and daemon.

A conflist whose one plugin is ``multus-shim`` (with the portMappings capability), and a
daemon in delegates mode (no Kubernetes) whose clusterNetwork is bridge + host-local +
portmap and whose defaultNetworks add a second bridge. ``podman run`` gets eth0 and net1,
``-p`` reaches the container's httpd through portmap on 127.0.0.1, and ``podman rm -f``
leaves nothing: netns, veths, leases, multusd's and libcni's cache files, iptables rules.
A run whose ADD fails leaves nothing either (podman's DEL after a failed ADD).
"""

from __future__ import annotations

import json
import os
import random
import socket
import uuid

import pytest

from podmanlib import LIBCNI_CACHE, Podman, missing
from testlib import netns_links, run, wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

# A third octet of this run's own: portmap's DNAT goes through the host's routes, which two
# runs at once (two checkouts' make test) must not share.
OCTET = random.randrange(256)


@pytest.fixture
def podman():
    reason = missing()
    if reason:
        pytest.skip(reason)
    box = Podman()
    yield box
    box.cleanup()


@pytest.fixture
def image(podman) -> str:
    image = podman.import_busybox()
    probe = podman(*podman.run_args("--rm", "--network", "none", image, "/bin/busybox", "true"),
                   check=False)
    if probe.returncode != 0:  # not multusd's doing: no network is involved
        pytest.skip(f"podman cannot run a container on this machine: {probe.stderr.strip()}")
    return image


def multus_network(sandbox, podman: Podman, tmp_path, delegates_mode: list | None = None):
    """The daemon (delegates mode) and podman's conflist that points at it; (daemon, name)."""
    conf_dir = str(tmp_path / "confdir")
    os.makedirs(conf_dir)
    primary = sandbox.net("unused", f"10.155.{OCTET}.0/24", cni_version="0.4.0")
    for key in ("name", "cniVersion"):
        del primary[key]
    cluster_path = os.path.join(conf_dir, "10-pm.conflist")
    with open(cluster_path, "w") as handle:
        json.dump({"cniVersion": "0.4.0", "name": "pm-primary", "plugins": [
            primary, {"type": "portmap", "capabilities": {"portMappings": True}}]}, handle)
    with open(os.path.join(conf_dir, "20-extra.conf"), "w") as handle:
        json.dump(sandbox.net("pm-extra", f"10.156.{OCTET}.0/24", cni_version="0.4.0",
                              gateway=False), handle)
    config = {"cniVersion": "0.4.0", "confDir": conf_dir}
    if delegates_mode is None:
        config.update(clusterNetwork=cluster_path, defaultNetworks=["pm-extra"])
    else:
        config.update(delegates=delegates_mode)
    daemon = sandbox.daemon(config)
    name = podman.network(f"mdpm{uuid.uuid4().hex[:8]}", [
        {"type": "multus-shim", "daemonSocketDir": daemon.socket_dir,
         "capabilities": {"portMappings": True}}])
    return daemon, name


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_get(port: int) -> str:
    """The body of GET / on 127.0.0.1:<port>; "" when nothing answers (yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            data = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return ""
    return data.decode(errors="replace").partition("\r\n\r\n")[2]


def iptables() -> str:
    return run("iptables-save").stdout


def dnat_chains() -> set:
    return {line.split()[0] for line in iptables().splitlines() if line.startswith(":CNI-DN-")}


def bridge_ports(bridge: str) -> list:
    if not os.path.exists(f"/sys/class/net/{bridge}"):
        return []  # a network that was never attached
    return json.loads(run("ip", "-j", "link", "show", "master", bridge).stdout or "[]")


def assert_nothing_left(sandbox, daemon, cid: str, netns: str, chains_before: set) -> None:
    assert not os.path.exists(netns), netns
    assert [p for b in sandbox._bridges for p in bridge_ports(b)] == []  # no veth left
    assert sandbox.leases_held() == []
    assert os.listdir(daemon.cni_dir) in ([], ["results"])
    assert os.listdir(os.path.join(daemon.cni_dir, "results")) == []
    if os.path.isdir(LIBCNI_CACHE):
        assert [f for f in os.listdir(LIBCNI_CACHE) if cid in f] == []
    assert cid not in iptables()
    assert dnat_chains() <= chains_before


def test_podman_run_gets_eth0_net1_and_a_published_port_and_rm_leaves_nothing(
        sandbox, podman, image, tmp_path):
    daemon, network = multus_network(sandbox, podman, tmp_path)
    chains_before = dnat_chains()
    port = free_port()
    name = f"web_{uuid.uuid4().hex[:6]}.test"  # podman passes it as K8S_POD_NAME

    podman(*podman.run_args("-d", "--name", name, "--network", network,
                            "-p", f"127.0.0.1:{port}:8080", image,
                            "/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"))

    cid, netns = podman("inspect", "--format", "{{.Id}} {{.NetworkSettings.SandboxKey}}",
                        name).stdout.split()
    links = {k: [a for a in v if "." in a] for k, v in netns_links(netns).items() if k != "lo"}
    assert links == {"eth0": [f"10.155.{OCTET}.2/24"],
                     "net1": [f"10.156.{OCTET}.2/24"]}
    assert wait_for(lambda: http_get(port), 20, interval=0.05,
                    what="the container's httpd through portmap") == "multusd via podman\n"
    assert cid in iptables()  # portmap's rules, named after the container
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert "not a Kubernetes pod" in daemon.log()

    podman("rm", "--force", "--time", "0", name)

    assert_nothing_left(sandbox, daemon, cid, netns, chains_before)
    assert http_get(port) == ""
    assert "DEL: 2 network(s) released" in daemon.log()


def test_a_podman_run_whose_add_fails_leaves_nothing(sandbox, podman, image, tmp_path):
    good = sandbox.net("pm-good", f"10.157.{OCTET}.0/24", cni_version="0.4.0")
    broken = {"cniVersion": "0.4.0", "name": "pm-broken", "type": "stub-add-error"}  # its DEL works
    daemon, network = multus_network(sandbox, podman, tmp_path, delegates_mode=[good, broken])
    chains_before = dnat_chains()
    name = f"fails-{uuid.uuid4().hex[:6]}"

    failed = podman(*podman.run_args("-d", "--name", name, "--network", network, image,
                                     "/bin/busybox", "sleep", "60"), check=False)

    assert failed.returncode != 0
    assert "flux capacitor" in failed.stderr, failed.stderr
    assert f"[container {name}:pm-broken]" in failed.stderr
    cid = podman("inspect", "--format", "{{.Id}}", name).stdout.strip()
    podman("rm", "--force", "--time", "0", name)
    assert "DEL starting CNI request" in daemon.log()  # podman's teardown of the failed set-up
    assert_nothing_left(sandbox, daemon, cid, "/nonexistent", chains_before)
