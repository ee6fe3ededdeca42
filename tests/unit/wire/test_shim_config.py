"""The shim's own keys of its config, read as upstream's shim reads its ShimNetConf struct."""

from __future__ import annotations

import pytest

from multusd.errors import DecodeFailure
from multusd.wire import shim


@pytest.mark.parametrize("stdin, socket_dir, version", [
    (b'{"cniVersion": "1.0.0", "daemonSocketDir": "/run/x"}', "/run/x", "1.0.0"),
    (b'{"CNIVersion": "1.0.0", "DaemonSocketDir": "/run/x"}', "/run/x", "1.0.0"),
    (b'{"daemonSocketDir": "/run/x", "DAEMONSOCKETDIR": "/run/y"}', "/run/y", ""),
    (b'{"daemonSocketDir": "/run/x", "daemonSocketDir": null}', "/run/x", ""),
    (b'{"daemonSocketDir": null}', "/run/multus/", ""),
    (b'{"cniVersion": "1.0.0", "a": "\\ud800", "b": "\xff"}', "/run/multus/", "1.0.0"),
])
def test_the_shims_settings_are_read_as_upstreams_struct(stdin, socket_dir, version):
    conf = shim.parse_config(stdin)
    assert conf.socket_dir == socket_dir and conf.cni_version == version


@pytest.mark.parametrize("stdin, fragment", [
    (b'{"cniVersion": "1.0.0", "mtu": NaN}', "NaN is not JSON"),
    (b'{"cniVersion": 1e400}', "out of range"),
    (b'{"cniVersion": "1.0.0", "x": ' + b"[" * 10001 + b"]" * 10001 + b"}", "exceeded max depth"),
    (b'\xef\xbb\xbf{"cniVersion": "1.0.0"}', "byte order mark"),
    (b'{"logToStderr": "yes", "LogToStderr": true}', '"logToStderr" in the multus-shim config: '
                                                     'it must be a boolean'),
])
def test_what_upstreams_shim_refuses_is_a_decode_failure(stdin, fragment):
    with pytest.raises(DecodeFailure, match=fragment):
        shim.parse_config(stdin)


def test_version_and_the_daemons_answer_are_read_as_go_reads_them():
    assert shim.version_info(b'{"CNIVersion": "0.4.0"}')["cniVersion"] == "0.4.0"
    result = {"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]}
    assert shim.add_result(b'{"result": ' + str(result).replace("'", '"').encode() + b"}",
                           "1.1.0") == result
