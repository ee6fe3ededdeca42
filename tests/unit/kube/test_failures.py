"""multusd.kube.failures: what a failed round is, and what the next round asks for after it.

The plan is pure (no wait in it: every failure waits on the one backoff, see
test_reflector_backoff.py); this is its table, and the mapping of every exception a round
can raise to a kind.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl

import pytest

from multusd.kube import failures
from multusd.kube.clientconfig import WatchError
from multusd.kube.failures import NoWatchList, Plan, Unfinished, kind_of, plan
from multusd.kube.reflector import REOPEN_CAUSES
from multusd.kube.transport import ApiError, IdleTimeout
from multusd.kube.watchstream import Expired, TooLarge

INITIALIZING_BODY = json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests",
                                "message": "storage is (re)initializing",
                                "details": {"retryAfterSeconds": 1}})
TOO_LARGE_BODY = json.dumps({"code": 504, "message": "Too large resource version: 9, current: 2",
                             "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}})


@pytest.mark.parametrize("kind,syncing,expected", [
    # a watch found its history gone: the whole state again, at the version it had
    (failures.EXPIRED, False, Plan(True, False, True, "expired")),
    # a relist at that version answered 410: from the current state, never the same again
    (failures.EXPIRED, True, Plan(True, True, False, "expired")),
    (failures.TOO_LARGE, False, Plan(True, True, True, "expired")),
    (failures.TOO_LARGE, True, Plan(True, True, False, "expired")),
    # an ERROR event ends in a relist (client-go), whatever came before it in the stream
    (failures.EVENT, False, Plan(True, False, False, "error")),
    (failures.EVENT, True, Plan(True, False, False, "error")),
    (failures.NO_WATCH_LIST, True, Plan(True, False, False, "error")),
    # the rest ask again for what failed: the watch from its version, or the sync
    (failures.UNREACHABLE, False, Plan(False, False, False, "connection")),
    (failures.UNREACHABLE, True, Plan(True, False, False, "connection")),
    (failures.ANSWERED, False, Plan(False, False, False, "error")),
    (failures.ANSWERED, True, Plan(True, False, False, "error")),
    (failures.YOUNG, False, Plan(False, False, False, "ended")),
    (failures.UNFINISHED, True, Plan(True, False, False, "ended")),
    (failures.SILENT, False, Plan(False, False, False, "silence")),
    (failures.SILENT, True, Plan(True, False, False, "silence")),
    (failures.MALFORMED, False, Plan(False, False, False, "error")),
    (failures.UNEXPECTED, False, Plan(False, False, False, "error")),
    # a server that is starting: its new watch cache does not hold the version to resume from
    (failures.STARTING, False, Plan(True, False, False, "error")),
    (failures.STARTING, True, Plan(True, False, False, "error")),
])
def test_what_the_next_round_asks_for(kind, syncing, expected):
    assert plan(kind, syncing) == expected


@pytest.mark.parametrize("kind", failures.KINDS)
@pytest.mark.parametrize("syncing", [False, True])
def test_every_kind_has_a_plan_and_a_reopen_cause(kind, syncing):
    step = plan(kind, syncing)
    assert step.cause in REOPEN_CAUSES
    assert step.relist or not syncing  # a failed sync is never taken for a synced state
    assert not (step.stale and syncing)  # a cache is made stale once, by the watch that found it


@pytest.mark.parametrize("exc,kind", [
    (TooLarge("too large"), failures.TOO_LARGE),
    (Expired("too old"), failures.EXPIRED),
    (NoWatchList("422"), failures.NO_WATCH_LIST),
    (Unfinished("cut short"), failures.UNFINISHED),
    (WatchError(500, "etcdserver: leader changed", "InternalError"), failures.EVENT),
    (WatchError(429, "slow down", "TooManyRequests"), failures.EVENT),
    (IdleTimeout(), failures.SILENT),
    (ApiError(410, "Gone"), failures.EXPIRED),
    (ApiError(504, "Gateway Timeout", TOO_LARGE_BODY), failures.TOO_LARGE),
    (ApiError(504, "Gateway Timeout", "{}"), failures.ANSWERED),
    (ApiError(429, "Too Many Requests"), failures.ANSWERED),
    (ApiError(403, "Forbidden"), failures.ANSWERED),
    (ConnectionRefusedError(111, "refused"), failures.UNREACHABLE),
    (ConnectionResetError(104, "reset"), failures.UNREACHABLE),
    (socket.timeout("timed out"), failures.UNREACHABLE),
    (ssl.SSLEOFError(8, "EOF"), failures.UNREACHABLE),
    (http.client.IncompleteRead(b""), failures.UNREACHABLE),
    (http.client.RemoteDisconnected("closed"), failures.UNREACHABLE),
    (json.JSONDecodeError("bad", "{", 0), failures.MALFORMED),
    (ValueError("invalid chunk"), failures.MALFORMED),
    (KeyError("a bug"), failures.UNEXPECTED),
])
def test_every_exception_of_a_round_is_a_kind(exc, kind):
    assert kind_of(exc) == kind


@pytest.mark.parametrize("exc,served,kind", [
    # the watch cache says it is initialising: a server starting, whoever asks
    (ApiError(429, "Too Many Requests", INITIALIZING_BODY), False, failures.STARTING),
    (WatchError(429, "storage is (re)initializing", "TooManyRequests"), False,
     failures.STARTING),
    # Priority and Fairness turning requests away: an overloaded server, on the curve
    (ApiError(429, "Too Many Requests", json.dumps({"message": "Too many requests, please try "
                                                               "again later."})), True,
     failures.ANSWERED),
    # 403 to what the server served before: its authorizer has not loaded the roles yet
    (ApiError(403, "Forbidden"), True, failures.STARTING),
    (ApiError(403, "Forbidden"), False, failures.ANSWERED),  # never served: RBAC says no
    (ApiError(401, "Unauthorized"), True, failures.ANSWERED),
    (ApiError(500, "Internal Server Error"), True, failures.ANSWERED),
    (ApiError(410, "Gone"), True, failures.EXPIRED),
])
def test_a_server_that_is_starting_is_told_by_its_answer_and_what_it_served(exc, served, kind):
    assert kind_of(exc, served) == kind
