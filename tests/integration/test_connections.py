"""Issue 21: connections never starve the node; issue 20: a refused request is read away.

The real Server on a real unix socket in this process (its handler records what it ran and
can be held), and the real daemon under socket activation. Outcomes only: what was answered,
with what, in which order; never how fast.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from harness import call_shim
from testlib import wait_for
from multusd.daemon.httpreq import READ_TIMEOUT
from multusd.daemon.server import Server
from multusd.wire import api


def cni_body(command: str, container_id: str) -> bytes:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": "eth0",
           "CNI_NETNS": "/var/run/netns/x", "CNI_ARGS": "K8S_POD_NAMESPACE=d;K8S_POD_NAME=p"}
    return api.encode_request(env, b'{"cniVersion": "1.0.0", "name": "n", "type": "t"}')


class Recorder:
    """The handler: records (command, container ID) as each request starts; a request whose
    pair is in ``hold`` waits until that event is set."""

    def __init__(self) -> None:
        self.started: list = []
        self.finished: list = []
        self.hold: dict = {}
        self._lock = threading.Lock()

    def __call__(self, endpoint, body, deadline, request_id):
        env = json.loads(body)["env"]
        pair = (env["CNI_COMMAND"], env["CNI_CONTAINERID"])
        with self._lock:
            self.started.append(pair)
        gate = self.hold.get(pair)
        if gate is not None:
            assert gate.wait(60), f"{pair} was held for too long"
        with self._lock:
            self.finished.append(pair)
        return {"Result": {"cniVersion": "1.0.0"}} if pair[0] == "ADD" else None


class InProcessServer:
    """The real Server on a real unix socket, serving on a thread of this process."""

    def __init__(self, tmp_path, handler=None, **kw) -> None:
        self.path = str(tmp_path / "s.sock")
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(256)
        self.handler = handler or Recorder()
        kw.setdefault("workers", 2)
        self.server = Server(self.listener, self.handler, **kw)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.answers: dict = {}
        self._clients: list = []
        # the longest a request takes to be taken in, run and answered: the server answers
        # each by its deadline (run, or "busy"), its answer written within READ_TIMEOUT
        self.bound = self.server.request_timeout + READ_TIMEOUT

    def get(self, path: str) -> int:
        return api.http_request(self.path, "GET", path, timeout=30).status

    def post(self, name: str, command: str, container_id: str,
             body: bytes = b"") -> threading.Thread:
        """POST a /cni request on a thread; its (status, body) lands in ``answers[name]``."""
        def send() -> None:
            response = api.http_request(self.path, "POST", "/cni",
                                        body or cni_body(command, container_id),
                                        timeout=self.bound)
            self.answers[name] = (response.status, response.body)
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        self._clients.append(thread)
        return thread

    def answered(self, name: str) -> tuple:
        wait_for(lambda: name in self.answers, self.bound, what=f"the answer to {name}")
        return self.answers[name]

    def close(self) -> None:
        for gate in getattr(self.handler, "hold", {}).values():
            gate.set()
        for thread in self._clients:
            thread.join(30)
        self.server.stop()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def served(tmp_path):
    made = []

    def make(**kw) -> InProcessServer:
        made.append(InProcessServer(tmp_path, **kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


def idle_connections(path: str, count: int) -> list:
    """``count`` connections that connect and send nothing (a stuck or killed runtime)."""
    conns = []
    for _ in range(count):
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(30)
        conn.connect(path)
        conns.append(conn)
    return conns


def closed_by_server(conn: socket.socket) -> bool:
    try:
        return conn.recv(100) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_do_not_stop_probes_or_a_del(served):
    server = served()
    idle = idle_connections(server.path, 100)
    try:
        wait_for(lambda: server.server.in_flight == 100, 10, what="the idle connections")
        assert server.get("/healthz") == 200
        assert server.get("/readyz") == 200
        server.post("del", "DEL", "c1")
        assert server.answered("del") == (200, b"")
        assert server.handler.finished == [("DEL", "c1")]
    finally:
        for conn in idle:
            conn.close()


def test_at_the_cap_the_oldest_idle_connection_makes_room(served):
    server = served(max_connections=8)
    idle = idle_connections(server.path, 20)  # 12 of them wait in the backlog
    try:
        assert server.get("/healthz") == 200
        server.post("del", "DEL", "c1")
        assert server.answered("del") == (200, b"")
        assert server.server.in_flight <= 8
        assert closed_by_server(idle[0])  # the oldest idle one made room
    finally:
        for conn in idle:
            conn.close()


def test_a_connection_that_sends_no_head_is_closed_unanswered(served):
    server = served(head_timeout=1.0)
    conn = idle_connections(server.path, 1)[0]
    partial = idle_connections(server.path, 1)[0]
    try:
        partial.sendall(b"GET /healthz HTTP/1.1\r\n")  # a head that never ends
        assert conn.recv(100) == b""
        answer = partial.recv(1000)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == 11
        wait_for(lambda: server.server.in_flight == 0, 10, what="both connections closed")
    finally:
        conn.close()
        partial.close()


def test_a_trickled_request_is_cut_at_the_read_deadline(served):
    server = served(read_timeout=1.0)
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(server.path)
        conn.settimeout(30)
        sent = 0
        answer = b""
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"y" * 2000:
            try:
                conn.sendall(bytes([byte]))
                sent += 1
            except OSError:
                break
            conn.settimeout(0.05)  # the client's pace: 20 bytes/s
            try:
                answer = conn.recv(1000)
                break
            except socket.timeout:
                pass
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert sent < 2000  # cut before the head was done, however slowly it came


def test_probes_and_a_del_answer_while_every_worker_is_busy(served):
    recorder = Recorder()
    server = served(handler=recorder, workers=2, del_workers=1)
    for name in ("a", "b", "c"):
        recorder.hold[("ADD", name)] = threading.Event()
        server.post(name, "ADD", name)
    wait_for(lambda: len(recorder.started) == 2, server.bound, what="two ADDs running")
    wait_for(lambda: server.server.lanes.queued == 1, server.bound, what="the third ADD waiting")
    assert server.get("/healthz") == 200
    assert server.get("/readyz") == 200
    status = json.loads(api.http_request(server.path, "GET", "/status", timeout=30).body)
    assert (status["running"], status["queued"]) == (2, 1)
    server.post("del", "DEL", "d")
    assert server.answered("del") == (200, b"")
    assert not set(server.answers) & {"a", "b", "c"}  # the ADDs are still held
    for gate in recorder.hold.values():
        gate.set()
    for name in ("a", "b", "c"):
        assert server.answered(name)[0] == 200
    assert recorder.finished[0] == ("DEL", "d")


def test_one_sandbox_runs_in_order_and_its_waiting_del_holds_no_thread(served):
    recorder = Recorder()
    server = served(handler=recorder, workers=1, del_workers=1)
    recorder.hold[("ADD", "c1")] = threading.Event()
    server.post("add", "ADD", "c1")
    wait_for(lambda: recorder.started == [("ADD", "c1")], server.bound, what="the ADD running")
    server.post("del1", "DEL", "c1")
    wait_for(lambda: server.server.lanes.queued == 1, server.bound, what="its DEL waiting")
    server.post("del2", "DEL", "c2")  # the DEL lane is free: c1's DEL waits without it
    assert server.answered("del2") == (200, b"")
    assert "del1" not in server.answers
    recorder.hold[("ADD", "c1")].set()
    assert server.answered("add")[0] == 200
    assert server.answered("del1") == (200, b"")
    assert recorder.started == [("ADD", "c1"), ("DEL", "c2"), ("DEL", "c1")]


def test_one_sandbox_at_a_time_however_its_container_id_is_spelled(served):
    """The lanes alone hold one sandbox's requests apart (no lock in the handler): a body that
    spells the key with a JSON escape is the same sandbox's, and waits for its ADD."""
    recorder = Recorder()
    server = served(handler=recorder, workers=2, del_workers=1)
    recorder.hold[("ADD", "c1")] = threading.Event()
    server.post("add", "ADD", "c1")
    wait_for(lambda: recorder.started == [("ADD", "c1")], server.bound, what="the ADD running")
    escaped = cni_body("CHECK", "c1").replace(b'"CNI_CONTAINERID"', b'"CNI\\u005fCONTAINERID"')
    assert escaped != cni_body("CHECK", "c1")
    server.post("check", "CHECK", "c1", body=escaped)
    lanes = server.server.lanes
    wait_for(lambda: lanes.queued + lanes.running == 2, server.bound, what="the CHECK taken in")
    # a request behind it in the general lane: once it has run, a free worker took the CHECK
    # before it (the lane is first come, first served) unless the CHECK waits for its sandbox
    server.post("other", "ADD", "c2")
    assert server.answered("other")[0] == 200
    assert ("CHECK", "c1") not in recorder.started and "check" not in server.answers
    recorder.hold[("ADD", "c1")].set()
    assert server.answered("add")[0] == 200 and server.answered("check") == (200, b"")
    assert recorder.started == [("ADD", "c1"), ("ADD", "c2"), ("CHECK", "c1")]


