"""multusd.kube.execplugin: exec credential plugins run with a deadline, and what they print.

The plugins are real programs (shell and Python scripts written per test); a hung one is
killed with what it started, and none of what a plugin prints on stdout reaches a message.
"""

from __future__ import annotations

import calendar
import json
import os
import stat
import sys
import time

import pytest

from multusd.errors import MultusError, TryAgainLater
from multusd.kube import execplugin
from multusd.kube.clientconfig import ClientConfig
from multusd.kube.credentials import Credentials, CredentialPluginError, Secrets
from multusd.kube.kubeconfig import ExecPlugin, KubeconfigError, Settings, exec_plugin, load
from testlib import wait_for

V1 = "client.authentication.k8s.io/v1"
TOKEN = "exec-tok-5a6b7c8d9e0f1a2b"


def script(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def printing(tmp_path, status: dict, *, api_version: str = V1, name: str = "plugin",
             record: str = "") -> str:
    """A plugin that prints an ExecCredential with ``status`` (and appends its
    KUBERNETES_EXEC_INFO to ``record``)."""
    answer = json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                         "status": status})
    keep = (f"with open({record!r}, 'a') as f: f.write(os.environ['KUBERNETES_EXEC_INFO']"
            " + '\\n')") if record else "pass"
    return script(tmp_path, name, f"#!{sys.executable}\nimport os\n{keep}\nprint({answer!r})\n")


def hanging(tmp_path) -> str:
    """A plugin that starts a child and waits for it for ten minutes."""
    return script(tmp_path, "hangs", "#!/bin/sh\necho $$ > \"$0.pid\"\nsleep 600 &\n"
                                     "echo $! > \"$0.child\"\nwait\n")


def plugin_of(command: str, cwd: str = "/", **extra) -> ExecPlugin:
    return ExecPlugin(command=command, args=(), env=(), api_version=V1, cwd=cwd, **extra)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_token_is_read_with_its_expiry(tmp_path):
    command = printing(tmp_path, {"token": TOKEN, "expirationTimestamp": "2099-01-02T03:04:05Z"})
    credential = execplugin.run(plugin_of(command), time.monotonic() + 30)
    assert credential.header == f"Bearer {TOKEN}"
    assert credential.expires == calendar.timegm((2099, 1, 2, 3, 4, 5, 0, 0, 0))
    assert not credential.expired()
    assert credential.expired(now=credential.expires - execplugin.EXPIRY_SKEW)


@pytest.mark.parametrize("stamp,shift", [
    ("2099-01-02T03:04:05.123456789Z", 0.123456),  # Go's nanoseconds
    ("2099-01-02T03:04:05.123456+00:00", 0.123456),  # Python's isoformat()
    ("2099-01-02T03:04:05.5+02:00", 0.5 - 7200),  # a fraction and an offset
])
def test_an_expiry_with_a_fraction_keeps_its_offset(tmp_path, stamp, shift):
    command = printing(tmp_path, {"token": TOKEN, "expirationTimestamp": stamp})
    credential = execplugin.run(plugin_of(command), time.monotonic() + 30)
    expected = calendar.timegm((2099, 1, 2, 3, 4, 5, 0, 0, 0)) + shift
    assert credential.expires is not None and abs(credential.expires - expected) < 1e-6


def test_a_hung_plugin_is_killed_with_its_children_at_the_deadline(tmp_path):
    command = hanging(tmp_path)
    with pytest.raises(CredentialPluginError) as caught:
        execplugin.run(plugin_of(command), time.monotonic() + 1.0)
    error = caught.value
    assert error.transient and "did not finish within" in str(error) and command in str(error)
    pid, child = (int(open(f"{command}.{kind}").read()) for kind in ("pid", "child"))
    wait_for(lambda: not alive(pid) and not alive(child), 10, what="the plugin to be gone")
    assert isinstance(error.as_error("get pod a/b"), TryAgainLater)


def test_a_failing_plugin_names_its_exit_status_and_last_stderr_line_redacted(tmp_path):
    secrets = Secrets()
    secrets.add(f"Bearer {TOKEN}")
    command = script(tmp_path, "fails", "#!/bin/sh\necho 'secret-stdout-1234'\n"
                                        f"echo 'first' >&2\necho 'token {TOKEN} refused' >&2\n"
                                        "exit 3\n")
    with pytest.raises(CredentialPluginError) as caught:
        execplugin.run(plugin_of(command), time.monotonic() + 30, redact=secrets.redact)
    message = str(caught.value)
    assert "exit status 3" in message and "token <redacted> refused" in message
    assert TOKEN not in message and "secret-stdout" not in message and "first" not in message
    assert not caught.value.transient
    assert type(caught.value.as_error("x")) is MultusError


@pytest.mark.parametrize("answer,what", [
    ("not json", "not JSON"),
    (json.dumps({"kind": "Other"}), "not an ExecCredential"),
    (json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",
                 "kind": "ExecCredential", "status": {"token": TOKEN}}), "apiVersion"),
    (json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {}}), "neither"),
])
def test_an_unusable_answer_is_refused_without_quoting_it(tmp_path, answer, what):
    command = script(tmp_path, "odd", f"#!/bin/sh\necho '{answer}'\n")
    with pytest.raises(CredentialPluginError) as caught:
        execplugin.run(plugin_of(command), time.monotonic() + 30)
    assert what in str(caught.value) and TOKEN not in str(caught.value)


