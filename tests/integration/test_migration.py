"""A node moving between upstream Multus v4.3 and multusd, both ways: each releases what the
other attached, from the other's cache files.

Always: caches written exactly as upstream v4.3 writes them (tests/upstreamfmt.py, from its Go
types), for attachments real plugins made with upstream's arguments, checked and released by
multusd's CHECK and DEL; and multusd's own caches compared with that format field by field.
With ``$MULTUSD_UPSTREAM_BIN`` (upstream's multus-daemon and multus-shim, tests/upstreambin.py)
also for real: upstream's daemon and shim ADD, multusd CHECK and DEL, and the reverse, and
upstream's files compared with tests/upstreamfmt.py so that the tests without it stay honest.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from typing import Any, Dict, List, Tuple

import pytest

import upstreambin
import upstreamfmt
from harness import Cluster, call_shim, netns_addresses
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.tools import sockcheck
from upstreambin import DAEMON

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

NETWORKS_KEY = "k8s.v1.cni.cncf.io/networks"


class Node:
    """A cluster network file, one NAD and a pod asking for it; both daemons use ``cni_dir``."""

    def __init__(self, sandbox, kube, tmp_path, *, conflist: bool = False) -> None:
        self.cluster = Cluster(sandbox, kube, tmp_path)
        self.cni_dir = str(tmp_path / "shared-cni")
        self.conflist = conflist
        if conflist:  # a "*.conflist" clusterNetwork: upstream records it its own way
            plugin = {k: v for k, v in self.cluster.cluster.items()
                      if k not in ("cniVersion", "name")}
            self.cluster.cluster = {"cniVersion": "0.4.0", "name": "cluster-net",
                                    "plugins": [plugin]}
            os.unlink(self.cluster.cluster_path)
            self.cluster.cluster_path = os.path.join(self.cluster.conf_dir,
                                                     "10-cluster.conflist")
            with open(self.cluster.cluster_path, "w") as handle:
                json.dump(self.cluster.cluster, handle)
        nad = sandbox.net("mig-a", "10.121.0.0/24", cni_version="0.4.0", gateway=False)
        self.nad_bytes = json.dumps(nad).encode()  # named: upstream keeps these bytes as they are
        self.cluster.kube.add_nad("default", "mig-a", self.nad_bytes.decode())
        self.pod = self.cluster.pod("mover", annotations={NETWORKS_KEY: "mig-a"})
        self.ns_name, self.ns_path = sandbox.netns()
        self.cid = uuid.uuid4().hex

    @property
    def uid(self) -> str:
        return self.pod["metadata"]["uid"]

    def args(self) -> List[Tuple[str, str]]:
        return upstreamfmt.upstream_args("default", "mover", self.cid, self.uid)

    def delegates(self) -> List[Tuple[bytes, str, str, str]]:
        """(config bytes, delegate name, network name, ifname), in upstream's order."""
        with open(self.cluster.cluster_path, "rb") as handle:
            cluster = handle.read()
        return [(cluster, "cluster-net", "cluster-net", "eth0"),
                (self.nad_bytes, "default/mig-a", "mig-a", "net1")]

    def multusd(self):
        self.cluster.start(cniDir=self.cni_dir)
        return self.cluster.daemon

    def shim(self, command: str, **kw):
        return self.cluster.shim(command, self.pod, self.ns_path, self.cid, **kw)

    def released(self) -> None:
        assert set(netns_addresses(self.ns_name)) == {"lo"}
        assert self.cluster.sandbox.leases_held() == []
        assert not os.path.exists(os.path.join(self.cni_dir, self.cid))
        results = os.path.join(self.cni_dir, "results")
        assert not os.path.isdir(results) or not [n for n in os.listdir(results)
                                                  if f"-{self.cid}-" in n]


