"""multusd's one format of a failed DEL's mark (``mark_json``, ``parse_mark``), which the shim
(wire/delwindow) and the daemon (core/delmarks) both write and read."""

from __future__ import annotations

import json

import pytest

import multusd
from multusd.core import delmarks, unreleased
from multusd.wire import delwindow
from failingdel import CONF, FAILED, del_request

END = {"until": 1010.0, "bootId": "b", "untilBoot": 17.0}


def a_mark(**changes) -> dict:
    keys = dict(by="daemon", first_failure=1000.0, last_failure=1005.0, end=END, window=10.0,
                attempts=2, error="e", cni_dir="/srv/cni",
                request=multusd.mark_request({"CNI_CONTAINERID": "c0ffee"}, CONF),
                failures=[("default/vendor", "net1", "gone")], released=[("cluster", "eth0")],
                announced=True)
    keys.update(changes)
    return multusd.mark_json("c0ffee", **keys)


def test_both_writers_write_every_key_of_the_one_format(tmp_path):
    cni_dir = str(tmp_path)
    req = del_request(cni_dir)
    shims = delwindow.note_failure({"cniDir": cni_dir}, dict(req.env), CONF, "down",
                                   now=(900.0, "b", 7.0))
    daemons = unreleased.record(cni_dir, req, FAILED, "msg", window=60, now=(1000.0, "b", 8.0))
    with open(delmarks.mark_path(cni_dir, "c0ffee")) as handle:
        on_disk = json.load(handle)

    assert list(shims) == list(daemons.to_json()) == list(on_disk) == list(a_mark())
    assert shims["failures"] == shims["released"] == [] and shims["announced"] is False
    # the runtime's request is kept alike by both: its CNI_* variables, never PATH
    assert on_disk["request"] == shims["request"] == multusd.mark_request(req.env, CONF)
    assert "PATH" not in shims["request"]["env"] and shims["request"]["config"] == CONF.decode()


def test_a_mark_reads_back_as_it_was_written():
    mark = a_mark()
    assert multusd.parse_mark("c0ffee", json.loads(json.dumps(mark))) == mark
    typed = delmarks.FailedDelete(container_id="c0ffee", first_failure=1.0, last_failure=2.0,
                                  until=3.0, attempts=1, by="shim", error="",
                                  failures=FAILED, cni_dir="/x")
    assert multusd.parse_mark("c0ffee", typed.to_json()) == typed.to_json()


@pytest.mark.parametrize("data", [None, [], "x", {}, {"firstFailure": 0},
                                  {"firstFailure": True}, {"firstFailure": "1000"},
                                  {"containerId": "other", "firstFailure": 1000.0}])
def test_what_is_no_mark_reads_as_none(data):
    assert multusd.parse_mark("c0ffee", data) is None


def test_a_key_missing_or_of_another_type_reads_as_its_default():
    mark = multusd.parse_mark("c0ffee", {
        "firstFailure": 1000, "attempts": True, "by": "", "window": "10", "cniDir": "rel/dir",
        "untilBoot": "x", "request": "x", "announced": 1, "failures": [7, {"network": 5}],
        "released": {"network": "n"}})
    assert mark == multusd.mark_json(
        "c0ffee", by="shim", first_failure=1000.0, last_failure=1000.0,
        end={"until": 1000.0, "bootId": "", "untilBoot": None}, window=0.0, attempts=1,
        error="", cni_dir="", request=None, failures=[("5", "", "")])
    assert multusd.window_left(mark, 999.0) == 1.0  # its window: until the first failure


def test_the_marks_places_are_cni_dirs_then_the_spare_one():
    assert multusd.marks_places("/var/lib/cni/multus/") == [
        "/var/lib/cni/multus/.multusd-unreleased"]
    assert multusd.marks_places("/c", "/run/multus/.multusd-unreleased") == [
        "/c/.multusd-unreleased", "/run/multus/.multusd-unreleased"]
    assert multusd.marks_places("/c", "/c/.multusd-unreleased") == ["/c/.multusd-unreleased"]
