"""multusd.cni.args: CNI_ARGS parsing and the delegate's CNI_ARGS (both upstream bugs fixed)."""

from __future__ import annotations

import pytest

from multusd.cni.args import build_delegate_args, format_cni_args, parse_cni_args
from multusd.errors import InvalidEnvironment


def test_parse_splits_on_first_equals_only():
    # Upstream bug 1 (seeds): ranging over strings.Split's result broke "K=V" items.
    assert parse_cni_args("K8S_POD_NAMESPACE=openshift-etcd;A=b=c") == [
        ("K8S_POD_NAMESPACE", "openshift-etcd"), ("A", "b=c")]


@pytest.mark.parametrize("value, pairs", [
    ("", []),
    ("A=1;", [("A", "1")]),
    (";;A=1;;B=;", [("A", "1"), ("B", "")]),
    ("IgnoreUnknown=1;K8S_POD_UID=", [("IgnoreUnknown", "1"), ("K8S_POD_UID", "")]),
])
def test_parse_edge_cases(value, pairs):
    assert parse_cni_args(value) == pairs


@pytest.mark.parametrize("bad", ["A=1;JUSTAKEY", "=value"])
def test_parse_rejects_item_without_key_value(bad):
    with pytest.raises(InvalidEnvironment) as err:
        parse_cni_args(bad)
    item = bad.split(";")[-1]
    assert repr(item) in err.value.msg
    assert "KEY=VALUE" in err.value.msg
    assert err.value.code == 4


def test_build_keeps_upstream_order_and_empty_values():
    pairs = build_delegate_args("ns1", "pod1", "infra123", "")
    assert format_cni_args(pairs) == (
        "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;"
        "K8S_POD_INFRA_CONTAINER_ID=infra123;K8S_POD_UID=")


def test_build_extra_fills_an_empty_value():
    # Upstream bug 2 (seeds): an empty pre-created key could not be filled.
    pairs = build_delegate_args("ns1", "pod1", "infra123", "", [("K8S_POD_UID", "uid-9")])
    assert ("K8S_POD_UID", "uid-9") in pairs
    assert len(pairs) == 5


def test_build_extra_appends_a_missing_key():
    # Upstream bug 2 (seeds): the inverted "isExists" test never appended new keys.
    pairs = build_delegate_args("ns1", "pod1", "infra123", "u", [("MAC", "c2:11:22:33:44:66"),
                                                                 ("IP", "10.1.1.5/24")])
    assert pairs[5:] == [("MAC", "c2:11:22:33:44:66"), ("IP", "10.1.1.5/24")]


def test_build_extra_never_overrides_a_set_value():
    pairs = build_delegate_args("ns1", "pod1", "infra123", "u",
                                [("K8S_POD_NAME", "evil"), ("IgnoreUnknown", "1")])
    assert dict(pairs)["K8S_POD_NAME"] == "pod1"
    assert dict(pairs)["IgnoreUnknown"] == "true"
    assert len(pairs) == 5


def test_format_round_trips_through_parse():
    pairs = [("A", "b=c"), ("EMPTY", ""), ("K", "v")]
    assert parse_cni_args(format_cni_args(pairs)) == pairs
