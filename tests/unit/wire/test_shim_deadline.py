"""The shim's call to the daemon is bounded whole: requestTimeout plus a margin, then a CNI
error that names the socket, the time waited and what to check.

Over real unix sockets: a daemon that never answers, one that answers a byte at a time, one
that answers once the shim has decided to wait longer.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from multusd.errors import NotReady, TryAgainLater
from multusd.wire import api, shim

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{\"Result\": null}"


class Daemon:
    """A unix-socket daemon that reads a request, then waits for :attr:`release` and answers
    one byte every ``interval`` (0: at once); every connection is closed at :meth:`stop`."""

    def __init__(self, path: str, interval: float = 0.0) -> None:
        self.path, self.interval = path, interval
        self.release = threading.Event()
        self.stopped = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            while not self.release.wait(0.05):
                if self.stopped.is_set():
                    return
            try:
                if not self.interval:
                    conn.sendall(ANSWER)
                    return
                for index in range(len(ANSWER)):
                    if self.stopped.wait(self.interval):
                        return
                    conn.sendall(ANSWER[index:index + 1])
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def daemon(tmp_path):
    made = []

    def make(interval: float = 0.0) -> Daemon:
        made.append(Daemon(str(tmp_path / f"multus{len(made)}.sock"), interval))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def test_a_daemon_that_does_not_answer_is_a_cni_error_naming_its_socket(daemon):
    silent = daemon()
    with pytest.raises(TryAgainLater) as caught:
        shim.post_cni(silent.path, {"CNI_COMMAND": "ADD"}, b"{}", timeout=0.3)
    msg = caught.value.msg
    assert f"multusd did not answer the ADD request on {silent.path} within" in msg
    assert "systemctl status multusd.socket multusd" in msg and "journalctl -u multusd" in msg


def test_a_status_the_daemon_does_not_answer_is_not_ready_code_50(daemon):
    silent = daemon()
    with pytest.raises(NotReady) as caught:
        shim.post_cni(silent.path, {"CNI_COMMAND": "STATUS"}, b"{}", timeout=0.3,
                      not_ready=True)
    assert caught.value.code == 50
    assert f"multusd did not answer the STATUS request on {silent.path} within" in \
        caught.value.msg


def test_a_status_waits_seconds_for_its_answer_never_the_request_timeout():
    assert shim.STATUS_TIMEOUT <= 5.0 < shim.REQUEST_TIMEOUT


def test_a_daemon_that_answers_a_byte_at_a_time_is_cut_at_the_timeout_not_per_read(daemon):
    slow = daemon(interval=0.05)  # each read is quick; the whole answer takes ~4 s
    slow.release.set()
    with pytest.raises(api.Timeout):
        api.http_request(slow.path, "POST", api.CNI_ENDPOINT, b"{}", timeout=0.5)


def test_a_longer_request_timeout_is_waited_for_once_the_default_passed(daemon):
    late = daemon()
    asked = []

    def extend() -> float:  # the default has passed: the daemon may take longer
        asked.append(time.monotonic())
        late.release.set()  # ... and it answers in the time granted
        return 30.0

    response = api.http_request(late.path, "POST", api.CNI_ENDPOINT, b"{}", timeout=0.3,
                                extend=extend)
    assert response.status == 200 and len(asked) == 1


def test_no_longer_timeout_means_the_call_ends(daemon):
    silent = daemon()
    with pytest.raises(api.Timeout):
        api.http_request(silent.path, "POST", api.CNI_ENDPOINT, b"{}", timeout=0.3,
                         extend=lambda: 0.0)


def test_the_message_says_which_request_timeout_and_margin_it_waited_for():
    msg = shim.no_answer_message("/run/multus/multus.sock", "DEL", 120.2, 110.0)
    assert msg.startswith("multusd did not answer the DEL request on /run/multus/multus.sock "
                          "within 120s (its requestTimeout, 110s, and a margin of 10s)")


def test_the_default_bound_keeps_an_add_inside_the_kubelets_two_minutes():
    assert shim.REQUEST_TIMEOUT + shim.ANSWER_MARGIN <= 120.0


@pytest.mark.parametrize("config,seconds", [
    ({"requestTimeout": 300}, 300.0), ({"requestTimeout": 12.5}, 12.5), ({}, None),
    ({"requestTimeout": True}, None), ({"requestTimeout": -1}, None),
    ({"requestTimeout": "300"}, None), ([], None),
])
def test_the_daemons_request_timeout_is_read_from_its_config(tmp_path, config, seconds):
    path = tmp_path / "daemon-config.json"
    path.write_text(json.dumps(config))
    assert shim.DaemonFile(str(path)).request_timeout() == seconds


def test_an_unreadable_daemon_config_is_no_request_timeout(tmp_path):
    assert shim.DaemonFile(str(tmp_path / "absent.json")).request_timeout() is None
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert shim.DaemonFile(str(broken)).request_timeout() is None


def test_daemon_config_is_read_once_per_shim_run_whatever_asks(tmp_path):
    path = tmp_path / "daemon-config.json"
    path.write_text(json.dumps({"requestTimeout": 300, "cniDir": "/d"}))
    daemon = shim.DaemonFile(str(path))  # one per run: requestTimeout, then a failed DEL's mark

    assert daemon.request_timeout() == 300.0
    path.write_text(json.dumps({"requestTimeout": 5}))
    assert daemon.doc() == {"requestTimeout": 300, "cniDir": "/d"} and \
        daemon.request_timeout() == 300.0
    assert shim.DaemonFile(str(tmp_path / "absent.json")).doc() == {}
    path.write_text("[]")
    assert shim.DaemonFile(str(path)).doc() == {}
