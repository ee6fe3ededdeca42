"""multusd.daemon.lanes: the DEL lane, one sandbox at a time, bounded waiting, reused threads."""

import threading

from testlib import wait_for

from multusd.daemon.lanes import Job, Lanes


class Runs:
    """``run`` for Lanes: records each job as it starts; a job named in ``hold`` waits."""

    def __init__(self) -> None:
        self.started, self.done, self.hold = [], [], {}
        self.threads = set()

    def __call__(self, job: Job) -> None:
        self.started.append(job.conn)
        self.threads.add(threading.current_thread())
        gate = self.hold.get(job.conn)
        if gate is not None:
            assert gate.wait(30)
        self.done.append(job.conn)


def job(name: str, command: str = "ADD", key: str = "", deadline: float = 1e12) -> Job:
    return Job(name, "/cni", "POST", b"", deadline, command, key)


def release(runs: Runs) -> None:
    for gate in runs.hold.values():
        gate.set()


def test_a_del_runs_while_every_general_worker_waits():
    runs = Runs()
    lanes = Lanes(runs, workers=2, fast_workers=1, max_queued=10)
    try:
        for name in ("a1", "a2", "a3"):
            runs.hold[name] = threading.Event()
            assert lanes.submit(job(name))
        wait_for(lambda: len(runs.started) == 2, 10, what="two ADDs running")
        assert lanes.submit(job("d", "DEL"))
        wait_for(lambda: "d" in runs.done, 10, what="the DEL done")
        assert "a3" not in runs.started  # still waiting for a general worker
    finally:
        release(runs)
        lanes.close()
    wait_for(lambda: len(runs.done) == 4, 10, what="every job done")


def test_general_workers_take_waiting_dels_first():
    runs = Runs()
    lanes = Lanes(runs, workers=1, fast_workers=1, max_queued=10)
    try:
        runs.hold["first"], runs.hold["d0"] = threading.Event(), threading.Event()
        lanes.submit(job("first"))
        wait_for(lambda: runs.started == ["first"], 10, what="the first ADD running")
        lanes.submit(job("d0", "DEL"))  # the DEL lane's one thread: busy from here on
        wait_for(lambda: runs.started == ["first", "d0"], 10, what="d0 running")
        lanes.submit(job("add"))
        lanes.submit(job("del", "DEL"))
        runs.hold["first"].set()
        wait_for(lambda: len(runs.done) == 3, 10, what="first, del and add done")
        assert runs.started[2:] == ["del", "add"] and "d0" not in runs.done
    finally:
        release(runs)
        lanes.close()


def test_one_sandbox_at_a_time_in_order_and_its_waiting_jobs_hold_no_thread():
    runs = Runs()
    lanes = Lanes(runs, workers=2, fast_workers=1, max_queued=10)
    try:
        runs.hold["add-c1"] = threading.Event()
        lanes.submit(job("add-c1", "ADD", "c1"))
        wait_for(lambda: runs.started == ["add-c1"], 10, what="the ADD running")
        lanes.submit(job("check-c1", "CHECK", "c1"))
        lanes.submit(job("del-c1", "DEL", "c1"))
        lanes.submit(job("add-c2", "ADD", "c2"))
        wait_for(lambda: "add-c2" in runs.done and lanes.running == 1, 10,
                 what="the other sandbox's ADD")
        assert lanes.queued == 2
        release(runs)
        wait_for(lambda: len(runs.done) == 4, 10, what="every job done")
        assert [n for n in runs.started if n.endswith("c1")] == ["add-c1", "check-c1", "del-c1"]
    finally:
        lanes.close()


def test_waiting_is_bounded():
    runs = Runs()
    lanes = Lanes(runs, workers=1, fast_workers=0, max_queued=2)
    try:
        runs.hold["a"] = threading.Event()
        assert lanes.submit(job("a"))
        wait_for(lambda: runs.started == ["a"], 10, what="the first job running")
        assert lanes.submit(job("b")) and lanes.submit(job("c", "CHECK", "k"))
        assert not lanes.submit(job("d"))
        assert not lanes.submit(job("e", "DEL", "k"))  # parked ones count too
        release(runs)
        wait_for(lambda: len(runs.done) == 3, 10, what="the three accepted jobs")
        assert lanes.submit(job("f"))
    finally:
        lanes.close()


