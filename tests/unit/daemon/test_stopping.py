"""multusd.daemon.stopping: the stop's one budget (and multusd.service's TimeoutStopSec beside
it), the drain, the cut (plugins killed, requests not run refused, DELs recorded), the exit.

The real :class:`~multusd.daemon.server.Server` on a real unix socket, with the test's handler
running real stub plugins (tests/stubs) through a real
:class:`~multusd.cni.invoke.RunningPlugins`; a short budget stands for the daemon's 20 s. The
real daemon's stop under a hung plugin is tests/integration/test_daemon_stop.py's.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from typing import Any, Dict, Iterator, List

import pytest

from harness import REPO, STUBS, NotifyListener
from multusd.cni import invoke
from multusd.config import daemonconf
from multusd.core import delmarks
from multusd.daemon.server import Server
from multusd.daemon.stopping import CUT_GRACE, STOP_TIMEOUT, UNIT_MARGIN, Stop
from multusd.wire import api
from testlib import wait_for

SHIM_CONF = b'{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim"}'


def test_the_units_timeout_stop_sec_is_the_stop_budget_plus_its_margin():
    with open(os.path.join(REPO, "systemd", "multusd.service")) as handle:
        unit = handle.read()
    (value,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert float(value) == STOP_TIMEOUT + UNIT_MARGIN
    assert 0 < CUT_GRACE < STOP_TIMEOUT and UNIT_MARGIN >= 5


def body(command: str, cid: str) -> bytes:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
           "CNI_NETNS": "", "CNI_ARGS": f"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p-{cid};"
                                        f"K8S_POD_UID=u-{cid}"}
    return api.encode_request(env, SHIM_CONF)


class Node:
    """A server whose handler runs ``stub-hang`` for each container named in :attr:`hang`
    (through :attr:`running`) and waits on :attr:`gates` for those named there."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.cni_dir = str(tmp_path / "cni")
        self.socket_dir = str(tmp_path / "run")  # never the host's (marks may go there too)
        self.config = daemonconf.from_dict({"cniDir": self.cni_dir, "deleteRetryWindow": 300,
                                            "socketDir": self.socket_dir,
                                            "delegates": [{"cniVersion": "0.3.1", "name": "n",
                                                           "type": "loopback"}]})
        self.running = invoke.RunningPlugins()
        self.hang: List[str] = []
        self.gates: Dict[str, threading.Event] = {}
        self.started: List[str] = []
        self.path = str(tmp_path / "multus.sock")
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.server = Server(self.listener, self.handle, workers=1, del_workers=1)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.answers: Dict[str, Any] = {}

    def handle(self, endpoint: str, data: bytes, deadline: float, request_id: str) -> None:
        env = json.loads(data)["env"]
        cid = env["CNI_CONTAINERID"]
        self.started.append(cid)
        if cid in self.gates:
            assert self.gates[cid].wait(60)
        if cid in self.hang:
            invoke.exec_plugin(os.path.join(STUBS, "stub-hang"), command=env["CNI_COMMAND"],
                               stdin=json.dumps({"pidFile": str(self.tmp_path / cid)}).encode(),
                               env={"CNI_COMMAND": "DEL"}, deadline=deadline,
                               running=self.running)
        return None

    def send(self, name: str, command: str, cid: str) -> threading.Thread:
        def post() -> None:
            self.answers[name] = api.http_request(self.path, "POST", api.CNI_ENDPOINT,
                                                  body(command, cid), timeout=60)
        thread = threading.Thread(target=post, daemon=True)
        thread.start()
        return thread

    def error(self, name: str, status: int = 400) -> tuple:
        """(code, msg) of the answer to ``name``, which has ``status`` (503: not started)."""
        answer = self.answers[name]
        assert answer.status == status, (name, answer.status, answer.body)
        error = json.loads(answer.body)
        return error["code"], error["msg"]

    def stop(self, **options: Any) -> Stop:
        return Stop(self.server, self.running, self.config, **options)

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        self.running.end_all("the test ends")
        self.server.stop()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    made = Node(tmp_path)
    yield made
    made.close()


