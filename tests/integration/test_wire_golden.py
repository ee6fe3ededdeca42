"""Our daemon answers the exact bytes upstream's Go multus-shim puts on the unix socket.

The requests are built by hand from how the Go shim talks (net/http client, one
``client.Post(url, "application/json", body)`` per call, no keep-alive): every request is a
POST, even the readiness probes (``/readyz`` before ADD/CHECK/GC/STATUS, ``/healthz`` before
DEL), whose body is the JSON encoding of a nil value, ``null``. The header order and values
are the ones Go's client writes; the body is Go's ``encoding/json`` output (sorted map keys,
no spaces, ``[]byte`` as base64). The answers are read the way Go's client reads them:
framing by Content-Length (or by close), and a non-200 body decoded as a CNI error whose
``msg`` must be non-empty for the error to reach the runtime as the daemon wrote it.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from typing import Any, Mapping

import pytest

from harness import netns_addresses

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

GO_CLIENT_HEADERS = ("Host: dummy\r\n"
                     "User-Agent: Go-http-client/1.1\r\n"
                     "Content-Length: {length}\r\n"
                     "Content-Type: application/json\r\n"
                     "Accept-Encoding: gzip\r\n")


def go_json(value: Any) -> bytes:
    """What Go's json.Marshal writes for a map or string: sorted keys, compact, HTML-escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def go_post(path: str, body: bytes) -> bytes:
    """The bytes Go's http.Client writes for client.Post("http://dummy" + path, ...)."""
    head = f"POST {path} HTTP/1.1\r\n" + GO_CLIENT_HEADERS.format(length=len(body)) + "\r\n"
    return head.encode("ascii") + body


def shim_stdin(socket_dir: str, cni_version: str, **extra: Any) -> bytes:
    conf = {"cniVersion": cni_version, "name": "multus-cni-network", "type": "multus-shim",
            "daemonSocketDir": socket_dir}
    conf.update(extra)
    return json.dumps(conf).encode()


def cni_body(command: str, stdin: bytes, container_id: str = "", netns: str = "",
             pod: str = "golden") -> bytes:
    """The shim's api.Request: its whole environment as "env", stdin as base64 "config"."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": (f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
                        f"K8S_POD_INFRA_CONTAINER_ID={container_id};"
                        "K8S_POD_UID=6c3b5f1e-0d2a-4c1b-9a51-2f0e7b8c9d10"),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    # A Go struct marshals its fields in declaration order (env, config); only maps are sorted.
    return (b'{"env":' + go_json(env) + b',"config":'
            + go_json(base64.b64encode(stdin).decode()) + b"}")


class Answer:
    """One HTTP response as Go's client frames it."""

    def __init__(self, raw: bytes) -> None:
        head, sep, body = raw.partition(b"\r\n\r\n")
        assert sep, f"no end of headers in the answer: {raw[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        version, status, _ = (lines[0].split(" ", 2) + [""])[:3]
        self.version = version
        self.status = int(status)
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        self.body = body

    def json(self) -> Mapping[str, Any]:
        return json.loads(self.body)


def exchange(socket_path: str, request: bytes, timeout: float = 120.0) -> Answer:
    """Send the bytes, half-close nothing (Go keeps its write side open), read until close."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(socket_path)
        conn.sendall(request)
        raw = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            raw += chunk
    finally:
        conn.close()
    return Answer(raw)


def assert_go_can_frame(answer: Answer) -> None:
    """Go reads a body by Content-Length or to EOF; chunked would also do, but we never send it."""
    assert answer.version == "HTTP/1.1"
    assert "transfer-encoding" not in answer.headers
    assert int(answer.headers["content-length"]) == len(answer.body)
    assert answer.headers.get("connection", "").lower() == "close"


def assert_cni_error(answer: Answer) -> Mapping[str, Any]:
    """DoCNI keeps the daemon's error only if it decodes as types.Error with a non-empty msg."""
    assert answer.status == 400
    error = answer.json()
    assert isinstance(error["code"], int) and error["code"] >= 0  # Go's field is a uint
    assert isinstance(error["msg"], str) and error["msg"]
    assert isinstance(error.get("details", ""), str)
    return error


