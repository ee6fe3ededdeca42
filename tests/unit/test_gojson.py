"""multusd.gojson: JSON read and written as Go's encoding/json (v1) does, per its documentation.

The expected values are Go's (``json.Unmarshal`` into ``interface{}`` / a struct, ``Marshal``),
from encoding/json's documented rules: strict JSON, U+FFFD for invalid UTF-8 (one per byte)
and unpaired surrogate escapes, float64 numbers, last duplicate key wins, case-insensitive
struct fields (Unicode simple folding: ſ is s, the Kelvin sign is k), null leaves a scalar
field as it was, 10000 levels at most, ES6 float formatting on the way out.
"""

from __future__ import annotations

import math
import random

import pytest

from multusd import (MAX_JSON_DEPTH, GoObject, ascii_json, go_field, go_fields, go_fold,
                     go_loads, gojson)
from multusd.errors import DecodeFailure, InvalidJSON, MultusError
from testlib import random_json

# --- reading -------------------------------------------------------------------------------

ACCEPTED = [
    # (JSON text, what Go's Unmarshal into interface{} holds)
    ('{"a": 1}', {"a": 1}),
    (' \t\r\n[true, false, null] \n', [True, False, None]),
    ('{"a": 1, "a": 2}', {"a": 2}),                        # a map: the last duplicate wins
    ('{"a": 1, "b": 2, "a": null}', {"a": None, "b": 2}),
    ("1e2", 100.0), ("1E2", 100.0), ("1.0", 1.0), ("-2.5e-3", -0.0025),
    ("1e-400", 0.0),                                         # underflow is no error in Go
    ("12345678901234567890", 12345678901234567890),         # kept exact (Go would round)
    ('"\\ud800"', "\ufffd"),                                 # unpaired high surrogate
    ('"\\udc00"', "\ufffd"),                                 # unpaired low surrogate
    ('"\\ud800\\u0041"', "\ufffdA"),
    ('"\\udc00\\ud800"', "\ufffd\ufffd"),
    ('"\\ud800\\ud800\\udc00"', "\ufffd\U00010000"),         # the second high one pairs
    ('"\\uD83D\\uDE00"', "\U0001F600"),                      # a pair, upper-case hex
    ('"\\\\ud800"', "\\ud800"),                              # an escaped backslash: no escape
    ('{"\\ud800": "\\udfff"}', {"\ufffd": "\ufffd"}),         # keys too
    ('"\\u00e9\\u2028<&>"', "\u00e9\u2028<&>"),
    ('[[], {}, [{}]]', [[], {}, [{}]]),
]


@pytest.mark.parametrize("text,expected", ACCEPTED)
def test_accepted_json_reads_as_go_reads_it_into_an_interface(text, expected):
    for data in (text, text.encode()):
        value = go_loads(data)
        assert value == expected
        assert type(value) is type(expected) or isinstance(value, dict)


def test_an_integer_literal_is_an_int_and_every_other_number_a_float():
    value = go_loads('[1, -1, 1.0, 1e2, 0]')
    assert [type(v) for v in value] == [int, int, float, float, int]


def test_minus_zero_is_a_float64_minus_zero():
    value = go_loads("-0")
    assert value == 0 and math.copysign(1.0, value) == -1.0


INVALID_UTF8 = [
    # (bytes of a JSON string, Go's reading: one U+FFFD per bad byte)
    (b'"\xff"', "\ufffd"),
    (b'"a\xc3"', "a\ufffd"),                  # truncated 2-byte sequence
    (b'"\xe2\x82A"', "\ufffd\ufffdA"),         # truncated 3-byte sequence: two bytes, two
    (b'"\xed\xa0\x80"', "\ufffd" * 3),         # a surrogate encoded in UTF-8
    (b'"\xc0\xaf"', "\ufffd" * 2),             # overlong
    (b'"\xf4\x90\x80\x80"', "\ufffd" * 4),     # beyond U+10FFFF
    (b'"caf\xc3\xa9"', "caf\u00e9"),           # valid UTF-8 stays
]


@pytest.mark.parametrize("data,expected", INVALID_UTF8)
def test_invalid_utf8_reads_as_one_replacement_character_per_bad_byte(data, expected):
    assert go_loads(data) == expected


