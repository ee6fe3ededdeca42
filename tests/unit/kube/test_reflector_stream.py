"""multusd.kube.reflector against a raw server that answers each request as its script says.

What the stand-in cannot stage at a given moment: a WatchList that stops before the bookmark
ending its initial events (until the test lets it go on), one that stalls where WatchLists
worked before, an ERROR "Too large resource version" in a relist's initial events, and watch
events cut anywhere in the HTTP chunks. The server is a real HTTP/1.1 server on loopback; the
reflector runs in a real thread over the real transport.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Dict, Iterator, List, Optional, Union
from urllib.parse import parse_qs, urlsplit

import pytest

from multusd.kube.clientconfig import ClientConfig
from multusd.kube.objects import NADS_PATH, nad_from_object
from multusd.kube.reflector import LIST_PAGE, Reflector
from multusd.kube.watchstream import WatchState
from multusd.kube.watchstream import shutdown_response, watch_events
from testlib import token_kubeconfig, wait_for

NS = "default"
Step = Union[bytes, threading.Event]  # a chunk to send, or a wait until the test sets it


def nad(name: str, version: int) -> Dict[str, Any]:
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": str(version)},
            "spec": {"config": '{"cniVersion":"1.0.0","name":"n","type":"bridge"}'}}


def event(etype: str, obj: Dict[str, Any]) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode() + b"\n"


def end_of_initial_events(version: int) -> bytes:
    return event("BOOKMARK", {"kind": "NetworkAttachmentDefinition",
                              "metadata": {"resourceVersion": str(version), "annotations": {
                                  "k8s.io/initial-events-end": "true"}}})


def error(code: int, reason: str, message: str, **details: Any) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
              "reason": reason, "message": message}
    if details:
        status["details"] = details
    return event("ERROR", status)


class ScriptedServer:
    """Answers the n-th request (each on a connection of its own) with ``script[n]``: a
    list of steps streamed as HTTP chunks (then the end of the stream, or with ``hold`` the
    connection kept open until the client closes it), or a dict answered whole as JSON."""

    def __init__(self, script: List[Any], hold: bool = True) -> None:
        self.script, self.hold = script, hold
        self.queries: List[Dict[str, str]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        for answer in self.script:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                target = head.split(b" ")[1].decode()
                self.queries.append({k: v[-1] for k, v in parse_qs(urlsplit(target).query).items()})
                self._answer(conn, answer)

    def _answer(self, conn: socket.socket, answer: Any) -> None:
        if isinstance(answer, dict):
            body = json.dumps(answer).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: "
                         b"close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for step in answer:
                if isinstance(step, threading.Event):
                    step.wait(30)
                else:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(step), step))
            if not self.hold:
                conn.sendall(b"0\r\n\r\n")
                return
            while conn.recv(4096):  # until the client closes it
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def config_for(tmp_path, url: str) -> ClientConfig:
    return ClientConfig(token_kubeconfig(tmp_path / "kubeconfig", "t0k3n-for-the-raw-server", server=url))


@pytest.fixture
def scripted(tmp_path) -> Iterator[Any]:
    """``scripted(script, **reflector options)``: (server, reflector, its store) with the
    reflector running; all stopped at the end of the test."""
    made: List[Any] = []

    def start(script: List[Any], hold: bool = True, list_end_wait: float = 10.0,
              state: Optional[WatchState] = None) -> Any:
        server = ScriptedServer(script, hold)
        config = config_for(tmp_path, server.url)
        store: Dict[Any, Any] = {}

        def send(extra: Dict[str, Any], timeout: float, read_timeout: Any) -> Any:
            return config.transport.request("GET", NADS_PATH, query=extra, timeout=timeout,
                                            read_timeout=read_timeout, stream=True)

        reflector = Reflector(state or WatchState(kinds=("nads",)), "nads", "nads", send,
                              nad_from_object, store, config, 5.0, None, list_end_wait)
        thread = threading.Thread(target=reflector.run, daemon=True)
        thread.start()
        made.append((server, reflector, thread, config))
        return server, reflector, store

    yield start
    for server, reflector, thread, config in made:
        reflector.state.stop()
        with reflector.state.cond:
            watches = list(reflector.state.open_watches.values())
        for response in watches:
            shutdown_response(response)
        thread.join(timeout=10)
        config.close()
        server.close()


def test_the_store_is_replaced_only_when_the_initial_events_end(scripted):
    go_on = threading.Event()
    server, reflector, store = scripted([[event("ADDED", nad("a", 3)), event("ADDED", nad("b", 4)),
                                          go_on, end_of_initial_events(9)]])
    state = reflector.state
    wait_for(lambda: reflector.initial_events == 2, what="both initial events read")
    with state.cond:
        assert store == {} and not state.synced["nads"] and not state.listed["nads"]
    go_on.set()
    with state.cond:
        assert state.cond.wait_for(lambda: state.synced["nads"], 10)
        assert sorted(name for _, name in store) == ["a", "b"]
    assert reflector.version == "9" and state.watch_list is True
    query = server.queries[0]
    assert (query["watch"], query["sendInitialEvents"], query["resourceVersionMatch"],
            query["resourceVersion"]) == ("true", "true", "NotOlderThan", "0")


def test_changes_before_the_end_of_the_initial_events_are_part_of_the_state(scripted):
    """Servers of 1.27-1.31 send the end bookmark at their next bookmark tick: changes of
    the meantime come first, and the state at the bookmark includes them."""
    _server, reflector, store = scripted([[
        event("ADDED", nad("a", 3)), event("ADDED", nad("b", 4)),
        event("BOOKMARK", {"metadata": {"resourceVersion": "5"}}),  # not the end
        event("DELETED", nad("a", 6)), event("MODIFIED", nad("b", 7)), event("ADDED", nad("c", 8)),
        end_of_initial_events(8)]])
    state = reflector.state
    with state.cond:
        assert state.cond.wait_for(lambda: state.synced["nads"], 10)
        assert sorted(name for _, name in store) == ["b", "c"]
    assert reflector.version == "8"


def test_too_large_in_a_relists_initial_events_lists_consistently(scripted):
    server, reflector, store = scripted([
        [event("ADDED", nad("a", 40)), end_of_initial_events(50),
         error(410, "Expired", "too old resource version: 50 (60)")],
        [error(504, "Timeout", "Timeout: Too large resource version: 50, current: 7",
               causes=[{"reason": "ResourceVersionTooLarge"}], retryAfterSeconds=1)],
        {"kind": "NetworkAttachmentDefinitionList", "metadata": {"resourceVersion": "7"},
         "items": [nad("b", 6)]},
        []], hold=False)
    wait_for(lambda: len(server.queries) == 4, what="the watch after the consistent list")
    first, relist, consistent, watch = server.queries
    assert (first["resourceVersion"], relist["resourceVersion"]) == ("0", "50")
    assert relist["sendInitialEvents"] == "true"
    assert "resourceVersion" not in consistent and consistent["limit"] == str(LIST_PAGE)
    assert watch["resourceVersion"] == "7" and "sendInitialEvents" not in watch
    assert list(store) == [(NS, "b")]
    assert reflector.state.reopens.get(("nads", "expired")) == 1  # the 410 alone


def test_where_watch_lists_worked_a_stalled_one_is_asked_again(scripted):
    server, reflector, store = scripted([
        [event("ADDED", nad("a", 3)), end_of_initial_events(5),
         error(410, "Expired", "too old resource version: 5 (6)")],
        [],  # the relist sends nothing at all
        [event("ADDED", nad("c", 8)), end_of_initial_events(8)]], list_end_wait=0.3)
    wait_for(lambda: len(server.queries) == 3 and list(store) == [(NS, "c")],
             what="the WatchList asked again")
    assert [q["resourceVersion"] for q in server.queries] == ["0", "5", "5"]
    assert all(q["sendInitialEvents"] == "true" for q in server.queries)
    assert reflector.state.watch_list is True  # not taken for a server that ignores it


def test_events_are_framed_by_lines_whatever_the_chunks(tmp_path):
    events = [{"type": "ADDED", "object": {"metadata": {"name": f"n{i}", "namespace": NS,
                                                         "resourceVersion": str(10 + i)}}}
              for i in range(4)]
    lines = [json.dumps(e).encode() for e in events]
    chunks = [lines[0][:7], lines[0][7:] + b"\n" + lines[1][:30],  # split inside a line
              lines[1][30:] + b"\n",
              b"\n" + lines[2] + b"\n" + lines[3]]  # an empty line; the last one unterminated
    server = ScriptedServer([chunks], hold=False)
    config = config_for(tmp_path, server.url)
    try:
        response = config.transport.request("GET", NADS_PATH, query={"watch": True},
                                            timeout=5, stream=True)
        assert list(watch_events(response)) == events
        response.close()
    finally:
        config.close()
        server.close()


def test_a_stream_answered_with_connection_close_keeps_its_socket(tmp_path):
    """An answer with "Connection: close" takes the socket over from the connection (a proxy
    may answer a watch so): its read timeout is still set, and shutdown_response still wakes
    the thread reading it."""
    server = ScriptedServer([[event("ADDED", nad("a", 3))], []])
    config = config_for(tmp_path, server.url)
    try:
        quiet = config.transport.request("GET", NADS_PATH, query={"watch": True}, timeout=60,
                                         read_timeout=0.2, stream=True)
        assert quiet.sock is not None and quiet.sock.gettimeout() == 0.2
        quiet.close()
        response = config.transport.request("GET", NADS_PATH, query={"watch": True},
                                            timeout=60, stream=True)
        def read() -> None:
            try:
                list(watch_events(response))
            except Exception:  # noqa: BLE001 - cut in the middle of a chunk: how it ends
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        shutdown_response(response)
        reader.join(timeout=10)
        assert not reader.is_alive()  # woken, not left until the 60 s read timeout
        response.close()
    finally:
        config.close()
        server.close()
