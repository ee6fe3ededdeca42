"""multusd.daemon.server: routing, probes, /status, the handler's contract, body limits, and
the CNI error JSON on every refusal.

The real :class:`Server` on a real unix socket, serving on a thread of this process; its
handler is the test's (the composition root hands the server one in the same way). Connection
limits, memory bounds, trickling clients and stop are tests/integration/test_connections.py's;
the real daemon's answers to the same edges are tests/integration/test_daemon.py's.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from multusd.daemon.httpreq import peek_env
from multusd.daemon.server import MAX_BODY, PROBE_BODY, STATUS_TIMEOUT, Server
from multusd.errors import DEFAULT_CNI_VERSION, InvalidNetworkConfig, NotReady, TryAgainLater
from multusd.wire import api
from testlib import raw_exchange, wait_for

CNI_ERROR_KEYS = {"cniVersion", "code", "msg", "details"}


def cni_body(command: str = "ADD", container_id: str = "c1") -> bytes:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": "eth0",
           "CNI_NETNS": "/var/run/netns/x"}
    return api.encode_request(env, b'{"cniVersion":"1.0.0","name":"n","type":"t"}')


class Handler:
    """Records each call (endpoint, body, seconds to its deadline, request id) and answers
    what :attr:`outcome` says: a value to return, or an exception to raise; a call waits for
    :attr:`gate`, or for the gate of its command in :attr:`gates`."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, bytes, float, str]] = []
        self.outcome: Any = {"Result": {"cniVersion": "1.1.0"}}
        self.gate: Optional[threading.Event] = None
        self.gates: Dict[str, threading.Event] = {}

    def __call__(self, endpoint: str, body: bytes, deadline: float, request_id: str) -> Any:
        self.calls.append((endpoint, body, deadline - time.monotonic(), request_id))
        gate = self.gate or self.gates.get(peek_env(body)[0])
        if gate is not None:
            assert gate.wait(60)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class Served:
    """The server, its handler, and what it reported through its callbacks."""

    def __init__(self, tmp_path, **options: Any) -> None:
        self.path = str(tmp_path / "multus.sock")
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.handler = Handler()
        self.ready = True
        self.observed: List[Tuple[str, str, int]] = []
        self.after = 0
        options.setdefault("workers", 2)
        self.server = Server(self.listener, self.handler,
                             readiness=lambda: self.ready,
                             after_request=self._after,
                             observe_http=lambda *answer: self.observed.append(answer),
                             describe=lambda: {"version": "test"}, **options)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _after(self) -> None:
        self.after += 1

    def call(self, method: str, path: str, body: bytes = b"") -> api.HTTPResponse:
        return api.http_request(self.path, method, path, body, timeout=30)

    def raw(self, data: bytes, half_close: bool = True) -> Tuple[int, dict, bytes]:
        """Send raw bytes; (status, headers, body) of the answer."""
        answer = raw_exchange(self.path, data, half_close=half_close)
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, body

    def close(self) -> None:
        for gate in [self.handler.gate, *self.handler.gates.values()]:
            if gate is not None:
                gate.set()
        self.server.stop()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def served(tmp_path) -> Iterator:
    made: List[Served] = []

    def make(**options: Any) -> Served:
        made.append(Served(tmp_path / str(len(made)) if made else tmp_path, **options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def cni_error(body: bytes) -> dict:
    error = json.loads(body)
    assert set(error) == CNI_ERROR_KEYS, error
    return error


# ---- the handler's contract ----------------------------------------------------------------

def test_a_cni_request_reaches_the_handler_whole_and_its_answer_is_json(served):
    node = served(request_timeout=40.0)
    body = cni_body()
    response = node.call("POST", api.CNI_ENDPOINT, body)
    assert (response.status, json.loads(response.body)) == \
        (200, {"Result": {"cniVersion": "1.1.0"}})
    (endpoint, got, left, request_id), = node.handler.calls
    assert (endpoint, got) == (api.CNI_ENDPOINT, body)
    assert 0 < left <= 40.0  # the request's deadline: request_timeout from its arrival
    assert len(request_id) == 16 and int(request_id, 16) >= 0


def test_a_delegate_request_goes_to_the_same_handler_with_its_endpoint(served):
    node = served()
    node.handler.outcome = None  # DEL, CHECK, ...: 200 with an empty body
    response = node.call("POST", api.DELEGATE_ENDPOINT, cni_body("DEL"))
    assert (response.status, response.body) == (200, b"")
    assert node.handler.calls[0][0] == api.DELEGATE_ENDPOINT


def test_every_request_has_its_own_id(served):
    node = served()
    for n in range(3):
        node.call("POST", api.CNI_ENDPOINT, cni_body(container_id=f"c{n}"))
    assert len({call[3] for call in node.handler.calls}) == 3


def test_a_cni_error_is_answered_400_as_the_handler_raised_it(served):
    node = served()
    node.handler.outcome = InvalidNetworkConfig("no 'type' in the delegate: add one", "net1")
    response = node.call("POST", api.CNI_ENDPOINT, cni_body())
    assert response.status == 400
    assert cni_error(response.body) == {"cniVersion": DEFAULT_CNI_VERSION, "code": 7,
                                        "msg": "no 'type' in the delegate: add one",
                                        "details": "net1"}


def test_any_other_exception_is_a_cni_error_and_logged_with_its_traceback(served, caplog):
    node = served()
    node.handler.outcome = KeyError("ifname")
    with caplog.at_level(logging.ERROR, logger="multusd.daemon.server"):
        response = node.call("POST", api.CNI_ENDPOINT, cni_body())
    assert response.status == 400
    error = cni_error(response.body)
    assert (error["code"], error["msg"]) == (100, "internal error: KeyError: 'ifname'")
    assert "failed unexpectedly" in caplog.text and "Traceback" in caplog.text
    node.handler.outcome = None
    assert node.call("POST", api.CNI_ENDPOINT, cni_body()).status == 200  # still serving


def test_outcomes_are_counted_and_reported_after_each_request(served):
    node = served()
    node.call("POST", api.CNI_ENDPOINT, cni_body())
    node.handler.outcome = TryAgainLater("later")
    node.call("POST", api.CNI_ENDPOINT, cni_body())
    assert node.server.runner.counted() == {"ok": 1, "failed": 1}
    assert node.after == 2
    wait_for(lambda: len(node.observed) == 2, what="both answers observed")
    assert node.observed == [("/cni", "POST", 200), ("/cni", "POST", 400)]


# ---- routing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,status", [
    ("GET", "/cni", 405), ("PUT", "/delegate", 405), ("PUT", "/healthz", 405),
    ("DELETE", "/readyz", 405), ("POST", "/status", 405), ("GET", "/nope", 404),
    ("POST", "/cni/", 404), ("GET", "/metrics", 404)])
