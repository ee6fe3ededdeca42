"""What multusd writes and how: the one atomic-write helper and its JSON-file reader.

Every file multusd writes goes through :func:`atomic_write` (but the systemd generator's
drop-in, written once into a fresh tmpfs): a temp file in the same directory, fsync, rename
over the target, fsync of the directory. The fsyncs are skipped for libcni's result cache
(libcni never fsyncs it) and the kubeconfig's ``-data`` files (rewritten at every start), and
left to a :class:`Flush` for the scratch cache (it runs while the plugins do). A reader sees
the old content or the new, never an empty or partial file; JSON files are read as Go reads
them (:func:`multusd.go_loads`) and written as Go writes them (:func:`multusd.go_json`: what
must match upstream's bytes, 00-multus.conf, the scratch cache, delegate configs, the
network-status annotation). :mod:`multusd.store.valueclass`
holds the frozen value classes the data is kept in on its way (declared as dataclasses are).
"""

from __future__ import annotations

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