def test_an_idle_stop_tells_systemd_its_budget_and_ends_at_once(node, tmp_path, monkeypatch):
    with NotifyListener(str(tmp_path / "notify.sock")) as notify:
        monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
        stop = node.stop()
        stop.begin("received SIGTERM")
        message = notify.receive_until("STOPPING=1")
    assert f"EXTEND_TIMEOUT_USEC={int(STOP_TIMEOUT * 1_000_000)}" in message
    assert "STATUS=stopping: received SIGTERM" in message
    node.thread.join(30)  # nothing to drain: the reactor ended, long before the budget
    assert not node.thread.is_alive()
    stop.finish()
    assert not stop.cut_done and stop.recorded == []


def test_while_draining_a_del_is_served_and_an_add_refused(node):
    node.gates["slow"] = threading.Event()
    slow = node.send("slow", "ADD", "slow")
    wait_for(lambda: node.started == ["slow"], node.server.request_timeout,
             what="the ADD running")
    stop = node.stop(budget=3600.0)
    stop.begin("received SIGTERM")
    node.send("del", "DEL", "other").join(30)
    assert node.answers["del"].status == 200
    node.send("add", "ADD", "new").join(30)
    code, msg = node.error("add", api.NOT_STARTED)
    assert code == 11 and "multusd is stopping" in msg
    assert node.started == ["slow", "other"]
    node.gates["slow"].set()  # the running request finishes: the stop ends without a cut
    node.thread.join(30)
    slow.join(30)  # the answer was sent before the server ended; its reader may still be parsing
    stop.finish()
    assert node.answers["slow"].status == 200 and not stop.cut_done


def test_the_cut_kills_the_plugins_refuses_what_waits_and_records_the_dels(node):
    node.hang += ["hung-add", "hung-del"]
    sent = [node.send("hung-add", "ADD", "hung-add")]
    # a plugin starts within its request's deadline (or fails by it, and the request ends)
    wait_for(lambda: node.running.running() == ["stub-hang ADD"] or not sent[0].is_alive(),
             node.server.request_timeout, what="the ADD hanging")
    sent.append(node.send("hung-del", "DEL", "hung-del"))
    wait_for(lambda: len(node.running.running()) == 2 or not sent[1].is_alive(),
             node.server.request_timeout, what="the DEL hanging too")
    assert len(node.running.running()) == 2, node.answers
    sent += [node.send("retry", "DEL", "hung-del"),   # parked behind its sandbox's DEL
             node.send("queued", "CHECK", "other")]   # waiting for the busy general worker
    wait_for(lambda: node.server.lanes.queued == 2, node.server.request_timeout,
             what="two requests waiting")
    stop = node.stop(budget=2.0, cut_grace=1.0)
    stop.begin("received SIGTERM")
    node.thread.join(30)
    stop.finish()
    for thread in sent:
        thread.join(30)
    assert stop.cut_done
    for name, command in (("hung-add", "ADD"), ("hung-del", "DEL")):
        code, msg = node.error(name)
        assert code == 11
        assert f"{command} was killed: multusd stopped it at its stop deadline" in msg
    for name in ("retry", "queued"):
        code, msg = node.error(name, api.NOT_STARTED)  # 400 for the two that ran
        assert code == 11
        assert msg.startswith("multusd is stopping (its stop deadline, 2s after the signal, "
                              "is near): the request was not run; retry it")
    assert node.started == ["hung-add", "hung-del"]  # what waited never ran
    assert stop.recorded == ["hung-del"]  # the DEL that never ran; the CHECK is no DEL
    mark = delmarks.read(node.cni_dir, "hung-del")
    assert (mark.by, mark.pod, mark.attempts) == ("daemon", "ns/p-hung-del", 1)
    assert mark.error.startswith("multusd is stopping (its stop deadline")
    assert mark.request["env"]["CNI_COMMAND"] == "DEL"  # to be run again as the runtime sent it
    assert node.running.running() == []