def test_jobs_past_their_deadline_are_taken_out_and_their_sandbox_moves_on():
    runs = Runs()
    lanes = Lanes(runs, workers=1, fast_workers=0, max_queued=10)
    try:
        runs.hold["a"] = threading.Event()
        lanes.submit(job("a"))
        wait_for(lambda: runs.started == ["a"], 10, what="the first job running")
        lanes.submit(job("late", "ADD", "k", deadline=5.0))
        lanes.submit(job("next", "CHECK", "k", deadline=50.0))
        lanes.submit(job("later", "ADD", "", deadline=5.0))
        expired = lanes.take_expired(now=10.0)
        assert sorted(j.conn for j in expired) == ["late", "later"]
        assert lanes.queued == 1
        release(runs)
        wait_for(lambda: runs.done == ["a", "next"], 10, what="the sandbox's next job")
    finally:
        lanes.close()


def test_the_jobs_running_and_waiting_and_all_waiting_taken_out_at_exit():
    runs = Runs()
    lanes = Lanes(runs, workers=1, fast_workers=1, max_queued=10)
    try:
        runs.hold["add"], runs.hold["del"] = threading.Event(), threading.Event()
        lanes.submit(job("add", "ADD", "c1"))
        wait_for(lambda: runs.started == ["add"], 10, what="the ADD running")
        lanes.submit(job("del", "DEL", "c2"))
        wait_for(lambda: runs.started == ["add", "del"], 10, what="the DEL running")
        lanes.submit(job("queued", "CHECK", "c3"))
        lanes.submit(job("parked", "DEL", "c1"))  # behind its sandbox's ADD
        running, waiting = lanes.jobs()
        assert sorted(j.conn for j in running) == ["add", "del"]
        assert sorted(j.conn for j in waiting) == ["parked", "queued"]
        assert sorted(j.conn for j in lanes.take_waiting()) == ["parked", "queued"]
        assert lanes.queued == 0 and lanes.jobs()[1] == []
        release(runs)
        wait_for(lambda: lanes.jobs() == ([], []), 10, what="the running jobs done")
        assert sorted(runs.done) == ["add", "del"]  # what was taken out never ran
    finally:
        lanes.close()


def test_threads_are_started_as_needed_and_reused():
    runs = Runs()
    lanes = Lanes(runs, workers=4, fast_workers=2, max_queued=100)
    try:
        for number in range(20):
            lanes.submit(job(f"j{number}"))
            # done, and its thread back to waiting (it is, once it no longer counts as running)
            wait_for(lambda: len(runs.done) == number + 1 and lanes.running == 0, 10,
                     what="that job done")
        assert len(runs.threads) == 1 and lanes.threads() == 1
    finally:
        lanes.close()
    wait_for(lambda: not any(t.is_alive() for t in runs.threads), 10,
             what="the worker to end once closed")


class Gate:
    """The lanes' ``cpu_busy``: the CPUs are busy while ``busy`` is set; ``looked`` is set
    once a worker has asked (it then waits, held back, before it lets go of the lanes)."""

    def __init__(self) -> None:
        self.busy, self.looked = threading.Event(), threading.Event()
        self.busy.set()

    def __call__(self) -> bool:
        self.looked.set()
        return self.busy.is_set()


def held_back_behind_a1(runs: Runs, gate: Gate, **kw) -> Lanes:
    """Lanes of two general workers past their busy limit, the CPU gate closed: a1 runs (held)
    on one, a2 waits for spare CPU and the other worker waits with it, held back."""
    lanes = Lanes(runs, workers=2, max_queued=10, busy_limit=1, cpu_busy=gate, **kw)
    runs.hold["a1"] = threading.Event()
    assert lanes.submit(job("a1"))
    wait_for(lambda: runs.started == ["a1"], what="a1 running")
    assert lanes.submit(job("a2"))
    assert gate.looked.wait(10), "the second worker never asked whether the CPUs are busy"
    return lanes


