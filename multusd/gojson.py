"""JSON as upstream reads it: Go's ``encoding/json`` (v1) ``Unmarshal``, for every layer.

Multus, libcni and the plugins decode what multusd reads (annotations, NAD configs, the
runtime's config, daemon-config.json, cni-args, /delegate bodies, the result cache) with Go's
``json.Unmarshal``; this module is its one definition here (architecture invariant 15), and
:func:`multusd.store.go_json` the one of ``json.Marshal`` (the daemon's alone: the shim, which
imports this module for every pod sandbox, never writes Go's JSON). Reached through the package
root (``from multusd import go_loads``), which the shim, the engine, the config and the core
all import; standard library only and nothing imported at load time.

Reading (:func:`go_loads`), as Go's Unmarshal into an ``interface{}`` documents it:

* strict JSON: ``NaN``, ``Infinity``, a byte order mark, UTF-16, trailing commas refused;
  nesting deeper than :data:`MAX_JSON_DEPTH` refused ("exceeded max depth"), never a
  RecursionError;
* invalid UTF-8 reads as U+FFFD, one per bad byte, and so does an unpaired ``\\uD800``-
  ``\\uDFFF`` escape;
* every number is a float64: out of its range (``1e400``) refused; an integer literal stays an
  exact ``int`` (Go prints the same digits up to 2**53; beyond, Go rounds and multusd keeps it);
* a key given twice: its last value, as in a Go map (:class:`GoObject` keeps every member for
  struct reads). A Go struct's fields are read with :func:`go_fields`/:func:`go_field`: a key
  matches its field exactly or else case-insensitively (``"IngressRate"`` sets
  ``ingressRate``; :func:`go_fold`), and ``null`` leaves a string, number or bool field as it
  was but sets a slice, map or pointer field to nil.

The shim's own JSON (its answer, its request to the daemon), ASCII-escaped as ``json.dumps``
writes it, is :func:`ascii_json`.

Usage::

    conf = go_loads(b'{"Bandwidth": {"IngressRate": 1e3}, "cni-args": {"vlan": 1e2}}')
    go_field(conf, "bandwidth")                  # {'IngressRate': 1000.0}
    go_field(conf, "cni-args")                   # {'vlan': 100.0}: go_json writes '{"vlan":100}'
"""

#: Go's decoder refuses JSON nested deeper than this ("exceeded max depth").
MAX_JSON_DEPTH: int = 10000
_WHITESPACE = " \t\n\r"
_FOLDED = {**{c: c - 32 for c in range(ord("a"), ord("z") + 1)}, 0x17F: "S", 0x212A: "K"}


