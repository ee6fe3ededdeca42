"""The benchmarks' figures: percentiles, timers, CPU of a process, the machine, the log line.

The lowest module of bench/: the standard library only, imported by every benchmark.
"""

from __future__ import annotations

import math
import os
import platform
import resource
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


def percentiles(samples: Sequence[float]) -> Dict[str, Any]:
    """p50/p95/p99 (nearest rank), mean, min, max and n of millisecond samples."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 1)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99),
            "mean": round(sum(ordered) / len(ordered), 1), "min": round(ordered[0], 1),
            "max": round(ordered[-1], 1), "n": len(ordered)}


def timed(call: Callable[[], Any]) -> tuple:
    """(milliseconds, return value) of one call."""
    started = time.perf_counter()
    value = call()
    return (time.perf_counter() - started) * 1000, value


class CpuMeter:
    """CPU time (ms) spent between construction and :meth:`per_pod`, by whom.

    daemon: multusd's own threads; plugins: its waited-for children (the CNI plugins);
    shims: this process's waited-for children (the shim processes, and nothing else runs
    while a phase is measured); bench: this process (in Kubernetes mode the fake API server).
    """

    TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self._sample()

    def _sample(self) -> Dict[str, float]:
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # fields from #3 (state) on
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {"daemon": (int(fields[11]) + int(fields[12])) * self.TICK_MS,
                "plugins": (int(fields[13]) + int(fields[14])) * self.TICK_MS,
                "shims": (children.ru_utime + children.ru_stime) * 1000,
                "bench": (own.ru_utime + own.ru_stime) * 1000}

    def per_pod(self, pods: int) -> Dict[str, float]:
        end = self._sample()
        return {key: round((end[key] - self.start[key]) / max(pods, 1), 1) for key in end}


def machine() -> Dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": load_average()}


def load_average() -> List[float]:
    """1/5/15-minute load: other work on the machine inflates every figure."""
    return [round(x, 2) for x in os.getloadavg()]


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM (or Ctrl-C) asked the benchmark to stop: clean up and exit."""



def median(values: List[float]) -> Optional[float]:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None
