"""JSON read as upstream reads it, through the real shim and daemon with real plugins (issue 39).

Upstream decodes a pod's network-selection annotation into its Go structs: a key in another
case sets the field ("IngressRate" is an ingressRate, "HostPort" a hostPort), so the
bandwidth plugin shapes the pod's traffic and portmap forwards the port. cni-args are decoded
into interface{} (every number a float64) and written out again by Go's encoder: a plugin gets
``"vlan":100`` for ``1e2``, an integer it can decode. An empty ``default-route`` gateway (""
or null) is Go's nil IP: upstream accepts the annotation, and its route via no gateway fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from harness import Cluster, netns_addresses

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


@pytest.fixture
def cluster(sandbox, kube_api, tmp_path) -> Cluster:
    return Cluster(sandbox, kube_api, tmp_path)


def conflist_nad(cluster: Cluster, name: str, subnet: str, *chained: dict) -> None:
    """A NAD whose config is the sandbox's bridge network followed by ``chained`` plugins."""
    bridge = cluster.sandbox.net(name, subnet, cni_version="0.4.0", gateway=False)
    version = bridge.pop("cniVersion")
    bridge.pop("name")
    cluster.kube.add_nad("default", name, json.dumps(
        {"cniVersion": version, "name": name, "plugins": [bridge, *chained]}))


def attach(cluster: Cluster, annotation: str):
    pod = cluster.pod(f"pod-{uuid.uuid4().hex[:8]}", annotations={NETWORKS_KEY: annotation})
    ns_name, ns_path = cluster.sandbox.netns()
    cid = uuid.uuid4().hex
    return cluster.shim("ADD", pod, ns_path, cid), pod, ns_name, ns_path, cid


def host_veth(add_output: dict, cid: str, cluster: Cluster, net: str) -> str:
    """The host side of the pod's ``net1`` veth, from the delegate's cached result."""
    from multusd.cni import resultcache

    cached = resultcache.read_result(cluster.daemon.cni_dir, net, cid, "net1")
    names = [i["name"] for i in cached["interfaces"] if not i.get("sandbox")]
    return next(n for n in names if n.startswith("veth"))


def test_bandwidth_keys_in_another_case_shape_the_pods_traffic(cluster):
    """{"IngressRate": ..., "IngressBurst": ...}: upstream's BandwidthEntry takes them (Go's
    case-insensitive field match), and the bandwidth plugin puts a token bucket on the pod's
    host-side veth; it got {"ingressRate": 0, ...} and shaped nothing before."""
    conflist_nad(cluster, "shaped", "10.97.0.0/24",
                 {"type": "bandwidth", "capabilities": {"bandwidth": True}})
    cluster.start()
    add, pod, ns_name, ns_path, cid = attach(cluster, json.dumps([
        {"Name": "shaped", "Interface": "net1",
         "Bandwidth": {"IngressRate": 8000000, "IngressBurst": 4000000}}]))
    assert add.code == 0, add.output
    assert netns_addresses(ns_name)["net1"] == ["10.97.0.2/24"]
    veth = host_veth(add.output, cid, cluster, "shaped")
    qdiscs = json.loads(subprocess.run(["tc", "-j", "qdisc", "show", "dev", veth], check=True,
                                       capture_output=True, text=True).stdout)
    tbf = [q for q in qdiscs if q.get("kind") == "tbf"]
    assert len(tbf) == 1, qdiscs
    assert tbf[0]["options"]["rate"] == 8000000 // 8  # bytes per second
    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert cluster.sandbox.leases_held() == []


def nat_rules() -> str:
    return subprocess.run(["iptables", "-t", "nat", "-S"], check=True, capture_output=True,
                          text=True).stdout


