"""Sandboxes whose DEL keeps failing: reported for a short window, then kept as *unreleased*.

Invariant 10, a drain always finishes, fast, and nothing leaks. A DEL that fails (a
delegate's DEL error) is answered with the error, so that the runtime retries a transient
failure, only until the sandbox's window ends (``deleteRetryWindow`` from the first failure,
10 s by default: a kubelet's first retry gets success); from then on DEL answers success, so
that the pod can terminate, and nothing is forgotten: the sandbox's records (scratch and result
caches) stay, and it is *unreleased*. The journal gets a warning and the pod an Event (while
it exists), ``multusd status``/``doctor`` and the gauge ``multusd_unreleased_sandboxes`` show
it, and the daemon runs its DEL again by itself (:mod:`multusd.daemon.delretry`: at start, then
with a backoff; ``multusd gc`` at once); once that succeeds, the records and the mark go.

Each such sandbox has a mark, ``<cniDir>/.multusd-unreleased/<containerID>`` (JSON, root
only, atomic): when its DEL first and last failed, how often, what failed (which network,
interface, error), which of its delegates were released already (a retry runs only the DEL of
those still held: the cluster network's DEL that succeeded is not run again; the scratch cache
keeps upstream's format and every delegate, so upstream's daemon reading it runs them all, as
it always does), the runtime's DEL request (to run it again as sent) and the end of its
window: ``until`` on the wall clock, ``untilBoot`` on the boot's clock, which decides
(:func:`multusd.window_left`: no wall-clock step stretches a window). When ``<cniDir>`` cannot
take a mark (a full or read-only disk, a file where the directory should be) it goes to the
*spare* directory, the same name in the socket's directory (``/run/multus``): every function
here that reads or writes marks takes it as ``spare`` and looks in both places. The shim
writes the same files when the daemon does not answer at all (a daemon-config.json that does
not parse): :mod:`multusd.wire.delwindow` (standard library only, so it cannot import this
module; its docstring lists the keys it writes, and ``tests/unit/core/test_unreleased.py``
holds the two to one format); the daemon publishes its window for it in ``.settings``. A
leading dot is never part of a container ID, so the directory never collides with upstream's
files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import (MARK_REQUEST_ENV, MARKED_BY_DAEMON, MARKED_BY_SHIM, WINDOW_FILE,
                     as_instant, number_of, store, unreleased_marks_dir, window_end,
                     window_left)
from multusd.cni.args import parse_cni_args
from multusd.cni.resultcache import RESULTS_DIR
from multusd.cni.names import is_valid_name
from multusd.errors import MultusError
from multusd.store.valueclass import Record, field, replace

LOG = logging.getLogger(__name__)

EVENT_REASON = "NetworkNotReleased"
REPORTING, UNRELEASED = "reporting", "unreleased"


class Failure(Record):
    """One delegate whose DEL failed: its network, interface and error."""

    network: str
    ifname: str
    error: str


class Released(Record):
    """One delegate of a sandbox whose DEL succeeded while another's failed."""

    network: str
    ifname: str


