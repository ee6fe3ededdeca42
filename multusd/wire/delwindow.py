"""The shim's half of the DEL window: mark a sandbox whose DEL failed, answer success once it ends.

A DEL that fails (multusd does not answer, or answers an error: a daemon that cannot start,
a plugin whose DEL fails for good, upstream's daemon) is reported to the runtime, which
retries it, only for a bounded window; then the shim answers success, so that the pod can
terminate and a drain finishes. What the sandbox set up stays recorded: multusd shows it as
*unreleased* and ``multusd gc`` releases it later.

The window of a sandbox is kept on disk, where the daemon finds it and a restart does not
lose it: ``<cniDir>/.multusd-unreleased/<containerID>``, a JSON file (root only, written
atomically) whose ``until`` is the end of the window. ``cniDir`` is the one in the shim's
config (00-multus.conf carries daemon-config.json's, as upstream's generator writes it), else
upstream's default /var/lib/cni/multus: beside the sandbox's records, in a directory whose
name (a leading dot) is never a container ID, so it cannot collide with upstream's files.
The daemon writes the same files with more detail (:mod:`multusd.core.unreleased` defines
them and publishes its ``deleteRetryWindow`` in ``.settings`` for the shim); the shim writes
a mark only where there is none, or its own, and reads ``until``. Keys the shim writes:
``containerId``, ``by`` ("shim"), ``firstFailure``, ``lastFailure``, ``until``, ``window``,
``attempts``, ``error`` and ``request`` (the runtime's CNI_* variables and config, so that
the DEL can be run again as the runtime sent it).

Standard library only, and imported only when a DEL failed: a DEL that succeeds costs
nothing. Times are the wall clock (seconds since the epoch), so they survive reboots.
"""

import os
import time

from multusd import (DEFAULT_CNI_DIR, MARK_REQUEST_ENV, MARKED_BY_SHIM, UNRELEASED_DIR,
                     WINDOW_FILE)
from multusd.wire import quickjson  # not json: it imports re and enum, ~13 ms of a shim run

# Five minutes: kubelet retries a failed StopPodSandbox about every 10 s (its pod workers'
# back-off), so a transient failure (an IPAM daemon or OVS restarting, a plugin being
# upgraded) gets ~30 more tries; it is longer than the default terminationGracePeriod (30 s)
# and well within the timeouts drain tools use (10 min and more).
DEFAULT_WINDOW = 300.0


def marks_dir(cni_dir: str = "") -> str:
    return os.path.join(cni_dir or DEFAULT_CNI_DIR, UNRELEASED_DIR)


def cni_dir_of(conf: dict) -> str:
    """``cniDir`` of the shim's config, the default when unset; "" when it is not usable."""
    value = conf.get("cniDir")
    if value is None or value == "":
        return DEFAULT_CNI_DIR
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        return ""
    return value


def window(directory: str) -> float:
    """The daemon's published ``deleteRetryWindow``, else :data:`DEFAULT_WINDOW`."""
    try:
        with open(os.path.join(directory, WINDOW_FILE), "rb") as handle:
            value = quickjson.loads(handle.read()).get("deleteRetryWindow")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_WINDOW
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return DEFAULT_WINDOW
    return float(value)


def read_mark(path: str) -> "dict | None":
    """The mark at ``path``; None when there is none or it cannot be read as one."""
    try:
        with open(path, "rb") as handle:
            mark = quickjson.loads(handle.read())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def expired(mark: dict, now: "float | None" = None) -> bool:
    """The mark's window is over: DEL answers success from now on."""
    until = mark.get("until")
    if isinstance(until, bool) or not isinstance(until, (int, float)):
        return False
    return (time.time() if now is None else now) >= until


def note_failure(conf: dict, env: "dict[str, str]", stdin: bytes, error: str,
                 now: "float | None" = None) -> "dict | None":
    """Record that this DEL failed; return the sandbox's mark (None: it cannot be marked).

    A mark the daemon wrote is only read (the daemon counted this failure itself when it
    answered); the shim's own mark gets one more attempt.
    """
    container_id = env.get("CNI_CONTAINERID", "")
    directory_of = cni_dir_of(conf)
    if not directory_of or not _is_file_name(container_id):
        return None
    directory = marks_dir(directory_of)
    path = os.path.join(directory, container_id)
    now = time.time() if now is None else now
    mark = read_mark(path)
    if mark is not None and mark.get("by") != MARKED_BY_SHIM:
        return mark
    first = mark is None
    if first:
        seconds = window(directory)
        mark = {"containerId": container_id, "by": MARKED_BY_SHIM, "firstFailure": now,
                "lastFailure": now, "until": now + seconds, "window": seconds, "attempts": 1,
                "error": error,
                "request": {"env": {k: env[k] for k in MARK_REQUEST_ENV if k in env},
                            "config": stdin.decode("utf-8", "replace")}}
    else:
        attempts = mark.get("attempts")
        mark = dict(mark, lastFailure=now, error=error,
                    attempts=(attempts if isinstance(attempts, int) else 0) + 1)
    try:  # the first failure must survive a power loss; a lost count costs nothing
        _write(directory, container_id, quickjson.dumps(mark).encode(), durable=first)
    except OSError:
        return None
    return mark


def give_up_message(mark: dict, now: "float | None" = None) -> str:
    """The line the shim logs when it answers a failed DEL with success."""
    now = time.time() if now is None else now
    first = mark.get("firstFailure")
    since = (f"since {_stamp(first)} ({_span(now - first)} ago)"
             if isinstance(first, (int, float)) else "repeatedly")
    seconds = mark.get("window")
    window_text = _span(seconds) if isinstance(seconds, (int, float)) else "deleteRetryWindow"
    return (f"DEL of container {mark.get('containerId', '?')} has failed {since}, "
            f"{mark.get('attempts', '?')} attempt(s), last: {mark.get('error', '?')}; its "
            f"window ({window_text}) has passed, so DEL answers success and the pod can "
            "terminate. Its records stay: multusd shows the sandbox as unreleased (`multusd "
            "status`) and `multusd gc` releases it once multusd and its plugins work")


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
    for path in (os.path.dirname(directory), directory):  # cniDir, then the marks' own
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
