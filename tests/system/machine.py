"""A booted Debian systemd in systemd-nspawn, for the package tests.

The container runs on a fresh copy of the cached root (debroot.py), with a private network: its
units hold CAP_NET_ADMIN and make bridges, veths and network namespaces without touching the
host's. No machined runs on the host, so commands go in with ``nsenter`` on the container's PID 1.
Files are passed by writing into the root directory from the host.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from typing import List, Optional

LOG = logging.getLogger(__name__)

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
# Inside the container systemd may not lower a unit's OOM score below where the container
# starts (that needs CAP_SYS_RESOURCE, which nspawn drops), so where the host may, start it low
# enough for multusd.service's OOMScoreAdjust=-900 to take effect and be checked.
OOM_SCORE_FLOOR = -950
# What `systemctl is-system-running` prints while PID 1 is still setting itself up.
BOOTING_ANSWERS = ("", "offline", "unknown")


class MachineError(AssertionError):
    """A command inside the container failed or the container did not boot."""


class Machine:
    """One booted container: ``start()`` boots it, ``stop()`` powers it off, deletes its files."""

    def __init__(self, root_tarball: str, workdir: str, suite: str = "bookworm") -> None:
        self.root_tarball = root_tarball
        self.suite = suite  # the Debian release of the root
        self.workdir = workdir
        self.root = os.path.join(workdir, "root")
        self.console_log = os.path.join(workdir, "console.log")
        self.nspawn: Optional[subprocess.Popen] = None
        self.leader: Optional[int] = None
        # True when units inside can lower their OOM score (see OOM_SCORE_FLOOR).
        self.oom_adjustable = _can_lower_oom_score()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        os.makedirs(self.root)
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", self.root, "-xf",
                        self.root_tarball], check=True)
        with open(self.console_log, "wb") as console:
            self.nspawn = subprocess.Popen(
                ["systemd-nspawn", "-b", "--register=no", "--keep-unit", "--private-network",
                 "--quiet", *self._oom_args(), "-D", self.root],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.leader = self._wait_for_leader()
        state = self._wait_for_boot()
        if state not in ("running", "degraded"):
            raise MachineError(f"container did not boot (state {state!r}); console:\n"
                               f"{self.console_tail()}")

    def _oom_args(self) -> List[str]:
        return [f"--oom-score-adjust={OOM_SCORE_FLOOR}"] if self.oom_adjustable else []

    def _wait_for_leader(self) -> int:
        """The container's PID 1: the child of nspawn that runs systemd in a new PID namespace."""
        assert self.nspawn is not None
        my_pidns = os.readlink("/proc/self/ns/pid")
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise MachineError(f"systemd-nspawn exited with {self.nspawn.returncode}; "
                                   f"console:\n{self.console_tail()}")
            for pid in _children_of(self.nspawn.pid):
                try:
                    comm = open(f"/proc/{pid}/comm").read().strip()
                    pidns = os.readlink(f"/proc/{pid}/ns/pid")
                except OSError:
                    continue
                if comm == "systemd" and pidns != my_pidns:
                    return pid
            time.sleep(0.05)
        raise MachineError(f"no systemd in the container after {BOOT_TIMEOUT}s; console:\n"
                           f"{self.console_tail()}")

    def _wait_for_boot(self) -> str:
        """The system state once boot is over ("running", "degraded", ...)."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            # Until PID 1 has made /run/systemd/system, systemctl answers "offline"; until the
            # manager listens, it prints nothing or "unknown". Each is "not yet": ask again.
            state = self.run("systemctl", "is-system-running", "--wait", check=False,
                             timeout=BOOT_TIMEOUT).stdout.strip()
            if state not in BOOTING_ANSWERS or time.monotonic() > deadline:
                return state
            if self.nspawn is not None and self.nspawn.poll() is not None:
                return state
            time.sleep(0.1)

    def stop(self) -> None:
        """Power off, wait for nspawn to exit (kill it if it does not), delete the root."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            if self.leader is not None:
                self.run("systemctl", "poweroff", "--no-block", check=False, timeout=30)
            try:
                self.nspawn.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                # Killing the namespace's init kills every process in the container.
                LOG.warning("container did not power off in %ss; killing it", STOP_TIMEOUT)
                if self.leader is not None:
                    _kill(self.leader)
                _kill(self.nspawn.pid)
                self.nspawn.wait(timeout=STOP_TIMEOUT)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def console_tail(self, size: int = 4000) -> str:
        try:
            with open(self.console_log, "rb") as f:
                return f.read()[-size:].decode(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------------ commands
    def argv(self, *argv: str) -> List[str]:
        """``argv`` wrapped to run inside the container, with a clean environment."""
        assert self.leader is not None, "container not started"
        return ["nsenter", "-a", "-t", str(self.leader), "--", "/usr/bin/env", "-i",
                f"PATH={CONTAINER_PATH}", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive",
                *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 120,
            input: Optional[str] = None, env: Optional[dict] = None
            ) -> subprocess.CompletedProcess:
        """Run a command inside the container; raise MachineError on failure if ``check``."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        full = self.argv(*(["/usr/bin/env"] + extra if extra else []), *argv)
        done = subprocess.run(full, capture_output=True, text=True, timeout=timeout,
                              input=input)
        if check and done.returncode != 0:
            raise MachineError(f"{' '.join(argv)!r} failed in the container "
                               f"(exit {done.returncode}):\nstdout: {done.stdout}\n"
                               f"stderr: {done.stderr}")
        return done

    def sh(self, script: str, check: bool = True, timeout: float = 120
           ) -> subprocess.CompletedProcess:
        return self.run("/bin/sh", "-c", script, check=check, timeout=timeout)

    def path(self, inside: str) -> str:
        """The host path of a file inside the container's root."""
        return os.path.join(self.root, inside.lstrip("/"))

    def put(self, inside: str, content: str, mode: int = 0o644) -> None:
        host = self.path(inside)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        with open(host, "w") as f:
            f.write(content)
        os.chmod(host, mode)

    def copy_in(self, host_file: str, inside: str) -> None:
        host = self.path(inside)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        shutil.copy(host_file, host)


def _can_lower_oom_score() -> bool:
    """Whether this host lets us lower an OOM score (CAP_SYS_RESOURCE); tried on a child."""
    probe = subprocess.run(["sh", "-c", f"echo {OOM_SCORE_FLOOR} > /proc/self/oom_score_adj"],
                           capture_output=True)
    return probe.returncode == 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _children_of(pid: int) -> List[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children
