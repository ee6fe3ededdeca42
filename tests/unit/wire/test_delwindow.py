"""multusd.wire.delwindow: the shim's marks of a sandbox whose DEL failed, and its window."""

from __future__ import annotations

import json
import os
import stat

import pytest

import multusd
from multusd.wire import delwindow

ENV = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/run/netns/x",
       "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
       "PATH": "/usr/bin", "HOME": "/root"}
STDIN = b'{"cniVersion":"0.4.0","name":"multus-cni-network","type":"multus-shim"}'
STDIN_CONF = json.loads(STDIN)


def conf(tmp_path) -> dict:
    return {"cniVersion": "0.4.0", "cniDir": str(tmp_path / "cni")}


def mark_file(tmp_path, cid: str = "c0ffee") -> str:
    return str(tmp_path / "cni" / multusd.UNRELEASED_DIR / cid)


def test_the_first_failure_starts_the_default_window_in_a_root_only_mark(tmp_path):
    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "not reachable", now=1000.0)

    assert mark["until"] == 1000.0 + delwindow.DEFAULT_WINDOW == 1010.0
    assert (mark["by"], mark["attempts"], mark["error"]) == ("shim", 1, "not reachable")
    # the runtime's request, to run it again: CNI_* only, never the rest of its environment
    assert mark["request"] == {"env": {k: v for k, v in ENV.items() if k.startswith("CNI_")},
                               "config": STDIN.decode()}
    with open(mark_file(tmp_path)) as handle:
        assert json.load(handle) == mark
    assert stat.S_IMODE(os.stat(mark_file(tmp_path)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(mark_file(tmp_path))).st_mode) == 0o700
    assert sorted(os.listdir(os.path.dirname(mark_file(tmp_path)))) == ["c0ffee"]  # no temp
    assert not delwindow.expired(mark, now=1009.9) and delwindow.expired(mark, now=1010.0)


def test_later_failures_keep_the_first_and_count(tmp_path):
    delwindow.note_failure(conf(tmp_path), ENV, STDIN, "first", now=1000.0)
    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "second", now=1005.0)

    assert (mark["firstFailure"], mark["lastFailure"], mark["until"]) == (1000.0, 1005.0, 1010.0)
    assert (mark["attempts"], mark["error"]) == (2, "second")


def test_the_daemons_published_window_is_used(tmp_path):
    directory = os.path.dirname(mark_file(tmp_path))
    os.makedirs(directory)
    with open(os.path.join(directory, multusd.WINDOW_FILE), "w") as handle:
        json.dump({"deleteRetryWindow": 7}, handle)

    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=1000.0)

    assert (mark["window"], mark["until"]) == (7.0, 1007.0)
    for bad in ('{"deleteRetryWindow": -1}', '{"deleteRetryWindow": true}', "[", "{}"):
        with open(os.path.join(directory, multusd.WINDOW_FILE), "w") as handle:
            handle.write(bad)
        assert delwindow.window(directory) == delwindow.DEFAULT_WINDOW


def test_a_mark_the_daemon_wrote_is_only_read(tmp_path):
    directory = os.path.dirname(mark_file(tmp_path))
    os.makedirs(directory)
    daemons = {"containerId": "c0ffee", "by": "daemon", "firstFailure": 5.0, "until": 65.0,
               "attempts": 4, "failures": [{"network": "n", "interface": "net1", "error": "e"}]}
    with open(mark_file(tmp_path), "w") as handle:
        json.dump(daemons, handle)

    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=70.0)
    assert mark == multusd.parse_mark("c0ffee", daemons)  # read as the format reads it
    assert (mark["by"], mark["attempts"], mark["until"]) == ("daemon", 4, 65.0)
    assert delwindow.read_mark(mark_file(tmp_path)) == daemons  # unchanged on disk
    assert delwindow.expired(mark, now=70.0)


