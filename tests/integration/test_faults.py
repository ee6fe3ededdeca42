"""Issue 12: repeated calls, pre-existing interfaces, CNI_IFNAME, rollback leftovers, bad netns.

The real shim and daemon (socket activation), real bridge/host-local plugins, real namespaces.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from harness import call_shim, netns_addresses

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]


def pod_args(container_id: str) -> dict:
    return {"container_id": container_id, "pod": ("default", "web-0"), "uid": str(uuid.uuid4())}


def links(ns_name: str) -> set:
    return set(netns_addresses(ns_name)) - {"lo"}


def test_repeated_add_is_refused_and_leaves_the_first_attachment_intact(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.90.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")
    assert call_shim("ADD", conf, netns=ns_path, **pod_args(cid)).code == 0

    again = call_shim("ADD", conf, netns=ns_path, **pod_args(cid))

    assert again.code == 1, again.output
    assert "must call DEL" in again.output["msg"]
    assert netns_addresses(ns_name)["eth0"] == ["10.90.0.2/24"]
    assert len(sandbox.leases_held()) == 1
    assert call_shim("CHECK", conf, netns=ns_path, **pod_args(cid)).code == 0
    assert call_shim("DEL", conf, netns=ns_path, **pod_args(cid)).code == 0
    assert links(ns_name) == set() and sandbox.leases_held() == []


def test_a_pre_existing_interface_survives_a_failed_add(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.91.0.0/24"),
                                           sandbox.net("second", "10.92.0.0/24", gateway=False)]})
    ns_name, ns_path = sandbox.netns()
    subprocess.run(["ip", "-n", ns_name, "link", "add", "net1", "type", "veth",
                    "peer", "name", "net1peer"], check=True)
    cid = uuid.uuid4().hex

    add = call_shim("ADD", daemon.shim_conf("0.4.0"), netns=ns_path, **pod_args(cid))

    assert add.code == 1, add.output
    assert "validateIfName: interface name net1 already exists" in add.output["msg"]
    assert 'error adding container to network "second"' in add.output["msg"]
    assert links(ns_name) == {"net1", "net1peer"}  # the pod's own net1 is still there
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))


def test_eth1_master_is_checked_and_deleted_by_its_name(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.93.0.0/24"),
                                           sandbox.net("second", "10.94.0.0/24", gateway=False)]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")
    assert call_shim("ADD", conf, netns=ns_path, ifname="eth1", **pod_args(cid)).code == 0
    assert links(ns_name) == {"eth1", "net1"}

    check = call_shim("CHECK", conf, netns=ns_path, ifname="eth1", **pod_args(cid))
    assert check.code == 0, check.output
    delete = call_shim("DEL", conf, netns=ns_path, ifname="eth1", **pod_args(cid))
    assert delete.code == 0, delete.output

    assert links(ns_name) == set()
    assert sandbox.leases_held() == []
    assert os.listdir(os.path.join(daemon.cni_dir, "results")) == []


def test_what_a_rollback_could_not_release_is_released_by_the_runtimes_del(sandbox, tmp_path):
    passed, record = str(tmp_path / "del-may-pass"), str(tmp_path / "calls.jsonl")
    stuck = {"cniVersion": "0.4.0", "name": "stuck", "type": "stub-record", "recordFile": record,
             "failOn": "ADD", "failDelUnless": passed,
             "error": {"cniVersion": "0.4.0", "code": 7, "msg": "stub refuses"}}
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.95.0.0/24"), stuck]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")

    add = call_shim("ADD", conf, netns=ns_path, **pod_args(cid))
    assert add.code == 1 and "stub refuses" in add.output["msg"], add.output
    assert commands(record) == ["ADD", "DEL"]  # its rollback DEL failed ...
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))  # ... so it stays recorded

    open(passed, "w").close()
    delete = call_shim("DEL", conf, netns=ns_path, **pod_args(cid))
    assert delete.code == 0, delete.output
    assert commands(record) == ["ADD", "DEL", "DEL"]  # the runtime's DEL reached it
    assert links(ns_name) == set()
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))


def commands(record: str) -> list:
    with open(record) as handle:
        return [json.loads(line)["command"] for line in handle]


@pytest.mark.parametrize("kind", ["fifo", "directory", "file"])
def test_a_netns_that_is_not_a_namespace_fails_by_the_check_not_the_deadline(sandbox, tmp_path, kind):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.97.0.0/24")]})
    path = str(tmp_path / f"not-a-netns-{kind}")
    {"fifo": os.mkfifo, "directory": os.mkdir, "file": lambda p: open(p, "w").close()}[kind](path)
    cid = uuid.uuid4().hex

    # Unfixed, a FIFO holds the worker until the 110 s deadline: the ADD fails by it, not by
    # the check (the shim is given its own bound, not a guess a busy machine may pass).
    add = call_shim("ADD", daemon.shim_conf("0.4.0"), netns=path, **pod_args(cid))

    assert add.code == 1, add.output
    assert "is not a network namespace" in add.output["msg"]
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))


def test_del_with_a_fifo_netns_still_releases_the_addresses(sandbox, tmp_path):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.89.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")
    assert call_shim("ADD", conf, netns=ns_path, **pod_args(cid)).code == 0
    fifo = str(tmp_path / "fifo-netns")
    os.mkfifo(fifo)

    # Unfixed, bridge refuses the path ("unknown FS magic") and every retried DEL fails.
    delete = call_shim("DEL", conf, netns=fifo, **pod_args(cid))

    assert delete.code == 0, delete.output
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))
