"""multusd.cni.passthru: the no-op plugin at the head of an auxiliary chain, run as the program
the package installs (/opt/cni/bin/passthru): what each command prints and exits with.

A chain that uses it with real plugins (tuning after it) is tests/integration's
(test_attachment_config.py); here the program alone, as a runtime or libcni runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from multusd import CURRENT_VERSION, SUPPORTED_VERSIONS
from multusd.cni import result
from testlib import REPO


def passthru(command: str, stdin: bytes) -> tuple:
    """Run the installed program's code as a process: (exit code, parsed stdout or None)."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); from multusd.cni.passthru import main; " \
        "raise SystemExit(main())"
    proc = subprocess.run([sys.executable, "-I", "-c", code, REPO], input=stdin,
                          capture_output=True, env={"CNI_COMMAND": command, "PATH": "/usr/bin"},
                          timeout=60)
    out = proc.stdout.decode().strip()
    return proc.returncode, json.loads(out) if out else None


def conf(version: str) -> bytes:
    return json.dumps({"cniVersion": version, "name": "chain", "type": "passthru"}).encode()


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_add_prints_an_empty_valid_result_at_the_configs_version(version):
    code, answer = passthru("ADD", conf(version))
    assert code == 0 and answer["cniVersion"] == version
    assert (answer["interfaces"], answer["ips"], answer["routes"]) == ([], [], [])
    assert ("dns" in answer) is (not version.startswith("1."))  # 1.x: dns only when set
    assert result.is_empty(answer)
    for other in SUPPORTED_VERSIONS:  # what libcni does with it for the next plugin
        assert result.convert_result(answer, other)["cniVersion"] == other


@pytest.mark.parametrize("command", ["DEL", "CHECK", "STATUS", "GC"])
def test_the_other_commands_do_nothing_and_print_nothing(command):
    assert passthru(command, conf("1.0.0")) == (0, None)


def test_version_lists_every_supported_version():
    assert passthru("VERSION", conf("0.4.0")) == \
        (0, {"cniVersion": "0.4.0", "supportedVersions": list(SUPPORTED_VERSIONS)})


def test_without_a_config_the_current_version_is_used():
    code, answer = passthru("ADD", b"  \n")
    assert code == 0 and answer["cniVersion"] == CURRENT_VERSION


@pytest.mark.parametrize("stdin,words", [(b"{not json", "error parsing CNI configuration"),
                                         (b'["a", "list"]', "is not a JSON object")])
def test_a_config_it_cannot_read_is_a_cni_decode_error(stdin, words):
    code, error = passthru("ADD", stdin)
    assert code == 1
    assert set(error) == {"cniVersion", "code", "msg", "details"}
    assert error["code"] == 6 and error["msg"].startswith("passthru cni: ") and words in \
        error["msg"]
