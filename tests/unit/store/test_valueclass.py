"""multusd.store.valueclass: classes that behave as frozen dataclasses do, without dataclasses."""

import dataclasses
from typing import Dict, Mapping

import pytest

from multusd.store.valueclass import FrozenInstanceError, Record, field, replace


class Point(Record):
    x: int
    y: int = 0
    tags: Dict[str, str] = field(default_factory=dict)
    note: str = field(default="", compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class DataPoint:
    x: int
    y: int = 0
    tags: Dict[str, str] = dataclasses.field(default_factory=dict)
    note: str = dataclasses.field(default="", compare=False, repr=False)


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, 2), {}), ((), {"x": 3, "y": 4}),
                                          ((5,), {"tags": {"a": "b"}, "note": "n"})])
def test_fields_defaults_and_repr_as_a_dataclass(args, kwargs):
    ours, theirs = Point(*args, **kwargs), DataPoint(*args, **kwargs)
    assert (ours.x, ours.y, ours.tags, ours.note) == (theirs.x, theirs.y, theirs.tags, theirs.note)
    assert repr(ours) == repr(theirs).replace("DataPoint", "Point")


def test_each_instance_gets_its_own_default_factory_value():
    first, second = Point(1), Point(1)
    assert first.tags == {} and first.tags is not second.tags


def test_equality_and_hash_leave_out_compare_false_fields():
    assert Point(1, note="a") == Point(1, note="b")
    assert Point(1) != Point(2) and Point(1) != DataPoint(1)
    assert hash(Point(1, 2, tags=None)) == hash(Point(1, 2, tags=None))  # type: ignore[arg-type]


def test_instances_are_frozen():
    point = Point(1)
    with pytest.raises(FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.y
    assert point.x == 1


@pytest.mark.parametrize("call, words", [
    (lambda: Point(), "missing required argument 'x'"),
    (lambda: Point(1, x=1), "multiple values for argument 'x'"),
    (lambda: Point(1, z=1), "unexpected keyword argument 'z'"),
    (lambda: Point(1, 2, {}, "", 5), "takes 4 positional arguments but 5 were given"),
])
def test_wrong_arguments_are_type_errors(call, words):
    with pytest.raises(TypeError) as info:
        call()
    assert words in str(info.value)


def test_replace_copies_with_changes():
    point = Point(1, 2, tags={"a": "b"})
    moved = replace(point, y=3)
    assert (moved.x, moved.y, moved.tags) == (1, 3, {"a": "b"}) and point.y == 2
    with pytest.raises(TypeError):
        replace(point, z=1)


def test_subclasses_add_fields_after_their_bases_and_keep_methods():
    class Labelled(Point):
        label: str = "l"

        def describe(self) -> str:
            return f"{self.label}@{self.x}"

    labelled = Labelled(1, label="here")
    assert labelled.describe() == "here@1" and labelled.y == 0
    assert [f.name for f in Labelled.__record_fields__] == ["x", "y", "tags", "note", "label"]


def test_a_required_field_after_a_default_one_is_refused():
    with pytest.raises(TypeError):
        class Wrong(Record):  # noqa: F841 - the class statement is the test
            a: int = 1
            b: Mapping[str, str]


def test_mixins_without_fields_are_fine():
    class Named:
        def hello(self) -> str:
            return "hi " + self.name  # type: ignore[attr-defined]

    class Person(Named, Record):
        name: str

    assert Person("ann").hello() == "hi ann" and Person("ann") == Person(name="ann")
