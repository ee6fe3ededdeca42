"""The .deb in booted Debian 12 and 13 systemd (systemd-nspawn), with real delegate plugins.

One container for the whole module; the tests run in order, each on the state the previous one
left: install, first request, restart under load, upgrade under load (apt install, then an
unpack under a daemon that has served nothing yet), remove, purge. The newer packages are
tripwired (tests/system/pkgbuild.py): an old daemon that loads one of their modules fails the
request that made it.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import List

import pytest

from pkgbuild import build_packages, tripwired
from testlib import wait_for
from machine import Machine
from nodeops import (CONFIG, EDITED_CONFIG, GENERATED, HERE, PRIMARY, SHIM_CONF, SOCKET, UNITS,
                     WORK, active_state, netns_addrs, shim, shim_env, show)

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]


class Loop:
    """cni_loop.py running inside the container while the host restarts or upgrades things."""

    def __init__(self, box: Machine, name: str) -> None:
        self.box = box
        self.dir = f"{WORK}/{name}"
        box.put(f"{self.dir}/conf.json", json.dumps(SHIM_CONF))
        box.copy_in(os.path.join(HERE, "cni_loop.py"), f"{WORK}/cni_loop.py")
        box.run("ip", "netns", "add", name)
        self.proc = subprocess.Popen(
            box.argv("python3", f"{WORK}/cni_loop.py", f"{self.dir}/conf.json",
                     f"/run/netns/{name}", self.dir, "500"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def calls(self) -> List[dict]:
        try:
            with open(self.box.path(f"{self.dir}/calls.jsonl")) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def wait_for_more(self, count: int, timeout: float = 120) -> None:
        target = len(self.calls()) + count
        wait_for(lambda: len(self.calls()) >= target or self.proc.poll() is not None,
                 timeout, interval=0.05, what=f"{count} more shim calls")
        assert self.proc.poll() is None, f"loop ended early: {self.proc.stdout.read()}"

    def finish(self) -> List[dict]:
        self.box.put(f"{self.dir}/stop", "")
        self.proc.wait(timeout=600)
        return self.calls()


@pytest.fixture(scope="module")
def installed(machine: Machine, packages) -> Machine:
    machine.copy_in(packages["deb"], "/root/" + os.path.basename(packages["deb"]))
    done = machine.run("apt-get", "install", "-y",
                       "/root/" + os.path.basename(packages["deb"]), check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return machine


def test_1_install_leaves_the_socket_listening_and_the_service_idle(installed, packages):
    box = installed
    assert box.run("dpkg-query", "-W", "-f=${Status} ${Version}", "multusd").stdout == \
        f"install ok installed {packages['version']}-1"
    assert active_state(box, "multusd.socket") == "active"
    assert active_state(box, "multusd-config.path") == "active"
    assert active_state(box, "multusd-config.timer") == "active"
    assert active_state(box, "multusd.service") == "inactive"
    assert active_state(box, "multusd-socket-guard.path") == "active"
    for unit in ("multusd.socket", "multusd-socket-guard.path", "multusd-config.path",
                 "multusd-config.timer", "multusd-config.service"):
        assert box.run("systemctl", "is-enabled", unit).stdout.strip() == "enabled"
    # the CNI plugins are copies in /opt/cni/bin, made by postinst (not files dpkg owns)
    for name in ("multus-shim", "passthru"):
        assert box.run("cmp", f"/usr/lib/multusd/bin/{name}", f"/opt/cni/bin/{name}",
                       check=False).returncode == 0, name
        assert box.run("stat", "-c", "%a", f"/opt/cni/bin/{name}").stdout.strip() == "755"
    assert box.run("dpkg", "-S", "/opt/cni/bin/multus-shim", check=False).returncode != 0
    assert box.run("stat", "-c", "%a %F", SOCKET).stdout.strip() == "600 socket"
    assert box.run("stat", "-c", "%a", os.path.dirname(SOCKET)).stdout.strip() == "700"
    verify = box.run("systemd-analyze", "verify", "--man=no",
                     *(f"/usr/lib/systemd/system/{unit}" for unit in UNITS), check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    assert box.run("multusd", "--version").stdout.strip() == f"multusd {packages['version']}"
    # byte-compiled on the target by postinst's py3compile (not shipped), for its python3
    tag = box.run("python3", "-c", "import sys; print(sys.implementation.cache_tag)").stdout
    assert f"__main__.{tag.strip()}.pyc" in \
        os.listdir(box.path("/usr/lib/multusd/multusd/__pycache__"))
    # nothing differs from what the package shipped
    verify = box.run("dpkg", "--verify", "multusd", check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    # the shim runs on its own (VERSION is answered without the daemon)
    version = box.run("/opt/cni/bin/multus-shim", env={"CNI_COMMAND": "VERSION"},
                      input='{"cniVersion": "0.3.1"}')
    assert "0.3.1" in json.loads(version.stdout)["supportedVersions"]
    assert active_state(box, "multusd.service") == "inactive"


def test_1b_one_change_runs_the_config_oneshot_once(installed):
    box = installed

    def starts() -> int:
        log = box.run("journalctl", "--no-pager", "-o", "cat", "-u",
                      "multusd-config.service").stdout
        return sum(line.startswith("Starting") for line in log.splitlines())

    wait_for(lambda: show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="multusd-config.path watching")
    first = starts()
    box.put("/etc/cni/net.d/README.mdtest", "not a CNI config\n")
    wait_for(lambda: starts() > first, 30, what="the change to start the oneshot")
    # Settled means: the oneshot finished and the path unit is watching again. A unit that
    # re-triggers itself (the DirectoryNotEmpty= busy loop, 80 runs in 6 s) never settles.
    wait_for(lambda: show(box, "multusd-config.service", "ActiveState") == "inactive"
             and show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="the path unit to settle")
    # One run for the change; one more at most if multusd-config.timer's boot run fell inside.
    assert starts() - first <= 2
    box.run("rm", "/etc/cni/net.d/README.mdtest")


def test_2_first_request_activates_the_service(installed):
    box = installed
    box.put(CONFIG, json.dumps(EDITED_CONFIG, indent=4) + "\n")
    box.put("/etc/cni/net.d/10-mdtest.conflist", json.dumps(PRIMARY, indent=4) + "\n")
    box.run("ip", "netns", "add", "pod-a")

    added = shim(box, "ADD", "cid-pod-a", "pod-a", "/run/netns/pod-a")
    assert added.returncode == 0, added.stdout + added.stderr
    result = json.loads(added.stdout)
    assert result["ips"][0]["address"].startswith("10.89.0.")
    assert result["ips"][0]["address"].split("/")[0] in netns_addrs(box, "pod-a")["eth0"]

    assert active_state(box, "multusd.service") == "active"
    status = box.run("systemctl", "status", "--no-pager", "multusd", check=False)
    assert status.returncode == 0 and "active (running)" in status.stdout, status.stdout

    def pod_entries_once_add_is_in() -> list:
        entries = [json.loads(line) for line in box.run(
            "journalctl", "--no-pager", "-o", "json", "-u", "multusd", "K8S_POD_NAME=pod-a"
        ).stdout.splitlines()]
        return entries if any(e["MESSAGE"].startswith("ADD") for e in entries) else []

    # journald stores what it is sent in its own time: the ADD's line may come after its answer
    entries = wait_for(pod_entries_once_add_is_in, 30,
                       what="the ADD's journal line carrying K8S_POD_NAME=pod-a")
    assert {e.get("CNI_CONTAINERID") for e in entries} == {"cid-pod-a"}

    # the hardening in multusd.service is in force, and the plugins above worked under it
    pid = show(box, "multusd.service", "MainPID")
    assert show(box, "multusd.service", "OOMScoreAdjust") == "-900"
    if box.oom_adjustable:  # else the host itself may not lower OOM scores (no CAP_SYS_RESOURCE)
        assert box.run("cat", f"/proc/{pid}/oom_score_adj").stdout.strip() == "-900"
    proc_status = box.run("cat", f"/proc/{pid}/status").stdout
    assert "NoNewPrivs:\t1" in proc_status
    # LockPersonality, RestrictRealtime, RestrictSUIDSGID, SystemCallArchitectures: seccomp
    assert "Seccomp:\t2" in proc_status
    for prop in ("LockPersonality", "RestrictRealtime", "RestrictSUIDSGID"):
        assert show(box, "multusd.service", prop) == "yes", prop
    assert show(box, "multusd.service", "KillMode") == "mixed"

    deleted = shim(box, "DEL", "cid-pod-a", "pod-a", "/run/netns/pod-a")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert "eth0" not in netns_addrs(box, "pod-a")

    # the path unit noticed the primary network and generated the runtime's config
    wait_for(lambda: os.path.exists(box.path(GENERATED)), 60, what=GENERATED)
    assert json.loads(open(box.path(GENERATED)).read())["type"] == "multus-shim"


def generated(box) -> dict:
    try:
        with open(box.path(GENERATED)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def test_2b_the_path_unit_regenerates_the_config_when_the_primary_changes(installed):
    box = installed
    wait_for(lambda: generated(box), 60, what=GENERATED)
    with_portmap = dict(PRIMARY, plugins=PRIMARY["plugins"] + [
        {"type": "portmap", "capabilities": {"portMappings": True}}])
    box.put("/etc/cni/net.d/10-mdtest.conflist", json.dumps(with_portmap, indent=4) + "\n")
    wait_for(lambda: generated(box).get("capabilities") == {"portMappings": True}, 30,
             what="the new capability in 00-multus.conf")
    # systemd does not watch while the oneshot runs: wait until the path unit is armed again
    # (the window multusd-config.timer covers for installers that write at that moment).
    wait_for(lambda: show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="multusd-config.path watching again")

    other = {"cniVersion": "0.3.1", "name": "mdtest-other", "type": "bridge",
             "bridge": "mdoth0", "ipam": {"type": "host-local", "subnet": "10.87.0.0/24"}}
    box.put("/etc/cni/net.d/05-other.conf", json.dumps(other) + "\n")
    wait_for(lambda: generated(box).get("clusterNetwork") == "/etc/cni/net.d/05-other.conf",
             30, what="the lexically first primary in 00-multus.conf")
    wait_for(lambda: show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="multusd-config.path watching again")
    box.run("rm", "/etc/cni/net.d/05-other.conf")
    wait_for(lambda: generated(box).get("clusterNetwork") == "/etc/cni/net.d/10-mdtest.conflist",
             30, what="the remaining primary in 00-multus.conf")
    assert box.run("stat", "-c", "%a", GENERATED).stdout.strip() == "600"


def test_2c_the_generator_makes_the_readiness_file_a_trigger(installed):
    box = installed
    ready = "/run/mdtest-ready/flag"
    box.put(CONFIG, json.dumps(dict(EDITED_CONFIG, readinessindicatorfile=ready), indent=4) + "\n")
    box.run("systemctl", "daemon-reload")
    dropin = "/run/systemd/generator/multusd-config.path.d/50-daemon-config-paths.conf"
    assert f"PathChanged={ready}" in box.run("cat", dropin).stdout  # /run: the box's own tmpfs
    wait_for(lambda: show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="multusd-config.path watching")
    # without the readiness file the generator waits: a changed primary is not written yet
    box.put("/etc/cni/net.d/10-mdtest.conflist", json.dumps(PRIMARY, indent=4) + "\n")
    wait_for(lambda: "waiting for" in box.run(
        "journalctl", "--no-pager", "-o", "cat", "-n", "5", "-u", "multusd-config.service"
    ).stdout, 30, what="generate-config waiting for the readiness file")
    assert generated(box).get("capabilities") == {"portMappings": True}
    wait_for(lambda: show(box, "multusd-config.path", "SubState") == "waiting", 30,
             what="multusd-config.path watching again")
    box.run("mkdir", "-p", os.path.dirname(ready))
    box.run("touch", ready)
    wait_for(lambda: generated(box) and "capabilities" not in generated(box), 30,
             what="00-multus.conf regenerated once the readiness file appeared")
    box.put(CONFIG, json.dumps(EDITED_CONFIG, indent=4) + "\n")
    box.run("systemctl", "daemon-reload")


def test_3_restart_under_load_fails_no_request(installed):
    box = installed
    loop = Loop(box, "restart")
    pids = {show(box, "multusd.service", "MainPID")}
    inode = box.run("stat", "-c", "%i", SOCKET).stdout
    try:
        loop.wait_for_more(4)
        for _ in range(10):  # each restart races the loop's next connection: many, to see it
            box.run("systemctl", "restart", "multusd.service", timeout=200)
            pids.add(show(box, "multusd.service", "MainPID"))
            loop.wait_for_more(2)
    finally:
        calls = loop.finish()
    failed = [c for c in calls if c["rc"] != 0]
    assert failed == [], [(c["command"], c["rc"], c["stdout"][-400:]) for c in failed[:3]]
    assert len(pids) == 11, f"the service did not restart each time: {pids}"
    assert box.run("stat", "-c", "%i", SOCKET).stdout == inode, "the socket was re-created"
    assert len(calls) >= 24


def test_4_upgrade_keeps_the_edited_config_and_the_socket(installed, packages, tmp_path):
    box = installed
    newer = build_packages(str(tmp_path), packages["version"] + ".1")
    newer["deb"] = tripwired(newer["deb"], str(tmp_path))
    box.copy_in(newer["deb"], "/root/" + os.path.basename(newer["deb"]))
    shim(box, "ADD", "cid-warm", "pod-a", "/run/netns/pod-a")  # make sure the daemon runs
    assert active_state(box, "multusd.service") == "active"
    before = {"inode": box.run("stat", "-c", "%i", SOCKET).stdout,
              "since": show(box, "multusd.socket", "ActiveEnterTimestampMonotonic"),
              "pid": show(box, "multusd.service", "MainPID")}
    config_before = open(box.path(CONFIG)).read()

    loop = Loop(box, "upgrade")
    try:
        loop.wait_for_more(2)
        done = box.run("apt-get", "install", "-y",
                       "/root/" + os.path.basename(newer["deb"]), check=False, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        loop.wait_for_more(2)
    finally:
        calls = loop.finish()
    assert [c for c in calls if c["rc"] != 0] == []

    assert box.run("multusd", "--version").stdout.strip() == f"multusd {newer['version']}"
    assert open(box.path(CONFIG)).read() == config_before
    assert not os.path.exists(box.path(CONFIG + ".dpkg-dist"))
    assert box.run("stat", "-c", "%i", SOCKET).stdout == before["inode"]
    assert show(box, "multusd.socket", "ActiveEnterTimestampMonotonic") == before["since"]
    assert show(box, "multusd.service", "MainPID") != before["pid"], "service not restarted"
    assert shim(box, "DEL", "cid-warm", "pod-a", "/run/netns/pod-a").returncode == 0


# /delegate (hot-plug) from inside the container, with the package's own client module (the
# shim's: no tripwire), as the multus-dynamic-networks-controller would call it.
DELEGATE = """
import json, sys
sys.path.insert(0, "/usr/lib/multusd")
from multusd.wire import api
env, conf = json.loads(sys.argv[1]), sys.argv[2].encode()
answer = api.http_request("/run/multus/multus.sock", "POST", "/delegate",
                          api.encode_request(env, conf, {}), timeout=120)