def test_waiting_requests_are_bounded(served):
    recorder = Recorder()
    server = served(handler=recorder, workers=1, del_workers=1, max_queued=1)
    recorder.hold[("ADD", "a")] = threading.Event()
    server.post("a", "ADD", "a")
    wait_for(lambda: recorder.started == [("ADD", "a")], server.bound, what="the ADD running")
    server.post("b", "ADD", "b")
    wait_for(lambda: server.server.lanes.queued == 1, server.bound, what="the second ADD waiting")
    server.post("c", "ADD", "c")
    status, body = server.answered("c")
    error = json.loads(body)
    assert status == 400 and error["code"] == 11 and "busy" in error["msg"], error
    recorder.hold[("ADD", "a")].set()
    assert server.answered("a")[0] == 200 and server.answered("b")[0] == 200
    assert ("ADD", "c") not in recorder.started


def test_request_memory_is_bounded_in_all(served):
    recorder = Recorder()
    server = served(handler=recorder, max_buffered=64 * 1024)
    big = api.http_request(server.path, "POST", "/cni", b"x" * (100 * 1024), timeout=30)
    error = json.loads(big.body)
    assert big.status == 400 and error["code"] == 11 and "busy" in error["msg"], error
    server.post("small", "DEL", "c1")
    assert server.answered("small") == (200, b"")
    assert recorder.started == [("DEL", "c1")]


