"""The shim's result conversion (wire/result.py) gives what the engine's does, for every pair."""

import copy
import json
import os

import pytest

from multusd.cni.result import convert_result
from multusd.errors import SUPPORTED_VERSIONS, DecodeFailure, IncompatibleCNIVersion
from multusd.wire.result import for_runtime
from testlib import REPO

DATA = os.path.join(REPO, "tests", "data", "results")
PAIRS = [(f, t) for f in SUPPORTED_VERSIONS for t in SUPPORTED_VERSIONS]


def golden_input(version: str) -> dict:
    with open(os.path.join(DATA, f"input-{version}.json")) as handle:
        return json.load(handle)


@pytest.mark.parametrize("from_version, to_version", PAIRS)
def test_the_shim_converts_exactly_as_the_engine(from_version, to_version):
    source = golden_input(from_version)
    before = copy.deepcopy(source)
    assert for_runtime(source, to_version) == convert_result(source, to_version)
    assert source == before  # the input is not modified


@pytest.mark.parametrize("bad, error", [
    ([], DecodeFailure), ({"cniVersion": "9.9.9"}, IncompatibleCNIVersion),
    ({"cniVersion": "1.0.0", "ips": [{"gateway": "10.0.0.1"}]}, DecodeFailure),
    ({"cniVersion": "1.0.0", "routes": "x"}, DecodeFailure),
])
def test_bad_results_fail_alike(bad, error):
    with pytest.raises(error):
        for_runtime(bad, "0.3.1")
    with pytest.raises(error):
        convert_result(bad, "0.3.1")
