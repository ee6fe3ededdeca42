"""STATUS, GC, the readiness indicator file and long-run memory, through the real shim and daemon."""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest

from harness import call_shim, netns_addresses, shim_bound
from multusd.wire import api
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]


def recorder(record: str, version: str = "1.1.0", **extra) -> dict:
    conf = {"cniVersion": version, "name": "recnet", "type": "stub-record", "recordFile": record,
            "result": {"ips": [{"address": "192.0.2.7/24"}]}}
    conf.update(extra)
    return conf


def calls(record: str, command: str) -> list:
    with open(record) as handle:
        return [json.loads(line) for line in handle if json.loads(line)["command"] == command]


def pod(cid: str) -> dict:
    return {"container_id": cid, "pod": ("default", "p-" + cid[:6]), "uid": str(uuid.uuid4())}


def test_status_passes_the_cluster_networks_error_code_through(sandbox, tmp_path):
    record = str(tmp_path / "calls.jsonl")
    failing = recorder(record, failOn="STATUS",
                       error={"cniVersion": "1.1.0", "code": 50, "msg": "status failed"})
    daemon = sandbox.daemon({"delegates": [failing]})
    out = call_shim("STATUS", daemon.shim_conf("1.1.0"))
    assert out.code == 1
    assert (out.output["code"], out.output["msg"]) == (50, "status failed")
    assert len(calls(record, "STATUS")) == 1

    healthy = sandbox.daemon({"delegates": [recorder(str(tmp_path / "ok.jsonl"))]})
    assert call_shim("STATUS", healthy.shim_conf("1.1.0")).code == 0


def test_gc_keeps_every_cached_attachment_valid(sandbox, tmp_path):
    record = str(tmp_path / "calls.jsonl")
    daemon = sandbox.daemon({"delegates": [recorder(record)]})
    conf = daemon.shim_conf("1.1.0")
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert call_shim("ADD", conf, netns=ns_path, **pod(cid)).code == 0

    out = call_shim("GC", conf)
    assert out.code == 0, out.output
    gc = calls(record, "GC")
    assert len(gc) == 1
    assert {"containerID": cid, "ifname": "eth0"} in gc[0]["stdin"]["cni.dev/valid-attachments"]
    assert calls(record, "DEL") == []  # nothing cached was stale

    os.rename(os.path.join(daemon.cni_dir, "results"), os.path.join(daemon.cni_dir, "moved"))
    missing = call_shim("GC", conf)
    assert missing.code == 1
    assert "error in gather valid attachments" in missing.output["msg"]


@pytest.fixture
def static_mode(sandbox, tmp_path):
    """Non-auto mode (an operator-written multus config), where the readiness file applies."""
    operator_conf = tmp_path / "00-multus.conf"
    operator_conf.write_text("{}")
    ready = tmp_path / "ready" / "indicator"
    return operator_conf, ready


def test_add_waits_for_the_readiness_indicator_file(sandbox, static_mode):
    operator_conf, ready = static_mode
    daemon = sandbox.daemon({"multusConfigFile": str(operator_conf),
                             "readinessindicatorfile": str(ready),
                             "delegates": [sandbox.net("primary", "10.72.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    result = {}
    caller = threading.Thread(target=lambda: result.update(
        add=call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod(cid))))
    caller.start()
    wait_for(lambda: "ADD starting" in daemon.log() or not caller.is_alive(), shim_bound("ADD"),
             what="the ADD to reach the daemon")
    assert "eth0" not in netns_addresses(ns_name)
    ready.parent.mkdir()
    ready.write_text("")
    caller.join(shim_bound("ADD"))
    assert result["add"].code == 0, result["add"].output
    assert netns_addresses(ns_name)["eth0"] == ["10.72.0.2/24"]
    assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod(cid)).code == 0


def test_add_without_the_readiness_file_fails_with_upstreams_hint(sandbox, static_mode):
    operator_conf, ready = static_mode
    daemon = sandbox.daemon({"multusConfigFile": str(operator_conf), "requestTimeout": 2,
                             "readinessindicatorfile": str(ready),
                             "delegates": [sandbox.net("primary", "10.73.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    out = call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod(uuid.uuid4().hex))
    assert out.code == 1
    assert "have you checked that your default network is ready?" in out.output["msg"]
    assert str(ready) in out.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}


def test_status_without_the_readiness_file_is_not_ready_at_once(sandbox, static_mode, tmp_path):
    operator_conf, ready = static_mode
    record = str(tmp_path / "calls.jsonl")
    daemon = sandbox.daemon({"multusConfigFile": str(operator_conf),
                             "readinessindicatorfile": str(ready),
                             "delegates": [recorder(record)]})
    out = call_shim("STATUS", daemon.shim_conf("1.1.0"))
    assert (out.code, out.output["code"]) == (1, 50)  # before: 11, after a wait of 45 s
    assert f"the readiness indicator file {ready} (readinessindicatorfile) does not exist" \
        in out.output["msg"]
    assert not ready.exists()  # answered while it was missing
    assert not os.path.exists(record)  # the cluster network was not asked
    ready.parent.mkdir()
    ready.write_text("")
    assert call_shim("STATUS", daemon.shim_conf("1.1.0")).code == 0
    assert len(calls(record, "STATUS")) == 1


def test_status_of_a_daemon_that_does_not_answer_is_not_ready(tmp_path):
    import socket as pysocket

    missing = call_shim("STATUS", {"cniVersion": "1.1.0", "daemonSocketDir": str(tmp_path)})
    assert (missing.code, missing.output["code"]) == (1, 50)
    assert f"multusd is not reachable on {tmp_path}/multus.sock" in missing.output["msg"]
    with pysocket.socket(pysocket.AF_UNIX) as silent:  # a socket whose daemon never answers
        silent.bind(str(tmp_path / "multus.sock"))
        silent.listen(8)
        out = call_shim("STATUS", {"cniVersion": "1.1.0", "daemonSocketDir": str(tmp_path)})
    assert (out.code, out.output["code"]) == (1, 50)
    assert "multusd is not reachable" in out.output["msg"]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_stays_flat_over_thousands_of_requests(sandbox, tmp_path):
    daemon = sandbox.daemon({"delegates": [recorder(str(tmp_path / "r.jsonl"))],
                             "logLevel": "error"})
    body = api.encode_request({"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "gone",
                               "CNI_NETNS": "", "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b"},
                              json.dumps(daemon.shim_conf("1.1.0")).encode())

    def burst(count: int) -> None:
        for _ in range(count):
            response = api.http_request(daemon.socket_path, "POST", "/cni", body, timeout=10)
            assert response.status == 400  # nothing recorded for "gone": a clear CNI error

    burst(300)
    before = rss_kb(daemon.proc.pid)
    burst(2000)
    after = rss_kb(daemon.proc.pid)
    assert after - before < 2048, f"RSS grew from {before} kB to {after} kB"
