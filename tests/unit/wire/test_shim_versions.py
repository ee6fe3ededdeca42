"""The shim's version rules: each command's minimum and the ADD result's conversion, as the engine's."""

import json

import pytest

from multusd import COMMAND_MIN_VERSION, CURRENT_VERSION, SUPPORTED_VERSIONS, convert_result
from multusd.cni import version
from multusd.errors import IncompatibleCNIVersion
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


def test_version_without_a_requested_version_answers_the_newest():
    assert shim.version_info(b"") == {"cniVersion": CURRENT_VERSION,
                                      "supportedVersions": list(SUPPORTED_VERSIONS)}
