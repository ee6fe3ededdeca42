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
GO_REFUSED = [
    b'{"cniVersion":"0.4.0","name":"a","type":"t","mtu":NaN}',
    b'{"cniVersion":"0.4.0","name":"a","type":"t","mtu":-Infinity}',
    b'{"cniVersion":"0.4.0","name":"a","type":"t","mtu":1e400}',
    b'\xef\xbb\xbf{"cniVersion":"0.4.0","name":"a","type":"t"}',
    '{"cniVersion":"0.4.0","name":"a","type":"t"}'.encode("utf-16"),
    b'{"cniVersion":"0.4.0","name":"a","type":"t","x":' + b"[" * 10001 + b"]" * 10001 + b"}",
    b'{"cniVersion":"0.4.0","name":"a","type":"t",}',
]
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
    else:  # JSON Go's decoder refuses (a key given twice it accepts: the last one wins)
        return rng.choice(GO_REFUSED)
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


# --- every JSON reader, in process: only CNI errors, and only JSON comes out (issue 39) -------

READER_CASES = 250
PARSE_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/p",
             "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web"}
SEEDS = {
    "selection": b'[{"name":"a","interface":"net1","ips":["10.1.1.5/24"],"mac":'
                 b'"c2:11:22:33:44:55","portMappings":[{"hostPort":8080,"containerPort":80}],'
                 b'"bandwidth":{"ingressRate":1000},"cni-args":{"vlan":1e2},'
                 b'"default-route":["10.1.1.254"]}]',
    "conf": b'{"cniVersion":"1.0.0","name":"n","type":"bridge","bridge":"br0",'
            b'"args":{"cni":{"a":1.5}},"ipam":{"type":"host-local","subnet":"10.1.1.0/24"}}',
    "conflist": b'{"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"},'
                b'{"type":"tuning","capabilities":{"mac":true}}]}',
    "runtime": b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim",'
               b'"daemonSocketDir":"/run/multus","runtimeConfig":{"portMappings":[]}}',
    "daemon": b'{"socketDir":"/run/multus/","logLevel":"debug","requestTimeout":110,'
              b'"clusterNetwork":"cbr0","delegates":[{"type":"bridge"}]}',
}
TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-0", b"1e-400", b"1.0", b"1e2",
          b'"\\ud800"', b'"\\udc00\\ud800"', b"\\ud800", b'"\xff\xfe"', b"\xed\xa0\x80",
          b"\xef\xbb\xbf", b"\x00", b"null", b",", b"}", b"]", b"{", b"[", b'"', b":", b"\\",
          b'"Name"', b'"TYPE"', b'"IngressRate"', b'"\xc5\xbfype"', b"9" * 400, b'"":1',
          b'{"a":' * 60, b"[" * 60]


def mutated(rng: random.Random, data: bytes) -> bytes:
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(5)
        if kind == 0:
            data = data[:at] + rng.choice(TOKENS) + data[at:]
        elif kind == 1:
            data = data[:at] + data[at + rng.randrange(1, 12):]
        elif kind == 2:  # a key in another case
            data = data[:at] + data[at:at + 8].swapcase() + data[at + 8:]
        elif kind == 3:  # a member given twice
            data = data[:at] + data[max(0, at - 20):at] + data[at:]
        else:
            data = data[:at] + rng.choice(TOKENS) + data[at + rng.randrange(1, 6):]
    if rng.random() < 0.02:
        data = b"[" * 10001 + data + b"]" * 10001
    return data