class FailedDelete(Record):
    """A sandbox whose DEL failed, as its mark records it (times: seconds since the epoch;
    ``until_boot``: CLOCK_BOOTTIME of boot ``boot_id``)."""

    container_id: str
    first_failure: float
    last_failure: float
    until: float                        # DEL answers success from here on (the wall clock)
    attempts: int
    by: str                             # who wrote the mark: "daemon" or "shim"
    error: str                          # the whole message of the last failure
    failures: Tuple[Failure, ...] = ()  # the daemon's: which delegates failed
    window: float = 0.0
    announced: bool = False             # journal warning and Event sent
    request: Optional[Mapping[str, Any]] = None  # {"env": {CNI_*...}, "config": "..."}
    released: Tuple[Released, ...] = ()  # delegates already released: not run again
    boot_id: str = ""
    until_boot: Optional[float] = None  # the end of the window on the boot's clock
    cni_dir: str = ""                   # where the sandbox's records are ("": the reader's)
    place: str = field(default="", compare=False)  # the marks directory it was read from

    def ends_in(self, now: Any = None) -> float:
        """Seconds until the window ends (0 or less: it has); ``now`` as
        :func:`multusd.as_instant` takes it."""
        return window_left({"until": self.until, "window": self.window, "bootId": self.boot_id,
                            "untilBoot": self.until_boot}, now)

    def state(self, now: Any = None) -> str:
        """:data:`REPORTING` (the runtime is told, and retries) or :data:`UNRELEASED`."""
        return UNRELEASED if self.ends_in(now) <= 0 else REPORTING

    def is_unreleased(self, now: Any = None) -> bool:
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
        """The failures in one line: ``net1 (default/vendor): <error> / ...`` or the error;
        with what an earlier attempt released."""
        text = (" / ".join(f"{f.ifname} ({f.network}): {f.error}" for f in self.failures)
                if self.failures else self.error)
        if self.released:
            text += "; released already: " + ", ".join(f"{r.ifname} ({r.network})"
                                                       for r in self.released)
        return text

    def to_json(self, now: Any = None) -> Dict[str, Any]:
        """The mark as written (and as ``--json`` shows it, with ``state``)."""
        doc: Dict[str, Any] = {
            "containerId": self.container_id, "by": self.by,
            "firstFailure": self.first_failure, "lastFailure": self.last_failure,
            "until": self.until, "bootId": self.boot_id, "untilBoot": self.until_boot,
            "window": self.window, "attempts": self.attempts, "error": self.error,
            "failures": [{"network": f.network, "interface": f.ifname, "error": f.error}
                         for f in self.failures],
            "released": [{"network": r.network, "interface": r.ifname} for r in self.released],
            "cniDir": self.cni_dir or None, "announced": self.announced,
            "request": dict(self.request) if self.request is not None else None}
        if now is not None:
            doc["state"] = self.state(now)
        return doc


def spare_marks_dir(socket_dir: str) -> str:
    """Where a mark goes when ``<cniDir>`` cannot take it: the marks' directory beside the
    daemon's socket (``/run/multus/.multusd-unreleased``); "" without a socket directory."""
    return unreleased_marks_dir(socket_dir) if socket_dir else ""


def mark_path(cni_dir: str, container_id: str) -> str:
    """Where the mark of ``container_id`` is in ``<cniDir>``."""
    return os.path.join(unreleased_marks_dir(cni_dir), container_id)


def read(cni_dir: str, container_id: str, *, spare: str = "") -> Optional[FailedDelete]:
    """The mark of ``container_id`` (``<cniDir>``'s, else the spare one); None when there is
    none (or it is not a mark)."""
    if not is_valid_name(container_id):
        return None
    for place in _places(cni_dir, spare):
        mark = _parse(container_id, store.read_json_object(os.path.join(place, container_id),
                                                           "unreleased-sandbox mark"), place)
        if mark is not None:
            return mark
    return None


def read_all(cni_dir: str, *, spare: str = "") -> Dict[str, FailedDelete]:
    """Every mark under ``cni_dir`` and in ``spare``, by container ID (``<cniDir>``'s first)."""
    marks: Dict[str, FailedDelete] = {}
    for place in _places(cni_dir, spare):
        try:
            names = os.listdir(place)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            LOG.warning("cannot list %s: %s", place, exc.strerror)
            continue
        for name in sorted(names):
            if name in marks or not is_valid_name(name):
                continue
            mark = _parse(name, store.read_json_object(os.path.join(place, name),
                                                       "unreleased-sandbox mark"), place)
            if mark is not None:
                marks[name] = mark
    return dict(sorted(marks.items()))


def record(cni_dir: str, request: Any, failures: Sequence[Failure], error: str, *,
           window: float, now: Any = None, released: Sequence[Released] = (),
           spare: str = "") -> FailedDelete:
    """Record a failed DEL of ``request`` (a :class:`~multusd.core.request.CmdArgs`).

    The first failure (the shim's, if it marked the sandbox first) starts the window, of the
    ``window`` configured now; ``released`` are the delegates released so far.

    :raises IOFailure: the mark can be written neither in ``<cniDir>`` nor in ``spare``.
    """
    now = as_instant(now)
    old = read(cni_dir, request.container_id, spare=spare)
    mark = FailedDelete(
        container_id=request.container_id,
        first_failure=old.first_failure if old is not None else now[0], last_failure=now[0],
        attempts=(old.attempts if old is not None else 0) + 1, by=MARKED_BY_DAEMON,
        error=error, failures=tuple(failures), window=window,
        announced=old.announced if old is not None else False,
        request={"env": {k: request.env[k] for k in MARK_REQUEST_ENV if k in request.env},
                 "config": request.config_bytes.decode("utf-8", "replace")},
        released=tuple(released), cni_dir=cni_dir,
        **_window_fields(window, old, now))
    return _write(cni_dir, mark, spare, old)