def test_a_declared_body_holds_its_share_of_the_bound_before_it_arrives(served):
    recorder = Recorder()
    server = served(handler=recorder, max_buffered=64 * 1024)
    body = cni_body("ADD", "c1") + b" " * (40 * 1024)
    head = b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n" % len(body)
    with socket.socket(socket.AF_UNIX) as first:
        first.settimeout(30)
        first.connect(server.path)
        first.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert first.recv(100).startswith(b"HTTP/1.1 100 ")  # its head is read and routed
        other = cni_body("ADD", "c2") + b" " * (30 * 1024)  # would fit alone
        answer = send_and_read(server.path, b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n"
                               b"\r\n%s" % (len(other), other))
        error = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert answer.startswith(b"HTTP/1.1 400 ") and error["code"] == 11, answer[:300]
        assert error["msg"].startswith("multusd is busy: ")
        first.sendall(body)
        received = b""
        while not received.endswith(b"}}"):
            chunk = first.recv(65536)
            assert chunk, received
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 ") and recorder.started == [("ADD", "c1")]
    # alone, a body that came with its head is charged once (not as read and as declared)
    wait_for(lambda: server.server.in_flight == 0, server.bound, what="c1's connection given back")
    body = cni_body("ADD", "c3") + b" " * (40 * 1024)
    alone = send_and_read(server.path, head + b"\r\n" + body)  # the same length as c1's
    assert alone.startswith(b"HTTP/1.1 200 ") and recorder.started[-1] == ("ADD", "c3")