def test_only_the_api_paths_and_methods_are_served(served, method, path, status):
    node = served()
    response = node.call(method, path)
    assert response.status == status
    assert response.body == (b"" if status == 404 else b"Method not allowed\n")
    assert node.handler.calls == []
    assert node.observed == [(path, method, status)]


def test_an_unknown_path_with_a_body_is_answered_and_the_body_read_away(served):
    node = served()
    status, headers, body = node.raw(b"POST /nope HTTP/1.1\r\nContent-Length: 100000\r\n\r\n"
                                     + b"x" * 100000)
    assert (status, body) == (404, b"")
    assert headers["connection"] == "close"


# ---- probes and /status -----------------------------------------------------------------------

def test_healthz_answers_200_whatever_the_readiness(served):
    node = served()
    node.ready = False
    for method in ("GET", "POST"):
        assert node.call(method, api.HEALTH_ENDPOINT).status == 200


def test_readyz_follows_readiness_and_a_stopping_daemon(served):
    node = served()
    assert node.call("POST", api.READY_ENDPOINT, b"null").status == 200  # upstream's shim
    node.ready = False
    assert node.call("GET", api.READY_ENDPOINT).status == 500  # after READY_HOLD
    node.ready = True
    node.server.ready = False  # what lifecycle sets at SIGTERM
    assert node.call("GET", api.READY_ENDPOINT).status == 500