def report(cni_dir: str, request: Any, failures: Sequence[Failure], msg: str, *,
           window: float, kube: Any, log: Any, released: Sequence[Released] = (),
           spare: str = "") -> None:
    """A DEL of ``request`` failed: record it, and raise ``msg`` while the sandbox's window
    lasts; past it, say once that the sandbox is unreleased and return (DEL answers success).

    A mark that cannot be written anywhere is logged; ``msg`` is raised then, never the
    I/O failure in its place (the runtime retries, as without a window).

    :raises MultusError: ``msg`` and until when it is reported.
    """
    try:
        mark = record(cni_dir, request, failures, msg, window=window, released=released,
                      spare=spare)
    except MultusError as exc:
        log.error("DEL failed and cannot be recorded as such (%s): the runtime keeps being "
                  "told, and retries", exc.msg)
        raise MultusError(f"{msg} (multusd cannot record this failure: {exc.msg})") from None
    if not mark.is_unreleased():
        raise MultusError(f"{msg}. This is reported until {stamp(mark.until)} (deleteRetryWindow "
                          f"{window:g}s after the first failure at {stamp(mark.first_failure)}); "
                          "after that DEL answers success, so that the pod can terminate, and "
                          "the sandbox stays recorded as unreleased until multusd releases it")
    if not mark.announced and announce(kube, mark, log):
        try:
            set_announced(cni_dir, mark, spare=spare)
        except MultusError as exc:  # said again next time: never a failed DEL for it
            log.warning("%s", exc.msg)
    else:
        log.info("DEL: still unreleased (%d attempts): %s; answered success, the records stay "
                 "until multusd releases them", mark.attempts, mark.what_failed())


def set_announced(cni_dir: str, mark: FailedDelete, *, spare: str = "") -> FailedDelete:
    """``mark``, announced, written back (where it is, or wherever it can go)."""
    return _write(cni_dir, replace(mark, announced=True), spare, mark)


def clear(cni_dir: str, container_id: str, *, spare: str = "") -> bool:
    """Drop the mark (the sandbox is released, or its records were dropped); True if there
    was one. Never raises: a DEL that released everything must not fail on it (a mark left
    on a read-only disk is dropped later, once its sandbox has no records). Costs an unlink of
    a missing file per place on every DEL that succeeds."""
    dropped = False
    for place in _places(cni_dir, spare):
        dropped = _remove(os.path.join(place, container_id)) or dropped
    return dropped


def has_records(cni_dir: str, container_id: str) -> bool:
    """The sandbox still has records (a scratch cache or a result-cache entry)."""
    if os.path.exists(os.path.join(cni_dir, container_id)):
        return True
    marker = f"-{container_id}-"
    try:
        return any(marker in name for name in os.listdir(os.path.join(cni_dir, RESULTS_DIR)))
    except OSError:
        return False


def unreleased(cni_dir: str, now: Any = None, *, spare: str = "") -> List[FailedDelete]:
    """The unreleased sandboxes: marks past their window whose sandbox still has records."""
    now = as_instant(now)
    return [m for m in read_all(cni_dir, spare=spare).values()
            if m.is_unreleased(now) and has_records(m.cni_dir or cni_dir, m.container_id)]


def count_unreleased(cni_dir: str, *, spare: str = "") -> Optional[int]:
    """For the ``multusd_unreleased_sandboxes`` gauge; None when the marks cannot be read."""
    try:
        return len(unreleased(cni_dir, spare=spare))
    except (OSError, MultusError) as exc:
        LOG.debug("cannot count the unreleased sandboxes in %s: %s", cni_dir, exc)
        return None