class GoObject(dict):
    """A JSON object as Go reads it: this dict is the map view (a key given twice holds its
    last value) and ``pairs`` every member in document order, what a Go struct is decoded
    from (:func:`go_fields`). Changing the dict drops ``pairs`` (``None``: read the dict)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: "list | tuple" = ()) -> None:
        dict.__init__(self, pairs)
        self.pairs: "list | tuple | None" = pairs


def _dropping_pairs(name: str) -> object:
    method = getattr(dict, name)

    def changed(self: GoObject, *args: object, **kwargs: object) -> object:
        self.pairs = None
        return method(self, *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault",
              "update"):
    setattr(GoObject, _name, _dropping_pairs(_name))


def go_fold(key: str) -> str:
    """``key`` as Go's decoder matches it against an (ASCII) struct field name: ASCII letters
    upper-cased, and ``ſ`` (U+017F) and the Kelvin sign (U+212A), which Unicode folds onto
    ``s`` and ``k``, as S and K (``foldName``: every other letter folds onto a non-ASCII one)."""
    return key.translate(_FOLDED)


def go_fields(obj: dict, names: tuple, *, nils: tuple = (), merges: tuple = (),
              check: object = None) -> dict:
    """The fields of a Go struct with the JSON names ``names`` (in declaration order) as
    ``json.Unmarshal`` of ``obj`` leaves them: ``{name: value}`` for each field a member set.

    A member sets the field its key names exactly, or else the first whose name it matches
    case-insensitively (:func:`go_fold`); unknown keys are ignored; members apply in document
    order, so the last wins. ``null`` leaves a string, number or bool field as it was; for a
    field in ``nils`` (a slice, map, pointer or interface) it sets ``None``. An object given
    twice to a field in ``merges`` (a map, or a pointer to a struct) is decoded into the
    first: their members add up. ``check(name, value)`` sees every non-null value a field is
    given (Go refuses a value of the wrong type even when a later member replaces it).
    """
    if not isinstance(obj, dict):
        return {}  # not an object: Go refuses it, which the caller says
    exact = {name: name for name in names}
    folded: dict = {}
    for name in names:
        folded.setdefault(go_fold(name), name)
    out: dict = {}
    for key, value in _pairs(obj):
        name = exact.get(key) or folded.get(go_fold(key))
        if name is None:
            continue
        if value is None:
            if name in nils or name in merges:
                out[name] = None
            continue
        if check is not None:
            check(name, value)
        if name in merges and isinstance(value, dict) and isinstance(out.get(name), dict):
            value = GoObject(list(_pairs(out[name])) + list(_pairs(value)))
        out[name] = value
    return out


def go_field(obj: object, name: str, default: object = None, *, nil: bool = False) -> object:
    """The one field ``name`` of a Go struct (no other field of which matches ``name``
    case-insensitively) after ``json.Unmarshal`` of ``obj``; ``default`` when no member set
    it (or ``obj`` is no object). ``nil``: a slice/map/pointer field, which ``null`` sets to
    ``None``; else ``null`` leaves it as it was. See :func:`go_fields`."""
    if not isinstance(obj, dict):
        return default
    value, size, want = default, len(name), None
    for key, member in _pairs(obj):
        if len(key) != size or member is None and not nil:
            continue  # folding keeps the length; a null leaves a scalar field alone
        if key != name:
            want = want or go_fold(name)
            if go_fold(key) != want:
                continue
        value = member
    return value


def _pairs(obj: dict) -> "list | tuple | object":
    pairs = getattr(obj, "pairs", None)
    return obj.items() if pairs is None else pairs


def go_loads(data: "bytes | bytearray | memoryview | str") -> object:
    """``data`` as Go's ``json.Unmarshal`` into an ``interface{}`` reads it: objects are
    :class:`GoObject` (plain dicts for every other purpose), integer literals ints, other
    numbers floats, strings with U+FFFD for invalid UTF-8 (one per bad byte) and for unpaired
    surrogate escapes.

    :raises multusd.errors.InvalidJSON: (a DecodeFailure, and a ValueError as ``json``'s
        errors are) saying what Go's decoder refuses, and where.
    """
    text = _go_text(data)
    if "\\ud" in text or "\\uD" in text:
        text = _paired_surrogates_only(text)
    if text.count("{") + text.count("[") <= MAX_JSON_DEPTH:  # cannot nest past Go's limit:
        try:  # CPython's C scanner (deeper than its recursion takes, the parse below)
            value, end = _scanner()(text, len(text) - len(text.lstrip(_WHITESPACE)))
            if not text[end:].strip(_WHITESPACE):
                return value
        except Exception:  # noqa: B902 - the parse below says what is wrong, and where
            pass
    return _parse_iteratively(text)


class _Refused(ValueError):
    """A literal Go's decoder refuses (NaN, Infinity, a number out of a float64's range)."""


def _integer(literal: str) -> object:
    if literal == "-0":
        return -0.0  # a float64 minus zero, which Go writes back as -0
    if len(literal) > 308:  # 1e308: float64's range ends near 1.8e308
        if len(literal.lstrip("-")) > 309:
            raise _Refused(_out_of_range(literal))
        try:
            float(int(literal))
        except OverflowError:
            raise _Refused(_out_of_range(literal)) from None
    return int(literal)


def _fraction(literal: str) -> float:
    value = float(literal)
    if value - value != 0.0:  # inf: Python rounds 1e400 up to it, Go refuses it
        raise _Refused(_out_of_range(literal))
    return value


def _out_of_range(literal: str) -> str:
    shown = literal if len(literal) <= 40 else literal[:37] + "..."
    return f"cannot unmarshal number {shown} into Go value of type float64: out of range"


def _constant(name: str) -> object:
    raise _Refused(f"{name} is not JSON (Go's decoder refuses NaN and Infinity; write a number, "
                   "a string or null)")


_SCANNER: list = []


def _scanner() -> object:
    """CPython's C scanner (what ``json`` runs on) with Go's hooks, made once (``_json`` is
    all it imports: ``json`` itself would cost the shim ~10 ms)."""
    if not _SCANNER:
        class Context:  # the attributes make_scanner reads from a json.JSONDecoder
            strict = True
            object_hook = None
            object_pairs_hook = GoObject
            parse_float = staticmethod(_fraction)
            parse_int = staticmethod(_integer)
            parse_constant = staticmethod(_constant)
            memo: dict = {}

        try:
            from _json import make_scanner
        except ImportError:  # pragma: no cover - not CPython: json's own, in Python
            import json

            _SCANNER.append(json.JSONDecoder(
                object_pairs_hook=GoObject, parse_float=_fraction, parse_int=_integer,
                parse_constant=_constant).scan_once)
        else:
            _SCANNER.append(make_scanner(Context()))
    return _SCANNER[0]


def _go_text(data: object) -> str:
    """The text Go's decoder sees: UTF-8 with U+FFFD for each invalid byte."""
    if isinstance(data, str):
        if data.isascii():
            return data
        try:
            data.encode("utf-8")
            return data
        except UnicodeEncodeError:  # lone surrogates (e.g. surrogateescape'd bytes): bad bytes
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in data)
    raw = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        import codecs

        codecs.register_error("multusd-go-json", _each_byte_replaced)
        return raw.decode("utf-8", "multusd-go-json")


