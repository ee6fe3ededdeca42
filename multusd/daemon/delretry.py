"""Unreleased sandboxes, from the daemon's side: the window published, DEL retried, announced.

At start, and whenever the node's cniDir changes, the daemon publishes its
``deleteRetryWindow`` for the shim (which needs it when the daemon cannot answer), in the
node's cniDir. Then it releases by itself what is recorded as unreleased: the
sandboxes whose DEL kept failing past their window, its own or the shim's (while the daemon
was down or broken), wherever they are recorded (below). It
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

The marks are read wherever requests record them: every cniDir the node's configuration
names (:meth:`~multusd.core.effective.NodeConfig.cni_dirs`: daemon-config.json's, the runtime's
multus config's, Multus's default) and the spare directory; each sandbox is found where its
records are, and its DEL, run again as the runtime sent it, is judged by the configuration the
sandbox recorded (:mod:`multusd.core.sandboxconfig`), as the runtime's own DEL is. A mark found
elsewhere than beside its records (a shim that marked in another cniDir) is moved there at
each look, and the marks of released sandboxes are dropped
(:func:`~multusd.core.markadoption.tidy`); a copy elsewhere of a sandbox whose DEL the daemon
answered goes then (:meth:`DelRetrier.after_del`).

A sandbox still failing after its first retry is announced once (a journal warning, an Event
while the pod exists, which waits up to :data:`SYNC_WAIT` for the pod cache). Marks whose
sandbox has no records left (released by another DEL, upstream's daemon, ``gc --forget``)
are dropped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from multusd import clock_now
from multusd.core import delmarks, markadoption, unreleased, unreleasedwarning
from multusd.errors import MultusError
from multusd.kube.retries import BackoffPolicy, Delays
from multusd.wire import api, delwindow

LOG = logging.getLogger(__name__)

RETRY_FIRST = 5.0     # seconds before a sandbox that failed again is retried ...
# ... doubling to 40 s: with the jitter every wait is under a minute, so a sandbox is released
# within a minute of its cause going away however long it failed (issue 37), at the cost of
# one DEL a minute per sandbox still failing, run one at a time
RETRY_MAX = 40.0
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
                 scan: float = SCAN_INTERVAL, sync_wait: float = SYNC_WAIT) -> None:
        self.config = config
        self.multus = multus  # its node: the node's configuration (multus.node, a NodeConfig)
        self.handle = handle  # sends a request to the daemon: (endpoint, body, deadline, id)
        self.curve = BackoffPolicy(initial=first, cap=cap, jitter=RETRY_JITTER, calm=math.inf)
        self.scan, self.sync_wait = scan, sync_wait
        self.spare = delmarks.spare_marks_dir(config.socket_dir)
        self.retries = 0   # DELs run again, and how many released their sandbox (the notes'
        self.released = 0  # and the tests' view of what the thread did)
        self._due: Dict[str, Tuple[float, Delays]] = {}  # container ID -> (when, its backoff)
        self._published = ""  # the cniDir the window was published in
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def cni_dirs(self) -> Tuple[str, ...]:
        """Every cniDir the node names now, its own first (where marks and records are)."""
        return self.multus.node.cni_dirs()

    def start(self) -> "DelRetrier":
        self._publish_window()
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
        self._publish_window()
        self._tidy()
        now = clock_now()
        marks = markadoption.node_marks(self.cni_dirs(), self.spare)
        left = [m for m in marks.values() if m.is_unreleased(now)]
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
            self._announce_if_due(mark)
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
        for mark in unreleased.unreleased(self.cni_dirs(), spare=self.spare):
            if self._stop.is_set():
                break
            if self.retry(mark):
                released += 1
            else:
                self._announce_if_due(mark, wait=False)
        return released

    def _publish_window(self) -> None:
        """The window where a shim finds it (the node's cniDir), when that changed."""
        cni_dir = self.multus.node.current().cni_dir
        if cni_dir == self._published:
            return
        try:
            delmarks.publish_window(cni_dir, self.config.delete_retry_window,
                                    delwindow.DEFAULT_WINDOW, spare=self.spare)
        except MultusError as exc:
            LOG.warning("cannot tell the shim the deleteRetryWindow: %s; a shim that cannot "
                        "reach multusd uses the default", exc.msg)
        self._published = cni_dir

    def _tidy(self) -> None:
        """The marks found elsewhere than beside their records moved there, the marks of
        released sandboxes dropped (see :func:`~multusd.core.markadoption.tidy`)."""
        tidied = markadoption.tidy(self.cni_dirs(), self.spare)
        for problem in tidied.problems:  # the mark stays where it is until the next look
            LOG.warning("%s", problem)
        for container_id in tidied.moved:
            LOG.info("the mark of sandbox %s's failed DEL, found in another cniDir than its "
                     "records (written by a shim whose config names another), is now kept "
                     "beside its records", container_id)
        for container_id in tidied.dropped:
            LOG.info("the mark of sandbox %s's failed DEL is dropped: the sandbox is released",
                     container_id)

    def after_del(self, container_id: str) -> None:
        """The daemon answered a DEL (or ``gc --forget``) of ``container_id`` with success:
        a copy of its mark elsewhere than the DEL's cniDir (a shim's) goes now if the sandbox
        is released (the DEL dropped its own). Never raises: the DEL is done. Costs the open
        of a missing file per place when nothing is marked (nearly every DEL)."""
        try:
            markadoption.drop_if_released(self.cni_dirs(), container_id, self.spare)
        except Exception:  # noqa: BLE001 - the next look tries again; said in the journal
            LOG.exception("dropping the shim's mark of sandbox %s failed", container_id)

    def retry(self, mark: delmarks.FailedDelete) -> bool:
        """The runtime's DEL of ``mark``'s sandbox once more (``mark.cni_dir``: where its
        records are, as :func:`~multusd.core.markadoption.node_marks` found them); True when
        it is released."""
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
        if markadoption.has_records(mark.cni_dir, mark.container_id):
            return False
        self.released += 1
        LOG.info("unreleased sandbox %s (%s) is released now", mark.container_id, mark.pod)
        return True

    def _announce_if_due(self, mark: delmarks.FailedDelete, wait: bool = True) -> None:
        """Announce the sandbox (once) when its pod cache can say whether the pod exists (for
        the Event), or :attr:`sync_wait` after start without it (``wait``: else at once)."""
        mark = markadoption.mark_of(self.cni_dirs(), mark.container_id, self.spare)
        if mark is None or mark.announced or not mark.is_unreleased():
            return
        waited = not wait or time.monotonic() - self._started >= self.sync_wait
        if unreleasedwarning.announce(self.multus.kube, mark, LOG, without_cache=waited):
            delmarks.set_announced(mark.cni_dir, mark, spare=self.spare)
