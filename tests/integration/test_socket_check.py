"""``multusd socket-check``: whose socket the shim's path is, on real unix sockets.

The booted-systemd tests (tests/system) cover ``--repair`` restarting multusd.socket; here,
without systemd as PID 1: every state is told apart, a socket another daemon listens on is
never touched, and ``--remove-dead`` deletes only a socket nobody listens on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from multusd.tools import sockcheck


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "daemon-config.json"
    path.write_text(json.dumps({"socketDir": str(tmp_path / "run")}))
    return str(path)


def sock_path(config: str) -> str:
    return sockcheck.socket_path(config)


def cli(config: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multusd", "socket-check", "--config", config,
                           *flags], capture_output=True, text=True, timeout=60)


def listen(path: str) -> socket.socket:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    return server


def test_missing_and_not_a_socket(config):
    path = sock_path(config)
    assert sockcheck.probe(path).state == sockcheck.MISSING
    out = cli(config)
    assert out.returncode == 1 and f"{path}: no such file" in out.stdout
    os.makedirs(os.path.dirname(path))
    open(path, "w").close()
    assert sockcheck.probe(path).state == sockcheck.NOT_A_SOCKET
    assert cli(config, "--remove-dead").returncode == 0
    assert os.path.exists(path), "--remove-dead deletes only a dead socket"


def test_another_daemons_socket_is_told_apart_and_never_touched(config):
    path = sock_path(config)
    server = listen(path)  # this test process plays the other daemon
    try:
        found = sockcheck.probe(path)
        assert (found.state, found.pid) == (sockcheck.FOREIGN, os.getpid())
        assert "pytest" in found.command or "python" in found.command
        inode = os.stat(path).st_ino
        for flags in ((), ("--repair",), ("--remove-dead",)):
            out = cli(config, *flags)
            assert os.stat(path).st_ino == inode, flags
        assert "bound by another process" in cli(config).stdout
        assert "leaving" in cli(config, "--remove-dead").stderr
        server.settimeout(5)
        conn, _ = server.accept()  # the probes only connected and closed; nothing was sent
        assert conn.recv(100) == b""
        conn.close()
    finally:
        server.close()


def test_a_dead_socket_is_removed_with_its_empty_directory(config):
    path = sock_path(config)
    listen(path).close()  # closed without unlink: what a killed daemon leaves
    assert sockcheck.probe(path).state == sockcheck.DEAD
    out = cli(config, "--remove-dead")
    assert out.returncode == 0, out.stderr
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.dirname(path))


def test_a_socket_activated_multusd_is_not_foreign(sandbox, config):
    daemon = sandbox.daemon({"delegates": [sandbox.net("primary", "10.78.0.0/24")]},
                            activate=False)
    found = sockcheck.probe(daemon.socket_path)
    # systemd-socket-activate holds it here (systemd itself on a node): multusd's, not foreign
    assert found.state == sockcheck.MULTUSD, found.describe()


def test_the_shim_names_the_exact_fix_when_the_socket_file_is_gone(config):
    from harness import call_shim

    directory = os.path.dirname(sock_path(config))
    conf = {"cniVersion": "0.4.0", "daemonSocketDir": directory,
            "cniDir": os.path.join(os.path.dirname(directory), "cni")}  # the shim's marks
    gone = call_shim("DEL", conf, container_id="c1", netns="")
    assert gone.code == 1 and gone.output["code"] == 11  # the runtime retries
    assert "the socket file is gone" in gone.output["msg"]
    assert "`systemctl restart multusd.socket`" in gone.output["msg"]
    listen(sock_path(config)).close()  # a file nobody listens on: another fix applies
    dead = call_shim("DEL", conf, container_id="c1", netns="")
    assert dead.code == 1 and "Connection refused" in dead.output["msg"]
    assert "check `systemctl status multusd.socket multusd`" in dead.output["msg"]
