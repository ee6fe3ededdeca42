"""multusd.kube.watchstream: framing of watch events, expiry and Retry-After read off answers,
waking a blocked reader, and what the reflectors of one server share (WatchState)."""

from __future__ import annotations

import email.utils
import json
import socket
import threading
import time
from typing import Iterator, List

import pytest

from multusd.kube import retries, watchstream
from multusd.kube.clientconfig import WatchError
from multusd.kube.transport import ApiError
from multusd.kube.watchstream import (Expired, TooLarge, WatchState, answer, gone, retry_after,
                                      shutdown_response, status_of, too_large, too_large_error,
                                      watch_events)

TOO_LARGE_STATUS = {"kind": "Status", "code": 504, "reason": "Timeout",
                    "message": "Timeout: Too large resource version: 50, current: 7",
                    "details": {"causes": [{"reason": "ResourceVersionTooLarge"}],
                                "retryAfterSeconds": 1}}


class Chunks:
    """A response whose body arrives in these chunks (what watch_events reads: stream())."""

    def __init__(self, chunks: List[bytes]) -> None:
        self.chunks = chunks

    def stream(self) -> Iterator[bytes]:
        yield from self.chunks


def api_error(status: int, body: object = "", headers: dict = None) -> ApiError:
    text = body if isinstance(body, str) else json.dumps(body)
    return ApiError(status, "Reason", text, headers or {})


# ---- framing --------------------------------------------------------------------------------

def test_events_are_split_by_lines_whatever_the_chunks():
    events = [{"type": "ADDED", "object": {"n": i}} for i in range(3)]
    lines = [json.dumps(e).encode() for e in events]
    chunks = [lines[0][:5], lines[0][5:] + b"\n" + lines[1][:4], lines[1][4:] + b"\n\n",
              b"  \n" + lines[2]]  # blank lines skipped; the last one unterminated
    assert list(watch_events(Chunks(chunks))) == events


def test_events_come_as_they_arrive_not_when_the_stream_ends():
    gate = threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b'{"type":"ADDED","object":{}}\n'
        gate.wait(10)
        yield b'{"type":"DELETED","object":{}}\n'

    class Live:
        def stream(self) -> Iterator[bytes]:
            return chunks()

    events = watch_events(Live())
    assert next(events)["type"] == "ADDED"  # before the second chunk was even produced
    gate.set()
    assert next(events)["type"] == "DELETED"


def test_a_line_that_is_not_json_raises_value_error():
    with pytest.raises(ValueError):
        list(watch_events(Chunks([b'{"type":"ADDED"}\n{not json\n'])))


def test_an_empty_stream_has_no_events():
    assert list(watch_events(Chunks([]))) == [] and list(watch_events(Chunks([b"\n"]))) == []


# ---- what an answer says ------------------------------------------------------------------------

def test_too_large_is_told_by_its_cause_or_its_message():
    assert too_large(TOO_LARGE_STATUS)
    assert too_large({"message": "too large resource version: 9, current: 3"})
    assert too_large({"details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}})
    assert not too_large({"code": 504, "message": "Timeout: request did not complete"})
    assert not too_large({"details": {"causes": ["not a dict"]}})


def test_too_large_error_is_a_504_that_says_so():
    assert too_large_error(api_error(504, TOO_LARGE_STATUS))
    assert not too_large_error(api_error(504, {"message": "Timeout"}))
    assert not too_large_error(api_error(500, TOO_LARGE_STATUS))
    assert not too_large_error(OSError("no answer"))


def test_status_of_an_answer_without_one_is_empty():
    assert status_of(api_error(500, "plain text")) == {}
    assert status_of(OSError("refused")) == {}
    assert status_of(api_error(504, TOO_LARGE_STATUS))["code"] == 504


def test_gone_is_410_alone():
    assert gone(api_error(410, {"reason": "Expired"}))
    assert not gone(api_error(404)) and not gone(OSError("x"))
    assert issubclass(TooLarge, Expired)  # both mean: the version asked for is of no use


def test_answer_names_status_and_message_for_a_log_line():
    assert answer(api_error(422, {"message": "sendInitialEvents: Forbidden"})) == \
        "422 sendInitialEvents: Forbidden"
    assert answer(OSError("connection refused")) == "connection refused"


# ---- Retry-After: the one rule ------------------------------------------------------------------

def test_retry_after_from_the_header_the_status_or_an_error_event():
    assert retry_after(api_error(429, {}, {"Retry-After": "3"})) == 3.0
    assert retry_after(api_error(503, {"details": {"retryAfterSeconds": 2}})) == 2.0
    assert retry_after(api_error(503, {})) is None
    event = WatchError(500, "etcdserver: leader changed", "InternalError")
    assert retry_after(event) is None
    event.retry_after = retries.retry_after_seconds(5)  # as the reflector reads an ERROR event
    assert retry_after(event) == 5.0


def test_retry_after_is_capped_and_reads_http_dates_as_the_transport_does():
    huge = api_error(429, {}, {"retry-after": "86400"})
    assert retry_after(huge) == watchstream.RETRY_AFTER_MAX == retries.RETRY_AFTER_MAX
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25.0 <= retry_after(api_error(503, {}, {"Retry-After": soon})) <= 30.0
    assert retry_after(api_error(503, {"details": {"retryAfterSeconds": 10 ** 6}})) == \
        retries.RETRY_AFTER_MAX
    for header in ("soon", "-1", "1.5"):  # unreadable: as if absent
        assert retry_after(api_error(503, {}, {"Retry-After": header})) is None


# ---- waking a reader, shared state --------------------------------------------------------------

def test_shutdown_wakes_a_thread_blocked_reading_the_socket():
    ours, theirs = socket.socketpair()
    try:
        class Response:
            sock = ours

        done = threading.Event()

        def read() -> None:
            ours.recv(10)  # blocks: the peer sends nothing
            done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        shutdown_response(Response())
        assert done.wait(10)
        shutdown_response(Response())  # again, on a socket shut down already: no error
    finally:
        ours.close()
        theirs.close()

    class Closed:
        sock = None

    shutdown_response(Closed())  # an answer whose socket is gone: nothing to do


def test_watch_state_starts_unsynced_and_stop_wakes_every_reflector():
    state = WatchState(kinds=("pods", "nads"))
    assert state.prober == "pods" and state.watch_list is None
    assert not state.all_synced() and state.errors == {"pods": None, "nads": None}
    with state.cond:
        assert state.set_watch_list(False) is True  # the first verdict is news
        assert state.set_watch_list(False) is False  # the same again is not
        assert state.set_watch_list(True) is True  # a change is
    state.synced.update(pods=True, nads=True)
    assert state.all_synced()
    state.stop()
    assert state.stopping.is_set() and all(e.is_set() for e in state.wake.values())
