"""systemd integration: inherited listening sockets, sd_notify, the journal handler.

The only module (with log.py) that imports systemd-python. Everything here is a no-op
outside systemd, so the daemon runs the same by hand or under ``systemd-socket-activate``.
"""

from __future__ import annotations

import logging
import os
import socket

LOG = logging.getLogger(__name__)


def inherited_unix_listener() -> socket.socket | None:
    """The listening unix socket systemd passed us (LISTEN_FDS), or None when started by hand."""
    from systemd import daemon

    for fd in daemon.listen_fds(unset_environment=True):
        if daemon.is_socket_unix(fd, socket.SOCK_STREAM, 1):
            return socket.socket(fileno=fd)
        LOG.warning("ignoring inherited fd %d: not a listening unix stream socket", fd)
    return None


def notify(state: str) -> None:
    """sd_notify(state) when NOTIFY_SOCKET is set; silently nothing otherwise."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    from systemd import daemon

    daemon.notify(state)


def watchdog_interval() -> float | None:
    """Half of WatchdogSec when the watchdog is on for this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None


def journal_handler() -> logging.Handler | None:
    """A JournalHandler tagged multusd when the journal socket exists, else None."""
    if not os.path.exists("/run/systemd/journal/socket"):
        return None
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        return None
    return JournalHandler(SYSLOG_IDENTIFIER="multusd")


def stderr_is_journal() -> bool:
    """True when stderr is already connected to the journal (JOURNAL_STREAM matches)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"
