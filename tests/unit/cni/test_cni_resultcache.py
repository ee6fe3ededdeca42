"""multusd.cni.resultcache: libcni's cniCacheV1 files, byte format and edge cases."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat

import pytest

from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.errors import InvalidEnvironment, InvalidNetworkConfig, IOFailure

RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}]}
CONFIG = b'{"cniVersion":"1.0.0","name":"net1","type":"bridge"}'


def _rt(tmp_path, **kw) -> RuntimeConf:
    values = dict(container_id="cid1", netns="/var/run/netns/p1", ifname="eth0",
                  args=(("IgnoreUnknown", "true"), ("K8S_POD_NAME", "web")),
                  capability_args={"mac": "c2:11:22:33:44:66"}, cache_dir=str(tmp_path))
    values.update(kw)
    return RuntimeConf(**values)


def test_result_path_layout(tmp_path):
    assert resultcache.result_path("/var/lib/cni/multus", "net1", "cid1", "eth0") == \
        "/var/lib/cni/multus/results/net1-cid1-eth0"


@pytest.mark.parametrize("net, cid, ifname, error", [
    ("", "cid", "eth0", InvalidNetworkConfig), ("a/b", "cid", "eth0", InvalidNetworkConfig),
    ("net", "", "eth0", InvalidEnvironment), ("net", "../x", "eth0", InvalidEnvironment),
    ("net", "cid", "", InvalidEnvironment)])
def test_result_path_rejects_names_that_escape_or_are_empty(net, cid, ifname, error):
    with pytest.raises(error):
        resultcache.result_path("/c", net, cid, ifname)


def test_write_uses_libcni_keys_order_and_modes(tmp_path):
    rt = _rt(tmp_path)
    resultcache.write(str(tmp_path), "net1", rt, CONFIG, RESULT)
    path = resultcache.result_path(str(tmp_path), "net1", "cid1", "eth0")
    with open(path, "rb") as handle:
        entry = json.loads(handle.read())
    assert list(entry) == ["kind", "containerId", "config", "ifName", "networkName", "netns",
                           "cniArgs", "capabilityArgs", "result"]
    assert entry["kind"] == "cniCacheV1"
    assert base64.b64decode(entry["config"]) == CONFIG
    assert entry["cniArgs"] == [["IgnoreUnknown", "true"], ["K8S_POD_NAME", "web"]]
    assert entry["capabilityArgs"] == {"mac": "c2:11:22:33:44:66"}
    assert entry["result"] == RESULT
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert resultcache.read(str(tmp_path), "net1", "cid1", "eth0") == entry
    assert resultcache.decode_config(entry) == CONFIG


def test_empty_optional_fields_are_omitted_like_go_omitempty(tmp_path):
    rt = _rt(tmp_path, netns="", args=(), capability_args={})
    resultcache.write(str(tmp_path), "net1", rt, CONFIG, RESULT)
    entry = resultcache.read(str(tmp_path), "net1", "cid1", "eth0")
    assert set(entry) == {"kind", "containerId", "config", "ifName", "networkName", "result"}


def test_read_of_missing_and_corrupt_files(tmp_path, caplog):
    assert resultcache.read(str(tmp_path), "net1", "cid1", "eth0") is None
    assert resultcache.read_result(str(tmp_path), "net1", "cid1", "eth0") is None
    path = resultcache.result_path(str(tmp_path), "net1", "cid1", "eth0")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write('{"kind": "cniCacheV1", "resu')
    with caplog.at_level(logging.WARNING, logger="multusd.cni.resultcache"):
        assert resultcache.read(str(tmp_path), "net1", "cid1", "eth0") is None
    assert any(path in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)


def test_read_result_accepts_libcni_legacy_bare_result(tmp_path):
    path = resultcache.result_path(str(tmp_path), "net1", "cid1", "eth0")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump(RESULT, handle)
    assert resultcache.read_result(str(tmp_path), "net1", "cid1", "eth0") == RESULT
    assert resultcache.read(str(tmp_path), "net1", "cid1", "eth0") is None


def test_update_result_keeps_the_rest(tmp_path):
    resultcache.write(str(tmp_path), "net1", _rt(tmp_path), CONFIG, RESULT)
    before = resultcache.read(str(tmp_path), "net1", "cid1", "eth0")
    new = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.6/24"}], "routes": []}
    resultcache.update_result(str(tmp_path), "net1", "cid1", "eth0", new)
    after = resultcache.read(str(tmp_path), "net1", "cid1", "eth0")
    assert after["result"] == new
    assert {k: v for k, v in after.items() if k != "result"} == \
        {k: v for k, v in before.items() if k != "result"}


def test_update_result_of_missing_entry_fails_clearly(tmp_path):
    with pytest.raises(IOFailure) as err:
        resultcache.update_result(str(tmp_path), "net1", "cid1", "eth0", RESULT)
    assert "net1" in err.value.msg and "missing" in err.value.msg


def test_delete_and_list_entries(tmp_path):
    cache_dir = str(tmp_path)
    assert resultcache.list_entries(cache_dir) == []
    resultcache.write(cache_dir, "net1", _rt(tmp_path), CONFIG, RESULT)
    resultcache.write(cache_dir, "net2", _rt(tmp_path, container_id="cid2", ifname="net1"), CONFIG,
                RESULT)
    junk = os.path.join(cache_dir, "results", "junk-file")
    with open(junk, "w") as handle:
        handle.write("not json")
    entries = resultcache.list_entries(cache_dir)
    assert [(e["networkName"], e["containerId"], e["ifName"]) for e in entries] == [
        ("net1", "cid1", "eth0"), ("net2", "cid2", "net1")]
    assert resultcache.delete(cache_dir, "net1", "cid1", "eth0") is True
    assert resultcache.delete(cache_dir, "net1", "cid1", "eth0") is False
    assert [e["networkName"] for e in resultcache.list_entries(cache_dir)] == ["net2"]


def test_the_entries_of_one_container_are_read_alone(tmp_path):
    cache_dir = str(tmp_path)
    for cid in ("cid1", "cid12", "xcid1"):
        resultcache.write(cache_dir, "net1", _rt(tmp_path, container_id=cid), CONFIG, RESULT)
    assert [e["containerId"] for e in resultcache.list_entries(cache_dir, "cid1")] == ["cid1"]
    assert resultcache.list_entries(cache_dir, "cid9") == []
