"""Frozen value classes, declared as dataclasses are, built without generating code per class.

``dataclasses`` costs a socket-activated daemon ~5 ms to import (it pulls in ``inspect``) and
~0.7 ms per class, because it compiles each class's ``__init__``, ``__repr__``, ``__eq__``
and ``__hash__`` from source at import time: ~12 ms of the first ADD for multusd's classes.
:class:`Record` gives the same behaviour with methods shared by every class::

    class Pod(Record):
        namespace: str
        name: str
        annotations: Mapping[str, str] = field(default_factory=dict)
        source: str = field(default="", repr=False, compare=False)

Fields are the class's own annotations (after its bases'), in order; a field without a
default cannot follow one with a default. Instances are frozen (assignment raises
:class:`FrozenInstanceError`), compare and hash by their ``compare`` fields, and print as
``Pod(namespace='a', ...)``; :func:`replace` makes a changed copy.
"""

from typing import Any, Callable, Dict, Optional, Tuple

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a :class:`Record` (they are immutable)."""


class Field:
    """How one field is made and shown (see :func:`field`)."""

    __slots__ = ("name", "default", "default_factory", "compare", "repr")

    def __init__(self, default: Any = _MISSING, default_factory: Optional[Callable[[], Any]] = None,
                 compare: bool = True, repr: bool = True) -> None:  # noqa: A002 - dataclasses' name
        self.name = ""
        self.default, self.default_factory = default, default_factory
        self.compare, self.repr = compare, repr

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.default_factory is None


def field(*, default: Any = _MISSING, default_factory: Optional[Callable[[], Any]] = None,
          compare: bool = True, repr: bool = True) -> Any:  # noqa: A002
    """A field's default, default factory and whether it takes part in ``==`` and ``repr``."""
    if default is not _MISSING and default_factory is not None:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, compare, repr)


class Record:
    """Base of multusd's frozen value classes (see the module docstring)."""

    __record_fields__: Tuple[Field, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: Dict[str, Field] = {f.name: f for f in cls.__record_fields__}
        for name in cls.__dict__.get("__annotations__", {}):
            value = cls.__dict__.get(name, _MISSING)
            spec = value if isinstance(value, Field) else Field(default=value)
            spec.name = name
            if isinstance(value, Field):
                if spec.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, spec.default)
            fields.pop(name, None)
            fields[name] = spec
        seen_default = False
        for spec in fields.values():
            if spec.required and seen_default:
                raise TypeError(f"non-default field {spec.name!r} follows a default field "
                                f"in {cls.__name__}")
            seen_default = seen_default or not spec.required
        cls.__record_fields__ = tuple(fields.values())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self.__record_fields__
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} positional "
                            f"arguments but {len(args)} were given")
        put = object.__setattr__
        for spec, value in zip(fields, args):
            if spec.name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument "
                                f"{spec.name!r}")
            put(self, spec.name, value)
        for spec in fields[len(args):]:
            if spec.name in kwargs:
                value = kwargs.pop(spec.name)
            elif spec.default_factory is not None:
                value = spec.default_factory()
            elif spec.default is not _MISSING:
                value = spec.default
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument "
                                f"{spec.name!r}")
            put(self, spec.name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument "
                            f"{next(iter(kwargs))!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _compared(self) -> tuple:
        return tuple(getattr(self, f.name) for f in self.__record_fields__ if f.compare)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                          for f in self.__record_fields__ if f.repr)
        return f"{type(self).__qualname__}({shown})"


def replace(record: Any, **changes: Any) -> Any:
    """A copy of ``record`` with ``changes`` (as ``dataclasses.replace``)."""
    values = {f.name: getattr(record, f.name) for f in record.__record_fields__}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(record)(**values)
