"""multusd.cni.version: parsing and capability helpers."""

from __future__ import annotations

import pytest

from multusd import SUPPORTED_VERSIONS
from multusd.cni import version
from multusd.errors import IncompatibleCNIVersion


@pytest.mark.parametrize("text, parsed", [("0.3.1", (0, 3, 1)), ("1.1.0", (1, 1, 0)),
                                          ("10.20.30", (10, 20, 30))])
def test_parse_version(text, parsed):
    assert version.parse_version(text) == parsed


@pytest.mark.parametrize("garbage", ["", "1.0", "1.0.0.0", "v1.0.0", "1.x.0", " 1.0.0", None])
def test_parse_version_rejects_garbage(garbage):
    with pytest.raises(IncompatibleCNIVersion) as err:
        version.parse_version(garbage)
    assert "MAJOR.MINOR.PATCH" in err.value.msg
    assert err.value.code == 1


def test_supported_versions_and_helpers():
    assert SUPPORTED_VERSIONS == ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
    assert not version.supports_check("0.3.1")
    assert version.supports_check("0.4.0") and version.supports_check("1.1.0")
    assert not version.supports_status_gc("1.0.0")
    assert version.supports_status_gc("1.1.0")
    assert version.is_legacy("0.4.0") and not version.is_legacy("1.0.0")


def test_require_supported_names_source_and_choices():
    with pytest.raises(IncompatibleCNIVersion) as err:
        version.require_supported("0.2.0", "/etc/cni/net.d/x.conf")
    assert "'0.2.0'" in err.value.msg and "/etc/cni/net.d/x.conf" in err.value.msg
    assert "1.1.0" in err.value.msg
