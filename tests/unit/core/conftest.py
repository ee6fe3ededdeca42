"""Fixtures of core/'s unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def conf_dir(tmp_path) -> str:
    """A confDir for the test's conf files (made when the first file is written)."""
    return str(tmp_path / "multus.d")
