"""What ``multusd generate-config`` wrote, so that package removal deletes only that.

Upstream's daemon writes a ``00-multus.conf`` byte-identical to ours for the same config (and
rewrites it in place, with ``os.WriteFile``), so content alone cannot tell whose file it is.
Each write is recorded here with the file's SHA-256, size, inode and modification time; a file
is multusd's while all four still match. Anything that rewrote it since (upstream's daemon,
its installer, an operator), even with the same bytes, changed its mtime: the file is theirs.

The record is ``$STATE_DIRECTORY/written.json`` (systemd sets ``STATE_DIRECTORY`` for a unit
with ``StateDirectory=multusd``), else ``/var/lib/multusd/written.json``; package purge
deletes that directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Dict, Optional

from multusd import store
from multusd.errors import IOFailure

LOG = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/multusd"
RECORD_NAME = "written.json"


def state_dir() -> str:
    """``$STATE_DIRECTORY`` (its first entry), else :data:`DEFAULT_STATE_DIR`."""
    value = os.environ.get("STATE_DIRECTORY", "")
    return value.split(":")[0] if value else DEFAULT_STATE_DIR


def record_path() -> str:
    return os.path.join(state_dir(), RECORD_NAME)


def remember(path: str) -> None:
    """Record ``path`` as multusd's, as it is now on disk (call right after writing it).

    A record that cannot be written is logged, not raised: the file itself was written, and
    the only cost is that package removal will leave it in place.
    """
    facts = _facts(path)
    if facts is None:
        return
    records = _load()
    if records.get(os.path.abspath(path)) == facts:
        return
    records[os.path.abspath(path)] = facts
    try:
        store.atomic_write(record_path(), json.dumps(records, indent=1, sort_keys=True).encode(),
                           mode=0o600, dir_mode=0o755, durable=False)
    except (IOFailure, OSError) as exc:  # store.atomic_write raises IOFailure
        LOG.warning("cannot record that multusd wrote %s in %s (%s): package removal will "
                    "leave it in place", path, record_path(), _reason(exc))


def is_ours(path: str) -> bool:
    """True when ``path`` is exactly as multusd last wrote it (bytes, inode and mtime)."""
    recorded = _load().get(os.path.abspath(path))
    return recorded is not None and recorded == _facts(path)


def is_recorded(path: str) -> bool:
    """True when multusd wrote ``path`` at some point (whether or not it changed since)."""
    return os.path.abspath(path) in _load()


def forget(path: str) -> None:
    """Drop the record of ``path`` (after deleting the file)."""
    records = _load()
    if records.pop(os.path.abspath(path), None) is None:
        return
    try:
        store.atomic_write(record_path(), json.dumps(records, indent=1, sort_keys=True).encode(),
                           mode=0o600, dir_mode=0o755, durable=False)
    except (IOFailure, OSError) as exc:
        LOG.warning("cannot update %s: %s", record_path(), _reason(exc))


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "msg", None) or str(exc)


def _facts(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            digest = hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None
    return {"sha256": digest, "size": info.st_size, "ino": info.st_ino,
            "mtime_ns": info.st_mtime_ns}


def _load() -> Dict[str, Dict[str, Any]]:
    data = store.read_json_object(record_path(), "multusd's record of the files it wrote")
    return {k: v for k, v in (data or {}).items() if isinstance(v, dict)}