def test_a_str_with_lone_surrogates_reads_as_the_bad_bytes_they_stand_for():
    assert go_loads('"a\udcff"') == "a\ufffd"   # a surrogateescape'd byte 0xff


REFUSED = [
    # (input, a part of the error's message)
    ("NaN", "NaN is not JSON"),
    ("[1, Infinity]", "Infinity is not JSON"),
    ('{"mtu": -Infinity}', "-Infinity is not JSON"),
    ("1e400", "out of range"),
    ("[-1e400]", "out of range"),
    ("1" + "0" * 400, "out of range"),
    (b"\xef\xbb\xbf{}", "byte order mark"),
    ('{"a": 1}'.encode("utf-16"), "UTF-16"),
    ('{"a": 1}'.encode("utf-16-le"), "UTF-16"),
    ("", "unexpected end of JSON input"),
    ("   ", "unexpected end of JSON input"),
    ("[1, 2", "unexpected end of JSON input"),
    ("[1,]", "invalid character ']' looking for beginning of value"),
    ('{"a": 1,}', "looking for beginning of object key string"),
    ("{} x", "invalid character 'x' after top-level value"),
    ("[1 2]", "invalid character '2' after array element"),
    ('{"a" 1}', "invalid character '1' after object key"),
    ('{"a": 1 "b": 2}', "after object key:value pair"),
    ("{'a': 1}", "looking for beginning of object key string"),
    ("01", "after top-level value"),
    ("tru", "looking for beginning of value"),
    ('"a\x01b"', "control character"),
    ('"\\x"', "escape"),
    ('"\\u12"', "escape"),
    ('"abc', "Unterminated string"),
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "exceeded max depth"),
    ('{"a":' * (MAX_JSON_DEPTH + 1), "exceeded max depth"),
]


@pytest.mark.parametrize("data,fragment", REFUSED)
def test_what_go_refuses_is_an_invalid_json_error_saying_so(data, fragment):
    with pytest.raises(InvalidJSON) as caught:
        go_loads(data)
    assert fragment in caught.value.msg
    assert "char " in caught.value.msg           # and where
    assert isinstance(caught.value, DecodeFailure) and isinstance(caught.value, ValueError)
    assert caught.value.code == 6


def test_nesting_up_to_go_s_limit_is_read_without_recursion():
    depth = MAX_JSON_DEPTH - 1  # and the object inside: 10000 levels, Go's most
    value = go_loads("[" * depth + '{"k": 1}' + "]" * depth)
    for _ in range(depth):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == {"k": 1}


def _iteratively(data):
    return gojson._parse_iteratively(gojson._paired_surrogates_only(gojson._go_text(data)))


def test_the_c_scanner_and_the_iterative_parse_agree():
    """Shallow documents take CPython's C scanner, deep or broken ones the iterative parse:
    the same value and the same refusals either way (generated documents, fixed seed)."""
    rng = random.Random(39)
    for _ in range(400):
        text = random_json(rng, 4)
        fast = go_loads(text)
        assert _iteratively(text) == fast
        assert _types(_iteratively(text)) == _types(fast)
        broken = _mutated(rng, text)
        outcomes = []
        for parse in (go_loads, _iteratively):
            try:
                outcomes.append(("value", parse(broken)))
            except InvalidJSON as exc:
                outcomes.append(("error", exc.msg))
        assert outcomes[0] == outcomes[1], broken


