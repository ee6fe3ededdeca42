"""Unreleased sandboxes, from the daemon's side: the window published, announced, DEL retried.

At start the daemon publishes its ``deleteRetryWindow`` for the shim (which needs it when
the daemon cannot answer) and, once its pod cache has synced, announces the sandboxes the
shim answered success for while the daemon could not run (a journal warning each, an Event
while the pod exists). Then, every :data:`RETRY_INTERVAL`, it runs the runtime's DEL again for
each unreleased sandbox, one at a time, exactly as the runtime sent it and through the
daemon's own socket (the lanes keep it one at a time with the runtime's requests for that
sandbox; deadline, logs and metrics as for any request): a cause that went away (a plugin installed
again, an IPAM daemon back) releases what the sandbox held without the operator. A slow
cadence, and none at start: a start is when a node's queued requests (a reboot, a drain)
arrive, and ``multusd gc`` retries at once when asked. Marks whose sandbox has no records left
(released by another DEL, upstream's daemon, ``gc --forget``) are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional

from multusd.core import settings, unreleased
from multusd.errors import MultusError
from multusd.wire import api, delwindow

LOG = logging.getLogger(__name__)

RETRY_INTERVAL = 600.0  # 10 minutes: a few plugin runs per unreleased sandbox an hour
SYNC_WAIT = 60.0        # how long the start's announcements wait for the pod cache (Events)

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
                 interval: float = RETRY_INTERVAL) -> None:
        self.config = config
        self.multus = multus
        self.handle = handle  # sends a request to the daemon: (endpoint, body, deadline, id)
        self.interval = interval
        self.cni_dir = settings.cni_dir_of(config.raw)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "DelRetrier":
        try:
            unreleased.publish_window(self.cni_dir, self.config.delete_retry_window,
                                      delwindow.DEFAULT_WINDOW)
        except MultusError as exc:
            LOG.warning("cannot tell the shim the deleteRetryWindow: %s; a shim that cannot "
                        "reach multusd uses the default", exc.msg)
        self._thread = threading.Thread(target=self._run, name="multusd-unreleased",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        waited = 0.0
        marked = bool(unreleased.read_all(self.cni_dir))
        while marked and not self.multus.ready() and waited < SYNC_WAIT and \
                not self._stop.wait(0.5):  # an Event needs the pod cache
            waited += 0.5
        try:
            if marked:
                self.announce()
        except Exception:  # noqa: BLE001 - never take the daemon down; said in the journal
            LOG.exception("announcing the unreleased sandboxes failed")
        while not self._stop.wait(self.interval):
            try:
                self.retry_all()
            except Exception:  # noqa: BLE001
                LOG.exception("retrying the DEL of unreleased sandboxes failed")

    def announce(self) -> int:
        """Say once, for every unreleased sandbox not announced yet, that it is unreleased."""
        unreleased.prune(self.cni_dir)
        count = 0
        for mark in unreleased.unreleased(self.cni_dir):
            if not mark.announced:
                unreleased.announce(self.multus.kube, mark, LOG)
                unreleased.set_announced(self.cni_dir, mark)
                count += 1
        return count

    def retry_all(self) -> int:
        """Run the DEL of every unreleased sandbox again; how many were released."""
        self.announce()
        released = 0
        for mark in unreleased.unreleased(self.cni_dir):
            if self._stop.is_set():
                break
            if self.retry(mark):
                released += 1
        return released

    def retry(self, mark: unreleased.FailedDelete) -> bool:
        """The runtime's DEL of ``mark``'s sandbox once more; True when it is released."""
        env = dict(mark.request_env, CNI_COMMAND="DEL")
        config = str((mark.request or {}).get("config") or "").encode()
        if not env.get("CNI_CONTAINERID") or not config:
            LOG.warning("unreleased sandbox %s: its mark holds no DEL request to run again; "
                        "release it with `multusd gc`", mark.container_id)
            return False
        deadline = time.monotonic() + self.config.request_timeout
        try:
            self.handle(api.CNI_ENDPOINT, api.encode_request(env, config), deadline,
                        f"unreleased-{mark.container_id[:12]}")
        except MultusError as exc:
            LOG.warning("unreleased sandbox %s: its DEL failed again: %s", mark.container_id,
                        exc.msg)
            return False
        if unreleased.has_records(self.cni_dir, mark.container_id):
            return False
        LOG.info("unreleased sandbox %s (%s) is released now", mark.container_id, mark.pod)
        return True
