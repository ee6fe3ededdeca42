"""multusd.cni.invoke: finding plugins and running them (real subprocesses, stub plugins)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

from testlib import wait_for  # tests/conftest.py (pytest puts tests/ on sys.path)
from multusd.cni import invoke
from multusd.errors import (DeadlineExceeded, DelegateError, InvalidNetworkConfig,
                            PluginError)
from multusd.wire.shim import REQUEST_TIMEOUT  # the daemon's default request deadline



ENV = invoke.build_env("ADD", "cid1", "/var/run/netns/x", "eth0", "A=1;B=2", "/opt/cni/bin")


def _exec(path: str, stdin: dict, timeout: float = 30.0, command: str = "ADD"):
    return invoke.exec_plugin(path, command=command, stdin=json.dumps(stdin).encode(),
                              env=dict(ENV, CNI_COMMAND=command),
                              deadline=time.monotonic() + timeout)


def test_build_env_sets_all_six_variables():
    assert ENV == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "cid1",
                   "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
                   "CNI_ARGS": "A=1;B=2", "CNI_PATH": "/opt/cni/bin"}


def test_search_path_defaults_to_opt_then_the_distributions_dirs():
    assert invoke.search_path("") == ("/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni")
    assert invoke.search_path("", ["/x", "/usr/lib/cni", ""]) == (
        "/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni", "/x")
    assert invoke.search_path("/srv/cni", ["/opt/cni/bin", "/srv/cni"]) == (
        "/srv/cni", "/opt/cni/bin")


def test_plugins_in_lists_executables_only(tmp_path):
    (tmp_path / "bridge").write_text("#!/bin/sh\n")
    (tmp_path / "bridge").chmod(0o755)
    (tmp_path / "README").write_text("not a plugin\n")
    (tmp_path / "sub").mkdir()
    assert invoke.plugins_in(str(tmp_path)) == ("bridge",)
    assert invoke.plugins_in(str(tmp_path / "missing")) is None


def test_find_plugin_takes_the_first_directory_that_has_it(tmp_path, stub_bin):
    assert invoke.find_plugin("stub-record", [str(tmp_path / "nope"), stub_bin]) == \
        os.path.join(stub_bin, "stub-record")


def test_find_plugin_missing_names_plugin_and_every_dir(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    with pytest.raises(InvalidNetworkConfig) as err:
        invoke.find_plugin("no-such-plugin", dirs)
    assert "'no-such-plugin'" in err.value.msg
    assert all(d in err.value.msg for d in dirs)


def test_find_plugin_skips_non_executable_and_says_so(tmp_path):
    plugin = tmp_path / "plain"
    plugin.write_text("#!/bin/sh\n")
    os.chmod(plugin, 0o644)
    with pytest.raises(InvalidNetworkConfig) as err:
        invoke.find_plugin("plain", [str(tmp_path)])
    assert "not executable" in err.value.msg


@pytest.mark.parametrize("bad", ["../bin/bridge", "/usr/lib/cni/bridge", "", ".."])
def test_find_plugin_rejects_paths(bad, stub_bin):
    with pytest.raises(InvalidNetworkConfig):
        invoke.find_plugin(bad, [stub_bin])


def test_exec_passes_stdin_and_only_the_given_env_plus_path(stub_bin, tmp_path, monkeypatch):
    # A daemon variable must not reach the plugin: each call gets its own environment.
    monkeypatch.setenv("MULTUSD_TEST_SECRET", "leak")
    record = tmp_path / "record.jsonl"
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "stub-record",
            "recordFile": str(record), "result": {"ips": [{"address": "10.0.0.2/24"}]}}
    before = dict(os.environ)
    result = _exec(os.path.join(stub_bin, "stub-record"), conf)
    assert result == {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    call = json.loads(record.read_text())
    assert call["stdin"] == conf
    env = {k: v for k, v in call["env"].items() if k not in ("PWD", "SHLVL", "_", "LC_CTYPE")}
    assert env == dict(ENV, PATH=os.environ["PATH"])
    assert dict(os.environ) == before


def test_exec_empty_stdout_is_none(stub_bin):
    assert _exec(os.path.join(stub_bin, "stub-record"),
                 {"cniVersion": "1.0.0", "type": "stub-record"}, command="DEL") is None


def test_plugin_cni_error_passes_through_unchanged(stub_bin):
    with pytest.raises(PluginError) as err:
        _exec(os.path.join(stub_bin, "stub-error"), {})
    assert err.value.code == 42
    assert err.value.to_cni_error() == {
        "cniVersion": "1.0.0", "code": 42, "msg": "stub error: the flux capacitor is empty",
        "details": "refill it", "extraKey": "kept"}


def test_exit_code_without_json_is_delegate_error_with_details(stub_bin):
    path = os.path.join(stub_bin, "stub-exit")
    with pytest.raises(DelegateError) as err:
        _exec(path, {})
    assert "'stub-exit'" in err.value.msg and "exited with code 3" in err.value.msg
    assert "it said: 'stub-exit: second line'" in err.value.msg
    details = err.value.details
    assert f"Plugin: {path}" in details
    assert "Command: ADD" in details and "Exit code: 3" in details
    # the multi-line stderr is kept, continuation lines indented under "Stderr:"
    assert "Stderr: stub-exit: something broke\n        stub-exit: second line" in details
    assert err.value.exit_code == 3 and "second line" in err.value.stderr


def test_garbage_on_stdout_is_a_clear_error(stub_bin):
    with pytest.raises(DelegateError) as err:
        _exec(os.path.join(stub_bin, "stub-garbage"), {})
    assert "'stub-garbage'" in err.value.msg and "not a JSON object" in err.value.msg
    assert "Stdout: this is <not> json" in err.value.details


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"  # zombie: not running
    except FileNotFoundError:
        return True


def test_hanging_plugin_and_its_children_are_killed_at_the_deadline(stub_bin, tmp_path):
    pid_file = tmp_path / "pids"
    timeout = 3.0
    while True:  # until the stub had started (written its pids) by the deadline
        with pytest.raises(DeadlineExceeded) as err:
            _exec(os.path.join(stub_bin, "stub-hang"), {"pidFile": str(pid_file)},
                  timeout=timeout)
        if pid_file.exists():
            break
        # a loaded machine did not even start it in time: again, with twice as long, up to
        # the daemon's request deadline (what a plugin gets to run in)
        assert timeout < REQUEST_TIMEOUT, "stub-hang never started within a request deadline"
        timeout *= 2
    print(f"\nstub-hang started within a deadline of {timeout:g}s")
    assert "'stub-hang'" in err.value.msg and "deadline" in err.value.msg
    assert err.value.code == 11
    plugin_pid, child_pid = (int(p) for p in pid_file.read_text().split())
    wait_for(lambda: _dead(plugin_pid) and _dead(child_pid), what="stub-hang and its child gone")


def test_past_deadline_does_not_start_the_plugin(stub_bin, tmp_path):
    record = tmp_path / "record.jsonl"
    with pytest.raises(DeadlineExceeded):
        invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="ADD",
                           stdin=json.dumps({"recordFile": str(record)}).encode(), env=ENV,
                           deadline=time.monotonic() - 1)
    assert not record.exists()


def test_missing_binary_at_exec_time(tmp_path):
    with pytest.raises(InvalidNetworkConfig) as err:
        _exec(str(tmp_path / "vanished"), {})
    assert "does not exist" in err.value.msg and "vanished" in err.value.details


class _CloseOnRetry(logging.Handler):
    """Closes the writer's fd when invoke logs its first ETXTBSY retry."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.retries = 0

    def emit(self, record):
        if "ETXTBSY" in record.getMessage():
            self.retries += 1
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