_PORTMAP_SCAFFOLD = [  # what portmap adds once and never removes (a node keeps it)
    ["-D", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"],
    ["-D", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"],
    ["-D", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade",
     "-j", "CNI-HOSTPORT-MASQ"],
    ["-F", "CNI-HOSTPORT-MASQ"], ["-F", "CNI-HOSTPORT-SETMARK"],
    ["-X", "CNI-HOSTPORT-DNAT"], ["-X", "CNI-HOSTPORT-MASQ"], ["-X", "CNI-HOSTPORT-SETMARK"]]


@pytest.fixture
def portmap_chains():
    """portmap's shared nat chains are removed after the test when it made them."""
    made = "-N CNI-HOSTPORT-DNAT" not in nat_rules()
    yield
    if made and "-A CNI-HOSTPORT-DNAT " not in nat_rules():
        for rule in _PORTMAP_SCAFFOLD:
            subprocess.run(["iptables", "-t", "nat", *rule], capture_output=True)


@pytest.mark.usefixtures("portmap_chains")
def test_port_mappings_in_another_case_reach_portmap(cluster):
    """{"HostPort": ..., "ContainerPort": ...}: upstream's PortMapEntry takes them, and the
    portmap plugin DNATs the host port to the pod; it got 0/0 and refused the mapping before."""
    conflist_nad(cluster, "mapped", "10.98.0.0/24",
                 {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False})
    cluster.start()
    host_port = 20000 + uuid.uuid4().int % 20000
    add, pod, ns_name, ns_path, cid = attach(cluster, json.dumps([
        {"name": "mapped", "portMappings": [
            {"HostPort": host_port, "ContainerPort": 8080, "Protocol": "tcp"}]}]))
    assert add.code == 0, add.output
    rule = f"--dport {host_port} -j DNAT --to-destination 10.98.0.2:8080"
    try:
        assert any(rule in line for line in nat_rules().splitlines()), nat_rules()
        delete = cluster.shim("DEL", pod, ns_path, cid)
        assert delete.code == 0, delete.output
    finally:
        # A DEL leaves them, upstream's too: its delegates' cache does not keep the pod's
        # portMappings, and portmap's DEL removes nothing without them. Its own DEL does.
        unforward(cid, ns_path, [{"hostPort": host_port, "containerPort": 8080,
                                  "protocol": "tcp"}])
    assert f"--dport {host_port} " not in nat_rules()


def unforward(cid: str, ns_path: str, mappings: list) -> None:
    conf = {"cniVersion": "0.4.0", "name": "mapped", "type": "portmap", "snat": False,
            "runtimeConfig": {"portMappings": mappings}}
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": ns_path,
           "CNI_IFNAME": "net1", "CNI_PATH": "/usr/lib/cni", "PATH": os.environ["PATH"]}
    subprocess.run(["/usr/lib/cni/portmap"], input=json.dumps(conf).encode(), env=env,
                   check=True, capture_output=True)


def test_cni_args_numbers_reach_the_plugin_as_go_writes_them(cluster, tmp_path):
    """cni-args go through interface{} and Go's encoder upstream: 1e2 reaches the plugin as
    100 (a JSON integer), 1.0 as 1; 0.5 and 1e-7 stay what they are."""
    record = str(tmp_path / "calls.jsonl")
    cluster.kube.add_nad("default", "rec", json.dumps(
        {"cniVersion": "0.4.0", "type": "stub-record", "recordFile": record}))
    cluster.start()
    add, pod, _, ns_path, cid = attach(
        cluster, '[{"name": "rec", "cni-args": {"vlan": 1e2, "mtu": 1.0, "ratio": 0.5, '
                 '"tiny": 1e-7, "name": "x"}}]')
    assert add.code == 0, add.output
    with open(record) as handle:
        call = json.loads(handle.readline())
    cni = call["stdin"]["args"]["cni"]
    assert cni == {"vlan": 100, "mtu": 1, "ratio": 0.5, "tiny": 1e-7, "name": "x"}
    assert type(cni["vlan"]) is int and type(cni["mtu"]) is int  # "100", not "100.0"
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0


def default_routes(ns_name: str) -> list:
    out = subprocess.run(["ip", "-4", "-n", ns_name, "-j", "route", "show", "default"],
                         check=True, capture_output=True, text=True).stdout
    return [(r.get("gateway"), r["dev"]) for r in json.loads(out)]


@pytest.mark.parametrize("gateways", ['[""]', "[null]"])
def test_an_empty_default_route_gateway_fails_the_add_where_upstream_fails_it(cluster,
                                                                              gateways):
    """Upstream reads "" and null as a nil net.IP and accepts the annotation; after the
    delegate's ADD, its route via no gateway fails ("either Dst.IP, Src.IP or Gw must be set")
    and so does the ADD. multusd fails it there too, and rolls the pod's networks back."""
    cluster.nad("gwnet", "10.91.0.0/24", gateway=True)
    cluster.start()
    add, _, ns_name, _, _ = attach(cluster, f'[{{"name": "gwnet", "default-route": {gateways}}}]')
    assert add.code == 1 and add.output["code"] == 7, add.output
    assert "error setting default gateway" in add.output["msg"]
    assert "ends with an empty gateway" in add.output["msg"]
    assert "failed to parse pod Network Attachment Selection" not in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert cluster.sandbox.leases_held() == []


def test_an_empty_gateway_before_another_adds_no_route_as_upstream(cluster):
    """["", "10.91.0.1"]: upstream's route via the nil gateway fails (logged) and the next
    one's succeeds, and so does the ADD; the empty one counts as an IPv6 gateway."""
    cluster.nad("gwnet", "10.91.0.0/24", gateway=True)
    cluster.start()
    add, pod, ns_name, ns_path, cid = attach(
        cluster, '[{"name": "gwnet", "default-route": ["", "10.91.0.1"]}]')
    assert add.code == 0, add.output
    assert default_routes(ns_name) == [("10.91.0.1", "net1")]
    assert "holds an empty gateway" in cluster.daemon.log()
    with open(os.path.join(cluster.daemon.cni_dir, cid)) as handle:
        cached = json.load(handle)
    assert cached[1]["default-route"] == ["", "10.91.0.1"]  # as upstream records a nil IP
    delete = cluster.shim("DEL", pod, ns_path, cid)
    assert delete.code == 0, delete.output
    assert cluster.sandbox.leases_held() == []


def test_cni_args_nested_deeper_than_a_python_copy_takes_reach_the_plugin(cluster, tmp_path):
    """cni-args nested 600 levels deep (Go's decoder takes 10,000, and its encoder writes any
    depth): upstream hands them to the plugin; multusd did too little: its deep copy of them
    hit Python's recursion limit and the ADD failed with an internal RecursionError."""
    record = str(tmp_path / "calls.jsonl")
    cluster.kube.add_nad("default", "rec", json.dumps(
        {"cniVersion": "0.4.0", "type": "stub-record", "recordFile": record}))
    cluster.start()
    depth = 600
    add, pod, _, ns_path, cid = attach(
        cluster, '[{"name": "rec", "cni-args": {"deep": %s}}]' % ("[" * depth + "]" * depth))
    assert add.code == 0, add.output
    with open(record) as handle:
        value, levels = json.loads(handle.readline())["stdin"]["args"]["cni"]["deep"], 1
    while value:
        value, levels = value[0], levels + 1
    assert levels == depth
    assert cluster.shim("DEL", pod, ns_path, cid).code == 0
