"""Shared test fixtures: real network namespaces, the real plugin directory, markers.

Tests marked ``privileged`` need root; ``cni_plugins`` need Debian's containernetworking
plugins in /usr/lib/cni. Both skip with a reason when the machine cannot run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from typing import Callable, Iterator

import pytest

PLUGIN_DIR = "/usr/lib/cni"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    not_root = os.geteuid() != 0
    no_plugins = not os.path.exists(os.path.join(PLUGIN_DIR, "bridge"))
    for item in items:
        if not_root and ("privileged" in item.keywords or "cni_plugins" in item.keywords):
            item.add_marker(pytest.mark.skip(reason="needs root for network namespaces"))
        elif no_plugins and "cni_plugins" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"no CNI plugins in {PLUGIN_DIR}"))


def wait_for(condition: Callable[[], object], timeout: float = 10.0,
             interval: float = 0.01, what: str = "condition") -> object:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    """A short unique name (fits the 15-character interface name limit for short prefixes)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


@pytest.fixture
def plugin_dir() -> str:
    return PLUGIN_DIR


@pytest.fixture
def make_netns() -> Iterator[Callable[[], str]]:
    """Factory of real network namespaces (``ip netns add``); returns the netns path.

    Every namespace it made is deleted at teardown.
    """
    made: list[str] = []

    def make() -> str:
        name = unique("mdt-")
        run("ip", "netns", "add", name)
        made.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        return f"/var/run/netns/{name}"

    yield make
    for name in made:
        run("ip", "netns", "del", name, check=False)


@pytest.fixture
def netns(make_netns) -> str:
    """One real network namespace, as a path (what CNI_NETNS carries)."""
    return make_netns()


@pytest.fixture
def bridge_name() -> Iterator[str]:
    """A unique host bridge name; the bridge (if a plugin made it) is deleted at teardown."""
    name = unique("mdbr")
    yield name
    run("ip", "link", "del", name, check=False)


@pytest.fixture
def cni_state(tmp_path) -> Iterator[dict]:
    """Private state directories: cache dir and host-local's data dir, removed afterwards."""
    state = {
        "cache_dir": str(tmp_path / "cache"),
        "ipam_dir": str(tmp_path / "ipam"),
    }
    yield state
    shutil.rmtree(str(tmp_path), ignore_errors=True)


def netns_links(netns_path: str) -> dict:
    """Interfaces inside a namespace: name -> list of 'addr/prefix' strings (via ip -j)."""
    import json

    name = os.path.basename(netns_path)
    out = run("ip", "-n", name, "-j", "addr", "show").stdout
    return {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
            for link in json.loads(out)}


def netns_routes(netns_path: str, family: str = "-4") -> list:
    import json

    name = os.path.basename(netns_path)
    return json.loads(run("ip", family, "-n", name, "-j", "route", "show").stdout)
