"""multusd.core.delmarks: failed DELs' marks as the daemon reads and writes them, and where."""

from __future__ import annotations

import json
import logging
import os

import multusd
from multusd.config import daemonconf
from multusd.core import delmarks, effective, unreleased
from multusd.wire import delwindow
from failingdel import CONF, FAILED, del_request, write_records


def test_the_same_place_rule_and_window_as_the_shims():
    assert delmarks.mark_path("/x", "c0ffee") == "/x/.multusd-unreleased/c0ffee"
    assert delmarks.spare_marks_dir("/run/multus/") == "/run/multus/.multusd-unreleased"
    assert delmarks.spare_marks_dir("") == ""
    assert daemonconf.from_dict({}).delete_retry_window == delwindow.DEFAULT_WINDOW
    for conf in ({}, {"cniDir": ""}, {"cniDir": None}, {"cniDir": 7}, {"cniDir": "a\0b"},
                 {"cniDir": "/srv/cni"}, {"cniDir": "var/lib/x"}):
        # the daemon's (a request's effective cniDir) and the shim's
        assert effective.for_request(conf, daemonconf.from_dict({})).cni_dir == \
            multusd.cni_dir_of(conf)
    assert multusd.cni_dir_of({"cniDir": 7}) == multusd.DEFAULT_CNI_DIR
    assert multusd.cni_dir_of({"cniDir": "var/lib/x"}) == "/var/lib/x"  # from /, as systemd's


def test_the_shims_first_failure_starts_the_window_and_the_daemon_takes_the_mark_over(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    delwindow.note_failure({"cniDir": cni_dir}, dict(req.env), CONF, "not reachable",
                           now=900.0)
    shims = delmarks.read(cni_dir, "c0ffee")
    assert (shims.by, shims.first_failure, shims.until, shims.error) == \
        ("shim", 900.0, 900.0 + delwindow.DEFAULT_WINDOW, "not reachable")
    assert shims.pod == "default/web" and shims.failures == ()

    mark = unreleased.record(cni_dir, req, FAILED, "msg", window=60, now=1000.0)

    assert (mark.by, mark.first_failure, mark.until, mark.attempts) == ("daemon", 900.0, 960.0, 2)
    assert delwindow.expired(delwindow.read_mark(delmarks.mark_path(cni_dir, "c0ffee")),
                             now=960.0)



def test_what_is_not_a_mark_is_ignored(tmp_path):
    cni_dir = str(tmp_path)
    directory = multusd.unreleased_marks_dir(cni_dir)
    os.makedirs(directory)
    for name, text in ((".settings", '{"deleteRetryWindow": 5}'), ("corrupt", "{"),
                       ("list", "[]"), ("other-id", '{"containerId": "x", "firstFailure": 1}'),
                       ("no-time", '{"containerId": "no-time"}'), ("bad name!", "{}")):
        with open(os.path.join(directory, name), "w") as handle:
            handle.write(text)
    assert delmarks.read_all(cni_dir) == {}
    assert delmarks.read(cni_dir, "../x") is None


def test_the_window_is_published_for_the_shim_only_when_not_the_default(tmp_path):
    cni_dir = str(tmp_path)
    marks = multusd.unreleased_marks_dir(cni_dir)
    delmarks.publish_window(cni_dir, 300.0, default=300.0)
    assert not os.path.exists(marks)  # a healthy node: nothing at all
    delmarks.publish_window(cni_dir, 5.0, default=300.0)
    assert delwindow.window(marks) == 5.0
    delmarks.publish_window(cni_dir, 300.0, default=300.0)
    assert not os.path.exists(marks)


def test_a_cni_dir_that_cannot_take_the_window_publishes_it_beside_the_socket(tmp_path):
    cni_dir, spare = str(tmp_path / "cni"), str(tmp_path / "run" / ".multusd-unreleased")
    os.makedirs(cni_dir)
    blocker = tmp_path / "cni" / ".multusd-unreleased"
    blocker.write_text("a file where the marks' directory should be")
    delmarks.publish_window(cni_dir, 10.0, default=10.0, spare=spare)  # nothing to remove
    delmarks.publish_window(cni_dir, 5.0, default=10.0, spare=spare)
    assert delwindow.window(spare) == 5.0
    blocker.unlink()
    delmarks.publish_window(cni_dir, 6.0, default=10.0, spare=spare)  # it works again
    assert delwindow.window(multusd.unreleased_marks_dir(cni_dir)) == 6.0
    assert not os.path.exists(os.path.join(spare, ".settings"))  # one copy


def test_a_mark_cni_dir_cannot_take_goes_beside_the_socket_and_is_read_there(tmp_path, caplog):
    cni_dir, spare = str(tmp_path / "cni"), str(tmp_path / "run" / ".multusd-unreleased")
    write_records(cni_dir, "c0ffee")
    blocker = tmp_path / "cni" / ".multusd-unreleased"
    blocker.write_text("a file where the marks' directory should be")
    req = del_request(cni_dir)

    with caplog.at_level(logging.WARNING):
        mark = unreleased.record(cni_dir, req, FAILED, "m", window=1, now=1.0, spare=spare)

    assert mark.place == spare and os.path.exists(os.path.join(spare, "c0ffee"))
    assert any("it is kept in " + spare in r.getMessage() for r in caplog.records)
    assert delmarks.read(cni_dir, "c0ffee", spare=spare) == mark
    assert delmarks.read(cni_dir, "c0ffee") is None  # a reader that does not look there
    assert list(delmarks.read_all(cni_dir, spare=spare)) == ["c0ffee"]
    assert [m.container_id for m in unreleased.unreleased([cni_dir], spare=spare)] == ["c0ffee"]
    assert unreleased.count_unreleased([cni_dir], spare=spare) == 1
    blocker.unlink()  # cniDir takes marks again: the next one goes home, and only there
    moved = unreleased.record(cni_dir, req, FAILED, "m", window=1, now=2.0, spare=spare)
    assert (moved.place, moved.attempts, moved.first_failure) == (
        multusd.unreleased_marks_dir(cni_dir), 2, 1.0)
    assert not os.path.exists(os.path.join(spare, "c0ffee"))
    assert delmarks.clear(cni_dir, "c0ffee", spare=spare)
    assert delmarks.read(cni_dir, "c0ffee", spare=spare) is None


def test_the_delegates_released_are_kept_in_the_mark(tmp_path):
    cni_dir = str(tmp_path)
    released = (delmarks.Released(network="cluster", ifname="eth0"),)
    mark = unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=60,
                             now=1000.0, released=released)
    assert delmarks.read(cni_dir, "c0ffee").released == released == mark.released
    with open(delmarks.mark_path(cni_dir, "c0ffee")) as handle:
        assert json.load(handle)["released"] == [{"network": "cluster", "interface": "eth0"}]
    assert mark.what_failed() == ("net1 (default/vendor): plugin gone; released already: "
                                  "eth0 (cluster)")
