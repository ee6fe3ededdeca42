"""The queue of CNI requests waiting for a thread: pod work in two lanes, node work in slots.

**Pod work** (ADD, DEL, CHECK, ``/delegate``, the daemon's own work for a sandbox) runs on a
bounded set of worker threads, started as they are needed and kept. ``workers`` threads take
any of it, DEL first; ``fast_workers`` more (at least one) take only DEL. A DEL frees what a
node has too little of, so it never waits behind an ADD: every thread takes a waiting DEL
before anything else (but a general thread leaves a DEL to the DEL lane's thread woken or
started for it, so that a DEL whose plugin hangs holds that lane's thread, not one an ADD
needs), and the CPU gate below never holds one back; a DEL waits only while every thread runs
another request and the DEL lane's threads all run DELs.

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

**Node work** (STATUS and GC: the runtime asking about the node, invariant 14) never takes a
thread pod work needs: each kind has one slot, a thread of its own started when first needed,
so one kind's run holds one thread however often it is asked and however long it hangs. A run
is shared: a request arriving while one of the same kind runs with the same ``share`` (the
same request body) joins it, holds no thread, and is answered with its answer. Other requests
of the kind wait for the slot, grouped the same way, each group for one run. A run is bounded
by its first request's deadline (every request that joined came later, with a later one): it
runs at that deadline at the latest, whether its callers are still there or not, and its
plugin is killed by then (:func:`~multusd.cni.invoke.exec_plugin`). GC also yields to pod
work: its run starts only while no pod request waits for a thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

LOG = logging.getLogger(__name__)
FAST_COMMANDS = ("DEL",)  # the commands of the DEL lane, taken first by every pod thread
NODE_COMMANDS = ("STATUS", "GC")  # each in a slot of its own
YIELDING = ("GC",)  # node work that starts only while no pod request waits for a thread
_GENERAL, _FAST = 0, 1
CPU_RECHECK = 0.02  # how often a request held back by busy CPUs (or pods) looks again

# A node run's outcome, handed each request of it: ``share(first)`` runs the first request
# once and returns how to answer one request of the run (the first included).
Share = Callable[["Job"], Callable[["Job"], None]]


def del_lane_workers(workers: int) -> int:
    """The threads of the DEL lane beside ``workers`` general ones: a quarter, at least 2
    (the server's default)."""
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
    """One CNI request read in full, waiting for (or holding) a thread.

    A job with a ``task`` is the daemon's own work for a sandbox (a dynamic attachment's
    reconciliation): no connection, the task is run instead of the request; it waits in
    the sandbox's order like any request of it and keeps its own deadline (give it
    ``math.inf`` here, so that the server never answers it as expired). Node work (a
    ``command`` of :data:`NODE_COMMANDS`) is never parked behind a sandbox; jobs of it with
    the same ``share`` (not None) are run once, and a task of it is run alone.
    """

    __slots__ = ("conn", "path", "method", "body", "deadline", "command", "key", "fast",
                 "node", "share", "charged", "task")

    def __init__(self, conn: Any, path: str, method: str, body: bytes, deadline: float,
                 command: str = "", key: str = "", charged: int = 0,
                 task: Optional[Callable[["Job"], None]] = None,
                 share: Optional[object] = None) -> None:
        self.conn, self.path, self.method, self.body = conn, path, method, body
        self.deadline, self.command = deadline, command
        self.node = command in NODE_COMMANDS
        self.key = "" if self.node else key
        self.fast = command in FAST_COMMANDS
        self.share = None if task is not None else share
        self.charged = charged  # bytes of the server's memory budget this request holds
        self.task = task


class _Slot:
    """One kind of node work: its thread, the run going on, the groups waiting (lock held)."""

    def __init__(self, kind: str, lock: threading.Lock) -> None:
        self.kind = kind
        self.wakeup = threading.Condition(lock)
        self.started = False
        self.run: Optional[List[Job]] = None  # the first job, then whoever joined it
        self.groups: "OrderedDict[object, List[Job]]" = OrderedDict()  # waiting, by share

    def group_of(self, job: Job) -> object:
        return job if job.share is None else job.share  # a job without one is alone

    def waiting(self) -> List[Job]:
        return [job for group in self.groups.values() for job in group] + (self.run or [])[1:]


class Lanes:
    """Runs :class:`Job` objects on threads, in the order described above: pod work with
    ``run``, node work with ``share``."""

    def __init__(self, run: Callable[[Job], None], *, workers: int, fast_workers: int,
                 max_queued: int, busy_limit: Optional[int] = None,
                 cpu_busy: Optional[Callable[[], bool]] = None,
                 share: Optional[Share] = None) -> None:
        self._run = run
        self._share = share or _one_by_one(run)
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
        self._coming = [0, 0]  # started, not yet up: each for a job queued when it was started
        self._slots = {kind: _Slot(kind, self._lock) for kind in NODE_COMMANDS}
        self._keys: Dict[str, Deque[Job]] = {}  # a claimed sandbox -> its parked requests
        self._queued = 0  # waiting: queued, parked, in a node group or joined to a node run
        self._running = 0
        self._active: List[Job] = []  # the jobs running now (a node run: its first job)
        self._closed = False

    # -- what the server asks ---------------------------------------------------------------
    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and nothing queued) when ``max_queued`` are already waiting."""
        with self._lock:
            if self._queued >= self.max_queued:
                return False
            self._queued += 1
            if job.node:
                self._to_slot(job)
                return True
            if job.key:
                parked = self._keys.get(job.key)
                if parked is not None:
                    parked.append(job)  # runs once the sandbox's earlier requests are done
                    return True
                self._keys[job.key] = deque()
            self._enqueue(job)
        return True

    def take_expired(self, now: float) -> List[Job]:
        """Remove and return the waiting jobs whose deadline has passed (to be answered):
        queued, parked, waiting for a node slot, or joined to a node run still going."""
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
            for slot in self._slots.values():
                expired += _take_past(slot, now)
            self._queued -= len(expired)
        return expired

    def close(self) -> None:
        """Let the threads end once nothing is left to run (nothing is held back any more)."""
        with self._lock:
            self._closed = True
            for wakeup in self._wakeup:
                wakeup.notify_all()
            for slot in self._slots.values():
                slot.wakeup.notify_all()

    def jobs(self) -> Tuple[List[Job], List[Job]]:
        """(the jobs running now, the jobs waiting: queued, parked, or waiting for a node
        run's answer), for the daemon's stop."""
        with self._lock:
            waiting = [job for queue in self._queues for job in queue]
            waiting += [job for parked in self._keys.values() for job in parked]
            waiting += [job for slot in self._slots.values() for job in slot.waiting()]
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
        return sum(self._started) + sum(slot.started for slot in self._slots.values())

    # -- pod work ---------------------------------------------------------------------------
    def _enqueue(self, job: Job) -> None:
        """Put ``job`` in its lane and see that a thread will take it (lock held)."""
        self._queues[_FAST if job.fast else _GENERAL].append(job)
        self._call_thread(job.fast)

    def _call_thread(self, fast: bool) -> None:
        """See that a thread comes for a job waiting in the DEL lane (``fast``) or the general
        one: a waiting thread woken, or one more started (lock held)."""
        for kind in ((_FAST, _GENERAL) if fast else (_GENERAL,)):
            if self._waiting[kind] > self._notified[kind]:
                self._notified[kind] += 1
                self._wakeup[kind].notify()
                return
        for kind in ((_FAST, _GENERAL) if fast else (_GENERAL,)):
            if self._started[kind] < self._limit[kind]:
                self._started[kind] += 1
                self._coming[kind] += 1
                threading.Thread(target=self._work, args=(kind,), daemon=True,
                                 name="multusd-worker" if kind == _GENERAL
                                 else "multusd-worker-del").start()
                return
        # every thread that could take it is busy: the first to finish will

    def _call_threads_for_the_rest(self) -> None:
        """A thread took a job: the jobs still queued each have a thread coming (lock held).
        The thread called for one job may have taken another (a general thread woken for an
        ADD takes a DEL first): the job it was called for would then wait for a busy thread
        (a hung DEL plugin's) although another could start."""
        fast, general = len(self._queues[_FAST]), len(self._queues[_GENERAL])
        if general > self._notified[_GENERAL] + self._coming[_GENERAL]:
            self._call_thread(False)  # only a general thread takes it
        elif fast + general > sum(self._notified) + sum(self._coming):
            self._call_thread(True)

    def _take(self, kind: int):
        fast, general = self._queues[_FAST], self._queues[_GENERAL]
        self._held_back = False
        # A DEL first, on any thread (the CPU gate never holds one back), but a general thread
        # leaves to the DEL lane's threads the DELs they were called for: a DEL whose plugin
        # hangs then holds a thread of the DEL lane, not one an ADD needs.
        if fast and (kind == _FAST or len(fast) > self._notified[_FAST] + self._coming[_FAST]):
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
            self._coming[kind] -= 1
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
                self._call_threads_for_the_rest()
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

    # -- node work --------------------------------------------------------------------------
    def _to_slot(self, job: Job) -> None:
        """Join the run going on, or wait in the slot's groups; wake its thread (lock held)."""
        slot = self._slots[job.command]
        if job.share is not None and slot.run and slot.run[0].share == job.share:
            slot.run.append(job)  # answered with the run's answer
            return
        slot.groups.setdefault(slot.group_of(job), []).append(job)
        if slot.started:
            slot.wakeup.notify()
        else:
            slot.started = True
            threading.Thread(target=self._serve, args=(slot,), daemon=True,
                             name=f"multusd-{slot.kind.lower()}").start()

    def _next_run(self, slot: _Slot) -> Optional[List[Job]]:
        """The slot's next group, now its run; None while none waits, or while GC yields to
        pod requests waiting for a thread (lock held)."""
        if not slot.groups:
            return None
        if slot.kind in YIELDING and not self._closed and any(self._queues):
            return None
        slot.run = slot.groups.popitem(last=False)[1]
        return slot.run

    def _serve(self, slot: _Slot) -> None:
        """The slot's thread: one run at a time, each answering every job of its group."""
        with self._lock:
            while True:
                run = self._next_run(slot)
                if run is None:
                    if self._closed and not slot.groups:
                        slot.started = False
                        return
                    slot.wakeup.wait(CPU_RECHECK if slot.groups else None)  # held back: poll
                    continue
                first = run[0]
                self._queued -= 1  # the first job; those that join wait until answered
                self._running += 1
                self._active.append(first)
                self._lock.release()
                try:
                    answer = self._run_once(slot, first)
                finally:
                    self._lock.acquire()
                    self._active.remove(first)
                    self._running -= 1
                    joined, slot.run = run[1:], None  # who comes now waits for the next run
                    self._queued -= len(joined)
                self._lock.release()
                try:
                    for job in (first, *joined):
                        try:
                            answer(job)
                        except Exception:  # the others are still answered
                            LOG.exception("answering a %s request failed", slot.kind)
                finally:
                    self._lock.acquire()

    def _run_once(self, slot: _Slot, first: Job) -> Callable[[Job], None]:
        """Run ``first`` once; how to answer each job of its run (never raises)."""
        if first.task is not None:
            try:
                first.task(first)
            except Exception:  # a bug here must not end the thread
                LOG.exception("the daemon's own %s work failed", slot.kind)
            return lambda job: None
        try:
            return self._share(first)
        except Exception:  # a bug: each job of the run is then run on its own
            LOG.exception("a %s run failed; each of its requests is run on its own", slot.kind)
            return self._run


def _take_past(slot: _Slot, now: float) -> List[Job]:
    """The jobs of ``slot`` past their deadline that are not running, taken out (lock held)."""
    expired: List[Job] = []
    for key, group in list(slot.groups.items()):
        kept = [job for job in group if job.deadline > now]
        expired += [job for job in group if job.deadline <= now]
        if kept:
            slot.groups[key] = kept
        else:
            del slot.groups[key]
    if slot.run is not None:
        expired += [job for job in slot.run[1:] if job.deadline <= now]
        slot.run[1:] = [job for job in slot.run[1:] if job.deadline > now]
    return expired


def _one_by_one(run: Callable[[Job], None]) -> Share:
    """A ``share`` for lanes given none: each job of a run is run by ``run`` on its own."""
    def share(first: Job) -> Callable[[Job], None]:
        run(first)
        return lambda job: None if job is first else run(job)
    return share
