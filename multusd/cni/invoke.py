"""Finding and running CNI plugin binaries: the only module of multusd that executes a plugin.

Every plugin runs with an environment built for that one call (``os.environ`` is never
written: upstream's setenv race), in its own process group so that a plugin that hangs
is killed together with its children when the deadline passes. Failures are translated
here, at the one boundary, into the errors of :mod:`multusd.errors`:

* a plugin's own CNI error JSON (non-zero exit, ``code`` and ``msg`` on stdout) ->
  :class:`PluginError`, unchanged;
* a non-zero exit without such JSON, or stdout that is not JSON -> :class:`DelegateError`;
* the deadline passing -> :class:`DeadlineExceeded`;
* a missing or non-executable binary -> :class:`InvalidNetworkConfig`.

All but the first carry a ``details`` block (plugin, command, exit code, stdout, stderr).

Each execution that started is reported to the caller's ``observer``, if it gave one
(:data:`PluginObserver`: the daemon turns it into metrics); this module records nothing itself.
A caller that must end every plugin at once (the daemon's stop) hands each run the same
:class:`RunningPlugins`, which knows their process groups.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from multusd import go_loads
from multusd.errors import (DeadlineExceeded, DelegateError, InvalidNetworkConfig, MultusError,
                      PluginError)

LOG = logging.getLogger(__name__)

#: How often, and after how long, an exec that hit ETXTBSY is retried (the binary is
#: being replaced by a package upgrade at that moment).
ETXTBSY_BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8)

#: Output kept in error details, per stream; a plugin printing megabytes must not fill logs.
DETAILS_LIMIT = 4096

#: Output a plugin may print per stream before it is killed.
OUTPUT_LIMIT = 16 * 1024 * 1024

#: After killing a plugin, how long to wait for its pipes to close.
_REAP_TIMEOUT = 2.0

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Where plugins are looked up, in order, when ``binDir`` is not set: upstream's default,
#: then where Debian's containernetworking-plugins (recommended by the package) installs them,
#: then Fedora's.
DEFAULT_BIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni")

#: Told of every plugin execution, after it ends: ``observer(plugin_type, command, seconds,
#: outcome)``, outcome ``"ok"`` or ``"error"`` (any failure, the plugin's own CNI error
#: included). Called on the request's thread; whatever it raises is logged and dropped.
PluginObserver = Callable[[str, str, float, str], None]


def search_path(bin_dir: str, extra: Sequence[str] = ()) -> Tuple[str, ...]:
    """The directories searched for plugins: ``bin_dir`` (:data:`DEFAULT_BIN_DIRS` when it
    is empty), then ``extra`` (the daemon's own CNI_PATH, as upstream), each once."""
    dirs = [bin_dir] if bin_dir else list(DEFAULT_BIN_DIRS)
    dirs += [d for d in extra if d and d not in dirs]
    return tuple(dirs)


def plugins_in(directory: str) -> Optional[Tuple[str, ...]]:
    """The executable files in ``directory``, sorted; None when it is not a directory."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    return tuple(n for n in names if os.path.isfile(os.path.join(directory, n))
                 and os.access(os.path.join(directory, n), os.X_OK))


def find_plugin(plugin_type: str, bin_dirs: Sequence[str]) -> str:
    """The path of the first executable ``<dir>/<plugin_type>`` in ``bin_dirs``.

    :raises InvalidNetworkConfig: for an empty ``type``, one containing ``/``, or when no
        directory has the plugin; the message lists every directory searched.
    """
    if not plugin_type:
        raise InvalidNetworkConfig("the network configuration has an empty plugin 'type'")
    if "/" in plugin_type or plugin_type in (".", ".."):
        raise InvalidNetworkConfig(
            f"invalid plugin type {plugin_type!r}: a type is a file name looked up in the "
            f"plugin directories {list(bin_dirs)!r}, not a path")
    not_executable = []
    for directory in bin_dirs:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            not_executable.append(candidate)
    hint = (f" ({', '.join(not_executable)} exists but is not executable: chmod +x it)"
            if not_executable else "; install the plugin there or fix 'binDir'")
    error = InvalidNetworkConfig(
        f"failed to find plugin {plugin_type!r} in the plugin directories {list(bin_dirs)!r}"
        f"{hint}")
    error.missing_plugin = (plugin_type, tuple(bin_dirs))
    raise error


# How libcni (so every Go plugin delegating to IPAM) says that it found no binary.
_GO_NOT_FOUND = re.compile(r'failed to find plugin "([^"]+)" in path \[([^\]]*)\]')


def missing_plugin(exc: BaseException) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """``(plugin, directories searched)`` when ``exc`` says a plugin binary does not exist:
    ours (:func:`find_plugin`) or a plugin's own, e.g. bridge not finding host-local."""
    found = getattr(exc, "missing_plugin", None)
    if found is not None:
        return found
    match = _GO_NOT_FOUND.search(str(getattr(exc, "msg", "")))
    if match is None:
        return None
    return match.group(1), tuple(match.group(2).split())


def build_env(command: str, container_id: str, netns: str, ifname: str, cni_args: str,
              cni_path: str) -> Dict[str, str]:
    """The CNI_* variables of one plugin call (all six are always set, possibly empty)."""
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_ARGS": cni_args,
        "CNI_PATH": cni_path,
    }


