"""multusd.core.netchanges: a running pod's selections against its sandbox's records, planned."""

from __future__ import annotations

import pytest

from multusd.core.delegate import Delegate
from multusd.core.hotplugrecord import ADDED, ADDING, HotplugMark
from multusd.core.netchanges import Recorded, plan, selection_name
from multusd.core.selection import parse_selections

CONF = b'{"cniVersion":"0.4.0","name":"x","type":"bridge"}'
HOT = HotplugMark(state=ADDED, since=1.0)


def rec(name: str, ifname: str, *, master: bool = False, mark=None, cached: bool = True,
        requested: str = "") -> Recorded:
    return Recorded(delegate=Delegate(name=name, conf=CONF, ifname=ifname, master=master,
                                      ifname_request=requested), mark=mark, cached=cached)


CLUSTER = rec("cluster-net", "eth0", master=True)


def wanted(value: str):
    return parse_selections(value, "default")


def names(items) -> list:
    return [f"{r.delegate.name}@{r.delegate.ifname}" for r in items]


def added(changes) -> list:
    return [f"{selection_name(s)}@{s.interface}" for s in changes.add]


def test_nothing_changes_when_the_selections_match_the_records():
    records = [CLUSTER, rec("default/a", "net1", requested="net1")]
    changes = plan(wanted("a@net1"), records)
    assert not changes.changes and not changes.refused


def test_a_new_named_selection_is_added_and_a_dropped_one_removed():
    records = [CLUSTER, rec("default/a", "net1", requested="net1")]
    changes = plan(wanted("b@net2"), records)
    assert added(changes) == ["default/b@net2"]
    assert names(changes.remove) == ["default/a@net1"]


def test_removals_come_last_first_and_the_same_interface_may_move_to_another_network():
    records = [CLUSTER, rec("default/a", "net1"), rec("default/b", "net2")]
    changes = plan(wanted("c@net1"), records)
    assert names(changes.remove) == ["default/b@net2", "default/a@net1"]
    assert added(changes) == ["default/c@net1"] and not changes.refused


def test_a_selection_without_interface_keeps_the_attachment_the_sandboxs_add_named():
    records = [CLUSTER, rec("default/a", "net1"), rec("default/a", "net2")]
    changes = plan(wanted("a,b@fast0,a"), records)
    assert added(changes) == ["default/b@fast0"]
    assert not changes.remove and not changes.refused


def test_a_new_selection_without_interface_is_refused_and_says_how_to_name_it():
    records = [CLUSTER, rec("default/a", "net1")]
    changes = plan(wanted("a,b"), records)
    assert not changes.changes
    (refusal,) = changes.refused
    assert selection_name(refusal.selection) == "default/b"
    assert "names no interface" in refusal.why and '"interface"' in refusal.why


def test_an_unnamed_selection_never_takes_an_interface_added_while_the_pod_ran():
    records = [CLUSTER, rec("default/a", "hot0", mark=HOT)]
    changes = plan(wanted("a"), records)
    assert names(changes.remove) == ["default/a@hot0"]
    assert len(changes.refused) == 1


@pytest.mark.parametrize("selection,owner", [
    ("b@eth0", "network cluster-net"),
    ("b@net1", "network default/a"),
    ("b@net5,c@net5", "asked for network default/b"),
])
def test_an_interface_name_already_taken_is_refused(selection, owner):
    records = [CLUSTER, rec("default/a", "net1")]
    changes = plan(wanted(f"a,{selection}"), records)
    assert len(changes.refused) == 1
    assert owner in changes.refused[0].why and "choose another interface name" in \
        changes.refused[0].why


def test_the_cluster_network_default_networks_and_other_delegates_are_never_removed():
    records = [CLUSTER, rec("kube-system/extra", "net1"), rec("aux-chain", "net2"),
               rec("default/a", "net3")]
    changes = plan([], records, protected=("kube-system/extra",))
    assert names(changes.remove) == ["default/a@net3"]


def test_a_protected_network_added_while_the_pod_ran_can_be_removed():
    records = [CLUSTER, rec("kube-system/extra", "hot0", mark=HOT)]
    changes = plan([], records, protected=("kube-system/extra",))
    assert names(changes.remove) == ["kube-system/extra@hot0"]


def test_an_unfinished_add_is_undone_and_added_again_and_a_finished_one_kept():
    records = [CLUSTER, rec("default/a", "net1", mark=HotplugMark(state=ADDING, since=1.0),
                            cached=False),
               rec("default/b", "net2", mark=HotplugMark(state=ADDING, since=1.0))]
    changes = plan(wanted("a@net1,b@net2"), records)
    assert names(changes.undo) == ["default/a@net1"]
    assert names(changes.finished) == ["default/b@net2"]
    assert added(changes) == ["default/a@net1"]
    assert not changes.remove


def test_an_unfinished_add_no_longer_wanted_is_only_undone():
    records = [CLUSTER, rec("default/a", "net1", mark=HotplugMark(state=ADDING, since=1.0),
                            cached=False)]
    changes = plan([], records)
    assert names(changes.undo) == ["default/a@net1"]
    assert not changes.add and not changes.remove


def test_other_attributes_of_a_kept_selection_change_nothing():
    records = [CLUSTER, rec("default/a", "net1")]
    changes = plan(wanted('[{"name":"a","interface":"net1","ips":["10.1.1.1/24"]}]'), records)
    assert not changes.changes


@pytest.mark.parametrize("named_by, protected, removed", [
    ("k8s.v1.cni.cncf.io/networks", (), True),       # the annotation named it
    ("defaultNetworks", (), False),                  # recorded: never the annotation's
    ("clusterNetwork", (), False),
    ("delegates", (), False),
    ("auxiliaryCNIChainName", (), False),
    ("", ("kube-system/storage",), False),           # a record that does not say: as now
    ("", (), True),
])
def test_only_what_the_annotation_named_is_removed(named_by, protected, removed):
    records = [CLUSTER, Recorded(delegate=Delegate(name="kube-system/storage", conf=CONF,
                                                   ifname="net1", master=False,
                                                   named_by=named_by))]
    changes = plan(wanted(""), records, protected=protected)
    assert names(changes.remove) == (["kube-system/storage@net1"] if removed else [])


def test_a_selection_the_add_would_refuse_is_refused_with_its_message():
    changes = plan(wanted("other/b@net2,c@net3"), [CLUSTER],
                   refuse=lambda s: "isolated" if s.namespace == "other" else "")
    assert added(changes) == ["default/c@net3"]
    assert [(selection_name(r.selection), r.why) for r in changes.refused] == [
        ("other/b", "isolated")]
