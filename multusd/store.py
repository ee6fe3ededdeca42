"""Files multusd writes: the one atomic-write helper, and the per-sandbox scratch cache.

Every file multusd writes goes through :func:`atomic_write`: a temp file in the same
directory, fsync, rename over the target, fsync of the directory. A reader sees the old
content or the new, never an empty or partial file.

The scratch cache is upstream's ``<cniDir>/<containerID>``: a JSON list of the delegates
of one sandbox, written before the first delegate runs, read back by DEL and CHECK.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from multusd.errors import IOFailure

LOG = logging.getLogger(__name__)


def atomic_write(path: str, data: bytes, mode: int = 0o600, dir_mode: int = 0o700,
                 sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; create its directory with ``dir_mode``.

    The file's data is always fsynced before the rename, so no crash can leave it empty or
    partial. ``sync_dir=False`` skips the directory fsync for files whose loss after a crash
    is recoverable (libcni's result cache: DEL falls back to the scratch cache); the rename
    is still atomic.

    :raises IOFailure: when the directory or the file cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=dir_mode, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    except OSError as exc:
        raise IOFailure(f"cannot write {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise IOFailure(f"cannot write {path}: {exc.strerror}") from exc
    if sync_dir:
        _fsync_dir(directory)


def read_json_object(path: str, what: str) -> dict | None:
    """The JSON object in ``path``; None when it is missing, or unreadable or not a JSON
    object (then a warning names ``what`` it was supposed to be: callers carry on without)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        LOG.warning("cannot read %s %s: %s", what, path, exc.strerror)
        return None
    try:
        value = json.loads(data)
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
