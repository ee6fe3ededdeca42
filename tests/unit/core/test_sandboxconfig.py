"""multusd.core.sandboxconfig: what a sandbox was attached under, recorded in its scratch cache
(keys upstream's decoder skips) and what its DEL and CHECK are judged by, through the daemon's
Multus on stub delegates."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from multusd import DEFAULT_CNI_DIR, store
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.config import daemonconf
from multusd.core import request, sandboxconfig, scratch
from multusd.core.delegate import Delegate
from multusd.core.multus import Multus
from multusd.node.devices import devinfo_cni_dir

from harness import STUBS
from stubnode import RUNTIME_CONF, stub_calls

POD_ARGS = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u1"


class Node:
    """The daemon's Multus under a daemon-config.json that a test edits between requests."""

    def __init__(self, tmp_path) -> None:
        self.tmp = tmp_path
        self.calls_file = str(tmp_path / "calls.jsonl")
        self.multus = None

    def stub(self, name: str, **keys) -> dict:
        return dict({"cniVersion": "1.0.0", "name": name, "type": "stub-record",
                     "recordFile": self.calls_file}, **keys)

    def configure(self, **raw) -> "Node":
        raw = dict({"binDir": STUBS, "socketDir": str(self.tmp / "run")}, **raw)
        self.multus = Multus(daemonconf.from_dict(raw, str(self.tmp / "daemon-config.json")))
        return self

    def request(self, command: str, cid: str = "c1", netns: str = "", **conf
                ) -> request.CmdArgs:
        """A request (an ADD's is parsed only: its namespace is never opened)."""
        netns = netns or ("/run/netns/never-opened" if command == "ADD" else "")
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
               "CNI_IFNAME": "eth0", "CNI_ARGS": POD_ARGS}
        return request.parse(env, json.dumps(dict(RUNTIME_CONF, **conf)).encode(),
                             self.multus.config)

    def run(self, command: str, log, cid: str = "c1", netns: str = "", **conf):
        return self.multus.cni(self.request(command, cid, netns, **conf),
                               time.monotonic() + 30, log)

    def calls(self) -> list:
        return stub_calls(self.calls_file)

    def call(self, index: int) -> dict:
        with open(self.calls_file) as handle:
            return json.loads(handle.readlines()[index])


class Said(logging.LoggerAdapter):
    """A request logger that keeps what it said."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("test"), {})
        self.lines: list = []

    def log(self, level, msg, *args, **kwargs):
        self.lines.append((level, msg % args if args else msg))


def attached(node: Node, cni_dir: str, delegates, under=None, cid: str = "c1") -> None:
    """The records an ADD of ``delegates`` leaves in ``cni_dir``; with ``under`` (a request
    whose configuration the ADD had) its record of that configuration."""
    entries = [scratch.cache_entry(d) for d in delegates]
    if under is not None:
        sandboxconfig.put(entries, sandboxconfig.of(under.effective))
    store.atomic_write(scratch.cache_path(cni_dir, cid), scratch.encode_entries(entries))
    for d in delegates:
        rt = RuntimeConf(container_id=cid, netns="", ifname=d.ifname, cache_dir=cni_dir)
        resultcache.write(cni_dir, d.conf_name, rt, d.conf, {"cniVersion": "1.0.0"})


def device_delegate(node: Node) -> Delegate:
    """A secondary with a device: its plugins get the device-info file's path."""
    conf = node.stub("sriov", capabilities={"deviceID": True, "CNIDeviceInfoFile": True})
    return Delegate(name="sriov", conf=json.dumps(conf).encode(), ifname="net1", master=False,
                    device_id="0000:01:00.1", resource_name="r/x")


def held(cni_dir: str, cid: str = "c1") -> list:
    found = [cid] if os.path.exists(os.path.join(cni_dir, cid)) else []
    results = os.path.join(cni_dir, "results")
    return found + sorted(n for n in os.listdir(results) if f"-{cid}-" in n) \
        if os.path.isdir(results) else found


def test_the_record_goes_round_trip_and_a_broken_one_says_what_is_wrong(tmp_path):
    node = Node(tmp_path).configure(clusterNetwork="cn", cniDir="/c", namespaceIsolation=True,
                                    globalNamespaces="a,b", auxiliaryCNIChainName="aux",
                                    deviceInfoDir="/di")
    recorded = sandboxconfig.of(node.request("ADD").effective)
    assert recorded == sandboxconfig.SandboxConfig(
        cni_dir="/c", conf_dir="/etc/cni/multus/net.d", multus_namespace="kube-system",
        namespace_isolation=True, global_namespaces=("a", "b"),
        system_namespaces=("kube-system",), auxiliary_chain="aux", devinfo_dir="/di",
        kubelet_dir="/var/lib/kubelet")
    entries = [{"Name": "cn"}]
    sandboxconfig.put(entries, recorded)
    assert sandboxconfig.read(json.loads(json.dumps(entries))) == (recorded, "")
    assert sandboxconfig.read([{"Name": "cn"}]) == (None, "")  # an earlier multusd's
    entries[0]["multusdConfig"]["globalNamespaces"] = "a,b"
    assert sandboxconfig.read(entries) == (
        None, "multusdConfig.globalNamespaces is not a list of strings")


