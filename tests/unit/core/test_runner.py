"""multusd.core.runner: one delegate's ADD and DEL around the engine (device-info files,
undeclared requests), DEL of all in reverse, and how a delegate's failure is reported."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from multusd.core.delegate import Delegate
from multusd.core.runner import (CLEANUP_TIME, DelegateRunner, as_cni_error, delegate_error,
                                 emit_added)
from multusd.core.selection import NetworkSelection
from multusd.errors import MultusError

from stubnode import LOG, StubNode

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


@pytest.fixture
def node(tmp_path):
    return StubNode(tmp_path).configure([], deviceInfoDir=str(tmp_path / "devinfo"))


def runner(node: StubNode, **kw) -> DelegateRunner:
    req = node.request("ADD", netns="/var/run/netns/none")
    return DelegateRunner(node.multus.engine(req.config), req, time.monotonic() + 30, LOG, **kw)


def delegate(conf: dict, ifname: str, master: bool = False, **fields) -> Delegate:
    return Delegate(name=conf["name"], conf=json.dumps(conf).encode(), ifname=ifname,
                    master=master, **fields)


def test_delete_all_releases_last_first_and_every_one_whatever_fails(node, tmp_path):
    never = str(tmp_path / "never")
    delegates = [delegate(node.stub("a"), "eth0", master=True),
                 delegate(node.stub("b", failDelUnless=never, error=ERROR), "net1"),
                 delegate(node.stub("c", failDelUnless=never, error=ERROR), "net2")]
    failures = runner(node).delete_all(delegates)
    assert node.calls() == [("DEL", "c", "net2"), ("DEL", "b", "net1"), ("DEL", "a", "eth0")]
    assert [(d.name, exc.msg) for d, exc in failures] == [("c", "its daemon is down"),
                                                           ("b", "its daemon is down")]


def test_a_dependent_is_released_before_what_it_depends_on_in_parallel_mode(node):
    delegates = [delegate(node.stub("a"), "eth0", master=True),
                 delegate(node.stub("vlan", master="net2", linkInContainer=True), "net1"),
                 delegate(node.stub("base"), "net2")]
    assert runner(node, parallel_delegates=True).delete_all(delegates) == []
    calls = [name for _, name, _ in node.calls()]
    assert calls.index("vlan") < calls.index("base")


def test_a_device_info_file_is_copied_before_add_and_removed_after_del(node, tmp_path):
    dp = tmp_path / "devinfo" / "dp"
    dp.mkdir(parents=True)
    (dp / "vendor.com-sriov-0000:af:06.1-device.json").write_text(
        '{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:af:06.1"}}')
    sriov = delegate(node.stub("sriov"), "net1", resource_name="vendor.com/sriov",
                     device_id="0000:af:06.1",
                     selection=NetworkSelection(name="sriov", namespace="ns"))
    run = runner(node)
    run.add(sriov)
    written = tmp_path / "devinfo" / "cni" / "sriov-c1_net1"  # <deviceInfoDir>/cni
    assert json.loads(written.read_text())["pci"]["pci-address"] == "0000:af:06.1"
    run.delete(sriov)
    assert node.calls() == [("ADD", "sriov", "net1"), ("DEL", "sriov", "net1")]
    assert not os.path.exists(written)


def test_a_request_no_plugin_declares_is_a_warning_never_a_refusal(node, caplog):
    mac = delegate(node.stub("mv"), "net1", mac_request="c2:11:22:33:44:55",
                   selection=NetworkSelection(name="mv", namespace="ns",
                                              mac="c2:11:22:33:44:55"))
    with caplog.at_level(logging.WARNING, logger="test"):
        runner(node).add(mac)
    assert node.calls() == [("ADD", "mv", "net1")]
    assert any("network 'ns/mv': the pod requests 'mac' but no plugin" in r.getMessage()
               for r in caplog.records)
    assert "MAC=c2:11:22:33:44:55" in node.call_env(0)["CNI_ARGS"]  # the legacy CNI_ARGS


def test_undoing_a_failed_add_gets_time_even_past_the_adds_deadline(node):
    late = runner(node)
    expired = DelegateRunner(late.engine, late.req, time.monotonic() - 1, LOG)
    assert expired.for_cleanup().deadline >= time.monotonic() + CLEANUP_TIME - 1
    assert late.for_cleanup().deadline >= late.deadline


def test_failures_become_cni_errors_and_ours_keep_their_code(node, caplog):
    req = node.request("ADD", netns="/x")
    failed = delegate_error(req, delegate(node.stub("n1"), "net1"), MultusError("boom", code=7))
    assert failed.msg == '[ns/web/u1:n1]: error adding container to network "n1": boom'
    assert failed.code == 7
    with caplog.at_level(logging.ERROR, logger="test"):
        unexpected = as_cni_error(KeyError("x"), LOG)
    assert unexpected.code == 100 and "internal error: KeyError" in unexpected.msg
    assert any(r.exc_info for r in caplog.records)  # the traceback goes to the journal


def test_no_event_for_an_empty_result_or_without_a_pod():
    sent = []

    class Kube:  # the Kubernetes seam: what the client would send as an Event
        def emit_event(self, pod, kind, reason, message):
            sent.append((pod, kind, reason, message))

    d = Delegate(name="ns/n1", conf=b"{}", ifname="net1", master=False)
    emit_added(Kube(), None, d, {"ips": [{"address": "10.1.1.2/24"}]})
    emit_added(Kube(), "pod", d, {"cniVersion": "1.0.0"})
    emit_added(Kube(), "pod", d, {"ips": [{"address": "10.1.1.2/24"}]})
    assert sent == [("pod", "Normal", "AddedInterface", "Add net1 [10.1.1.2/24] from ns/n1")]