def upstream_add_with_real_plugins(node: Node, tmp_path) -> None:
    """What upstream's ADD leaves behind: the attachments, made by the real plugins with
    upstream's arguments, and its two caches in its own format."""
    engine = Engine([node.cluster.sandbox.bin_dir])
    throwaway = str(tmp_path / "engine-cache")  # the engine's own records are not wanted
    entries = []
    for conf, name, net_name, ifname in node.delegates():
        rt = RuntimeConf(container_id=node.cid, netns=node.ns_path, ifname=ifname,
                         args=tuple(node.args()), cache_dir=throwaway)
        result = engine.add(NetworkConfigList.load(conf, source=name), rt)
        from_file = node.conflist and ifname == "eth0"
        entries.append(upstreamfmt.delegate_entry(conf, name, from_file_conflist=from_file))
        upstreamfmt.write_result_entry(node.cni_dir, upstreamfmt.result_entry(
            node.cid, conf, ifname, net_name, node.ns_path, node.args(), {}, result))
    upstreamfmt.write_scratch(node.cni_dir, node.cid, upstreamfmt.scratch_cache(entries))


def drop_address(node: Node, ifname: str) -> None:
    address = netns_addresses(node.ns_name)[ifname][0]
    subprocess.run(["ip", "-n", node.ns_name, "addr", "del", address, "dev", ifname],
                   check=True)


@pytest.mark.parametrize("conflist", [False, True], ids=["conf", "conflist"])
def test_upstream_v43_caches_are_checked_and_released_by_multusd(sandbox, kube_api, tmp_path,
                                                                  conflist):
    node = Node(sandbox, kube_api, tmp_path, conflist=conflist)
    upstream_add_with_real_plugins(node, tmp_path)
    assert set(netns_addresses(node.ns_name)) == {"lo", "eth0", "net1"}
    node.multusd()

    check = node.shim("CHECK")
    assert check.code == 0, check.output  # every attachment, from upstream's records
    drop_address(node, "net1")
    broken = node.shim("CHECK")
    assert broken.code != 0 and "default/mig-a" in broken.output["msg"]

    delete = node.shim("DEL")
    assert delete.code == 0, delete.output
    node.released()


def test_multusd_writes_upstreams_format_field_by_field(sandbox, kube_api, tmp_path):
    node = Node(sandbox, kube_api, tmp_path)
    node.multusd()
    add = node.shim("ADD")
    assert add.code == 0, add.output

    expected_scratch = [upstreamfmt.delegate_entry(conf, name)
                        for conf, name, _, _ in node.delegates()]
    ours = read_json(os.path.join(node.cni_dir, node.cid))
    compare_scratch(ours, expected_scratch)
    # ours after upstream's fields: the configuration the sandbox was attached under and what
    # named each delegate, in keys no field of upstream's DelegateNetConf matches
    assert [[k for k in entry if k in OURS] for entry in ours] == [
        ["multusdNamedBy", "multusdConfig"], ["multusdNamedBy"]]
    assert [entry["multusdNamedBy"] for entry in ours] == ["clusterNetwork",
                                                           "k8s.v1.cni.cncf.io/networks"]
    assert ours[0]["multusdConfig"]["cniDir"] == node.cni_dir
    for conf, _, net_name, ifname in node.delegates():
        ours = read_json(os.path.join(node.cni_dir, "results", f"{net_name}-{node.cid}-{ifname}"))
        expected = upstreamfmt.result_entry(node.cid, conf, ifname, net_name, node.ns_path,
                                            node.args(), {}, ours.get("result", {}))
        compare_fields(ours, expected, f"result cache of {net_name}")
    assert oct(os.stat(os.path.join(node.cni_dir, node.cid)).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.join(node.cni_dir, "results")).st_mode & 0o777) == "0o700"
    assert node.shim("DEL").code == 0
    node.released()


def read_json(path: str) -> Any:
    with open(path, "rb") as handle:
        return json.loads(handle.read())