def test_a_file_that_is_no_mark_gets_the_shims_first_mark_and_a_whole_window(tmp_path):
    # (before one format, the shim took any JSON object there for the daemon's mark: one
    # without an end had ended, and the first failed DEL was answered success at once)
    directory = os.path.dirname(mark_file(tmp_path))
    os.makedirs(directory)
    for junk in ({"by": "daemon"}, {"containerId": "other", "firstFailure": 5.0}, []):
        with open(mark_file(tmp_path), "w") as handle:
            json.dump(junk, handle)

        mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=1000.0)

        assert (mark["by"], mark["attempts"], mark["firstFailure"]) == ("shim", 1, 1000.0)
        assert not delwindow.expired(mark, now=1000.0)
        assert delwindow.read_mark(mark_file(tmp_path)) == mark


def test_nothing_is_marked_for_a_container_id_that_names_no_file(tmp_path):
    for cid in ("", "../escape", ".hidden", "a/b", "x" * 300):
        assert delwindow.note_failure(conf(tmp_path), dict(ENV, CNI_CONTAINERID=cid), STDIN,
                                      "x", socket_dir=str(tmp_path / "run")) is None
    assert not os.path.exists(tmp_path / "cni") and not os.path.exists(tmp_path / "run")


def test_the_cni_dir_is_the_daemons_rule():
    assert delwindow.cni_dir_of({}) == delwindow.cni_dir_of({"cniDir": ""}) == \
        delwindow.cni_dir_of({"cniDir": 7}) == "/var/lib/cni/multus"
    assert delwindow.cni_dir_of({"cniDir": "relative/dir"}) == "/relative/dir"
    assert delwindow.cni_dir_of({"cniDir": "/srv/cni"}) == "/srv/cni"


# (what, the shim's config (the runtime's multus config), daemon-config.json as the shim read
# it (None: not there), the cniDir the mark goes to)
CNI_DIRS = [
    ("the runtime's when daemon-config.json names none", {"cniDir": "/rt"}, {}, "/rt"),
    ("daemon-config.json's when the runtime's names none", {}, {"cniDir": "/d"}, "/d"),
    ("daemon-config.json's over the runtime's", {"cniDir": "/rt"}, {"cniDir": "/d"}, "/d"),
    ("as Go reads its struct: CNIDir", {}, {"CNIDir": "/d"}, "/d"),
    ("a null in daemon-config.json: the default, as the overlay has it", {"cniDir": "/rt"},
     {"cniDir": None}, multusd.DEFAULT_CNI_DIR),
    ("no daemon-config.json to read: the runtime's", {"cniDir": "/rt"}, None, "/rt"),
    ("neither: Multus's default", {}, {"logLevel": "debug"}, multusd.DEFAULT_CNI_DIR),
]


@pytest.mark.parametrize("runtime, daemon, expected", [c[1:] for c in CNI_DIRS],
                         ids=[c[0] for c in CNI_DIRS])
def test_the_shim_marks_in_the_cni_dir_the_daemon_judges_the_request_by(runtime, daemon,
                                                                         expected):
    from multusd.config import daemonconf
    from multusd.core import effective

    conf = dict(STDIN_CONF, **runtime)
    assert delwindow.marks_cni_dir(conf, daemon) == expected
    # the daemon's rule for the same request, daemon-config.json as it loads it
    assert effective.for_request(conf, daemonconf.from_dict(daemon or {})).cni_dir == expected


def test_a_static_config_naming_no_cni_dir_marks_beside_the_daemons_records(tmp_path):
    daemons = str(tmp_path / "daemons")
    directory = os.path.join(daemons, multusd.UNRELEASED_DIR)
    os.makedirs(directory)
    with open(os.path.join(directory, multusd.WINDOW_FILE), "w") as handle:
        json.dump({"deleteRetryWindow": 3}, handle)  # what the daemon published there

    mark = delwindow.note_failure(STDIN_CONF, ENV, STDIN, "x", now=1000.0,
                                  daemon={"cniDir": daemons, "logLevel": "debug"})

    assert (mark["cniDir"], mark["window"]) == (daemons, 3.0)
    assert os.path.exists(os.path.join(directory, "c0ffee"))


