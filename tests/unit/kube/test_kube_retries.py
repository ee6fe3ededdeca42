"""multusd.kube.retries: what is sent again, Retry-After, and the waits inside the deadline."""

from __future__ import annotations

import email.utils
import http.client
import ssl
import time

import pytest

from multusd.kube import retries
from multusd.kube.connections import TunnelError
from multusd.kube.retries import ANSWER, CONNECT, SEND, Attempts


class Clock:
    """A clock the test moves (Attempts takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("value,seconds", [
    ("3", 3.0), (" 0 ", 0.0), ("120", 120.0), (None, None), ("", None), ("-1", None),
    ("1.5", None), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past
])
def test_retry_after_is_seconds_or_an_http_date(value, seconds):
    assert retries.retry_after_seconds(value) == seconds


def test_retry_after_as_a_future_http_date():
    value = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retries.retry_after_seconds(value) <= 30


@pytest.mark.parametrize("method,status,retry_after,cause", [
    ("GET", 429, None, "429"), ("POST", 429, None, "429"), ("POST", 429, 2.0, "429"),
    ("GET", 500, None, "500"), ("PUT", 502, None, "502"), ("GET", 503, None, "503"),
    ("GET", 504, None, "504"), ("POST", 503, None, None), ("POST", 500, None, None),
    ("POST", 503, 1.0, "503"), ("GET", 501, None, None), ("GET", 501, 1.0, "5xx"),
    ("GET", 404, None, None), ("GET", 409, 1.0, None), ("GET", 401, None, None),
])
def test_which_answers_are_retried(method, status, retry_after, cause):
    assert retries.status_cause(method, status, retry_after) == cause


@pytest.mark.parametrize("error,kind", [
    (ConnectionRefusedError(111, "refused"), "refused"),
    (ConnectionResetError(104, "reset"), "reset"),
    (BrokenPipeError(32, "pipe"), "reset"),
    (http.client.RemoteDisconnected("closed"), "closed"),
    (http.client.IncompleteRead(b"{", 10), "closed"),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), "tls-eof"),
    (TunnelError(503, "Service Unavailable"), "proxy"),
    (TunnelError(407, "Proxy Authentication Required"), None),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), None),
    (TimeoutError("timed out"), None),
    (OSError(113, "No route to host"), None),
    (http.client.BadStatusLine("garbage"), None),
])
def test_which_connection_failures_are_transient(error, kind):
    assert retries.connection_failure(error) == kind


@pytest.mark.parametrize("phase", [CONNECT, SEND, ANSWER])
@pytest.mark.parametrize("method", ["GET", "PUT", "POST"])
def test_a_post_is_resent_only_if_it_was_not_written_whole(phase, method):
    cause = retries.connection_cause(ConnectionResetError(104, "reset"), phase, method)
    assert cause == (None if phase == ANSWER and method == "POST" else "reset")


def test_backoff_doubles_with_jitter_up_to_its_maximum():
    attempts = Attempts(Clock().now + 1000.0, clock=Clock())
    delays = [attempts.pause() for _ in range(retries.MAX_RETRIES)]
    for n, delay in enumerate(delays):
        step = min(retries.BACKOFF_MAX, retries.BACKOFF_FIRST * 2 ** n)
        assert step / 2 <= delay <= step
    assert attempts.pause() is None  # MAX_RETRIES, as client-go
    assert attempts.count == retries.MAX_RETRIES + 1


def test_retry_after_is_honoured_and_jittered_upwards():
    attempts = Attempts(Clock().now + 1000.0, clock=Clock())
    for _ in range(20):
        assert 3.0 <= attempts.pause(3.0) <= 3.0 * (1 + retries.RETRY_AFTER_JITTER)
        attempts.retries = 0


def test_no_wait_ends_past_the_deadline():
    clock = Clock()
    attempts = Attempts(clock.now + 2.0, clock=clock)  # a deadline: an instant of the clock
    assert attempts.pause(5.0) is None  # Retry-After past the deadline: give up now
    assert attempts.retries == 0
    total = 0.0
    while True:
        delay = attempts.pause()
        if delay is None:
            break
        clock.now += delay
        total += delay
        assert attempts.left() >= retries.MIN_ATTEMPT
    assert total <= 2.0 - retries.MIN_ATTEMPT


def test_attempts_count_down_to_an_instant_not_from_their_start():
    clock = Clock()
    attempts = Attempts(clock.now + 3.0, clock=clock)
    clock.now += 1.0
    assert attempts.left() == 2.0
    clock.now += 5.0
    assert attempts.left() == -3.0 and attempts.pause() is None


def test_retry_counts_are_kept_by_cause():
    counts = retries.RetryCounts()
    for cause in ("503", "429", "503"):
        counts.add(cause)
    snapshot = counts.snapshot()
    counts.add("reset")
    assert snapshot == {"503": 2, "429": 1}