def adopt(other_dir: str, cni_dir: str, *, spare: str = "") -> List[str]:
    """Move to ``cni_dir`` the marks under ``other_dir`` (Multus's default ``cniDir``) of
    sandboxes recorded in ``cni_dir`` and not there; the container IDs moved.

    A shim whose config names no ``cniDir`` (an operator's static 00-multus.conf, as upstream's
    needs none) marks in the default directory while a daemon-config.json naming another one
    keeps the records there: unadopted, such a mark would be read by nothing of the daemon's.
    A mark the daemon keeps itself for that sandbox stands; the shim's copy goes.
    """
    if os.path.realpath(other_dir) == os.path.realpath(cni_dir):
        return []
    moved = []
    for container_id, mark in read_all(other_dir).items():
        if has_records(other_dir, container_id) or not has_records(cni_dir, container_id):
            continue  # that directory's own sandbox, or one released meanwhile
        if read(cni_dir, container_id, spare=spare) is None:
            _write(cni_dir, replace(mark, cni_dir=cni_dir), spare, mark)
        else:
            clear(other_dir, container_id)
        moved.append(container_id)
    return moved


def prune(cni_dir: str, *, spare: str = "") -> List[str]:
    """Drop the marks of sandboxes that have no records left (released by another DEL,
    upstream's daemon, or ``gc --forget``); the container IDs dropped."""
    dropped = []
    for container_id, mark in read_all(cni_dir, spare=spare).items():
        if not has_records(mark.cni_dir or cni_dir, container_id) and \
                clear(cni_dir, container_id, spare=spare):
            dropped.append(container_id)
    return dropped


def publish_window(cni_dir: str, window: float, default: float, *, spare: str = "") -> None:
    """Tell the shim the window (it reads it when the daemon does not answer): in
    ``<cniDir>``'s marks directory, in ``spare``'s when that cannot take it. Written when it
    changed; with the ``default`` (the shim's own) nothing is left on disk.

    :raises IOFailure: it can be written nowhere.
    """
    places = _places(cni_dir, spare)
    if window == default:
        for place in places:
            if _remove(os.path.join(place, WINDOW_FILE)):
                try:
                    os.rmdir(place)
                except OSError:
                    pass  # marks remain
        return
    data = json.dumps({"deleteRetryWindow": window}).encode()
    failure: Optional[MultusError] = None
    for place in places:
        path = os.path.join(place, WINDOW_FILE)
        try:
            if store.read_or_none(path) != data:
                store.atomic_write(path, data)
        except MultusError as exc:
            failure = failure or exc
            continue
        for other in places[places.index(place) + 1:]:
            _unlink(other, WINDOW_FILE)  # the spare copy, for a cniDir that works again
        return
    assert failure is not None  # _places always names one
    raise failure


# --- the pod, through the Kubernetes client the caller hands in ------------------------------


def announce(kube: Any, mark: FailedDelete, log: Any, *, without_cache: bool = False) -> bool:
    """Say that ``mark``'s sandbox is unreleased: a journal warning, and a Warning Event on
    the pod while it still exists (sent in the background, never fails). False, and nothing
    said, while the pod cache has never listed (unless ``without_cache``): the Event needs it,
    and the caller tries again later (the daemon's retrier, which gives up waiting after a
    while). The caller records the announcement (:func:`set_announced`)."""
    if kube is not None and not without_cache and not _listed(kube):
        return False
    now = time.time()
    pod = mark.pod or "no pod"
    log.warning("DEL of sandbox %s (%s) has failed since %s (%d attempt(s)): %s. The "
                "runtime now gets success so that the pod can terminate; the sandbox stays "
                "recorded as unreleased (`multusd status`), and multusd retries its DEL "
                "until it is released (`multusd gc` at once, once the cause is fixed)",
                mark.container_id, pod, stamp(mark.first_failure), mark.attempts,
                mark.what_failed(),
                extra={"CNI_CONTAINERID": mark.container_id, "UNRELEASED_SINCE":
                       stamp(min(mark.until, now))})
    args = dict(mark.cni_args)
    known, live = _cached_pod(kube, args.get("K8S_POD_NAMESPACE", ""),
                              args.get("K8S_POD_NAME", ""), args.get("K8S_POD_UID", ""))
    if known and live is not None:
        kube.emit_event(live, "Warning", EVENT_REASON, _clip(
            f"the networks of sandbox {mark.container_id[:12]} could not be released: "
            f"{mark.what_failed()}; the pod may terminate, and what they hold stays recorded "
            "until multusd releases it (it retries; `multusd gc` at once)"))
    return True


