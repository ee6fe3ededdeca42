"""multusd.core.reconcile: a running pod's sandbox brought in line with its network selections,
through the daemon's Multus on stub delegates in a real namespace, the stand-in API server for
NADs, network-status and events."""

from __future__ import annotations

import json
import os
import time

import pytest

from multusd.cni import resultcache
from multusd.core import reconcile, scratch
from multusd.core.hotplugrecord import ADDED, ADDING, read_marks
from multusd.errors import MultusError

from harness import watch_bound
from hotplugnode import NETWORKS, STATUS, Node, result
from stubnode import LOG
from testlib import run, wait_for

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


@pytest.fixture
def node(tmp_path, kube_api, netns):
    made = Node(tmp_path, kube_api, netns)
    yield made
    made.client.stop()


def test_an_added_selection_runs_its_add_is_recorded_and_network_status_is_written_once(node):
    node.nad("b", "hot0", "10.9.0.2/24")
    node.attach()
    before = node.api.count("PUT")

    outcome = node.reconcile(node.select("b@hot0"))

    assert (outcome.result, outcome.added) == (reconcile.CHANGED, ("hot0 (default/b)",))
    assert node.calls()[-1] == ("ADD", "b", "hot0")
    assert node.recorded() == [("cluster", "eth0"), ("default/b", "hot0")]
    marks, _ = read_marks(node.scratch())
    assert marks[0] is None and marks[1].state == ADDED
    assert node.status() == [("cluster", "eth0"), ("default/b", "hot0")]
    assert node.api.count("PUT") == before + 1
    # events go out asynchronously: the attach's own (eth0) may land after this one
    added = wait_for(lambda: [e for e in node.events("AddedInterface")
                              if "hot0" in e["message"]], node.events_bound(),
                     what="hot0's AddedInterface")
    assert [e["message"] for e in added] == ["Add hot0 [10.9.0.2/24] from default/b"]

    calls = len(node.calls())
    again = node.reconcile()  # a re-delivered event, a restart: nothing twice
    assert again.result == reconcile.UNCHANGED
    assert len(node.calls()) == calls and node.api.count("PUT") == before + 1

    node.delete()
    assert node.calls()[-2:] == [("DEL", "b", "hot0"), ("DEL", "cluster", "eth0")]
    assert not os.listdir(node.cni_dir) or os.listdir(node.cni_dir) == ["results"]
    assert not os.listdir(os.path.join(node.cni_dir, "results"))


def test_a_removed_selection_runs_its_del_and_the_later_unnamed_ones_keep_their_names(node):
    node.nad("a", "net1")
    node.nad("b", "net2")
    node.attach(networks="a,b")
    assert node.recorded() == [("cluster", "eth0"), ("default/a", "net1"), ("default/b", "net2")]

    outcome = node.reconcile(node.select("b"))

    assert (outcome.result, outcome.removed) == (reconcile.CHANGED, ("net1 (default/a)",))
    assert node.calls()[-1] == ("DEL", "a", "net1")
    assert node.recorded() == [("cluster", "eth0"), ("default/b", "net2")]  # not net1
    assert read_marks(node.scratch())[1][0].ifname == "net1"
    assert resultcache.read(node.cni_dir, "a", node.cid, "net1") is None
    wait_for(lambda: node.events("RemovedInterface"), node.events_bound(), what="RemovedInterface")
    assert node.status() == [("cluster", "eth0"), ("default/b", "net2")]
    assert node.reconcile().result == reconcile.UNCHANGED

    node.delete()
    assert node.calls()[-2:] == [("DEL", "b", "net2"), ("DEL", "cluster", "eth0")]


def test_a_failed_add_is_rolled_back_and_its_entry_dropped(node):
    node.nad("b", "hot0", failOn="ADD", error=ERROR)
    node.attach()
    status = node.status()

    outcome = node.reconcile(node.select("b@hot0"))

    assert outcome.result == reconcile.FAILED and outcome.retry
    assert node.calls()[-2:] == [("ADD", "b", "hot0"), ("DEL", "b", "hot0")]
    assert node.recorded() == [("cluster", "eth0")]
    assert read_marks(node.scratch()) == ([None], ())
    assert node.status() == status
    wait_for(lambda: node.events("FailedAddingInterface"), node.events_bound(),
             what="the Warning event")
    message = node.events("FailedAddingInterface")[0]["message"]
    assert "hot0 (default/b): its ADD failed and was rolled back: its daemon is down" in message


def test_a_rollback_that_fails_keeps_the_entry_for_the_runtimes_del(node, tmp_path):
    fixed = str(tmp_path / "fixed")
    node.nad("b", "hot0", failOn="ADD", error=ERROR, failDelUnless=fixed)
    node.attach()

    assert node.reconcile(node.select("b@hot0")).result == reconcile.FAILED

    assert node.recorded() == [("cluster", "eth0"), ("default/b", "hot0")]
    assert read_marks(node.scratch())[0][1].state == ADDING
    open(fixed, "w").close()
    node.delete()
    assert node.calls()[-2:] == [("DEL", "b", "hot0"), ("DEL", "cluster", "eth0")]
    assert not os.path.exists(scratch.cache_path(node.cni_dir, node.cid))