print(answer.status, answer.body.decode())
"""
HOTNET = {"cniVersion": "0.4.0", "name": "mdtest-hot", "type": "bridge", "bridge": "mdhot0",
          "ipam": {"type": "host-local", "subnet": "10.84.0.0/24", "dataDir": f"{WORK}/ipam-hot"}}


def delegate(box: Machine, command: str, container_id: str, netns: str) -> str:
    env = dict(shim_env(command, container_id, "pod-w", netns), CNI_IFNAME="net5")
    return box.run("python3", "-c", DELEGATE, json.dumps(env), json.dumps(HOTNET),
                   check=False, timeout=200).stdout.strip()


def daemon_version(box: Machine) -> str:
    status = box.run("python3", "-c", "import sys; sys.path.insert(0, '/usr/lib/multusd'); "
                     "from multusd.wire import api; print(api.http_request("
                     "'/run/multus/multus.sock', 'GET', '/status', timeout=60).body.decode())")
    return json.loads(status.stdout)["version"]


def test_4b_a_daemon_serving_under_unpacked_files_loads_none_of_them(installed, packages,
                                                                      tmp_path):
    """apt's two steps with requests between: dpkg --unpack puts the new files in place under
    a daemon that has served nothing since it started; every kind of request it then serves
    (ADD, hot-plug ADD and DEL, DEL) would load a module it had not loaded yet from
    those files; postinst (dpkg --configure) restarts it on the new version meanwhile."""
    box = installed
    newer = build_packages(str(tmp_path), packages["version"] + ".2")
    wired = tripwired(newer["deb"], str(tmp_path))
    deb = "/root/" + os.path.basename(wired)
    box.copy_in(wired, deb)
    box.run("ip", "netns", "add", "pod-w")
    box.run("systemctl", "restart", "multusd.service", timeout=200)
    old = {"pid": show(box, "multusd.service", "MainPID"), "version": daemon_version(box)}

    unpacked = box.run("dpkg", "--unpack", deb, check=False, timeout=300)
    assert unpacked.returncode == 0, unpacked.stdout + unpacked.stderr
    loop = Loop(box, "unpacked")
    try:
        answers = {"ADD": shim(box, "ADD", "cid-w", "pod-w", "/run/netns/pod-w")}
        hot = [delegate(box, "ADD", "cid-w", "/run/netns/pod-w"),
               delegate(box, "DEL", "cid-w", "/run/netns/pod-w")]
        answers["DEL"] = shim(box, "DEL", "cid-w", "pod-w", "/run/netns/pod-w")
        loop.wait_for_more(2)
        # all of it served by the old daemon, on the old version
        assert show(box, "multusd.service", "MainPID") == old["pid"]
        assert daemon_version(box) == old["version"] != newer["version"]
        configured = box.run("dpkg", "--configure", "multusd", check=False, timeout=300)
        assert configured.returncode == 0, configured.stdout + configured.stderr
        loop.wait_for_more(2)
    finally:
        calls = loop.finish()
    failed = {command: done.stdout[-400:] for command, done in answers.items()
              if done.returncode != 0}
    assert failed == {}
    assert hot[0].startswith("200 ") and '"Result"' in hot[0], hot[0]
    assert hot[1] == "200", hot[1]
    assert [c for c in calls if c["rc"] != 0] == []
    assert show(box, "multusd.service", "MainPID") != old["pid"], "service not restarted"
    assert daemon_version(box) == newer["version"]
    assert "eth0" not in netns_addrs(box, "pod-w") and "net5" not in netns_addrs(box, "pod-w")
    assert "two versions in one process" not in journal_text(box)


def journal_text(box: Machine) -> str:
    return box.run("journalctl", "--no-pager", "-o", "cat", "-u", "multusd.service",
                   check=False).stdout


def test_5_remove_stops_everything_and_deletes_the_generated_config(installed):
    box = installed
    assert os.path.exists(box.path(GENERATED))
    # what the daemon keeps of a kubeconfig's inline keys (kube/kubeconfig.py) goes too
    box.run("sh", "-c", "mkdir -p -m 0700 /run/multusd-kubeconfig-0 && "
            "echo key > /run/multusd-kubeconfig-0/0123.pem")
    done = box.run("apt-get", "remove", "-y", "multusd", check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not os.path.exists(box.path(GENERATED)), "00-multus.conf left behind"
    for unit in UNITS:
        journal = box.run("journalctl", "--no-pager", "-u", unit, check=False).stdout
        assert active_state(box, unit) in ("inactive", "unknown"), f"{unit}:\n{journal}"
    running = box.run("systemctl", "list-units", "--no-legend", "--state=active",
                      "multusd*").stdout
    assert running.strip() == ""
    assert not os.path.exists(box.path(SOCKET))
    assert not os.path.exists(box.path("/usr/lib/multusd")), "byte-code left behind"
    assert os.path.exists(box.path(CONFIG)), "remove (not purge) keeps the conffile"
    assert box.run("test", "-e", "/run/multusd-kubeconfig-0", check=False).returncode != 0


def test_6_purge_deletes_config_and_state(installed):
    box = installed
    done = box.run("apt-get", "purge", "-y", "multusd", check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not os.path.exists(box.path(CONFIG))
    assert not os.path.exists(box.path("/var/lib/cni/multus"))
    assert box.run("dpkg-query", "-W", "multusd", check=False).returncode != 0
    # no file of the package's, nor any it made, is left (but the tests' own and the journal)
    left = box.run("find", "/etc", "/usr", "/opt", "/var", "/run", "-xdev", "-name", "*multus*",
                   "-not", "-path", f"{WORK}/*", "-not", "-path", "/var/log/journal/*",
                   "-not", "-path", "/root/*", check=False).stdout.split()
    assert left == [], left
