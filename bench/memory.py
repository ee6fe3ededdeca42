"""Process memory from /proc: RSS now and at its peak, PSS, the process tree, a peak sampler.

The sampler follows a daemon and its tree (plugins, shims) during a burst (bench/burst.py).
"""

from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional, Sequence

SAMPLE_INTERVAL = 0.2
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> Optional[float]:
    """VmRSS of a process in MB (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE // 1024
    except (OSError, IndexError, ValueError):
        return 0


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (the interpreter, a Go binary's text) divided
    among the processes that map them, so that a sum over processes means something."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return 0


def peak_rss_mb(pid: int) -> Optional[float]:
    """VmHWM: the process's own peak resident set since it started."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def children_by_parent() -> Dict[int, List[int]]:
    tree: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(name))
    return tree


class Sampler(threading.Thread):
    """Samples the memory of the daemon (RSS) and of its tree with the shims (PSS: the
    daemon, its plugins, this process's other children and theirs) until :meth:`stop`."""

    def __init__(self, daemon_pid: int, other_daemons: Sequence[int]) -> None:
        super().__init__(name="burst-sampler", daemon=True)
        self.daemon_pid = daemon_pid
        self.skip = set(other_daemons) | {daemon_pid}
        self.peak_tree_kb = 0
        self.peak_daemon_kb = 0
        self._done = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        while not self._done.wait(SAMPLE_INTERVAL):
            tree = children_by_parent()
            roots = [self.daemon_pid] + [p for p in tree.get(me, []) if p not in self.skip]
            total, stack = 0, list(roots)
            while stack:
                pid = stack.pop()
                total += pss_kb(pid)
                stack.extend(tree.get(pid, []))
            self.peak_tree_kb = max(self.peak_tree_kb, total)
            self.peak_daemon_kb = max(self.peak_daemon_kb, rss_kb(self.daemon_pid))

    def stop(self) -> None:
        self._done.set()
        self.join(10)
