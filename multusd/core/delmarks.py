"""The marks of sandboxes whose DEL failed, as the daemon reads and writes them, and where they are.

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
not parse) or answers an error: :mod:`multusd.wire.delwindow`. Both write and read a mark
through the one definition of its format, :func:`multusd.mark_json` and
:func:`multusd.parse_mark` (the package's, so that the shim imports nothing more for it);
:class:`FailedDelete` is the daemon's typed view of it. The daemon publishes its window for
the shim in ``.settings`` (:func:`publish_window`). A leading dot is never part of a
container ID, so the directory never collides with upstream's files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from multusd import (WINDOW_FILE, mark_json, marks_places, parse_mark, store,
                     unreleased_marks_dir, window_left)
from multusd.cni.args import parse_cni_args
from multusd.cni.names import is_valid_name
from multusd.errors import MultusError
from multusd.store.valueclass import Record, field, replace

LOG = logging.getLogger(__name__)

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
        """The mark as written (:func:`multusd.mark_json`; as ``--json`` shows it, with
        ``state``)."""
        doc = mark_json(
            self.container_id, by=self.by, first_failure=self.first_failure,
            last_failure=self.last_failure,
            end={"until": self.until, "bootId": self.boot_id, "untilBoot": self.until_boot},
            window=self.window, attempts=self.attempts, error=self.error,
            failures=[(f.network, f.ifname, f.error) for f in self.failures],
            released=[(r.network, r.ifname) for r in self.released], cni_dir=self.cni_dir,
            announced=self.announced,
            request=dict(self.request) if self.request is not None else None)
        if now is not None:
            doc["state"] = self.state(now)
        return doc


def stamp(epoch: float) -> str:
    """``epoch`` in UTC, ISO 8601 to the second (a mark's times, as people read them)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


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
    for place in marks_places(cni_dir, spare):
        mark = read_in(place, container_id)
        if mark is not None:
            return mark
    return None


def read_in(place: str, container_id: str) -> Optional[FailedDelete]:
    """The mark of ``container_id`` in the marks directory ``place`` alone."""
    if not is_valid_name(container_id):
        return None
    return _parse(container_id, store.read_json_object(os.path.join(place, container_id),
                                                       "unreleased-sandbox mark"), place)


def read_all(cni_dir: str, *, spare: str = "") -> Dict[str, FailedDelete]:
    """Every mark under ``cni_dir`` and in ``spare``, by container ID (``<cniDir>``'s first)."""
    marks: Dict[str, FailedDelete] = {}
    for place in marks_places(cni_dir, spare):
        for name, mark in read_place(place).items():
            marks.setdefault(name, mark)
    return dict(sorted(marks.items()))


def read_place(place: str) -> Dict[str, FailedDelete]:
    """Every mark in the marks directory ``place`` (``<cniDir>/.multusd-unreleased`` or the
    spare one), by container ID; {} when there is none."""
    try:
        names = os.listdir(place)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as exc:
        LOG.warning("cannot list %s: %s", place, exc.strerror)
        return {}
    marks: Dict[str, FailedDelete] = {}
    for name in sorted(names):
        if not is_valid_name(name):
            continue
        mark = _parse(name, store.read_json_object(os.path.join(place, name),
                                                   "unreleased-sandbox mark"), place)
        if mark is not None:
            marks[name] = mark
    return marks


def write(cni_dir: str, mark: FailedDelete, spare: str,
          old: Optional[FailedDelete]) -> FailedDelete:
    """Write ``mark`` in ``<cniDir>``, else in ``spare``; ``mark`` with its place. A copy
    ``old`` left in the other place is dropped.

    :raises IOFailure: neither place can take it.
    """
    data = json.dumps(mark.to_json(), indent=1).encode()
    places = marks_places(cni_dir, spare)
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
    raise AssertionError("no place")  # marks_places always names one


def set_announced(cni_dir: str, mark: FailedDelete, *, spare: str = "") -> FailedDelete:
    """``mark``, announced, written back (where it is, or wherever it can go)."""
    return write(cni_dir, replace(mark, announced=True), spare, mark)


def clear(cni_dir: str, container_id: str, *, spare: str = "") -> bool:
    """Drop the mark (the sandbox is released, or its records were dropped); True if there
    was one. Never raises: a DEL that released everything must not fail on it (a mark left
    on a read-only disk is dropped later, once its sandbox has no records). Costs an unlink of
    a missing file per place on every DEL that succeeds."""
    dropped = False
    for place in marks_places(cni_dir, spare):
        dropped = _remove(os.path.join(place, container_id)) or dropped
    return dropped


def publish_window(cni_dir: str, window: float, default: float, *, spare: str = "") -> None:
    """Tell the shim the window (it reads it when the daemon does not answer): in
    ``<cniDir>``'s marks directory, in ``spare``'s when that cannot take it. Written when it
    changed; with the ``default`` (the shim's own) nothing is left on disk.

    :raises IOFailure: it can be written nowhere.
    """
    places = marks_places(cni_dir, spare)
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
    assert failure is not None  # marks_places always names one
    raise failure


# --- internals -----------------------------------------------------------------------------


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


def _parse(container_id: str, data: Optional[dict], place: str = "") -> Optional[FailedDelete]:
    """The mark read as :func:`multusd.parse_mark` reads it, typed."""
    doc = parse_mark(container_id, data)
    if doc is None:
        return None
    return FailedDelete(
        container_id=container_id, first_failure=doc["firstFailure"],
        last_failure=doc["lastFailure"], until=doc["until"], attempts=doc["attempts"],
        by=doc["by"], error=doc["error"],
        failures=tuple(Failure(network=f["network"], ifname=f["interface"], error=f["error"])
                       for f in doc["failures"]),
        window=doc["window"], announced=doc["announced"], request=doc["request"],
        released=tuple(Released(network=r["network"], ifname=r["interface"])
                       for r in doc["released"]),
        boot_id=doc["bootId"], until_boot=doc["untilBoot"], cni_dir=doc["cniDir"] or "",
        place=place)
