"""multusd.tools.show: which sandbox a query names, and how its records are held against the
pod's network-status in the API.

Records written by the daemon's own ADD (tests/toolnode.py: stub delegates answering with an
address and a MAC, in real namespaces); the pod and its annotation in the stand-in API server
(tests/kubeapi.py). The full node with real plugins is tests/integration/test_tools.py's.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from multusd.core import records
from multusd.tools import common, show
from toolnode import ToolNode

pytestmark = pytest.mark.privileged

STATUS = "k8s.v1.cni.cncf.io/network-status"
NS, UID = "ns", "u1"


def result(ifname: str, address: str, mac: str) -> dict:
    return {"interfaces": [{"name": ifname, "mac": mac, "sandbox": "/x"}],
            "ips": [{"address": address, "interface": 0}]}


def delegates(node: ToolNode) -> list:
    return [node.stub("cluster", result=result("eth0", "10.1.0.5/24", "0a:00:00:00:00:05")),
            node.stub("extra", result=result("net1", "10.2.0.5/24", "0A:00:00:00:01:05"))]


@pytest.fixture
def make_node(tmp_path, make_netns):
    def make(**daemon: Any) -> ToolNode:
        return ToolNode(tmp_path, make_netns, delegates, **daemon)
    return make


def sandboxes(node: ToolNode) -> list:
    return records.read_sandboxes(node.cni_dir)


def args(namespace: str = NS, name: str = "web", uid: str = UID) -> str:
    return f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID={uid}"


# ---- which sandbox a query names --------------------------------------------------------------

@pytest.fixture
def three(make_node) -> ToolNode:
    node = make_node()
    node.attach("aaaa1111", args(name="web"))
    node.attach("aaaa2222", args(name="db"))
    node.attach("bbbb3333", args(namespace="other", name="web"))
    return node


@pytest.mark.parametrize("query,found", [
    ("aaaa1111", ["aaaa1111"]), ("ns/web", ["aaaa1111"]), ("other/web", ["bbbb3333"]),
    ("db", ["aaaa2222"]), ("bbbb", ["bbbb3333"]), ("aaaa2", ["aaaa2222"])])
def test_a_query_is_an_id_a_pod_a_unique_pod_name_or_a_unique_prefix(three, query, found):
    assert [r.container_id for r in show.match(sandboxes(three), query)] == found


@pytest.mark.parametrize("query,code,words", [
    ("web", common.EXIT_USAGE, "names pods in several namespaces: ns/web, other/web; give "
                               "NAMESPACE/NAME"),
    ("aaaa", common.EXIT_USAGE, "container ID prefix 'aaaa' is ambiguous: aaaa1111, aaaa2222"),
    ("aaa", common.EXIT_NOT_FOUND, "no sandbox on this node matches 'aaa'"),  # too short
    ("ns/nobody", common.EXIT_NOT_FOUND, "`multusd status` lists them"),
])
def test_an_ambiguous_or_unknown_query_says_what_to_give(three, query, code, words):
    with pytest.raises(common.ToolError) as caught:
        show.match(sandboxes(three), query)
    assert caught.value.code == code and words in str(caught.value)


def test_show_exits_as_the_match_says(three, capsys):
    assert show.run(three.config_path, "nobody", use_api=False) == common.EXIT_NOT_FOUND
    assert "multusd show: no sandbox on this node matches 'nobody'" in capsys.readouterr().err
    assert show.run(three.config_path, "db", as_json=True, use_api=False) == common.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["containerId"] == "aaaa2222" and doc["api"] == {"state": "not asked"}
    assert [a["ips"] for a in doc["attachments"]] == [["10.1.0.5/24"], ["10.2.0.5/24"]]


# ---- the records beside the API ---------------------------------------------------------------

def status_entries(*overrides: Optional[dict]) -> list:
    """network-status as the daemon writes it for the two delegates (an override None drops
    that entry)."""
    entries = [{"name": "cluster", "interface": "eth0", "ips": ["10.1.0.5"],
                "mac": "0a:00:00:00:00:05", "default": True, "dns": {}},
               {"name": "extra", "interface": "net1", "ips": ["10.2.0.5"],
                "mac": "0a:00:00:00:01:05", "dns": {}}]
    for index, override in enumerate(overrides):
        if override is None:
            entries[index] = None
        else:
            entries[index] = dict(entries[index], **override)
    return [e for e in entries if e is not None]


@pytest.fixture
def attached(make_node, kube_api):
    """A node with a kubeconfig for the stand-in, and ns/web attached; returns (node, record)."""
    node = make_node(kubeconfig=kube_api.kubeconfig_path)
    node.attach("c0ffee11")
    return node, sandboxes(node)[0]


def compare(node: ToolNode, record: Any) -> dict:
    return show.compare_with_api(node.config, record)


def test_a_network_status_that_matches_the_records_agrees(attached, kube_api):
    node, record = attached
    kube_api.add_pod(NS, "web", uid=UID, annotations={STATUS: json.dumps(status_entries())})
    doc = compare(node, record)
    assert doc == {"state": "agree", "uid": UID, "networkStatus": status_entries(),
                   "differences": []}


@pytest.mark.parametrize("overrides,difference", [
    (({"ips": ["10.1.0.99"]},),
     "cluster (eth0): network-status has IPs ['10.1.0.99'], the node ['10.1.0.5']"),
    ((None, {"mac": "0A:00:00:00:01:99"}),
     "extra (net1): network-status has MAC 0a:00:00:00:01:99, the node 0A:00:00:00:01:05"),
    (({}, None), "extra (net1): recorded on the node but not in network-status"),
    (({"interface": "eth9"},), "cluster (eth9): in network-status but not in the node's records"),
], ids=["ips", "mac", "missing-in-api", "missing-on-node"])
def test_each_difference_is_named(attached, kube_api, overrides, difference):
    node, record = attached
    kube_api.add_pod(NS, "web", uid=UID,
                     annotations={STATUS: json.dumps(status_entries(*overrides))})
    doc = compare(node, record)
    assert doc["state"] == "disagree" and difference in doc["differences"]


def test_mac_case_and_a_missing_mac_are_no_difference(attached, kube_api):
    node, record = attached  # the node recorded net1's MAC in capitals
    entries = status_entries({"mac": "0A:00:00:00:00:05"}, {"mac": "0a:00:00:00:01:05"})
    kube_api.add_pod(NS, "web", uid=UID, annotations={STATUS: json.dumps(entries)})
    assert compare(node, record)["state"] == "agree"
    kube_api.update_pod(NS, "web", annotations={STATUS: json.dumps(status_entries(
        {"mac": ""}))})
    assert compare(node, record)["state"] == "agree"


def test_a_recreated_pod_disagrees_but_a_static_ones_mirror_does_not(attached, kube_api):
    node, record = attached
    kube_api.add_pod(NS, "web", uid="u2", annotations={STATUS: json.dumps(status_entries())})
    doc = compare(node, record)
    assert doc["state"] == "disagree"
    assert doc["differences"] == ["the API's pod ns/web has UID u2, the records u1: the pod "
                                  "was re-created"]
    kube_api.delete_pod(NS, "web")
    kube_api.add_pod(NS, "web", uid="mirror", static=True,
                     annotations={STATUS: json.dumps(status_entries())})
    assert compare(node, record)["state"] == "agree"


def test_an_annotation_that_is_not_json_disagrees(attached, kube_api):
    node, record = attached
    kube_api.add_pod(NS, "web", uid=UID, annotations={STATUS: "[{"})
    doc = compare(node, record)
    assert doc["state"] == "disagree" and doc["networkStatus"] is None
    assert doc["differences"] == [f"the {STATUS} annotation is not valid JSON"]


def test_no_annotation_names_every_attachment_missing(attached, kube_api):
    node, record = attached
    kube_api.add_pod(NS, "web", uid=UID)
    assert compare(node, record)["differences"] == [
        "cluster (eth0): recorded on the node but not in network-status",
        "extra (net1): recorded on the node but not in network-status"]


def test_a_pod_the_api_does_not_have_is_no_pod(attached):
    node, record = attached
    doc = compare(node, record)
    assert doc["state"] == "no-pod" and "the sandbox outlived it" in doc["reason"]


def test_without_an_answer_the_api_is_unavailable(attached, kube_api):
    node, record = attached
    kube_api.deny("get", "pods")
    doc = compare(node, record)
    assert doc["state"] == "unavailable" and "403" in doc["reason"]


def test_without_a_kubeconfig_or_a_pod_name_nothing_is_asked(make_node, kube_api):
    node = make_node()
    node.attach("c1")
    node.attach("c2", "IgnoreUnknown=1")
    first, second = sandboxes(node)
    assert compare(node, first) == {"state": "unavailable",
                                    "reason": "no kubeconfig in daemon-config.json"}
    asking = make_node(kubeconfig=kube_api.kubeconfig_path)
    assert compare(asking, second) == {"state": "unavailable",
                                       "reason": "the records name no pod"}
    assert kube_api.requests == []


def test_show_exits_1_when_the_api_disagrees_and_says_how(attached, kube_api, capsys):
    node, _ = attached
    kube_api.add_pod(NS, "web", uid=UID,
                     annotations={STATUS: json.dumps(status_entries({"ips": []}))})
    assert show.run(node.config_path, "ns/web") == common.EXIT_PROBLEM
    text = capsys.readouterr().out
    assert "API:        network-status DISAGREES with the node's records:\n  - cluster (eth0): " \
        "network-status has IPs [], the node ['10.1.0.5']" in text
    assert "eth0: network cluster (default)" in text
    assert "  mac 0a:00:00:00:00:05  ips 10.1.0.5/24" in text


def test_attachments_added_and_removed_while_the_pod_ran_are_marked(make_node, capsys):
    from multusd import store
    from multusd.core.hotplugrecord import ADDED, HotplugMark, Removal, ScratchEntries

    node = make_node()
    node.attach("c0ffee11")
    plain = common.record_json(sandboxes(node)[0])
    assert "removed" not in plain and all("hotplug" not in a for a in plain["attachments"])
    path = sandboxes(node)[0].scratch_file
    with open(path, "rb") as handle:
        entries = ScratchEntries.parse(handle.read())
    entries.set_mark(1, HotplugMark(state=ADDED, since=1700000000.0))
    entries.entries[0]["multusdRemoved"] = [
        Removal(network="ns/old", ifname="net7", at=1700000100.0).to_json()]
    store.atomic_write(path, entries.to_bytes())

    doc = common.record_json(sandboxes(node)[0])
    assert doc["attachments"][1]["hotplug"] == {"state": "added", "since": 1700000000.0}
    assert "hotplug" not in doc["attachments"][0]
    assert doc["removed"] == [{"name": "ns/old", "interface": "net7", "at": 1700000100.0}]
    show.run(node.config_path, "c0ffee11", use_api=False)
    text = capsys.readouterr().out
    assert "net1: network extra, ADDED while the pod ran, at 2023-11-14" in text
    assert "net7: network ns/old, REMOVED while the pod ran, at 2023-11-14" in text
