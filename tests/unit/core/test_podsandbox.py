"""multusd.core.podsandbox: a running pod's sandbox read once and judged by the configuration it
was attached under (its default networks, its namespace isolation), for the dynamic
reconciliation; through the daemon's Multus on stub delegates in a real namespace, the stand-in
API server for NADs, network-status and events."""

from __future__ import annotations

import json
import logging
import os

import pytest

from multusd.cni import resultcache
from multusd.core import delmarks, podsandbox, reconcile, sandboxconfig, scratch
from multusd.kube.objects import pod_from_object

from hotplugnode import STATUS, Node, result
from stubnode import LOG
from testlib import run, wait_for

pytestmark = pytest.mark.privileged

# clusterNetwork and defaultNetworks as NADs in multusNamespace (what named each is recorded)
DEFAULTS = {"clusterNetwork": "cluster", "defaultNetworks": ["storage"],
            "multusNamespace": "kube-system", "delegates": None}


@pytest.fixture
def node(tmp_path, kube_api, netns):
    made = Node(tmp_path, kube_api, netns)
    yield made
    made.client.stop()


def with_defaults(node: Node, **daemon) -> Node:
    node.nad("cluster", "eth0", "10.0.0.2/24", namespace="kube-system")
    node.nad("storage", "net1", "10.7.0.2/24", namespace="kube-system")
    node.configure(**dict(DEFAULTS, **daemon))
    return node


class Said(logging.LoggerAdapter):
    def __init__(self) -> None:
        super().__init__(logging.getLogger("test"), {})
        self.lines: list = []

    def log(self, level, msg, *args, **kwargs):
        self.lines.append(msg % args if args else msg)


def test_a_default_network_stays_whatever_the_annotation_and_the_config_say_now(node):
    with_defaults(node)
    node.nad("a", "net5")
    node.nad("b", "net6", "10.9.1.2/24")
    node.attach(networks="a@net5")
    assert node.recorded() == [("kube-system/cluster", "eth0"), ("kube-system/storage", "net1"),
                               ("default/a", "net5")]

    outcome = node.reconcile(node.select("a@net5,b@net6"))
    assert (outcome.result, outcome.added, outcome.removed) == (
        reconcile.CHANGED, ("net6 (default/b)",), ())

    # storage leaves defaultNetworks, the daemon restarts: what the ADD attached stays
    node.configure(**dict(DEFAULTS, defaultNetworks=[]))
    outcome = node.reconcile(node.select("b@net6"))
    assert outcome.removed == ("net5 (default/a)",)
    assert node.recorded() == [("kube-system/cluster", "eth0"), ("kube-system/storage", "net1"),
                               ("default/b", "net6")]
    assert ("DEL", "storage", "net1") not in node.calls()
    node.delete()


def test_a_record_less_sandbox_is_judged_by_the_configuration_now_said_once(node):
    with_defaults(node)
    node.nad("a", "net5")
    node.attach(networks="a@net5")
    node.drop_record()
    said = Said()
    node.multus.notices = sandboxconfig.Notices()

    for _ in range(2):
        assert node.multus.needs_reconciling(node.select(""), node.cid, said)
    assert said.lines == [sandboxconfig.NO_RECORD % node.cid]  # once, not per look
    outcome = node.reconcile(node.pod())
    assert outcome.removed == ("net5 (default/a)",)  # storage: defaultNetworks now
    assert node.recorded() == [("kube-system/cluster", "eth0"), ("kube-system/storage", "net1")]

    node.configure(**dict(DEFAULTS, defaultNetworks=[]))  # ...and now it is not
    assert node.reconcile(node.pod()).removed == ("net1 (kube-system/storage)",)
    node.delete()


def test_namespace_isolation_refuses_a_new_selection_as_the_add_did(node):
    with_defaults(node, namespaceIsolation=True)
    node.nad("other", "net7", namespace="elsewhere")
    node.attach()
    node.configure(**DEFAULTS)  # isolation off now: the sandbox keeps what it was attached under

    outcome = node.reconcile(node.select("elsewhere/other@net7"))

    assert outcome.result == reconcile.REFUSED and not outcome.retry
    assert ("ADD", "other", "net7") not in node.calls()
    wait_for(lambda: node.events("FailedAddingInterface"), node.events_bound(),
             what="the Warning event")
    (event,) = node.events("FailedAddingInterface")
    assert event["type"] == "Warning" and event["message"] == outcome.problems[0]
    assert "namespace isolation enabled" in event["message"]
    node.configure(**dict(DEFAULTS, namespaceIsolation=True))
    from test_reconcile import refused_add  # the ADD of a pod asking the same

    refused, _ = refused_add(node, "elsewhere/other@net7")
    assert refused.msg.endswith(": " + event["message"])
    node.delete()


def test_a_configuration_that_cannot_be_established_changes_nothing_said_once(node):
    node.nad("a", "net5")
    node.attach(networks="a@net5")
    node.drop_record()
    node.configure(delegates=None)  # no clusterNetwork, no delegates: the settings do not load
    said = Said()
    calls = len(node.calls())

    for _ in range(2):
        with pytest.raises(podsandbox.Unestablished, match="do not load"):
            node.multus.needs_reconciling(node.select(""), node.cid, said)
        outcome = node.reconcile(node.pod())
        assert outcome.result == reconcile.FAILED and outcome.retry
    assert len(node.calls()) == calls
    assert node.recorded()[-1] == ("default/a", "net5")
    broken = json.loads(node.scratch())
    broken[0][sandboxconfig.CONFIG_KEY] = {"cniDir": 5}
    with open(scratch.cache_path(node.cni_dir, node.cid), "w") as handle:
        json.dump(broken, handle)
    with pytest.raises(podsandbox.Unestablished, match="does not parse"):
        node.multus.needs_reconciling(node.pod(), node.cid, said)