def test_an_unfinished_add_is_undone_before_it_is_added_again(node):
    node.nad("b", "hot0")
    node.attach()
    node.reconcile(node.select("b@hot0"))
    # as a restart in the middle of that ADD leaves it: marked adding, nothing cached
    entries = json.loads(node.scratch())
    entries[1]["multusdHotplug"]["state"] = ADDING
    with open(scratch.cache_path(node.cni_dir, node.cid), "w") as handle:
        json.dump(entries, handle)
    resultcache.delete(node.cni_dir, "b", node.cid, "hot0")

    outcome = node.reconcile()

    assert outcome.result == reconcile.CHANGED
    assert node.calls()[-2:] == [("DEL", "b", "hot0"), ("ADD", "b", "hot0")]
    assert read_marks(node.scratch())[0][1].state == ADDED


def test_an_interface_multusd_did_not_make_is_left_alone(node):
    node.nad("b", "hot0")
    node.attach()
    run("ip", "-n", os.path.basename(node.netns), "link", "add", "hot0", "type", "veth",
        "peer", "name", "hot0p")
    calls = len(node.calls())

    outcome = node.reconcile(node.select("b@hot0"))

    assert outcome.result == reconcile.FAILED
    assert "hot0 already exists in the pod and multusd did not make it" in outcome.problems[0]
    assert len(node.calls()) == calls
    assert node.recorded() == [("cluster", "eth0")]
    links = run("ip", "-n", os.path.basename(node.netns), "link", "show", "hot0").stdout
    assert "hot0" in links


def test_a_missing_nad_fails_with_no_network_found(node):
    node.attach()
    outcome = node.reconcile(node.select("ghost@hot0"))
    assert outcome.result == reconcile.FAILED
    wait_for(lambda: node.events("NoNetworkFound"), node.events_bound(), what="NoNetworkFound")
    assert node.recorded() == [("cluster", "eth0")]


def test_an_annotation_that_does_not_parse_changes_nothing(node):
    node.nad("a", "net1")
    node.attach(networks="a")
    calls = len(node.calls())
    outcome = node.reconcile(node.select("[{not json"))
    assert outcome.result == reconcile.REFUSED
    assert len(node.calls()) == calls
    assert node.recorded() == [("cluster", "eth0"), ("default/a", "net1")]
    wait_for(lambda: node.events("FailedAddingInterface"), node.events_bound(),
             what="the Warning event")
    (event,) = node.events("FailedAddingInterface")
    assert event["message"] == outcome.problems[0]  # the ADD's message, as the ADD says it
    add, name = refused_add(node, "[{not json")
    assert add.msg.endswith(": " + event["message"].replace("default/web", f"default/{name}"))


def test_a_released_sandbox_or_a_gone_namespace_is_left_alone(node):
    node.nad("b", "hot0")
    node.attach()
    pod = node.select("b@hot0")
    run("ip", "netns", "del", os.path.basename(node.netns))
    assert node.reconcile(pod).result == reconcile.GONE
    node.delete()
    assert node.reconcile(pod).result == reconcile.GONE
    assert ("ADD", "b", "hot0") not in node.calls()


def test_stopping_ends_the_work_between_two_steps_without_network_status(node):
    node.nad("b", "hot0")
    node.nad("c", "hot1")
    node.attach()
    asked = []

    outcome = node.reconcile(node.select("b@hot0,c@hot1"),
                             stopping=lambda: asked.append(1) or len(asked) > 1)

    assert outcome.result == reconcile.STOPPED
    assert node.recorded() == [("cluster", "eth0"), ("default/b", "hot0")]
    assert node.status() == [("cluster", "eth0")]


def test_a_pod_in_a_system_namespace_gets_no_network_status(tmp_path, kube_api, netns):
    node = Node(tmp_path, kube_api, netns)
    try:
        kube_api.add_nad("kube-system", "b", json.dumps(node.stub("b", result=result(
            "hot0", "10.9.0.2/24"))))
        node.attach(namespace="kube-system")
        kube_api.update_pod("kube-system", "web", annotations={NETWORKS: "b@hot0"})
        outcome = node.reconcile(node.pod(namespace="kube-system"))
        assert outcome.result == reconcile.CHANGED
        assert STATUS not in kube_api.pod("kube-system", "web")["metadata"]["annotations"]
    finally:
        node.client.stop()



def refused_add(node, networks: str, namespace: str = "default"):
    """The error an ADD of another pod with this network selection answers, and the pod's
    name."""
    import uuid

    from multusd.core import request
    from stubnode import RUNTIME_CONF

    name = f"other-{uuid.uuid4().hex[:6]}"
    meta = node.api.add_pod(namespace, name, annotations={NETWORKS: networks})["metadata"]
    wait_for(lambda: node.client.cached_pod(namespace, name), watch_bound(), what="the pod cached")
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": uuid.uuid4().hex, "CNI_NETNS": node.netns,
           "CNI_IFNAME": "eth0", "CNI_ARGS": f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME="
           f"{name};K8S_POD_UID={meta['uid']}"}
    with pytest.raises(MultusError) as refused:
        node.multus.cni(request.parse(env, json.dumps(RUNTIME_CONF).encode(), node.config),
                        time.monotonic() + 30, LOG)
    return refused.value, name