class RunningPlugins:
    """The plugin processes running now, and the one switch that ends them all.

    Every run handed this registers its process while it runs. :meth:`end_all` kills every
    process group registered (the plugin and what it started) and, from then on, a run does
    not start (or, registering after the switch, is killed at once): each fails with
    :class:`~multusd.errors.DeadlineExceeded` saying why. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Dict[int, str] = {}  # pid (its group's ID) -> "plugin COMMAND"
        self._killed: set = set()
        self.ended: Optional[str] = None  # why no plugin may run any more

    def add(self, proc: subprocess.Popen, what: str) -> None:
        with self._lock:
            if self.ended is None:
                self._running[proc.pid] = what
                return
            self._killed.add(proc.pid)
        _kill_group(proc.pid)

    def discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.pop(proc.pid, None)
            self._killed.discard(proc.pid)

    def was_killed(self, proc: subprocess.Popen) -> bool:
        with self._lock:
            return proc.pid in self._killed

    def running(self) -> List[str]:
        """"plugin COMMAND" of every run registered now."""
        with self._lock:
            return sorted(self._running.values())

    def end_all(self, reason: str) -> List[str]:
        """Kill every running plugin's process group, and refuse every later run with
        ``reason``; "plugin COMMAND" of each one killed."""
        with self._lock:
            self.ended = reason
            killed = dict(self._running)
            self._killed.update(killed)
            self._running.clear()
        for pid in killed:
            _kill_group(pid)
        return sorted(killed.values())


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # every plugin leads a process group of its own
    except (ProcessLookupError, PermissionError):
        pass


def exec_plugin(path: str, *, command: str, stdin: bytes, env: Mapping[str, str],
                deadline: float, observer: Optional[PluginObserver] = None,
                running: Optional[RunningPlugins] = None) -> Optional[dict]:
    """Run the plugin at ``path`` with ``stdin`` and ``env`` until ``deadline``.

    :param deadline: a :func:`time.monotonic` instant; the plugin's process group is
        killed when it passes.
    :param observer: told of the execution once it ends (not when it never started).
    :param running: where the run is registered while it runs (see :class:`RunningPlugins`).
    :returns: the JSON object the plugin printed, or None when it printed nothing.
    :raises PluginError: the plugin's own CNI error, unchanged.
    :raises DeadlineExceeded: the plugin was still running at the deadline (it is killed), or
        ``running`` ended every plugin (it was killed, or not started).
    :raises DelegateError: non-zero exit without a CNI error, or stdout that is not JSON.
    :raises InvalidNetworkConfig: the binary is missing or cannot be executed.
    """
    run = _PluginRun(path, command)
    if time.monotonic() >= deadline:
        raise run.failure(DeadlineExceeded, "was not started: the request deadline had "
                          "already passed", None, b"", b"")
    if running is not None and running.ended is not None:
        raise run.failure(DeadlineExceeded, f"was not started: {running.ended}", None, b"", b"")
    started = time.monotonic()
    outcome = "error"
    try:
        proc = run.start(plugin_environment(env), deadline)
        if running is None:
            stdout, stderr = run.communicate(proc, stdin, deadline)
        else:
            running.add(proc, f"{run.name} {command}")
            try:
                stdout, stderr = run.communicate(proc, stdin, deadline)
                if running.was_killed(proc):
                    raise run.failure(DeadlineExceeded, f"was killed: {running.ended}",
                                      proc.returncode, stdout, stderr)
            finally:
                running.discard(proc)
        output = run.decode(proc.returncode, stdout, stderr)
        outcome = "ok"
        return output
    finally:
        if observer is not None:
            _report(observer, run, outcome, time.monotonic() - started)


def _report(observer: PluginObserver, run: "_PluginRun", outcome: str, seconds: float) -> None:
    try:
        observer(run.name, run.command, seconds, outcome)
    except Exception:  # a broken observer must not turn a plugin's answer into a failure
        LOG.exception("the plugin observer failed on %s %s", run.name, run.command)


def plugin_environment(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` plus the daemon's PATH when ``env`` has none (plugins exec iptables & co)."""
    built = dict(env)
    if "PATH" not in built:
        built["PATH"] = os.environ.get("PATH") or _DEFAULT_PATH
    return built


