"""A CNI request on a worker thread: run, answered on its connection, counted; the memory bound.

The reactor (:mod:`multusd.daemon.server`) reads a whole ``/cni`` or ``/delegate`` request
and hands it on as a :class:`~multusd.daemon.lanes.Job`; a worker of the lanes calls
:meth:`CniRunner.run_job`, which runs the daemon's handler within the request's deadline,
turns every failure into a 400 with CNI error JSON, writes the answer (blocking, bounded by
:data:`multusd.daemon.httpreq.READ_TIMEOUT`), closes the connection and gives back the bytes
the request held in the :class:`MemoryBound` (every request read and not yet answered counts
there: past the bound new bodies are refused "busy, retry"). A node slot of the lanes (STATUS,
GC) calls :meth:`CniRunner.run_shared` instead: the handler runs once, and its answer goes to
every request that joined the run. At the daemon's stop :meth:`CniRunner.refuse` makes it
answer every request not started yet "stopping, retry" instead of running it, with status 503
(:func:`not_started_answer`: nothing was done for it, the next daemon may serve it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional, Tuple

from multusd.daemon import httpreq
from multusd.daemon.lanes import Job
from multusd.errors import MultusError, NotReady, TryAgainLater, from_exception
from multusd.wire import api

LOG = logging.getLogger(__name__)

# handler(endpoint, body, deadline, request_id) -> response object (dict) or None
Handler = Callable[[str, bytes, float, str], Optional[Mapping[str, Any]]]


def error_answer(error: MultusError) -> tuple[int, bytes]:
    """(status, body) of a refused or failed request: 400 with the CNI error JSON."""
    return 400, json.dumps(error.to_cni_error()).encode()


def not_started_answer(error: MultusError) -> tuple[int, bytes]:
    """(status, body) of a request refused because the daemon stops, before anything was done
    for it: :data:`~multusd.wire.api.NOT_STARTED` (503) with the CNI error JSON, which tells
    multusd's shim that it may send it again to the next daemon (upstream's sees an error)."""
    return api.NOT_STARTED, json.dumps(error.to_cni_error()).encode()


class MemoryBound:
    """Bytes of requests held (read, not yet answered) against one bound; thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def over(self, more: int = 0) -> bool:
        """Whether holding ``more`` bytes would pass the bound (past it already: True)."""
        return self.held + more > self.limit

    def busy(self) -> MultusError:
        return TryAgainLater(f"multusd is busy: {self.held >> 20} MiB of requests are waiting "
                             "to be served; retry")

    def charge(self, conn: httpreq.Connection, size: int) -> None:
        """Count ``size`` bytes read on ``conn``, but for those charged in advance."""
        covered = min(size, conn.reserved)
        conn.reserved -= covered
        self.take(size - covered)
        conn.charged += size - covered

    def take(self, size: int) -> None:
        with self._lock:
            self.held += size

    def give_back(self, size: int) -> None:
        if size:
            with self._lock:
                self.held -= size

    def refund(self, conn: httpreq.Connection) -> None:
        """Everything ``conn`` holds goes back (it is answered or closed)."""
        self.give_back(conn.charged)
        conn.charged = conn.reserved = 0


