"""generateconfig.run() on real directories: what multusd-config.service does on each trigger.

Covers content and mode, atomicity under a concurrent reader, "unchanged input writes
nothing" (checked with a real inotify watch, as systemd's path unit sees it), a vanished
primary, a new primary, forceCNIVersion, static mode, --remove, exit codes, and the
command as a subprocess.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

from multusd.config import generateconfig

from testlib import REPO, wait_for  # tests/conftest.py (pytest puts tests/ on sys.path)

PYTHON = sys.executable
PRIMARY = {"cniVersion": "0.4.0", "name": "mycni-name", "type": "bridge", "ipam": {}}


@pytest.fixture
def node(tmp_path):
    """A fake node: /etc/cni/net.d and the daemon config, both under tmp_path."""
    netd = tmp_path / "net.d"
    netd.mkdir()
    config = tmp_path / "daemon-config.json"

    class Node:
        dir = netd
        config_path = str(config)
        generated = netd / "00-multus.conf"

        def configure(self, **keys):
            conf = {"cniVersion": "0.4.0", "multusAutoconfigDir": str(netd),
                    "cniConfigDir": str(netd), "socketDir": "/run/multus/"}
            conf.update(keys)
            config.write_text(json.dumps(conf))

        def primary(self, name, doc=None, **changes):
            path = netd / name
            path.write_text(json.dumps(dict(doc or PRIMARY, **changes)))
            return str(path)

        def run(self, remove=False):
            return generateconfig.run(self.config_path, remove=remove)

    yield Node()
    shutil.rmtree(str(tmp_path), ignore_errors=True)


class Inotify:
    """A real inotify watch on a directory, like the one systemd's path unit holds."""

    MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200  # modify attrib close_write moves
    NONBLOCK = os.O_NONBLOCK

    def __init__(self, path):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(self.NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        assert libc.inotify_add_watch(self.fd, str(path).encode(), self.MASK) >= 0

    def events(self):
        try:
            return len(os.read(self.fd, 65536))
        except BlockingIOError:
            return 0

    def close(self):
        os.close(self.fd)


def test_writes_upstreams_bytes_with_mode_0600(node):
    primary = node.primary("10-mycni.conf", capabilities={"portMappings": True})
    node.configure()
    assert node.run() == 0
    assert node.generated.read_text() == (
        '{"capabilities":{"portMappings":true},"cniVersion":"0.4.0",'
        f'"name":"multus-cni-network","clusterNetwork":"{primary}","type":"multus-shim"}}')
    assert stat.S_IMODE(node.generated.stat().st_mode) == 0o600
    assert [p.name for p in node.dir.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_unchanged_input_writes_nothing_so_the_path_unit_loop_ends(node):
    node.primary("10-mycni.conf")
    node.configure()
    watch = Inotify(node.dir)
    try:
        assert node.run() == 0
        assert watch.events() > 0  # the first write is seen (and would re-trigger the unit)
        os.utime(str(node.generated), ns=(1_000_000_000, 1_000_000_000))
        watch.events()  # drain the utime event
        identity = (node.generated.stat().st_ino, node.generated.stat().st_mtime_ns)
        assert node.run() == 0
        assert watch.events() == 0  # the re-triggered run is silent: the loop ends
        assert (node.generated.stat().st_ino, node.generated.stat().st_mtime_ns) == identity
    finally:
        watch.close()


def test_reader_never_sees_a_partial_or_empty_file(node):
    node.configure()
    variants = [{"portMappings": True}, {"bandwidth": True}]
    node.primary("10-mycni.conf", capabilities=variants[0])
    assert node.run() == 0
    expected = set()
    for caps in variants:
        node.primary("10-mycni.conf", capabilities=caps)
        assert node.run() == 0
        expected.add(node.generated.read_bytes())
    assert len(expected) == 2

    seen, bad, stop = [], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                data = node.generated.read_bytes()
            except FileNotFoundError:
                bad.append(b"<missing>")
                continue
            seen.append(data)
            if data not in expected:
                bad.append(data)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(1000):
            node.primary("10-mycni.conf", capabilities=variants[i % 2])
            assert node.run() == 0
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert len(seen) > 0 and set(seen) <= expected


def test_primary_removed_keeps_the_file_and_warns(node, caplog):
    primary = node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    before = node.generated.read_bytes()
    os.unlink(primary)
    with caplog.at_level("WARNING", logger="multusd.config.multusconf"):
        assert node.run() == 0
    assert node.generated.read_bytes() == before
    assert any("keeping" in r.getMessage() and "stale" in r.getMessage() for r in caplog.records)


def test_new_primary_regenerates(node):
    node.primary("20-old.conf")
    node.configure()
    assert node.run() == 0
    newer = node.primary("10-new.conflist", {"cniVersion": "1.0.0", "name": "new",
                                             "plugins": [{"type": "bridge"}]})
    assert node.run() == 0
    assert json.loads(node.generated.read_text())["clusterNetwork"] == newer


def test_no_primary_writes_nothing_and_exits_0(node, caplog):
    node.configure()
    with caplog.at_level("WARNING", logger="multusd.config.multusconf"):
        assert node.run() == 0
    assert not node.generated.exists()
    assert any("waiting for a primary network config" in r.getMessage() for r in caplog.records)


def test_readiness_indicator_gates_the_first_write(node, tmp_path):
    node.primary("10-mycni.conf")
    indicator = tmp_path / "ready"
    node.configure(readinessindicatorfile=str(indicator))
    assert node.run() == 0
    assert not node.generated.exists()
    indicator.write_text("ok")
    assert node.run() == 0
    assert "readinessindicatorfile" not in json.loads(node.generated.read_text())


def test_config_problem_exits_1_lists_every_problem_and_keeps_the_file(node, capsys):
    primary = node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    before = node.generated.read_bytes()
    capsys.readouterr()
    with open(primary, "w") as handle:
        handle.write('{"cniVersion": ')
    assert node.run() == 1
    assert node.generated.read_bytes() == before
    assert f"{primary}: the primary network config is not valid JSON" in capsys.readouterr().err

    node.primary("10-mycni.conf")
    node.configure(cniVersion="", logToStderr="yes")
    assert node.run() == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err
    assert "\n  logToStderr: must be true or false, got 'yes'" in err
    assert "\n  cniVersion: the CNI version is a mandatory parameter" in err


def test_version_mismatch_exits_1_with_upstreams_message(node, capsys):
    node.primary("10-mycni.conf", cniVersion="0.3.1")
    node.configure()
    assert node.run() == 1
    assert ("failed to load the primary CNI configuration as a multus delegate with error "
            "'delegate cni version is 0.3.1 while top level cni version is 0.4.0'"
            in capsys.readouterr().err)
    assert not node.generated.exists()


def test_force_cni_version_rewrites_the_primary_once(node, caplog):
    primary = node.primary("10-mycni.conf", cniVersion="0.3.1")
    os.chmod(primary, 0o640)
    node.configure(forceCNIVersion=True)
    with caplog.at_level("WARNING", logger="multusd.config.multusconf"):
        assert node.run() == 0
    assert json.loads(open(primary).read())["cniVersion"] == "0.4.0"
    assert stat.S_IMODE(os.stat(primary).st_mode) == 0o640
    assert any("forceCNIVersion" in r.getMessage() for r in caplog.records)
    assert json.loads(node.generated.read_text())["clusterNetwork"] == primary
    os.utime(primary, ns=(1_000_000_000, 1_000_000_000))
    assert node.run() == 0
    assert os.stat(primary).st_mtime_ns == 1_000_000_000  # already forced: not rewritten


def test_missing_or_invalid_daemon_config_exits_1(node, capsys):
    assert node.run() == 1
    assert f"{node.config_path}: does not exist" in capsys.readouterr().err
    with open(node.config_path, "w") as handle:
        handle.write("{nope")
    assert node.run() == 1
    assert "is not valid JSON" in capsys.readouterr().err


def test_io_failure_exits_2(node, tmp_path, capsys):
    node.primary("10-mycni.conf")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    node.configure(cniConfigDir=str(blocker / "net.d"))
    assert node.run() == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "Not a directory" in err and "nothing was changed" in err


def test_static_config_is_copied_atomically_and_idempotently(node, tmp_path):
    static = tmp_path / "my-multus.conflist"
    static.write_text('{"cniVersion": "1.0.0", "name": "mine", "plugins": [{"type": "x"}]}\n')
    node.configure(multusConfigFile=str(static))
    assert node.run() == 0
    copy = node.dir / "my-multus.conflist"
    assert copy.read_bytes() == static.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    os.utime(str(copy), ns=(1_000_000_000, 1_000_000_000))
    assert node.run() == 0
    assert copy.stat().st_mtime_ns == 1_000_000_000
    assert not node.generated.exists()


def test_remove_deletes_only_what_multusd_wrote(node, tmp_path):
    node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    assert node.run(remove=True) == 0
    assert not node.generated.exists()
    assert (node.dir / "10-mycni.conf").exists()
    assert node.run(remove=True) == 0  # nothing left: still fine

    thin = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
            "kubeconfig": "/etc/kubernetes/kubeconfig", "delegates": [PRIMARY]}
    node.generated.write_text(json.dumps(thin))
    assert node.run(remove=True) == 0
    assert json.loads(node.generated.read_text()) == thin


def test_remove_leaves_a_file_rewritten_since_even_with_the_same_bytes(node):
    """Upstream's daemon writes byte-identical content (in place): it is theirs now."""
    node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    ours = node.generated.read_bytes()
    with open(node.generated, "r+b") as handle:  # os.WriteFile: truncate and write in place
        handle.truncate(0)
        handle.write(ours)
    os.utime(node.generated, ns=(1_000_000_000, 1_000_000_000))  # a write at another time
    assert node.run() == 0  # the path unit's next run: up to date, and not adopted
    assert node.generated.stat().st_mtime_ns == 1_000_000_000
    assert node.run(remove=True) == 0
    assert node.generated.read_bytes() == ours
    # multusd writing it again makes it multusd's again (the next trigger of the oneshot)
    node.generated.write_text("{}")
    assert node.run() == 0 and node.run(remove=True) == 0
    assert not node.generated.exists()


def test_a_file_with_multusds_bytes_but_no_record_is_adopted(node):
    """Written by a multusd from before the record: removal still deletes it."""
    from multusd.config import ownership

    node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    ownership.forget(str(node.generated))
    assert not ownership.is_recorded(str(node.generated))
    assert node.run() == 0 and node.run(remove=True) == 0
    assert not node.generated.exists()


def test_the_record_lives_in_the_state_directory(node, state_directory):
    from multusd.config import ownership

    node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    record = json.loads(open(os.path.join(state_directory, "written.json")).read())
    entry = record[str(node.generated)]
    assert entry["sha256"] == __import__("hashlib").sha256(node.generated.read_bytes()).hexdigest()
    assert ownership.record_path() == os.path.join(state_directory, "written.json")
    assert node.run(remove=True) == 0
    assert str(node.generated) not in json.loads(
        open(os.path.join(state_directory, "written.json")).read())


def test_remove_works_without_a_daemon_config(node, tmp_path):
    node.primary("10-mycni.conf")
    node.configure()
    assert node.run() == 0
    generated = node.generated.read_bytes()
    os.unlink(node.config_path)
    # without a config the default /etc/cni/net.d is used: our tmp file must stay
    assert node.run(remove=True) == 0
    assert node.generated.read_bytes() == generated


def test_remove_static_copy_only_when_unedited(node, tmp_path):
    static = tmp_path / "my-multus.conf"
    static.write_text('{"cniVersion": "1.0.0", "name": "m", "type": "multus-shim"}')
    node.configure(multusConfigFile=str(static))
    assert node.run() == 0
    copy = node.dir / "my-multus.conf"
    copy.write_text('{"cniVersion": "1.0.0", "name": "edited", "type": "multus-shim"}')
    assert node.run(remove=True) == 0
    assert copy.exists()
    assert node.run() == 0  # restores the operator's file
    assert node.run(remove=True) == 0
    assert not copy.exists() and static.exists()


def _subprocess(*argv):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([PYTHON, *argv], capture_output=True, text=True, env=env,
                          timeout=60)


def test_run_as_a_subprocess(node):
    code = "import sys; from multusd.config.generateconfig import run; sys.exit(run(sys.argv[1]))"
    result = _subprocess("-c", code, node.config_path)
    assert result.returncode == 1 and "does not exist" in result.stderr
    node.primary("10-mycni.conf")
    node.configure()
    result = _subprocess("-c", code, node.config_path)
    assert result.returncode == 0, result.stderr
    wait_for(node.generated.exists, timeout=5, what="00-multus.conf")
    assert json.loads(node.generated.read_text())["type"] == "multus-shim"


def test_cli_generate_config(node):
    probe = _subprocess("-m", "multusd", "generate-config", "--help")
    if probe.returncode != 0:
        pytest.skip("`multusd generate-config` is not wired into the CLI yet")
    node.primary("10-mycni.conf")
    node.configure()
    result = _subprocess("-m", "multusd", "generate-config", "--config", node.config_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(node.generated.read_text())["clusterNetwork"].endswith("10-mycni.conf")
    result = _subprocess("-m", "multusd", "generate-config", "--config", node.config_path,
                         "--remove")
    assert result.returncode == 0, result.stderr
    assert not node.generated.exists()


def test_systemd_units_verify():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    units = [os.path.join(REPO, "systemd", name)
             for name in ("multusd-config.path", "multusd-config.service")]
    result = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True,
                            text=True, timeout=60)
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if line.strip() and "/usr/bin/multusd" not in line]
    assert complaints == []


def test_keys_in_another_case_name_one_place_for_writing_reading_and_removal(node):
    """"CNIConfigDir" is upstream's cniConfigDir (Go's field matching): the generator wrote
    00-multus.conf there, but the daemon looked for the runtime's config, and --remove for
    the file, in the default /etc/cni/net.d."""
    from multusd.config import daemonconf
    from multusd.config.multusconf import runtime_conf_paths

    node.primary("10-mycni.conf")
    with open(node.config_path, "w") as handle:
        json.dump({"cniVersion": "0.4.0", "MultusAutoconfigDir": str(node.dir),
                   "CNIConfigDir": str(node.dir), "socketDir": "/run/multus/"}, handle)
    assert node.run() == 0
    assert json.loads(node.generated.read_text())["clusterNetwork"].endswith("10-mycni.conf")
    assert runtime_conf_paths(daemonconf.load(node.config_path).raw) == (str(node.generated),)
    assert node.run(remove=True) == 0
    assert not node.generated.exists()