def compare_fields(ours: Dict[str, Any], theirs: Dict[str, Any], what: str) -> None:
    """Same keys in the same order, each with the same value (Bytes/config decoded)."""
    assert list(ours) == list(theirs), f"{what}: keys {list(ours)} != {list(theirs)}"
    for key in theirs:
        mine, other = ours[key], theirs[key]
        if key in ("Bytes", "config") and isinstance(mine, str) and isinstance(other, str):
            mine, other = base64.b64decode(mine), base64.b64decode(other)
            if mine != other:  # the same JSON written differently is not the same file
                assert json.loads(mine) == json.loads(other), f"{what}: {key} differs"
            continue
        assert mine == other, f"{what}: {key}: {mine!r} != {other!r}"


# multusd's keys in a scratch cache entry (Go's decoder skips them: no DelegateNetConf field
# matches, even case-insensitively); always after upstream's fields
OURS = ("multusdNamedBy", "multusdConfig")


def compare_scratch(ours: List[dict], theirs: List[dict]) -> None:
    """Upstream's fields, the same keys in the same order with the same values; then only
    multusd's own keys."""
    assert len(ours) == len(theirs)
    for index, (mine, other) in enumerate(zip(ours, theirs)):
        upstreams = {k: v for k, v in mine.items() if k not in OURS}
        compare_fields(upstreams, other, f"scratch cache entry {index}")
        assert list(mine)[:len(upstreams)] == list(upstreams), "multusd's keys come last"


# ---- with upstream's own binaries ($MULTUSD_UPSTREAM_BIN) -----------------------------------

@pytest.fixture
def upstream_bin() -> str:
    return upstreambin.bin_dir()


@pytest.fixture
def tls_kube(make_kube_api):
    return make_kube_api(tls=True)


def start_upstream(node: Node, directory: str, tmp_path, **config: Any):
    daemon = upstreambin.UpstreamDaemon(
        directory, node.cluster.kube, str(tmp_path / "upstream"),
        binDir=node.cluster.sandbox.bin_dir, confDir=node.cluster.conf_dir,
        cniDir=node.cni_dir, multusAutoconfigDir=node.cluster.conf_dir,
        multusNamespace="kube-system", **config)
    return daemon.start()


def upstream_shim(node: Node, daemon, command: str):
    return call_shim(command, daemon.shim_conf("0.4.0"), container_id=node.cid,
                     netns=node.ns_path, pod=("default", "mover"), uid=node.uid,
                     argv=daemon.shim_argv)


@pytest.mark.parametrize("conflist", [False, True], ids=["conf", "conflist"])
def test_real_upstream_add_then_multusd_check_and_del(sandbox, tls_kube, tmp_path,
                                                      upstream_bin, conflist):
    node = Node(sandbox, tls_kube, tmp_path, conflist=conflist)
    upstream = start_upstream(node, upstream_bin, tmp_path,
                              clusterNetwork=node.cluster.cluster_path)
    try:
        add = upstream_shim(node, upstream, "ADD")
        assert add.code == 0, (add.output, upstream.log()[-2000:])
    finally:
        upstream.stop()
    assert set(netns_addresses(node.ns_name)) == {"lo", "eth0", "net1"}
    # what upstream really wrote is what tests/upstreamfmt.py writes for the tests without it
    expected = [upstreamfmt.delegate_entry(conf, name, from_file_conflist=conflist and i == 0)
                for i, (conf, name, _, _) in enumerate(node.delegates())]
    compare_scratch(read_json(os.path.join(node.cni_dir, node.cid)), expected)
    for conf, _, net_name, ifname in node.delegates():
        theirs = read_json(os.path.join(node.cni_dir, "results",
                                        f"{net_name}-{node.cid}-{ifname}"))
        compare_fields(theirs, upstreamfmt.result_entry(
            node.cid, conf, ifname, net_name, node.ns_path, node.args(), {},
            theirs.get("result", {})), f"upstream's result cache of {net_name}")
        assert list(theirs["result"]) == sorted(theirs["result"])  # a Go map: sorted keys

    node.multusd()
    check = node.shim("CHECK")
    assert check.code == 0, check.output
    delete = node.shim("DEL")
    assert delete.code == 0, delete.output
    node.released()


