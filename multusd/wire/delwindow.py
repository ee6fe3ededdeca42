"""The shim's half of the DEL window: mark a sandbox whose DEL failed, answer success once it ends.

A DEL that fails (multusd does not answer, or answers an error: a daemon that cannot start,
a plugin whose DEL fails for good, upstream's daemon) is reported to the runtime, which
retries it, only for a short window; then the shim answers success, so that the pod can
terminate and a drain finishes. What the sandbox set up stays recorded: multusd shows it as
*unreleased* and releases it by itself once it runs (``multusd gc`` at once).

The window of a sandbox is kept on disk, where the daemon finds it and a restart does not
lose it: ``<cniDir>/.multusd-unreleased/<containerID>``, a JSON file (root only, written
atomically) whose ``until``/``untilBoot`` end the window. ``cniDir`` is the one the daemon
judges the request by: daemon-config.json's laid over the shim's config (:func:`multusd.overlaid`,
read by :func:`multusd.cni_dir_of`), so that an operator's static multus config that names
no cniDir (upstream's needs none) still has its marks beside the daemon's records and reads
the daemon's published window; 00-multus.conf in auto mode carries daemon-config.json's
anyway, as upstream's generator writes it. The mark is beside the sandbox's records, in a
directory whose name (a leading dot) is never a container ID, so it cannot collide with
upstream's files. When ``<cniDir>`` cannot take the mark (a full or read-only disk, a file
where the directory should be) it goes to the same name in the socket's directory
(``/run/multus/.multusd-unreleased``, lost at reboot), and the shim says so on stderr and in
the journal: the window still ends, and the daemon and the tools read both places.
The daemon writes the same files with more detail (:mod:`multusd.core.delmarks`; it publishes
its ``deleteRetryWindow`` in ``.settings`` for the shim); the shim writes a mark only where
there is none, or its own. Both write and read a mark through the one definition of its
format, :func:`multusd.mark_json` and :func:`multusd.parse_mark` (the package's: nothing more
to import); the shim's marks leave out what only the daemon knows (which delegates failed or
were released already), and keep the runtime's request (:func:`multusd.mark_request`: its
CNI_* variables and config), so that the DEL can be run again as the runtime sent it.

Times: ``firstFailure``, ``lastFailure`` and ``until`` are the wall clock (seconds since the
epoch, for people and across reboots); the window is counted on the boot's clock
(``untilBoot``, CLOCK_BOOTTIME of boot ``bootId``), so that no step of the wall clock
stretches it (:func:`multusd.window_left`). Standard library only, and imported only when a
DEL failed: a DEL that succeeds costs nothing.
"""

import os
import time

from multusd import (MARKED_BY_SHIM, WINDOW_FILE, as_instant, ascii_json, cni_dir_of,
                     go_field, go_loads, mark_json, mark_request, marks_places, overlaid,
                     parse_mark, seconds_of, unreleased_marks_dir, window_end,
                     window_left)  # not json: it imports re and enum, ~13 ms of a shim run

# Ten seconds from the first failure. A kubelet retries a failed KillPodSandbox 10 to 15 s
# after the failure (its pod workers' back-off, 10 s with up to 50% jitter), so its first
# retry finds the window over and gets success: a pod deleted while multusd is down or broken
# leaves the API some 10-20 s later, not minutes. A daemon restart (about a second; systemd
# holds the requests meanwhile, and they rarely fail at all) fits in it several times over.
# A longer window buys little: what the DEL could not release stays recorded, and the daemon
# releases it by itself, at its start and then with a backoff, while a kubelet kept waiting
# holds a drain, a node shutdown and a StatefulSet pod that cannot be made again.
DEFAULT_WINDOW = 10.0


def window(directory: str) -> float:
    """The daemon's ``deleteRetryWindow`` published in the marks' ``directory``, else
    :data:`DEFAULT_WINDOW`."""
    value = _published_window(directory)
    return DEFAULT_WINDOW if value is None else value


def _published_window(directory: str) -> "float | None":
    try:
        with open(os.path.join(directory, WINDOW_FILE), "rb") as handle:
            value = go_field(go_loads(handle.read()), "deleteRetryWindow")
    except (OSError, ValueError):
        return None
    return seconds_of(value)


def read_mark(path: str) -> "dict | None":
    """The mark at ``path``; None when there is none or it cannot be read as one."""
    try:
        with open(path, "rb") as handle:
            mark = go_loads(handle.read())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def expired(mark: dict, now: object = None) -> bool:
    """The mark's window is over: DEL answers success from now on (``now``: a
    :func:`multusd.clock_now` reading, or a wall-clock time)."""
    return window_left(mark, now) <= 0


