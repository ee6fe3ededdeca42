"""What multusd writes and how: the one atomic-write helper, its JSON-file reader, Go's JSON text.

Every file multusd writes goes through :func:`atomic_write` (but the systemd generator's
drop-in, written once into a fresh tmpfs): a temp file in the same directory, fsync, rename
over the target, fsync of the directory. The fsyncs are skipped for libcni's result cache
(libcni never fsyncs it) and the kubeconfig's ``-data`` files (rewritten at every start), and
left to a :class:`Flush` for the scratch cache (it runs while the plugins do). A reader sees
the old content or the new, never an empty or partial file; JSON files are read as Go reads
them (:func:`multusd.go_loads`). :func:`go_json` is the one encoder of JSON as Go's
``encoding/json`` writes it (its ``json.Marshal``, beside the reader's ``Unmarshal``, which the
shim needs and so lives in the package root): what must match upstream's bytes (00-multus.conf,
the scratch cache, delegate configs, the network-status annotation) and what upstream writes
out again and plugins read (cni-args, a plugin's stdin: ``1e2`` written ``100``).
:mod:`multusd.store.valueclass`
holds the frozen value classes the data is kept in on its way (declared as dataclasses are).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Optional

from multusd import go_loads
from multusd.errors import IOFailure

LOG = logging.getLogger(__name__)

def atomic_write(path: str, data: bytes, mode: int = 0o600, dir_mode: int = 0o700,
                 durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; create its directory with ``dir_mode``.

    A reader never sees a partial file (the data goes to a temp file renamed over ``path``).
    ``durable``: the data and the directory are fsynced, so that not even a power loss can
    leave the file empty, partial or missing. ``durable=False`` skips both fsyncs (~0.4 ms
    each) for a file whose loss or corruption in a power loss is recoverable: libcni's
    result cache, which readers ignore when corrupt and whose DEL falls back to the scratch
    cache; libcni itself never fsyncs it.

    :raises IOFailure: when the directory or the file cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=dir_mode, exist_ok=True)
        fd, tmp = _create_temp(directory, os.path.basename(path))
    except OSError as exc:
        raise IOFailure(f"cannot write {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if durable:
                os.fsync(handle.fileno())
        os.rename(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise IOFailure(f"cannot write {path}: {exc.strerror}") from exc
    if durable:
        _fsync_dir(directory)


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """A new file ``.<name>.<random>.tmp`` in ``directory``, opened for writing (mode 0600).

    What tempfile.mkstemp does, without importing tempfile (with shutil and random: ~5 ms of
    every socket-activated start) and its per-call name generator.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name} in {directory}")


class Flush:
    """fsync of a file just written (``durable=False``) and of its directory, on a thread.

    The disk then works while the caller goes on (the GIL is released during fsync);
    :meth:`wait` before saying the file is safe. A failed fsync is logged: the data is in the
    page cache, readers see it, only a power loss could still lose it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._error: Optional[OSError] = None
        self._thread = threading.Thread(target=self._run, name="multusd-fsync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return  # removed meanwhile (a rolled-back ADD): nothing left to keep
        except OSError as exc:
            self._error = exc
        _fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            LOG.warning("cannot fsync %s: %s; a power loss could lose it", self.path,
                        self._error.strerror)


def read_or_none(path: str, what: str = "") -> Optional[bytes]:
    """The bytes of ``path``; None when it does not exist.

    :raises IOFailure: it exists but cannot be read (``what`` names it in the message).
    """
    name = f"{what} {path}" if what else repr(path)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError as exc:
        raise IOFailure(f"cannot read {name}: it is a directory") from exc
    except OSError as exc:
        raise IOFailure(f"cannot read {name}: {exc.strerror}") from exc


def read_json_object(path: str, what: str) -> dict | None:
    """The JSON object in ``path``, read as Go reads it; None when it is missing, or unreadable
    or not a JSON object (then a warning names ``what`` it was supposed to be: callers carry
    on without)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        LOG.warning("cannot read %s %s: %s", what, path, exc.strerror)
        return None
    try:
        value = go_loads(data)
    except ValueError as exc:
        LOG.warning("ignoring corrupt %s %s: %s", what, path, exc)
        return None
    if not isinstance(value, dict):
        LOG.warning("ignoring corrupt %s %s: not a JSON object", what, path)
        return None
    return value