def test_past_the_busy_limit_a_general_request_waits_for_spare_cpu_but_a_del_does_not():
    runs, gate = Runs(), Gate()
    lanes = held_back_behind_a1(runs, gate, fast_workers=1)
    try:
        assert lanes.submit(job("d1", "DEL"))  # the first DEL: the DEL lane has no thread yet
        wait_for(lambda: "d1" in runs.done, what="the DEL while a worker is held back")
        assert runs.started == ["a1", "d1"]  # the CPUs are busy and one request already runs
        gate.busy.clear()  # the run queue shortens: a2 starts beside a1
        wait_for(lambda: "a2" in runs.done, what="a2 once the CPUs have time")
        assert "a1" not in runs.done
    finally:
        release(runs)
        lanes.close()


def test_a_del_runs_when_the_del_lane_is_busy_and_the_cpu_gate_holds_the_rest_back():
    runs, gate = Runs(), Gate()
    lanes = held_back_behind_a1(runs, gate, fast_workers=1)
    try:
        runs.hold["d0"] = threading.Event()
        assert lanes.submit(job("d0", "DEL"))  # the DEL lane's only thread, held
        wait_for(lambda: "d0" in runs.started, what="d0 running")
        assert lanes.submit(job("d1", "DEL"))
        wait_for(lambda: "d1" in runs.done, what="the DEL on the worker the gate held back")
        assert runs.started == ["a1", "d0", "d1"] and runs.done == ["d1"]
        assert lanes.queued == 1  # a2, still waiting for spare CPU
    finally:
        release(runs)
        lanes.close()


def test_a_del_runs_while_every_general_worker_runs_an_add_whatever_the_del_lane_size():
    runs = Runs()
    lanes = Lanes(runs, workers=1, fast_workers=0, max_queued=10)
    try:
        runs.hold["a1"] = threading.Event()
        assert lanes.submit(job("a1"))
        wait_for(lambda: runs.started == ["a1"], what="a1 running")
        assert lanes.submit(job("d1", "DEL"))
        wait_for(lambda: "d1" in runs.done, what="the DEL beside the only general worker")
        assert runs.done == ["d1"]
    finally:
        release(runs)
        lanes.close()


def test_while_the_cpus_have_time_requests_run_side_by_side_up_to_workers():
    runs = Runs()
    lanes = Lanes(runs, workers=3, fast_workers=0, max_queued=10, busy_limit=1,
                  cpu_busy=lambda: False)
    try:
        for name in ("a1", "a2", "a3"):
            runs.hold[name] = threading.Event()
            assert lanes.submit(job(name))
        wait_for(lambda: sorted(runs.started) == ["a1", "a2", "a3"], what="three at once")
    finally:
        release(runs)
        lanes.close()


def test_once_closed_a_request_held_back_for_cpu_still_runs():
    runs = Runs()
    lanes = Lanes(runs, workers=2, fast_workers=0, max_queued=10, busy_limit=1,
                  cpu_busy=lambda: True)
    try:
        runs.hold["a1"] = threading.Event()
        assert lanes.submit(job("a1")) and lanes.submit(job("a2"))
        wait_for(lambda: runs.started == ["a1"], what="a1 running")
        lanes.close()
        wait_for(lambda: "a2" in runs.done, what="a2 run before the threads end")
    finally:
        release(runs)
        lanes.close()
    wait_for(lambda: not any(t.is_alive() for t in runs.threads), 10,
             what="the workers to end once closed")


def test_a_task_of_the_daemons_own_waits_its_sandboxs_turn_and_runs_instead_of_a_request():
    runs = Runs()
    lanes = Lanes(runs, workers=2, fast_workers=1, max_queued=10)
    ran = []
    try:
        runs.hold["add"] = threading.Event()
        assert lanes.submit(job("add", key="c1"))
        wait_for(lambda: runs.started == ["add"], 10, what="the ADD running")
        task = Job(None, "", "", b"", float("inf"), "RECONCILE", "c1",
                   task=lambda j: ran.append(("task", list(runs.done))))
        assert lanes.submit(task)
        assert lanes.submit(job("del", "DEL", key="c1", deadline=float("inf")))
        assert lanes.take_expired(1e13) == []  # it keeps its own deadline: never answered
        release(runs)
        wait_for(lambda: runs.done == ["add", "del"], 10, what="the DEL after the task")
    finally:
        lanes.close()
    assert ran == [("task", ["add"])]  # after the ADD, before the DEL; never given to run
    assert None not in runs.started
