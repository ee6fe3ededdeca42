"""Result conversion (multusd.convert, through multusd.cni.result): golden files, every pair."""

from __future__ import annotations

import copy
import json
import os

import pytest

from multusd import SUPPORTED_VERSIONS, ResultError, convert
from multusd.cni.result import convert_result, ip_addresses, is_empty
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
