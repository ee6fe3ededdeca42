"""What a list or watch answer says, as the reflectors read it: its events, expiry, Retry-After.

* :func:`watch_events`: the JSON events of a chunked watch response, one per line, as they
  arrive (whatever the chunks); :func:`shutdown_response` wakes a thread blocked reading one;
* :class:`Expired` and :class:`TooLarge`: the version a watch or list asked for is not in the
  server's history (410), or beyond it ("Too large resource version", 504 with the cause
  ResourceVersionTooLarge, also as an ERROR event); :func:`gone`, :func:`too_large`,
  :func:`too_large_error` tell them from an answer;
* :func:`retry_after`: how long the server asked a client to wait (``Retry-After``, or the
  Status's ``retryAfterSeconds``), by :mod:`multusd.kube.retries`' one rule (capped at
  :data:`RETRY_AFTER_MAX`); :func:`answer`: the status and message of an error answer, for a
  log line;
* :class:`WatchState`: what the reflectors of one server share with their readers (the lock,
  sync flags, failures, counts, and whether the server streams lists).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

from multusd.kube import retries

Obj = Dict[str, Any]

RETRY_AFTER_MAX = retries.RETRY_AFTER_MAX


class Expired(Exception):
    """The watch's resourceVersion is not in the server's history (410): list again."""


class TooLarge(Expired):
    """The server's history is behind our version ("Too large resource version"): list
    consistently, the version we know is of no use to it."""


def too_large(status: Obj) -> bool:
    """kube-apiserver's "Too large resource version": its history starts after ours."""
    causes = (status.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "ResourceVersionTooLarge" for c in causes if
               isinstance(c, dict)) or "too large resource version" in \
        str(status.get("message", "")).lower()


def status_of(exc: BaseException) -> Obj:
    """The metav1.Status an error answer carried ({} if none)."""
    status_object = getattr(exc, "status_object", None)
    return status_object() if callable(status_object) else {}


def too_large_error(exc: BaseException) -> bool:
    """An error answer that is "Too large resource version"."""
    return getattr(exc, "status", None) == 504 and too_large(status_of(exc))


def answer(exc: BaseException) -> str:
    """The status and message of an error answer, for a log line."""
    message = status_of(exc).get("message") or getattr(exc, "reason", "") or exc
    return f"{getattr(exc, 'status', '')} {message}".strip()


def gone(exc: BaseException) -> bool:
    """410: Expired (or Gone, as servers before 1.18 said)."""
    return getattr(exc, "status", None) == 410


def retry_after(exc: BaseException) -> Optional[float]:
    """Seconds the server asked us to wait (``Retry-After``, or the Status's
    ``retryAfterSeconds``): :func:`multusd.kube.retries.retry_after_of`, the one rule. The
    jitter is the backoff's (:meth:`multusd.kube.retries.BackoffPolicy.wait`)."""
    return retries.retry_after_of(exc)


def watch_events(response: Any) -> Iterator[Obj]:
    """The JSON events of a chunked watch response, one per line, as they arrive."""
    pending = b""
    for chunk in response.stream():
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def shutdown_response(response: Any) -> None:
    """Wake a thread blocked reading ``response`` by shutting its socket down."""
    sock = getattr(response, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class WatchState:
    """What the reflectors share with their readers: one lock, sync flags, failures, counts."""

    def __init__(self, kinds: tuple = ("pods", "nads")) -> None:
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        # synced: the cache holds a complete list not known to be stale; listed: it did once
        self.synced: Dict[str, bool] = {kind: False for kind in kinds}
        self.listed: Dict[str, bool] = {kind: False for kind in kinds}
        self.errors: Dict[str, Optional[str]] = {kind: None for kind in kinds}
        self.error_status: Dict[str, Optional[int]] = {kind: None for kind in kinds}
        self.relists: Dict[str, int] = {kind: 0 for kind in kinds}  # after expiry
        self.reopens: Dict[Tuple[str, str], int] = {}  # (kind, cause): watch ends
        self.wake: Dict[str, threading.Event] = {kind: threading.Event() for kind in kinds}
        self.open_watches: Dict[str, Any] = {}
        # the server streams lists (WatchList): None not known yet, True it did, False it
        # does not (the reflectors list, then watch, for the life of the process); the first
        # kind's reflector finds out, the others wait for its verdict (bounded)
        self.watch_list: Optional[bool] = None
        self.prober = kinds[0]

    def set_watch_list(self, works: bool) -> bool:
        """Record whether the server streams lists (call with ``cond`` held); whether this
        is news (the first verdict, or a change)."""
        news = self.watch_list is not works
        self.watch_list = works
        self.cond.notify_all()
        return news

    def all_synced(self) -> bool:
        """Every cache holds a complete, not known stale, list (call with ``cond`` held)."""
        return all(self.synced.values())

    def stop(self) -> None:
        self.stopping.set()
        for event in self.wake.values():
            event.set()