@pytest.fixture
def golden(sandbox):
    """A daemon with one bridge network and a namespace for the pod."""
    daemon = sandbox.daemon({"cniVersion": "0.3.1",
                             "delegates": [sandbox.net("golden-net", "10.97.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    return daemon, ns_name, ns_path


@pytest.mark.parametrize("probe", ["/readyz", "/healthz"])
def test_readiness_probe_is_a_post_of_null(golden, probe):
    daemon, _, _ = golden

    answer = exchange(daemon.socket_path, go_post(probe, b"null"))

    assert answer.status == 200
    assert_go_can_frame(answer)


@pytest.mark.parametrize("cni_version", ["0.3.1", "1.0.0"])
def test_add_check_del_as_the_go_shim_sends_them(golden, cni_version):
    daemon, ns_name, ns_path = golden
    cid = uuid.uuid4().hex
    stdin = shim_stdin(daemon.socket_dir, cni_version)

    add = exchange(daemon.socket_path, go_post("/cni", cni_body("ADD", stdin, cid, ns_path)))

    assert add.status == 200, add.body
    assert_go_can_frame(add)
    assert list(add.json()) == ["Result"]  # api.Response has the untagged field Result
    result = add.json()["Result"]
    assert result["cniVersion"] == "1.1.0"  # always libcni's current; the shim converts down
    assert [ip["address"] for ip in result["ips"]] == ["10.97.0.2/24"]
    assert all("version" not in ip for ip in result["ips"])  # 1.x shape, readable by cni100
    eth0 = result["ips"][0]["interface"]
    assert result["interfaces"][eth0] == {"name": "eth0", "mac": result["interfaces"][eth0]["mac"],
                                          "sandbox": ns_path}
    assert netns_addresses(ns_name)["eth0"] == ["10.97.0.2/24"]

    check_stdin = shim_stdin(daemon.socket_dir, "1.0.0")  # CHECK needs >= 0.4.0 in Go's skel
    check = exchange(daemon.socket_path,
                     go_post("/cni", cni_body("CHECK", check_stdin, cid, ns_path)))
    assert (check.status, check.body) == (200, b"")
    assert_go_can_frame(check)

    delete = exchange(daemon.socket_path, go_post("/cni", cni_body("DEL", stdin, cid, ns_path)))
    assert (delete.status, delete.body) == (200, b"")
    assert_go_can_frame(delete)
    assert set(netns_addresses(ns_name)) == {"lo"}


def test_status_without_a_container(golden):
    daemon, _, _ = golden
    stdin = shim_stdin(daemon.socket_dir, "1.1.0")

    answer = exchange(daemon.socket_path, go_post("/cni", cni_body("STATUS", stdin)))

    assert (answer.status, answer.body) == (200, b""), answer.body
    assert_go_can_frame(answer)


def test_gc_keeps_a_live_attachment(golden):
    # Like upstream, GC needs <cniDir>/results, which the first ADD creates.
    daemon, ns_name, ns_path = golden
    cid = uuid.uuid4().hex
    stdin = shim_stdin(daemon.socket_dir, "1.1.0")
    add = exchange(daemon.socket_path, go_post("/cni", cni_body("ADD", stdin, cid, ns_path)))
    assert add.status == 200, add.body

    gc = exchange(daemon.socket_path, go_post("/cni", cni_body("GC", stdin)))

    assert (gc.status, gc.body) == (200, b""), gc.body
    assert_go_can_frame(gc)
    assert netns_addresses(ns_name)["eth0"] == ["10.97.0.2/24"]
    delete = exchange(daemon.socket_path, go_post("/cni", cni_body("DEL", stdin, cid, ns_path)))
    assert delete.status == 200, delete.body


def test_delegate_failure_is_a_cni_error_the_go_client_keeps(sandbox):
    broken = {"cniVersion": "0.3.1", "name": "golden-broken", "type": "macvlan",
              "master": "no-such-link0",
              "ipam": {"type": "host-local", "subnet": "10.97.1.0/24", "dataDir": sandbox.leases}}
    daemon = sandbox.daemon({"cniVersion": "0.3.1", "delegates": [broken]})
    _, ns_path = sandbox.netns()
    stdin = shim_stdin(daemon.socket_dir, "0.3.1")

    answer = exchange(daemon.socket_path,
                      go_post("/cni", cni_body("ADD", stdin, uuid.uuid4().hex, ns_path)))

    assert_go_can_frame(answer)
    error = assert_cni_error(answer)
    assert 'error adding container to network "golden-broken"' in error["msg"]
    assert sandbox.leases_held() == []


def test_unreadable_request_is_still_a_cni_error(golden):
    daemon, _, _ = golden

    answer = exchange(daemon.socket_path, go_post("/cni", b'{"env":'))

    assert_go_can_frame(answer)
    assert_cni_error(answer)


def test_large_config_is_framed_by_content_length(golden):
    daemon, _, _ = golden
    stdin = shim_stdin(daemon.socket_dir, "1.1.0", padding="a" * 300_000)

    answer = exchange(daemon.socket_path, go_post("/cni", cni_body("STATUS", stdin)))

    assert (answer.status, answer.body) == (200, b""), answer.body[:300]


@pytest.mark.parametrize("method,path,status", [("GET", "/cni", 405), ("POST", "/nothing", 404)])
def test_wrong_method_and_unknown_path(golden, method, path, status):
    daemon, _, _ = golden
    request = (f"{method} {path} HTTP/1.1\r\n" + GO_CLIENT_HEADERS.format(length=0)
               + "\r\n").encode()

    answer = exchange(daemon.socket_path, request)

    assert answer.status == status
    assert_go_can_frame(answer)
