"""multusd.daemon.server.ConnectionThreads: connections are served on reused threads."""

import socket
import threading

from testlib import wait_for

from multusd.daemon.server import ConnectionThreads


def served_by(count: int, hold: threading.Event = None) -> tuple:
    """Serve ``count`` connections (each until ``hold`` is set); the threads that did, one
    entry per connection."""
    idents, done = [], threading.Semaphore(0)

    def serve(conn: socket.socket) -> None:
        idents.append(threading.current_thread())
        if hold is not None:
            hold.wait(10)
        conn.close()
        done.release()

    threads = ConnectionThreads(serve)
    pairs = [socket.socketpair() for _ in range(count)]
    for ours, _ in pairs:
        threads.submit(ours)
        if hold is None:  # one after the other, each once the last thread is idle again
            assert done.acquire(timeout=10)
            wait_for(lambda: threads._idle == 1, 10, what="the thread waiting for more")
    if hold is not None:
        wait_for(lambda: len(idents) == count, 10, what="every connection being served")
        hold.set()
        for _ in range(count):
            assert done.acquire(timeout=10)
    for _, theirs in pairs:
        theirs.close()
    return idents, threads


def test_connections_one_after_the_other_reuse_one_thread():
    idents, threads = served_by(5)
    assert len(idents) == 5 and len(set(idents)) == 1
    threads.close()


def test_connections_at_once_get_a_thread_each_and_those_are_kept_idle():
    idents, threads = served_by(4, hold=threading.Event())
    assert len(set(idents)) == 4
    wait_for(lambda: threads._idle == 4, 10, what="the four threads waiting for more")
    threads.close()
    wait_for(lambda: not any(thread.is_alive() for thread in idents), 10,
             what="the idle threads to end")