def test_needs_reconciling_only_when_something_is_to_be_done(node):
    node.nad("b", "hot0")
    node.attach()
    needs = node.multus.needs_reconciling
    assert not needs(node.pod(), node.cid, LOG)
    pod = node.select("b@hot0")
    assert needs(pod, node.cid, LOG)
    node.reconcile(pod)
    assert not needs(node.pod(), node.cid, LOG)
    # network-status behind the records (a write that did not happen): to be done again
    node.api.update_pod("default", "web", annotations={STATUS: "[]"})
    assert needs(node.pod(), node.cid, LOG)


def test_the_sandbox_of_a_pod_is_the_one_its_records_name(node):
    node.attach()
    entries = resultcache.list_entries(node.cni_dir)
    pod = node.pod()
    assert podsandbox.sandbox_of(pod, entries, node.cni_dir) == node.cid
    other = pod_from_object(dict(node.api.pod("default", "web"), metadata=dict(
        node.api.pod("default", "web")["metadata"], uid="another")))
    assert podsandbox.sandbox_of(other, entries, node.cni_dir) is None  # re-created pod
    renamed = pod_from_object(dict(node.api.pod("default", "web"), metadata=dict(
        node.api.pod("default", "web")["metadata"], name="api")))
    assert podsandbox.sandbox_of(renamed, entries, node.cni_dir) is None
    run("ip", "netns", "del", os.path.basename(node.netns))
    assert podsandbox.sandbox_of(pod, entries, node.cni_dir) is None  # its netns is gone


def test_a_sandbox_whose_failed_del_is_marked_in_the_spare_directory_is_none(node, tmp_path):
    node.attach()
    entries = resultcache.list_entries(node.cni_dir)
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))
    assert podsandbox.sandbox_of(node.pod(), entries, node.cni_dir, spare=spare) == node.cid
    os.makedirs(spare)
    with open(os.path.join(spare, node.cid), "w") as handle:  # <cniDir> could not take it
        json.dump({"containerId": node.cid, "firstFailure": 1.0}, handle)
    assert podsandbox.sandbox_of(node.pod(), entries, node.cni_dir, spare=spare) is None


def test_a_conflist_recorded_without_cni_version_is_read_at_the_nodes_as_del_reads_it(node):
    # a scratch cache whose conflist has no cniVersion (as upstream may record one) gets the
    # multus config's (F57); daemon-config.json spells the key as upstream's NetConf struct
    # also reads it. The runtime's DEL reads it so; the dynamic view read it with .get, found
    # none, and its removal's DEL ran a conflist without a version (refused: no release)
    import base64

    node.configure(CNIVersion="1.0.0")
    node.api.add_nad("default", "c", json.dumps({"cniVersion": "1.0.0", "name": "c", "plugins": [
        node.stub("c", result=result("net5", "10.5.0.2/24"))]}))
    node.attach(networks="c@net5")
    entries = json.loads(node.scratch())
    conflist = json.loads(base64.b64decode(entries[-1]["Bytes"]))
    del conflist["cniVersion"]
    entries[-1]["Bytes"] = base64.b64encode(json.dumps(conflist).encode()).decode()
    entries[-1]["ConfList"] = conflist
    with open(scratch.cache_path(node.cni_dir, node.cid), "w") as handle:
        json.dump(entries, handle)

    view = podsandbox.read_view(node.cid, node.multus.node.current(), LOG)

    assert json.loads(view.delegates[-1].conf)["cniVersion"] == "1.0.0"
    outcome = node.reconcile(node.select(""))
    assert (outcome.result, outcome.removed) == (reconcile.CHANGED, ("net5 (default/c)",))
    assert ("DEL", "c", "net5") in node.calls()
    node.delete()


def test_a_sandbox_is_judged_where_its_records_are_whatever_cni_dir_its_record_names(
        node, tmp_path):
    # its records moved with the cniDir (or its record names the directory another way): the
    # runtime's DEL reads them where they are (sandboxconfig.sandbox_request); so does a
    # dynamic change, and its attachments' results go beside the others (they went to the
    # directory the record names, where the runtime's DEL never looks)
    node.nad("b", "hot0")
    node.attach()
    entries = json.loads(node.scratch())
    elsewhere = str(tmp_path / "moved-from")
    entries[0][sandboxconfig.CONFIG_KEY]["cniDir"] = elsewhere
    with open(scratch.cache_path(node.cni_dir, node.cid), "w") as handle:
        json.dump(entries, handle)

    view = podsandbox.read_view(node.cid, node.multus.node.current(), LOG)
    assert view.effective.cni_dir == node.cni_dir and view.cached == (True,)
    outcome = node.reconcile(node.select("b@hot0"))

    assert (outcome.result, outcome.added) == (reconcile.CHANGED, ("hot0 (default/b)",))
    assert sorted(e["networkName"] for e in resultcache.list_entries(node.cni_dir)) == \
        ["b", "cluster"]
    assert not os.path.exists(elsewhere)
    node.delete()
    assert resultcache.list_entries(node.cni_dir) == []
