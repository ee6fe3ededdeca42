"""``multusd socket-check [--repair | --remove-dead]``: whose socket the shim's path is now.

systemd binds ``/run/multus/multus.sock`` once, when ``multusd.socket`` starts. Another Multus
daemon started later (upstream's ``multus-daemon`` empties its socket directory and binds its
own socket there) leaves ``multusd.socket`` "listening" on a file that no longer exists, and
a daemon killed without cleaning up leaves a file nobody listens on. This tells those cases
apart without sending a request: it connects, asks the kernel who made the listening socket
(``SO_PEERCRED``: systemd, PID 1, for multusd.socket) and closes.

* ``--repair`` (``multusd-socket-guard.service``, started by its path unit on any change of
  the file): a missing or dead file while ``multusd.socket`` is active -> restart the socket
  unit, which makes the file again; another daemon's socket -> change nothing, say so and how
  to hand the node over or take it back.
* ``--remove-dead`` (package removal, after the socket unit stopped): delete the file only if
  it is a socket nobody listens on (``RemoveOnStop=no``: systemd would unlink the path whoever's
  socket it is by then).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from typing import Optional, Tuple

from multusd.config import daemonconf
from multusd.errors import ConfigError
from multusd.tools import common

LOG = logging.getLogger("multusd.socket-check")

SYSTEMD, MULTUSD, FOREIGN, DEAD, MISSING, NOT_A_SOCKET = (
    "systemd", "multusd", "foreign", "dead", "missing", "not-a-socket")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SYSTEMCTL_TIMEOUT = 120.0


class Probe:
    """What is at the socket path: one of the states above, and the listener if any."""

    def __init__(self, path: str, state: str, pid: int = 0, command: str = "",
                 error: str = "") -> None:
        self.path = path
        self.state = state
        self.pid = pid
        self.command = command
        self.error = error

    def describe(self) -> str:
        if self.state == SYSTEMD:
            return f"{self.path}: multusd.socket's (held by systemd)"
        if self.state == MULTUSD:
            return f"{self.path}: bound by multusd itself (pid {self.pid}, not socket-activated)"
        if self.state == FOREIGN:
            return (f"{self.path}: bound by another process, pid {self.pid} "
                    f"({self.command or 'unknown command'})")
        if self.state == DEAD:
            return f"{self.path}: a socket file nobody listens on ({self.error})"
        if self.state == NOT_A_SOCKET:
            return f"{self.path}: not a socket"
        return f"{self.path}: no such file"


def probe(path: str) -> Probe:
    """Connect to ``path`` (no request is sent) and tell whose listening socket it is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return Probe(path, MISSING)
    except OSError as exc:
        return Probe(path, DEAD, error=exc.strerror or str(exc))
    if not stat.S_ISSOCK(mode):
        return Probe(path, NOT_A_SOCKET)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        try:
            conn.connect(path)
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return Probe(path, DEAD, error=exc.strerror or str(exc))
            raise
        pid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               _PEERCRED.size))[0]
    command, name = _command_of(pid)
    if pid == 1 or name == "systemd":
        return Probe(path, SYSTEMD, pid, command)
    if "multusd" in command:
        return Probe(path, MULTUSD, pid, command)
    return Probe(path, FOREIGN, pid, command)


def run(config_path: str, *, repair: bool = False, remove_dead: bool = False) -> int:
    path = socket_path(config_path)
    try:
        found = probe(path)
    except OSError as exc:
        print(f"multusd socket-check: cannot connect to {path}: {exc.strerror or exc}",
              file=sys.stderr)
        return common.EXIT_PROBLEM
    if remove_dead:
        return _remove_dead(found)
    if repair:
        return _repair(found)
    print(found.describe())
    return common.EXIT_OK if found.state in (SYSTEMD, MULTUSD) else common.EXIT_PROBLEM


def socket_path(config_path: str) -> str:
    """The daemon's socket path; the default one when the config cannot be read (removal)."""
    try:
        return daemonconf.load(config_path).socket_path
    except ConfigError:
        return daemonconf.DaemonConfig(path=config_path, raw={}).socket_path


def _repair(found: Probe) -> int:
    if found.state in (SYSTEMD, MULTUSD):
        print(f"{found.describe()}: nothing to do")
        return common.EXIT_OK
    active, _ = _systemctl("is-active", common.SOCKET_UNIT)
    if not active:
        print(f"{found.describe()}; {common.SOCKET_UNIT} is not active: nothing to restore")
        return common.EXIT_OK
    if found.state in (FOREIGN, NOT_A_SOCKET):
        print(f"multusd socket-check: {found.describe()}. {common.SOCKET_UNIT} still listens, "
              "on a file that is gone, so no shim reaches multusd. To hand this node to the "
              f"other daemon: `systemctl disable --now {common.SOCKET_UNIT}`; to keep multusd: "
              f"stop the other daemon, then `systemctl restart {common.SOCKET_UNIT}`",
              file=sys.stderr)
        return common.EXIT_OK
    print(f"{found.describe()}: restarting {common.SOCKET_UNIT} to make it again",
          file=sys.stderr)
    ok, output = _systemctl("restart", common.SOCKET_UNIT)
    after = probe(found.path)
    if not ok or after.state != SYSTEMD:
        print(f"multusd socket-check: restarting {common.SOCKET_UNIT} did not bring "
              f"{found.path} back ({output.strip() or after.describe()}); see "
              f"`systemctl status {common.SOCKET_UNIT}`", file=sys.stderr)
        return common.EXIT_PROBLEM
    print(f"{found.path} is back: {after.describe()}")
    return common.EXIT_OK


def _remove_dead(found: Probe) -> int:
    if found.state == MISSING:
        return common.EXIT_OK
    if found.state != DEAD:
        print(f"multusd: leaving {found.describe()}", file=sys.stderr)
        return common.EXIT_OK
    try:
        os.unlink(found.path)
        os.rmdir(os.path.dirname(found.path))  # only when empty
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            print(f"multusd: cannot remove {found.path}: {exc.strerror}", file=sys.stderr)
            return common.EXIT_PROBLEM
    return common.EXIT_OK


def _systemctl(*args: str) -> Tuple[bool, str]:
    try:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True,
                              timeout=_SYSTEMCTL_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    return done.returncode == 0, done.stdout + done.stderr


EXEC_WAIT = 1.0  # how long a socket's holder may show no command line: it is in execve


def _command_of(pid: int) -> Tuple[str, str]:
    """``(command line, comm)`` of a process; empty strings when it cannot be read. A holder
    that shows no command line is between two programs (systemd-socket-activate execs the
    daemon when the first connection, maybe the probe's own, arrives): read again until it
    shows one, for at most :data:`EXEC_WAIT`."""
    command: Optional[str] = None
    name = ""
    deadline = time.monotonic() + EXEC_WAIT
    try:
        while True:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if command or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        with open(f"/proc/{pid}/comm") as handle:
            name = handle.read().strip()
    except OSError:
        pass
    return command or "", name