def _each_byte_replaced(exc: UnicodeDecodeError) -> tuple:
    # Python flags a truncated sequence as one error; Go's DecodeRune fails byte by byte.
    return "\ufffd" * (exc.end - exc.start), exc.end


def _paired_surrogates_only(text: str) -> str:
    r"""``text`` with every ``\uD800``-``\uDFFF`` escape that is not half of a pair (a high one
    followed by a low one) written ``\ufffd``, as Go decodes it."""
    parts, done, at = [], 0, text.find("\\u")
    while at != -1:
        before = at  # the backslashes before this one: an odd run of them escapes it
        while before and text[before - 1] == "\\":
            before -= 1  # each run is walked once: the next search starts past it
        code = _hex4(text, at + 2) if (at - before) % 2 == 0 else -1
        step = 6 if code != -1 else 2
        if 0xD800 <= code <= 0xDBFF and text.startswith("\\u", at + 6) and \
                0xDC00 <= _hex4(text, at + 8) <= 0xDFFF:
            step = 12  # a pair
        elif 0xD800 <= code <= 0xDFFF:
            parts += [text[done:at], "\\ufffd"]
            done = at + 6
        at = text.find("\\u", at + step)
    return "".join(parts) + text[done:] if parts else text


def _hex4(text: str, at: int) -> int:
    digits = text[at:at + 4]
    if len(digits) == 4 and digits.isascii() and digits.isalnum():  # int() takes "+1_a" too
        try:
            return int(digits, 16)
        except ValueError:
            pass
    return -1