def readers(tmp_path):
    """Each of multusd's readers of JSON upstream reads with encoding/json: (name, seed,
    call); a call returns what multusd would hand on (bytes to check) or None."""
    from multusd import go_loads
    from multusd.cni.conflist import NetworkConfigList
    from multusd.config import daemonconf, multusconf
    from multusd.core import netconf, request, runtimeconf, scratch, selection
    from multusd.core.delegate import Delegate
    from multusd.store import read_json_object
    from multusd.wire import shim
    from nads import Nad

    daemon = daemonconf.from_dict({"clusterNetwork": "cbr0", "cniDir": str(tmp_path)})
    conf_dir = str(tmp_path / "confdir")
    os.makedirs(conf_dir, exist_ok=True)

    def text(data: bytes) -> str:
        return data.decode("utf-8", "surrogateescape")  # a str as a client may hand it over

    def in_file(name: str, data: bytes) -> str:
        path = os.path.join(conf_dir, name)
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    SEEDS["scratch"] = scratch.delegates_to_cache([
        Delegate(name="cbr0", conf=SEEDS["conf"], ifname="eth0", master=True),
        Delegate(name="ns/l", conf=SEEDS["conflist"], ifname="net1", master=False,
                 ip_request=("10.1.1.5",), gateway_request=("10.1.1.254", ""))])

    return [
        ("go_loads", "conf", lambda d: go_loads(d) and None),
        ("annotation", "selection", lambda d: selection.parse_selections(text(d), "ns")),
        ("default network", "selection",
         lambda d: selection.parse_default_network(text(d), "kube-system")),
        ("NAD spec.config", "conf",
         lambda d: netconf.nad_config(Nad("ns", "n", text(d)), conf_dir)),
        ("delegate check", "conflist", lambda d: netconf.check_delegate_conf(d, "here")),
        ("conf file", "conf", lambda d: netconf.load_conf_file(in_file("50-x.conf", d))),
        ("conflist file", "conflist",
         lambda d: netconf.load_conf_file(in_file("50-x.conflist", d))),
        ("engine load", "conflist", lambda d: NetworkConfigList.load(d) and None),
        ("runtime's config", "runtime", lambda d: request.parse(PARSE_ENV, d, daemon) and None),
        ("request body", "runtime", lambda d: request.decode_body(
            b'{"env":{},"config":"e30=","interfaceAttributes":' + d + b"}") and None),
        ("cni-args", "conf", lambda d: runtimeconf.inject_cni_args(d, {"vlan": 1e2})),
        ("capabilities", "conflist", lambda d: runtimeconf.declared_capabilities(d) and None),
        ("daemon-config.json", "daemon",
         lambda d: daemonconf.load(in_file("daemon.json", d)) and None),
        ("00-multus.conf plan", "daemon",
         lambda d: multusconf.plan(go_loads(d)) and None),
        ("shim config", "runtime", lambda d: shim.parse_config(d) and None),
        ("scratch cache", "scratch", lambda d: scratch.delegates_from_cache(d) and None),
        ("result cache", "conf", lambda d: read_json_object(in_file("cache", d), "x") and None),
    ]


def test_no_json_makes_any_reader_raise_anything_but_a_cni_error(tmp_path):
    """Mutated annotations, NAD configs, conf files, the runtime's config, request bodies,
    daemon-config.json, the shim's stdin, the caches: each reader answers with its result or
    a MultusError (never a ValueError, RecursionError or UnicodeError), and what it hands on
    to a plugin is JSON (strict: no NaN) in UTF-8."""
    from multusd.errors import MultusError

    rng = random.Random(3939)
    outcomes: dict = {}
    for name, seed, call in readers(tmp_path):
        for index in range(READER_CASES):
            data = mutated(rng, SEEDS[seed])
            try:
                out = call(data)
            except MultusError:
                outcomes[name] = outcomes.get(name, 0) + 1
                continue
            except Exception as exc:  # noqa: B902 - what this test is about
                raise AssertionError(f"{name} raised {type(exc).__name__}: {exc} for "
                                     f"{data[:300]!r}") from exc
            if isinstance(out, bytes):
                _check_plugin_stdin(out)
    print(f"\nreader fuzz: {READER_CASES} inputs each, CNI errors {outcomes}")


def _check_plugin_stdin(conf: bytes) -> None:
    """A delegate's config bytes (as upstream, possibly not UTF-8: Go passes them on and
    reads them with U+FFFD) become each plugin's stdin as the engine writes it: strict JSON."""
    from multusd.store import go_json
    from multusd.cni import conflist
    from multusd.errors import MultusError

    try:
        net = conflist.NetworkConfigList.load(conf)
    except MultusError:
        return  # refused before any plugin runs
    for plugin in net.plugins:
        stdin = go_json(conflist._plugin_conf(net, plugin), sort_keys=True).encode()
        json.loads(stdin.decode("utf-8"), parse_constant=_refuse)


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} handed on: not JSON")