class CniRunner:
    """Runs CNI requests for the server and counts their outcomes (see the module docstring).

    :param finished: called with each job once its connection is closed (the server counts
        its open connections).
    """

    def __init__(self, handler: Handler, memory: MemoryBound, *, request_timeout: float,
                 observe_http: Callable[[str, str, int], None],
                 after_request: Callable[[], None], finished: Callable[[Job], None]) -> None:
        self.handler = handler
        self.memory = memory
        self.request_timeout = request_timeout
        self.observe_http = observe_http
        self.after_request = after_request
        self.finished = finished
        self.counts = {"ok": 0, "failed": 0}
        self._counts_lock = threading.Lock()
        # (why, told of each job first): no job runs any more, each is answered TryAgainLater
        self.refusal: Optional[Tuple[str, Callable[[Job], None]]] = None

    def counted(self) -> dict:
        with self._counts_lock:
            return dict(self.counts)

    def too_late(self, job: Optional[Job] = None) -> tuple[int, bytes]:
        """The answer to a request that waited past its deadline (counted): for pod work, no
        worker became free; for STATUS and GC, an earlier run of it still ran (STATUS: "not
        available", code 50, as a STATUS that did not answer in time is)."""
        self.count("failed")
        command = job.command if job is not None else ""
        if command == "STATUS":
            return error_answer(NotReady(
                "multusd cannot serve ADD: the STATUS of its cluster network did not answer "
                "in time (an earlier STATUS of it was still running)"))
        if command == "GC":
            return error_answer(TryAgainLater(
                "multusd is busy: an earlier GC of the cluster network was still running "
                "when this one's deadline passed; retry"))
        return error_answer(TryAgainLater(
            f"multusd is busy: no worker became free within {self.request_timeout:.0f}s; "
            "raise \"workers\" in daemon-config.json or retry"))

    def refuse(self, why: str, told: Callable[[Job], None]) -> None:
        """From now on, run no job: answer each TryAgainLater ``why`` (503: not started),
        after telling ``told`` (the daemon's stop records a DEL it did not run)."""
        self.refusal = (why, told)

    def refused(self, job: Job) -> tuple[int, bytes]:
        """The answer to ``job`` once :meth:`refuse` was called (counted, ``told`` told)."""
        why, told = self.refusal
        try:
            told(job)
        except Exception:  # noqa: BLE001 - the request is still answered
            LOG.exception("recording a refused %s request failed", job.command or "CNI")
        self.count("failed")
        return not_started_answer(TryAgainLater(why))

    def run_job(self, job: Job) -> None:
        """On a worker thread: run one CNI request, answer it, close the connection."""
        if self.refusal is not None:
            status, payload = self.refused(job)
        elif time.monotonic() >= job.deadline:
            status, payload = self.too_late(job)
        else:
            status, payload = self.run_cni(job.path, job.body, job.deadline)
        self.answer(job, status, payload)

    def run_shared(self, first: Job) -> Callable[[Job], None]:
        """On a node slot's thread: run ``first`` once, within its deadline (the run's
        bound); returns how to answer it and each request that joined its run with the same
        answer (each counted). Refused, or past its deadline already: each is answered so."""
        if self.refusal is not None:
            return lambda job: self.answer(job, *self.refused(job))
        if time.monotonic() >= first.deadline:
            return lambda job: self.answer(job, *self.too_late(job))
        status, payload = self.run_cni(first.path, first.body, first.deadline)

        def answer(job: Job) -> None:
            if job is not first:
                self.count("ok" if status == 200 else "failed")
            self.answer(job, status, payload)

        return answer

    def answer(self, job: Job, status: int, payload: bytes,
               timeout: float = httpreq.READ_TIMEOUT) -> None:
        """Write the answer of ``job`` (blocking, up to ``timeout``), close its connection."""
        sock = job.conn
        try:
            sock.setblocking(True)
            sock.settimeout(timeout)
            sock.sendall(httpreq.response(status, payload))
            self.observe_http(job.path, job.method, status)
        except OSError as exc:
            LOG.debug("the client of a %s request went away before its answer: %s",
                      job.command or "CNI", exc)
        finally:
            try:
                sock.close()
            except OSError:
                pass
            self.memory.give_back(job.charged)
            self.finished(job)

    def run_cni(self, endpoint: str, body: bytes, deadline: float) -> tuple[int, bytes]:
        """Run one /cni or /delegate request; (status, body) to answer."""
        request_id = os.urandom(8).hex()  # not uuid: it imports platform
        try:
            response = self.handler(endpoint, body, deadline, request_id)
        except Exception as exc:  # every failure reaches the runtime as a CNI error
            error = from_exception(exc)
            if not isinstance(exc, MultusError):
                LOG.exception("request %s failed unexpectedly", request_id)
            self.count("failed")
            return error_answer(error)
        self.count("ok")
        if response is None:
            return 200, b""
        return 200, json.dumps(response).encode()

    def count(self, outcome: str) -> None:
        with self._counts_lock:
            self.counts[outcome] += 1
        self.after_request()
