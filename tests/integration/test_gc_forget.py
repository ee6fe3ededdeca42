"""``multusd gc --forget`` goes through the daemon's lanes when the daemon answers: it runs in the
sandbox's turn, never beside the runtime's DEL of it or the daemon's own retry (invariant 5);
with no daemon it runs in the tool's process, and says so.

The real daemon under systemd-socket-activate, the real shim, the tool as a process; the
delegates are the stubs of tests/stubs: ``stub-hold`` holds a sandbox's DEL while a file names
it, ``stub-record`` fails DEL until a file exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest

from harness import call_shim, shim_bound
from multusd.wire import api
from testlib import wait_for

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


def forget(daemon, cid: str) -> subprocess.Popen:
    """``multusd gc --forget CID --json``, started."""
    return subprocess.Popen([sys.executable, "-m", "multusd", "gc", "--forget", cid, "--json",
                             "--config", daemon.config_path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def answered(proc: subprocess.Popen, timeout: float) -> tuple:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert out, err
    return proc.returncode, json.loads(out)


def status(daemon) -> dict:
    return json.loads(api.http_request(daemon.socket_path, "GET", "/status", timeout=5).body)


@pytest.fixture
def node(sandbox, tmp_path):
    """A daemon whose sandboxes have two delegates: "held" (stub-hold: its DEL waits while
    ``hold/<containerID>`` exists) and "stuck" (its DEL fails until ``fixed`` exists)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    calls = str(tmp_path / "calls.jsonl")
    held = {"cniVersion": "1.0.0", "name": "held", "type": "stub-hold", "holdDir": str(hold),
            "recordFile": calls}
    stuck = {"cniVersion": "1.0.0", "name": "stuck", "type": "stub-record",
             "failDelUnless": str(tmp_path / "fixed"), "error": ERROR, "recordFile": calls}
    daemon = sandbox.daemon({"delegates": [held, stuck], "deleteRetryWindow": 300})
    daemon.hold, daemon.calls = hold, calls
    return daemon


def attach(daemon, sandbox) -> tuple:
    cid = uuid.uuid4().hex
    netns = sandbox.netns()[1]
    added = call_shim("ADD", daemon.shim_conf(), container_id=cid, netns=netns,
                      pod=("default", "web"))
    assert added.code == 0, added.output
    return cid, netns


def dels(daemon, cid: str) -> int:
    """How many DELs of ``cid`` the "held" delegate was asked for (started, held or not)."""
    with open(daemon.calls) as handle:
        calls = [json.loads(line) for line in handle]
    return sum(1 for c in calls if c["command"] == "DEL" and c.get("container") == cid)


def test_forget_waits_for_the_sandboxs_running_del_and_runs_in_the_daemon(node, sandbox):
    cid, netns = attach(node, sandbox)
    (node.hold / cid).touch()  # the runtime's DEL hangs in "held"
    runtime = []
    thread = threading.Thread(target=lambda: runtime.append(call_shim(
        "DEL", node.shim_conf(), container_id=cid, netns=netns, pod=("default", "web"))))
    thread.start()
    wait_for(lambda: (node.hold / f"{cid}.DEL.pids").exists(), shim_bound("DEL"),
             what="the runtime's DEL to hang in its plugin")

    tool = forget(node, cid)
    try:
        # the forget waits in the sandbox's lane behind the runtime's DEL: nothing of it has
        # run (before, it ran in the tool's process at once, beside the DEL)
        # (the tool's start, then its request, bounded as a shim's)
        wait_for(lambda: status(node)["queued"] == 1, shim_bound("DEL"),
                 what="the forget parked in the lane")
        assert dels(node, cid) == 1 and tool.poll() is None
    finally:
        (node.hold / cid).unlink()  # the DEL goes on: "stuck" fails it, the records stay
        thread.join(shim_bound("DEL"))
    assert runtime[0].code == 1 and "its daemon is down" in runtime[0].output["msg"]

    code, doc = answered(tool, shim_bound("DEL"))

    assert code == 0 and doc["via"] == "daemon" and "viaReason" not in doc
    assert doc["networks"] == [
        {"network": "held", "interface": "eth0", "released": True},
        {"network": "stuck", "interface": "net1", "released": False,
         "error": "its daemon is down"}]
    assert doc["recordsLeft"] == [] and dels(node, cid) == 2  # after the runtime's, not beside
    assert f"gc --forget {cid}: 1 of 2 network(s) released" in node.log()
    assert not os.path.exists(os.path.join(node.cni_dir, cid))
    assert not os.path.exists(os.path.join(node.cni_dir, ".multusd-unreleased", cid))
    again = call_shim("DEL", node.shim_conf(), container_id=cid, netns=netns,
                      pod=("default", "web"))
    assert again.code == 0, again.output  # the pod can terminate


def test_with_no_daemon_answering_forget_runs_in_the_tool_and_says_so(node, sandbox):
    cid, _ = attach(node, sandbox)
    node.terminate()  # nothing listens on the socket any more

    proc = subprocess.run([sys.executable, "-m", "multusd", "gc", "--forget", cid,
                           "--config", node.config_path], capture_output=True, text=True,
                          timeout=120)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("run in this process, outside multusd's lanes: multusd does not "
                            f"answer on {node.socket_path}")
    assert "NOT released, record dropped: stuck (net1): its daemon is down" in proc.stdout
    assert "released: held (eth0)" in proc.stdout
    assert not os.path.exists(os.path.join(node.cni_dir, cid))