def note_failure(conf: dict, env: "dict[str, str]", stdin: bytes, error: str,
                 now: object = None, *, socket_dir: str = "",
                 warn: "object | None" = None, daemon: "dict | None" = None) -> "dict | None":
    """Record that this DEL failed; return the sandbox's mark (None: it cannot be marked).

    A mark the daemon wrote is only read (the daemon counted this failure itself when it
    answered); the shim's own mark gets one more attempt. The mark goes to ``<cniDir>``
    (``daemon``'s, daemon-config.json's, laid over ``conf``'s: the daemon's records are
    there); when that fails, to ``socket_dir``'s marks directory, and ``warn`` (a callable)
    is told.
    """
    container_id = env.get("CNI_CONTAINERID", "")
    if not _is_file_name(container_id):
        return None
    now = as_instant(now)
    cni_dir = marks_cni_dir(conf, daemon)
    places = marks_places(cni_dir, unreleased_marks_dir(socket_dir) if socket_dir else "")
    mark, found_in = None, ""
    for place in places:
        mark = parse_mark(container_id, read_mark(os.path.join(place, container_id)))
        if mark is not None:
            found_in = place
            break
    if mark is not None and mark["by"] != MARKED_BY_SHIM:
        return mark
    first = mark is None
    if first:
        seconds = next((w for w in map(_published_window, places) if w is not None),
                       DEFAULT_WINDOW)
        mark = mark_json(container_id, by=MARKED_BY_SHIM, first_failure=now[0],
                         last_failure=now[0], end=window_end(seconds, None, now),
                         window=seconds, attempts=1, error=error, cni_dir=cni_dir,
                         request=mark_request(env, stdin))
    else:
        mark = dict(mark, lastFailure=now[0], error=error, attempts=mark["attempts"] + 1)
        if mark["bootId"] != now[1]:  # written in another boot: on this boot's clock now
            mark.update(window_end(seconds_of(mark["window"]) or DEFAULT_WINDOW, mark, now))
    data = ascii_json(mark).encode()
    for place in places:
        try:  # the first failure must survive a power loss; a lost count costs nothing
            _write(place, container_id, data, durable=first)
        except OSError as exc:
            if place == places[-1]:
                return None  # nowhere: the error is reported as it was, the runtime retries
            if callable(warn):
                warn(f"cannot keep the mark of container {container_id}'s failed DEL in "
                     f"{place}: {exc.strerror or exc}; it is kept in {places[-1]} instead "
                     f"(lost at reboot; the sandbox's records in {cni_dir} stay for "
                     "multusd): make the directory writable")
            continue
        if found_in and found_in != place:
            try:
                os.unlink(os.path.join(found_in, container_id))  # one mark per sandbox
            except OSError:
                pass
        return mark
    return None


def marks_cni_dir(conf: dict, daemon: "dict | None") -> str:
    """The cniDir a failed DEL is marked in: the one the daemon judges the request by,
    ``daemon`` (daemon-config.json, None: not there) laid over ``conf`` (the shim's)."""
    return cni_dir_of(overlaid(conf, daemon) if daemon else conf)


def give_up_message(mark: dict, now: object = None) -> str:
    """The line the shim logs when it answers a failed DEL with success."""
    now = as_instant(now)[0]
    first = mark.get("firstFailure")
    since = (f"since {_stamp(first)} ({_span(now - first)} ago)"
             if isinstance(first, (int, float)) else "repeatedly")
    seconds = mark.get("window")
    window_text = _span(seconds) if isinstance(seconds, (int, float)) else "deleteRetryWindow"
    return (f"DEL of container {mark.get('containerId', '?')} has failed {since}, "
            f"{mark.get('attempts', '?')} attempt(s), last: {mark.get('error', '?')}; its "
            f"window ({window_text}) has passed, so DEL answers success and the pod can "
            "terminate. Its records stay: multusd shows the sandbox as unreleased (`multusd "
            "status`) and releases it by itself once multusd and its plugins work (`multusd "
            "gc` at once)")


def to_syslog(message: str) -> None:
    """The journal (syslog identifier multus-shim), where the operator looks; never raises."""
    try:
        import syslog

        syslog.openlog("multus-shim", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, message)
        syslog.closelog()
    except Exception:  # noqa: BLE001 - no syslog: stderr and logFile still have it
        pass


def _is_file_name(name: str) -> bool:
    """Usable as a file name in the marks directory (the daemon checks the CNI rule itself)."""
    return (0 < len(name) <= 253 and "/" not in name and "\0" not in name
            and not name.startswith("."))


def _write(directory: str, name: str, data: bytes, durable: bool = True) -> None:
    """Replace ``directory/name`` atomically (temp file, fsync, rename, fsync of the directory;
    the fsyncs only when ``durable``).

    The daemon writes through :func:`multusd.store.atomic_write`; the shim may import the
    standard library only, so these are the same steps in its own words.
    """
    for path in (os.path.dirname(directory), directory):  # cniDir (or the socket's), the marks'
        try:
            os.mkdir(path, 0o700)  # never cniDir's parents: a stale /host/... path stays absent
        except FileExistsError:
            pass
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(directory, name))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not durable:
        return
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _span(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
