"""Unreleased sandboxes, from the daemon's side: the window published, DEL retried, announced.

At start the daemon publishes its ``deleteRetryWindow`` for the shim (which needs it when the
daemon cannot answer). Then it releases by itself what is recorded as unreleased: the
sandboxes whose DEL kept failing past their window, its own or the shim's (while the daemon
was down or broken), in ``<cniDir>`` and in the spare marks directory beside the socket. It
runs the runtime's DEL of each again, exactly as the runtime sent it and through the daemon's
own socket (the lanes keep it one at a time with the runtime's requests for that sandbox;
deadline, logs and metrics as for any request; only the delegates still held run):

* at once when the daemon starts, without waiting for the pod cache (a DEL needs none), so
  that a pod deleted while the daemon was down has its addresses back within seconds of the
  daemon's return;
* then each sandbox still failing on its own backoff: :data:`RETRY_FIRST` seconds, doubling
  to :data:`RETRY_MAX`, each wait up to half as long again at random (many nodes whose IPAM
  server was down do not come back in step; the house's one backoff value,
  :class:`~multusd.kube.retries.BackoffPolicy`); a sandbox released leaves the schedule;
* new marks are looked for every :data:`SCAN_INTERVAL`, and when a sandbox's window ends
  (the runtime stops retrying then): a sandbox the daemon answered success for is retried
  within seconds.

A shim whose config names no ``cniDir`` marks in Multus's default one: with a
daemon-config.json naming another, those marks are moved beside their records at each look
(:func:`~multusd.core.markadoption.adopt`), and dropped once their sandbox is released: when
the daemon answers its DEL (:meth:`DelRetrier.after_del`), or at the next look when something
else released it.

A sandbox still failing after its first retry is announced once (a journal warning, an Event
while the pod exists, which waits up to :data:`SYNC_WAIT` for the pod cache). Marks whose
sandbox has no records left (released by another DEL, upstream's daemon, ``gc --forget``)
are dropped.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from multusd import DEFAULT_CNI_DIR, clock_now
from multusd.core import delmarks, markadoption, settings, unreleased, unreleasedwarning
from multusd.errors import MultusError
from multusd.kube.retries import BackoffPolicy, Delays
from multusd.wire import api, delwindow

LOG = logging.getLogger(__name__)

RETRY_FIRST = 5.0     # seconds before a sandbox that failed again is retried ...
RETRY_MAX = 300.0     # ... doubling to 5 minutes
RETRY_JITTER = 0.5    # each wait is its step times 1 to 1.5, at random
SCAN_INTERVAL = 30.0  # how often new marks are looked for, with nothing due before
SYNC_WAIT = 60.0      # how long an announcement waits for the pod cache (its Event)

Handler = Callable[[str, bytes, float, str], Optional[Mapping[str, Any]]]


def through_socket(path: str) -> Handler:
    """A handler that sends the retrier's requests to the daemon's socket at ``path``, where
    the lanes keep each one at a time with the runtime's requests for its sandbox."""

    def send(endpoint: str, body: bytes, deadline: float, request_id: str) -> None:
        try:
            failure = api.post_failure(path, endpoint, body,
                                       timeout=max(1.0, deadline - time.monotonic() + 5))
        except OSError as exc:
            raise MultusError(f"cannot reach multusd's socket {path}: {exc}") from None
        if failure:
            raise MultusError(failure)
    return send


