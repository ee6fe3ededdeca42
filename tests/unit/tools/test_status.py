"""multusd.tools.status: what it says of the daemon, the node, the API and each sandbox, and
which findings are problems (exit 1).

Records written by the daemon's own ADD and DEL (tests/toolnode.py: stub delegates in real
namespaces). The daemon is absent, or the real server (multusd.daemon.server) on the config's
socket answering ``/status`` with the facts a daemon reports (its ``describe``), or a peer
without ``/status`` (upstream's daemon). The real daemon under systemd is
tests/integration/test_tools.py's and tests/system's. Off systemd, as on this test machine.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Dict, Iterator

import pytest

from multusd.config import generateconfig
from multusd.daemon.server import Server
from multusd.errors import MultusError
from multusd.tools import common, status
from toolnode import ToolNode, netns_gone

pytestmark = pytest.mark.privileged

ERROR = {"cniVersion": "1.0.0", "code": 11, "msg": "its daemon is down"}


def delegates(node: ToolNode) -> list:
    ok = {"interfaces": [{"name": "eth0"}], "ips": [{"address": "10.1.0.5/24", "interface": 0}]}
    return [node.stub("cluster", result=ok),
            node.stub("stuck", failDelUnless="/nonexistent/never", error=ERROR)]


@pytest.fixture
def node(tmp_path, make_netns) -> ToolNode:
    return ToolNode(tmp_path, make_netns, delegates, deleteRetryWindow=0.001,
                    nodeName="node-7")


def status_json(node: ToolNode, capsys) -> tuple:
    code = status.run(node.config_path, as_json=True)
    return code, json.loads(capsys.readouterr().out)


def status_text(node: ToolNode, capsys) -> tuple:
    code = status.run(node.config_path)
    return code, capsys.readouterr().out


class Daemon:
    """The real server on the config's socket, its /status from ``describe``."""

    def __init__(self, path: str, describe: Dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(8)
        self.server = Server(self.listener, lambda *request: None, workers=1,
                             describe=lambda: describe)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        self.listener.close()


@pytest.fixture
def daemon() -> Iterator:
    made = []

    def start(node: ToolNode, describe: Dict[str, Any]) -> Daemon:
        made.append(Daemon(node.config.socket_path, describe))
        return made[-1]

    yield start
    for one in made:
        one.stop()


FACTS = {"version": "9.9.9", "pid": 4242, "uptimeSeconds": 7300.5, "socketActivated": True,
         "nodeName": "node-from-daemon", "nodeNameSource": "MULTUS_NODE_NAME"}


def kube_facts(**overrides: Any) -> Dict[str, Any]:
    return dict({"server": "https://api.example:6443", "synced": True, "lastError": None,
                 "cachedPods": 12, "cachedNads": 3, "nadsSynced": True, "nadProblem": None},
                **overrides)


# ---- the daemon --------------------------------------------------------------------------------

def test_no_daemon_is_a_problem_that_says_how_to_start_it(node, capsys):
    code, doc = status_json(node, capsys)
    assert code == common.EXIT_PROBLEM
    assert doc["daemon"]["running"] is False
    reason = f"no socket at {node.config.socket_path}"
    assert doc["daemon"]["reason"] == reason
    assert f"the daemon is not running ({reason}): pods cannot be attached; start it " \
        "(`systemctl start multusd.socket`)" in doc["problems"]
    # resolved as the daemon would
    assert doc["node"] == {"name": "node-7", "source": "nodeName in daemon-config.json"}
    assert doc["api"]["summary"] == "not used (no kubeconfig in daemon-config.json)"
    code, text = status_text(node, capsys)
    assert f"daemon:     not running ({reason})" in text
    assert f"socket:     {node.config.socket_path} (absent)" in text


def test_a_running_daemon_is_described_by_its_status(node, daemon, capsys):
    daemon(node, dict(FACTS))
    code, doc = status_json(node, capsys)
    assert doc["daemon"]["running"] is True and doc["daemon"]["version"] == "9.9.9"
    assert doc["node"] == {"name": "node-from-daemon", "source": "MULTUS_NODE_NAME"}
    assert not any("not running" in p for p in doc["problems"])
    code, text = status_text(node, capsys)
    assert "daemon:     running, multusd 9.9.9, pid 4242, up 2h01m, socket-activated" in text
    assert "requests:   0 done, 0 failed, 0 in flight" in text
    assert "node:       node-from-daemon (from MULTUS_NODE_NAME)" in text


def test_a_daemon_without_status_answers_and_that_is_all(node, capsys):
    path = node.config.socket_path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def answer_404() -> None:  # upstream's daemon: no /status
        conn, _ = listener.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536):
                pass
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer_404, daemon=True)
    thread.start()
    try:
        code, doc = status_json(node, capsys)
    finally:
        thread.join(10)
        listener.close()
    assert doc["daemon"]["running"] is True
    assert doc["daemon"]["reason"] == "the daemon answers but has no /status (404)"
    assert not any("not running" in p for p in doc["problems"])


# ---- the API ------------------------------------------------------------------------------------

