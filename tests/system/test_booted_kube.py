"""The .deb on a Kubernetes node, booted Debian 12 and 13 (systemd-nspawn): a pod with a NAD.

One container for the module; the tests run in order on the state the previous one left. The
stand-in API server (tests/kubeapi.py, run inside by kubestandin.py: the container's network is
private) holds a NetworkAttachmentDefinition and a pod that asks for it; the runtime's call of
the real shim with the generated 00-multus.conf gets the pod its cluster network (eth0) and the
NAD's (net1), the daemon writes the pod's network-status, ``multusd status``, ``show`` and
``doctor`` read the node and the API as an operator would, and neither a restart nor an upgrade
loses the pod: its DEL afterwards releases everything.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Iterator

import pytest

from machine import Machine
from nodeops import (CONFIG, EDITED_CONFIG, GENERATED, HERE, WORK, configure, netns_addrs, shim,
                     show)
from pkgbuild import REPO, build_packages, tripwired
from testlib import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

KUBE = f"{WORK}/kube"
NODE = "node-a"
POD, POD_UID, CID, NETNS = "web-0", "5d0c1e2f-0000-4000-8000-00000000beef", "cid-kube-1", "pod-k"
NAD = {"cniVersion": "0.3.1", "type": "bridge", "bridge": "mdnad0",
       "ipam": {"type": "host-local", "subnet": "10.86.0.0/24", "dataDir": f"{WORK}/ipam-nad"}}
OBJECTS = {
    "node": NODE,
    "nads": [{"namespace": "default", "name": "storage", "config": json.dumps(NAD)}],
    "pods": [{"namespace": "default", "name": POD, "uid": POD_UID,
              "annotations": {"k8s.v1.cni.cncf.io/networks": "storage"}}],
}
KUBE_CONFIG = dict(EDITED_CONFIG, kubeconfig=f"{KUBE}/kubeconfig", nodeName=NODE)
STATUS_KEY = "k8s.v1.cni.cncf.io/network-status"
# the pod as the API server has it, read inside the container with the stand-in's token
GET_POD = """
import json, sys, urllib.request
ready = json.load(open(sys.argv[1]))
request = urllib.request.Request(ready["url"] + "/api/v1/namespaces/default/pods/" + sys.argv[2],
                                 headers={"Authorization": "Bearer " + ready["token"]})
print(urllib.request.urlopen(request, timeout=30).read().decode())
"""


@pytest.fixture(scope="module")
def node(machine: Machine, packages) -> Iterator[Machine]:
    deb = "/root/" + os.path.basename(packages["deb"])
    machine.copy_in(packages["deb"], deb)
    done = machine.run("apt-get", "install", "-y", deb, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    configure(machine)
    for name in glob.glob(os.path.join(REPO, "tests", "kube*.py")) + [
            os.path.join(HERE, "kubestandin.py")]:
        machine.copy_in(name, f"{KUBE}/{os.path.basename(name)}")
    machine.put(f"{KUBE}/objects.json", json.dumps(OBJECTS))
    standin = subprocess.Popen(
        machine.argv("python3", f"{KUBE}/kubestandin.py", KUBE, f"{KUBE}/objects.json"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: os.path.exists(machine.path(f"{KUBE}/ready")) or
                 standin.poll() is not None, 60, what="the stand-in API server")
        assert standin.poll() is None, standin.stdout.read()
        machine.put(CONFIG, json.dumps(KUBE_CONFIG, indent=4) + "\n")
        machine.run("systemctl", "restart", "multusd.service", timeout=200)
        machine.run("ip", "netns", "add", NETNS)
        yield machine
    finally:
        standin.stdin.close()  # it serves until its stdin closes
        standin.wait(timeout=60)


def pod_status(box: Machine) -> list:
    out = box.run("python3", "-c", GET_POD, f"{KUBE}/ready", POD).stdout
    return json.loads(json.loads(out)["metadata"]["annotations"].get(STATUS_KEY, "[]"))


def runtime_conf(box: Machine) -> dict:
    """What the runtime hands the shim: the generated 00-multus.conf."""
    with open(box.path(GENERATED)) as handle:
        return json.load(handle)


def nad_leases(box: Machine) -> list:
    return [n for n in os.listdir(box.path(f"{WORK}/ipam-nad/storage")) if n[0].isdigit()]


def test_1_a_pod_gets_its_nads_interface_through_the_api_server(node):
    box = node
    added = shim(box, "ADD", CID, POD, f"/run/netns/{NETNS}", conf=runtime_conf(box),
                 uid=POD_UID)
    assert added.returncode == 0, added.stdout + added.stderr
    addrs = netns_addrs(box, NETNS)
    assert [a.split(".")[:3] for a in addrs["eth0"] if "." in a] == [["10", "88", "0"]]
    assert [a.split(".")[:3] for a in addrs["net1"] if "." in a] == [["10", "86", "0"]]
    status = pod_status(box)
    assert [(s["name"], s["interface"], s.get("default", False)) for s in status] == [
        ("mdtest-primary", "eth0", True), ("default/storage", "net1", False)]
    assert [s["ips"][0] for s in status] == [addrs["eth0"][0], addrs["net1"][0]]
    assert len(nad_leases(box)) == 1


def test_2_status_show_and_doctor_read_the_node_and_the_api(node):
    box = node
    done = box.run("multusd", "status", "--json", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout)
    assert status["daemon"]["running"] and status["api"]["synced"], status
    assert status["node"]["name"] == NODE
    sandbox = next(s for s in status["sandboxes"] if s["containerId"] == CID)
    assert sandbox["pod"] == {"namespace": "default", "name": POD, "uid": POD_UID}
    assert [(a["network"], a["interface"]) for a in sandbox["attachments"]] == [
        ("mdtest-primary", "eth0"), ("default/storage", "net1")]
    shown = box.run("multusd", "show", f"default/{POD}", check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "network-status agrees with the node's records" in shown.stdout
    doctor = box.run("multusd", "doctor", "--json", check=False)
    checks = {c["name"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 0, doctor.stdout
    for name in ("api", "permissions", "nad-api", "node", "plugins", "00-multus.conf"):
        assert checks[name] == "ok", (name, doctor.stdout)


def test_3_a_restart_and_an_upgrade_lose_nothing(node, packages, tmp_path):
    box = node
    before = pod_status(box)
    pid = show(box, "multusd.service", "MainPID")
    box.run("systemctl", "restart", "multusd.service", timeout=200)
    assert show(box, "multusd.service", "MainPID") not in (pid, "0")
    shown = box.run("multusd", "show", f"default/{POD}", check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr

    pid = show(box, "multusd.service", "MainPID")
    newer = build_packages(str(tmp_path), packages["version"] + ".3")
    wired = tripwired(newer["deb"], str(tmp_path))  # the old daemon loads none of its files
    deb = "/root/" + os.path.basename(wired)
    box.copy_in(wired, deb)
    done = box.run("apt-get", "install", "-y", deb, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert box.run("multusd", "--version").stdout.strip() == f"multusd {newer['version']}"
    assert show(box, "multusd.service", "MainPID") not in (pid, "0")
    shown = box.run("multusd", "show", f"default/{POD}", check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert pod_status(box) == before

    deleted = shim(box, "DEL", CID, POD, f"/run/netns/{NETNS}", conf=runtime_conf(box),
                   uid=POD_UID)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert set(netns_addrs(box, NETNS)) == {"lo"}
    assert nad_leases(box) == []
    assert not os.path.exists(box.path(f"/var/lib/cni/multus/{CID}"))
