"""multusd.core.records: sandbox records read back from the scratch and result caches."""

from __future__ import annotations

import os

from multusd import store
from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.core import records, scratch
from multusd.core.delegate import Delegate

CLUSTER = (b'{"cniVersion":"0.4.0","name":"cluster-net","type":"bridge",'
           b'"ipam":{"type":"host-local"}}')
NAD = b'{"cniVersion":"0.4.0","name":"net-a","type":"macvlan","password":"s3cret"}'
ARGS = (("IgnoreUnknown", "true"), ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "web"),
        ("K8S_POD_INFRA_CONTAINER_ID", "cid1"), ("K8S_POD_UID", "u-1"))


def _result(ifname: str, address: str) -> dict:
    return {"cniVersion": "0.4.0",
            "interfaces": [{"name": "br0", "mac": "aa:00:00:00:00:01"},
                           {"name": ifname, "mac": "aa:00:00:00:00:02", "sandbox": "/ns"}],
            "ips": [{"version": "4", "interface": 1, "address": address,
                     "gateway": "10.0.0.1"}]}


def _attach(cni_dir: str, cid: str, netns: str, net: str, conf: bytes, ifname: str,
            address: str) -> None:
    rt = RuntimeConf(container_id=cid, netns=netns, ifname=ifname, args=ARGS,
                     capability_args={"CNIDeviceInfoFile": f"/devinfo/{cid}-{ifname}"},
                     cache_dir=cni_dir)
    resultcache.write(cni_dir, net, rt, conf, _result(ifname, address))


def _sandbox(tmp_path, cid: str = "cid1", netns: str = "/proc/self/ns/net") -> str:
    cni_dir = str(tmp_path / "cni")
    delegates = [Delegate(name="cluster-net", conf=CLUSTER, ifname="eth0", master=True),
                 Delegate(name="default/net-a", conf=NAD, ifname="net1", master=False,
                          device_id="0000:03:00.1", resource_name="intel/sriov")]
    store.atomic_write(os.path.join(cni_dir, cid), scratch.delegates_to_cache(delegates))
    _attach(cni_dir, cid, netns, "cluster-net", CLUSTER, "eth0", "10.0.0.5/24")
    _attach(cni_dir, cid, netns, "net-a", NAD, "net1", "10.1.0.5/24")
    return cni_dir


def test_a_sandbox_reads_back_with_its_pod_netns_and_attachments(tmp_path):
    cni_dir = _sandbox(tmp_path)

    [record] = records.read_sandboxes(cni_dir)

    assert (record.container_id, record.pod, record.pod_uid) == ("cid1", "default/web", "u-1")
    assert record.netns == "/proc/self/ns/net" and record.netns_state() == records.PRESENT
    assert [(a.network, a.net_name, a.ifname, a.master) for a in record.attachments] == [
        ("cluster-net", "cluster-net", "eth0", True), ("default/net-a", "net-a", "net1", False)]
    eth0, net1 = record.attachments
    assert eth0.plugins == ("bridge", "host-local") and net1.plugins == ("macvlan",)
    assert net1.ips == ["10.1.0.5/24"] and net1.gateways == ["10.0.0.1"]
    assert net1.mac == "aa:00:00:00:00:02"  # the pod's interface, not the host bridge
    assert (net1.device_id, net1.device_info_file) == ("0000:03:00.1", "/devinfo/cid1-net1")
    assert record.files == [os.path.join(cni_dir, "cid1"),
                            os.path.join(cni_dir, "results", "cluster-net-cid1-eth0"),
                            os.path.join(cni_dir, "results", "net-a-cid1-net1")]
    assert records.read_sandbox(cni_dir, "cid1") == record
    assert records.read_sandbox(cni_dir, "other") is None
    assert records.read_sandbox(cni_dir, "../etc") is None


def test_without_a_scratch_cache_the_result_cache_still_names_the_attachments(tmp_path):
    cni_dir = _sandbox(tmp_path)
    os.unlink(os.path.join(cni_dir, "cid1"))

    [record] = records.read_sandboxes(cni_dir)

    assert record.scratch_file == ""
    assert [(a.network, a.ifname, a.master) for a in record.attachments] == [
        ("cluster-net", "eth0", True), ("net-a", "net1", False)]


