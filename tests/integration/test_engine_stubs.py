"""The engine (multusd.cni.conflist.Engine) driving recording stub plugins.

Real subprocesses and real cache files; the stubs (tests/stubs) record every call
(command, environment, stdin) as one JSON line, so order and plugin input can be asserted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import List

import pytest

from multusd.cni import resultcache
from multusd.cni.resultcache import RuntimeConf
from multusd.cni.conflist import Engine, NetworkConfigList
from multusd.errors import (DeadlineExceeded, DelegateError, IncompatibleCNIVersion,
                            InvalidNetworkConfig, MultusError, PluginError,
                            UnknownContainer)

RESULT_100 = {"cniVersion": "1.0.0",
              "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
              "ips": [{"interface": 0, "address": "10.9.0.5/24", "gateway": "10.9.0.1"}],
              "routes": [{"dst": "0.0.0.0/0", "gw": "10.9.0.1"}]}


@pytest.fixture
def record(tmp_path) -> str:
    return str(tmp_path / "calls.jsonl")


@pytest.fixture
def engine(stub_bin, tmp_path) -> Engine:
    # a second, empty directory proves CNI_PATH carries every bin dir
    return Engine([stub_bin, str(tmp_path / "empty-bin")], default_timeout=60)


def calls(record: str) -> List[dict]:
    if not os.path.exists(record):
        return []
    with open(record) as handle:
        return [json.loads(line) for line in handle]


def rt_for(tmp_path, cid: str = "cid1", **kw) -> RuntimeConf:
    values = dict(container_id=cid, netns="/var/run/netns/x", ifname="eth0",
                  args=(("IgnoreUnknown", "true"), ("K8S_POD_NAME", "web"), ("EXTRA", "a=b")),
                  cache_dir=str(tmp_path / "cache"))
    values.update(kw)
    return RuntimeConf(**values)


def chain(record: str, version: str = "1.0.0", **extra) -> NetworkConfigList:
    return NetworkConfigList.load({
        "cniVersion": version, "name": "chain-net", **extra,
        "plugins": [
            {"type": "stub-record", "recordFile": record, "result": RESULT_100,
             "capabilities": {"mac": True, "portMappings": False, "ips": True}},
            {"type": "stub-record", "recordFile": record, "appendInterface": "second"},
            {"type": "stub-record", "recordFile": record, "appendInterface": "third"},
        ]}, source="test chain")


def test_add_chains_prev_result_and_returns_the_last_result(engine, record, tmp_path,
                                                             stub_bin):
    net = chain(record)
    rt = rt_for(tmp_path)
    result = engine.add(net, rt)
    assert [i["name"] for i in result["interfaces"]] == ["eth0", "second", "third"]
    first, second, third = calls(record)
    assert [c["command"] for c in (first, second, third)] == ["ADD"] * 3
    assert "prevResult" not in first["stdin"]
    assert second["stdin"]["prevResult"] == RESULT_100
    assert [i["name"] for i in third["stdin"]["prevResult"]["interfaces"]] == ["eth0", "second"]
    for call in (first, second, third):
        assert call["stdin"]["name"] == "chain-net" and call["stdin"]["cniVersion"] == "1.0.0"
        env = call["env"]
        assert env["CNI_COMMAND"] == "ADD" and env["CNI_CONTAINERID"] == "cid1"
        assert env["CNI_NETNS"] == "/var/run/netns/x" and env["CNI_IFNAME"] == "eth0"
        assert env["CNI_ARGS"] == "IgnoreUnknown=true;K8S_POD_NAME=web;EXTRA=a=b"
        assert env["CNI_PATH"] == f"{stub_bin}:{tmp_path / 'empty-bin'}"
    entry = resultcache.read(rt.cache_dir, "chain-net", "cid1", "eth0")
    assert entry["result"] == result
    assert resultcache.decode_config(entry) == net.data
    assert engine.cached_result("chain-net", rt) == result


def test_prev_result_is_converted_to_the_list_version(engine, record, tmp_path):
    # The first plugin answers in 1.0.0 although the list is 0.4.0: the next one must get
    # a 0.4.0 prevResult (ips[].version present), and so must the caller.
    result = engine.add(chain(record, version="0.4.0"), rt_for(tmp_path))
    second = calls(record)[1]
    assert second["stdin"]["prevResult"]["cniVersion"] == "0.4.0"
    assert second["stdin"]["prevResult"]["ips"][0]["version"] == "4"
    assert result["cniVersion"] == "0.4.0" and result["ips"][0]["version"] == "4"


def test_runtime_config_only_carries_declared_capabilities(engine, record, tmp_path):
    caps = {"mac": "c2:11:22:33:44:66", "portMappings": [{"hostPort": 80}],
            "bandwidth": {"ingressRate": 1}, "ips": ["10.9.0.5/24"]}
    engine.add(chain(record), rt_for(tmp_path, capability_args=caps))
    first, second, _ = calls(record)
    # declared true and given: mac, ips; declared false: portMappings; undeclared: bandwidth
    assert first["stdin"]["runtimeConfig"] == {"mac": "c2:11:22:33:44:66",
                                               "ips": ["10.9.0.5/24"]}
    assert "runtimeConfig" not in second["stdin"]
    cached = resultcache.read(str(tmp_path / "cache"), "chain-net", "cid1", "eth0")
    assert cached["capabilityArgs"] == caps


def test_del_runs_in_reverse_with_the_cached_result(engine, record, tmp_path):
    net, rt = chain(record), rt_for(tmp_path)
    added = engine.add(net, rt)
    os.unlink(record)
    engine.delete(net, rt)
    dels = calls(record)
    assert [c["command"] for c in dels] == ["DEL"] * 3
    assert [c["stdin"].get("appendInterface") for c in dels] == ["third", "second", None]
    assert all(c["stdin"]["prevResult"] == added for c in dels)
    assert resultcache.read(rt.cache_dir, "chain-net", "cid1", "eth0") is None


def test_del_below_040_sends_no_prev_result(engine, record, tmp_path):
    net, rt = chain(record, version="0.3.1"), rt_for(tmp_path)
    engine.add(net, rt)
    os.unlink(record)
    engine.delete(net, rt)
    assert all("prevResult" not in c["stdin"] for c in calls(record))


def test_del_without_cache_succeeds_and_repeats(engine, record, tmp_path):
    net, rt = chain(record), rt_for(tmp_path, netns="")
    engine.delete(net, rt)
    engine.delete(net, rt)
    dels = calls(record)
    assert len(dels) == 6 and all("prevResult" not in c["stdin"] for c in dels)


def test_del_failure_still_runs_the_other_plugins_and_keeps_the_cache(engine, record,
                                                                      tmp_path):
    error = {"code": 77, "msg": "cannot release"}
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "plugins": [
        {"type": "stub-record", "recordFile": record, "result": RESULT_100},
        {"type": "stub-record", "recordFile": record, "failOn": "DEL", "error": error},
        {"type": "stub-record", "recordFile": record}]})
    rt = rt_for(tmp_path)
    engine.add(net, rt)
    with pytest.raises(PluginError) as err:
        engine.delete(net, rt)
    assert err.value.code == 77 and err.value.msg == "cannot release"
    assert [c["command"] for c in calls(record)] == ["ADD"] * 3 + ["DEL"] * 3
    assert resultcache.read(rt.cache_dir, "n", "cid1", "eth0") is not None


def test_check_uses_the_cached_result(engine, record, tmp_path):
    net, rt = chain(record), rt_for(tmp_path)
    added = engine.add(net, rt)
    os.unlink(record)
    engine.check(net, rt)
    checks = calls(record)
    assert [c["command"] for c in checks] == ["CHECK"] * 3
    assert [c["stdin"].get("appendInterface") for c in checks] == [None, "second", "third"]
    assert all(c["stdin"]["prevResult"] == added for c in checks)


def test_check_without_cache_is_a_clear_error(engine, record, tmp_path):
    with pytest.raises(UnknownContainer) as err:
        engine.check(chain(record), rt_for(tmp_path))
    assert "no cached result" in err.value.msg and "was ADD run" in err.value.msg
    assert calls(record) == []


def test_check_below_040_is_not_supported(engine, record, tmp_path):
    with pytest.raises(IncompatibleCNIVersion) as err:
        engine.check(chain(record, version="0.3.1"), rt_for(tmp_path))
    assert "does not support the CHECK command" in err.value.msg


def test_disable_check_skips_plugins(engine, record, tmp_path):
    net, rt = chain(record, disableCheck=True), rt_for(tmp_path)
    engine.add(net, rt)
    os.unlink(record)
    engine.check(net, rt)
    assert calls(record) == []


def test_plugin_error_stops_add_and_passes_through(engine, record, tmp_path):
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "plugins": [
        {"type": "stub-record", "recordFile": record, "result": RESULT_100},
        {"type": "stub-error"},
        {"type": "stub-record", "recordFile": record}]})
    rt = rt_for(tmp_path)
    with pytest.raises(PluginError) as err:
        engine.add(net, rt)
    assert err.value.to_cni_error()["extraKey"] == "kept"
    assert len(calls(record)) == 1
    assert resultcache.read(rt.cache_dir, "n", "cid1", "eth0") is None


@pytest.mark.parametrize("plugin, error, fragment", [
    ("stub-garbage", DelegateError, "not a JSON object"),
    ("stub-exit", DelegateError, "exited with code 3"),
    ("no-such-plugin", InvalidNetworkConfig, "failed to find plugin 'no-such-plugin'"),
])
def test_broken_plugins_give_clear_errors(engine, tmp_path, stub_bin, plugin, error, fragment):
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "type": plugin})
    with pytest.raises(error) as err:
        engine.add(net, rt_for(tmp_path))
    assert fragment in err.value.msg
    if plugin == "no-such-plugin":
        assert stub_bin in err.value.msg and str(tmp_path / "empty-bin") in err.value.msg


def test_add_with_no_result_is_an_error(engine, tmp_path):
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "type": "stub-record",
                                  "silentOn": "ADD"})
    with pytest.raises(DelegateError) as err:
        engine.add(net, rt_for(tmp_path))
    assert "printed no result on ADD" in err.value.msg


def test_result_without_cni_version_takes_the_configs(engine, tmp_path):
    net = NetworkConfigList.load({"cniVersion": "0.4.0", "name": "n", "type": "stub-record",
                                  "result": {"cniVersion": "",
                                             "ips": [{"version": "4",
                                                      "address": "10.9.0.7/24"}]}})
    assert engine.add(net, rt_for(tmp_path))["cniVersion"] == "0.4.0"


def test_hanging_plugin_hits_the_deadline(engine, tmp_path):
    net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": "n", "type": "stub-hang",
                                  "pidFile": str(tmp_path / "pids")})
    with pytest.raises(DeadlineExceeded):
        engine.add(net, rt_for(tmp_path), deadline=time.monotonic() + 2)


@pytest.mark.parametrize("rt_change, error_word", [
    ({"container_id": ""}, "missing container ID"),
    ({"container_id": "bad/id"}, "container ID"),
    ({"ifname": "a-very-long-interface-name"}, "interface name"),
    ({"ifname": "et:h0"}, "interface name"),
])
def test_add_validates_the_attachment_like_libcni(engine, record, tmp_path, rt_change,
                                                  error_word):
    with pytest.raises(MultusError) as err:
        engine.add(chain(record), rt_for(tmp_path, **rt_change))
    assert error_word in err.value.msg
    assert calls(record) == []


def test_status_runs_only_for_110(engine, record, tmp_path):
    engine.status(chain(record, version="1.0.0"))
    assert calls(record) == []
    engine.status(chain(record, version="1.1.0"))
    statuses = calls(record)
    assert [c["command"] for c in statuses] == ["STATUS"] * 3
    assert statuses[0]["env"]["CNI_CONTAINERID"] == "" and statuses[0]["env"]["CNI_NETNS"] == ""
    assert all("runtimeConfig" not in c["stdin"] for c in statuses)


def test_status_error_passes_through(engine, record):
    net = NetworkConfigList.load({"cniVersion": "1.1.0", "name": "n", "type": "stub-record",
                                  "failOn": "STATUS",
                                  "error": {"code": 50, "msg": "plugin not available"}})
    with pytest.raises(PluginError) as err:
        engine.status(net)
    assert err.value.code == 50 and err.value.msg == "plugin not available"


@pytest.mark.parametrize("version, plugin_gc", [("1.1.0", True), ("1.0.0", False)])
def test_gc_deletes_stale_attachments_then_gcs_plugins(engine, record, tmp_path, version,
                                                       plugin_gc):
    net = chain(record, version=version)
    cache_dir = str(tmp_path / "cache")
    for cid in ("keep1", "stale1"):
        engine.add(net, rt_for(tmp_path, cid=cid, capability_args={"mac": "c2:00:00:00:00:01"}))
    other = NetworkConfigList.load({"cniVersion": version, "name": "other-net",
                                    "type": "stub-record", "recordFile": record})
    engine.add(other, rt_for(tmp_path, cid="stale2"))
    os.unlink(record)
    valid = [{"containerID": "keep1", "ifname": "eth0"}]
    engine.gc(net, cache_dir, valid)
    gc_calls = calls(record)
    dels = [c for c in gc_calls if c["command"] == "DEL"]
    assert [c["env"]["CNI_CONTAINERID"] for c in dels] == ["stale1"] * 3
    # the synthesized DEL is built from the cache entry: netns, args, capabilities
    assert dels[0]["env"]["CNI_NETNS"] == "/var/run/netns/x"
    assert dels[0]["env"]["CNI_ARGS"] == "IgnoreUnknown=true;K8S_POD_NAME=web;EXTRA=a=b"
    assert dels[-1]["stdin"]["runtimeConfig"] == {"mac": "c2:00:00:00:00:01"}
    remaining = {(e["networkName"], e["containerId"]) for e in resultcache.list_entries(cache_dir)}
    assert remaining == {("chain-net", "keep1"), ("other-net", "stale2")}
    gcs = [c for c in gc_calls if c["command"] == "GC"]
    if plugin_gc:
        assert len(gcs) == 3
        assert all(c["stdin"]["cni.dev/valid-attachments"] == valid for c in gcs)
        assert all(c["stdin"]["cni.dev/attachments"] == valid for c in gcs)
    else:
        assert gcs == []


def test_engine_is_safe_from_many_threads(engine, tmp_path):
    errors = []
    results = {}

    def add(index: int) -> None:
        record = str(tmp_path / f"calls-{index}.jsonl")
        net = NetworkConfigList.load({"cniVersion": "1.0.0", "name": f"net{index}",
                                      "type": "stub-record", "recordFile": record,
                                      "result": {"ips": [{"address": f"10.9.1.{index}/24"}]}})
        try:
            results[index] = engine.add(net, rt_for(tmp_path, cid=f"c{index}"))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(1, 13)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert {i: r["ips"][0]["address"] for i, r in results.items()} == {
        i: f"10.9.1.{i}/24" for i in range(1, 13)}


def test_the_engine_reports_every_plugin_run_to_its_observer(stub_bin, record, tmp_path):
    observed: list = []
    engine = Engine([stub_bin], default_timeout=60,
                    observer=lambda *report: observed.append(report))
    net, rt = chain(record), rt_for(tmp_path)
    engine.add(net, rt)
    engine.delete(net, rt)
    assert [(plugin, command, outcome) for plugin, command, _, outcome in observed] == (
        [("stub-record", "ADD", "ok")] * 3 + [("stub-record", "DEL", "ok")] * 3)