def chunked(body: bytes, size: int = 16 * 1024) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def test_a_chunked_body_is_charged_to_the_memory_bound_as_it_is_read(served):
    recorder = Recorder()
    server = served(handler=recorder, max_buffered=64 * 1024)
    # a valid request (JSON allows the trailing spaces), under MAX_BODY, over the bound
    body = cni_body("ADD", "c1") + b" " * (100 * 1024)
    answer = send_and_read(server.path, b"POST /cni HTTP/1.1\r\nHost: x\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body))
    head, _, payload = answer.partition(b"\r\n\r\n")
    error = json.loads(payload)
    assert head.startswith(b"HTTP/1.1 400 ") and error["code"] == 11, answer[:300]
    assert error["msg"].startswith("multusd is busy: ") and "retry" in error["msg"], error
    assert recorder.started == []
    # what it held is given back: a small chunked request is served
    small = send_and_read(server.path, b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked"
                          b"\r\n\r\n" + chunked(cni_body("DEL", "c2")))
    assert small.startswith(b"HTTP/1.1 200 ") and recorder.started == [("DEL", "c2")]


def send_and_read(path: str, data: bytes) -> bytes:
    """As a shim does: write the whole request (no half-close), then read the answer."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(path)
        conn.sendall(data)  # a BrokenPipeError here is the bug this guards against
        received = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return received
            received += chunk


BIG = b"x" * (10 << 20)
REFUSED = {
    "bad Content-Length": b"POST /cni HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n" + BIG,
    "body over the limit": b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG,
    "no Content-Length": b"POST /cni HTTP/1.1\r\nHost: x\r\n\r\n" + BIG,
    "malformed header": b"POST /cni HTTP/1.1\r\nNoColon\r\nContent-Length: 5\r\n\r\n" + BIG,
    "bad chunk size": b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + BIG,
}


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_a_refused_request_is_read_away_so_the_client_reads_its_cni_error(sandbox):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.77.0.0/24")]})
    for attempt in range(3):
        for case, data in REFUSED.items():
            answer = send_and_read(daemon.socket_path, data)
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 "), (attempt, case, answer[:300])
            error = json.loads(payload)
            assert set(error) == {"cniVersion", "code", "msg", "details"}, (case, error)
        for path, status in (("/nope", b"404"), ("/healthz", b"200")):
            answer = send_and_read(daemon.socket_path, b"PUT %s HTTP/1.1\r\nContent-Length: "
                                   b"%d\r\n\r\n" % (path.encode(), len(BIG)) + BIG)
            assert answer.split(b" ", 2)[1] == (b"405" if path == "/healthz" else status)
    assert api.http_request(daemon.socket_path, "GET", "/healthz", timeout=10).status == 200


@pytest.mark.privileged
@pytest.mark.cni_plugins
def test_the_daemon_answers_a_probe_and_a_del_beside_64_idle_connections(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.78.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    args = dict(container_id="idle1", netns=ns_path, pod=("default", "idle"))
    assert call_shim("ADD", daemon.shim_conf("0.4.0"), **args).code == 0
    idle = idle_connections(daemon.socket_path, 80)
    try:
        assert api.http_request(daemon.socket_path, "GET", "/healthz", timeout=10).status == 200
        out = call_shim("DEL", daemon.shim_conf("0.4.0"), **args)
        assert out.code == 0, out.output
        assert sandbox.leases_held() == []
    finally:
        for conn in idle:
            conn.close()


def test_cni_requests_never_take_the_slots_probes_need(served):
    recorder = Recorder()
    # 72 connections: 1 + 1 workers, the STATUS and GC slots' runs, 64 kept for probes and the
    # like, so 4 may wait
    server = served(handler=recorder, workers=1, del_workers=1, max_connections=72)
    assert server.server.lanes.max_queued == 4
    recorder.hold[("ADD", "a")] = threading.Event()
    server.post("a", "ADD", "a")
    wait_for(lambda: recorder.started == [("ADD", "a")], server.bound, what="the first ADD running")
    for number in range(10):
        server.post(f"add{number}", "ADD", f"c{number}")
    wait_for(lambda: server.server.lanes.queued + len(server.answers) == 10, server.bound,
             what="ten ADDs waiting or answered")
    assert server.get("/healthz") == 200
    busy = [name for name, (status, _) in server.answers.items() if status == 400]
    assert len(busy) == 6 and server.server.lanes.queued == 4
    recorder.hold[("ADD", "a")].set()
    for number in range(10):
        status, body = server.answered(f"add{number}")
        assert (status, f"add{number}" in busy) in ((200, False), (400, True)), body
    assert len(recorder.finished) == 5


def test_a_request_sent_just_after_stop_on_an_accepted_connection_is_served(served):
    """A restart races the next shim: its connection was accepted, its request not yet sent
    when the daemon stops. It is served, not reset (the shim would report a failed DEL)."""
    server = served()
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(30)
    conn.connect(server.path)
    wait_for(lambda: server.server.in_flight == 1, 10, what="the connection accepted")
    server.server.stop()
    body = cni_body("DEL", "late-del")
    conn.sendall(b"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    answer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        answer += chunk
    conn.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert ("DEL", "late-del") in server.handler.finished
    server.thread.join(10)
    assert not server.thread.is_alive()  # and then the server ends


def test_at_stop_a_silent_accepted_connection_is_closed_after_a_short_grace(served):
    server = served()
    silent = idle_connections(server.path, 1)[0]
    wait_for(lambda: server.server.in_flight == 1, 10, what="the connection accepted")
    server.server.stop()
    server.thread.join(10)
    assert not server.thread.is_alive() and closed_by_server(silent)
    silent.close()