def test_a_released_master_leaves_its_interface_name_to_the_runtime_default(tmp_path):
    # a DEL that released eth0 but not net1 (a plugin binary gone): net1 is not the master
    cni_dir = _sandbox(tmp_path)
    resultcache.delete(cni_dir, "cluster-net", "cid1", "eth0")

    record = records.read_sandbox(cni_dir, "cid1")

    assert record.master_ifname == "eth0"
    assert [(a.ifname, a.master) for a in record.attachments] == [("eth0", True),
                                                                  ("net1", False)]
    assert record.netns == "/proc/self/ns/net" and record.pod_name == "web"


def test_a_corrupt_scratch_cache_is_reported_not_fatal(tmp_path):
    cni_dir = _sandbox(tmp_path)
    with open(os.path.join(cni_dir, "cid1"), "w") as handle:
        handle.write("{not json")

    [record] = records.read_sandboxes(cni_dir)

    assert "not valid JSON" in record.scratch_error
    assert len(record.attachments) == 2  # from the result cache


def test_only_container_id_files_count_as_sandboxes(tmp_path):
    cni_dir = _sandbox(tmp_path)
    for name in (".tmp-cid1", "bad name"):
        open(os.path.join(cni_dir, name), "w").close()
    os.mkdir(os.path.join(cni_dir, "subdir"))
    assert records.container_ids(cni_dir) == ["cid1"]
    assert records.container_ids(str(tmp_path / "absent")) == []


def test_netns_state_tells_a_network_namespace_from_anything_else(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    assert records.netns_state("/proc/self/ns/net") == records.PRESENT
    assert records.netns_state("/proc/self/ns/uts") == records.GONE  # a namespace, not net
    assert records.netns_state(str(plain)) == records.GONE  # a left-over mount point file
    assert records.netns_state(str(tmp_path / "deleted")) == records.GONE
    assert records.netns_state("") == records.UNKNOWN


def test_stale_sandboxes_are_those_whose_netns_is_gone(tmp_path):
    cni_dir = _sandbox(tmp_path, "live")
    _sandbox(tmp_path, "dead", netns=str(tmp_path / "gone-netns"))
    assert [r.container_id for r in records.stale_sandboxes(cni_dir)] == ["dead"]
    assert records.count_stale_sandboxes(cni_dir) == 1
    assert records.count_stale_sandboxes(str(tmp_path / "absent")) == 0


def test_redact_hides_credential_values_at_any_depth():
    conf = {"type": "x", "password": "p", "ipam": {"apiToken": "t", "keyFile": "/k",
                                                   "list": [{"client_secret": "s"}]}}
    assert records.redact(conf) == {
        "type": "x", "password": "<redacted>",
        "ipam": {"apiToken": "<redacted>", "keyFile": "/k",
                 "list": [{"client_secret": "<redacted>"}]}}


def test_attachments_added_and_removed_while_the_pod_ran_are_read_back(tmp_path):
    from multusd.core.hotplugrecord import ADDED, HotplugMark, Removal, ScratchEntries

    cni_dir = _sandbox(tmp_path)
    path = os.path.join(cni_dir, "cid1")
    with open(path, "rb") as handle:
        entries = ScratchEntries.parse(handle.read())
    entries.set_mark(1, HotplugMark(state=ADDED, since=5.0))
    entries.entries[0]["multusdRemoved"] = [Removal(network="default/b", ifname="net2",
                                                    at=6.0).to_json()]
    store.atomic_write(path, entries.to_bytes())

    [record] = records.read_sandboxes(cni_dir)

    assert [a.hotplug for a in record.attachments] == [None, HotplugMark(state=ADDED, since=5.0)]
    assert record.removed == (Removal(network="default/b", ifname="net2", at=6.0),)
    assert records.read_sandboxes(_sandbox(tmp_path / "plain"))[0].removed == ()