def test_a_file_where_the_marks_directory_should_be_sends_the_mark_beside_the_socket(tmp_path):
    (tmp_path / "cni").mkdir()
    (tmp_path / "cni" / multusd.UNRELEASED_DIR).write_text("in the way")
    said = []

    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "not reachable", now=1000.0,
                                  socket_dir=str(tmp_path / "run"), warn=said.append)

    spare = tmp_path / "run" / multusd.UNRELEASED_DIR / "c0ffee"
    assert mark is not None and delwindow.read_mark(str(spare)) == mark
    assert mark["cniDir"] == str(tmp_path / "cni")  # where the records are
    assert stat.S_IMODE(os.stat(spare.parent).st_mode) == 0o700
    assert len(said) == 1 and f"it is kept in {spare.parent} instead" in said[0]
    assert "Not a directory" in said[0]
    # the window still ends, and the next failures find the mark there
    again = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=1010.0,
                                   socket_dir=str(tmp_path / "run"), warn=said.append)
    assert again["attempts"] == 2 and delwindow.expired(again, now=1010.0)
    # once cniDir takes marks again, the mark moves home: one mark per sandbox
    (tmp_path / "cni" / multusd.UNRELEASED_DIR).unlink()
    home = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=1011.0,
                                  socket_dir=str(tmp_path / "run"))
    assert home["attempts"] == 3 and delwindow.read_mark(mark_file(tmp_path)) == home
    assert not spare.exists()


def test_a_mark_that_lands_nowhere_leaves_the_error_as_it_was(tmp_path):
    (tmp_path / "cni").write_text("a file where cniDir should be")
    (tmp_path / "run").write_text("and one where the socket's directory should be")
    assert delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x",
                                  socket_dir=str(tmp_path / "run")) is None
    assert delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x") is None  # no socket dir


def test_a_stale_cni_dir_is_not_made_but_the_mark_still_lands(tmp_path):
    # upstream's in-pod /host/... path left in the config: its parents are never made
    stale = {"cniDir": str(tmp_path / "host" / "var" / "lib" / "cni" / "multus")}
    mark = delwindow.note_failure(stale, ENV, STDIN, "x", socket_dir=str(tmp_path / "run"))
    assert mark is not None and not (tmp_path / "host").exists()
    assert (tmp_path / "run" / multusd.UNRELEASED_DIR / "c0ffee").exists()


BOOT = "3d0f7a52-0000-4000-8000-000000000001"


def test_the_window_is_counted_on_the_boot_clock(tmp_path):
    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=(1000.0, BOOT, 7.0))
    assert (mark["bootId"], mark["untilBoot"], mark["until"]) == (BOOT, 17.0, 1010.0)
    day = 86400.0
    assert not delwindow.expired(mark, now=(1000.0 - day, BOOT, 16.9))  # wall clock set back
    assert delwindow.expired(mark, now=(1000.0 - day, BOOT, 17.0))
    # a mark from another boot, the wall clock a day behind: one window at most from now
    other = "3d0f7a52-0000-4000-8000-000000000002"
    later = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "x", now=(1000.0 - day, other, 2.0))
    assert (later["bootId"], later["untilBoot"]) == (other, 12.0)
    assert delwindow.expired(later, now=(0.0, other, 12.0))


def test_the_clock_reads_this_boot():
    wall, boot_id, boot = multusd.clock_now()
    with open("/proc/sys/kernel/random/boot_id") as handle:
        assert boot_id == handle.read().strip()
    assert boot > 0 and wall > 1.6e9


def test_the_give_up_line_says_what_happened_and_what_to_do(tmp_path):
    mark = delwindow.note_failure(conf(tmp_path), ENV, STDIN, "multusd is not reachable",
                                  now=1000.0)
    line = delwindow.give_up_message(mark, now=1400.0)
    assert "DEL of container c0ffee has failed since 1970-01-01T00:16:40Z (6m40s ago)" in line
    assert "1 attempt(s), last: multusd is not reachable" in line
    assert "window (10s) has passed, so DEL answers success" in line
    assert "`multusd status`" in line and "`multusd gc`" in line
    delwindow.to_syslog(line)  # never raises, with or without /dev/log