def _parse_iteratively(text: str) -> object:
    """The document parsed with a stack of its open objects and arrays instead of recursion
    (any depth up to MAX_JSON_DEPTH), scalars by the C scanner; errors in Go's words."""
    scan, stack = _scanner(), []  # frames: [members so far, is an object, pending key]
    at = _skip(text, 0)
    while True:
        char = text[at:at + 1]
        if char in ("{", "["):
            if len(stack) >= MAX_JSON_DEPTH:
                raise _invalid(f"exceeded max depth: more than {MAX_JSON_DEPTH} levels of "
                               "nested objects and arrays (Go's decoder limit)", text, at)
            at = _skip(text, at + 1)
            if text.startswith("}" if char == "{" else "]", at):
                value, at = GoObject([]) if char == "{" else [], at + 1
            else:
                stack.append([[], char == "{", None])
                if char == "{":
                    stack[-1][2], at = _member_key(text, at)
                continue
        else:
            value, at = _scalar(scan, text, at)
        while True:  # hand the value to its container, closing those that end here
            if not stack:
                at = _skip(text, at)
                if at < len(text):
                    raise _invalid(f"invalid character {text[at]!r} after top-level value",
                                   text, at)
                return value
            frame = stack[-1]
            frame[0].append((frame[2], value) if frame[1] else value)
            at = _skip(text, at)
            char = text[at:at + 1]
            if char == ",":
                at = _skip(text, at + 1)
                if frame[1]:
                    frame[2], at = _member_key(text, at)
                break
            if char != ("}" if frame[1] else "]"):
                where = "object key:value pair" if frame[1] else "array element"
                raise _invalid(_unexpected(text, at, f"after {where}"), text, at)
            stack.pop()
            value, at = (GoObject(frame[0]) if frame[1] else frame[0]), at + 1


def _skip(text: str, at: int) -> int:
    while text[at:at + 1] in (" ", "\t", "\n", "\r"):
        at += 1
    return at


def _member_key(text: str, at: int) -> tuple:
    if text[at:at + 1] != '"':
        raise _invalid(_unexpected(text, at, "looking for beginning of object key string"),
                       text, at)
    key, at = _scalar(_scanner(), text, at)
    at = _skip(text, at)
    if text[at:at + 1] != ":":
        raise _invalid(_unexpected(text, at, "after object key"), text, at)
    return key, _skip(text, at + 1)


def _scalar(scan: object, text: str, at: int) -> tuple:
    try:
        return scan(text, at)
    except _Refused as exc:
        raise _invalid(str(exc), text, at) from None
    except StopIteration:
        raise _invalid(_unexpected(text, at, "looking for beginning of value"), text, at) \
            from None
    except Exception:  # noqa: B902 - a bad string; json.decoder gives the C scanner its words
        import json.decoder

        try:
            scan(text, at)
        except ValueError as exc:
            raise _invalid(getattr(exc, "msg", str(exc)), text, getattr(exc, "pos", at)) \
                from None
        raise _invalid("invalid JSON value", text, at) from None


def _unexpected(text: str, at: int, context: str) -> str:
    if at >= len(text):
        return "unexpected end of JSON input"
    return f"invalid character {text[at]!r} {context}"


def _invalid(problem: str, text: str, at: int) -> Exception:
    """What Go's decoder refuses, where: an :class:`multusd.errors.InvalidJSON`."""
    from multusd.errors import InvalidJSON

    line = text.count("\n", 0, at) + 1
    where = f"line {line} column {at - text.rfind(chr(10), 0, at)} (char {at})"
    if text.startswith("\ufeff") and at == 0:
        problem += " (a byte order mark: save it as UTF-8 without one, as Go reads it)"
    elif "\x00" in text[:4] or text.startswith(("\ufffd\ufffd", "\ufffe", "\ufeff")):
        problem += " (UTF-16? Go's decoder reads UTF-8 only)"
    return InvalidJSON(f"{problem}: {where}")


# --- the shim's own JSON -----------------------------------------------------------------

def ascii_json(obj: object) -> str:
    """``json.dumps(obj)``: default separators, everything but ASCII escaped, for the shim's own
    output and requests (its environment may hold undecodable bytes as surrogates, which only
    an escape carries), by CPython's C encoder without importing ``json`` (~10 ms of a shim
    run: it compiles regular expressions and imports ``re`` and ``enum``)."""
    try:
        from _json import encode_basestring_ascii, make_encoder
    except ImportError:  # pragma: no cover - not CPython
        import json

        return json.dumps(obj)
    # A fresh markers dict per call: it is the encoder's circular-reference check.
    encoder = make_encoder({}, _unserializable, encode_basestring_ascii, None, ": ", ", ",
                           False, False, True)
    return "".join(encoder(obj, 0))


def _unserializable(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