class _PluginRun:
    """One execution of one plugin: start, wait with a deadline, decode the output."""

    def __init__(self, path: str, command: str) -> None:
        self.path = path
        self.command = command
        self.name = os.path.basename(path)

    def start(self, env: Dict[str, str], deadline: float) -> subprocess.Popen:
        for attempt, backoff in enumerate(ETXTBSY_BACKOFF + (None,)):
            try:
                return subprocess.Popen(
                    [self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=env, close_fds=True, cwd="/",
                    start_new_session=True)  # own process group: killpg reaches children
            except OSError as exc:
                if exc.errno != errno.ETXTBSY or backoff is None:
                    raise self._exec_failure(exc) from exc
                if time.monotonic() + backoff >= deadline:
                    raise self._deadline_error(b"", b"") from exc
                LOG.info("plugin %s is being written (ETXTBSY), retry %d in %.2fs",
                         self.path, attempt + 1, backoff)
                time.sleep(backoff)
        raise AssertionError("unreachable")  # the loop returns or raises

    def communicate(self, proc: subprocess.Popen, stdin: bytes,
                    deadline: float) -> Tuple[bytes, bytes]:
        output = _Output()
        try:
            return output.exchange(proc, stdin, deadline)
        except subprocess.TimeoutExpired:
            self._kill_and_close(proc)
            raise self._deadline_error(*output.so_far()) from None
        except _OutputTooLarge as exc:
            self._kill_and_close(proc)
            raise self.failure(DelegateError, f"printed more than {OUTPUT_LIMIT >> 20} MiB on "
                               f"{exc.stream} and was killed; a CNI result is a few KiB",
                               None, *output.so_far()) from None
        except BaseException:
            self._kill_and_close(proc)
            raise

    def _kill_and_close(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            proc.wait(_REAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            LOG.warning("plugin %s (pid %d) did not exit after SIGKILL", self.name, proc.pid)

    def decode(self, returncode: int, stdout: bytes, stderr: bytes) -> Optional[dict]:
        if stderr:
            LOG.debug("plugin %s %s wrote to stderr: %s", self.name, self.command,
                      _text(stderr))
        text = stdout.strip()
        if returncode != 0:
            error = _json_object(text)
            if error is not None and _is_cni_error(error):
                raise PluginError(error)
            reason = ("printed no CNI error" if not text
                      else "printed something that is not a CNI error")
            raise self.failure(DelegateError, f"exited with code {returncode} and {reason}",
                               returncode, stdout, stderr)
        if not text:
            return None
        result = _json_object(text)
        if result is None:
            raise self.failure(DelegateError, "succeeded but printed something that is not "
                               "a JSON object on stdout", returncode, stdout, stderr)
        return result

    def _deadline_error(self, stdout: bytes, stderr: bytes) -> MultusError:
        return self.failure(DeadlineExceeded, "did not finish before the request deadline "
                            "and was killed; check why it hangs or raise the timeout",
                            None, stdout, stderr)

    def _exec_failure(self, exc: OSError) -> MultusError:
        if exc.errno == errno.ENOENT:
            reason = "cannot be executed: the binary (or its interpreter) does not exist"
        elif exc.errno == errno.EACCES:
            reason = "cannot be executed: permission denied (is it executable?)"
        else:
            reason = f"cannot be executed: {exc.strerror or exc}"
        return self.failure(InvalidNetworkConfig, reason, None, b"", b"")

    def failure(self, kind: type, reason: str, returncode: Optional[int], stdout: bytes,
                stderr: bytes) -> MultusError:
        msg = f"plugin {self.name!r} ({self.path}) {self.command} {reason}"
        last_line = _last_line(stderr)
        if last_line:
            msg += f"; it said: {last_line!r}"  # the operator sees msg, not always details
        details = format_details(self.path, self.command, returncode, reason, stdout, stderr)
        error = kind(msg, details)
        error.plugin_path = self.path
        error.command = self.command
        error.exit_code = returncode
        error.stderr = _text(stderr)
        return error


class _OutputTooLarge(Exception):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


class _Output:
    """stdin written and stdout/stderr read together, each output bounded by OUTPUT_LIMIT."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()

    def so_far(self) -> Tuple[bytes, bytes]:
        return bytes(self.stdout), bytes(self.stderr)

    def exchange(self, proc: subprocess.Popen, stdin: bytes,
                 deadline: float) -> Tuple[bytes, bytes]:
        buffers = {proc.stdout.fileno(): (self.stdout, "stdout"),
                   proc.stderr.fileno(): (self.stderr, "stderr")}
        # The plugin's exit, as an fd: Popen.wait(timeout) polls with sleeps from 0.5 ms up
        # (~0.7 ms lost per plugin, three per ADD), a pidfd says it at once.
        exited = _pidfd(proc.pid)
        with selectors.DefaultSelector() as selector:
            for fd in buffers:
                selector.register(fd, selectors.EVENT_READ)
            if exited is not None:
                selector.register(exited, selectors.EVENT_READ)
            pending = memoryview(stdin)
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            try:
                self._pump(proc, selector, buffers, pending, exited, deadline)
            finally:
                if exited is not None:
                    os.close(exited)
        proc.wait(max(0.0, deadline - time.monotonic()))
        return self.so_far()

    def _pump(self, proc: subprocess.Popen, selector: selectors.BaseSelector, buffers: dict,
              pending: memoryview, exited: Optional[int], deadline: float) -> None:
        """Write stdin and read both outputs until EOF on both and, with a pidfd, the exit."""
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in selector.select(remaining):
                if key.fd == exited:
                    selector.unregister(exited)
                    continue
                if key.fd in buffers:
                    buffer, name = buffers[key.fd]
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fd)
                    buffer += data
                    if len(buffer) > OUTPUT_LIMIT:
                        raise _OutputTooLarge(name)
                    continue
                try:
                    pending = pending[os.write(key.fd, pending[:65536]):]
                except BrokenPipeError:
                    pending = pending[:0]  # it stopped reading: its output says why
                if not pending:
                    selector.unregister(key.fd)
                    proc.stdin.close()


def _pidfd(pid: int) -> Optional[int]:
    """A pidfd of ``pid`` (Linux 5.3+, Python 3.9+), else None: then Popen.wait polls."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def format_details(path: str, command: str, returncode: Optional[int], reason: str,
                   stdout: bytes, stderr: bytes) -> str:
    """A multi-line evidence block in the style of cloud-init's ProcessExecutionError."""
    exit_code = "-" if returncode is None else str(returncode)
    return "\n".join((
        f"Plugin: {path}",
        f"Command: {command}",
        f"Exit code: {exit_code}",
        f"Reason: {reason}",
        f"Stdout: {_indented(stdout)}",
        f"Stderr: {_indented(stderr)}",
    ))


def _indented(data: bytes) -> str:
    text = _text(data).rstrip("\n")
    if not text:
        return "-"
    return text.replace("\n", "\n        ")


def _last_line(data: bytes, limit: int = 300) -> str:
    lines = [line.strip() for line in _text(data[-DETAILS_LIMIT:]).splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    return last[:limit]


def _text(data: bytes) -> str:
    text = data[:DETAILS_LIMIT].decode("utf-8", errors="replace")
    if len(data) > DETAILS_LIMIT:
        text += f"... ({len(data) - DETAILS_LIMIT} more bytes)"
    return text


def _json_object(text: bytes) -> Optional[Dict[str, Any]]:
    try:
        value = go_loads(text)  # as libcni reads a plugin's output
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _is_cni_error(obj: Dict[str, Any]) -> bool:
    code = obj.get("code")
    return (isinstance(code, int) and not isinstance(code, bool) and code != 0
            and isinstance(obj.get("msg"), str))
