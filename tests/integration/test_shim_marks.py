"""A shim whose config names no cniDir (an operator's static 00-multus.conf) and that cannot read
daemon-config.json (here, none is at its packaged path: the daemon's is the test's; a shim
older than issue 37 never read it) marks a failed DEL in Multus's default cniDir, while
daemon-config.json keeps the records in another: that mark goes once its sandbox is released,
by the daemon's DEL at once, by ``gc --forget`` with no daemon, or at the daemon's next look
when something else released it (upstream's daemon). Before, it stayed for ever.
(tests/integration/test_recorded_dels: a shim that reads daemon-config.json marks beside the
records.)

The real daemon (systemd-socket-activate) and the real shim, each in a mount namespace of its
own where a directory of the test is bound on /var/lib: Multus's default cniDir,
/var/lib/cni/multus, is the test's, and the node's is never touched. The delegate is the stub
``stub-record`` (tests/stubs), whose DEL fails until a file exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from harness import PYTHON, SHIM_ARGV, call_shim, shim_conf
from multusd.daemon.delretry import SCAN_INTERVAL
from testlib import wait_for

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}
MARKS = ".multusd-unreleased"


class Node:
    """The daemon (its cniDir its own), the shim's config naming none, /var/lib the test's."""

    def __init__(self, sandbox, tmp_path) -> None:
        self.var_lib = tmp_path / "var-lib"
        (self.var_lib / "cni").mkdir(parents=True)  # the shim never makes cniDir's parents
        self.fixed = tmp_path / "fixed"
        stuck = {"cniVersion": "1.0.0", "name": "stuck", "type": "stub-record",
                 "failDelUnless": str(self.fixed), "error": ERROR}
        self.daemon = sandbox.daemon({"delegates": [stuck], "deleteRetryWindow": 300},
                                     command=[*self.private(), PYTHON, "-m", "multusd"])
        self.conf = shim_conf(self.daemon.socket_dir)  # no cniDir: Multus's default
        self.netns = sandbox.netns()[1]

    def private(self) -> list:
        """A command run in a mount namespace of its own, the test's directory on /var/lib (the
        host's mounts still reach it: the network namespaces made after the daemon started)."""
        return ["unshare", "-m", "--propagation", "slave", "sh", "-ec",
                'mount --bind "$0" /var/lib; exec "$@"', str(self.var_lib)]

    def shim(self, command: str, cid: str):
        return call_shim(command, self.conf, container_id=cid, netns=self.netns,
                         pod=("default", "web"), argv=[*self.private(), *SHIM_ARGV])

    def shims_mark(self, cid: str) -> str:
        """Where the shim marks ``cid``: /var/lib/cni/multus/.multusd-unreleased/<cid>."""
        return str(self.var_lib / "cni" / "multus" / MARKS / cid)

    def daemons_mark(self, cid: str) -> str:
        return os.path.join(self.daemon.cni_dir, MARKS, cid)


@pytest.fixture
def node(sandbox, tmp_path) -> Node:
    return Node(sandbox, tmp_path)


def test_the_daemons_del_drops_the_shims_mark_of_the_sandbox_it_released(node):
    cid = uuid.uuid4().hex
    assert node.shim("ADD", cid).code == 0
    failed = node.shim("DEL", cid)  # the daemon's delegate fails: both mark it, apart
    assert failed.code == 1 and "its daemon is down" in failed.output["msg"]
    with open(node.shims_mark(cid)) as handle:
        assert json.load(handle)["by"] == "shim"
    with open(node.daemons_mark(cid)) as handle:
        assert json.load(handle)["by"] == "daemon"
    node.fixed.touch()

    released = node.shim("DEL", cid)  # the runtime's retry: released now

    assert released.code == 0, released.output
    assert not os.path.exists(os.path.join(node.daemon.cni_dir, cid))
    assert not os.path.exists(node.daemons_mark(cid))
    assert not os.path.exists(node.shims_mark(cid))  # (it stayed, read by nothing)


def test_the_daemons_next_look_drops_the_shims_mark_of_a_sandbox_released_without_it(node):
    cid = uuid.uuid4().hex
    assert node.shim("ADD", cid).code == 0
    node.daemon.terminate()
    assert node.shim("DEL", cid).code == 1  # no daemon: the shim marks it
    assert os.path.exists(node.shims_mark(cid))
    # released by something that drops no marks (upstream's daemon, say): its records go
    results = os.path.join(node.daemon.cni_dir, "results")
    for name in [n for n in os.listdir(results) if f"-{cid}-" in n] + [os.path.join("..", cid)]:
        os.unlink(os.path.join(results, name))
    assert os.path.exists(node.shims_mark(cid))

    node.daemon.start()  # its first look is at its start; the next SCAN_INTERVAL later

    said = f"the mark of sandbox {cid}'s failed DEL is dropped: the sandbox is released"
    # the line is logged after the mark goes: both are waited for, with the look's own bound
    wait_for(lambda: not os.path.exists(node.shims_mark(cid)) and said in node.daemon.log(),
             SCAN_INTERVAL + 10, what="the daemon's look to drop the shim's mark, and say so")


def test_gc_forget_without_the_daemon_drops_the_shims_mark_too(node):
    cid = uuid.uuid4().hex
    assert node.shim("ADD", cid).code == 0
    node.daemon.terminate()
    assert node.shim("DEL", cid).code == 1  # no daemon: the shim marks it
    node.fixed.touch()

    forget = subprocess.run([*node.private(), PYTHON, "-m", "multusd", "gc", "--forget", cid,
                             "--config", node.daemon.config_path], capture_output=True,
                            text=True, timeout=120)

    assert forget.returncode == 0, forget.stdout + forget.stderr
    assert forget.stdout.startswith("run in this process")  # released, the daemon down
    assert not os.path.exists(os.path.join(node.daemon.cni_dir, cid))
    assert not os.path.exists(node.shims_mark(cid))  # (it stayed for the daemon's next look)
