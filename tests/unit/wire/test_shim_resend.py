"""The shim sends ADD, CHECK and GC again when the daemon did not start them (503: it is
stopping), once ``/readyz`` answers 200, within the readiness wait's bound; any other answer
(a 400 among them), and a DEL or STATUS, is the runtime's at once.

In process, against a daemon on a real unix socket that answers from a script: each ``/readyz``
and ``/cni`` answer in turn, every request it got kept in order. The real daemon's side (its
stop refusing an ADD that waited for a worker, the next daemon serving the resend) is
tests/integration/test_daemon_stop.py's.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import List, Tuple

import pytest

from multusd.errors import MultusError
from multusd.wire import api, shim

RESULT = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}], "ips": []}
STOPPING = {"cniVersion": "1.1.0", "code": 11,
            "msg": "multusd is stopping: ADD was not started; retry it (the socket stays open: "
                   "the next multusd serves it)"}
FAILED = {"cniVersion": "1.1.0", "code": 7, "msg": "the delegate failed"}


class ScriptedDaemon:
    """Answers ``/readyz`` with :attr:`ready` (then 200), ``/healthz`` 200 and ``/cni`` with
    :attr:`answers` (then 200 ``{"Result": ...}``), in turn; :attr:`got` holds (path,
    CNI_COMMAND) of each."""

    def __init__(self, path: str, answers: List[Tuple[int, dict]],
                 ready: Tuple[int, ...] = ()) -> None:
        self.answers = list(answers)
        self.ready = list(ready)
        self.got: List[Tuple[str, str]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines
                      if line.lower().startswith("content-length:"))
        while len(body) < length:
            body += conn.recv(65536)
        path = lines[0].split()[1]
        if path == api.HEALTH_ENDPOINT:
            self.got.append((path, ""))
            status, payload = 200, b""
        elif path == api.READY_ENDPOINT:
            self.got.append((path, ""))
            status, payload = (self.ready.pop(0) if self.ready else 200), b""
        else:
            self.got.append((path, json.loads(body)["env"]["CNI_COMMAND"]))
            status, answer = self.answers.pop(0) if self.answers else (200, {"Result": RESULT})
            payload = json.dumps(answer).encode()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(payload)}\r\n"
                     "Connection: close\r\n\r\n".encode() + payload)

    def posts(self) -> List[str]:
        return [command for path, command in self.got if path == api.CNI_ENDPOINT]

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close would not)
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def scripted(tmp_path):
    made: List[ScriptedDaemon] = []

    def make(answers, ready=()) -> ScriptedDaemon:
        made.append(ScriptedDaemon(str(tmp_path / "multus.sock"), answers, ready))
        return made[-1]

    yield make
    for daemon in made:
        daemon.close()


def call(tmp_path, command: str) -> tuple:
    """The shim's ``run`` as the runtime calls it (marks of a failed DEL under tmp_path)."""
    conf = {"cniVersion": "1.1.0", "name": "multus-cni-network", "type": "multus-shim",
            "daemonSocketDir": str(tmp_path), "cniDir": str(tmp_path / "cni")}
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p"}
    return shim.run(env, json.dumps(conf).encode())


def test_an_add_the_daemon_did_not_start_is_sent_again_once_it_is_ready(scripted, tmp_path):
    daemon = scripted([(api.NOT_STARTED, STOPPING)], ready=(200, 500, 500))
    code, output = call(tmp_path, "ADD")
    assert (code, output) == (0, RESULT)
    readyz = (api.READY_ENDPOINT, "")
    assert daemon.got == [readyz, (api.CNI_ENDPOINT, "ADD"),  # refused: not started
                          readyz, readyz, readyz,            # stopping, then the next daemon
                          (api.CNI_ENDPOINT, "ADD")]


@pytest.mark.parametrize("command", ["CHECK", "GC"])
def test_check_and_gc_are_sent_again_too(scripted, tmp_path, command):
    daemon = scripted([(api.NOT_STARTED, STOPPING), (api.NOT_STARTED, STOPPING)])
    assert call(tmp_path, command) == (0, None)
    assert daemon.posts() == [command] * 3


def test_a_failure_the_daemon_answers_400_is_not_sent_again(scripted, tmp_path):
    daemon = scripted([(400, FAILED)])
    code, output = call(tmp_path, "ADD")
    assert code == 1 and (output["code"], output["msg"]) == (7, "the delegate failed")
    assert daemon.posts() == ["ADD"]


@pytest.mark.parametrize("command", ["DEL", "STATUS"])
def test_a_del_or_status_the_daemon_did_not_start_is_not_sent_again(scripted, tmp_path,
                                                                      command):
    daemon = scripted([(api.NOT_STARTED, STOPPING)])
    code, output = call(tmp_path, command)
    assert code == 1 and output["code"] == 11 and output["msg"] == STOPPING["msg"]
    assert daemon.posts() == [command]


def test_resending_ends_with_the_daemons_refusal_once_the_readiness_bound_passed(scripted,
                                                                                 tmp_path):
    daemon = scripted([(api.NOT_STARTED, STOPPING)] * 10_000)
    conf = shim.parse_config(b"{}")
    with pytest.raises(MultusError) as caught:  # the daemon's own error, forwarded
        shim.post_when_ready(conf, str(tmp_path / "multus.sock"), {"CNI_COMMAND": "ADD"},
                             b"{}", timeout=0.3)
    assert (caught.value.code, caught.value.msg) == (11, STOPPING["msg"])
    assert 1 <= len(daemon.posts()) < 10_000
