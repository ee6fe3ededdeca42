"""multus-shim: the CNI plugin the container runtime executes; forwards the call to multusd.

Standard library only, and as few imports as possible: the runtime forks it for every pod
sandbox. It reads ``cniVersion``, ``daemonSocketDir`` and the logging keys from its stdin
config, answers VERSION itself, and POSTs everything else to ``/cni`` on the daemon's socket
(wire-compatible with upstream's daemon). ADD, CHECK and GC first wait (bounded) for
``/readyz``; DEL only probes ``/healthz`` so that clean-up proceeds while the daemon drains,
and so does STATUS, whose job is to say "not ready" at once: it never waits for ``/readyz``,
and a daemon that does not answer its probe within seconds is CNI error 50, as the daemon's
own "not ready" is.
A daemon that answers ADD, CHECK or GC with HTTP 503 (:data:`~multusd.wire.api.NOT_STARTED`)
did not start it: it is stopping (a restart or upgrade), and systemd's socket keeps the next
connection for the next daemon. The shim then waits for ``/readyz`` again and sends the
request once more, as long as the readiness wait's own bound (:data:`READY_TIMEOUT`, from the
first wait) has not passed; every other answer, 400 among them, is final (a DEL is served
while the daemon drains; STATUS answers at once).
The call to ``/cni`` is bounded, whole: the daemon's request deadline (``requestTimeout``,
:data:`REQUEST_TIMEOUT` unless daemon-config.json says longer, read only once that has
passed) plus :data:`ANSWER_MARGIN` (STATUS: :data:`STATUS_TIMEOUT`); a daemon that does not
answer by then gets a CNI error naming its socket, the time waited and what to check, not a
runtime waiting forever.
Unlike upstream, a failed DEL is reported to the runtime so that it retries instead of
leaking addresses, but only for a bounded window (:mod:`multusd.wire.delwindow`): after it
the shim answers success, so that the pod can terminate, and the sandbox stays recorded as
unreleased for multusd to show and release, its mark beside the daemon's records (the
``cniDir`` of daemon-config.json laid over the shim's config, as the daemon judges the
request). A DEL of something already gone succeeds in the daemon.
daemon-config.json (:class:`DaemonFile`) is read at most once per run, and only on those two
paths: a call the daemon has not answered within the default deadline, a DEL that failed.
"""

import sys
import time

# posix, not os: os imports stat, posixpath and the abstract collections, ~2 ms per pod.
import posix

from multusd import (COMMAND_MIN_VERSION, CURRENT_VERSION, SUPPORTED_VERSIONS, ResultError,
                     __version__, ascii_json, convert, go_field, go_fields, go_loads,
                     seconds_of, wire)
from multusd.wire import api

READY_POLL_FIRST = 0.01   # a daemon just activated answers within milliseconds ...
READY_POLL_INTERVAL = 0.1  # ... one waiting for its API caches, upstream's 100 ms
READY_TIMEOUT = 60.0
STATUS_PROBE_TIMEOUT = 3.0  # a running daemon answers /healthz in milliseconds
# The daemon answers every request by its deadline, requestTimeout after it read it (its
# default, 110 s, keeps an ADD inside the kubelet's 2 minutes); the margin covers its start
# by socket activation and writing the answer. A longer requestTimeout in daemon-config.json
# (at its default path, where `multusd serve` reads it) is honoured, read only when needed.
REQUEST_TIMEOUT = 110.0
STATUS_TIMEOUT = 5.0  # STATUS answers at once: a daemon silent this long is not ready
ANSWER_MARGIN = 10.0
DAEMON_CONFIG = "/etc/cni/net.d/multus.d/daemon-config.json"
LEVELS = {"panic": 0, "error": 1, "verbose": 2, "debug": 3}