def test_no_input_raises_anything_but_invalid_json():
    rng = random.Random(6)
    alphabet = b'{}[]",:0123456789.eE+-\\utrnfalsNIy \t\n\xff\xed\xa0\x80\xef\xbb\xbf'
    for _ in range(3000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        try:
            go_loads(data)
        except InvalidJSON:
            pass


def test_objects_keep_every_member_in_order_until_changed():
    obj = go_loads('{"a": 1, "A": 2, "a": 3}')
    assert isinstance(obj, GoObject) and dict(obj) == {"a": 3, "A": 2}
    assert obj.pairs == [("a", 1), ("A", 2), ("a", 3)]
    obj["b"] = 4
    assert obj.pairs is None                      # stale members are never read
    assert go_field(obj, "a") == 2                 # the dict, in its order: a=3, A=2


# --- struct fields ---------------------------------------------------------------------------

FIELDS = [
    # (JSON object, field name, value of the Go struct field after Unmarshal)
    ('{"ingressRate": 1}', "ingressRate", 1),
    ('{"IngressRate": 1}', "ingressRate", 1),
    ('{"INGRESSRATE": 1}', "ingressRate", 1),
    ('{"hoſtPort": 80}', "hostPort", 80),           # ſ (U+017F) folds onto s
    ('{"\u212aey": 1}', "key", 1),                  # the Kelvin sign folds onto k
    ('{"ınterface": "x"}', "interface", None),      # dotless i is no i for Go
    ('{"interfacé": "x"}', "interface", None),
    ('{"ingress_rate": 1}', "ingressRate", None),
    ('{"ingressRate": 5, "IngressRate": 7, "ingressRate": 9}', "ingressRate", 9),
    ('{"IngressRate": 7, "ingressRate": 5}', "ingressRate", 5),   # document order, not exactness
    ('{"name": "x", "name": null}', "name", "x"),    # null leaves a string field alone
    ('{"Name": "x", "NAME": null}', "name", "x"),
]


@pytest.mark.parametrize("text,name,expected", FIELDS)
def test_a_struct_field_matches_its_key_exactly_or_else_case_insensitively(text, name, expected):
    obj = go_loads(text)
    assert go_field(obj, name) == expected
    assert go_fields(obj, (name,)).get(name) == expected


def test_null_sets_a_slice_map_or_pointer_field_to_nil():
    obj = go_loads('{"ips": ["10.0.0.1"], "IPS": null}')
    assert go_field(obj, "ips") == ["10.0.0.1"]
    assert go_field(obj, "ips", nil=True) is None
    assert go_fields(obj, ("ips",), nils=("ips",)) == {"ips": None}


def test_an_exact_match_beats_a_folded_one_and_the_first_field_takes_a_fold():
    assert go_fields(go_loads('{"Foo": 1}'), ("foo", "Foo")) == {"Foo": 1}
    assert go_fields(go_loads('{"foo": 1}'), ("foo", "Foo")) == {"foo": 1}
    assert go_fields(go_loads('{"FOO": 1}'), ("foo", "Foo")) == {"foo": 1}


def test_an_object_given_twice_to_a_struct_pointer_or_map_field_adds_up():
    obj = go_loads('{"bandwidth": {"ingressRate": 1}, "Bandwidth": {"egressRate": 2}}')
    merged = go_fields(obj, ("bandwidth",), merges=("bandwidth",))["bandwidth"]
    assert dict(merged) == {"ingressRate": 1, "egressRate": 2}
    assert go_fields(obj, ("bandwidth",))["bandwidth"] == {"egressRate": 2}


def test_every_value_a_field_is_given_is_checked():
    seen = []
    go_fields(go_loads('{"mac": 5, "MAC": "x", "mac": null}'), ("mac",),
              check=lambda name, value: seen.append((name, value)))
    assert seen == [("mac", 5), ("mac", "x")]


def test_go_fold_upper_cases_ascii_and_folds_long_s_and_kelvin_only():
    assert go_fold("cniVersion") == "CNIVERSION"
    assert go_fold("\u017f\u212a") == "SK"
    assert go_fold("straße") == "STRAßE"          # no full case mapping (ß is not SS)


# --- the shim's own JSON ---------------------------------------------------------------------

ASCII_SAMPLES = [
    {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1"}],
     "dns": {}, "interfaces": [{"name": "eth0", "mac": "aa:bb", "mtu": 1500}]},
    [1, -2, 3.5, 1e300, True, False, None, "é \u2028 \"quoted\" \\ /", "\udcff"],
    "plain", 0, {"nested": {"deep": [[], {}]}},
]


@pytest.mark.parametrize("value", ASCII_SAMPLES)
def test_ascii_json_writes_what_json_writes(value):
    import json

    assert ascii_json(value) == json.dumps(value)
    assert ascii_json(value).isascii()  # surrogates from undecodable env bytes included


def test_ascii_json_refuses_unserializable_and_circular_values():
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        ascii_json({"a": {1}})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError):
        ascii_json(loop)



def _mutated(rng: random.Random, text: str) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice(["", ",", "]", "}", "{", "x", '"', "NaN", "1e999"]) + \
        text[at + rng.randrange(2):]


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_every_refusal_is_a_multus_error():
    assert issubclass(InvalidJSON, MultusError)
