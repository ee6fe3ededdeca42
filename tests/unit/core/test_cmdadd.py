"""multusd.core.cmdadd: ADD of a sandbox, through the daemon's Multus, on stub delegates in a
real namespace: what runs, in which order, what is recorded, and what a failure leaves."""

from __future__ import annotations

import os

import pytest

from multusd import CURRENT_VERSION
from multusd.errors import ConfigError, InvalidEnvironment, MultusError

from stubnode import StubNode

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


def result(ifname: str, address: str) -> dict:
    return {"interfaces": [{"name": ifname, "sandbox": "/x"}],
            "ips": [{"address": address, "interface": 0}]}


@pytest.fixture
def node(tmp_path):
    return StubNode(tmp_path)


def test_every_delegate_in_order_and_the_masters_result_at_the_current_version(node, netns):
    node.configure([node.stub("cluster", result=result("eth0", "10.1.0.2/24")),
                    node.stub("extra", cniVersion="0.4.0",
                              result=result("net1", "10.2.0.2/24"))])
    answer = node.run("ADD", "c1", netns)
    assert node.calls() == [("ADD", "cluster", "eth0"), ("ADD", "extra", "net1")]
    assert answer["cniVersion"] == CURRENT_VERSION
    assert [ip["address"] for ip in answer["ips"]] == ["10.1.0.2/24"]
    assert node.records() == ["c1", "results/cluster-c1-eth0", "results/extra-c1-net1"]


def test_a_failed_delegate_rolls_back_what_started_in_reverse_and_its_records(node, netns):
    node.configure([node.stub("cluster"), node.stub("extra"),
                    node.stub("broken", failOn="ADD", error=ERROR), node.stub("never")])
    with pytest.raises(MultusError) as err:
        node.run("ADD", "c1", netns)
    assert err.value.code == 11
    assert err.value.msg.startswith('[ns/web/u1:broken]: error adding container to network '
                                    '"broken": its daemon is down')
    assert node.calls() == [("ADD", "cluster", "eth0"), ("ADD", "extra", "net1"),
                            ("ADD", "broken", "net2"), ("DEL", "broken", "net2"),
                            ("DEL", "extra", "net1"), ("DEL", "cluster", "eth0")]
    assert node.records() == []


def test_a_rollback_that_cannot_release_keeps_the_scratch_cache_for_the_runtimes_del(
        node, netns, tmp_path):
    never = str(tmp_path / "never-there")
    node.configure([node.stub("cluster", failDelUnless=never, error=ERROR),
                    node.stub("broken", failOn="ADD", error=ERROR)])
    with pytest.raises(MultusError):
        node.run("ADD", "c1", netns)
    assert node.records()[0] == "c1"  # DEL finds what the rollback could not release


def test_a_repeated_add_is_refused_before_anything_runs(node, netns):
    node.configure([node.stub("cluster")])
    node.run("ADD", "c1", netns)
    with pytest.raises(MultusError) as err:
        node.run("ADD", "c1", netns)
    assert "container c1 already has network attachments recorded" in err.value.msg
    assert node.calls() == [("ADD", "cluster", "eth0")]
    os.remove(os.path.join(node.cni_dir, "c1"))  # the result cache alone counts too
    with pytest.raises(MultusError, match="already has network attachments"):
        node.run("ADD", "c1", netns)


def test_an_interface_name_taken_in_the_namespace_runs_nothing(node, netns):
    node.configure([node.stub("cluster"), node.stub("extra")])
    with pytest.raises(InvalidEnvironment) as err:
        node.run("ADD", "c1", netns, ifname="lo")
    assert 'cannot set "stub-record" interface name to "lo": validateIfName: interface ' \
           "name lo already exists" in err.value.msg
    assert node.calls() == [] and node.records() == []


def test_settings_are_read_once_and_a_bad_one_names_the_pod_before_anything_runs(
        node, netns):
    node.configure([node.stub("cluster")], systemNamespaces=["kube-system", 3])
    with pytest.raises(ConfigError) as err:
        node.run("ADD", "c1", netns)
    assert err.value.msg.startswith("[ns/web/u1]: invalid configuration of the multus network "
                                    "config: systemNamespaces: must be a list of strings")
    assert node.calls() == [] and node.records() == []


def test_a_container_that_is_not_a_pod_gets_the_daemons_networks(node, netns):
    node.configure([node.stub("cluster"), node.stub("extra")])
    node.run("ADD", "ctr1", netns, args="K8S_POD_NAME=podman-ctr")
    assert node.calls() == [("ADD", "cluster", "eth0"), ("ADD", "extra", "net1")]
    assert "K8S_POD_NAME=podman-ctr" in node.call_env(0)["CNI_ARGS"]
