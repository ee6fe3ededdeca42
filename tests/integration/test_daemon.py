"""The real shim against the real daemon under systemd-socket-activate, with real plugins.

Delegates mode (no Kubernetes): every test starts its own daemon in a private directory,
its own network namespaces and bridges, and removes all of it afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import uuid

import pytest

from harness import (DaemonProcess, NotifyListener, call_shim, netns_addresses, shim_bound,
                     start_bound, unit_stop_timeout)
from multusd.daemon.stopping import STOP_TIMEOUT
from testlib import free_port, metric_value, raw_exchange, wait_for
from multusd.wire import api
from multusd.wire.shim import REQUEST_TIMEOUT

pytestmark = [pytest.mark.privileged, pytest.mark.cni_plugins]

def pod_args(container_id: str, name: str = "web-0") -> dict:
    return {"container_id": container_id, "pod": ("default", name), "uid": str(uuid.uuid4())}


@pytest.mark.parametrize("count", [1, 2, 3])
def test_add_check_del_with_n_delegates(sandbox, count):
    nets = [sandbox.net(f"net{i}", f"10.{50 + i}.0.0/24", gateway=(i == 0)) for i in range(count)]
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "delegates": nets})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")

    add = call_shim("ADD", conf, netns=ns_path, **pod_args(cid))
    assert add.code == 0, add.output
    assert [ip["address"] for ip in add.output["ips"]] == ["10.50.0.2/24"]
    assert add.output["cniVersion"] == "0.4.0"
    links = netns_addresses(ns_name)
    expected = {"eth0": ["10.50.0.2/24"]}
    expected.update({f"net{i}": [f"10.{50 + i}.0.2/24"] for i in range(1, count)})
    assert {k: v for k, v in links.items() if k != "lo"} == expected
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert len(sandbox.leases_held()) == count

    check = call_shim("CHECK", conf, netns=ns_path, **pod_args(cid))
    assert check.code == 0, check.output

    delete = call_shim("DEL", conf, netns=ns_path, **pod_args(cid))
    assert delete.code == 0, delete.output
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []
    assert not os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert os.listdir(os.path.join(daemon.cni_dir, "results")) == []

    again = call_shim("DEL", conf, netns="", **pod_args(cid))  # containerd's second DEL
    assert again.code == 0, again.output


def test_failing_second_delegate_rolls_back_everything(sandbox):
    broken = {"cniVersion": "0.4.0", "name": "broken-macvlan", "type": "macvlan",
              "master": "no-such-link0", "ipam": {"type": "host-local", "subnet": "10.61.0.0/24",
                                                  "dataDir": sandbox.leases}}
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                         "delegates": [sandbox.net("good", "10.60.0.0/24"), broken]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex

    add = call_shim("ADD", daemon.shim_conf("0.4.0"), netns=ns_path, **pod_args(cid))

    assert add.code == 1
    assert add.output["cniVersion"] == "0.4.0"
    assert 'error adding container to network "broken-macvlan"' in add.output["msg"]
    assert "[default/web-0/" in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert sandbox.leases_held() == []
    # macvlan's DEL fails too while its master is missing: the attachment stays recorded for
    # the runtime's DEL (issue 12) instead of being forgotten.
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args("x" + cid)).code == 1
    daemon.wait_healthy()


@pytest.mark.parametrize("version,has_ip_version", [("0.3.1", True), ("0.4.0", True),
                                                    ("1.0.0", False)])
def test_result_is_converted_to_the_runtime_config_version(sandbox, version, has_ip_version):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.62.0.0/24",
                                                cni_version="0.3.1")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf(version)
    add = call_shim("ADD", conf, netns=ns_path, **pod_args(cid))
    assert add.code == 0, add.output
    assert add.output["cniVersion"] == version
    assert ("version" in add.output["ips"][0]) is has_ip_version
    assert call_shim("DEL", conf, netns=ns_path, **pod_args(cid)).code == 0


def test_version_is_answered_by_the_shim_alone():
    out = call_shim("VERSION", {"cniVersion": "1.0.0", "daemonSocketDir": "/nonexistent"})
    assert out.code == 0
    assert out.output["cniVersion"] == "1.0.0"
    assert "0.3.1" in out.output["supportedVersions"]


def post(daemon: DaemonProcess, path: str, body: bytes, method: str = "POST"):
    response = api.http_request(daemon.socket_path, method, path, body, timeout=30)
    return response.status, response.body


def cni_body(env_vars: dict, config: dict | bytes) -> bytes:
    raw = config if isinstance(config, bytes) else json.dumps(config).encode()
    return api.encode_request(env_vars, raw)


RUNTIME_CONF = {"cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus-shim"}
BASE_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/none",
            "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p"}


@pytest.mark.parametrize("case,body,message", [
    ("malformed JSON", b"{not json", "not valid JSON"),
    ("bad base64", json.dumps({"env": BASE_ENV, "config": "@@@"}).encode(), "not valid base64"),
    ("missing CNI_COMMAND", cni_body({k: v for k, v in BASE_ENV.items() if k != "CNI_COMMAND"},
                                     RUNTIME_CONF), "missing CNI_COMMAND"),
    ("missing CNI_ARGS", cni_body({k: v for k, v in BASE_ENV.items() if k != "CNI_ARGS"},
                                  RUNTIME_CONF), "missing CNI_ARGS"),
    ("missing K8S_POD_NAME", cni_body(dict(BASE_ENV, CNI_ARGS="K8S_POD_NAMESPACE=default"),
                                      RUNTIME_CONF), "missing K8S_POD_NAME"),
    ("invalid CNI_ARGS item", cni_body(dict(BASE_ENV, CNI_ARGS="K8S_POD_NAME=p;garbage"),
                                       RUNTIME_CONF), "invalid CNI_ARGS item 'garbage'"),
    ("config not JSON", cni_body(BASE_ENV, b"{{"), "CNI config from the runtime is not valid"),
    ("container ID as a path", cni_body(dict(BASE_ENV, CNI_CONTAINERID="../../etc/x"),
                                        RUNTIME_CONF), "invalid CNI_CONTAINERID"),
])
def test_bad_input_gets_a_clear_cni_error_and_the_daemon_keeps_serving(sandbox, case, body, message):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.63.0.0/24")]})
    status, payload = post(daemon, "/cni", body)
    assert status == 400, case
    error = json.loads(payload)
    assert set(error) >= {"cniVersion", "code", "msg", "details"}
    assert message in error["msg"], error
    assert post(daemon, "/healthz", b"", "GET")[0] == 200


def test_http_edges_answer_as_upstream(sandbox):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.64.0.0/24")]})
    assert post(daemon, "/nope", b"") == (404, b"")
    assert post(daemon, "/cni", b"", "GET")[0] == 405
    assert post(daemon, "/healthz", b"", "PUT")[0] == 405
    assert post(daemon, "/readyz", b"null")[0] == 200  # upstream's shim POSTs null to /readyz
    status, payload = post(daemon, "/cni", b"x" * (5 * 1024 * 1024))
    assert status == 400 and "over the limit" in json.loads(payload)["msg"]


def test_config_without_type_is_rejected_clearly(sandbox):
    daemon = sandbox.daemon({"delegates": [{"cniVersion": "0.4.0", "name": "typeless"}]})
    ns_name, ns_path = sandbox.netns()
    add = call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(uuid.uuid4().hex))
    assert add.code == 1
    assert "type" in add.output["msg"]
    assert set(netns_addresses(ns_name)) == {"lo"}


def test_a_hung_delegate_is_killed_at_the_deadline(sandbox, tmp_path):
    pid_file = str(tmp_path / "hang.pid")
    hang = {"cniVersion": "0.4.0", "name": "hangs", "type": "stub-hang", "pidFile": pid_file}
    timeout = 3
    while True:  # until the plugin had started (written its pids) by the deadline
        daemon = sandbox.daemon({"requestTimeout": timeout, "delegates": [hang]})
        ns_name, ns_path = sandbox.netns()
        add = call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(uuid.uuid4().hex))
        assert add.code == 1
        assert add.output["code"] == 11, add.output
        assert "hangs" in add.output["msg"]
        if os.path.exists(pid_file):
            break
        # a loaded machine did not even start it in time: again, with twice as long, up to
        # the default request deadline
        assert timeout < REQUEST_TIMEOUT, "stub-hang never started within a request deadline"
        daemon.terminate()
        timeout *= 2
    print(f"\nstub-hang started within a requestTimeout of {timeout}s")
    pids = [int(p) for p in open(pid_file).read().split()]
    for pid in pids:
        wait_for(lambda: not _alive(pid), 10, what=f"stub process {pid} to be gone")
    daemon.wait_healthy()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_inherited_socket_is_not_touched(sandbox):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.65.0.0/24")]}, activate=False)
    before = os.stat(daemon.socket_path)
    daemon.wait_healthy()
    after = os.stat(daemon.socket_path)
    assert (before.st_ino, before.st_mode) == (after.st_ino, after.st_mode)
    assert daemon.terminate() == 0
    assert os.path.exists(daemon.socket_path)  # systemd's socket, not ours to unlink


def test_self_bound_socket_modes_stale_file_and_live_daemon(tmp_path):
    socket_dir = tmp_path / "run"
    config = tmp_path / "daemon-config.json"
    config.write_text(json.dumps({"socketDir": str(socket_dir), "cniDir": str(tmp_path / "cni"),
                                  "delegates": [{"cniVersion": "0.4.0", "name": "n",
                                                 "type": "loopback"}]}))
    socket_dir.mkdir(mode=0o755)
    stale = socket_dir / "multus.sock"
    import socket as pysocket
    old = pysocket.socket(pysocket.AF_UNIX)
    old.bind(str(stale))
    old.close()  # a socket file nobody listens on: stale
    cmd = [sys.executable, "-m", "multusd", "serve", "--config", str(config)]
    first = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _answers(str(stale)), start_bound(), what="the self-bound daemon")
        assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o755  # not ours: left alone
        assert stat.S_IMODE(os.stat(stale).st_mode) == 0o600
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 3
        assert "another multusd is already serving" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(unit_stop_timeout()) == 0
    assert not stale.exists()


def test_self_bind_makes_its_directory_and_never_removes_a_file(tmp_path):
    socket_dir = tmp_path / "run" / "multus"
    config = tmp_path / "daemon-config.json"
    config.write_text(json.dumps({"socketDir": str(socket_dir), "cniDir": str(tmp_path / "cni"),
                                  "delegates": [{"cniVersion": "0.4.0", "name": "n",
                                                 "type": "loopback"}]}))
    cmd = [sys.executable, "-m", "multusd", "serve", "--config", str(config)]
    first = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _answers(str(socket_dir / "multus.sock")), start_bound(),
                 what="the daemon")
        assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700  # made by it
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(unit_stop_timeout()) == 0
    precious = socket_dir / "multus.sock"
    precious.write_text("not a socket")
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert second.returncode == 3
    assert "is not a socket" in second.stderr
    assert precious.read_text() == "not a socket"


def _answers(path: str) -> bool:
    try:
        return api.http_request(path, "GET", "/healthz", timeout=1).status == 200
    except OSError:
        return False


def test_sigterm_drains_in_flight_requests_and_still_serves_del(sandbox, tmp_path):
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    slow = {"cniVersion": "0.4.0", "name": "slow", "type": "stub-gate", "gateFile": gate,
            "startedFile": started}
    daemon = sandbox.daemon({"delegates": [slow]})
    ns_name, ns_path = sandbox.netns()
    outcome = {}
    adder = threading.Thread(target=lambda: outcome.update(
        add=call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args("slowpod"))))
    adder.start()
    try:
        wait_for(lambda: os.path.exists(started) or not adder.is_alive(), shim_bound("ADD"),
                 what="the slow ADD to reach its plugin")
        assert os.path.exists(started), outcome
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: post(daemon, "/readyz", b"", "GET")[0] == 500, STOP_TIMEOUT,
                 what="/readyz to turn 500")
        assert post(daemon, "/healthz", b"", "GET")[0] == 200
        delete = call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args("otherpod"))
        assert delete.code == 0, delete.output
        assert daemon.proc.poll() is None
    finally:
        open(gate, "w").close()
        adder.join(shim_bound("ADD"))
    assert outcome["add"].code == 0, outcome["add"].output
    assert daemon.proc.wait(unit_stop_timeout()) == 0


def test_fifty_concurrent_pods_add_and_del(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0", "workers": 8,
                         "delegates": [sandbox.net("cluster", "10.70.0.0/24"),
                                       sandbox.net("second", "10.71.0.0/24", gateway=False)]})
    namespaces = [sandbox.netns() for _ in range(50)]
    conf = daemon.shim_conf("0.4.0")
    results: dict[int, object] = {}

    def run(index: int, command: str) -> None:
        results[(index, command)] = call_shim(command, conf, netns=namespaces[index][1],
                                              **pod_args(f"pod{index:03d}", f"web-{index}"))

    for command in ("ADD", "DEL"):
        threads = [threading.Thread(target=run, args=(i, command)) for i in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(shim_bound(command))
        if command == "ADD":
            addresses = {results[(i, "ADD")].output["ips"][0]["address"] for i in range(50)
                         if results[(i, "ADD")].code == 0}
            assert len(addresses) == 50
            assert len(sandbox.leases_held()) == 100
    assert all(results[(i, c)].code == 0 for i in range(50) for c in ("ADD", "DEL"))
    assert sandbox.leases_held() == []
    assert all(set(netns_addresses(name)) == {"lo"} for name, _ in namespaces)
    assert sorted(os.listdir(daemon.cni_dir)) == ["results"]


def test_no_secret_reaches_the_log(sandbox):
    secret = "s3cr3t-token-" + uuid.uuid4().hex
    net = sandbox.net("primary", "10.66.0.0/24")
    net["kubernetes"] = {"token": secret}
    daemon = sandbox.daemon({"delegates": [net], "logLevel": "debug"})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
    assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
    log = daemon.log()
    assert "ADD starting" in log and secret not in log


def test_del_without_scratch_cache_falls_back_to_the_result_cache(sandbox):
    daemon = sandbox.daemon({"cniVersion": "0.4.0",
                         "delegates": [sandbox.net("cluster", "10.67.0.0/24"),
                                       sandbox.net("second", "10.68.0.0/24", gateway=False)]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    conf = daemon.shim_conf("0.4.0")
    assert call_shim("ADD", conf, netns=ns_path, **pod_args(cid)).code == 0
    with open(os.path.join(daemon.cni_dir, cid), "w") as handle:
        handle.write("{corrupt")
    delete = call_shim("DEL", conf, netns=ns_path, **pod_args(cid))
    assert delete.code == 0, delete.output
    assert sandbox.leases_held() == []
    assert set(netns_addresses(ns_name)) == {"lo"}
    assert "result cache" in daemon.log()


def test_check_config_reports_every_problem(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"chrootDir": "/hostroot", "logLevel": "loud"}))
    out = subprocess.run([sys.executable, "-m", "multusd", "check-config", "--config",
                          str(config)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "2 problem(s)" in out.stderr
    assert "chrootDir:" in out.stderr and "logLevel:" in out.stderr


def test_check_config_says_where_plugins_are_found_without_bin_dir(tmp_path):
    from multusd.cni.invoke import DEFAULT_BIN_DIRS, plugins_in

    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cniVersion": "0.3.1"}))
    out = subprocess.run([sys.executable, "-m", "multusd", "check-config", "--config",
                          str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "binDir is not set; searched in this order:" in out.stdout
    listed = [line.split(":")[0].strip() for line in out.stdout.splitlines()
              if line.startswith("    /")]
    assert listed == list(DEFAULT_BIN_DIRS)
    having = [d for d in DEFAULT_BIN_DIRS if plugins_in(d)]
    for directory in DEFAULT_BIN_DIRS:
        count = len(plugins_in(directory) or ())
        expected = f"{count} plugin(s)" if plugins_in(directory) is not None else \
            "no such directory"
        assert f"    {directory}: {expected}" in out.stdout
    if having:
        assert f"    found: {', '.join(having)} (" in out.stdout
    else:
        assert "warning: binDir: no plugin found" in out.stderr


def test_check_config_warns_when_bin_dir_holds_no_plugin(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"binDir": str(tmp_path / "none")}))
    out = subprocess.run([sys.executable, "-m", "multusd", "check-config", "--config",
                          str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"    {tmp_path / 'none'}: no such directory" in out.stdout
    assert f"warning: binDir: no plugin found in {tmp_path / 'none'}" in out.stderr


@pytest.mark.skipif(not os.path.exists("/usr/lib/cni/bridge") or
                    os.path.exists("/opt/cni/bin/bridge"),
                    reason="needs Debian's plugins in /usr/lib/cni and none in /opt/cni/bin")
def test_without_bin_dir_plugins_come_from_usr_lib_cni(sandbox):
    daemon = sandbox.daemon({"binDir": None,
                             "delegates": [sandbox.net("primary", "10.77.0.0/24")]})
    assert "binDir" not in json.load(open(daemon.config_path))
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    added = call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(cid))
    assert added.code == 0, added.output  # bridge from /usr/lib/cni, which finds host-local
    assert "eth0" in netns_addresses(ns_name)
    assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
    assert sandbox.leases_held() == []


def test_wire_body_is_upstreams_shape():
    body = json.loads(api.encode_request({"CNI_COMMAND": "ADD"}, b'{"a":1}'))
    assert body == {"env": {"CNI_COMMAND": "ADD"},
                    "config": base64.b64encode(b'{"a":1}').decode()}


def test_systemd_notifications_ready_status_watchdog_stopping(sandbox, tmp_path):
    with NotifyListener(str(tmp_path / "notify.sock")) as notify:
        daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.69.0.0/24")]},
                                env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"})
        notify.receive_until("READY=1")
        notify.receive_until("WATCHDOG=1")
        ns_name, ns_path = sandbox.netns()
        cid = uuid.uuid4().hex
        assert call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
        notify.receive_until("STATUS=serving: 1 requests done, 0 failed")
        assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
        daemon.proc.send_signal(signal.SIGTERM)
        notify.receive_until("STOPPING=1")
        assert daemon.proc.wait(unit_stop_timeout()) == 0


@pytest.mark.parametrize("command,version", [("CHECK", "0.3.1"), ("STATUS", "1.0.0"),
                                             ("GC", "1.0.0")])
def test_shim_refuses_commands_the_config_version_lacks(command, version):
    out = call_shim(command, {"cniVersion": version, "daemonSocketDir": "/nonexistent"})
    assert out.code == 1
    assert out.output == {"cniVersion": version, "code": 1, "details": "",
                          "msg": f"config version does not allow {command}"}


def test_metrics_count_requests_and_time_delegate_plugins(sandbox):
    import urllib.request

    port = free_port()
    daemon = sandbox.daemon({"metricsPort": port,
                             "delegates": [sandbox.net("primary", "10.74.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert metric_value(text, "multusd_requests_total", handler="/cni", command="ADD",
                        result="ok") == 1
    assert metric_value(text, "multus_server_request_total", handler="/cni", code="200",
                        method="post") == 1
    assert metric_value(text, "multusd_delegate_duration_seconds_count", plugin="bridge",
                        command="ADD") == 1
    assert metric_value(text, "multusd_scratch_cache_entries") == 1
    assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0


def test_malformed_http_and_expect_continue(sandbox):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.75.0.0/24")]})
    assert raw_exchange(daemon.socket_path, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_exchange(daemon.socket_path, b"GET /healthz HTTP/1.1\r\nNoColon\r\n\r\n"
                        ).startswith(b"HTTP/1.1 400 ")
    body = cni_body({}, RUNTIME_CONF)
    answer = raw_exchange(daemon.socket_path,
                          b"POST /cni HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\n")
    assert b"unexpected or missing CNI_COMMAND" in answer
    assert post(daemon, "/healthz", b"", "GET")[0] == 200


def test_del_with_an_empty_container_id_succeeds_and_touches_nothing(sandbox):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.76.0.0/24")]})
    ns_name, ns_path = sandbox.netns()
    cid = uuid.uuid4().hex
    assert call_shim("ADD", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0
    out = call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(""))
    assert out.code == 0, out.output
    assert os.path.exists(os.path.join(daemon.cni_dir, cid))
    assert call_shim("DEL", daemon.shim_conf(), netns=ns_path, **pod_args(cid)).code == 0


def test_shim_logs_errors_to_its_log_file(tmp_path):
    log_file = tmp_path / "shim.log"
    out = call_shim("DEL", {"cniVersion": "0.4.0", "daemonSocketDir": str(tmp_path / "none"),
                            "cniDir": str(tmp_path / "cni"), "logFile": str(log_file),
                            "logLevel": "error"},
                    container_id="c1", netns="/var/run/netns/none")
    assert out.code == 1 and out.output["code"] == 11  # the runtime retries the DEL
    assert "[error] DEL (shim): multusd is not reachable" in log_file.read_text()


def test_check_config_names_the_api_server_and_the_node_name(tmp_path, kube_api):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"kubeconfig": kube_api.kubeconfig_path}))
    env = {**os.environ, "MULTUS_NODE_NAME": "worker-3"}
    out = subprocess.run([sys.executable, "-m", "multusd", "check-config", "--config",
                          str(config)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert f"API server: {kube_api.url}" in out.stdout
    assert 'node name "worker-3" from MULTUS_NODE_NAME' in out.stdout
    assert kube_api.requests == []  # loaded, never contacted


def test_check_config_reports_a_kubeconfig_it_cannot_use(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({"current-context": "missing", "contexts": []}))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"kubeconfig": str(kubeconfig)}))
    out = subprocess.run([sys.executable, "-m", "multusd", "check-config", "--config",
                          str(config)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "kubeconfig: cannot use kubeconfig" in out.stderr and "'missing'" in out.stderr
