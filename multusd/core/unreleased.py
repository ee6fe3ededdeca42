"""Sandboxes whose DEL keeps failing: reported for a bounded window, then kept as *unreleased*.

Invariant 10, a drain always finishes. A DEL that fails (a delegate's DEL error) is answered
with the error, so that the runtime retries a transient failure, only until the sandbox's
window ends; from then on DEL answers success, so that the pod can terminate, and nothing
is forgotten: the sandbox's records (scratch and result caches) stay, and it is
*unreleased*. The journal gets a warning and the pod an Event (while it exists), ``multusd
status``/``doctor`` and the gauge ``multusd_unreleased_sandboxes`` show it, and ``multusd gc``
(and the daemon itself, at a slow cadence) runs its DEL again; once that succeeds, the
records and the mark go.

Each such sandbox has a mark, ``<cniDir>/.multusd-unreleased/<containerID>`` (JSON, root
only, atomic): when its DEL first and last failed, how often, what failed (which network,
interface, error), the runtime's DEL request (to run it again as sent) and ``until``, the
end of its window: ``firstFailure + deleteRetryWindow``, and no later than
:data:`POD_GONE_GRACE` after the pod was first seen gone from the API (nobody waits on a pod
that is gone, and the runtime keeps retrying an orphaned sandbox). The shim writes the same
files when the daemon does not answer at all (a daemon-config.json that does not parse):
:mod:`multusd.wire.delwindow` (standard library only, so it cannot import this module; its
docstring lists the keys it writes, and ``tests/unit/core/test_unreleased.py`` holds the two
to one format); the daemon publishes its window for it in ``.settings``. A leading dot is
never part of a container ID, so the directory never collides with upstream's files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import (MARK_REQUEST_ENV, MARKED_BY_DAEMON, MARKED_BY_SHIM, UNRELEASED_DIR,
                     WINDOW_FILE, store)
from multusd.cni.args import parse_cni_args
from multusd.cni.resultcache import RESULTS_DIR
from multusd.cni.names import is_valid_name
from multusd.errors import MultusError
from multusd.store.valueclass import Record, replace

LOG = logging.getLogger(__name__)

# Once the pod is gone from the API: kubelet retries an orphaned sandbox's StopPodSandbox
# about every 10 s, so a transient failure still gets three more tries.
POD_GONE_GRACE = 30.0
EVENT_REASON = "NetworkNotReleased"
REPORTING, UNRELEASED = "reporting", "unreleased"


class Failure(Record):
    """One delegate whose DEL failed: its network, interface and error."""

    network: str
    ifname: str
    error: str


class FailedDelete(Record):
    """A sandbox whose DEL failed, as its mark records it (times: seconds since the epoch)."""

    container_id: str
    first_failure: float
    last_failure: float
    until: float                        # DEL answers success from here on
    attempts: int
    by: str                             # who wrote the mark: "daemon" or "shim"
    error: str                          # the whole message of the last failure
    failures: Tuple[Failure, ...] = ()  # the daemon's: which delegates failed
    window: float = 0.0
    pod_gone_since: float = 0.0
    announced: bool = False             # journal warning and Event sent
    request: Optional[Mapping[str, Any]] = None  # {"env": {CNI_*...}, "config": "..."}

    def state(self, now: Optional[float] = None) -> str:
        """:data:`REPORTING` (the runtime is told, and retries) or :data:`UNRELEASED`."""
        return UNRELEASED if (time.time() if now is None else now) >= self.until else REPORTING

    def is_unreleased(self, now: Optional[float] = None) -> bool:
        return self.state(now) == UNRELEASED

    @property
    def cni_args(self) -> Tuple[Tuple[str, str], ...]:
        try:
            return tuple(parse_cni_args(str(self.request_env.get("CNI_ARGS", ""))))
        except MultusError:
            return ()

    @property
    def request_env(self) -> Mapping[str, Any]:
        env = (self.request or {}).get("env")
        return env if isinstance(env, dict) else {}

    @property
    def pod(self) -> str:
        args = dict(self.cni_args)
        name = args.get("K8S_POD_NAME", "")
        namespace = args.get("K8S_POD_NAMESPACE", "")
        return f"{namespace}/{name}" if namespace else name

    def what_failed(self) -> str:
        """The failures in one line: ``net1 (default/vendor): <error> / ...`` or the error."""
        if self.failures:
            return " / ".join(f"{f.ifname} ({f.network}): {f.error}" for f in self.failures)
        return self.error

    def to_json(self, now: Optional[float] = None) -> Dict[str, Any]:
        """The mark as written (and as ``--json`` shows it, with ``state``)."""
        doc: Dict[str, Any] = {
            "containerId": self.container_id, "by": self.by,
            "firstFailure": self.first_failure, "lastFailure": self.last_failure,
            "until": self.until, "window": self.window, "attempts": self.attempts,
            "error": self.error,
            "failures": [{"network": f.network, "interface": f.ifname, "error": f.error}
                         for f in self.failures],
            "podGoneSince": self.pod_gone_since or None, "announced": self.announced,
            "request": dict(self.request) if self.request is not None else None}
        if now is not None:
            doc["state"] = self.state(now)
        return doc


def mark_dir(cni_dir: str) -> str:
    return os.path.join(cni_dir, UNRELEASED_DIR)


def mark_path(cni_dir: str, container_id: str) -> str:
    return os.path.join(cni_dir, UNRELEASED_DIR, container_id)


def read(cni_dir: str, container_id: str) -> Optional[FailedDelete]:
    """The mark of ``container_id``; None when there is none (or it is not a mark)."""
    if not is_valid_name(container_id):
        return None
    return _parse(container_id, store.read_json_object(mark_path(cni_dir, container_id),
                                                       "unreleased-sandbox mark"))


def read_all(cni_dir: str) -> Dict[str, FailedDelete]:
    """Every mark under ``cni_dir``, by container ID."""
    try:
        names = os.listdir(mark_dir(cni_dir))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        LOG.warning("cannot list %s: %s", mark_dir(cni_dir), exc.strerror)
        return {}
    marks = {}
    for name in sorted(names):
        mark = read(cni_dir, name)
        if mark is not None:
            marks[name] = mark
    return marks


def record(cni_dir: str, request: Any, failures: Sequence[Failure], error: str, *,
           window: float, pod_gone: bool, now: Optional[float] = None) -> FailedDelete:
    """Record a failed DEL of ``request`` (a :class:`~multusd.core.request.CmdArgs`).

    The first failure (the shim's, if it marked the sandbox first) starts the window;
    ``until`` is recomputed from the window configured now.

    :raises IOFailure: the mark cannot be written.
    """
    now = time.time() if now is None else now
    old = read(cni_dir, request.container_id)
    first = old.first_failure if old is not None else now
    gone_since = 0.0
    if pod_gone:
        gone_since = old.pod_gone_since if old is not None and old.pod_gone_since else now
    until = first + window
    if gone_since:
        until = min(until, gone_since + min(window, POD_GONE_GRACE))
    mark = FailedDelete(
        container_id=request.container_id, first_failure=first, last_failure=now,
        until=until, attempts=(old.attempts if old is not None else 0) + 1, by=MARKED_BY_DAEMON,
        error=error, failures=tuple(failures), window=window, pod_gone_since=gone_since,
        announced=old.announced if old is not None else False,
        request={"env": {k: request.env[k] for k in MARK_REQUEST_ENV if k in request.env},
                 "config": request.config_bytes.decode("utf-8", "replace")})
    _write(cni_dir, mark)
    return mark


def report(cni_dir: str, request: Any, failures: Sequence[Failure], msg: str, *,
           window: float, kube: Any, log: Any) -> None:
    """A DEL of ``request`` failed: record it, and raise ``msg`` while the sandbox's window
    lasts; past it, say once that the sandbox is unreleased and return (DEL answers success).

    :raises MultusError: ``msg`` and until when it is reported.
    """
    gone = pod_gone(kube, request.pod_namespace, request.pod_name, request.pod_uid)
    mark = record(cni_dir, request, failures, msg, window=window, pod_gone=gone)
    if not mark.is_unreleased():
        raise MultusError(f"{msg}. This is reported until {stamp(mark.until)} ("
                          f"{'the pod is gone from the API; ' if gone else ''}deleteRetryWindow "
                          f"{window:g}s after the first failure at {stamp(mark.first_failure)}); "
                          "after that DEL answers success, so that the pod can terminate, and "
                          "the sandbox stays recorded as unreleased for `multusd gc`")
    if not mark.announced:
        announce(kube, mark, log)
        set_announced(cni_dir, mark)
    else:
        log.info("DEL: still unreleased (%d attempts): %s; answered success, the records stay "
                 "for `multusd gc`", mark.attempts, mark.what_failed())


def set_announced(cni_dir: str, mark: FailedDelete) -> FailedDelete:
    announced = replace(mark, announced=True)
    _write(cni_dir, announced)
    return announced


def clear(cni_dir: str, container_id: str) -> bool:
    """Drop the mark (the sandbox is released, or its records were dropped); True if there
    was one. Costs one unlink of a missing file on every DEL that succeeds."""
    return store.remove(mark_path(cni_dir, container_id))


def has_records(cni_dir: str, container_id: str) -> bool:
    """The sandbox still has records (a scratch cache or a result-cache entry)."""
    if os.path.exists(os.path.join(cni_dir, container_id)):
        return True
    marker = f"-{container_id}-"
    try:
        return any(marker in name for name in os.listdir(os.path.join(cni_dir, RESULTS_DIR)))
    except OSError:
        return False


def unreleased(cni_dir: str, now: Optional[float] = None) -> List[FailedDelete]:
    """The unreleased sandboxes: marks past their window whose sandbox still has records."""
    now = time.time() if now is None else now
    return [m for m in read_all(cni_dir).values()
            if m.is_unreleased(now) and has_records(cni_dir, m.container_id)]


def count_unreleased(cni_dir: str) -> Optional[int]:
    """For the ``multusd_unreleased_sandboxes`` gauge; None when the marks cannot be read."""
    try:
        return len(unreleased(cni_dir))
    except (OSError, MultusError) as exc:
        LOG.debug("cannot count the unreleased sandboxes in %s: %s", cni_dir, exc)
        return None


def prune(cni_dir: str) -> List[str]:
    """Drop the marks of sandboxes that have no records left (released by another DEL,
    upstream's daemon, or ``gc --forget``); the container IDs dropped."""
    dropped = []
    for container_id in read_all(cni_dir):
        if not has_records(cni_dir, container_id) and clear(cni_dir, container_id):
            dropped.append(container_id)
    return dropped


def publish_window(cni_dir: str, window: float, default: float) -> None:
    """Tell the shim the window (it reads it when the daemon does not answer). Written when
    it changed; with the ``default`` (the shim's own) nothing is left on disk.

    :raises IOFailure: it cannot be written or removed.
    """
    path = os.path.join(mark_dir(cni_dir), WINDOW_FILE)
    if window == default:
        if store.remove(path):
            try:
                os.rmdir(mark_dir(cni_dir))
            except OSError:
                pass  # marks remain
        return
    data = json.dumps({"deleteRetryWindow": window}).encode()
    if store.read_or_none(path) != data:
        store.atomic_write(path, data)


# --- the pod, through the Kubernetes client the caller hands in ------------------------------


def pod_gone(kube: Any, namespace: str, name: str, uid: str) -> bool:
    """The pod is known to be gone from the API (a synced watch cache lacks it, or holds a
    new pod of that name); False when it is there, or it cannot be told. Never a request."""
    known, pod = _cached_pod(kube, namespace, name, uid)
    return known and pod is None


def announce(kube: Any, mark: FailedDelete, log: Any) -> None:
    """Say once that ``mark``'s sandbox is unreleased: a journal warning, and a Warning
    Event on the pod while it still exists (sent in the background, never fails)."""
    now = time.time()
    pod = mark.pod or "no pod"
    log.warning("DEL of sandbox %s (%s) has failed since %s (%d attempt(s)): %s. The "
                "runtime now gets success so that the pod can terminate; the sandbox stays "
                "recorded as unreleased (`multusd status`), and `multusd gc` releases it "
                "once the cause is fixed", mark.container_id, pod, stamp(mark.first_failure),
                mark.attempts, mark.what_failed(),
                extra={"CNI_CONTAINERID": mark.container_id, "UNRELEASED_SINCE":
                       stamp(min(mark.until, now))})
    args = dict(mark.cni_args)
    known, live = _cached_pod(kube, args.get("K8S_POD_NAMESPACE", ""),
                              args.get("K8S_POD_NAME", ""), args.get("K8S_POD_UID", ""))
    if known and live is not None:
        kube.emit_event(live, "Warning", EVENT_REASON, _clip(
            f"the networks of sandbox {mark.container_id[:12]} could not be released: "
            f"{mark.what_failed()}; the pod may terminate, and what they hold stays recorded "
            "until `multusd gc` releases it"))


def _cached_pod(kube: Any, namespace: str, name: str, uid: str) -> Tuple[bool, Any]:
    """(whether the API's view is known, the pod or None) from the watch cache only."""
    if kube is None or not namespace or not name:
        return False, None
    try:
        if not kube.synced() or kube.node_mismatch is not None:
            return False, None  # a wrong node name makes every pod look gone
        pod = kube.cached_pod(namespace, name)
    except MultusError:
        return False, None
    if pod is not None and uid and pod.uid != uid and not pod.is_static:
        return True, None  # deleted, and another pod of that name made since
    return True, pod


# --- internals -----------------------------------------------------------------------------


def stamp(epoch: float) -> str:
    """``epoch`` in UTC, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write(cni_dir: str, mark: FailedDelete) -> None:
    store.atomic_write(mark_path(cni_dir, mark.container_id),
                       json.dumps(mark.to_json(), indent=1).encode())


def _number(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def _parse(container_id: str, data: Optional[dict]) -> Optional[FailedDelete]:
    if data is None or data.get("containerId", container_id) != container_id:
        return None
    first = _number(data, "firstFailure")
    if not first:
        return None
    failures = tuple(Failure(network=str(f.get("network", "")), ifname=str(f.get("interface", "")),
                             error=str(f.get("error", "")))
                     for f in data.get("failures") or [] if isinstance(f, dict))
    attempts = data.get("attempts")
    request = data.get("request")
    return FailedDelete(
        container_id=container_id, first_failure=first,
        last_failure=_number(data, "lastFailure", first), until=_number(data, "until", first),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 1,
        by=str(data.get("by") or MARKED_BY_SHIM), error=str(data.get("error") or ""),
        failures=failures, window=_number(data, "window"),
        pod_gone_since=_number(data, "podGoneSince"), announced=data.get("announced") is True,
        request=request if isinstance(request, dict) else None)
