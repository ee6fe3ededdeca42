"""The queue of CNI requests waiting for a worker: a DEL/STATUS lane beside the general one.

Requests are run by a bounded set of worker threads, started as they are needed and kept.
``workers`` threads take any request, DEL and STATUS first; ``fast_workers`` more (at least
one) take only DEL and STATUS. A DEL frees what a node has too little of, so it never waits
behind an ADD: every thread takes a waiting DEL before anything else, and the CPU gate below
never holds one back; a DEL waits only while every thread runs another request and the DEL
lane's threads all run DELs.

One sandbox's requests run in the order they came, one at a time (invariant 5; nothing else
in the daemon serialises them): a request whose container ID (:func:`~multusd.daemon.httpreq.
peek_env`, the ID the request acts on) has another queued or running is parked behind it and
holds no thread. The number waiting, parked ones included, is bounded; :meth:`Lanes.submit`
says when it is full.

Past ``busy_limit`` requests running on the general threads (twice the CPUs this process may
use, at least 4), one more request other than a DEL starts there only while the CPUs have time
to spare: the run queue (``procs_running`` of /proc/stat) is no longer than the CPUs. A request
is CPU-bound for about half of its time (its plugins, the daemon's own work), so two per CPU
keep every CPU busy and more only make every process of the node wait longer for one (in the
reboot burst, on 2 CPUs: /healthz p99 42-52 ms with 4 running against 170-190 ms with 16, in
the same total time); requests whose plugins mostly wait (DHCP) leave the run queue short, so
up to ``workers`` of them run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

LOG = logging.getLogger(__name__)
FAST_COMMANDS = ("DEL", "STATUS")
_GENERAL, _FAST = 0, 1
CPU_RECHECK = 0.02  # how often a request held back by busy CPUs looks again


def del_lane_workers(workers: int) -> int:
    """The threads of the DEL/STATUS lane beside ``workers`` general ones: a quarter, at
    least 2 (the server's default)."""
    return max(2, workers // 4)


def usable_cpus() -> int:
    """How many CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_queue_full(cpus: int = 0) -> bool:
    """More tasks are runnable on this machine than it has CPUs (/proc/stat procs_running)."""
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1]) > (cpus or usable_cpus())
    except (OSError, ValueError):
        pass
    return False


class Job:
    """One CNI request read in full, waiting for (or holding) a worker.

    A job with a ``task`` is the daemon's own work for a sandbox (a dynamic attachment's
    reconciliation): no connection, the task is run instead of the request; it waits in
    the sandbox's order like any request of it and keeps its own deadline (give it
    ``math.inf`` here, so that the server never answers it as expired).
    """

    __slots__ = ("conn", "path", "method", "body", "deadline", "command", "key", "fast",
                 "charged", "task")

    def __init__(self, conn: Any, path: str, method: str, body: bytes, deadline: float,
                 command: str = "", key: str = "", charged: int = 0,
                 task: Optional[Callable[["Job"], None]] = None) -> None:
        self.conn, self.path, self.method, self.body = conn, path, method, body
        self.deadline, self.command, self.key = deadline, command, key
        self.fast = command in FAST_COMMANDS
        self.charged = charged  # bytes of the server's memory budget this request holds
        self.task = task


class Lanes:
    """Runs :class:`Job` objects with ``run`` on worker threads, in the order described above."""

    def __init__(self, run: Callable[[Job], None], *, workers: int, fast_workers: int,
                 max_queued: int, busy_limit: Optional[int] = None,
                 cpu_busy: Optional[Callable[[], bool]] = None) -> None:
        self._run = run
        self.max_queued = max_queued
        cpus = usable_cpus()
        self.busy_limit = max(4, 2 * cpus) if busy_limit is None else busy_limit
        self._cpu_busy = cpu_busy or (lambda: run_queue_full(cpus))
        self._cpu_seen = (-1.0, False)  # (when, busy): one look serves every waiting worker
        self._running_general = 0
        self._held_back = False  # a general job waits for spare CPU (workers poll, not wait)
        self._lock = threading.Lock()
        self._wakeup = (threading.Condition(self._lock), threading.Condition(self._lock))
        self._queues: tuple[Deque[Job], Deque[Job]] = (deque(), deque())
        self._limit = (max(1, workers), max(1, fast_workers))
        self._started = [0, 0]
        self._waiting = [0, 0]
        self._notified = [0, 0]  # woken, not yet awake: not free for the next job
        self._keys: Dict[str, Deque[Job]] = {}  # a claimed sandbox -> its parked requests
        self._queued = 0
        self._running = 0
        self._active: List[Job] = []  # the jobs running now
        self._closed = False

    # -- what the server asks ---------------------------------------------------------------
    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and nothing queued) when ``max_queued`` are already waiting."""
        with self._lock:
            if self._queued >= self.max_queued:
                return False
            self._queued += 1
            if job.key:
                parked = self._keys.get(job.key)
                if parked is not None:
                    parked.append(job)  # runs once the sandbox's earlier requests are done
                    return True
                self._keys[job.key] = deque()
            self._enqueue(job)
        return True

    def take_expired(self, now: float) -> List[Job]:
        """Remove and return the waiting jobs whose deadline has passed (to be answered)."""
        expired: List[Job] = []
        with self._lock:
            for parked in self._keys.values():
                if any(job.deadline <= now for job in parked):
                    expired += [job for job in parked if job.deadline <= now]
                    kept = [job for job in parked if job.deadline > now]
                    parked.clear()
                    parked.extend(kept)
            for queue in self._queues:
                if any(job.deadline <= now for job in queue):
                    gone = [job for job in queue if job.deadline <= now]
                    kept = [job for job in queue if job.deadline > now]
                    queue.clear()
                    queue.extend(kept)
                    for job in gone:
                        expired.append(job)
                        self._release_key(job)
            self._queued -= len(expired)
        return expired

    def close(self) -> None:
        """Let the threads end once nothing is left to run (nothing is held back any more)."""
        with self._lock:
            self._closed = True
            for wakeup in self._wakeup:
                wakeup.notify_all()

    def jobs(self) -> Tuple[List[Job], List[Job]]:
        """(the jobs running now, the jobs waiting: queued or parked), for the daemon's stop."""
        with self._lock:
            waiting = [job for queue in self._queues for job in queue]
            waiting += [job for parked in self._keys.values() for job in parked]
            return list(self._active), waiting

    def take_waiting(self) -> List[Job]:
        """Remove and return every waiting job (to be answered: the daemon is exiting)."""
        return self.take_expired(float("inf"))

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def running(self) -> int:
        return self._running

    def threads(self) -> int:
        return sum(self._started)

    # -- inside -----------------------------------------------------------------------------
    def _enqueue(self, job: Job) -> None:
        """Put ``job`` in its lane and see that a thread will take it (lock held)."""
        self._queues[_FAST if job.fast else _GENERAL].append(job)
        for kind in ((_FAST, _GENERAL) if job.fast else (_GENERAL,)):
            if self._waiting[kind] > self._notified[kind]:
                self._notified[kind] += 1
                self._wakeup[kind].notify()
                return
        for kind in ((_FAST, _GENERAL) if job.fast else (_GENERAL,)):
            if self._started[kind] < self._limit[kind]:
                self._started[kind] += 1
                threading.Thread(target=self._work, args=(kind,), daemon=True,
                                 name="multusd-worker" if kind == _GENERAL
                                 else "multusd-worker-del").start()
                return
        # every thread that could take it is busy: the first to finish will

    def _take(self, kind: int):
        fast, general = self._queues[_FAST], self._queues[_GENERAL]
        self._held_back = False
        if fast:  # a DEL first, on any thread: the CPU gate never holds one back
            return fast.popleft()
        if kind == _FAST or not general:
            return None
        if self._running_general >= self.busy_limit and not self._closed and self._cpus_busy():
            self._held_back = True  # this thread still takes a DEL the moment one comes
            return None
        return general.popleft()

    def _cpus_busy(self) -> bool:
        """:attr:`_cpu_busy`, looked at most once per half CPU_RECHECK (lock held)."""
        now = time.monotonic()
        if now - self._cpu_seen[0] >= CPU_RECHECK / 2:
            self._cpu_seen = (now, bool(self._cpu_busy()))
        return self._cpu_seen[1]

    def _release_key(self, job: Job) -> None:
        """``job`` is done (or gone): the sandbox's next parked request may run (lock held)."""
        if not job.key:
            return
        parked = self._keys.get(job.key)
        if parked:
            self._enqueue(parked.popleft())
        else:
            self._keys.pop(job.key, None)

    def _work(self, kind: int) -> None:
        with self._lock:
            while True:
                job = self._take(kind)
                if job is None:
                    if self._closed:
                        self._started[kind] -= 1
                        return
                    self._waiting[kind] += 1
                    self._wakeup[kind].wait(CPU_RECHECK if self._held_back else None)
                    self._waiting[kind] -= 1
                    if self._notified[kind]:
                        self._notified[kind] -= 1
                    continue
                self._queued -= 1
                self._running += 1
                self._active.append(job)
                general = kind == _GENERAL
                self._running_general += general
                self._lock.release()
                try:
                    (job.task or self._run)(job)
                except Exception:  # the server answers; a bug here must not end the thread
                    LOG.exception("a worker failed on a %s request", job.command or "CNI")
                finally:
                    self._lock.acquire()
                    self._active.remove(job)
                    self._running -= 1
                    self._running_general -= general
                    self._release_key(job)

