"""multusd.cni.result: conversion (multusd.convert) on golden files, every pair; queries; a
result's default routes taken out and added, in both shapes (routes list, ip4/ip6)."""

from __future__ import annotations

import copy
import ipaddress
import json
import os

import pytest

from multusd import SUPPORTED_VERSIONS, ResultError, convert
from multusd.cni.result import (convert_result, ip_addresses, is_empty, with_default_routes,
                                without_default_routes)
from multusd.errors import DecodeFailure, IncompatibleCNIVersion

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "results")
PAIRS = [(f, t) for f in SUPPORTED_VERSIONS for t in SUPPORTED_VERSIONS]


def _load(name: str) -> dict:
    with open(os.path.join(DATA, name)) as handle:
        return json.load(handle)


@pytest.mark.parametrize("from_version, to_version", PAIRS,
                         ids=[f"{f}-to-{t}" for f, t in PAIRS])
def test_golden_conversion(from_version, to_version):
    source = _load(f"input-{from_version}.json")
    pristine = copy.deepcopy(source)
    converted = convert_result(source, to_version)
    assert converted == _load(f"{from_version}-to-{to_version}.json")
    assert source == pristine, "convert_result must not mutate its input"
    assert converted["cniVersion"] == to_version


@pytest.mark.parametrize("from_version, to_version", PAIRS,
                         ids=[f"{f}-to-{t}" for f, t in PAIRS])
def test_conversion_shape_rules(from_version, to_version):
    converted = convert_result(_load(f"input-{from_version}.json"), to_version)
    legacy = to_version.startswith("0.")
    assert all(("version" in ip) == legacy for ip in converted["ips"])
    assert [ip["address"] for ip in converted["ips"]] == [
        "10.1.0.5/24", "fd00:10::5/64", "192.168.7.9/32"]
    if legacy:
        assert [ip["version"] for ip in converted["ips"]] == ["4", "6", "4"]
    assert "notInTheSpec" not in converted
    assert converted["dns"]["nameservers"] == ["10.1.0.10"]


def test_new_interface_fields_only_survive_between_1x_versions():
    source = _load("input-1.1.0.json")
    assert convert_result(source, "1.0.0")["interfaces"][2]["pciID"] == "0000:3b:00.1"
    down = convert_result(source, "0.4.0")["interfaces"][2]
    assert down == {"name": "eth0", "mac": "02:00:00:00:00:03",
                    "sandbox": "/var/run/netns/pod1"}


def test_empty_dns_is_omitted_in_1x_and_an_object_in_0x():
    bare = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    assert "dns" not in convert_result(bare, "1.1.0")
    assert convert_result(bare, "0.3.1")["dns"] == {}
    assert "dns" not in convert_result(convert_result(bare, "0.3.1"), "1.0.0")


def test_ip_interface_index_zero_is_kept():
    result = {"cniVersion": "0.4.0",
              "ips": [{"version": "4", "interface": 0, "address": "10.0.0.2/24"}]}
    assert convert_result(result, "1.0.0")["ips"] == [{"interface": 0,
                                                       "address": "10.0.0.2/24"}]


def test_unsupported_versions_are_rejected():
    with pytest.raises(IncompatibleCNIVersion) as err:
        convert_result({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}, "1.0.0")
    assert "0.2.0" in err.value.msg
    with pytest.raises(IncompatibleCNIVersion):
        convert_result({"cniVersion": "1.0.0"}, "2.0.0")


def test_malformed_results_are_decode_failures():
    with pytest.raises(DecodeFailure):
        convert_result({"cniVersion": "1.0.0", "ips": "10.0.0.1"}, "0.4.0")
    with pytest.raises(DecodeFailure):
        convert_result({"cniVersion": "1.0.0", "ips": [{"address": "not-an-ip"}]}, "0.4.0")
    with pytest.raises(DecodeFailure):
        convert_result(["not", "a", "dict"], "1.0.0")


def test_is_empty_and_ip_addresses():
    assert is_empty(None) and is_empty({"cniVersion": "1.0.0", "dns": {}})
    assert not is_empty({"cniVersion": "1.0.0", "dns": {"domain": "x"}})
    full = _load("input-1.0.0.json")
    assert not is_empty(full)
    assert ip_addresses(full) == ["10.1.0.5/24", "fd00:10::5/64", "192.168.7.9/32"]


