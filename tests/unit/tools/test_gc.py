"""multusd.tools.gc: which sandboxes it lists, retries, releases or forgets, how, and what it says.

A real cniDir whose records the daemon's own ADD and DEL wrote (the daemon's Multus on the
stub plugin ``stub-record``, in real network namespaces); gc runs as ``multusd gc`` does,
from daemon-config.json, in this process (its output read off stdout). Through the daemon it
talks to the real server on the config's socket. The full node (real plugins, the shim, the
tool as a process) is tests/integration/test_tools.py's and test_del_window.py's.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Dict, List

import pytest

from multusd.core import delmarks
from multusd.daemon.server import Server
from multusd.errors import MultusError
from multusd.tools import common, gc
from testlib import wait_for
from toolnode import ToolNode, netns_gone

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


def delegates(node: ToolNode) -> list:
    """Delegate "cluster", and "stuck", whose DEL fails until the file ``fixed`` exists."""
    return [node.stub("cluster"), node.stub("stuck", failDelUnless=fixed(node), error=ERROR)]


def fixed(node: ToolNode) -> str:
    return os.path.join(os.path.dirname(node.cni_dir), "fixed")


@pytest.fixture
def node(tmp_path, make_netns) -> ToolNode:
    return ToolNode(tmp_path, make_netns, delegates)


def gc_json(capsys, node: ToolNode, **options: Any) -> tuple:
    code = gc.run(node.config_path, as_json=True, **options)
    return code, json.loads(capsys.readouterr().out)


def gc_text(capsys, node: ToolNode, **options: Any) -> tuple:
    code = gc.run(node.config_path, **options)
    return code, capsys.readouterr().out


# ---- stale sandboxes ---------------------------------------------------------------------------

def test_only_sandboxes_whose_netns_is_gone_are_listed_and_nothing_changes(node, capsys):
    netns_gone(node.attach("gone-1"))
    node.attach("live-1")
    files, calls = node.files(), node.calls()
    for options in ({}, {"dry_run": True}):
        code, doc = gc_json(capsys, node, **options)
        assert code == common.EXIT_OK
        assert doc["dryRun"] is True and doc["via"] == "" and doc["released"] == 0
        assert [s["containerId"] for s in doc["stale"]] == ["gone-1"]
        assert doc["stale"][0]["netnsState"] == "gone" and doc["unreleased"] == []
    assert node.files() == files and node.calls() == calls
    code, text = gc_text(capsys, node)
    assert "stale: ns/web gone-1 netns " in text and "(gone); eth0=cluster(-), net1=stuck(-)" \
        in text
    assert "    results/cluster-gone-1-eth0" in text.replace(node.cni_dir + "/", "")
    assert "1 stale sandbox(es); nothing was changed (dry run). Release them with: multusd gc " \
        "--release" in text


def test_nothing_stale_is_said_so(node, capsys):
    node.attach("live-1")
    code, text = gc_text(capsys, node, release=True)
    assert code == 0 and text.strip() == ("no stale sandboxes: every recorded sandbox's network "
                                          "namespace exists")


def test_release_without_a_daemon_runs_the_runtimes_del_in_process(node, capsys):
    netns = node.attach("gone-1")
    node.attach("live-1")
    open(fixed(node), "w").close()  # every delegate's DEL works
    netns_gone(netns)
    live = [f for f in node.files() if "live-1" in f]
    code, doc = gc_json(capsys, node, release=True)
    assert code == 0 and doc["via"] == "in-process" and doc["released"] == 1
    assert doc["stale"][0]["released"] is True
    assert [name for name, _ in node.del_calls()] == ["stuck", "cluster"]  # last first
    env = node.del_calls()[1][1]
    assert (env["CNI_CONTAINERID"], env["CNI_NETNS"], env["CNI_IFNAME"]) == \
        ("gone-1", netns, "eth0")
    assert env["CNI_ARGS"] == ("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;"
                               "K8S_POD_INFRA_CONTAINER_ID=gone-1;K8S_POD_UID=u1")
    assert node.files() == live


def test_a_failed_release_keeps_the_records_and_says_so(node, capsys):
    netns_gone(node.attach("gone-1"))  # "stuck" cannot DEL: no fixed file
    code, text = gc_text(capsys, node, release=True)
    assert code == common.EXIT_PROBLEM
    assert "NOT released: " in text and "stuck (net1): its daemon is down" in text
    assert "released 0 of 1 stale sandbox(es) (in-process); 1 failed: they stay recorded" in text
    assert any("gone-1" in f for f in node.files())


def test_a_stale_sandbox_whose_records_name_no_pod_is_not_released(node, capsys):
    netns_gone(node.attach("anon-1", args="IgnoreUnknown=1"))
    code, doc = gc_json(capsys, node, release=True)
    assert code == common.EXIT_PROBLEM
    assert doc["stale"][0]["error"] == "its records name no pod (no K8S_POD_NAME)"
    assert node.del_calls() == []


class RecordingDaemon:
    """The real server on the config's socket; its handler keeps each request's env."""

    def __init__(self, path: str, refuse: str = "") -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(8)
        self.envs: List[Dict[str, str]] = []
        self.endpoints: List[str] = []
        self.refuse = refuse  # every request fails with this msg
        self.server = Server(self.listener, self._handle, workers=1)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, endpoint: str, body: bytes, deadline: float, request_id: str) -> None:
        self.envs.append(json.loads(body)["env"])
        self.endpoints.append(endpoint)
        if self.refuse:
            raise MultusError(self.refuse)
        return None  # DEL answers 200, empty

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        self.listener.close()


def test_with_a_daemon_answering_the_del_goes_through_its_socket(node, capsys):
    netns = node.attach("gone-1")
    netns_gone(netns)
    daemon = RecordingDaemon(node.config.socket_path)
    try:
        code, doc = gc_json(capsys, node, release=True)
    finally:
        daemon.stop()
    assert doc["via"] == "daemon" and node.del_calls() == []  # not run here
    assert [(e["CNI_COMMAND"], e["CNI_CONTAINERID"], e["CNI_NETNS"]) for e in daemon.envs] == \
        [("DEL", "gone-1", netns)]
    # released is read from the records, not from the answer: these are still there
    assert code == common.EXIT_PROBLEM and doc["stale"][0]["released"] is False
    assert doc["stale"][0]["error"].startswith("DEL succeeded but records remain: ")


# ---- unreleased sandboxes ---------------------------------------------------------------------

def make_unreleased(node: ToolNode, cid: str) -> str:
    """A sandbox whose DEL failed past its window (the daemon's own DEL records it so)."""
    netns = node.attach(cid)
    netns_gone(netns)
    try:
        node.delete(cid, netns)
    except MultusError:
        pass  # reported to the runtime while the window lasts
    # the window (1 ms) has passed before the test asks: on a fast python it may not have yet
    mark = delmarks.read(node.cni_dir, cid)
    assert mark is not None
    wait_for(lambda: mark.is_unreleased(), 5, what="the DEL window to pass")
    return netns


@pytest.fixture
def short_window(tmp_path, make_netns) -> ToolNode:
    return ToolNode(tmp_path, make_netns, delegates, deleteRetryWindow=0.001)


def test_an_unreleased_sandbox_is_listed_by_a_dry_run_and_not_retried(short_window, capsys):
    node = short_window
    make_unreleased(node, "held-1")
    deletes = len(node.del_calls())
    code, doc = gc_json(capsys, node, dry_run=True)
    assert code == common.EXIT_PROBLEM  # it needs the operator
    assert [d["containerId"] for d in doc["unreleased"]] == ["held-1"]
    assert doc["stale"] == []  # an unreleased sandbox is not also a stale one
    assert doc["unreleased"][0]["failedDelete"]["failures"][0]["network"] == "stuck"
    assert len(node.del_calls()) == deletes
    code, text = gc_text(capsys, node, dry_run=True)
    assert "unreleased: ns/web held-1, DEL failing since " in text
    assert "(1 attempt(s)): net1 (stuck): its daemon is down" in text and "(dry run)" in text


def test_an_unreleased_sandbox_gets_the_runtimes_del_again_until_it_is_released(
        short_window, capsys):
    node = short_window
    netns = make_unreleased(node, "held-1")
    deletes = len(node.del_calls())
    code, doc = gc_json(capsys, node)  # the cause is not fixed: it fails again
    assert code == common.EXIT_PROBLEM and doc["via"] == "in-process"
    assert doc["unreleased"][0]["released"] is False
    assert doc["unreleased"][0]["error"].startswith("DEL failed again: ")
    assert len(node.del_calls()) > deletes
    open(fixed(node), "w").close()  # the operator fixed it
    code, text = gc_text(capsys, node)
    assert code == common.EXIT_OK
    assert "released: ns/web held-1 (unreleased since " in text
    assert "released 1 of 1 unreleased sandbox(es) (in-process)" in text
    assert node.del_calls()[-1][1]["CNI_NETNS"] == netns  # the runtime's own request
    assert node.files() == []
    assert delmarks.read(node.cni_dir, "held-1") is None


# ---- --forget ---------------------------------------------------------------------------------

def test_forget_releases_what_it_can_and_drops_every_record(node, capsys):
    node.attach("stuck-1")
    code = gc.forget(node.config_path, "stuck-1", as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert code == common.EXIT_OK
    assert doc["pod"] == {"namespace": "ns", "name": "web"}
    # no daemon on the socket: run here, and said so
    assert doc["via"] == "in-process" and doc["viaReason"].startswith(
        f"multusd does not answer on {node.config.socket_path} (")
    assert doc["networks"] == [
        {"network": "cluster", "interface": "eth0", "released": True},
        {"network": "stuck", "interface": "net1", "released": False,
         "error": "its daemon is down"}]
    assert doc["recordsLeft"] == [] and node.files() == []


def test_forget_with_a_daemon_without_forget_runs_here_and_says_so(node, capsys):
    # upstream's daemon (or a multusd older than /forget) answers 404: run here, as before
    from upstreamd import UpstreamDaemon

    node.attach("stuck-1")
    upstream = UpstreamDaemon(node.config.socket_dir, {})
    try:
        code = gc.forget(node.config_path, "stuck-1")
    finally:
        upstream.stop()
    out = capsys.readouterr().out
    assert code == common.EXIT_OK and node.files() == []
    assert upstream.requests == ["GET /healthz", "POST /forget"]  # no DEL sent there
    assert out.startswith("run in this process, outside multusd's lanes: the daemon on "
                          f"{node.config.socket_path} has no /forget (upstream's, or an older "
                          "multusd): HTTP 404\n")
    assert "NOT released, record dropped: stuck (net1): its daemon is down" in out


def test_forget_the_daemon_refuses_is_not_run_here(node, capsys):
    node.attach("stuck-1")
    files = node.files()
    daemon = RecordingDaemon(node.config.socket_path, refuse="multusd is stopping: retry it")
    try:
        code = gc.forget(node.config_path, "stuck-1", as_json=True)
    finally:
        daemon.stop()
    assert code == common.EXIT_PROBLEM
    assert [(e["CNI_COMMAND"], e["CNI_CONTAINERID"]) for e in daemon.envs] == [
        ("DEL", "stuck-1")]
    assert daemon.endpoints == ["/forget"]
    assert "multusd could not forget sandbox stuck-1: multusd is stopping: retry it; nothing " \
        "was run here" in capsys.readouterr().err
    assert node.files() == files and node.del_calls() == []  # nothing released, nothing dropped


def test_forget_of_an_unknown_sandbox_names_what_to_give(node, capsys):
    assert gc.forget(node.config_path, "no-such") == common.EXIT_NOT_FOUND
    assert "no sandbox 'no-such' is recorded in " in capsys.readouterr().err


def test_a_config_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "daemon-config.json"
    path.write_text('{"cniDir": 7}')
    assert gc.run(str(path)) == common.EXIT_USAGE
    assert f"run `multusd check-config --config {path}`" in capsys.readouterr().err
