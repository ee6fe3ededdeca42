"""Shared test fixtures: real network namespaces, the real plugin directory, markers.

Tests marked ``privileged`` need root; ``cni_plugins`` need Debian's containernetworking
plugins in /usr/lib/cni. Both skip with a reason when the machine cannot run them.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Iterator

import pytest

from kubeapi import kube_api, make_kube_api  # noqa: F401 - fixtures for every test
from testlib import PLUGIN_DIR, run, unique
from harness import STUBS, Sandbox


@pytest.fixture(scope="session", autouse=True)
def state_directory(tmp_path_factory) -> Iterator[str]:
    """multusd's state directory (what generate-config records it wrote) for every test and
    every process a test starts: a private one, never the host's /var/lib/multusd."""
    path = str(tmp_path_factory.mktemp("multusd-state"))
    before = os.environ.get("STATE_DIRECTORY")
    os.environ["STATE_DIRECTORY"] = path
    yield path
    if before is None:
        os.environ.pop("STATE_DIRECTORY", None)
    else:
        os.environ["STATE_DIRECTORY"] = before


HOST_MARKS = "/var/lib/cni/multus/.multusd-unreleased"


@pytest.fixture(scope="session", autouse=True)
def host_cni_dir_untouched() -> Iterator[None]:
    """A shim whose DEL fails marks the sandbox under the ``cniDir`` of its config, the
    host's /var/lib/cni/multus when it names none: every test's shim config must name one."""
    before = os.path.exists(HOST_MARKS)
    yield
    assert before or not os.path.exists(HOST_MARKS), (
        f"a test's shim marked a failed DEL in the host's {HOST_MARKS}: give its shim config "
        "a \"cniDir\" of the test's own (DaemonProcess.shim_conf() does)")


@pytest.fixture(scope="session", autouse=True)
def kubeconfig_files_removed() -> Iterator[None]:
    """The files every kubeconfig load keeps in the root-only directory of /run (a parsed copy
    per path and content, the ``-data`` certificates and keys) are removed when the tests end:
    the tests' kubeconfigs have a path and content of their own each, and are not the host's."""
    from multusd.kube.kubeconfig import data_dir

    directory = data_dir()
    before = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    yield
    if os.path.isdir(directory):
        for name in set(os.listdir(directory)) - before:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


KUBE_FIXTURES = {"kube_api", "make_kube_api"}


def pytest_collection_modifyitems(config, items):
    not_root = os.geteuid() != 0
    no_plugins = not os.path.exists(os.path.join(PLUGIN_DIR, "bridge"))
    for item in items:
        # every test of the Kubernetes path (the stand-in API server, or kube/'s own unit
        # tests) is marked `kube`: `make test` runs those again on the newest client
        if KUBE_FIXTURES & set(getattr(item, "fixturenames", ())) or \
                os.sep + os.path.join("unit", "kube") + os.sep in str(item.fspath):
            item.add_marker(pytest.mark.kube)
        if not_root and ("privileged" in item.keywords or "cni_plugins" in item.keywords):
            item.add_marker(pytest.mark.skip(reason="needs root for network namespaces"))
        elif no_plugins and "cni_plugins" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"no CNI plugins in {PLUGIN_DIR}"))


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




@pytest.fixture
def sandbox(tmp_path) -> Iterator[Sandbox]:
    """Bridges, namespaces and multusd daemons for one test; all removed at teardown."""
    box = Sandbox(str(tmp_path / "sandbox"))
    yield box
    box.cleanup()


@pytest.fixture
def stub_bin(tmp_path) -> str:
    """A private bin dir holding the stub plugins of tests/stubs, executable."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("stub-record", "stub-error", "stub-exit", "stub-garbage", "stub-hang"):
        shutil.copyfile(os.path.join(STUBS, name), bin_dir / name)
        os.chmod(bin_dir / name, 0o755)
    return str(bin_dir)