@pytest.fixture
def with_kubeconfig(tmp_path, make_netns, kube_api) -> ToolNode:
    return ToolNode(tmp_path, make_netns, delegates, kubeconfig=kube_api.kubeconfig_path)


def test_the_api_summary_is_the_daemons_cache_state(with_kubeconfig, daemon, capsys):
    daemon(with_kubeconfig, dict(FACTS, kube=kube_facts()))
    code, doc = status_json(with_kubeconfig, capsys)
    assert doc["api"]["summary"] == "https://api.example:6443: pod cache synced (12 pods, 3 NADs)"
    assert doc["problems"] == [] and code == common.EXIT_OK


def test_an_unsynced_cache_and_a_failing_nad_api_are_problems(with_kubeconfig, daemon, capsys):
    problem = {"condition": "crd-missing", "message": "the CRD is not installed; install it"}
    daemon(with_kubeconfig, dict(FACTS, kube=kube_facts(synced=False, lastError="pods: 503",
                                        nadProblem=problem)))
    code, doc = status_json(with_kubeconfig, capsys)
    assert code == common.EXIT_PROBLEM
    assert doc["api"]["summary"] == ("https://api.example:6443: pod cache NOT synced (12 pods, "
                                     "NAD API crd-missing); pods: 503")
    assert doc["problems"] == [
        "the daemon's pod cache has not synced (pods: 503): ADD waits; `multusd doctor` checks "
        "the API server",
        "pods that ask for a NetworkAttachmentDefinition fail: the CRD is not installed; "
        "install it"]


def test_the_api_while_the_daemon_is_stopped_is_unknown(with_kubeconfig, kube_api, capsys):
    code, doc = status_json(with_kubeconfig, capsys)
    assert doc["api"]["kubeconfig"] == kube_api.kubeconfig_path
    assert "cache state unknown while the daemon is not running" in doc["api"]["summary"]
    assert kube_api.requests == []  # status never asks the API server


# ---- sandboxes --------------------------------------------------------------------------------

def test_each_sandbox_is_one_row_and_stale_and_unreleased_ones_are_counted(node, daemon,
                                                                          capsys):
    daemon(node, dict(FACTS))
    node.attach("live0001")
    netns_gone(node.attach("stale001"))
    held = node.attach("held0001")
    netns_gone(held)
    try:
        node.delete("held0001", held)  # its window is over at once: answered success, kept
    except MultusError:
        pass
    code, doc = status_json(node, capsys)
    states = {s["containerId"]: (s["netnsState"], (s["failedDelete"] or {}).get("state"))
              for s in doc["sandboxes"]}
    assert states == {"live0001": ("present", None), "stale001": ("gone", None),
                      "held0001": ("gone", "unreleased")}
    held_problems = [p for p in doc["problems"] if "held0001" in p]
    assert len(held_problems) == 1 and "is UNRELEASED" in held_problems[0]
    assert "`multusd gc --forget held0001`" in held_problems[0]
    assert code == common.EXIT_PROBLEM
    code, text = status_text(node, capsys)
    assert "sandboxes:  3, 2 stale (netns gone: `multusd gc` lists them), 1 unreleased (DEL " \
        "failed past deleteRetryWindow: `multusd gc` retries them)" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("ns/web")}
    assert rows["live0001"].endswith("ok") and "eth0=cluster(10.1.0.5/24)" in rows["live0001"]
    assert rows["stale001"].endswith("GONE (stale)")
    assert rows["held0001"].endswith("GONE (stale), UNRELEASED")


def test_a_corrupt_scratch_cache_is_a_problem_naming_the_sandbox(node, daemon, capsys):
    daemon(node, dict(FACTS))
    node.attach("broken01")
    with open(os.path.join(node.cni_dir, "broken01"), "w") as handle:
        handle.write("{not json")
    code, doc = status_json(node, capsys)
    assert code == common.EXIT_PROBLEM
    assert any(p.startswith("sandbox broken01: ") for p in doc["problems"])


def test_the_runtimes_config_is_held_against_what_generate_config_writes(node, daemon,
                                                                         capsys):
    daemon(node, dict(FACTS))

    def conf_state() -> tuple:
        code, doc = status_json(node, capsys)
        problems = [p for p in doc["problems"] if "00-multus.conf" in p]
        return doc["multusConf"]["state"], problems

    assert conf_state() == ("waiting", [])  # no primary network yet: nothing to write
    with open(os.path.join(node.conf_dir, "10-primary.conflist"), "w") as handle:
        json.dump({"cniVersion": "1.0.0", "name": "primary",
                   "plugins": [{"type": "stub-record"}]}, handle)
    state, problems = conf_state()
    assert state == "missing" and len(problems) == 1
    assert "generate-config" in problems[0]
    assert generateconfig.run(node.config_path) == 0
    assert conf_state() == ("current", [])
    target = os.path.join(node.conf_dir, "00-multus.conf")
    with open(target, "a") as handle:
        handle.write(" ")
    assert conf_state()[0] == "differs"
    open(target, "w").close()
    assert conf_state()[0] == "empty"


def test_a_config_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "daemon-config.json"
    path.write_text("{")
    assert status.run(str(path)) == common.EXIT_USAGE
    assert "multusd status: " in capsys.readouterr().err
