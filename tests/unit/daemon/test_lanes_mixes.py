"""multusd.daemon.lanes under every mix of work that hangs: STATUS and GC in slots of their own,
one run at a time and shared; DEL first; a hung plugin never holds another sandbox's ADD.

Each job stands for a request whose plugin runs as long as the test says (:class:`Plugins`):
held ones until the test lets them go, the others at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from testlib import wait_for

from multusd.daemon.lanes import Job, Lanes

HOLD = 60.0  # a held plugin lets go by then at the latest (the test has failed long before)


@dataclass(frozen=True)
class Call:
    """What a job stands for: its name, and whether its plugin hangs until released."""

    name: str
    hold: bool = False


class Plugins:
    """``run`` (pod work) and ``share`` (node work) for Lanes: each records its start and is
    answered when its plugin ends; a node run's answer names the run's first job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.started: List[str] = []
        self.answered: Dict[str, str] = {}  # job -> the job whose run answered it
        self.node_runs: Dict[str, int] = {}  # kind -> runs started
        self.at_once: Dict[str, int] = {}  # kind -> runs running now
        self.most_at_once: Dict[str, int] = {}

    def _plugin(self, job: Job) -> None:
        with self.lock:
            self.started.append(job.conn.name)
        if job.conn.hold:
            assert self.released.wait(HOLD), f"{job.conn.name} was never released"

    def run(self, job: Job) -> None:
        self._plugin(job)
        with self.lock:
            self.answered[job.conn.name] = job.conn.name

    def share(self, first: Job) -> Callable[[Job], None]:
        kind = first.command
        with self.lock:
            self.node_runs[kind] = self.node_runs.get(kind, 0) + 1
            self.at_once[kind] = self.at_once.get(kind, 0) + 1
            self.most_at_once[kind] = max(self.most_at_once.get(kind, 0), self.at_once[kind])
        try:
            self._plugin(first)
        finally:
            with self.lock:
                self.at_once[kind] -= 1

        def answer(job: Job) -> None:
            with self.lock:
                self.answered[job.conn.name] = first.conn.name
        return answer

    def done(self, *names: str) -> bool:
        with self.lock:
            return all(name in self.answered for name in names)


# (name, command, sandbox, hold); node work with the same command shares one body
Spec = Tuple[str, str, str, bool]


def job(spec: Spec, deadline: float = 1e12) -> Job:
    name, command, key, hold = spec
    return Job(Call(name, hold), "/cni", "POST", b"", deadline, command, key,
               share=f"{command} body" if command in ("STATUS", "GC") else None)


def many(count: int, prefix: str, command: str, hold: bool = True, sandboxes: bool = True
         ) -> List[Spec]:
    return [(f"{prefix}{n}", command, f"{prefix}-sandbox{n}" if sandboxes else "", hold)
            for n in range(count)]


HUNG_STATUS = many(40, "status", "STATUS", sandboxes=False)
HUNG_GC = many(10, "gc", "GC", sandboxes=False)
ADD = ("add", "ADD", "new-pod", False)
DEL = ("del", "DEL", "old-pod", False)
STATUS = ("status-again", "STATUS", "", False)

# (what hangs, what must still be answered while it hangs); 2 general workers, 1 DEL thread
MIXES = {
    "hung STATUS, asked 40 times": (HUNG_STATUS, [ADD, DEL]),
    "hung GC, asked 10 times": (HUNG_GC, [ADD, DEL]),
    "a hung DEL plugin": (many(1, "hung-del", "DEL"), [ADD, DEL]),
    "hung DEL plugins on the DEL lane and a general thread": (many(2, "hung-del", "DEL"),
                                                              [ADD, DEL]),
    "slow ADDs on every general thread": (many(2, "slow-add", "ADD"), [DEL]),
    "hung STATUS, hung GC, a hung DEL plugin and a slow ADD": (
        HUNG_STATUS + HUNG_GC + many(1, "hung-del", "DEL") + many(1, "slow-add", "ADD"),
        [DEL, ADD]),
    "hung STATUS and GC and slow ADDs on every general thread": (
        HUNG_STATUS + HUNG_GC + many(2, "slow-add", "ADD"), [DEL]),
}