@pytest.mark.parametrize("bad, code, error", [
    ([], 6, DecodeFailure), ({"cniVersion": "9.9.9"}, 1, IncompatibleCNIVersion),
    ({"cniVersion": "1.0.0", "ips": [{"gateway": "10.0.0.1"}]}, 6, DecodeFailure),
    ({"cniVersion": "1.0.0", "routes": "x"}, 6, DecodeFailure),
])
def test_the_package_reports_what_the_engine_raises(bad, code, error):
    # multusd.convert imports nothing (the shim's happy path, and errors imports multusd):
    # it reports a ResultError with the code; the engine raises the error that code names.
    with pytest.raises(ResultError) as reported:
        convert(bad, "0.3.1")
    assert reported.value.code == code and not isinstance(reported.value, error)
    with pytest.raises(error) as raised:
        convert_result(bad, "0.3.1")
    assert raised.value.msg == reported.value.msg and raised.value.code == code


V4_DEFAULT = {"dst": "0.0.0.0/0", "gw": "10.10.0.1"}
V6_DEFAULT = {"dst": "::/0", "gw": "fd10::1"}
V6_DEFAULT_GO_SPELLING = {"dst": "::0/0", "gw": "fd10::1"}
OTHER_ROUTE = {"dst": "10.20.0.0/16", "gw": "10.10.0.1"}


# --- a cached result's default routes taken out or added ----------------------------------


def test_without_default_routes_drops_only_the_requested_family():
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.10.0.2/24"}],
              "routes": [V4_DEFAULT, OTHER_ROUTE, V6_DEFAULT, V6_DEFAULT_GO_SPELLING,
                         {"gw": "10.10.0.9"}]}
    only_v4 = without_default_routes(result, ipv4=True, ipv6=False)
    assert only_v4["routes"] == [OTHER_ROUTE, V6_DEFAULT, V6_DEFAULT_GO_SPELLING,
                                 {"gw": "10.10.0.9"}]
    only_v6 = without_default_routes(result, ipv4=False, ipv6=True)
    assert only_v6["routes"] == [V4_DEFAULT, OTHER_ROUTE, {"gw": "10.10.0.9"}]
    assert len(result["routes"]) == 5, "the input must not be modified"


def test_without_default_routes_removes_an_emptied_routes_list():
    result = {"cniVersion": "0.4.0", "ips": [], "routes": [V4_DEFAULT]}
    assert "routes" not in without_default_routes(result, True, True)


def test_legacy_results_use_ip4_and_ip6_sections():
    result = {"cniVersion": "0.2.0",
              "ip4": {"ip": "10.10.0.2/24", "routes": [V4_DEFAULT, OTHER_ROUTE]},
              "ip6": {"ip": "fd10::2/64", "routes": [V6_DEFAULT]}}
    dropped = without_default_routes(result, ipv4=True, ipv6=True)
    assert dropped["ip4"]["routes"] == [OTHER_ROUTE]
    assert "routes" not in dropped["ip6"]
    added = with_default_routes(dropped, ["10.1.1.254", "fd01::fe"])
    assert added["ip4"]["routes"] == [OTHER_ROUTE, {"dst": "0.0.0.0/0", "gw": "10.1.1.254"}]
    assert added["ip6"]["routes"] == [{"dst": "::/0", "gw": "fd01::fe"}]
    no_v6 = with_default_routes({"ip4": {"ip": "10.1.1.2/24"}}, ["fd01::fe"])
    assert no_v6 == {"ip4": {"ip": "10.1.1.2/24"}}, "no ip6 section: nothing to add to"


def test_with_default_routes_appends_one_route_per_gateway():
    result = {"cniVersion": "1.1.0", "ips": [{"address": "10.1.1.2/24"}]}
    added = with_default_routes(result, ["10.1.1.254", "FD01::00FE"])
    assert added["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.1.1.254"},
                               {"dst": "::/0", "gw": "fd01::fe"}]
    assert "routes" not in result


def test_malformed_cached_routes_are_a_decode_failure():
    with pytest.raises(DecodeFailure) as err:
        without_default_routes({"cniVersion": "1.0.0", "routes": {"dst": "0.0.0.0/0"}},
                               True, True, where="/x/results/n-c-eth0")
    assert "/x/results/n-c-eth0" in err.value.msg


def test_gateways_may_be_given_parsed():
    added = with_default_routes({"cniVersion": "1.0.0"}, [ipaddress.ip_address("FD01::FE")])
    assert added["routes"] == [{"dst": "::/0", "gw": "fd01::fe"}]


def test_a_result_of_an_unknown_shape_keeps_its_routes_in_the_list():
    result = {"cniVersion": "9.9.9", "routes": [V4_DEFAULT, OTHER_ROUTE]}
    assert without_default_routes(result, True, False)["routes"] == [OTHER_ROUTE]
    unversioned = {"ip4": {"ip": "10.1.1.2/24", "routes": [V4_DEFAULT]}}
    assert "routes" not in without_default_routes(unversioned, True, False)["ip4"]