class DelRetrier:
    """The daemon's background thread for unreleased sandboxes (see the module docstring)."""

    def __init__(self, config: Any, multus: Any, handle: Handler, *,
                 first: float = RETRY_FIRST, cap: float = RETRY_MAX,
                 scan: float = SCAN_INTERVAL, sync_wait: float = SYNC_WAIT,
                 shim_default: str = DEFAULT_CNI_DIR) -> None:
        self.config = config
        self.multus = multus
        self.handle = handle  # sends a request to the daemon: (endpoint, body, deadline, id)
        self.curve = BackoffPolicy(initial=first, cap=cap, jitter=RETRY_JITTER, calm=math.inf)
        self.scan, self.sync_wait = scan, sync_wait
        self.cni_dir = settings.cni_dir_of(config.raw)
        self.spare = delmarks.spare_marks_dir(config.socket_dir)
        self.shim_default = shim_default  # where a shim whose config names no cniDir marks
        self._shim_elsewhere = os.path.realpath(shim_default) != os.path.realpath(self.cni_dir)
        self.retries = 0   # DELs run again, and how many released their sandbox (the notes'
        self.released = 0  # and the tests' view of what the thread did)
        self._due: Dict[str, Tuple[float, Delays]] = {}  # container ID -> (when, its backoff)
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "DelRetrier":
        try:
            delmarks.publish_window(self.cni_dir, self.config.delete_retry_window,
                                      delwindow.DEFAULT_WINDOW, spare=self.spare)
        except MultusError as exc:
            LOG.warning("cannot tell the shim the deleteRetryWindow: %s; a shim that cannot "
                        "reach multusd uses the default", exc.msg)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="multusd-unreleased",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pause = self.run_due()
            except Exception:  # noqa: BLE001 - never take the daemon down; said in the journal
                LOG.exception("retrying the DEL of unreleased sandboxes failed")
                pause = self.scan
            if self._stop.wait(pause):
                return

    def run_due(self) -> float:
        """Retry each unreleased sandbox whose turn it is (each new one at once), announce
        those still failing; the seconds until something is due again."""
        self._tidy()
        now = clock_now()
        marks = delmarks.read_all(self.cni_dir, spare=self.spare)
        left = [m for m in marks.values() if m.is_unreleased(now)
                and markadoption.has_records(m.cni_dir or self.cni_dir, m.container_id)]
        still = {m.container_id for m in left}
        self._due = {cid: due for cid, due in self._due.items() if cid in still}
        for mark in left:
            if self._stop.is_set():
                break
            when, backoff = self._due.get(mark.container_id, (0.0, None))
            if time.monotonic() < when:
                continue
            if self.retry(mark):
                self._due.pop(mark.container_id, None)
                continue
            backoff = backoff or self.curve.delays()
            self._due[mark.container_id] = (time.monotonic() + backoff.next(), backoff)
            self._announce_if_due(mark.container_id)
        pause = self.scan
        if self._due:
            pause = min(pause, min(when for when, _ in self._due.values()) - time.monotonic())
        reporting = [m.ends_in(now) for m in marks.values() if not m.is_unreleased(now)]
        if reporting:  # the runtime stops retrying when the window ends: the daemon goes on
            pause = min(pause, min(reporting) + 1.0)
        return max(0.1, pause)

    def retry_all(self) -> int:
        """Run the DEL of every unreleased sandbox again, now; announce those still failing;
        how many were released."""
        self._tidy()
        released = 0
        for mark in unreleased.unreleased(self.cni_dir, spare=self.spare):
            if self._stop.is_set():
                break
            if self.retry(mark):
                released += 1
            else:
                self._announce_if_due(mark.container_id, wait=False)
        return released

    def _tidy(self) -> None:
        """The shim's marks in the default directory taken in (see
        :func:`~multusd.core.markadoption.adopt`), the marks of released sandboxes dropped."""
        try:
            for container_id in markadoption.adopt(self.shim_default, self.cni_dir,
                                                 spare=self.spare):
                LOG.info("the mark of sandbox %s's failed DEL, written by the shim in %s (its "
                         "config names no cniDir), is now kept in %s beside its records",
                         container_id, self.shim_default, self.cni_dir)
        except MultusError as exc:  # said; the mark stays where it is until the next scan
            LOG.warning("%s", exc.msg)
        markadoption.prune(self.cni_dir, spare=self.spare)
        if self._shim_elsewhere:
            for container_id in markadoption.prune(self.shim_default, records_in=(self.cni_dir,)):
                LOG.info("the mark of sandbox %s's failed DEL, written by the shim in %s (its "
                         "config names no cniDir), is dropped: the sandbox is released",
                         container_id, self.shim_default)

    def after_del(self, container_id: str) -> None:
        """The daemon answered a DEL (or ``gc --forget``) of ``container_id`` with success:
        the shim's copy of its mark in the default directory goes now if the sandbox is
        released (the DEL dropped the daemon's own; the shim's was read by nothing). Never
        raises: the DEL is done. Costs the open of a missing file when the shim marked
        nothing there."""
        if not self._shim_elsewhere:
            return
        try:
            markadoption.prune(self.shim_default, records_in=(self.cni_dir,), only=container_id)
        except Exception:  # noqa: BLE001 - the next look tries again; said in the journal
            LOG.exception("dropping the shim's mark of sandbox %s failed", container_id)

    def retry(self, mark: delmarks.FailedDelete) -> bool:
        """The runtime's DEL of ``mark``'s sandbox once more; True when it is released."""
        env = dict(mark.request_env, CNI_COMMAND="DEL")
        config = str((mark.request or {}).get("config") or "").encode()
        if not env.get("CNI_CONTAINERID") or not config:
            LOG.warning("unreleased sandbox %s: its mark holds no DEL request to run again; "
                        "release it with `multusd gc`", mark.container_id)
            return False
        deadline = time.monotonic() + self.config.request_timeout
        self.retries += 1
        try:
            self.handle(api.CNI_ENDPOINT, api.encode_request(env, config), deadline,
                        f"unreleased-{mark.container_id[:12]}")
        except MultusError as exc:
            LOG.warning("unreleased sandbox %s: its DEL failed again: %s", mark.container_id,
                        exc.msg)
            return False
        if markadoption.has_records(mark.cni_dir or self.cni_dir, mark.container_id):
            return False
        self.released += 1
        LOG.info("unreleased sandbox %s (%s) is released now", mark.container_id, mark.pod)
        return True

    def _announce_if_due(self, container_id: str, wait: bool = True) -> None:
        """Announce the sandbox (once) when its pod cache can say whether the pod exists (for
        the Event), or :attr:`sync_wait` after start without it (``wait``: else at once)."""
        mark = delmarks.read(self.cni_dir, container_id, spare=self.spare)
        if mark is None or mark.announced or not mark.is_unreleased():
            return
        waited = not wait or time.monotonic() - self._started >= self.sync_wait
        if unreleasedwarning.announce(self.multus.kube, mark, LOG, without_cache=waited):
            delmarks.set_announced(self.cni_dir, mark, spare=self.spare)
