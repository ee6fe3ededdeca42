"""Issue 12: a seeded fuzz of the daemon's socket and of the shim's stdin.

Fixed seeds, so a failure reproduces: every generated request is malformed in at least one
way (body, env, config or HTTP framing); the daemon must answer each with 400 and a CNI error,
keep serving, and make no attachment. The shim must exit 1 with a CNI error on stdout and
nothing on stderr. Counts are printed (pytest -s) for the issue's notes.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess

import pytest

from harness import SHIM_ARGV
from testlib import raw_exchange
from multusd.wire import api

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

SOCKET_CASES = 2500
SHIM_CASES = 300
CONF = {"cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus-shim"}
ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "fuzz1", "CNI_NETNS": "/var/run/netns/none",
       "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p"}
NASTY = ["", " ", "\n", "\u0000", "..", "/", "a/b", "x" * 300, "-1", "1e999", "\udcff", "é",
         "eth0\n", "{}", "[]", "null", "true", "a=b=c", ";;", "IgnoreUnknown=maybe"]
WRONG_TYPES = [None, 1, -1.5, True, [], {}, ["x"], {"a": 1}, "x" * 2000]


def nasty(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 40)))
    return rng.choice(NASTY)


def bad_config(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if kind == 1:
        return b"[" * rng.randrange(1, 5000)
    conf = dict(CONF)
    if kind == 2:
        conf.pop(rng.choice(list(conf)))
    elif kind == 3:
        conf[rng.choice(list(conf) + ["delegates", "logFile", "clusterNetwork",
                                      "runtimeConfig"])] = rng.choice(WRONG_TYPES[1:])
    elif kind == 4:
        conf["cniVersion"] = rng.choice(["9.9.9", "1.0", "v1.0.0", "", "0.2.0", "1.0.0\n"])
    else:
        return b'{"cniVersion":"0.4.0","name":"a","name":"b","type":"t"}'
    return json.dumps(conf).encode()


def bad_env(rng: random.Random) -> dict:
    env = dict(ENV, CNI_COMMAND=rng.choice(["ADD", "CHECK"]))
    kind = rng.randrange(5)
    if kind == 0:
        env.pop(rng.choice(["CNI_IFNAME", "CNI_ARGS", "CNI_CONTAINERID", "CNI_COMMAND"]))
    elif kind == 1:
        env["CNI_IFNAME"] = rng.choice(["", "a/b", "x" * 16, "eth 0", ".", "..", "eth0\n"])
    elif kind == 2:
        env["CNI_ARGS"] = rng.choice([
            "K8S_POD_NAME=p", "garbage", "IgnoreUnknown=maybe;" + ENV["CNI_ARGS"],
            ENV["CNI_ARGS"] + ";X=" + "a" * 70000, ENV["CNI_ARGS"] + ";K8S_POD_NAME=q", "=x"])
    elif kind == 3:
        env["CNI_CONTAINERID"] = rng.choice(["../x", "a\n", "-a", ".a", "a b", "", "a/b"])
    else:
        env["CNI_COMMAND"] = nasty(rng)
    return env


def bad_body(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
    if kind == 1:
        return json.dumps({"env": ENV, "config": rng.choice(WRONG_TYPES + ["@@", "e30"])}
                          ).encode()
    if kind == 2:
        return json.dumps({"env": rng.choice([None, [], "x", {"CNI_COMMAND": 1}]),
                           "config": base64.b64encode(json.dumps(CONF).encode()).decode()}
                          ).encode()
    if kind == 3:
        return api.encode_request(ENV, bad_config(rng))
    if kind == 4:
        return api.encode_request(bad_env(rng), json.dumps(CONF).encode())
    return b'{"env": ' * rng.randrange(1, 3000)


def framed(rng: random.Random, body: bytes) -> bytes:
    """The body in an HTTP request, with its framing broken in one of a few ways (or not)."""
    kind = rng.randrange(6)
    if kind == 0:
        length = rng.choice(["-1", "-100", "abc", "+5", " ", "0x10", "99999999999999999999"])
        return f"POST /cni HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode() + body
    if kind == 1:  # a length longer than the body, then EOF
        return (f"POST /cni HTTP/1.1\r\nContent-Length: {len(body) + rng.randrange(1, 99)}"
                "\r\n\r\n").encode() + body
    if kind == 2:
        size = rng.choice(["-1", "zz", "0x1", "", "+1", "%x" % (len(body) + 7)])
        return (f"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\n"
                ).encode() + body
    if kind == 3:
        return (b"POST /cni HTTP/1.1\r\n" + b"X-A: b\r\n" * rng.randrange(101, 300)
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_the_socket_answers_every_malformed_request_with_a_cni_error(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                             "delegates": [sandbox.net("primary", "10.99.0.0/24")]})
    rng = random.Random(1212)
    statuses: dict = {}
    for index in range(SOCKET_CASES):
        body = bad_body(rng)
        answer = raw_exchange(daemon.socket_path, framed(rng, body), half_close=True)
        head, _, payload = answer.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/1.1 ") else b"none"
        statuses[status] = statuses.get(status, 0) + 1
        assert status == b"400", (index, body[:200], answer[:300])
        error = json.loads(payload)
        assert set(error) == {"cniVersion", "code", "msg", "details"} and error["msg"], error
    print(f"\nsocket fuzz: {SOCKET_CASES} cases, answers {statuses}")
    assert api.http_request(daemon.socket_path, "GET", "/healthz", timeout=5).status == 200
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, "fuzz1"))


def bad_stdin(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
    if kind == 1:
        return rng.choice([b"{'cniVersion': '1.0.0'}", b"[" * 100000, b'{"a":' * 50000,
                           b"", b"null", b"[]", b'"x"', b"{", b'{"cniVersion": 1}'])
    conf = dict(CONF)
    if kind == 2:
        key = rng.choice(["logFile", "logLevel", "daemonSocketDir", "logToStderr", "cniVersion"])
        conf[key] = rng.choice([v for v in WRONG_TYPES[1:]
                                if not (key == "logToStderr" and v is True)])
    elif kind == 3:
        conf[rng.choice(["logFile", "daemonSocketDir"])] = rng.choice(
            ["\u0000", "relative.log", "a\u0000b", "", "./x"][:4])
        if conf.get("logFile") == "" or conf.get("daemonSocketDir") == "":
            conf["logLevel"] = "nonsense"
    else:
        conf["logLevel"] = nasty(rng) + "!"
    return json.dumps(conf).encode()


def test_the_shim_answers_every_malformed_stdin_with_a_cni_error(tmp_path):
    rng = random.Random(1213)
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
           "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", "PATH": "/usr/bin:/bin"}
    codes: dict = {}
    for index in range(SHIM_CASES):
        stdin = bad_stdin(rng)
        command = rng.choice(["ADD", "DEL", "CHECK"])
        proc = subprocess.run(SHIM_ARGV, input=stdin, env=dict(env, CNI_COMMAND=command),
                              cwd=str(tmp_path), capture_output=True, timeout=60)
        assert proc.returncode == 1 and proc.stderr == b"", (index, stdin[:200], proc)
        error = json.loads(proc.stdout)
        assert set(error) == {"cniVersion", "code", "msg", "details"}, error
        codes[error["code"]] = codes.get(error["code"], 0) + 1
    print(f"\nshim fuzz: {SHIM_CASES} cases, CNI error codes {codes}")
    assert os.listdir(tmp_path) == []