def test_a_del_still_running_at_the_deadline_is_recorded_before_the_exit(node):
    node.gates["stuck"] = threading.Event()  # held outside any plugin: the cut cannot end it
    node.send("stuck", "DEL", "stuck")
    wait_for(lambda: node.started == ["stuck"], node.server.request_timeout,
             what="the DEL running")
    stop = node.stop(budget=1.0, cut_grace=0.5)
    stop.begin("received SIGTERM")
    node.thread.join(30)
    stop.finish()  # returns at the deadline although the DEL still runs
    assert "stuck" not in node.answers
    assert stop.recorded == ["stuck"]
    assert delmarks.read(node.cni_dir, "stuck").error == \
        "multusd stopped at its stop deadline while this DEL ran"


def test_a_request_still_waiting_at_the_exit_is_answered_not_started(node):
    node.gates["stuck"] = threading.Event()  # held outside any plugin: the cut cannot end it
    node.send("stuck", "DEL", "stuck")
    wait_for(lambda: node.started == ["stuck"], node.server.request_timeout,
             what="the DEL running")
    waiting = node.send("later", "CHECK", "stuck")  # parked behind its sandbox's DEL
    wait_for(lambda: node.server.lanes.queued == 1, node.server.request_timeout,
             what="the CHECK waiting")
    stop = node.stop(budget=1.0, cut_grace=0.5)
    stop.begin("received SIGTERM")
    node.thread.join(30)
    stop.finish()
    waiting.join(30)
    code, msg = node.error("later", api.NOT_STARTED)  # nothing done for it: it may be resent
    assert code == 11 and msg.startswith("multusd stopped before this request could run")
    assert node.started == ["stuck"]


def test_a_del_that_cannot_be_recorded_is_said_and_the_stop_goes_on(node, caplog):
    os.makedirs(node.cni_dir)
    for path in (os.path.join(node.cni_dir, ".multusd-unreleased"), node.socket_dir):
        with open(path, "w") as handle:
            handle.write("a file where a directory of marks should be")
    node.gates["stuck"] = threading.Event()
    node.send("stuck", "DEL", "stuck")
    wait_for(lambda: node.started == ["stuck"], node.server.request_timeout,
             what="the DEL running")
    stop = node.stop(budget=1.0, cut_grace=0.5)
    stop.begin("received SIGTERM")
    node.thread.join(30)
    stop.finish()
    assert stop.recorded == []
    assert "stop: a DEL cut short could not be recorded" in caplog.text


def test_record_ignores_what_is_not_a_sandbox_del(node):
    from multusd.daemon.lanes import Job

    stop = node.stop()
    for path, command in ((api.CNI_ENDPOINT, "ADD"), (api.DELEGATE_ENDPOINT, "DEL")):
        stop.record(Job(None, path, "POST", body(command, "c9"), 0.0, command, "c9"), "why")
    assert stop.recorded == [] and delmarks.read_all(node.cni_dir) == {}


def test_a_reconciliation_still_waiting_at_the_exit_is_dropped_not_answered(node):
    import math

    from multusd.daemon.lanes import Job

    node.gates["stuck"] = threading.Event()
    node.send("stuck", "DEL", "stuck")
    wait_for(lambda: node.started == ["stuck"], node.server.request_timeout,
             what="the DEL running")
    ran: List[Job] = []
    task = Job(None, "", "", b"", math.inf, "RECONCILE", "stuck", task=ran.append)
    assert node.server.lanes.submit(task)  # parked behind its sandbox's DEL: no connection
    stop = node.stop(budget=1.0, cut_grace=0.5)
    stop.begin("received SIGTERM")
    node.thread.join(30)
    stop.finish()  # answers what waits: a task has no client to answer
    assert stop.recorded == ["stuck"] and ran == []
    assert node.server.lanes.jobs()[1] == []
