"""The shim's version rules: each command's minimum and the ADD result's conversion, as the engine's."""

import json

import pytest

from multusd import COMMAND_MIN_VERSION, CURRENT_VERSION, SUPPORTED_VERSIONS
from multusd.cni import version
from multusd.cni.result import convert_result
from multusd.errors import DecodeFailure, IncompatibleCNIVersion
from multusd.wire import shim

ENGINE_ALLOWS = {"CHECK": version.supports_check, "STATUS": version.supports_status_gc,
                 "GC": version.supports_status_gc}


@pytest.mark.parametrize("command", sorted(COMMAND_MIN_VERSION))
@pytest.mark.parametrize("cni_version", SUPPORTED_VERSIONS)
def test_the_shim_refuses_a_command_exactly_where_the_engine_does(command, cni_version):
    if ENGINE_ALLOWS[command](cni_version):
        shim.check_command_allowed(command, cni_version)
    else:
        with pytest.raises(IncompatibleCNIVersion, match=f"does not allow {command}"):
            shim.check_command_allowed(command, cni_version)


def test_the_minimums_are_the_specs():
    assert COMMAND_MIN_VERSION == {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}
    shim.check_command_allowed("ADD", "0.3.0")  # ADD and DEL exist in every version
    shim.check_command_allowed("DEL", "0.3.0")


def test_the_daemons_answer_is_converted_to_the_configs_version():
    result = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mtu": 1500}],
              "ips": [{"address": "fd00::5/64", "interface": 0}]}
    body = json.dumps({"Result": result}).encode()
    assert shim.add_result(body, "0.3.1") == convert_result(result, "0.3.1")
    assert shim.add_result(body, "0.3.1")["ips"][0]["version"] == "6"
    assert shim.add_result(body, "1.1.0") == result  # the same version is passed on as is


@pytest.mark.parametrize("result, error", [
    ({"cniVersion": "1.1.0", "ips": [{"gateway": "10.0.0.1"}]}, DecodeFailure),
    ({"cniVersion": "2.0.0"}, IncompatibleCNIVersion)])
def test_a_result_the_shim_cannot_convert_is_the_engines_cni_error(result, error):
    body = json.dumps({"Result": result}).encode()
    with pytest.raises(error) as raised:
        shim.add_result(body, "0.3.1")
    with pytest.raises(error) as engine:
        convert_result(result, "0.3.1")
    assert raised.value.to_cni_error("0.3.1") == engine.value.to_cni_error("0.3.1")


def test_version_without_a_requested_version_answers_the_newest():
    assert shim.version_info(b"") == {"cniVersion": CURRENT_VERSION,
                                      "supportedVersions": list(SUPPORTED_VERSIONS)}