def test_etxtbsy_is_retried_until_the_writer_is_done(tmp_path):
    plugin = tmp_path / "busy"
    fd = os.open(plugin, os.O_WRONLY | os.O_CREAT, 0o755)
    os.write(fd, b"#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\"}'\n")
    handler = _CloseOnRetry(fd)
    logger = logging.getLogger("multusd.cni.invoke")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert _exec(str(plugin), {}) == {"cniVersion": "1.0.0"}
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        if handler.fd >= 0:
            os.close(handler.fd)
    assert handler.retries >= 1


def test_etxtbsy_forever_gives_up_with_a_clear_error(tmp_path):
    plugin = tmp_path / "busy"
    fd = os.open(plugin, os.O_WRONLY | os.O_CREAT, 0o755)
    try:
        os.write(fd, b"#!/bin/sh\nexit 0\n")
        with pytest.raises(InvalidNetworkConfig) as err:
            _exec(str(plugin), {})
    finally:
        os.close(fd)
    assert "busy" in err.value.msg.lower()


def test_concurrent_execs_get_their_own_environment(stub_bin, tmp_path):
    path = os.path.join(stub_bin, "stub-record")
    results = {}

    def run(index: int) -> None:
        record = tmp_path / f"r{index}.jsonl"
        env = dict(ENV, CNI_CONTAINERID=f"cid{index}")
        invoke.exec_plugin(path, command="ADD", env=env, deadline=time.monotonic() + 30,
                           stdin=json.dumps({"cniVersion": "1.0.0",
                                             "recordFile": str(record)}).encode())
        results[index] = json.loads(record.read_text())["env"]["CNI_CONTAINERID"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: f"cid{i}" for i in range(10)}


class _Observed(list):
    """An observer that keeps what it is told: (plugin, command, seconds, outcome)."""

    def __call__(self, plugin: str, command: str, seconds: float, outcome: str) -> None:
        self.append((plugin, command, seconds, outcome))


