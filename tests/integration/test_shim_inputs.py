"""The real shim (python3 -IS, as installed) on bad stdin: exit 1, a CNI error, no file, no crash."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness import SHIM_ARGV

GOOD = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus-shim"}


def with_keys(**keys) -> bytes:
    conf = dict(GOOD)
    conf.update(keys)
    return json.dumps(conf).encode()


INPUTS = {
    "not JSON": b"cniVersion=1.0.0",
    "single quotes": b"{'cniVersion': '1.0.0'}",
    "deep nesting": b"[" * 200000,
    "deep nesting in an object": b'{"a":' * 100000 + b"1" + b"}" * 100000,
    "huge": b'{"cniVersion": "1.0.0", "pad": "' + b"x" * (4 << 20) + b'"}',
    "binary": bytes(range(256)) * 4,
    "not an object": b'["cniVersion"]',
    "cniVersion a number": b'{"cniVersion": 1.0}',
    "logFile a number": with_keys(logFile=1),
    "logFile a float": with_keys(logFile=1.5),
    "logFile true": with_keys(logFile=True),
    "logFile NUL": with_keys(logFile="\u0000"),
    "logFile relative": with_keys(logFile="shim.log"),
    "logLevel a list": with_keys(logLevel=["debug"]),
    "logLevel unknown": with_keys(logLevel="loud"),
    "logToStderr a string": with_keys(logToStderr="yes"),
    "daemonSocketDir a number": with_keys(daemonSocketDir=7),
    "daemonSocketDir NUL": with_keys(daemonSocketDir="/run/\u0000"),
    "daemonSocketDir relative": with_keys(daemonSocketDir="run/multus"),
}


@pytest.mark.parametrize("case", sorted(INPUTS))
@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_bad_stdin_is_a_cni_error_and_writes_nothing(tmp_path, case, command):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x",
           "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(SHIM_ARGV, input=INPUTS[case], env=env, cwd=str(tmp_path),
                          capture_output=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr == b""
    error = json.loads(proc.stdout)
    assert set(error) == {"cniVersion", "code", "msg", "details"}
    assert error["code"] in (1, 6, 7) and error["msg"], error
    assert os.listdir(tmp_path) == []  # no log file of a strange name in its cwd


def test_version_with_a_bad_stdin_still_answers(tmp_path):
    proc = subprocess.run(SHIM_ARGV, input=INPUTS["single quotes"],
                          env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == b""
    assert json.loads(proc.stdout)["cniVersion"] == "1.1.0"
