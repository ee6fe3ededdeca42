"""JSON out of short-lived processes (the shim, the systemd generator): ``_json`` without ``json``.

``import json`` costs the shim about a third of its run time: json.decoder compiles regular
expressions at import, which pulls in ``re`` and ``enum``. The shim runs once per pod sandbox,
so it calls CPython's own C encoder (``_json``, what ``json`` uses underneath) directly: the
same text as ``json.dumps`` with default arguments; where ``_json`` is missing (another
Python implementation) it falls back to ``json``. JSON is read as upstream reads it, by
:func:`multusd.go_loads` (the same C scanner, Go's rules).
"""

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None


def _unsupported(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """``json.dumps(obj)`` with the default separators and ASCII escaping."""
    if _json is None:
        import json

        return json.dumps(obj)
    # A fresh markers dict per call: it is the encoder's circular-reference check.
    encoder = _json.make_encoder({}, _unsupported, _json.encode_basestring_ascii, None,
                                 ": ", ", ", False, False, True)
    return "".join(encoder(obj, 0))
