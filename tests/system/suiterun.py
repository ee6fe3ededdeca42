#!/usr/bin/python3
"""Run pytest on this checkout inside a Debian root, on that release's own python3 and packages.

Usage: tests/system/suiterun.py SUITE [PYTEST_ARGS...]   (as root, from any directory)

``make test`` runs the unit and integration suites this way on Debian 13 ("trixie": python
3.13, python3-kubernetes 30.1, python3-pyroute2 0.7, python3-prometheus-client 0.21, systemd
257), besides on the host's Debian 12. The root is the one the booted package tests use
(tests/system/debroot.py builds and caches it), unpacked afresh; the checkout is bound into it
read-only at /src and pytest runs there in systemd-nspawn with a private network (the bridges,
veths and namespaces the tests make never touch the host's), not booted: the tests start what
they need themselves (the daemon under systemd-socket-activate). Exits with pytest's status;
0 with a message on stderr, having run nothing, when the archive cannot be reached to build a
missing root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import debroot  # noqa: E402

INSIDE = "/src"
SCRATCH = "/var/tmp"  # on disk: the unpacked root is ~1 GB, more than a tmpfs may hold


def nspawn_argv(root: str, pytest_args: List[str]) -> List[str]:
    """systemd-nspawn running pytest at /src in ``root``, not booted."""
    return ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--private-network",
            # a stub init as PID 1 reaps what the tests' processes leave; pytest is PID 2
            "--as-pid2", "--console=pipe", f"--machine=multusd-suite-{os.getpid()}",
            "-D", root, f"--bind-ro={REPO}:{INSIDE}", f"--chdir={INSIDE}",
            "-E", "LANG=C.UTF-8", "-E", "PYTHONDONTWRITEBYTECODE=1",
            "python3", "-m", "pytest", "-p", "no:cacheprovider", *pytest_args]


def run(suite: str, pytest_args: List[str]) -> int:
    name = debroot.VERSIONS.get(suite, suite)
    try:
        tarball = debroot.ensure_root_tarball(suite)
    except debroot.ArchiveUnreachable as exc:
        print(f"suiterun: SKIPPED the tests on {name} ({suite}): {exc}", file=sys.stderr)
        return 0
    work = tempfile.mkdtemp(prefix=f"multusd-suite-{suite}-", dir=SCRATCH)
    try:
        root = os.path.join(work, "root")
        os.makedirs(root)
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-xf", tarball],
                       check=True)
        # the checkout importable by the root's python3 as the host's `pip install -e .` makes
        # it for .venv: by every process the tests start, with whatever environment
        with open(os.path.join(root, "usr/lib/python3/dist-packages/multusd-checkout.pth"),
                  "w") as handle:
            handle.write(INSIDE + "\n")
        python = subprocess.run(["chroot", root, "python3", "--version"], capture_output=True,
                                text=True).stdout.strip()
        print(f"suiterun: pytest on {name} ({suite}), {python}: {' '.join(pytest_args)}",
              flush=True)
        return subprocess.run(nspawn_argv(root, pytest_args), stdin=subprocess.DEVNULL
                              ).returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: List[str]) -> int:
    if not argv or argv[0] not in debroot.SUITES:
        print(f"usage: suiterun.py {{{','.join(debroot.SUITES)}}} [PYTEST_ARGS...]",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("suiterun: needs root (systemd-nspawn)", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
