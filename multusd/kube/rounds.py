"""How a reflector's round ends: the failure accounted for, what the next round asks, how long it waits.

*One backoff for every way back to the server* (architecture invariant 9). A round is one
sync or one watch of a :class:`multusd.kube.reflector.Reflector` (:meth:`Rounds.round`); it
fails unless it was a watch the server ended after it lived (:mod:`multusd.kube.failures`):
an ERROR event whatever the stream delivered before it, a 410 on a watch or a relist, a refused or cut connection, an error answer (429, 5xx,
403 ...), a WatchList the server refuses, a watch the server ends within :data:`YOUNG_WATCH` of
its answer, news or not (client-go counts only one that ended within a second without news;
a server or proxy that ends every watch right after an event would then be asked again as
fast as it answers). Each failure waits on the reflector's one
:class:`~multusd.kube.retries.Delays` of :data:`~multusd.kube.retries.API_SERVER` (0.8 s
doubling to 30 s, each wait in ``[d, 2d)``, never less than the server's Retry-After); answers
do not reset it, two minutes without a failure do. What failed decides what the next round
asks for, and how long it waits in two cases only (:meth:`Rounds.wait_after`):

* *a watch's expiry is the server's normal answer after a restart or a compaction*: a watch
  that gets 410 (at its start or as an ERROR event) relists at once, with no wait, if a watch
  has worked (followed changes for :data:`YOUNG_WATCH`; a WatchList's from the end of its
  initial events) since the last relist that came so, or none came yet.
  When that relist fails, or 410s come again without a working watch between them, they are
  failures as any: a server that answers 410 to everything is asked on the curve;
* *a server that is starting* (:data:`multusd.kube.failures.STARTING`: 429 "storage is
  (re)initializing", a 403 to a list or watch it served before) is asked again on the curve's
  first step or after its Retry-After, without growing the curve, for
  :attr:`~multusd.kube.retries.BackoffPolicy.starting` (10) such answers per run of failures,
  the next round a relist (its new watch cache does not hold the version a watch would resume
  from: one request less than a watch answered 410). A 403 that lasts past them is the refusal
  it says it is: reported as such, the curve growing again.

No sequence of answers makes a loop, and the nodes of a cluster whose watches all end at once
come back spread over seconds, then minutes.

While a cache is known stale (expired, until its relist completes) it does not count as synced;
a failure is kept for the readers (its message and HTTP status) until an answer clears it,
and counted by cause (:data:`REOPEN_CAUSES`) where it ended a watch.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, Optional

from multusd.kube import failures
from multusd.kube.retries import retry_after_of
from multusd.kube.watchstream import answer

__all__ = ["Rounds", "Outcome", "YOUNG_WATCH", "REOPEN_CAUSES"]

LOG = logging.getLogger("multusd.kube.reflector")  # one log for the reflectors' rounds and reads

# a watch the server ends sooner ended early: a failure (a healthy one lives its 240-300 s,
# a proxy that cuts them at a minute still gets them reopened at once); at most a few a minute
YOUNG_WATCH = 15.0
# what a failure of a server that is starting adds to its message (failures.STARTING)
STARTING_NOTE = (" (taken as an API server that is starting up: it served this before, or its "
                 "storage is initialising; asked again soon)")
# why a watch ended and another was opened (the label of multusd_watch_reopens_total)
REOPEN_CAUSES = ("ended", "expired", "error", "connection", "silence")


class Outcome(NamedTuple):
    """How a round ended (:meth:`Rounds.round`)."""

    failure: Optional[str]  # one of multusd.kube.failures.KINDS; None: a watch ended as it should
    cause: str  # why the watch ended (REOPEN_CAUSES)
    watched: bool  # a watch followed changes (or was asked for): counted as a reopen
    retry_after: Optional[float] = None  # seconds the server asked for
    at_once: bool = False  # a watch's expiry after a working watch: relisted with no wait


class Rounds:
    """The loop of a :class:`multusd.kube.reflector.Reflector` (mixed in): one round after
    the other, each failure accounted for and waited on. The reflector holds the state
    (``state``, ``kind``, ``what``, ``config``, ``delays``, ``need_list``, ``version`` ...)
    and reads (``_sync``, ``_watch``)."""

    def run(self) -> None:
        stopping = self.state.stopping
        while not stopping.is_set():
            outcome = self.round()
            if stopping.is_set():
                break
            if outcome.failure is not None:
                self._pause(self.wait_after(outcome))

    def wait_after(self, outcome: Outcome) -> float:
        """Seconds to wait after a failed round: none before the relist of a watch's expiry
        that follows a working watch (:attr:`Outcome.at_once`); else the one backoff's next
        wait, which for a server that is starting is its first step (see the module
        docstring)."""
        if outcome.at_once:
            return 0.0
        return self.delays.next(outcome.retry_after,
                                starting=outcome.failure == failures.STARTING)

    def round(self) -> Outcome:
        """One sync or one watch, followed until it ends; never raises. A failure sets what
        the next round asks for (:func:`multusd.kube.failures.plan`), not how long it waits."""
        self._opened, self._following, self._watching = None, None, False
        try:
            cause = self._sync() if self.need_list else self._watch()
        except Exception as exc:  # noqa: BLE001 - the watch thread must not die
            return self._failed(exc)
        if cause == "ended" and not self._lived():
            return self._failed(None, failures.YOUNG)  # a server that ends every watch early
        # a watch worked: its successor's 410 is relisted at once
        self._relist_at_once = self._relist_at_once or self._worked()
        self._count_reopen(cause)
        return Outcome(None, cause, True)

    def _lived(self) -> bool:
        """The round's watch lived :data:`YOUNG_WATCH` from its answer: not ended young."""
        return self._opened is not None and time.monotonic() - self._opened >= YOUNG_WATCH

    def _worked(self) -> bool:
        """The round's watch followed changes for :data:`YOUNG_WATCH` (a WatchList: from the
        end of its initial events; the time it took to stream them is a list's, not a
        watch's)."""
        return self._following is not None and \
            time.monotonic() - self._following >= YOUNG_WATCH

    def _failed(self, exc: Optional[BaseException], kind: str = "") -> Outcome:
        """Account for a failed round: what the next one asks for, the failure reported."""
        kind = kind or failures.kind_of(exc, self._served)  # type: ignore[arg-type]
        if kind == failures.STARTING and self.delays.starting_spent:
            kind = failures.ANSWERED  # it lasted: the refusal it says it is
        syncing = self.need_list  # the whole state was being read (not a watch following it)
        watched = self._watching and not syncing
        step = failures.plan(kind, syncing)
        if self.state.stopping.is_set():
            return Outcome(kind, step.cause, watched)
        self._relist_at_once = self._relist_at_once or self._worked()
        at_once = kind == failures.EXPIRED and not syncing and self._relist_at_once
        if at_once:
            self._relist_at_once = False  # the next 410 without a working watch waits
        self.need_list = self.need_list or step.relist
        self.version_unavailable = self.version_unavailable or step.consistent
        if kind == failures.UNEXPECTED:
            LOG.error("%s watch failed unexpectedly", self.kind, exc_info=exc)
        elif kind in (failures.EXPIRED, failures.TOO_LARGE):
            LOG.info("the API server cannot serve %s at version %s (%s); listing them %s",
                     self.kind, self.version or "0", exc,
                     "consistently" if step.consistent else "again at that version")
        elif kind in (failures.YOUNG, failures.UNFINISHED, failures.SILENT):
            LOG.info("the %s %s; asking again", self.kind, {
                failures.YOUNG: f"watch was ended by the server within {YOUNG_WATCH:g}s",
                failures.UNFINISHED: "WatchList ended before its initial events did",
                failures.SILENT: "stream sent nothing within its time"}[kind])
        elif exc is not None and kind != failures.NO_WATCH_LIST:
            self._report(exc, starting=kind == failures.STARTING)
        if step.stale:
            self._stale()
        if watched:
            self._count_reopen(step.cause)
        return Outcome(kind, step.cause, watched, retry_after_of(exc) if exc else None, at_once)

    def _count_reopen(self, cause: str) -> None:
        with self.state.cond:
            key = (self.kind, cause)
            self.state.reopens[key] = self.state.reopens.get(key, 0) + 1

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``. :meth:`WatchState.stop` ends it; a reader that found the API
        answering (:meth:`multusd.kube.client.KubeClient.get_nad`) ends it early, a
        Retry-After's too, but once per run of failures (:attr:`Delays.streak`, which only a
        calm period starts anew): a reader's wake-up adds at most one request per run, it
        cannot make a loop."""
        wake, stopping = self.state.wake[self.kind], self.state.stopping
        wake.clear()  # a wake-up from before this failure says nothing about it
        end = time.monotonic() + seconds
        while not stopping.is_set():
            left = end - time.monotonic()
            if left <= 0 or not wake.wait(left):
                return
            wake.clear()
            if self._woken != self.delays.streak:
                self._woken = self.delays.streak
                return

    def _stale(self) -> None:
        with self.state.cond:
            self.state.synced[self.kind] = False
            self.state.relists[self.kind] += 1
            self.state.cond.notify_all()

    def _report(self, exc: BaseException, starting: bool = False) -> None:
        """Keep the failure for the readers and the status; log it, a server that is starting
        (:data:`multusd.kube.failures.STARTING`) without a warning: its refusal says nothing
        yet, and one that lasts is reported anew as the refusal it is."""
        failure = self.config.failure(exc, f"watch {self.what}")
        message = failure.msg + (STARTING_NOTE if starting else "")
        with self.state.cond:
            first = self.state.errors[self.kind] != message
            self.state.errors[self.kind] = message
            self.state.error_status[self.kind] = getattr(exc, "status", None)
            self.state.cond.notify_all()
        # the same failure again is logged quietly: the backoff already spaces the attempts
        if starting:
            LOG.log(logging.INFO if first else logging.DEBUG, "the API server answered %s to "
                    "the %s watch%s", answer(exc), self.kind, STARTING_NOTE)
        else:
            LOG.log(logging.WARNING if first else logging.DEBUG, "%s; retrying", message)

    def _recovered(self) -> None:
        """Forget the last failure (called with the state's lock held)."""
        if self.state.errors[self.kind] is not None:
            self.state.errors[self.kind] = None
            self.state.error_status[self.kind] = None
            LOG.info("the %s watch is working again", self.kind)
