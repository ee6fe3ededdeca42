"""The .rpm's scriptlets in booted Debian 12 and 13 systemd (systemd-nspawn), with Debian's rpm.

One container for the module; the tests run in order on the state the previous one left. The
scriptlets follow the systemd rpm macros: a first install enables what the presets say (the
package's 80-multusd.preset, unless an administrator's preset says otherwise) and starts it, an
upgrade try-restarts the service (never the socket), an erase disables and stops every unit.
``rpm -V`` finds nothing changed after install (the byte-code is in the payload); an erase keeps
the pods' records and leaves no other file of the package. rpm cannot see Debian's python3
packages, which satisfy the dependencies: every install is ``--nodeps``.
"""

from __future__ import annotations

import os
from typing import Iterator, List

import pytest

from machine import Machine
from nodeops import (CONFIG, GENERATED, SOCKET, active_state, configure, netns_addrs, shim,
                     show)
from pkgbuild import build_packages

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

CNI_DIR = "/var/lib/cni/multus"
PRESET = "/usr/lib/systemd/system-preset/80-multusd.preset"
# what 80-multusd.preset enables; multusd.service starts on the first request
PRESET_UNITS = ("multusd.socket", "multusd-socket-guard.path", "multusd-config.path",
                "multusd-config.timer", "multusd-config.service")
TRIGGERS = ("multusd.socket", "multusd-socket-guard.path", "multusd-config.path",
            "multusd-config.timer")
LOCAL_PRESET = "/etc/systemd/system-preset/10-local.preset"


def rpm_options(box: Machine) -> List[str]:
    """Debian 12's rpm installs nothing without --force-debian; Debian 13's has no such option."""
    usage = box.run("rpm", "--help", check=False).stdout
    return ["--nodeps"] + (["--force-debian"] if "--force-debian" in usage else [])


def rpm(box: Machine, *argv: str) -> str:
    done = box.run("rpm", *argv, check=False, timeout=300)
    assert done.returncode == 0, f"rpm {' '.join(argv)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def enabled(box: Machine, unit: str) -> str:
    return box.run("systemctl", "is-enabled", unit, check=False).stdout.strip()


@pytest.fixture(scope="module")
def node(machine: Machine, packages) -> Iterator[Machine]:
    if machine.run("sh", "-c", "command -v rpm", check=False).returncode != 0:
        pytest.skip("no rpm in the container root (tests/system/debroot.py installs it)")
    machine.copy_in(packages["rpm"], "/root/multusd.rpm")
    machine.run("ip", "netns", "add", "pod-r")
    yield machine


def test_1_first_install_enables_and_starts_what_the_preset_says(node, packages):
    box = node
    rpm(box, "-i", *rpm_options(box), "/root/multusd.rpm")
    for unit in PRESET_UNITS:
        assert enabled(box, unit) == "enabled", unit
    for unit in TRIGGERS:
        assert active_state(box, unit) == "active", unit
    assert active_state(box, "multusd.service") == "inactive"
    assert box.run("stat", "-c", "%a %F", SOCKET).stdout.strip() == "600 socket"
    # %posttrans copied the CNI plugins
    for name in ("multus-shim", "passthru"):
        assert box.run("cmp", f"/usr/lib/multusd/bin/{name}", f"/opt/cni/bin/{name}",
                       check=False).returncode == 0, name
    # nothing differs from the payload: modes, digests, the byte-code included
    verify = box.run("rpm", "-V", "--nodeps", "multusd", check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    assert box.run("multusd", "--version").stdout.strip() == f"multusd {packages['version']}"


def test_2_an_upgrade_restarts_the_service_never_the_socket(node, packages, tmp_path):
    box = node
    configure(box)
    added = shim(box, "ADD", "cid-rpm", "pod-r", "/run/netns/pod-r")
    assert added.returncode == 0, added.stdout + added.stderr
    assert active_state(box, "multusd.service") == "active"
    before = {"inode": box.run("stat", "-c", "%i", SOCKET).stdout,
              "since": show(box, "multusd.socket", "ActiveEnterTimestampMonotonic"),
              "pid": show(box, "multusd.service", "MainPID")}
    config = open(box.path(CONFIG)).read()
    newer = build_packages(str(tmp_path), packages["version"] + ".1")
    box.copy_in(newer["rpm"], "/root/multusd-newer.rpm")

    rpm(box, "-U", *rpm_options(box), "/root/multusd-newer.rpm")

    assert box.run("multusd", "--version").stdout.strip() == f"multusd {newer['version']}"
    assert show(box, "multusd.service", "MainPID") not in (before["pid"], "0"), \
        "%postun did not restart the service"
    assert box.run("stat", "-c", "%i", SOCKET).stdout == before["inode"]
    assert show(box, "multusd.socket", "ActiveEnterTimestampMonotonic") == before["since"]
    assert open(box.path(CONFIG)).read() == config, "the edited config was replaced"
    verify = box.run("rpm", "-V", "--nodeps", "--noconfig", "multusd", check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    for unit in PRESET_UNITS:
        assert enabled(box, unit) == "enabled", f"an upgrade changed {unit}"
    box.run("ip", "netns", "add", "pod-r2")
    for command in ("ADD", "DEL"):  # the new daemon serves
        done = shim(box, command, "cid-rpm2", "pod-r2", "/run/netns/pod-r2")
        assert done.returncode == 0, done.stdout + done.stderr


def test_3_erase_disables_and_stops_every_unit_and_keeps_only_the_pods_records(node):
    box = node
    box.sh("mkdir -p -m 0700 /run/multusd-kubeconfig-0 && echo key > /run/multusd-kubeconfig-0/k")

    rpm(box, "-e", "multusd")

    for unit in PRESET_UNITS + ("multusd.service",):
        assert active_state(box, unit) in ("inactive", "unknown"), unit
    wants = box.run("sh", "-c", "ls /etc/systemd/system/*.wants/ 2>/dev/null").stdout
    assert "multusd" not in wants, wants
    assert os.path.exists(box.path(f"{CNI_DIR}/cid-rpm")), "erase deleted a pod's records"
    assert netns_addrs(box, "pod-r").get("eth0"), "erase released a pod"
    for gone in ("/usr/lib/multusd", PRESET, "/opt/cni/bin/multus-shim", "/opt/cni/bin/passthru",
                 GENERATED, SOCKET, "/var/lib/multusd", "/run/multusd-kubeconfig-0"):
        assert not os.path.lexists(box.path(gone)), f"{gone} left behind"
    # the records are upstream's format: a Multus installed next releases the pod from them
    box.run("rm", "-rf", CNI_DIR)


def test_4_an_administrators_preset_installs_it_disabled(node):
    box = node
    box.put(LOCAL_PRESET, "disable multusd*\n")
    try:
        rpm(box, "-i", *rpm_options(box), "/root/multusd.rpm")
        for unit in PRESET_UNITS:
            assert enabled(box, unit) == "disabled", unit
            assert active_state(box, unit) == "inactive", unit
        assert not os.path.exists(box.path(SOCKET))
        rpm(box, "-e", "multusd")
        assert not os.path.lexists(box.path("/usr/lib/multusd"))
    finally:
        box.run("rm", "-f", LOCAL_PRESET)