@pytest.mark.parametrize("conflist", [False, True], ids=["conf", "conflist"])
def test_multusd_add_then_real_upstream_del(sandbox, tls_kube, tmp_path, upstream_bin,
                                            conflist):
    node = Node(sandbox, tls_kube, tmp_path, conflist=conflist)
    node.multusd()
    add = node.shim("ADD")
    assert add.code == 0, add.output
    node.cluster.daemon.terminate()
    upstream = start_upstream(node, upstream_bin, tmp_path,
                              clusterNetwork=node.cluster.cluster_path)
    try:
        delete = upstream_shim(node, upstream, "DEL")
        assert delete.code == 0, delete.output
        log = upstream.log()
    finally:
        upstream.stop()
    assert "failed to get the cached delegates file" not in log  # it read multusd's cache
    node.released()


def test_multusd_add_then_real_upstream_check_and_del_in_delegates_mode(
        sandbox, tls_kube, tmp_path, upstream_bin):
    """Upstream checks nothing with a clusterNetwork (its CHECK only walks "delegates")."""
    node = Node(sandbox, tls_kube, tmp_path)
    delegates = [node.cluster.cluster]
    node.cluster.start(cniDir=node.cni_dir, clusterNetwork=None, delegates=delegates)
    add = node.shim("ADD")
    assert add.code == 0, add.output
    node.cluster.daemon.terminate()
    upstream = start_upstream(node, upstream_bin, tmp_path, delegates=delegates)
    try:
        check = upstream_shim(node, upstream, "CHECK")
        assert check.code == 0, (check.output, upstream.log()[-2000:])
        drop_address(node, "eth0")
        broken = upstream_shim(node, upstream, "CHECK")
        assert broken.code != 0, "upstream's CHECK did not read multusd's result cache"
        assert upstream_shim(node, upstream, "DEL").code == 0
    finally:
        upstream.stop()
    node.released()


def test_during_the_move_either_shim_works_with_either_daemon(sandbox, tls_kube, tmp_path,
                                                              upstream_bin):
    """/opt/cni/bin/multus-shim may still be the other project's while its daemon runs."""
    node = Node(sandbox, tls_kube, tmp_path)
    upstream = start_upstream(node, upstream_bin, tmp_path,
                              clusterNetwork=node.cluster.cluster_path)
    try:  # multusd's shim, upstream's daemon
        found = sockcheck.probe(os.path.join(upstream.socket_dir, "multus.sock"))
        assert found.state == sockcheck.FOREIGN and DAEMON in found.command, found.describe()
        add = call_shim("ADD", upstream.shim_conf("0.4.0"), container_id=node.cid,
                        netns=node.ns_path, pod=("default", "mover"), uid=node.uid)
        assert add.code == 0, add.output
        assert add.output["ips"][0]["address"].startswith("10.80.0.")
        assert call_shim("DEL", upstream.shim_conf("0.4.0"), container_id=node.cid,
                         netns=node.ns_path, pod=("default", "mover"), uid=node.uid).code == 0
    finally:
        upstream.stop()
    node.released()

    daemon = node.multusd()  # upstream's shim, multusd's daemon
    for command in ("ADD", "CHECK", "DEL"):
        out = call_shim(command, daemon.shim_conf("0.4.0"), container_id=node.cid,
                        netns=node.ns_path, pod=("default", "mover"), uid=node.uid,
                        argv=upstream.shim_argv)
        assert out.code == 0, (command, out.output)
        if command == "ADD":
            assert set(netns_addresses(node.ns_name)) == {"lo", "eth0", "net1"}
    node.released()
