"""Typed reads of JSON config objects that collect every problem instead of failing at the first.

The one reader behind daemon-config.json (:mod:`.daemonconf`), the 00-multus.conf generator
(:mod:`.multusconf`) and the multus settings the delegates are resolved from
(:mod:`multusd.core.podnetworks`). A ``null`` value counts as absent, as Go's decoder treats
it; a value of the wrong JSON type is recorded as a :class:`~multusd.errors.ConfigProblem`
(``key: must be <what>, got <value>``) and the default is used, so that the caller can
report all problems in one :class:`~multusd.errors.ConfigError`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

from multusd import go_field, go_fields
from multusd.errors import ConfigProblem

#: Upstream's LogOptions struct (``logOptions``): its fields, each a pointer, and their types.
LOG_OPTIONS = (("maxAge", int), ("maxSize", int), ("maxBackups", int), ("compress", bool))


class ConfigReader(list):
    """A list of :class:`ConfigProblem` filled in by typed reads of config objects."""

    def add(self, path: str, message: str) -> None:
        self.append(ConfigProblem(path, message))

    def bad(self, key: str, expected: str, value: Any, hint: str = "") -> None:
        self.add(key, f"must be {expected}, got {value!r}" + (f"; {hint}" if hint else ""))

    def expect(self, raw: Mapping[str, Any], key: str, kind: type, what: str,
               prefix: str = "") -> bool:
        """Record a problem when ``raw[key]`` is set but not of ``kind``; True if it is fine."""
        if is_wrong_type(raw, key, kind):
            self.bad(prefix + key, what, raw[key])
            return False
        return True

    def string(self, raw: Mapping[str, Any], key: str, default: str = "") -> str:
        value = raw.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.bad(key, "a string", value, f'write "{key}": "..."')
            return default
        return value

    def absolute_path(self, raw: Mapping[str, Any], key: str, default: str) -> str:
        value = self.string(raw, key, default) or default
        if not os.path.isabs(value):
            self.bad(key, "an absolute path", value, f"write e.g. {default!r}")
            return default
        return value

    def boolean(self, raw: Mapping[str, Any], key: str, default: bool = False) -> bool:
        value = raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.bad(key, "true or false", value)
            return default
        return value

    def log_options(self, raw: Mapping[str, Any], key: str = "logOptions"
                    ) -> Optional[Dict[str, Any]]:
        """``logOptions`` as upstream's ``*LogOptions`` reads it: None when absent or null,
        else the fields set (``"MaxSize"`` sets maxSize; null leaves one unset). A value of
        the wrong type is a problem wherever it is: Go refuses the config."""
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.bad(key, 'an object such as {"maxAge": 5}', value)
            return None
        kinds = dict(LOG_OPTIONS)

        def check(name: str, member: Any) -> None:
            if is_wrong_type({name: member}, name, kinds[name]):
                self.bad(f"{key}.{name}", "an integer" if kinds[name] is int
                         else "true or false", member)

        options = go_fields(value, tuple(kinds), nils=tuple(kinds), check=check)
        return {name: options[name] for name in kinds if options.get(name) is not None}

    def string_list(self, raw: Mapping[str, Any], key: str,
                    default: Tuple[str, ...]) -> Tuple[str, ...]:
        if key not in raw:
            return default
        value = raw[key]
        if value is None:
            return ()  # an explicit null empties the list, as Go's decoder does
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.bad(key, "a list of strings", value)
            return default
        return tuple(value)

    def names(self, raw: Mapping[str, Any], key: str,
              default: Tuple[str, ...]) -> Tuple[str, ...]:
        """A comma-separated string of names, or a list of them, each stripped; ``default``
        when unset or empty."""
        value = raw.get(key)
        if value is None or value == "":
            return default
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(v.strip() for v in value)
        self.bad(key, "a comma-separated string of namespaces", value)
        return default

    def objects(self, raw: Mapping[str, Any], key: str) -> Tuple[Dict[str, Any], ...]:
        value = raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.bad(key, "a list of CNI config objects", value)
            return ()
        return tuple(value)

    def port(self, raw: Mapping[str, Any], key: str) -> Optional[int]:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            self.bad(key, "a TCP port number from 1 to 65535", value)
            return None
        return value

    def positive(self, raw: Mapping[str, Any], key: str, default, kind):
        value = raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.bad(key, "a number greater than 0", value)
            return default
        return kind(value)


def is_wrong_type(raw: Mapping[str, Any], key: str, kind: type) -> bool:
    """A value of the wrong JSON type (null counts as absent; an int is not a bool)."""
    value = raw.get(key)
    if value is None:
        return False
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int)
    return not isinstance(value, kind)


def lenient_str(raw: Mapping[str, Any], key: str, default: str) -> str:
    """The string field ``key`` of upstream's struct as Go reads it out of ``raw``
    (``"CNIConfigDir"`` is a cniConfigDir), else ``default`` (for keys already validated, or
    read leniently: the daemon config as the generator, its removal and the daemon find the
    runtime's config by it)."""
    value = go_field(raw, key)
    return value if isinstance(value, str) else default