def test_a_missing_plugin_says_so_with_its_install_hint(tmp_path):
    with pytest.raises(CredentialPluginError) as caught:
        execplugin.run(plugin_of(str(tmp_path / "absent"), install_hint="apt install x"),
                       time.monotonic() + 30)
    assert "cannot be started" in str(caught.value) and "apt install x" in str(caught.value)


def test_a_client_certificate_becomes_private_files(tmp_path):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
    command = printing(tmp_path, {"clientCertificateData": pem, "clientKeyData": key})
    credential = execplugin.run(plugin_of(command), time.monotonic() + 30)
    assert credential.header is None and credential.expires is None
    assert open(credential.cert_file).read() == pem and open(credential.key_file).read() == key
    assert stat.S_IMODE(os.stat(credential.key_file).st_mode) == 0o600


# ---- the kubeconfig's exec ------------------------------------------------------------------

def kubeconfig(tmp_path, user: dict, **cluster) -> str:
    document = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://api:6443",
                                                       **cluster}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(document))
    return str(path)


def test_exec_is_read_with_its_args_env_and_the_kubeconfigs_directory(tmp_path):
    path = kubeconfig(tmp_path, {"exec": {
        "apiVersion": V1, "command": "./bin/plugin", "args": ["a", 1],
        "env": [{"name": "K", "value": "v"}], "provideClusterInfo": True,
        "interactiveMode": "IfAvailable"}}, **{"tls-server-name": "api.local"})
    plugin = load(path, exec_plugins=True).exec_plugin
    assert plugin.command == "./bin/plugin" and plugin.args == ("a", "1")
    assert plugin.env == (("K", "v"),) and plugin.cwd == str(tmp_path)
    assert json.loads(plugin.cluster) == {"server": "https://api:6443",
                                          "tls-server-name": "api.local"}
    assert load(path) is None  # without exec_plugins: the package's loader, as before


def test_a_token_wins_over_exec_as_in_the_package(tmp_path):
    path = kubeconfig(tmp_path, {"token": TOKEN, "exec": {"apiVersion": V1, "command": "x"}})
    settings = load(path, exec_plugins=True)
    assert settings.token == TOKEN and settings.exec_plugin is None


@pytest.mark.parametrize("spec,what", [
    ({"apiVersion": V1}, "no 'command'"),
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "apiVersion"),
    ({"apiVersion": V1, "command": "x", "interactiveMode": "Always"}, "terminal"),
    ({"apiVersion": V1, "command": "x", "env": [{"value": "v"}]}, "'name'"),
])
def test_an_unusable_exec_is_a_kubeconfig_error(spec, what):
    with pytest.raises(KubeconfigError) as caught:
        exec_plugin(spec, {}, "/")
    assert what in str(caught.value)


def test_the_plugin_is_told_the_cluster_and_that_nobody_is_at_a_terminal(tmp_path):
    record = str(tmp_path / "info")
    command = printing(tmp_path, {"token": TOKEN}, record=record)
    path = kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": command,
                                          "provideClusterInfo": True}})
    Credentials(load(path, exec_plugins=True), Secrets()).header()
    info = json.loads(open(record).read())
    assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "https://api:6443"


# ---- Credentials: when a request makes it run ---------------------------------------------------

def switchable(tmp_path, expires: str) -> tuple:
    """A plugin that prints a token expiring at ``expires``, or hangs once ``mode`` says so."""
    mode = tmp_path / "mode"
    mode.write_text("ok")
    answer = json.dumps({"apiVersion": V1, "kind": "ExecCredential",
                         "status": {"token": TOKEN, "expirationTimestamp": expires}})
    command = script(tmp_path, "switch", f"#!/bin/sh\nif [ \"$(cat {mode})\" = hang ]; then "
                                         f"exec sleep 600; fi\necho '{answer}'\n")
    return command, mode


def test_an_expired_token_runs_the_plugin_within_the_requests_deadline(tmp_path):
    command, mode = switchable(tmp_path, "2000-01-01T00:00:00Z")  # always expired
    credentials = Credentials(Settings(host="https://x", exec_plugin=plugin_of(command)),
                              Secrets())
    assert credentials.header() == f"Bearer {TOKEN}"
    mode.write_text("hang")
    with pytest.raises(CredentialPluginError) as caught:
        credentials.header(time.monotonic() + 0.5)
    assert caught.value.transient and "did not finish" in str(caught.value)


def test_a_valid_token_is_not_asked_for_again_until_a_401(tmp_path):
    command, mode = switchable(tmp_path, "2099-01-01T00:00:00Z")
    credentials = Credentials(Settings(host="https://x", exec_plugin=plugin_of(command)),
                              Secrets())
    assert credentials.header() == f"Bearer {TOKEN}"
    mode.write_text("hang")  # would hang if it ran again
    assert credentials.header(time.monotonic() + 0.5) == f"Bearer {TOKEN}"
    with pytest.raises(CredentialPluginError):
        credentials.refresh(time.monotonic() + 0.5)  # a 401: it runs, and hangs


def test_a_plugin_that_hangs_at_start_is_a_kubeconfig_problem_not_a_hang(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(execplugin, "PLUGIN_TIMEOUT", 1.0)  # a shorter bound, same code
    path = kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": hanging(tmp_path)}})
    with pytest.raises(MultusError) as caught:
        ClientConfig(path)
    assert "did not finish within" in caught.value.msg and path in caught.value.msg