@pytest.mark.parametrize("hung,answered", list(MIXES.values()), ids=list(MIXES))
def test_what_hangs_holds_nothing_another_request_needs(hung, answered):
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=2, fast_workers=1, max_queued=100, share=plugins.share,
                  busy_limit=2, cpu_busy=lambda: False)
    try:
        for spec in hung:
            assert lanes.submit(job(spec))
        first_of = {command: next(spec[0] for spec in hung if spec[1] == command)
                    for command in ("STATUS", "GC") if any(s[1] == command for s in hung)}
        # every plugin that hangs is running (a node kind's first run), the rest joined it
        running = [s[0] for s in hung if s[1] not in first_of] + list(first_of.values())
        wait_for(lambda: set(running) <= set(plugins.started), what="what hangs to hang")
        for spec in answered:
            assert lanes.submit(job(spec))
        names = [spec[0] for spec in answered]
        wait_for(lambda: plugins.done(*names), what=f"{names} while the others hang")
        assert not plugins.done(*running)  # they still hang
        for kind in first_of:
            assert plugins.node_runs[kind] == 1  # one run, however often it was asked
        # those that joined a run wait for its answer, holding no thread
        assert lanes.queued == sum(sum(s[1] == kind for s in hung) - 1 for kind in first_of)
        # threads: the pod lanes' at most, and one per node kind that was asked
        assert lanes.threads() <= 2 + 1 + len(first_of)
        plugins.released.set()
        everyone = [s[0] for s in hung] + names
        wait_for(lambda: plugins.done(*everyone), what="every request answered")
        for kind, first in first_of.items():
            assert {plugins.answered[s[0]] for s in hung if s[1] == kind} == {first}
            assert plugins.most_at_once[kind] == 1
        # (a pod thread gives its job back just after the job's answer)
        wait_for(lambda: lanes.queued == 0 and lanes.running == 0, what="nothing left")
    finally:
        plugins.released.set()
        lanes.close()


def test_a_status_arriving_once_a_run_has_answered_gets_a_run_of_its_own():
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    try:
        assert lanes.submit(job(("s1", "STATUS", "", False)))
        wait_for(lambda: plugins.done("s1"), what="the first STATUS")
        assert lanes.submit(job(("s2", "STATUS", "", False)))
        wait_for(lambda: plugins.done("s2"), what="the next STATUS")
        assert plugins.answered == {"s1": "s1", "s2": "s2"}  # the agent recovered: it says so
        assert plugins.node_runs == {"STATUS": 2}
    finally:
        lanes.close()


def test_a_different_status_waits_for_the_run_going_on_one_run_at_a_time():
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    try:
        assert lanes.submit(job(("s1", "STATUS", "", True)))
        wait_for(lambda: "s1" in plugins.started, what="the first STATUS hanging")
        other = Job(Call("other"), "/cni", "POST", b"", 1e12, "STATUS", share="another body")
        assert lanes.submit(other)
        assert lanes.submit(job(("s2", "STATUS", "", False)))  # joins s1's run
        plugins.released.set()
        wait_for(lambda: plugins.done("s1", "s2", "other"), what="both runs answered")
        assert plugins.answered == {"s1": "s1", "s2": "s1", "other": "other"}
        assert plugins.most_at_once == {"STATUS": 1}
    finally:
        plugins.released.set()
        lanes.close()


def test_who_joined_a_hung_run_is_taken_out_at_its_deadline_and_the_run_keeps_one_thread():
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    try:
        assert lanes.submit(job(("s1", "STATUS", "", True), deadline=3.0))
        wait_for(lambda: "s1" in plugins.started, what="the STATUS hanging")
        assert lanes.submit(job(("s2", "STATUS", "", False), deadline=5.0))
        assert lanes.submit(job(("s3", "STATUS", "", False), deadline=50.0))
        assert [j.conn.name for j in lanes.take_expired(now=10.0)] == ["s2"]  # answered late
        assert lanes.queued == 1 and lanes.running == 1 and lanes.threads() == 1
        plugins.released.set()
        wait_for(lambda: plugins.done("s1", "s3"), what="the run's answer")
        assert "s2" not in plugins.answered  # the server answered it when it was taken out
        assert plugins.answered["s3"] == "s1"
    finally:
        plugins.released.set()
        lanes.close()


def test_gc_starts_only_while_no_pod_request_waits_for_a_thread():
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    try:
        slow = Job(Call("slow-add", True), "/cni", "POST", b"", 1e12, "ADD", "s1")
        assert lanes.submit(slow)
        wait_for(lambda: "slow-add" in plugins.started, what="the ADD running")
        waiting = Job(Call("waiting-add"), "/cni", "POST", b"", 1e12, "ADD", "s2")
        assert lanes.submit(waiting)  # no general thread is free: it waits for one
        assert lanes.submit(job(("gc", "GC", "", False)))
        assert lanes.submit(job(("status", "STATUS", "", False)))
        wait_for(lambda: plugins.done("status"), what="STATUS beside the waiting ADD")
        assert "gc" not in plugins.started  # behind the ADD that waits for a thread
        plugins.released.set()
        wait_for(lambda: plugins.done("slow-add", "waiting-add", "gc"), what="the rest")
    finally:
        plugins.released.set()
        lanes.close()


