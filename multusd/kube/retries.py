"""When a request to the API server is sent again: transient answers, Retry-After, jittered backoff.

Every node runs multusd, so what one node does after a transient answer, thousands do at once
(architecture invariant 9). API Priority and Fairness sheds load with 429 and ``Retry-After``;
a rolling API-server restart behind a load balancer shows as 502/503/504, refused
connections, resets and TLS connections closed without an answer. None of these should fail
an ADD that has time left, and none may be answered by sending everything again at once.

client-go's rest client (``rest/request.go``, ``rest/with_retry.go``) is the reference. Its
``IsNextRetry`` resends a request up to ``maxRetries`` (10) times when ``checkWait`` finds a
429 or a 5xx *with* an integer ``Retry-After`` (every verb: the server asked for it), waiting
that many seconds; and, through ``isErrRetryableFunc``, a GET (no other verb) whose connection
was reset or hit EOF, after an artificial ``Retry-After: 1``. Here (:func:`status_cause`,
:func:`connection_cause`, :class:`Attempts`; :class:`Backoff` for the reflectors' own loop):

* 429, and a 5xx with ``Retry-After``: every verb, as client-go; ``Retry-After`` as
  delta-seconds or an HTTP-date (client-go reads only seconds), waited for in full plus up to
  20% jitter, so that a fleet told "1" does not come back in the same millisecond;
* 500/502/503/504 without ``Retry-After``: GET and PUT (client-go: no retry). A load
  balancer in front of a restarting API server answers without ``Retry-After``, and a failed
  ADD costs the cluster more (the kubelet tears the sandbox down and starts again) than one
  retry. Never a POST: the server may have processed it;
* refused connections (client-go: no retry) and a connection cut while it was set up (TCP,
  the proxy's CONNECT, the TLS handshake: "TLS EOF") or while the request was being written:
  every verb, since the server has not read a whole request;
* reset, EOF or TLS EOF after the request was written: GET and PUT (client-go: GET). The
  one PUT multusd sends is ``pods/<name>/status`` with the pod's resourceVersion: if the
  first one had been applied, the resent one answers 409 and :mod:`multusd.kube.status`
  reads the pod again and finds the annotation written. An event POST is not resent;
* the wait: jittered exponential backoff (0.125-0.25 s, doubling to 2-4 s), never less than
  ``Retry-After`` (client-go waits a fixed 1 s after a connection error, in lockstep);
* bounded by the caller's deadline (its CNI request's, a ``time.monotonic()`` instant): no
  wait that would end past it, and no retry is started with less than :data:`MIN_ATTEMPT`
  left; the request fails then with the last answer, as it would have without retries; and
  at most :data:`MAX_RETRIES` retries, as client-go.
"""

from __future__ import annotations

import email.utils
import http.client
import random
import ssl
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Dict, Optional

from multusd.kube.connections import TunnelError

MAX_RETRIES = 10  # client-go's default maxRetries
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 4.0
RETRY_AFTER_JITTER = 0.2
MIN_ATTEMPT = 0.05  # seconds an attempt needs at least; less left: give up instead
RETRY_STATUSES = frozenset({500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

# where an attempt failed: setting up the connection, writing the request, awaiting the answer
CONNECT, SEND, ANSWER = "connect", "send", "answer"
# the causes counted (a bounded set: they are a metric's label values)
CAUSES = ("429", "500", "502", "503", "504", "5xx", "refused", "reset", "closed", "tls-eof",
          "proxy")


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP-date; None if
    absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):  # 3.9 raises TypeError, 3.10+ ValueError
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def status_cause(method: str, status: int, retry_after: Optional[float]) -> Optional[str]:
    """The cause to count when an answer with ``status`` is to be retried, else None."""
    if status == 429:
        return "429"  # API Priority and Fairness rejects before any handler ran
    if status < 500:
        return None
    label = str(status) if status in RETRY_STATUSES else "5xx"
    if retry_after is not None:
        return label  # the server asks for it, whatever the verb (client-go's checkWait)
    if status in RETRY_STATUSES and method in IDEMPOTENT:
        return label
    return None


def connection_failure(exc: BaseException) -> Optional[str]:
    """What kind of transient connection failure ``exc`` is (a cause), or None."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TunnelError):
        return "proxy" if exc.status in (502, 503, 504) else None
    if isinstance(exc, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return "closed"  # ended without (a whole) answer
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "tls-eof"
    if isinstance(exc, ssl.SSLError):
        return "tls-eof" if "EOF" in str(getattr(exc, "reason", "") or "") else None
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return "reset"
    return None


def connection_cause(exc: BaseException, phase: str, method: str) -> Optional[str]:
    """The cause to count when a request that failed with ``exc`` in ``phase`` is to be sent
    again, else None (not transient, or a POST the server may have processed)."""
    cause = connection_failure(exc)
    if cause is None or (phase == ANSWER and method not in IDEMPOTENT):
        return None
    return cause


class Attempts:
    """The retries of one request: how many so far, the next wait, the time left.

    :param deadline: when the whole request, retries and waits included, must be over (a
        ``time.monotonic()`` instant, or one of ``clock``).
    """

    def __init__(self, deadline: float, *, max_retries: int = MAX_RETRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline = deadline
        self.max_retries = max_retries
        self.retries = 0
        self._clock = clock
        self.started = clock()

    @property
    def count(self) -> int:
        """Attempts made so far (the first one included)."""
        return self.retries + 1

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.deadline - self._clock()

    def pause(self, retry_after: Optional[float] = None) -> Optional[float]:
        """Seconds to wait before the next attempt, or None if none fits (count, deadline)."""
        if self.retries >= self.max_retries:
            return None
        step = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** self.retries)
        delay = step / 2 + random.uniform(0, step / 2)
        if retry_after is not None:
            delay = max(delay, retry_after * random.uniform(1.0, 1.0 + RETRY_AFTER_JITTER))
        if delay + MIN_ATTEMPT > self.left():
            return None  # honoured, it would end past the deadline: fail now, not later
        self.retries += 1
        return delay


class Backoff:
    """Exponential backoff with jitter between the attempts of a loop that never gives up (a
    reflector's): each delay at random between half and all of the current step, so that
    many nodes spread out; the step doubles up to ``maximum`` and is reset after a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.current = initial

    def next(self) -> float:
        delay = self.current * random.uniform(0.5, 1.0)
        self.current = min(self.current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.current = self.initial


class RetryCounts:
    """Retries by cause, over the transport's life (thread-safe; the causes are bounded)."""

    def __init__(self) -> None:
        self._counts: Dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, cause: str) -> None:
        with self._lock:
            self._counts[cause] = self._counts.get(cause, 0) + 1

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)
