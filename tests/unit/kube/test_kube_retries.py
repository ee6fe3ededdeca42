"""multusd.kube.retries: what is sent again, Retry-After, the waits inside the deadline, and the
one backoff curve of every way back to the API server."""

from __future__ import annotations

import email.utils
import http.client
import ssl
import time

import pytest

from multusd.kube import retries
from multusd.kube.connections import TunnelError
from multusd.kube.retries import ANSWER, CONNECT, SEND, Attempts
from multusd.kube.transport import ApiError


class Clock:
    """A clock the test moves (Attempts takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("value,seconds", [
    ("3", 3.0), (" 0 ", 0.0), ("120", 120.0), (None, None), ("", None), ("-1", None),
    ("1.5", None), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past
    # digits Go's strconv.Atoi reads, no others: "2²" is no number (float() raised on it)
    ("2\u00b2", None), ("\u00b3", None), ("\u0663", None),
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


# ---- the one Retry-After rule, the one backoff --------------------------------------------------

@pytest.mark.parametrize("value,seconds", [
    (3, 3.0), (0, 0.0), (True, None), (-2, None), (float("nan"), None),
    ("86400", retries.RETRY_AFTER_MAX), (10 ** 9, retries.RETRY_AFTER_MAX),
])
def test_retry_after_from_a_status_is_seconds_by_the_same_rule_and_capped(value, seconds):
    assert retries.retry_after_seconds(value) == seconds


def test_a_far_http_date_is_capped():
    value = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert retries.retry_after_seconds(value) == retries.RETRY_AFTER_MAX


def test_the_api_server_curve_is_client_gos_reflector():
    policy = retries.API_SERVER
    assert (policy.initial, policy.factor, policy.cap, policy.jitter, policy.calm) == \
        (0.8, 2.0, 30.0, 1.0, 120.0)
    assert [policy.step(n) for n in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert policy.step(10 ** 6) == 30.0  # a year of failures does not overflow
    assert policy.wait(0, rand=lambda: 0.0) == 0.8
    assert policy.wait(0, rand=lambda: 0.999999) < 1.6  # [d, 2d)


def test_retry_after_is_a_floor_never_a_bypass():
    policy = retries.API_SERVER
    assert policy.wait(0, at_least=5.0, rand=lambda: 0.0) == 5.0
    assert policy.wait(0, at_least=5.0, rand=lambda: 0.5) == 5.0 * (1 + retries.RETRY_AFTER_JITTER
                                                                     * 0.5)
    assert policy.wait(5, at_least=1.0, rand=lambda: 0.0) == 25.6  # the curve, if longer
    assert policy.wait(0, at_least=10 ** 6, rand=lambda: 0.0) == retries.RETRY_AFTER_MAX


def test_the_request_curve_keeps_the_numbers_attempts_always_had():
    for n in range(12):
        step = min(retries.BACKOFF_MAX, retries.BACKOFF_FIRST * 2 ** n)
        assert retries.REQUEST.wait(n, rand=lambda: 0.0) == step / 2
        assert step / 2 <= retries.REQUEST.wait(n) < step


def test_delays_count_a_run_of_failures_and_only_calm_ends_it():
    clock = Clock()
    delays = retries.API_SERVER.delays(clock=clock)
    assert delays.calm() and delays.failures == 0 and delays.streak == 0
    for _ in range(3):
        delays.next()
        clock.now += 100.0  # answers in between change nothing
    assert (delays.failures, delays.streak) == (3, 1) and not delays.calm()
    clock.now += 20.0  # 120 s after the last failure
    assert delays.calm()
    assert 0.8 <= delays.next() < 1.6 and (delays.failures, delays.streak) == (1, 2)


def test_retry_after_of_reads_the_header_then_the_status():
    header = ApiError(429, "Too Many Requests", '{"details":{"retryAfterSeconds":9}}',
                      {"Retry-After": "2"})
    assert retries.retry_after_of(header) == 2.0
    body = ApiError(503, "Unavailable", '{"details":{"retryAfterSeconds":9}}')
    assert retries.retry_after_of(body) == 9.0
    assert retries.retry_after_of(ApiError(503, "Unavailable", "not json")) is None
    assert retries.retry_after_of(ConnectionRefusedError(111, "refused")) is None


def test_a_starting_servers_answers_wait_on_the_first_step_or_its_retry_after():
    policy = retries.API_SERVER
    assert policy.starting == retries.MAX_RETRIES  # as client-go's rest client resends a 429
    assert policy.first_wait(rand=lambda: 0.0) == 0.8
    assert policy.first_wait(rand=lambda: 0.999999) < 1.6  # the first step, jittered
    assert policy.first_wait(1.0, rand=lambda: 0.0) == 1.0  # what the server asked for ...
    assert policy.first_wait(1.0, rand=lambda: 0.999999) < 1.0 * (1 + retries.RETRY_AFTER_JITTER)
    assert policy.first_wait(0.1, rand=lambda: 0.0) == 0.8  # ... never under the first step
    assert policy.first_wait(0.0, rand=lambda: 0.0) == 0.8
    assert policy.first_wait(10 ** 6, rand=lambda: 0.0) == retries.RETRY_AFTER_MAX


def test_a_starting_server_does_not_grow_the_curve_for_its_allowance_per_run():
    clock = Clock()
    delays = retries.API_SERVER.delays(clock=clock)
    wait = delays.next()  # the watch cut by the restart: a failure as any
    clock.now += wait
    for _ in range(retries.API_SERVER.starting):
        assert not delays.starting_spent
        wait = delays.next(1.0, starting=True)
        assert 1.0 <= wait < 1.2  # its Retry-After, not the grown step
        clock.now += wait
    assert delays.failures == 1 and delays.starting_spent
    # still "starting" past its allowance: a failure as any, the curve growing from where it was
    assert 1.6 <= delays.next(1.0, starting=True) < 3.2
    assert 3.2 <= delays.next(starting=True) < 6.4 and delays.failures == 3
    clock.now += retries.API_SERVER.calm + 1.0  # calm: a new run, with its allowance again
    assert not delays.starting_spent
    assert 0.8 <= delays.next(starting=True) < 1.6 and delays.failures == 0
    assert delays.starts == 1 and delays.streak == 2
