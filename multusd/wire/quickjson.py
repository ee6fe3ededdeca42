"""JSON for short-lived processes (the shim, the systemd generator): ``_json`` without ``json``.

``import json`` costs the shim about a third of its run time: json.decoder compiles regular
expressions at import, which pulls in ``re`` and ``enum``. The shim runs once per pod sandbox,
so it calls CPython's own C scanner and encoder (``_json``, what ``json`` uses underneath)
directly. Same results as ``json.loads``/``json.dumps`` with default arguments; where ``_json``
is missing (another Python implementation) it falls back to ``json``.
"""

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _DecoderContext:
    """The attributes ``_json.make_scanner`` reads from a json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _unsupported(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_DecoderContext())


def loads(data: "str | bytes") -> object:
    """``json.loads(data)``; raises ValueError (json.JSONDecodeError) on bad input."""
    if _json is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    stripped = text.lstrip(_WHITESPACE)
    offset = len(text) - len(stripped)
    try:
        value, end = _scan(text, offset)
    except BaseException:  # noqa: B902 - any scanner failure: let json say what is wrong
        return _loads_with_json(text)
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def _loads_with_json(text: str) -> object:
    """The error path: the standard parser, whose errors are ValueErrors with a position.

    The bare scanner is not a safe parser on its own: it needs ``json.decoder`` for its
    error messages (``SystemError`` without it) and recurses without a guard.
    """
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def dumps(obj: object) -> str:
    """``json.dumps(obj)`` with the default separators and ASCII escaping."""
    if _json is None:
        import json

        return json.dumps(obj)
    # A fresh markers dict per call: it is the encoder's circular-reference check.
    encoder = _json.make_encoder({}, _unsupported, _json.encode_basestring_ascii, None,
                                 ": ", ", ", False, False, True)
    return "".join(encoder(obj, 0))
