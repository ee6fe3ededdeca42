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
* :func:`~multusd.core.reconcile.needs_reconciling` reads the records (outside the lanes, read
  only): only when something is to be done the reconciliation is queued, as a task in the
  sandbox's lane (:class:`~multusd.daemon.lanes.Job` keyed on its container ID), so it never
  runs beside that sandbox's ADD, DEL or another reconciliation, and reads the records again
  there. After a restart the first list delivers every pod again: each is looked at once, and
  what a restart interrupted is finished.

A failed reconciliation is retried on :class:`RetryPolicy` (per pod, jittered exponential,
bounded: after :attr:`RetryPolicy.attempts` failures it waits for the next change of the
annotation, or a restart). Its curve is a value of the API server's backoff type
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
from multusd.core import reconcile, unreleased
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


class _PodState:
    """What the daemon holds of one pod: the latest delivery and the reconciliation's state."""

    __slots__ = ("pod", "seen", "done", "failed", "failures", "due", "busy", "again")

    def __init__(self, pod: Any, seen: float) -> None:
        self.pod, self.seen = pod, seen
        self.done: Optional[Signature] = None    # the selections last reconciled
        self.failed: Optional[Signature] = None  # the selections whose reconciliation failed
        self.failures = 0                        # in a row, for ``failed``
        self.due: Optional[float] = None         # its retry is due then (the clock's time)
        self.busy = False   # a reconciliation is queued or running in the lanes
        self.again = False  # the pod changed meanwhile: look again when it is done


def signature(pod: Any) -> Signature:
    """What a reconciliation follows of a pod: its UID and network-selection annotation."""
    return pod.uid, pod.annotations.get(NETWORKS_ANNOTATION)


def eligible(pod: Any) -> bool:
    """A pod whose interfaces may change: running, not terminating."""
    return pod.phase == "Running" and not pod.deleting


