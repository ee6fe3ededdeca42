"""Issue 12: what the runtime and the socket send is checked before anything runs.

Request validation and HTTP framing against the real daemon (socket activation); the
server's deadlines and limits are in test_connections.py.
"""

from __future__ import annotations

import json
import os

import pytest

from harness import call_shim
from testlib import raw_exchange
from multusd.wire import api

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

CONF = {"cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus-shim"}
ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/none",
       "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p"}


def body(env=None, conf=None, **drop) -> bytes:
    env = {k: v for k, v in dict(ENV, **(env or {})).items() if k not in drop}
    raw = conf if isinstance(conf, bytes) else json.dumps(dict(CONF, **(conf or {}))).encode()
    return api.encode_request(env, raw)


def without(key: str) -> bytes:
    return api.encode_request(ENV, json.dumps({k: v for k, v in CONF.items()
                                               if k != key}).encode())


VALIDATION = [
    ("empty config", json.dumps({"env": ENV, "config": ""}).encode(), '"config"'),
    ("config an object", json.dumps({"env": ENV, "config": CONF}).encode(), '"config"'),
    ("no cniVersion", without("cniVersion"), '"cniVersion"'),
    ("no name", without("name"), '"name"'),
    ("no type", without("type"), '"type"'),
    ("name a number", body(conf={"name": 7}), '"name"'),
    ("cniVersion unknown", body(conf={"cniVersion": "9.9.9"}), "cniVersion"),
    ("delegates an object", body(conf={"delegates": {}}), '"delegates"'),
    # JSON Go's decoder refuses (a key given twice it reads, as a map: the last one wins)
    ("NaN", body(conf=b'{"cniVersion":"0.4.0","name":"a","type":"t","mtu":NaN}'),
     "NaN is not JSON"),
    ("nested past Go's limit", body(conf=b'{"cniVersion":"0.4.0","name":"a","type":"t","x":'
                                    + b"[" * 10001 + b"]" * 10001 + b"}"), "exceeded max depth"),
    ("no CNI_IFNAME", body(CNI_IFNAME=None), "CNI_IFNAME"),
    ("CNI_IFNAME with a slash", body({"CNI_IFNAME": "a/b"}), "CNI_IFNAME"),
    ("CNI_IFNAME too long", body({"CNI_IFNAME": "x" * 16}), "CNI_IFNAME"),
    ("empty CNI_NETNS", body({"CNI_NETNS": ""}), "CNI_NETNS"),
    ("IgnoreUnknown=maybe", body({"CNI_ARGS": ENV["CNI_ARGS"] + ";IgnoreUnknown=maybe"}),
     "IgnoreUnknown"),
    ("1 MB of CNI_ARGS", body({"CNI_ARGS": ENV["CNI_ARGS"] + ";X=" + "a" * (1 << 20)}),
     "CNI_ARGS"),
    ("a CNI_ARGS key twice", body({"CNI_ARGS": ENV["CNI_ARGS"] + ";K8S_POD_NAME=q"}),
     "K8S_POD_NAME"),
    ("container ID with a newline", body({"CNI_CONTAINERID": "c1\n"}), "CNI_CONTAINERID"),
]


@pytest.fixture
def daemon(sandbox):
    return sandbox.daemon({"cniVersion": "0.4.0",
                           "delegates": [sandbox.net("primary", "10.98.0.0/24")]})


def post(daemon, data: bytes):
    response = api.http_request(daemon.socket_path, "POST", "/cni", data, timeout=30)
    return response.status, json.loads(response.body)


def test_each_validation_refusal_names_its_field(daemon, sandbox):
    for case, data, field in VALIDATION:
        for command in ("ADD", "CHECK") if case != "empty CNI_NETNS" else ("ADD",):
            data_cmd = data.replace(b'"CNI_COMMAND": "ADD"', f'"CNI_COMMAND": "{command}"'.encode())
            status, error = post(daemon, data_cmd)
            assert status == 400, (case, command)
            assert field in error["msg"], (case, error)
            assert set(error) == {"cniVersion", "code", "msg", "details"}
    assert sandbox.leases_held() == []
    assert not os.path.exists(daemon.cni_dir) or os.listdir(daemon.cni_dir) in ([], ["results"])


def test_del_stays_lenient_without_a_netns(daemon):
    out = call_shim("DEL", daemon.shim_conf("0.4.0"), container_id="c2", netns="")
    assert out.code == 0, out.output


def head(length: str, extra: str = "") -> bytes:
    return (f"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n{extra}\r\n"
            ).encode()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


DEL_BODY = body({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "", "CNI_NETNS": ""})


FRAMING = dict([
    ("Content-Length -1", head("-1") + DEL_BODY),
    ("Content-Length -1 with 10 MiB", head("-1") + b"x" * (10 << 20)),
    ("Content-Length -100", head("-100") + DEL_BODY),
    ("Content-Length not a number", head("12abc") + DEL_BODY),
    ("Content-Length with a sign", head(f"+{len(DEL_BODY)}") + DEL_BODY),
    ("conflicting Content-Lengths", head("1", f"Content-Length: {len(DEL_BODY)}\r\n")
     + DEL_BODY),
    ("negative chunk size", b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n"
     + DEL_BODY),
    ("chunk size 0x", b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x%x\r\n"
     % len(DEL_BODY) + DEL_BODY + b"\r\n0\r\n\r\n"),
    ("body shorter than Content-Length", head(str(len(DEL_BODY) + 10)) + DEL_BODY),
    ("short chunk", b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n"
     % (len(DEL_BODY) + 10) + DEL_BODY),
    ("200 repeated header lines", head(str(len(DEL_BODY)), "X-A: 1\r\n" * 200) + DEL_BODY),
    ("a 100 KiB head", head(str(len(DEL_BODY)), ("X-B: " + "b" * 1000 + "\r\n") * 90) + DEL_BODY),
])


@pytest.mark.parametrize("case", list(FRAMING))
def test_framing_errors_are_refused_and_never_run(daemon, case):
    data = FRAMING[case]
    answer = raw_exchange(daemon.socket_path, data, half_close=True)
    assert status_of(answer) == 400, (case, answer[:200])
    assert b"HTTP/1.1 200" not in answer
    ok = raw_exchange(daemon.socket_path, head(str(len(DEL_BODY))) + DEL_BODY)
    assert status_of(ok) == 200, ok  # the same request, framed right, runs; the daemon serves
