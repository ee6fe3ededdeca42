"""The daemon's stop: one deadline inside systemd's TimeoutStopSec, the drain, the cut.

A stop (SIGTERM, SIGINT, or a Kubernetes client that cannot be built) has one budget,
:data:`STOP_TIMEOUT` seconds, and the process has exited at its end. multusd.service's
``TimeoutStopSec=`` is that budget plus :data:`UNIT_MARGIN` (``tests/unit/daemon/
test_stopping.py`` holds the unit to it), and the daemon tells systemd its budget when the
stop begins (EXTEND_TIMEOUT_USEC with STOPPING=1), so that a drop-in with a shorter
``TimeoutStopSec=`` still does not SIGKILL it mid-request. The budget is not the request
deadline (``requestTimeout``, 110 s): a hung plugin must not hold a restart for minutes.

1. **The drain** (:meth:`Stop.begin`): ``/readyz`` answers 500; ``/healthz``, ``/status``,
   DEL and STATUS are still served (upstream's shim probes ``/healthz`` before a DEL); an
   ADD, CHECK, GC or ``/delegate`` read from now on is answered "stopping, retry" with 503,
   not started (the shims wait for ``/readyz`` first, so only a race gets there; multusd's
   shim then waits for ``/readyz`` again and sends it to the next daemon). Once no
   connection is open, accepting ends: what arrives later waits in the socket, which
   systemd keeps, for the next daemon.
2. **The cut**, :data:`CUT_GRACE` seconds before the deadline if requests still run: every
   delegate plugin's process group is killed and no plugin starts any more
   (:class:`~multusd.cni.invoke.RunningPlugins`), so each request fails as if its plugin
   had: a DEL through its own failure path, which marks the sandbox unreleased
   (:mod:`multusd.core.unreleased`) as any failing DEL does; an ADD through its rollback,
   whose records stay where it could not release (invariant 3) for the runtime's DEL.
   Requests not started yet are answered "stopping, retry" (503), and a DEL among them is
   recorded the same way (:func:`multusd.core.unreleased.record`), so that nothing it was
   to release is forgotten, whichever shim sent it (upstream's never retries a DEL).
3. **The exit**, at the deadline at the latest: a DEL still running then (held outside any
   plugin) is recorded too, the requests still waiting are answered (a dynamic networks
   reconciliation still waiting is dropped: the next daemon's first pod list looks at the pod
   again), and the process ends.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Set

from multusd.cni.invoke import RunningPlugins
from multusd.core import delmarks, effective, sandboxconfig, unreleased
from multusd.core.request import decode_body, parse
from multusd.daemon import systemd
from multusd.daemon.lanes import Job
from multusd.errors import MultusError, TryAgainLater
from multusd.daemon.cnirun import not_started_answer
from multusd.wire import api

LOG = logging.getLogger(__name__)

STOP_TIMEOUT = 20.0  # from the signal to the exit
CUT_GRACE = 3.0      # the cut comes this long before the deadline: time to answer and record
UNIT_MARGIN = 10.0   # multusd.service's TimeoutStopSec= is STOP_TIMEOUT + UNIT_MARGIN
ANSWER_TIMEOUT = 0.5  # at the exit, writing the answer of a request that was never run


class Stop:
    """One stop of the daemon (see the module docstring); :meth:`begin` on the signal,
    :meth:`finish` on the main thread once the server's reactor has ended."""

    def __init__(self, server: Any, running: RunningPlugins, config: Any,
                 budget: float = STOP_TIMEOUT, cut_grace: float = CUT_GRACE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.running = running
        self.config = config
        self.clock = clock
        self.budget = budget
        self.cut_grace = cut_grace
        self.started = 0.0
        self.deadline = 0.0
        self.cut_at = 0.0
        self.cut_done = False
        self._lock = threading.Lock()
        self._recorded: Set[int] = set()  # id() of the jobs recorded as cut DELs
        self.recorded: List[str] = []     # container IDs recorded, in order (for the log)

    # -- the drain --------------------------------------------------------------------------
    def begin(self, why: str) -> None:
        """The stop starts now: its deadline is set, the drain runs on a thread of its own."""
        self.started = self.clock()
        self.deadline = self.started + self.budget
        self.cut_at = self.deadline - self.cut_grace
        LOG.info("%s: stopping within %.0fs; requests running now may finish until then",
                 why, self.budget)
        self.server.begin_stop()
        systemd.notify(f"STOPPING=1\nEXTEND_TIMEOUT_USEC={int(self.budget * 1_000_000)}\n"
                       f"STATUS=stopping: {why}")
        threading.Thread(target=self._drain, name="multusd-stop", daemon=True).start()

    def _drain(self) -> None:
        if not self.server.wait_idle(self._left(self.cut_at)):
            self.cut()
        self.server.stop()

    def _left(self, until: float) -> float:
        return max(0.0, until - self.clock())

    # -- the cut ----------------------------------------------------------------------------
    def cut(self) -> None:
        """End what still runs: kill every plugin, refuse every request not started yet."""
        with self._lock:
            if self.cut_done:
                return
            self.cut_done = True
        why = (f"multusd is stopping (its stop deadline, {self.budget:.0f}s after the signal, "
               "is near): the request was not run; retry it (the next multusd serves it)")
        self.server.runner.refuse(why, lambda job: self.record(job, why))
        running, waiting = self.server.lanes.jobs()
        killed = self.running.end_all(f"multusd stopped it at its stop deadline "
                                      f"({self.budget:.0f}s after the signal)")
        LOG.warning("stop: %d request(s) still running after %.0fs (%s), %d waiting: their "
                    "plugins were killed (%s); a DEL cut short stays recorded as unreleased "
                    "and is released later, an ADD's records stay for the runtime's DEL",
                    len(running), self.clock() - self.started, describe(running),
                    len(waiting), ", ".join(killed) or "none running")

    def record(self, job: Job, why: str) -> None:
        """A DEL the stop cut short (or never ran): marked as a failing DEL is, for the
        runtime's retry, the daemon's own or ``multusd gc`` to release later."""
        if job.path != api.CNI_ENDPOINT or job.command != "DEL":
            return
        with self._lock:
            if id(job) in self._recorded:
                return
            self._recorded.add(id(job))
        try:
            env, config, _ = decode_body(job.body)
            request = parse(env, config, self.config)
            if not request.container_id:
                return
            # beside the sandbox's records, where its DEL would have put the mark
            request = sandboxconfig.sandbox_request(
                request, LOG, other_dirs=lambda: effective.node_cni_dirs(self.config))
            cni_dir = request.effective.cni_dir
            spare = delmarks.spare_marks_dir(self.config.socket_dir)
            earlier = delmarks.read(cni_dir, request.container_id, spare=spare)
            unreleased.record(cni_dir, request, earlier.failures if earlier else (), why,
                              window=self.config.delete_retry_window,
                              released=earlier.released if earlier else (), spare=spare)
        except Exception as exc:  # noqa: BLE001 - the stop goes on; said in the journal
            LOG.error("stop: a DEL cut short could not be recorded: %s",
                      exc.msg if isinstance(exc, MultusError) else repr(exc))
            return
        self.recorded.append(request.container_id)
        LOG.warning("stop: the DEL of sandbox %s was cut short; it is recorded as a failed "
                    "DEL (`multusd status`), to be released by the runtime's retry, multusd "
                    "itself or `multusd gc`", request.container_id,
                    extra={"CNI_CONTAINERID": request.container_id})

    # -- the exit ---------------------------------------------------------------------------
    def finish(self) -> None:
        """On the main thread, once the reactor has ended: wait for the requests running
        until the cut, then until the deadline; record and answer what is left."""
        if not self.server.wait_idle(self._left(self.cut_at)):
            self.cut()
            self.server.wait_idle(self._left(self.deadline))
        running, waiting = self.server.lanes.jobs()
        why = ("multusd stopped before this request could run; retry it (the next multusd "
               "serves it)")
        for job in running:
            self.record(job, "multusd stopped at its stop deadline while this DEL ran")
        for job in self.server.lanes.take_waiting():
            if job.task is not None:
                continue  # the daemon's own work (a reconciliation): no client to answer
            self.record(job, why)
            self.server.runner.answer(job, *not_started_answer(TryAgainLater(why)),
                                      timeout=ANSWER_TIMEOUT)
        if running or waiting:
            LOG.warning("stop: exiting with %d request(s) still running (%s)", len(running),
                        describe(running))
        LOG.info("stopped after %.1fs%s", self.clock() - self.started,
                 f"; DELs cut short and recorded: {', '.join(self.recorded)}"
                 if self.recorded else "")


def describe(jobs: List[Job]) -> str:
    """``ADD x2, DEL`` for the jobs given."""
    counts: dict = {}
    for job in jobs:
        counts[job.command or "?"] = counts.get(job.command or "?", 0) + 1
    return ", ".join(f"{c} x{n}" if n > 1 else c for c, n in sorted(counts.items())) or "none"
