"""When the API server is asked again after a failure: one backoff, one Retry-After rule.

Every node runs multusd, so what one node does after a failure, thousands do at once
(architecture invariant 9). This module states the rule once:

* :class:`BackoffPolicy`, a value: the wait after the n-th failure in a row is
  ``initial * factor**n`` capped at ``cap``, times a random factor in ``[1, 1 + jitter)``,
  never less than the server's ``Retry-After`` (a floor, never a bypass; jittered upwards by up
  to :data:`RETRY_AFTER_JITTER`, so a fleet told "1" does not come back in the same
  millisecond). :data:`API_SERVER` is client-go's reflector curve (0.8 s doubling to 30 s,
  jitter 1.0: each wait in ``[d, 2d)``), for every way back to the server of a loop that never
  gives up (the reflectors); :data:`REQUEST` the one for the retries inside one request's
  deadline (:class:`Attempts`);
* :class:`Delays`, the state of a policy for one loop (its clock injected): it counts the
  failures in a row, and only a calm period (:attr:`BackoffPolicy.calm`, 120 s with no failure:
  the rule of apimachinery's ``NewExponentialBackoffManager``, not the sawtooth of the
  ``backoffManager`` that resets two minutes after its previous reset) starts the curve again.
  An answer does not: a server that answers and then fails at once is still failing. A server
  that says it is starting (:data:`multusd.kube.failures.STARTING`: 429 "storage is
  (re)initializing", a 403 to what it served before) is asked again on the curve's first step,
  or after its Retry-After (:meth:`BackoffPolicy.first_wait`), without growing it, for
  :attr:`BackoffPolicy.starting` such answers per run of failures; past them it is failing
  as any server (:attr:`Delays.starting_spent`);
* :func:`retry_after_seconds`: the one parser of ``Retry-After`` (delta-seconds or an
  HTTP-date; a Status's ``retryAfterSeconds`` by the same rule), capped at
  :data:`RETRY_AFTER_MAX`; :func:`retry_after_of` reads it off an error answer or ERROR event.

What a request sends again inside its deadline (:func:`status_cause`,
:func:`connection_cause`, :class:`Attempts`) follows client-go's rest client
(``rest/request.go``, ``rest/with_retry.go``). Its ``IsNextRetry`` resends a request up to
``maxRetries`` (10) times when ``checkWait`` finds a 429 or a 5xx *with* an integer
``Retry-After`` (every verb: the server asked for it), waiting that many seconds; and, through
``isErrRetryableFunc``, a GET (no other verb) whose connection was reset or hit EOF, after an
artificial ``Retry-After: 1``. Here:

* 429, and a 5xx with ``Retry-After``: every verb, as client-go; ``Retry-After`` as
  delta-seconds or an HTTP-date (client-go reads only seconds), waited for in full (the floor
  above);
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
* the wait: :data:`REQUEST` (0.125-0.25 s, doubling to 2-4 s), never less than
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
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Optional, Union

from multusd.kube.connections import TunnelError

MAX_RETRIES = 10  # client-go's default maxRetries
# the steps of REQUEST: its n-th wait lies in [BACKOFF_FIRST, 2 BACKOFF_FIRST) / 2 * 2**n, up to
# [BACKOFF_MAX / 2, BACKOFF_MAX)
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 4.0
RETRY_AFTER_JITTER = 0.2  # a Retry-After is waited for in full plus up to this share of it
# the longest Retry-After honoured: no request deadline is longer (the kubelet's CRI call gives
# up at 2 min), and a reflector that waited longer would outwait the calm period
RETRY_AFTER_MAX = 120.0
MIN_ATTEMPT = 0.05  # seconds an attempt needs at least; less left: give up instead
RETRY_STATUSES = frozenset({500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

# where an attempt failed: setting up the connection, writing the request, awaiting the answer
CONNECT, SEND, ANSWER = "connect", "send", "answer"
# the causes counted (a bounded set: they are a metric's label values)
CAUSES = ("429", "500", "502", "503", "504", "5xx", "refused", "reset", "closed", "tls-eof",
          "proxy")


def retry_after_seconds(value: Union[str, int, float, None]) -> Optional[float]:
    """Seconds from now a server asked a client to wait, capped at :data:`RETRY_AFTER_MAX`;
    None if absent or unreadable.

    A header's text is delta-seconds (digits only) or an HTTP-date (in the past: 0); a number
    (a Status's ``details.retryAfterSeconds``) is seconds. Negative values are unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if value < 0 or value != value else min(float(value), RETRY_AFTER_MAX)
    text = str(value).strip()
    if text.isascii() and text.isdigit():  # as Go's strconv.Atoi: "²" and "٣" are no digits
        return min(float(text), RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):  # 3.9 raises TypeError, 3.10+ ValueError
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return min(max(0.0, seconds), RETRY_AFTER_MAX)


def retry_after_of(answer: BaseException) -> Optional[float]:
    """Seconds an error answer or ERROR event asked for (:func:`retry_after_seconds`): its
    ``Retry-After`` header, else what it carries as ``retry_after``, else its Status's
    ``details.retryAfterSeconds``; None if it asked for nothing."""
    for name, text in (getattr(answer, "headers", None) or {}).items():
        if name.lower() == "retry-after":
            return retry_after_seconds(text)
    seconds = retry_after_seconds(getattr(answer, "retry_after", None))
    if seconds is not None:
        return seconds
    status_object = getattr(answer, "status_object", None)
    status: Any = status_object() if callable(status_object) else {}
    details = status.get("details") if isinstance(status, dict) else None
    if isinstance(details, dict):
        return retry_after_seconds(details.get("retryAfterSeconds"))
    return None


@dataclass(frozen=True)
class BackoffPolicy:
    """A backoff curve, as a value (see the module docstring).

    :param initial: the first step, in seconds.
    :param cap: the largest step.
    :param factor: each failure in a row multiplies the step by this.
    :param jitter: a wait is its step times a random factor in ``[1, 1 + jitter)``.
    :param calm: seconds with no failure after which the curve starts again.
    :param starting: answers of a server that is starting (:meth:`Delays.next`) waited on the
        first step, not growing the curve, per run of failures.
    """

    initial: float
    cap: float
    factor: float = 2.0
    jitter: float = 1.0
    calm: float = 120.0
    starting: int = 0

    def step(self, failures: int) -> float:
        """The step after ``failures`` earlier failures in a row (0: :attr:`initial`)."""
        return min(self.cap, self.initial * self.factor ** min(max(failures, 0), 64))

    def wait(self, failures: int, at_least: Optional[float] = None,
             rand: Callable[[], float] = random.random) -> float:
        """The wait after ``failures`` earlier failures in a row: the step, jittered; never
        less than ``at_least`` (a Retry-After: capped at :data:`RETRY_AFTER_MAX`, jittered
        upwards by up to :data:`RETRY_AFTER_JITTER`)."""
        wait = self.step(failures) * (1.0 + self.jitter * rand())
        if at_least is not None and at_least > 0:
            floor = min(at_least, RETRY_AFTER_MAX) * (1.0 + RETRY_AFTER_JITTER * rand())
            wait = max(wait, floor)
        return wait

    def first_wait(self, retry_after: Optional[float] = None,
                   rand: Callable[[], float] = random.random) -> float:
        """The wait of the first step: the server's Retry-After if it gave one (capped at
        :data:`RETRY_AFTER_MAX`, jittered upwards by up to :data:`RETRY_AFTER_JITTER`, never
        less than :attr:`initial`), else :attr:`initial` jittered as every step."""
        if retry_after is not None and retry_after > 0:
            asked = min(retry_after, RETRY_AFTER_MAX) * (1.0 + RETRY_AFTER_JITTER * rand())
            return max(self.initial, asked)
        return self.wait(0, None, rand)

    def delays(self, clock: Callable[[], float] = time.monotonic,
               rand: Callable[[], float] = random.random) -> "Delays":
        """A fresh state of this curve for one loop."""
        return Delays(self, clock, rand)


# client-go's reflector (NewReflectorWithOptions): every way back to the API server of a loop
# that never gives up (invariant 9); a starting server's answers are asked again on its first
# step as often as client-go's rest client resends a 429 with Retry-After (maxRetries)
API_SERVER = BackoffPolicy(initial=0.8, cap=30.0, factor=2.0, jitter=1.0, calm=120.0,
                           starting=MAX_RETRIES)
# the retries inside one request's deadline (Attempts): 0.125-0.25 s doubling to 2-4 s; a
# request's state lives as long as the request, so calm never comes into play
REQUEST = BackoffPolicy(initial=BACKOFF_FIRST / 2, cap=BACKOFF_MAX / 2, factor=2.0, jitter=1.0,
                        calm=float("inf"))


class Delays:
    """The state of one :class:`BackoffPolicy` in one loop: failures in a row, the last one.

    Call :meth:`next` on every failure, whatever came before it; nothing but a calm period
    (no failure for :attr:`BackoffPolicy.calm` seconds) starts the curve again, and gives a
    starting server its :attr:`BackoffPolicy.starting` answers on the first step again.
    """

    def __init__(self, policy: BackoffPolicy, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._clock, self._rand = clock, rand
        self.failures = 0  # failures in a row since the curve (re)started
        self.starts = 0  # a starting server's answers waited on the first step in this run
        self.streak = 0  # how many times the curve (re)started: one per run of failures
        self._last: Optional[float] = None  # when the last failure was

    def calm(self) -> bool:
        """No failure yet, or none for the calm period: the next one starts the curve again."""
        return self._last is None or self._clock() - self._last >= self.policy.calm

    @property
    def starting_spent(self) -> bool:
        """This run of failures has had its :attr:`BackoffPolicy.starting` answers of a
        starting server: one more is a failure as any (a 403 that lasts is a refusal)."""
        return not self.calm() and self.starts >= self.policy.starting

    def next(self, at_least: Optional[float] = None, *, starting: bool = False) -> float:
        """A failure happened now: the seconds to wait before the next attempt (never less
        than ``at_least``, the server's Retry-After).

        :param starting: the server said it is starting: the first step's wait, or its
            Retry-After (:meth:`BackoffPolicy.first_wait`), and the curve does not grow,
            unless this run had its :attr:`BackoffPolicy.starting` such answers already."""
        if self.calm():
            self.failures = self.starts = 0
            self.streak += 1
        self._last = self._clock()
        if starting and self.starts < self.policy.starting:
            self.starts += 1
            return self.policy.first_wait(at_least, self._rand)
        wait = self.policy.wait(self.failures, at_least, self._rand)
        self.failures += 1
        return wait


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

    @property
    def count(self) -> int:
        """Attempts made so far (the first one included)."""
        return self.retries + 1

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.deadline - self._clock()

    def pause(self, retry_after: Optional[float] = None) -> Optional[float]:
        """Seconds to wait before the next attempt (:data:`REQUEST`, ``retry_after`` a floor),
        or None if none fits (count, deadline)."""
        if self.retries >= self.max_retries:
            return None
        delay = REQUEST.wait(self.retries, retry_after)
        if delay + MIN_ATTEMPT > self.left():
            return None  # honoured, it would end past the deadline: fail now, not later
        self.retries += 1
        return delay


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