class DaemonFile:
    """daemon-config.json at :data:`DAEMON_CONFIG` (where ``multusd serve`` reads it), read as
    the daemon reads it, at most once per shim run and only when asked: its
    ``requestTimeout`` once the default has passed, the whole of it for a failed DEL's mark.
    Absent, unreadable or no JSON object: ``{}`` (the shim's own config alone counts)."""

    def __init__(self, path: str = DAEMON_CONFIG) -> None:
        self.path = path
        self._doc: "dict | None" = None

    def doc(self) -> dict:
        if self._doc is None:
            try:
                with open(self.path, "rb") as handle:
                    doc = go_loads(handle.read())
            except (OSError, ValueError):
                doc = None
            self._doc = doc if isinstance(doc, dict) else {}
        return self._doc

    def request_timeout(self) -> "float | None":
        """``requestTimeout`` (seconds), None when it names none (or the file is not there)."""
        return seconds_of(go_field(self.doc(), "requestTimeout"))


class ShimConfig:
    """The few keys of the runtime's config that the shim itself reads, as upstream's shim reads
    them (its ShimNetConf struct: "CNIVersion" sets cniVersion)."""

    def __init__(self, conf: dict) -> None:
        self.raw = conf  # the rest is read only on a failure path (cniDir, for a failed DEL)
        settings = go_fields(conf, tuple(_SETTINGS), check=_check_setting)
        self.cni_version = settings.get("cniVersion", "")
        self.socket_dir = _path_setting(settings, "daemonSocketDir") or api.DEFAULT_SOCKET_DIR
        self.log_file = _path_setting(settings, "logFile")
        level = settings.get("logLevel", "").lower()
        if level and level not in LEVELS:
            raise wire.errors().DecodeFailure(f"invalid \"logLevel\" {level!r} in the multus-shim config: "
                                f"use one of {', '.join(LEVELS)}")
        self.log_level = LEVELS.get(level, 0)
        self.log_to_stderr = settings.get("logToStderr") is True

    def log(self, level: str, message: str) -> None:
        """Upstream's line format, to logFile and/or stderr as configured."""
        if LEVELS[level] > self.log_level and level != "error":
            return
        self._write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} [{level}] {message}\n",
                    self.log_to_stderr)

    def warn(self, message: str) -> None:
        """A line the operator must see whatever the logging keys say: stderr (the runtime
        logs a plugin's stderr), logFile if set, and the journal."""
        self._write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} [warning] multus-shim: {message}\n",
                    True)

    def _write(self, line: str, to_stderr: bool) -> None:
        if to_stderr:
            sys.stderr.write(line)
        if self.log_file:
            try:
                with open(self.log_file, "a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError:
                pass


# The keys the shim reads (upstream's ShimNetConf fields) and their JSON types.
_SETTINGS = {"cniVersion": str, "daemonSocketDir": str, "logFile": str, "logLevel": str,
             "logToStderr": bool}
_TYPE_NAMES = {str: "a string", bool: "a boolean"}


def _check_setting(key: str, value: object) -> None:
    """Every value a setting is given must have its JSON type (null leaves it unset)."""
    kind = _SETTINGS[key]
    if type(value) is not kind:
        raise wire.errors().DecodeFailure(f"invalid \"{key}\" in the multus-shim config: it must be "
                            f"{_TYPE_NAMES[kind]}, not {value!r:.40}")


def _path_setting(settings: dict, key: str) -> str:
    """An absolute path setting: the shim never writes or connects relative to its cwd."""
    value = settings.get(key, "")
    if value and (not value.startswith("/") or "\0" in value or len(value) > 4096):
        raise wire.errors().DecodeFailure(f"invalid \"{key}\" {value!r:.80} in the multus-shim config: it "
                            "must be an absolute path")
    return value


MAX_STDIN = 3 * 1024 * 1024  # the daemon takes 4 MiB of request, the config base64-encoded


def parse_config(stdin: bytes) -> ShimConfig:
    if len(stdin) > MAX_STDIN:
        raise wire.errors().DecodeFailure(f"invalid CNI configuration passed to multus-shim: {len(stdin)} "
                            f"bytes, over the limit of {MAX_STDIN}")
    try:
        conf = go_loads(stdin)
        if not isinstance(conf, dict):
            raise ValueError("the configuration is not a JSON object")
    except ValueError as exc:
        raise wire.errors().DecodeFailure(
            "invalid CNI configuration passed to multus-shim: failed to gather the multus "
            f"configuration: {exc}") from None
    return ShimConfig(conf)


def check_command_allowed(command: str, cni_version: str) -> None:
    """Refuse CHECK below 0.4.0 and STATUS/GC below 1.1.0 without asking the daemon."""
    minimum = COMMAND_MIN_VERSION.get(command)
    if minimum is None or not cni_version:
        return
    try:
        version = tuple(int(part) for part in cni_version.split("."))
    except ValueError:
        raise wire.errors().IncompatibleCNIVersion(f"invalid cniVersion {cni_version!r} in the CNI config") from None
    if version < tuple(int(part) for part in minimum.split(".")):
        raise wire.errors().IncompatibleCNIVersion(f"config version does not allow {command}")


def wait_ready(sock: str, timeout: float = READY_TIMEOUT, since: "float | None" = None) -> None:
    """Poll /readyz until it answers 200; raise TryAgainLater after ``timeout`` seconds
    (counted from the monotonic instant ``since``, by default now; polled at least once).

    A 404 means a daemon without a readiness endpoint (upstream's v4.2 and older): it is
    polled on /healthz instead, at once, as upstream's shim does.
    """
    deadline = (time.monotonic() if since is None else since) + timeout
    last = "no answer"
    pause = READY_POLL_FIRST
    endpoint = api.READY_ENDPOINT
    while True:
        try:
            response = api.http_request(sock, "GET", endpoint, timeout=5.0)
            if response.status == 200:
                return
            if response.status == 404 and endpoint == api.READY_ENDPOINT:
                endpoint = api.HEALTH_ENDPOINT
                continue
            last = f"{endpoint} answered {response.status} (multusd is stopping or starting)"
        except OSError as exc:
            last = f"{exc.strerror or exc}"
            hint = unreachable_hint(exc)
        else:
            hint = unreachable_hint(None)
        if time.monotonic() >= deadline:
            raise wire.errors().TryAgainLater(
                f"timed out after {timeout:.0f}s waiting for multusd on {sock}: {last}; {hint}")
        time.sleep(pause)
        pause = min(pause * 2, READY_POLL_INTERVAL)


def check_alive(sock: str, timeout: float = 5.0, not_ready: bool = False) -> None:
    """One /healthz probe (DEL must not wait for readiness: the daemon may be draining).

    :param not_ready: STATUS's probe: no answer is CNI error 50 ("not available"), not 11.
    """
    try:
        api.http_request(sock, "GET", api.HEALTH_ENDPOINT, timeout=timeout)
    except OSError as exc:
        errors = wire.errors()
        raise (errors.NotReady if not_ready else errors.TryAgainLater)(
            f"multusd is not reachable on {sock}: {exc.strerror or exc}; "
            f"{unreachable_hint(exc)}") from None


def unreachable_hint(exc: "OSError | None") -> str:
    """What to do when the socket does not answer; the exact fix when its file is gone."""
    if isinstance(exc, FileNotFoundError):
        # systemd still holds the socket, but its file was deleted (upstream's multus-daemon
        # empties its socket directory when it starts): only a restart of the unit binds anew
        return ("the socket file is gone (another Multus daemon may have emptied its "
                "directory); recreate it: `systemctl restart multusd.socket`")
    return "check `systemctl status multusd.socket multusd`"


def post_cni(sock: str, env: "dict[str, str]", stdin: bytes,
             timeout: "float | None" = None, not_ready: bool = False,
             daemon: "DaemonFile | None" = None) -> bytes:
    """POST the call to /cni; return the body of a 200, raise the daemon's CNI error otherwise.

    :param timeout: seconds the whole call may take; by default the daemon's requestTimeout
        (:data:`REQUEST_TIMEOUT`, or the longer one of ``daemon``, daemon-config.json) plus
        :data:`ANSWER_MARGIN`.
    :param not_ready: STATUS: no answer is CNI error 50 ("not available"), not 11.
    """
    started = time.monotonic()
    waited_for = [REQUEST_TIMEOUT if timeout is None else None]

    def longer() -> float:  # the default has passed: does the daemon take longer?
        configured = (daemon or DaemonFile()).request_timeout()
        if configured is None or configured <= REQUEST_TIMEOUT:
            return 0.0
        waited_for[0] = configured
        return configured - REQUEST_TIMEOUT

    try:
        response = api.http_request(
            sock, "POST", api.CNI_ENDPOINT, api.encode_request(env, stdin),
            timeout=REQUEST_TIMEOUT + ANSWER_MARGIN if timeout is None else timeout,
            extend=longer if timeout is None else None)
    except OSError as exc:
        errors = wire.errors()
        failure = errors.NotReady if not_ready else errors.TryAgainLater
        if isinstance(exc, api.Timeout):
            raise failure(no_answer_message(sock, env.get("CNI_COMMAND", ""),
                                            time.monotonic() - started, waited_for[0])) from None
        raise failure(f"failed to send CNI request to multusd on {sock}: "
                      f"{exc.strerror or exc}") from None
    if response.status == 200:
        return response.body
    try:
        error = go_loads(response.body)
    except ValueError:
        error = None
    if isinstance(error, dict) and error.get("msg"):
        failure = wire.errors().ForwardedError(error)
    else:
        text = response.body.decode("utf-8", "replace").strip()
        failure = wire.errors().MultusError(
            f"CNI request failed with status {response.status}: '{text}'")
    if response.status == api.NOT_STARTED:
        raise NotStarted(failure)
    raise failure


class NotStarted(Exception):
    """The daemon answered 503 (:data:`~multusd.wire.api.NOT_STARTED`): it did not start the
    request, which may be sent again; :attr:`error` is its CNI error, for when it is not."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def post_when_ready(conf: ShimConfig, sock: str, env: "dict[str, str]", stdin: bytes,
                    timeout: float = READY_TIMEOUT, daemon: "DaemonFile | None" = None
                    ) -> bytes:
    """ADD, CHECK, GC: wait for ``/readyz``, then :func:`post_cni` (``daemon``: its
    daemon-config.json); a request the daemon did not start (503: it is stopping) is sent
    again once a daemon is ready, while ``timeout`` seconds from the first wait (the readiness
    wait's own bound) have not passed."""
    started = time.monotonic()
    while True:
        wait_ready(sock, timeout, since=started)
        try:
            return post_cni(sock, env, stdin, daemon=daemon)
        except NotStarted as refusal:
            if time.monotonic() - started >= timeout:
                raise refusal.error from None
            conf.log("verbose", f"{env.get('CNI_COMMAND', '')} (shim): multusd did not start "
                                f"it ({refusal}); sending it again once multusd is ready")


def no_answer_message(sock: str, command: str, waited: float,
                      request_timeout: "float | None") -> str:
    """The msg of a call the daemon did not answer in time: which socket, how long, what next."""
    why = (f" (its requestTimeout, {request_timeout:g}s, and a margin of {ANSWER_MARGIN:g}s)"
           if request_timeout is not None else "")
    span = f"{waited:.0f}s" if waited >= 10 else f"{waited:.1f}s"
    return (f"multusd did not answer the {command or 'CNI'} request on {sock} within "
            f"{span}{why}: it is stuck or overloaded; check `systemctl status "
            "multusd.socket multusd` and `journalctl -u multusd` for that request (it may "
            "still finish there); the runtime retries")


def add_result(body: bytes, cni_version: str) -> dict:
    """The ADD result from the daemon's ``{"Result": ...}``, converted to the config's version."""
    try:
        result = go_field(go_loads(body), "Result", nil=True) if body else None
    except ValueError:
        raise wire.errors().DecodeFailure(f"failed to decode the result from multusd: {body[:200]!r}") from None
    if not isinstance(result, dict):
        raise wire.errors().DecodeFailure("multusd answered ADD without a result")
    if cni_version and cni_version != result.get("cniVersion"):
        try:
            result = convert(result, cni_version)
        except ResultError as exc:
            raise wire.errors().from_exception(exc) from None
    return result


def run(env: "dict[str, str]", stdin: bytes) -> "tuple[int, dict | None]":
    """Carry out one CNI call; return (exit code, JSON to print or None)."""
    command = env.get("CNI_COMMAND", "")
    config_version = ""
    conf = None
    daemon = DaemonFile()  # read only if needed, once
    try:
        if command == "VERSION":
            return 0, version_info(stdin)
        if not command:
            raise wire.errors().InvalidEnvironment("CNI_COMMAND is not set: multus-shim is a CNI plugin "
                                     "run by the container runtime")
        conf = parse_config(stdin)
        config_version = conf.cni_version
        check_command_allowed(command, config_version)
        sock = api.socket_path(conf.socket_dir)
        if command == "STATUS":
            # STATUS answers now, never after a wait for /readyz: "not ready" (code 50) comes
            # from the daemon, or from here when the daemon does not answer at all
            check_alive(sock, STATUS_PROBE_TIMEOUT, not_ready=True)
        elif command == "DEL":
            check_alive(sock)  # DEL must proceed while the daemon drains
        if command in ("STATUS", "DEL"):
            body = post_cni(sock, env, stdin,
                            timeout=STATUS_TIMEOUT if command == "STATUS" else None,
                            not_ready=command == "STATUS", daemon=daemon)
        else:
            body = post_when_ready(conf, sock, env, stdin, daemon=daemon)
        conf.log("verbose", f"{command} (shim): done for {env.get('CNI_CONTAINERID', '')}")
        if command == "ADD":
            return 0, add_result(body, conf.cni_version)
        return 0, None
    except BaseException as exc:  # noqa: B902 - the runtime gets a CNI error, never a traceback
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise
        errors = wire.errors()
        if isinstance(exc, NotStarted):  # a DEL or STATUS is not sent again
            exc = exc.error
        if not isinstance(exc, errors.MultusError):
            exc = errors.MultusError(f"multus-shim failed unexpectedly: {type(exc).__name__}: "
                                     f"{exc!s:.500}")
        elif conf is not None:
            conf.log("error", f"{command} (shim): {exc.msg}")
        if command == "DEL" and conf is not None and \
                del_window_passed(conf, env, stdin, exc.msg, daemon):
            return 0, None
        return 1, exc.to_cni_error(config_version or errors.DEFAULT_CNI_VERSION)


def del_window_passed(conf: ShimConfig, env: "dict[str, str]", stdin: bytes, error: str,
                      daemon: "DaemonFile | None" = None) -> bool:
    """Mark the sandbox whose DEL failed (beside the records of the daemon that ``daemon``,
    daemon-config.json, configures); True once its window is over (answer success)."""
    from multusd.wire import delwindow

    def say(message: str) -> None:
        conf.warn(message)
        delwindow.to_syslog(message)

    mark = delwindow.note_failure(conf.raw, env, stdin, error, socket_dir=conf.socket_dir,
                                  warn=say, daemon=(daemon or DaemonFile()).doc())
    if mark is None or not delwindow.expired(mark):
        return False
    say(delwindow.give_up_message(mark))
    return True


def version_info(stdin: bytes) -> dict:
    try:
        requested = go_field(go_loads(stdin), "cniVersion") if stdin.strip() else None
    except ValueError:
        requested = None
    if not isinstance(requested, str) or not requested:
        requested = CURRENT_VERSION
    return {"cniVersion": requested, "supportedVersions": list(SUPPORTED_VERSIONS)}


def environment() -> "dict[str, str]":
    """The process environment, decoded as ``os.environ`` decodes it."""
    encoding = sys.getfilesystemencoding()
    return {key.decode(encoding, "surrogateescape"): value.decode(encoding, "surrogateescape")
            for key, value in posix.environ.items()}


def main(argv: "list[str] | None" = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-version", "--version", "-v"):
        print(f"multus-shim: version:{__version__}(multusd)")
        return 0
    try:
        stdin = sys.stdin.buffer.read(MAX_STDIN + 1)
        code, output = run(environment(), stdin)
        text = ascii_json(output) + "\n" if output is not None else ""
    except Exception as exc:  # noqa: B902 - last line of defence: still a CNI error
        code, text = 1, ascii_json(wire.errors().MultusError(
            f"multus-shim failed unexpectedly: {type(exc).__name__}: {exc!s:.500}")
            .to_cni_error()) + "\n"
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