def test_node_work_is_never_parked_behind_a_sandbox_and_a_task_of_it_runs_alone():
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    ran: List[Optional[str]] = []
    try:
        assert lanes.submit(Job(Call("add", True), "/cni", "POST", b"", 1e12, "ADD", "c1"))
        wait_for(lambda: "add" in plugins.started, what="the ADD hanging")
        # a STATUS naming the same container (a runtime may send one) does not wait for it
        assert lanes.submit(Job(Call("status"), "/cni", "POST", b"", 1e12, "STATUS", "c1",
                                share="body"))
        wait_for(lambda: plugins.done("status"), what="the STATUS")
        task = Job(None, "", "", b"", float("inf"), "GC", task=lambda j: ran.append(j.command),
                   share="body")
        assert task.share is None  # a task is never shared
        assert lanes.submit(task)
        wait_for(lambda: ran == ["GC"], what="the daemon's own GC work")
        assert plugins.node_runs == {"STATUS": 1}
    finally:
        plugins.released.set()
        lanes.close()


def test_without_a_share_each_node_request_is_run_on_its_own():
    runs: List[str] = []
    lanes = Lanes(lambda j: runs.append(j.conn.name), workers=1, fast_workers=1,
                  max_queued=10)
    try:
        for name in ("s1", "s2"):
            assert lanes.submit(job((name, "STATUS", "", False)))
        wait_for(lambda: sorted(runs) == ["s1", "s2"], what="both run")
    finally:
        lanes.close()


def test_a_del_of_the_daemons_own_runs_first_in_the_del_lane_beside_busy_general_workers():
    """What the daemon releases by itself (a DEL retried, ``gc --forget``) can go through the
    lanes as a task: in its sandbox's turn, DEL first, never behind the ADDs."""
    plugins = Plugins()
    lanes = Lanes(plugins.run, workers=1, fast_workers=1, max_queued=10, share=plugins.share)
    ran: List[str] = []
    try:
        assert lanes.submit(Job(Call("slow-add", True), "/cni", "POST", b"", 1e12, "ADD", "s1"))
        wait_for(lambda: "slow-add" in plugins.started, what="the ADD holding the worker")
        assert lanes.submit(Job(Call("add"), "/cni", "POST", b"", 1e12, "ADD", "s2"))
        task = Job(None, "", "", b"", float("inf"), "DEL", "s3",
                   task=lambda j: ran.append(j.key))
        assert lanes.submit(task)
        wait_for(lambda: ran == ["s3"], what="the daemon's own DEL")
        assert "add" not in plugins.started  # still waiting for the general worker
    finally:
        plugins.released.set()
        lanes.close()


def test_a_job_whose_thread_took_a_del_first_gets_another_thread():
    """The DEL lane's thread is started for a DEL, a general one for an ADD; when the general
    one is up first it takes the DEL (DEL first, on any thread), whose plugin hangs: the ADD
    gets a thread of its own, not the hung DEL's. Repeated: which thread is up first is the
    scheduler's."""
    for attempt in range(200):
        plugins = Plugins()
        lanes = Lanes(plugins.run, workers=2, fast_workers=1, max_queued=10)
        try:
            assert lanes.submit(Job(Call("hung-del", True), "/cni", "POST", b"", 1e12, "DEL",
                                    "d"))
            assert lanes.submit(Job(Call("add"), "/cni", "POST", b"", 1e12, "ADD", "a"))
            wait_for(lambda: plugins.done("add"), what=f"the ADD (attempt {attempt})")
        finally:
            plugins.released.set()
            lanes.close()


def test_a_hung_del_holds_the_del_lanes_thread_not_one_an_add_needs():
    """A DEL and an ADD come together, each plugin hangs: the DEL is on the DEL lane's thread
    (started for it), not on a general one that was up first, and the next ADD has the other
    general thread. Repeated: which thread is up first is the scheduler's."""
    for attempt in range(100):
        plugins = Plugins()
        lanes = Lanes(plugins.run, workers=2, fast_workers=1, max_queued=10)
        try:
            assert lanes.submit(Job(Call("hung-del", True), "/cni", "POST", b"", 1e12, "DEL",
                                    "d"))
            assert lanes.submit(Job(Call("slow-add", True), "/cni", "POST", b"", 1e12, "ADD",
                                    "s"))
            wait_for(lambda: {"hung-del", "slow-add"} <= set(plugins.started),
                     what=f"both hanging (attempt {attempt})")
            assert lanes.submit(Job(Call("add"), "/cni", "POST", b"", 1e12, "ADD", "a"))
            wait_for(lambda: plugins.done("add"), what=f"the next ADD (attempt {attempt})")
        finally:
            plugins.released.set()
            lanes.close()