def test_del_is_judged_by_the_configuration_the_sandbox_was_attached_under(tmp_path):
    node = Node(tmp_path)
    cni_dir, before, after = str(tmp_path / "cni"), str(tmp_path / "di-a"), str(tmp_path / "di-b")
    conf = node.stub("cluster")
    delegates = [Delegate(name="cluster", conf=json.dumps(conf).encode(), ifname="eth0",
                          master=True), device_delegate(node)]
    node.configure(delegates=[conf], cniDir=cni_dir, deviceInfoDir=before)
    attached(node, cni_dir, delegates, under=node.request("ADD"))

    # the operator points deviceInfoDir elsewhere, and restarts the daemon
    node.configure(delegates=[conf], cniDir=cni_dir, deviceInfoDir=after)
    node.run("DEL", Said())

    assert node.calls() == [("DEL", "sriov", "net1"), ("DEL", "cluster", "eth0")]
    info_file = node.call(0)["stdin"]["runtimeConfig"]["CNIDeviceInfoFile"]
    assert info_file.startswith(devinfo_cni_dir(before) + "/"), info_file
    assert held(cni_dir) == []


def test_a_sandbox_without_a_record_is_judged_as_configured_now_and_said_once(tmp_path):
    node = Node(tmp_path)
    cni_dir, now = str(tmp_path / "cni"), str(tmp_path / "di-now")
    conf = node.stub("cluster", failOn="DEL",
                     error={"cniVersion": "1.0.0", "code": 11, "msg": "down"})
    delegates = [Delegate(name="cluster", conf=json.dumps(conf).encode(), ifname="eth0",
                          master=True), device_delegate(node)]
    node.configure(delegates=[conf], cniDir=cni_dir, deviceInfoDir=now)
    attached(node, cni_dir, delegates)  # upstream's, or an earlier multusd's: no record

    said = Said()
    for _ in range(2):  # the runtime retries a DEL that fails
        with pytest.raises(Exception):
            node.run("DEL", said)
    info_file = node.call(0)["stdin"]["runtimeConfig"]["CNIDeviceInfoFile"]
    assert info_file.startswith(devinfo_cni_dir(now) + "/")
    notices = [line for _, line in said.lines if "has no record of the configuration" in line]
    assert notices == [sandboxconfig.NO_RECORD % "c1"]  # once, not per DEL


@pytest.mark.privileged
def test_del_and_check_find_the_records_in_any_cni_dir_the_node_names(tmp_path, netns):
    """A static 00-multus.conf names cniDir; the operator then sets another one in
    daemon-config.json: the runtime's DEL (its merged config names the new one) still finds
    and releases what the ADD recorded in the first."""
    node = Node(tmp_path)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    conf_dir = tmp_path / "net.d"
    static = dict(RUNTIME_CONF, cniDir=first, delegates=[node.stub("cluster")])
    os.makedirs(conf_dir)
    (conf_dir / "00-multus.conf").write_text(json.dumps(static))
    mode = {"multusConfigFile": str(conf_dir / "00-multus.conf"), "cniConfigDir": str(conf_dir)}
    node.configure(**mode)
    add = node.request("ADD", **static)
    assert add.effective.cni_dir == first
    cluster = Delegate(name="cluster", conf=json.dumps(node.stub("cluster")).encode(),
                       ifname="eth0", master=True)
    attached(node, first, [cluster], under=add)

    node.configure(cniDir=second, **mode)
    said = Said()
    node.run("CHECK", said, netns=netns, **static)
    node.run("DEL", said, **static)

    assert node.calls() == [("CHECK", "cluster", "eth0"), ("DEL", "cluster", "eth0")]
    assert held(first) == [] and not os.path.exists(second)
    assert any(f"records are in {first}, not in the request's cniDir {second}" in line
               for _, line in said.lines)
    assert node.multus.node.cni_dirs() == (second, first, DEFAULT_CNI_DIR)


@pytest.mark.privileged
def test_an_add_records_its_configuration_and_what_named_each_delegate(tmp_path, netns):
    node = Node(tmp_path)
    cni_dir = str(tmp_path / "cni")
    node.configure(delegates=[node.stub("cluster"), node.stub("extra")], cniDir=cni_dir,
                   namespaceIsolation=True, multusNamespace="multus")
    node.run("ADD", Said(), netns=netns)
    entries = scratch.cache_entries(scratch.read_cache(scratch.cache_path(cni_dir, "c1")))
    record, problem = sandboxconfig.read(entries)
    assert problem == "" and record.cni_dir == cni_dir
    assert (record.namespace_isolation, record.multus_namespace) == (True, "multus")
    assert [e[scratch.NAMED_BY_KEY] for e in entries] == ["delegates", "delegates"]
    node.run("DEL", Said())
    assert held(cni_dir) == []
