"""multusd.config.reader: typed reads that collect every problem, null as absent."""

from __future__ import annotations

from multusd.config.reader import ConfigReader, is_wrong_type, lenient_str


def test_every_problem_is_collected_and_the_default_used():
    reader = ConfigReader()
    raw = {"s": 3, "b": "yes", "l": ["a", 1], "o": [{}, 2], "p": 70000, "n": -1, "m": []}
    assert reader.string(raw, "s", "d") == "d"
    assert reader.boolean(raw, "b", True) is True
    assert reader.string_list(raw, "l", ("x",)) == ("x",)
    assert reader.objects(raw, "o") == ()
    assert reader.port(raw, "p") is None
    assert reader.positive(raw, "n", 5.0, float) == 5.0
    assert reader.log_options(raw, "m") is None
    assert [p.path for p in reader] == ["s", "b", "l", "o", "p", "n", "m"]
    assert reader[0].format() == 's: must be a string, got 3; write "s": "..."'


def test_null_is_absent_except_that_it_empties_a_list():
    reader = ConfigReader()
    raw = {"s": None, "l": None}
    assert reader.string(raw, "s", "d") == "d"
    assert reader.string_list(raw, "l", ("x",)) == ()
    assert reader.string_list({}, "l", ("x",)) == ("x",)
    assert not reader


def test_names_are_a_comma_separated_string_or_a_list():
    reader = ConfigReader()
    assert reader.names({"k": " a, b"}, "k", ("d",)) == ("a", "b")
    assert reader.names({"k": ["c "]}, "k", ("d",)) == ("c",)
    assert reader.names({"k": ""}, "k", ("d",)) == ("d",)
    assert reader.names({"k": 3}, "k", ("d",)) == ("d",)
    assert [p.format() for p in reader] == ["k: must be a comma-separated string of "
                                            "namespaces, got 3"]


def test_type_helpers():
    assert is_wrong_type({"k": True}, "k", int) and not is_wrong_type({"k": None}, "k", int)
    assert lenient_str({"k": 3}, "k", "d") == "d" and lenient_str({"k": "v"}, "k", "d") == "v"