def remove(path: str) -> bool:
    """Delete ``path``; True if it existed. A missing file is not an error.

    The directory is not fsynced: a deletion lost in a crash only means a second, idempotent
    DEL of the same attachment.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise IOFailure(f"cannot remove {path}: {exc.strerror}") from exc
    return True


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# Go's encoder escapes these even inside strings, to keep JSON safe to embed in HTML/JS.
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
               "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_json(obj: object, *, indent: "int | None" = None, sort_keys: bool = False) -> str:
    """``obj`` as JSON text the way Go's ``encoding/json`` writes it.

    Compact (or indented with ``indent`` spaces, as ``MarshalIndent``), non-ASCII kept as
    UTF-8, ``< > &`` U+2028 U+2029 escaped as ``\\u00XX``, floats as :func:`go_float` writes
    them. ``sort_keys`` mimics Go's marshalling of a ``map`` (sorted keys); leave it off to
    mimic a struct (declared order). Any depth (Go has no limit on writing).

    :raises ValueError: a float that is NaN or infinite (Go: "unsupported value").
    """
    if _floats_differ(obj):
        text = _written_iteratively(obj, indent, sort_keys)
    else:
        try:
            if indent is None:
                text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                                  sort_keys=sort_keys, allow_nan=False)
            else:
                text = json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=sort_keys,
                                  allow_nan=False)
        except RecursionError:  # deeper than json's recursion takes
            text = _written_iteratively(obj, indent, sort_keys)
    if any(c in text for c in _GO_ESCAPES):
        # Safe on the whole text: these characters can only occur inside JSON strings.
        text = "".join(_GO_ESCAPES.get(c, c) for c in text)
    return text


def go_float(value: float) -> str:
    """A float64 as Go's encoder writes it (``floatEncoder``): the shortest digits that read
    back the same (Python's ``repr`` finds the same ones), in fixed notation from 1e-6 up to
    1e21 and as ``1e-7``/``1e+21`` beyond, the ES6 way: ``100.0`` is ``100``.

    :raises ValueError: NaN or an infinity (JSON has no such number).
    """
    if value != value or value - value != 0.0:
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0.0:
        return "-0" if str(value)[0] == "-" else "0"
    text = repr(value)
    sign, text = ("-", text[1:]) if text[0] == "-" else ("", text)
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    figures = whole + fraction
    digits = figures.lstrip("0").rstrip("0")
    point = len(whole) + int(exponent or 0) - (len(figures) - len(figures.lstrip("0")))
    if 1e-6 <= abs(value) < 1e21:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return sign + digits + "0" * (point - len(digits))
        return f"{sign}{digits[:point]}.{digits[point:]}"
    power = point - 1
    shown = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{shown}e{'-' if power < 0 else '+'}{abs(power):0{1 if power < 0 else 2}d}"


def _floats_differ(obj: object) -> bool:
    """Whether ``obj`` holds a float whose ``repr`` (what ``json`` writes) is not Go's text."""
    pending = [obj]
    while pending:
        value = pending.pop()
        if isinstance(value, float):
            if repr(value) != go_float(value):
                return True
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return False


_END = object()


def _written_iteratively(obj: object, indent: "int | None", sort_keys: bool) -> str:
    """What ``json.dumps`` writes (as :func:`go_json` calls it), floats as Go writes them,
    without recursion."""
    colon = ":" if indent is None else ": "
    parts: list = []
    stack: list = []  # frames: [iterator of members, closing bracket, members written, object]
    value = obj
    while True:
        if isinstance(value, dict) and value:
            members = sorted(value.items()) if sort_keys else list(value.items())
            parts.append("{")
            stack.append([iter(members), "}", 0, True])
        elif isinstance(value, (list, tuple)) and value:
            parts.append("[")
            stack.append([iter(value), "]", 0, False])
        elif isinstance(value, float):
            parts.append(go_float(value))
        else:
            parts.append(json.dumps(value, ensure_ascii=False, allow_nan=False))
        while stack:
            frame = stack[-1]
            member = next(frame[0], _END)
            if member is _END:
                stack.pop()
                parts.append(_newline(indent, len(stack)) + frame[1])
                continue
            parts.append(("," if frame[2] else "") + _newline(indent, len(stack)))
            frame[2] += 1
            if frame[3]:
                parts.append(json.dumps(str(member[0]), ensure_ascii=False) + colon)
                value = member[1]
            else:
                value = member
            break
        else:
            return "".join(parts)


def _newline(indent: "int | None", depth: int) -> str:
    return "" if indent is None else "\n" + " " * (indent * depth)