def test_once_stopping_only_del_and_status_run_and_probes_are_answered(served):
    node = served()
    node.handler.outcome = None
    node.server.begin_stop()
    assert node.call("GET", api.READY_ENDPOINT).status == 500
    assert node.call("GET", api.HEALTH_ENDPOINT).status == 200
    for command in ("DEL", "STATUS"):
        assert node.call("POST", api.CNI_ENDPOINT, cni_body(command)).status == 200
    for endpoint, command in ((api.CNI_ENDPOINT, "ADD"), (api.CNI_ENDPOINT, "CHECK"),
                              (api.CNI_ENDPOINT, "GC"), (api.DELEGATE_ENDPOINT, "ADD")):
        response = node.call("POST", endpoint, cni_body(command))
        assert response.status == api.NOT_STARTED == 503  # not started: the shim resends it
        error = cni_error(response.body)
        assert error["code"] == 11
        assert error["msg"] == (f"multusd is stopping: {command} was not started; retry it "
                                "(the socket stays open: the next multusd serves it)")
    assert len(node.handler.calls) == 2  # the DEL and the STATUS
    assert node.server.runner.counted() == {"ok": 2, "failed": 4}


def test_once_refusing_no_request_runs_and_each_is_told_first(served):
    node = served()
    told = []
    node.server.runner.refuse("stopping now; retry", told.append)
    response = node.call("POST", api.CNI_ENDPOINT, cni_body("DEL", "c7"))
    assert response.status == api.NOT_STARTED  # not started (a DEL: the shim does not resend)
    assert (cni_error(response.body)["code"], cni_error(response.body)["msg"]) == \
        (11, "stopping now; retry")
    assert node.handler.calls == []
    (job,) = told
    assert (job.path, job.command, job.key) == (api.CNI_ENDPOINT, "DEL", "c7")


