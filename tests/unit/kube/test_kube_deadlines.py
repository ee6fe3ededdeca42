"""multusd.kube.deadlines: the watchdog's alarms and the socket cut, on real sockets."""

from __future__ import annotations

import socket
import threading
import time

from multusd.kube.deadlines import SocketCut, Watchdog, left, within
from testlib import wait_for


def test_deadlines_are_instants_and_the_earliest_wins():
    now = time.monotonic()
    assert within(100.0, now + 1) == now + 1
    assert now + 1 < within(1.0) <= time.monotonic() + 1
    assert left(now - 1) < 0 < left(now + 60)


def test_the_watchdog_runs_alarms_in_order_and_never_a_cancelled_one():
    watchdog = Watchdog("test-watchdog")
    ran = []
    done = threading.Event()
    now = time.monotonic()
    watchdog.arm(now + 0.2, lambda: ran.append("late"))
    cancelled = watchdog.arm(now + 0.1, lambda: ran.append("cancelled"))
    watchdog.arm(now + 0.05, lambda: ran.append("early"))
    watchdog.arm(now + 0.3, done.set)
    cancelled.cancel()
    assert done.wait(10)
    assert ran == ["early", "late"] and watchdog.pending() == 0


def test_an_action_that_raises_does_not_stop_the_watchdog(caplog):
    watchdog = Watchdog("test-watchdog")
    done = threading.Event()
    watchdog.arm(time.monotonic(), lambda: 1 / 0)
    watchdog.arm(time.monotonic() + 0.05, done.set)
    assert done.wait(10)
    assert "a deadline action failed" in caplog.text


def test_a_cut_ends_a_blocked_read_at_its_deadline():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        cut = SocketCut(time.monotonic() + 0.2, describe=lambda: "reading")
        cut.hold(ours)
        ours.settimeout(60)  # the read's own timeout would take a minute
        assert ours.recv(1) == b""  # shut down: the read ends
        assert cut.release() is True and cut.fired and cut.fired_during == "reading"


def test_a_cut_released_in_time_leaves_its_socket_alone():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        cut = SocketCut(time.monotonic() + 0.2)
        cut.hold(ours)
        assert cut.release() is False
        wait_for(lambda: time.monotonic() > cut.deadline + 0.1, 5, what="the deadline to pass")
        theirs.sendall(b"x")
        ours.settimeout(5)
        assert ours.recv(1) == b"x" and not cut.fired


def test_a_socket_held_after_the_deadline_is_cut_at_once():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        cut = SocketCut(time.monotonic())
        wait_for(lambda: cut.fired, 5, what="the cut to fire")
        cut.hold(ours)
        ours.settimeout(60)
        assert ours.recv(1) == b""
        cut.release()


def test_the_cut_shuts_down_its_own_connection_even_when_the_number_was_reused():
    ours, theirs = socket.socketpair()
    cut = SocketCut(time.monotonic() + 0.3)
    cut.hold(ours)
    ours.close()
    theirs.close()
    other, peer = socket.socketpair()  # likely to get the closed socket's number
    with other, peer:
        wait_for(lambda: cut.fired, 5, what="the cut to fire")
        peer.sendall(b"y")
        other.settimeout(5)
        assert other.recv(1) == b"y"  # untouched, though it may have the closed number
        assert cut.release() is True
