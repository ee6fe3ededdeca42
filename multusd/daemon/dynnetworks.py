"""``enableDynamicNetworks`` on the daemon's side: pods whose selections change, reconciled.

The pod watch hands every pod it delivers to :meth:`DynamicNetworks.pod_changed` (on the
watch's thread: the pod is kept, a thread of this module is woken, nothing waits). That thread
looks at each pod that changed:

* only a pod that is ``Running`` and not terminating, whose network-selection annotation (or
  UID) differs from the one last reconciled, is looked at (a re-delivered event, a relist, the
  pod's own status updates cost a comparison); a pod that starts terminating loses its retries
  and stops a reconciliation under way between two steps;
* its sandbox is the one the node's records name for it (container ID, same UID unless it is a
  static pod, its network namespace present): a pod multusd did not attach is left alone;
* :meth:`~multusd.core.multus.Multus.needs_reconciling` reads the records
  (:mod:`multusd.core.podsandbox`: outside the lanes, read only, judged by the configuration
  the sandbox was attached under): only when something is to be done the reconciliation is
  queued, as a task in the sandbox's lane (:class:`~multusd.daemon.lanes.Job` keyed on its
  container ID), so it never runs beside that sandbox's ADD, DEL or another reconciliation,
  and reads the records again there. After a restart the first list delivers every pod again:
  each is looked at once, and what a restart interrupted is finished.

Each followed pod is in one phase (:class:`_Followed`): IDLE (its selections dealt with),
PENDING (to be looked at), LOOKING, QUEUED (its reconciliation in the lanes) or BACKOFF. A look
that fails for any reason (the records unreadable, the sandbox's configuration not
established, an unexpected exception, the queue full) and a failed reconciliation put the pod
in BACKOFF, retried on :class:`RetryPolicy` (per pod, jittered exponential, bounded: after
:attr:`RetryPolicy.attempts` failures it waits for the next change of the annotation, or a
restart): never a loop. Its curve is a value of the API server's backoff type
(:class:`~multusd.kube.retries.BackoffPolicy`), with its own numbers: it paces the plugin runs
of one pod, not requests to the API server.
Reconciliations are counted by outcome (``multusd_dynamic_reconciliations_total``).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from multusd.cni import resultcache
from multusd.core import delmarks, podsandbox, reconcile
from multusd.core.selection import NETWORKS_ANNOTATION
from multusd.daemon.lanes import Job, Lanes
from multusd.daemon.log import RequestLogger, request_fields
from multusd.errors import MultusError
from multusd.kube.retries import BackoffPolicy
from multusd.store.valueclass import Record

LOG = logging.getLogger(__name__)
COMMAND = "RECONCILE"  # the command of its lane jobs and log lines

Key = Tuple[str, str]
Signature = Tuple[str, Optional[str]]
FORGET_AFTER = 60.0  # a pod the watch cache no longer holds is forgotten this long after


#: a pod's failed reconciliation, again after 1 s doubling to 60 s, jittered (the house's one
#: backoff value); a success ends the run, so calm plays no part
RECONCILE_RETRY = BackoffPolicy(initial=1.0, cap=60.0, factor=2.0, jitter=1.0, calm=math.inf)


class RetryPolicy(Record):
    """When a pod whose reconciliation failed is tried again: on ``curve`` after each failure
    in a row, no more after ``attempts`` of them."""

    curve: BackoffPolicy = RECONCILE_RETRY
    attempts: int = 8

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> Optional[float]:
        """Seconds to wait after the ``failures``-th failure in a row; None: give up."""
        if failures >= self.attempts:
            return None
        return self.curve.wait(max(0, failures - 1), rand=rand)


# Where a followed pod's reconciliation stands (_Followed.phase): the one state a pod is in.
IDLE = "idle"        # nothing to do until its selections change (``settled``)
PENDING = "pending"  # to be looked at, in the order the pods changed
LOOKING = "looking"  # taken by the thread, its records being looked at
QUEUED = "queued"    # its reconciliation is in the lanes (queued or running)
BACKOFF = "backoff"  # its look or reconciliation failed: looked at again at ``due``


class _Followed:
    """One pod the daemon follows: its latest delivery and its phase. Every change of phase
    is one of the methods below, called with the lock held."""

    __slots__ = ("pod", "seen", "phase", "settled", "failing", "failures", "due")

    def __init__(self, pod: Any, seen: float) -> None:
        self.pod, self.seen = pod, seen
        self.phase = IDLE
        self.settled: Optional[Signature] = None  # IDLE: the selections dealt with
        self.failing: Optional[Signature] = None  # BACKOFF: the selections that failed
        self.failures = 0                         # in a row, for ``failing``
        self.due: Optional[float] = None          # BACKOFF: when it is looked at again

    def wants_look(self, now: float) -> bool:
        """Whether it is to be looked at now: its selections changed since they were dealt
        with, or since they failed; or its retry is due."""
        wanted = signature(self.pod)
        if self.phase == IDLE:
            return wanted != self.settled
        if self.phase == BACKOFF:
            return wanted != self.failing or (self.due is not None and now >= self.due)
        return False

    def done(self, dealt: Signature) -> None:
        """``dealt`` reconciled, or nothing to do for it (or given up on)."""
        self.phase, self.settled = IDLE, dealt
        self.failing, self.failures, self.due = None, 0, None

    def failed(self, dealt: Signature, policy: "RetryPolicy", now: float) -> Optional[int]:
        """A look or reconciliation of ``dealt`` failed: BACKOFF on ``policy``. When the policy
        gives up: IDLE until the selections change, and how many failed in a row."""
        failures = self.failures + 1 if dealt == self.failing else 1
        wait = policy.delay(failures)
        if wait is None:
            self.done(dealt)
            return failures
        self.phase, self.failing, self.failures, self.due = BACKOFF, dealt, failures, now + wait
        return None


def signature(pod: Any) -> Signature:
    """What a reconciliation follows of a pod: its UID and network-selection annotation."""
    return pod.uid, pod.annotations.get(NETWORKS_ANNOTATION)


def eligible(pod: Any) -> bool:
    """A pod whose interfaces may change: running, not terminating."""
    return pod.phase == "Running" and not pod.deleting


class DynamicNetworks:
    """The daemon's dynamic attachments (see the module docstring).

    :param multus: the :class:`~multusd.core.multus.Multus` of the daemon (its
        :meth:`~multusd.core.multus.Multus.reconcile` runs in the lanes; its node
        configuration says where the records are).
    """

    def __init__(self, multus: Any, *, request_timeout: float,
                 policy: RetryPolicy = RetryPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.multus = multus
        self.request_timeout = request_timeout
        self.policy = policy
        self.clock = clock
        self.lanes: Optional[Lanes] = None
        self._pods: Dict[Key, _Followed] = {}
        self._pending: Dict[Key, None] = {}  # PENDING pods, in the order they changed
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._running = 0  # reconciliations running on a worker
        self._pruned = clock()
        self._counts = {outcome: 0 for outcome in reconcile.OUTCOMES}
        self._checked = 0  # pods whose records were looked at

    # -- what the daemon calls --------------------------------------------------------------
    def pod_changed(self, pod: Any) -> None:
        """A pod as the watch delivered it (the watch's thread: never waits)."""
        key = (pod.namespace, pod.name)
        with self._cond:
            state = self._pods.get(key)
            if state is None:
                if not eligible(pod):
                    return  # nothing to follow yet; a running pod is delivered again
                state = self._pods[key] = _Followed(pod, self.clock())
            state.pod, state.seen = pod, self.clock()
            self._review(key, state)

    def start(self, lanes: Lanes) -> "DynamicNetworks":
        self.lanes = lanes
        self._thread = threading.Thread(target=self._run, name="multusd-dynamic", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """No more reconciliations; wait up to ``timeout`` s in all for the running ones to
        stop (they stop between two steps) and for the thread to end."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._running == 0, timeout)
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def counts(self) -> Dict[str, int]:
        """Reconciliations so far, by outcome (:data:`multusd.core.reconcile.OUTCOMES`)."""
        with self._cond:
            return dict(self._counts)

    def status(self) -> Dict[str, Any]:
        """For ``GET /status``: the reconciliations by outcome, how many times a pod's records
        were looked at, and the pods waiting for a retry."""
        with self._cond:
            return {"reconciliations": dict(self._counts), "podsChecked": self._checked,
                    "pending": sum(1 for s in self._pods.values()
                                   if s.phase in (PENDING, LOOKING, QUEUED)),
                    "retrying": sorted(f"{k[0]}/{k[1]}" for k, s in self._pods.items()
                                       if s.phase == BACKOFF)}

    # -- the phases (lock held) -------------------------------------------------------------
    def _review(self, key: Key, state: _Followed) -> None:
        """After a delivery or a look: an ineligible pod is forgotten once nothing of it runs;
        one to be looked at is PENDING."""
        if state.phase in (LOOKING, QUEUED):
            return  # reviewed again once its look or reconciliation is over
        if not eligible(state.pod):
            del self._pods[key]  # its retries end; running again, it starts afresh
            self._pending.pop(key, None)
            return
        if state.phase != PENDING and state.wants_look(self.clock()):
            state.phase = PENDING
            self._pending[key] = None
            self._cond.notify()

    def _fail(self, key: Key, state: _Followed, dealt: Signature) -> None:
        gave_up = state.failed(dealt, self.policy, self.clock())
        if gave_up is not None:
            LOG.warning("dynamic networks: pod %s/%s: giving up after %d failed attempts; it "
                        "is tried again when its network-selection annotation changes, or at "
                        "multusd's next start", key[0], key[1], gave_up)

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                wanted = self._take()
                if not wanted and not self._stopping.is_set():
                    self._cond.wait(self._next_wait())
                    continue
            if self._stopping.is_set():
                return
            try:
                node = self.multus.node.current()
                entries = resultcache.list_entries(node.cni_dir)
            except Exception as exc:  # noqa: BLE001 - every pod taken fails, with the backoff
                LOG.warning("dynamic networks: cannot read the records: %s",
                            exc.msg if isinstance(exc, MultusError) else repr(exc))
                for key, pod in wanted:
                    self._finish_look(key, pod, failed=True)
                continue
            for key, pod in wanted:
                failed = False
                try:
                    self._look(key, pod, node.cni_dir, entries)
                except Exception as exc:  # noqa: BLE001 - one pod's failure stops no other
                    failed = True
                    self._say_failed_look(key, exc)
                self._finish_look(key, pod, failed=failed)

    def _take(self) -> List[Tuple[Key, Any]]:
        """The pods to look at now, LOOKING from here (lock held): those PENDING, in the order
        they changed, and those whose retry is due."""
        now = self.clock()
        if now - self._pruned >= FORGET_AFTER:
            self._forget_gone()
        for key, state in self._pods.items():
            if state.phase == BACKOFF and state.wants_look(now):
                state.phase = PENDING
                self._pending[key] = None
        taken = []
        for key in self._pending:
            state = self._pods.get(key)
            if state is None or state.phase != PENDING:
                continue
            state.phase = LOOKING
            self._checked += 1
            taken.append((key, state.pod))
        self._pending.clear()
        return taken

    def _next_wait(self) -> Optional[float]:
        dues = [s.due for s in self._pods.values() if s.phase == BACKOFF and s.due is not None]
        return max(0.0, min(dues) - self.clock()) if dues else None

    def _forget_gone(self) -> None:
        """Forget the pods the watch cache no longer holds (deleted: the watch hands this
        module no deletions), once nothing was delivered for them in a while (lock held)."""
        now = self._pruned = self.clock()
        kube = self.multus.kube
        for key, state in list(self._pods.items()):
            if state.phase in (IDLE, PENDING, BACKOFF) and now - state.seen >= FORGET_AFTER \
                    and kube.cached_pod(*key) is None:
                del self._pods[key]
                self._pending.pop(key, None)

    def _look(self, key: Key, pod: Any, cni_dir: str, entries: List[dict]) -> None:
        """Find the pod's sandbox, and queue its reconciliation if there is work.

        :raises Exception: whatever went wrong (the caller fails the look, with the backoff).
        """
        container_id = podsandbox.sandbox_of(
            pod, entries, cni_dir,
            spare=delmarks.spare_marks_dir(self.multus.config.socket_dir))
        if container_id is None:
            return  # not attached by multusd (host network, ...)
        log = _logger(pod, container_id, "check")
        try:
            needed = self.multus.needs_reconciling(pod, container_id, log)
        except podsandbox.Unestablished as exc:
            if self.multus.notices.first(container_id, exc.msg):
                log.warning("dynamic networks: nothing is changed: the sandbox's configuration "
                            "cannot be established: %s", exc.msg)
            raise
        if needed:
            self._submit(key, container_id)

    def _say_failed_look(self, key: Key, exc: BaseException) -> None:
        if isinstance(exc, podsandbox.Unestablished):
            return  # said once, by _look
        if isinstance(exc, MultusError):
            LOG.warning("dynamic networks: looking at pod %s/%s failed: %s", key[0], key[1],
                        exc.msg)
        else:
            LOG.error("dynamic networks: looking at pod %s/%s failed unexpectedly", *key,
                      exc_info=exc)

    def _finish_look(self, key: Key, pod: Any, *, failed: bool) -> None:
        """The look at ``pod`` is over: nothing to do (IDLE), its reconciliation queued
        (QUEUED, by :meth:`_submit`), or it failed (BACKOFF)."""
        with self._cond:
            state = self._pods.get(key)
            if state is None or state.phase != LOOKING:
                return
            if failed:
                self._fail(key, state, signature(pod))
            else:
                state.done(signature(pod))
            self._review(key, state)

    def _submit(self, key: Key, container_id: str) -> None:
        job = Job(None, "", "", b"", math.inf, COMMAND, container_id,
                  task=lambda job: self._task(key, container_id))
        with self._cond:
            state = self._pods.get(key)
            if state is None or state.phase != LOOKING:
                return
            state.phase = QUEUED
        if self.lanes is None or not self.lanes.submit(job):
            with self._cond:
                state.phase = LOOKING  # the look failed: queued it was not
            raise MultusError("the request queue is full; the pod is tried again later")

    def _task(self, key: Key, container_id: str) -> None:
        """On a worker of the lanes, in the sandbox's turn."""
        with self._cond:
            state = self._pods.get(key)
            pod = state.pod if state is not None else None
            if state is None or self._stopping.is_set() or not eligible(pod):
                if state is not None:
                    state.done(signature(pod))
                    self._review(key, state)
                return
            self._running += 1
        outcome = reconcile.Outcome(result=reconcile.FAILED)
        log = _logger(pod, container_id, "")
        try:
            log.info("dynamic networks: applying the pod's network selections")
            outcome = self.multus.reconcile(
                pod, container_id, time.monotonic() + self.request_timeout, log,
                stopping=lambda: self._stopping.is_set() or not self._still_eligible(key))
            log.info("dynamic networks: %s%s%s", outcome.result,
                     f"; added {', '.join(outcome.added)}" if outcome.added else "",
                     f"; removed {', '.join(outcome.removed)}" if outcome.removed else "")
        except MultusError as exc:  # the sandbox went away under it (its netns ...): retried
            log.warning("dynamic networks: the reconciliation failed: %s", exc.msg)
        except Exception:  # noqa: BLE001 - counted as a failure, retried
            log.exception("dynamic networks: the reconciliation failed unexpectedly")
        finally:
            with self._cond:
                self._running -= 1
                self._counts[outcome.result] += 1
                if state.phase == QUEUED:
                    if outcome.retry:
                        self._fail(key, state, signature(pod))
                    else:
                        state.done(signature(pod))
                if self._pods.get(key) is state:
                    self._review(key, state)
                self._cond.notify_all()

    def _still_eligible(self, key: Key) -> bool:
        with self._cond:
            state = self._pods.get(key)
            return state is not None and eligible(state.pod)


def _logger(pod: Any, container_id: str, request_id: str) -> RequestLogger:
    env = {"CNI_COMMAND": COMMAND, "CNI_CONTAINERID": container_id}
    return RequestLogger(LOG, request_fields(env, {
        "K8S_POD_NAMESPACE": pod.namespace, "K8S_POD_NAME": pod.name, "K8S_POD_UID": pod.uid},
        request_id))