class DynamicNetworks:
    """The daemon's dynamic attachments (see the module docstring).

    :param multus: the :class:`~multusd.core.multus.Multus` of the daemon (its
        :meth:`~multusd.core.multus.Multus.reconcile` runs in the lanes).
    """

    def __init__(self, multus: Any, *, cni_dir: str, request_timeout: float,
                 policy: RetryPolicy = RetryPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.multus = multus
        self.cni_dir = cni_dir
        self.request_timeout = request_timeout
        self.policy = policy
        self.clock = clock
        self.lanes: Optional[Lanes] = None
        self._pods: Dict[Key, _PodState] = {}
        self._changed: Dict[Key, None] = {}  # keys to look at, in the order they changed
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._running = 0  # reconciliations running on a worker
        self._pruned = clock()
        self._counts = {outcome: 0 for outcome in reconcile.OUTCOMES}
        self._checked = 0  # pods whose records were looked at
        self._looking = 0  # pods taken by the thread and not looked at yet

    # -- what the daemon calls --------------------------------------------------------------
    def pod_changed(self, pod: Any) -> None:
        """A pod as the watch delivered it (the watch's thread: never waits)."""
        key = (pod.namespace, pod.name)
        with self._cond:
            state = self._pods.get(key)
            if state is None:
                if not eligible(pod):
                    return  # nothing to follow yet; a running pod is delivered again
                state = self._pods[key] = _PodState(pod, self.clock())
            state.pod, state.seen = pod, self.clock()
            self._changed[key] = None
            self._cond.notify()

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
                    "pending": len(self._changed) + self._looking +
                    sum(1 for s in self._pods.values() if s.busy),
                    "retrying": sorted(f"{k[0]}/{k[1]}" for k, s in self._pods.items()
                                       if s.due is not None)}

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                if not self._work_ready():  # woken, or the next retry due: look again
                    self._cond.wait(self._next_wait())
                if self._stopping.is_set():
                    return
                keys = self._take_due()
                if self.clock() - self._pruned >= FORGET_AFTER:
                    self._forget_gone()
                wanted = [(key, pod) for key, pod in ((k, self._wanted(k)) for k in keys) if pod]
                self._looking = len(wanted)
            if not wanted:
                continue  # a pod's own status updates end here: nothing is read from disk
            try:
                entries = resultcache.list_entries(self.cni_dir)
            except MultusError as exc:
                LOG.warning("dynamic networks: cannot read the records in %s: %s", self.cni_dir,
                            exc.msg)
                entries = []
            for key, pod in wanted:
                try:
                    self._look(key, pod, entries)
                except Exception:  # noqa: BLE001 - one pod's bug must not stop the others
                    LOG.exception("dynamic networks: looking at pod %s/%s failed", *key)
                with self._cond:
                    self._looking -= 1

    def _work_ready(self) -> bool:
        return bool(self._changed) or self._stopping.is_set() or any(
            s.due is not None and s.due <= self.clock() and not s.busy
            for s in self._pods.values())

    def _next_wait(self) -> Optional[float]:
        dues = [s.due for s in self._pods.values() if s.due is not None and not s.busy]
        return max(0.0, min(dues) - self.clock()) if dues else None

    def _forget_gone(self) -> None:
        """Forget the pods the watch cache no longer holds (deleted: the watch hands this
        module no deletions), once nothing was delivered for them in a while (lock held)."""
        now = self._pruned = self.clock()
        kube = self.multus.kube
        for key, state in list(self._pods.items()):
            if not state.busy and now - state.seen >= FORGET_AFTER and \
                    kube.cached_pod(*key) is None:
                del self._pods[key]

    def _take_due(self) -> List[Key]:
        """The keys to look at now (lock held): changed ones, and retries that are due."""
        now = self.clock()
        keys = list(self._changed)
        self._changed.clear()
        keys += [k for k, s in self._pods.items()
                 if s.due is not None and s.due <= now and not s.busy and k not in keys]
        return keys

    def _wanted(self, key: Key) -> Any:
        """The pod to look at now, or None (lock held)."""
        state = self._pods.get(key)
        if state is None:
            return None
        pod = state.pod
        if not eligible(pod):
            del self._pods[key]  # its retries end; running again, it starts afresh
            return None
        if state.busy:
            state.again = True
            return None
        wanted = signature(pod)
        if state.due is not None:
            if wanted == state.failed and self.clock() < state.due:
                return None  # its retry is not due yet
        elif wanted == state.done:
            return None
        self._checked += 1
        return pod

    def _look(self, key: Key, pod: Any, entries: List[dict]) -> None:
        """Find the pod's sandbox, and queue its reconciliation if there is work."""
        container_id = reconcile.sandbox_of(
            pod, entries, self.cni_dir,
            spare=unreleased.spare_marks_dir(self.multus.config.socket_dir))
        if container_id is None:
            self._settle(key, pod, None)  # not attached by multusd (host network, ...)
            return
        log = _logger(pod, container_id, "check")
        if not self.multus.needs_reconciling(pod, container_id, log):
            self._settle(key, pod, None)
            return
        self._submit(key, pod, container_id)

    def _submit(self, key: Key, pod: Any, container_id: str) -> None:
        job = Job(None, "", "", b"", math.inf, COMMAND, container_id,
                  task=lambda job: self._task(key, container_id))
        with self._cond:
            state = self._pods.get(key)
            if state is None:
                return
            state.busy = True
        if self.lanes is None or not self.lanes.submit(job):
            LOG.warning("dynamic networks: the request queue is full; pod %s/%s is tried again "
                        "later", *key)
            with self._cond:
                state.busy = False
            self._settle(key, pod, reconcile.Outcome(result=reconcile.FAILED), count=False)

    def _task(self, key: Key, container_id: str) -> None:
        """On a worker of the lanes, in the sandbox's turn."""
        with self._cond:
            state = self._pods.get(key)
            pod = state.pod if state is not None else None
            if pod is None or self._stopping.is_set() or not eligible(pod):
                if state is not None:
                    state.busy = False
                return
            self._running += 1
        outcome: Optional[reconcile.Outcome] = None
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
            outcome = reconcile.Outcome(result=reconcile.FAILED)
        except Exception:  # noqa: BLE001 - counted as a failure, retried
            log.exception("dynamic networks: the reconciliation failed unexpectedly")
            outcome = reconcile.Outcome(result=reconcile.FAILED)
        finally:
            with self._cond:
                self._running -= 1
                if state is not None:
                    state.busy = False
                self._cond.notify_all()
            self._settle(key, pod, outcome)

    def _still_eligible(self, key: Key) -> bool:
        with self._cond:
            state = self._pods.get(key)
            return state is not None and eligible(state.pod)

    def _settle(self, key: Key, pod: Any, outcome: Optional[reconcile.Outcome], *,
                count: bool = True) -> None:
        """Record what happened to ``pod`` (None: nothing to do) and when to look again."""
        with self._cond:
            if outcome is not None and count:
                self._counts[outcome.result] += 1
            state = self._pods.get(key)
            if state is None:
                return
            reconciled = signature(pod)
            state.due = None
            if outcome is None or not outcome.retry:
                state.done, state.failed, state.failures = reconciled, None, 0
            else:
                state.failures = state.failures + 1 if reconciled == state.failed else 1
                state.failed = reconciled
                wait = self.policy.delay(state.failures)
                if wait is None:
                    LOG.warning("dynamic networks: pod %s/%s: giving up after %d failed "
                                "attempts; it is tried again when its network-selection "
                                "annotation changes, or at multusd's next start", key[0], key[1],
                                state.failures)
                    state.done, state.failed, state.failures = reconciled, None, 0
                else:
                    state.due = self.clock() + wait
            if state.again or signature(state.pod) != signature(pod):
                state.again = False
                self._changed[key] = None
            self._cond.notify_all()


def _logger(pod: Any, container_id: str, request_id: str) -> RequestLogger:
    env = {"CNI_COMMAND": COMMAND, "CNI_CONTAINERID": container_id}
    return RequestLogger(LOG, request_fields(env, {
        "K8S_POD_NAMESPACE": pod.namespace, "K8S_POD_NAME": pod.name, "K8S_POD_UID": pod.uid},
        request_id))
