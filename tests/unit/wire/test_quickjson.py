"""quickjson writes exactly what json writes, without importing it (the shim's start-up)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testlib import REPO

from multusd.wire import quickjson

SAMPLES = [
    {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1"}],
     "dns": {}, "interfaces": [{"name": "eth0", "mac": "aa:bb", "mtu": 1500}]},
    [1, -2, 3.5, 1e300, True, False, None, "é \u2028 \"quoted\" \\ /"],
    "plain", 0, {"nested": {"deep": [[], {}]}},
]


@pytest.mark.parametrize("value", SAMPLES)
def test_writes_what_json_writes(value):
    assert quickjson.dumps(value) == json.dumps(value)


def test_unserializable_and_circular_values_raise():
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        quickjson.dumps({"a": {1}})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError):
        quickjson.dumps(loop)


def test_the_shim_path_imports_neither_json_nor_re_nor_socket():
    code = (f"import sys; sys.path.insert(0, {REPO!r}); "
            "import multusd.wire.shim; multusd.convert({'cniVersion': '1.1.0', "
            "'ips': [{'address': '10.0.0.2/24'}]}, '0.3.1'); "
            "multusd.go_loads(b'{\"a\": [1.5, \"\\\\ud800\", {}]}'); "
            "print(sorted(m for m in ('json', 're', 'socket', 'logging', 'typing', 'enum') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"

