"""multusd.core.hotplug: POST /delegate, one interface added, checked or removed in a running
pod, through the daemon's Multus on a stub delegate (no Kubernetes client)."""

from __future__ import annotations

import json
import time

import pytest

from multusd import CURRENT_VERSION
from multusd.core import request
from multusd.core.hotplug import delegate_from_request
from multusd.errors import InvalidNetworkConfig, MultusError

from stubnode import LOG, POD_ARGS, StubNode


@pytest.fixture
def node(tmp_path):
    return StubNode(tmp_path).configure([])


def delegate_request(node: StubNode, command: str, conf: dict) -> request.CmdArgs:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/p",
           "CNI_IFNAME": "net5", "CNI_ARGS": POD_ARGS}
    return request.parse(env, json.dumps(conf).encode(), node.config)


def hotplug(node: StubNode, command: str, conf: dict, attributes=None):
    return node.multus.hotplug(delegate_request(node, command, conf), attributes or {},
                               time.monotonic() + 30, LOG)


def test_the_delegate_is_the_requests_own_config_with_its_attributes(node):
    conf = node.stub("dyn")
    req = delegate_request(node, "ADD", conf)
    delegate = delegate_from_request(req, {"ips": ["10.9.0.5/24"], "mac": "c2:11:22:33:44:55",
                                           "cni-args": {"foo": "bar"}})
    assert (delegate.name, delegate.ifname, delegate.master) == ("dyn", "net5", False)
    assert (delegate.ip_request, delegate.mac_request) == (("10.9.0.5/24",),
                                                           "c2:11:22:33:44:55")
    assert json.loads(delegate.conf)["args"] == {"cni": {"foo": "bar"}}
    assert (delegate.selection.namespace, delegate.selection.interface) == ("ns", "net5")


def test_add_check_and_del_run_the_one_delegate(node):
    conf = node.stub("dyn", result={"interfaces": [{"name": "net5", "sandbox": "/p"}]})
    answer = hotplug(node, "ADD", conf)
    assert answer["cniVersion"] == CURRENT_VERSION
    assert answer["interfaces"] == [{"name": "net5", "sandbox": "/p"}]
    assert hotplug(node, "CHECK", conf) is None
    assert hotplug(node, "DEL", conf) is None
    assert node.calls() == [("ADD", "dyn", "net5"), ("CHECK", "dyn", "net5"),
                            ("DEL", "dyn", "net5")]


def test_a_failed_add_removes_what_it_may_have_set_up(node):
    error = {"cniVersion": "1.0.0", "code": 11, "msg": "no"}
    with pytest.raises(MultusError, match="no"):
        hotplug(node, "ADD", node.stub("dyn", failOn="ADD", error=error))
    assert node.calls() == [("ADD", "dyn", "net5"), ("DEL", "dyn", "net5")]


def test_gc_is_not_a_hotplug_command(node):
    with pytest.raises(InvalidNetworkConfig, match="unknown cmd type: GC; /delegate takes "
                                                   "ADD, DEL, CHECK, STATUS"):
        node.multus.hotplug(request.parse({"CNI_COMMAND": "GC"},
                                          json.dumps(node.stub("dyn")).encode(), node.config),
                            {}, time.monotonic() + 30, LOG)