def test_a_probe_with_a_large_body_is_answered_at_once(served):
    node = served()
    status, _, _ = node.raw(b"POST /healthz HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                            % (PROBE_BODY * 4) + b"n" * (PROBE_BODY * 4))
    assert status == 200


def test_status_says_what_the_server_is_doing(served):
    node = served()
    node.call("POST", api.CNI_ENDPOINT, cni_body())
    wait_for(lambda: node.server.in_flight == 0, what="its connection to be closed")
    node.ready = False
    status = json.loads(node.call("GET", api.STATUS_ENDPOINT).body)
    assert status == {"requests": {"ok": 1, "failed": 0}, "inFlight": 0, "queued": 0,
                      "running": 0, "ready": False, "version": "test"}


def test_status_counts_requests_in_flight_but_itself(served):
    node = served()
    node.handler.gate = threading.Event()
    threading.Thread(target=lambda: node.call("POST", api.CNI_ENDPOINT, cni_body()),
                     daemon=True).start()
    wait_for(lambda: node.handler.calls, node.server.request_timeout, what="the request to run")
    status = json.loads(node.call("GET", api.STATUS_ENDPOINT).body)
    assert (status["inFlight"], status["running"]) == (1, 1)
    node.handler.gate.set()


# ---- body limits and malformed requests: the CNI error JSON ------------------------------------

def test_a_body_of_max_body_is_read_and_one_byte_more_is_refused_unread(served):
    node = served()
    node.handler.outcome = None
    exact = node.raw(b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % MAX_BODY
                     + b" " * MAX_BODY)
    assert exact[0] == 200 and node.handler.calls[0][1] == b" " * MAX_BODY
    status, _, body = node.raw(b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                               % (MAX_BODY + 1) + b" " * (MAX_BODY + 1))
    assert status == 400 and len(node.handler.calls) == 1
    error = cni_error(body)
    assert error["code"] == 6 and f"over the limit of {MAX_BODY} bytes" in error["msg"]


@pytest.mark.parametrize("data,code,words", [
    (b"POST /cni HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n{}", 6, "Content-Length"),
    (b"POST /cni HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n{}", 4, "no Content-Length"),
    (b"POST /cni\r\n\r\n", 6, "malformed HTTP request"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 6, "malformed HTTP request"),
], ids=["length", "encoding", "no-version", "tls-hello"])
def test_a_malformed_request_is_a_cni_error_and_never_runs(served, data, code, words):
    node = served()
    status, headers, body = node.raw(data)
    assert status == 400 and headers["content-type"] == "application/json"
    error = cni_error(body)
    assert error["code"] == code and words in error["msg"], error
    assert node.handler.calls == []
    assert node.call("GET", api.HEALTH_ENDPOINT).status == 200


def test_a_request_that_waited_past_its_deadline_is_answered_busy(served):
    node = served(workers=1, del_workers=1, request_timeout=0.5)
    node.handler.gate = threading.Event()
    answers: dict = {}

    def post(name: str, container_id: str) -> None:
        response = node.call("POST", api.CNI_ENDPOINT, cni_body("ADD", container_id))
        answers[name] = (response.status, response.body)

    first = threading.Thread(target=post, args=("first", "c1"), daemon=True)
    first.start()
    wait_for(lambda: node.handler.calls, what="the first request to hold the worker")
    second = threading.Thread(target=post, args=("second", "c2"), daemon=True)
    second.start()
    second.join(30)  # the sweep answers it once its deadline passed, the worker still held
    status, body = answers["second"]
    assert status == 400
    error = cni_error(body)
    assert error["code"] == 11 and "no worker became free within" in error["msg"]
    assert len(node.handler.calls) == 1
    node.handler.gate.set()
    first.join(30)
    assert answers["first"][0] == 200
    assert node.server.runner.counted()["failed"] == 1


# ---- STATUS and GC: bounded, shared, off the pod workers ---------------------------------------

def post_in_thread(node: Served, body: bytes, answers: list) -> threading.Thread:
    def post() -> None:
        response = node.call("POST", api.CNI_ENDPOINT, body)
        answers.append((response.status, response.body))

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def test_statuses_share_one_run_within_their_bound_and_hold_no_pod_worker(served):
    node = served(workers=1, del_workers=1)
    node.handler.outcome = None
    node.handler.gates["STATUS"] = threading.Event()
    answers: list = []
    callers = [post_in_thread(node, cni_body("STATUS", ""), answers) for _ in range(5)]
    wait_for(lambda: node.server.lanes.queued == 4, what="four STATUS joining the first's run")
    # the only general worker and the DEL lane's are free, probes are answered
    assert node.call("POST", api.CNI_ENDPOINT, cni_body("ADD", "c1")).status == 200
    assert node.call("POST", api.CNI_ENDPOINT, cni_body("DEL", "c2")).status == 200
    assert node.call("GET", api.HEALTH_ENDPOINT).status == 200

    def counts() -> tuple:  # (a worker gives its request back just after the answer)
        status = json.loads(node.call("GET", api.STATUS_ENDPOINT).body)
        return status["queued"], status["running"]

    wait_for(lambda: counts() == (4, 1), what="four STATUS waiting for the one running")
    node.handler.outcome = NotReady("its cluster network 'agent' did not answer STATUS")
    node.handler.gates["STATUS"].set()
    for caller in callers:
        caller.join(30)
    assert len(answers) == 5
    assert {(status, cni_error(body)["code"], cni_error(body)["msg"]) for status, body in answers} \
        == {(400, 50, "its cluster network 'agent' did not answer STATUS")}
    statuses = [call for call in node.handler.calls if peek_env(call[1])[0] == "STATUS"]
    assert len(statuses) == 1  # one run for the five
    assert 0 < statuses[0][2] <= STATUS_TIMEOUT  # its deadline: the STATUS bound, not 110 s
    assert node.server.runner.counted() == {"ok": 2, "failed": 5}
    assert node.server.lanes.threads() <= 1 + 1 + 1  # a general worker, a DEL one, STATUS's


def test_a_status_behind_another_run_past_its_bound_is_not_available_and_gc_is_not_bound_so(
        served):
    node = served(workers=1, del_workers=1, status_timeout=0.5)
    node.handler.outcome = None
    node.handler.gates["STATUS"] = threading.Event()
    first: list = []
    running = post_in_thread(node, cni_body("STATUS", ""), first)
    wait_for(lambda: node.handler.calls, what="the first STATUS running")
    late: list = []
    post_in_thread(node, cni_body("STATUS", "another"), late).join(30)  # another body
    ((status, body),) = late
    error = cni_error(body)
    assert (status, error["code"]) == (400, 50)
    assert "the STATUS of its cluster network did not answer in time" in error["msg"]
    assert len(node.handler.calls) == 1  # it never ran: one STATUS run at a time
    node.handler.gates["STATUS"].set()
    running.join(30)
    assert first == [(200, b"")]
    assert node.call("POST", api.CNI_ENDPOINT, cni_body("GC", "")).status == 200
    assert node.handler.calls[-1][2] > 0.5  # GC's deadline is the request deadline


def test_an_expect_100_continue_gets_its_go_ahead(served):
    node = served()
    node.handler.outcome = None
    body = cni_body("DEL")
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(node.path)
        conn.sendall(b"POST /cni HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        assert conn.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.sendall(body)
        assert conn.recv(100).startswith(b"HTTP/1.1 200 OK\r\n")