def test_the_observer_is_told_of_each_execution_and_its_outcome(stub_bin):
    observed = _Observed()
    record = {"cniVersion": "1.0.0", "type": "stub-record"}
    invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="DEL", env=ENV,
                       stdin=json.dumps(record).encode(), deadline=time.monotonic() + 30,
                       observer=observed)
    with pytest.raises(PluginError):
        invoke.exec_plugin(os.path.join(stub_bin, "stub-error"), command="ADD", env=ENV,
                           stdin=b"{}", deadline=time.monotonic() + 30, observer=observed)
    assert [(plugin, command, outcome) for plugin, command, _, outcome in observed] == [
        ("stub-record", "DEL", "ok"), ("stub-error", "ADD", "error")]
    assert all(seconds >= 0 for _, _, seconds, _ in observed)


def test_a_plugin_never_started_is_not_observed(stub_bin):
    observed = _Observed()
    with pytest.raises(DeadlineExceeded):
        invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="ADD", env=ENV,
                           stdin=b"{}", deadline=time.monotonic() - 1, observer=observed)
    assert observed == []


def test_a_failing_observer_does_not_change_the_plugin_answer(stub_bin, caplog):
    def broken(*_report: object) -> None:
        raise RuntimeError("observer broke")

    conf = {"cniVersion": "1.0.0", "type": "stub-record", "result": {"ips": []}}
    with caplog.at_level(logging.ERROR, logger="multusd.cni.invoke"):
        result = invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="ADD",
                                    env=ENV, stdin=json.dumps(conf).encode(),
                                    deadline=time.monotonic() + 30, observer=broken)
    assert result == {"cniVersion": "1.0.0", "ips": []}
    assert "the plugin observer failed on stub-record ADD" in caplog.text


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_plugin_printing_without_end_is_killed_at_the_output_limit(tmp_path, stream):
    plugin = tmp_path / "flood"
    redirect = " 1>&2" if stream == "stderr" else ""
    plugin.write_text(f"#!/bin/sh\ncat >/dev/null\nexec yes flood{redirect}\n")
    os.chmod(plugin, 0o755)
    with pytest.raises(DelegateError) as err:
        _exec(str(plugin), {"cniVersion": "1.0.0"}, timeout=60)
    assert f"printed more than 16 MiB on {stream} and was killed" in err.value.msg
    assert len(err.value.details) < 3 * invoke.DETAILS_LIMIT


# ---- RunningPlugins: every plugin ended at once (the daemon's stop) -------------------------

def test_end_all_kills_every_running_plugin_group_and_says_why(stub_bin, tmp_path):
    running = invoke.RunningPlugins()
    pid_file = tmp_path / "pids"
    failures: list = []

    def run() -> None:
        try:
            invoke.exec_plugin(os.path.join(stub_bin, "stub-hang"), command="DEL",
                               stdin=json.dumps({"pidFile": str(pid_file)}).encode(),
                               env=dict(ENV, CNI_COMMAND="DEL"),
                               deadline=time.monotonic() + REQUEST_TIMEOUT, running=running)
        except DeadlineExceeded as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: pid_file.exists(), REQUEST_TIMEOUT, what="stub-hang running")
    assert running.running() == ["stub-hang DEL"]
    assert running.end_all("the daemon stops") == ["stub-hang DEL"]
    thread.join(30)
    (error,) = failures  # long before the deadline
    assert error.code == 11
    assert error.msg.startswith(f"plugin 'stub-hang' ({stub_bin}/stub-hang) DEL was killed: "
                                "the daemon stops")
    plugin_pid, child_pid = (int(p) for p in pid_file.read_text().split())
    wait_for(lambda: _dead(plugin_pid) and _dead(child_pid), what="stub-hang and its child gone")
    assert running.running() == []


def test_after_end_all_no_plugin_starts(stub_bin, tmp_path):
    running = invoke.RunningPlugins()
    running.end_all("the daemon stops")
    record = tmp_path / "record.jsonl"
    with pytest.raises(DeadlineExceeded) as err:
        invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="ADD",
                           stdin=json.dumps({"recordFile": str(record)}).encode(), env=ENV,
                           deadline=time.monotonic() + 30, running=running)
    assert err.value.msg.endswith("ADD was not started: the daemon stops")
    assert not record.exists()


def test_a_plugin_registered_after_end_all_is_killed_at_once(stub_bin, tmp_path):
    """The race of a run that checked before the switch and registers after it."""
    import subprocess

    running = invoke.RunningPlugins()
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    running.end_all("the daemon stops")
    running.add(proc, "sleep ADD")
    assert proc.wait(30) == -9
    assert running.was_killed(proc) and running.running() == []
    running.discard(proc)
    assert not running.was_killed(proc)


def test_a_plugin_that_ends_by_itself_is_forgotten(stub_bin):
    running = invoke.RunningPlugins()
    assert invoke.exec_plugin(os.path.join(stub_bin, "stub-record"), command="DEL",
                              stdin=b"{}", env=dict(ENV, CNI_COMMAND="DEL"),
                              deadline=time.monotonic() + 30, running=running) is None
    assert running.running() == [] and running.end_all("stop") == []
