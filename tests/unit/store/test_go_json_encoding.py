"""multusd.store.go_json: JSON written as Go's encoding/json (v1) Marshal writes it.

The expected texts are Go's: floatEncoder's ES6 formatting of a float64 (the shortest digits
that read back the same, fixed notation from 1e-6 up to 1e21), HTMLEscape's \u003c, sorted map
keys, MarshalIndent's layout; NaN and infinities are "unsupported values".
"""

from __future__ import annotations

import math
import random

import pytest

from multusd import go_loads
from multusd.store import _written_iteratively, go_float, go_json
from testlib import random_json

FLOATS = [
    # (float64, what Go's encoder writes)
    (100.0, "100"), (1.0, "1"), (-2.0, "-2"), (0.0, "0"), (-0.0, "-0"),
    (0.5, "0.5"), (0.1, "0.1"), (123.456, "123.456"),
    (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (1e-10, "1e-10"), (5e-324, "5e-324"),
    (0.000001, "0.000001"), (1.5e-5, "0.000015"), (0.0001, "0.0001"),
    (1e20, "100000000000000000000"), (1e21, "1e+21"), (1.5e300, "1.5e+300"),
    (1.2345678901234567e20, "123456789012345670000"),
    (9007199254740993.0, "9007199254740992"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
]


@pytest.mark.parametrize("value,text", FLOATS)
def test_a_float_is_written_as_go_writes_a_float64(value, text):
    assert go_float(value) == text
    assert go_json(value) == text
    assert go_json([value]) == f"[{text}]"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinities_are_never_written(value):
    with pytest.raises(ValueError):
        go_json({"x": value})


def test_numbers_read_and_written_again_come_out_as_go_writes_them():
    text = '{"vlan": 1e2, "mtu": 1.0, "tiny": 1e-7, "big": 12345678901234567890, "n": -0}'
    assert go_json(go_loads(text), sort_keys=True) == (
        '{"big":12345678901234567890,"mtu":1,"n":-0,"tiny":1e-7,"vlan":100}')


def test_go_json_escapes_as_go_and_indents_as_marshal_indent():
    value = {"b": "<a&b>\u2028", "a": [1, {"c": 2.0}], "é": []}
    assert go_json(value) == '{"b":"\\u003ca\\u0026b\\u003e\\u2028","a":[1,{"c":2}],"é":[]}'
    assert go_json(value, sort_keys=True, indent=2) == (
        '{\n  "a": [\n    1,\n    {\n      "c": 2\n    }\n  ],\n'
        '  "b": "\\u003ca\\u0026b\\u003e\\u2028",\n  "é": []\n}')


def test_go_json_writes_what_python_writes_but_for_floats():
    import json

    rng = random.Random(15)
    for _ in range(200):
        value = go_loads(random_json(rng, 4, floats=False))
        for indent in (None, 4):
            for sort_keys in (False, True):
                expected = json.dumps(value, ensure_ascii=False, sort_keys=sort_keys,
                                      indent=indent,
                                      separators=(",", ":") if indent is None else None)
                assert _written_iteratively(value, indent, sort_keys) == expected


def test_go_json_writes_any_depth_it_reads():
    deep = go_loads("[" * 5000 + "1.0" + "]" * 5000)
    assert go_json(deep) == "[" * 5000 + "1" + "]" * 5000