def _listed(kube: Any) -> bool:
    try:
        return bool(kube.ready())
    except MultusError:
        return False


def _cached_pod(kube: Any, namespace: str, name: str, uid: str) -> Tuple[bool, Any]:
    """(whether the API's view is known, the pod or None) from the watch cache only."""
    if kube is None or not namespace or not name:
        return False, None
    try:
        if not kube.synced() or kube.node_mismatch is not None:
            return False, None
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


def _places(cni_dir: str, spare: str) -> List[str]:
    home = unreleased_marks_dir(cni_dir)
    return [home] + ([spare] if spare and spare != home else [])


def _window_fields(window: float, old: Optional[FailedDelete], now: tuple) -> Dict[str, Any]:
    end = window_end(window, old.to_json() if old is not None else None, now)
    return {"until": end["until"], "boot_id": end["bootId"],
            "until_boot": end.get("untilBoot")}


def _write(cni_dir: str, mark: FailedDelete, spare: str,
           old: Optional[FailedDelete]) -> FailedDelete:
    """Write ``mark`` in ``<cniDir>``, else in ``spare``; ``mark`` with its place. A copy
    ``old`` left in the other place is dropped.

    :raises IOFailure: neither place can take it.
    """
    data = json.dumps(mark.to_json(), indent=1).encode()
    places = _places(cni_dir, spare)
    for index, place in enumerate(places):
        try:
            store.atomic_write(os.path.join(place, mark.container_id), data)
        except MultusError as exc:
            if index == len(places) - 1:
                raise
            LOG.warning("cannot keep the mark of sandbox %s's failed DEL in %s (%s): it is "
                        "kept in %s instead (lost at reboot; the records stay); make the "
                        "directory writable", mark.container_id, place, exc.msg, places[-1])
            continue
        if old is not None and old.place and old.place != place:
            _unlink(old.place, mark.container_id)  # one mark per sandbox
        return replace(mark, place=place)
    raise AssertionError("no place")  # _places always names one


def _remove(path: str) -> bool:
    """:func:`multusd.store.remove`, said in the journal instead of raised; True if it was
    there. A file where the marks' directory should be holds no mark: nothing to say."""
    try:
        return store.remove(path)
    except MultusError as exc:
        if not isinstance(exc.__cause__, NotADirectoryError):
            LOG.warning("%s", exc.msg)
        return False


def _unlink(place: str, container_id: str) -> None:
    try:
        os.unlink(os.path.join(place, container_id))
    except OSError:
        pass


def _number(data: Mapping[str, Any], key: str, default: Optional[float] = 0.0
            ) -> Optional[float]:
    value = number_of(data.get(key))
    return default if value is None else value


def _pairs(data: Mapping[str, Any], key: str) -> List[Mapping[str, Any]]:
    value = data.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _parse(container_id: str, data: Optional[dict], place: str = "") -> Optional[FailedDelete]:
    if data is None or data.get("containerId", container_id) != container_id:
        return None
    first = _number(data, "firstFailure")
    if not first:
        return None
    attempts = data.get("attempts")
    request = data.get("request")
    cni_dir = data.get("cniDir")
    return FailedDelete(
        container_id=container_id, first_failure=first,
        last_failure=_number(data, "lastFailure", first), until=_number(data, "until", first),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 1,
        by=str(data.get("by") or MARKED_BY_SHIM), error=str(data.get("error") or ""),
        failures=tuple(Failure(network=str(f.get("network", "")),
                               ifname=str(f.get("interface", "")), error=str(f.get("error", "")))
                       for f in _pairs(data, "failures")),
        window=_number(data, "window"), announced=data.get("announced") is True,
        request=request if isinstance(request, dict) else None,
        released=tuple(Released(network=str(r.get("network", "")),
                                ifname=str(r.get("interface", "")))
                       for r in _pairs(data, "released")),
        boot_id=str(data.get("bootId") or ""), until_boot=_number(data, "untilBoot", None),
        cni_dir=cni_dir if isinstance(cni_dir, str) and cni_dir.startswith("/") else "",
        place=place)
