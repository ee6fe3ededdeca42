"""multusd.core.markadoption: the shim's marks adopted, the marks of released sandboxes dropped."""

from __future__ import annotations

import os

from multusd.core import delmarks, markadoption, unreleased
from multusd.wire import delwindow
from failingdel import CONF, FAILED, del_request, write_records


def test_clear_never_fails_a_del_and_prune_drops_marks_of_released_sandboxes(tmp_path):
    cni_dir, spare = str(tmp_path / "cni"), str(tmp_path / "run" / ".multusd-unreleased")
    os.makedirs(cni_dir)
    (tmp_path / "cni" / ".multusd-unreleased").write_text("in the way")
    assert delmarks.clear(cni_dir, "c0ffee", spare=spare) is False
    unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=1, now=1.0,
                      spare=spare)
    assert markadoption.prune(cni_dir, spare=spare) == ["c0ffee"]  # no records: dropped
    assert delmarks.read_all(cni_dir, spare=spare) == {}


def shim_mark(cni_dir: str, cid: str) -> None:
    """The shim's mark of ``cid``'s failed DEL in ``cni_dir`` (its config names that one)."""
    req = del_request(cni_dir, cid)
    assert delwindow.note_failure({"cniDir": cni_dir}, dict(req.env), CONF, "not reachable",
                                  now=1000.0) is not None


def test_a_sandbox_has_records_while_a_scratch_cache_or_a_result_entry_is_left(tmp_path):
    cni_dir = str(tmp_path)
    assert not markadoption.has_records(cni_dir, "c0ffee")
    write_records(cni_dir, "c0ffee")
    assert markadoption.has_records(cni_dir, "c0ffee")
    os.unlink(os.path.join(cni_dir, "c0ffee"))
    os.makedirs(os.path.join(cni_dir, "results"))
    open(os.path.join(cni_dir, "results", "net-a-c0ffee-eth0"), "w").close()
    assert markadoption.has_records(cni_dir, "c0ffee")
    assert not markadoption.has_records(cni_dir, "c0ffe")  # the whole ID, never a prefix


def test_the_shims_marks_in_another_cni_dir_are_moved_beside_their_records(tmp_path):
    # the shim's config names no cniDir: it marks in the default one, the records are here
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    write_records(cni_dir, "moved")
    write_records(cni_dir, "both")
    write_records(default, "theirs")  # that directory's own sandbox
    for cid in ("moved", "both", "theirs"):
        shim_mark(default, cid)
    unreleased.record(cni_dir, del_request(cni_dir, "both"), FAILED, "m", window=60, now=990.0)

    assert sorted(markadoption.adopt(default, cni_dir)) == ["both", "moved"]

    moved = delmarks.read(cni_dir, "moved")
    assert (moved.by, moved.cni_dir, moved.first_failure) == ("shim", cni_dir, 1000.0)
    assert delmarks.read(cni_dir, "both").by == "daemon"  # the daemon's own stands
    assert delmarks.read(default, "moved") is None and delmarks.read(default, "both") is None
    assert delmarks.read(default, "theirs") is not None  # not the daemon's to take
    assert markadoption.adopt(cni_dir, cni_dir) == []  # the same directory: nothing to do


def test_a_mark_stands_while_its_records_are_where_it_names_or_where_the_reader_keeps_them(
        tmp_path):
    # the shim (its config naming the default cniDir, which could not take the mark) marked
    # beside the socket; the records are in the daemon's cniDir: not released, not dropped
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    spare = delmarks.spare_marks_dir(str(tmp_path / "run"))
    os.makedirs(default)
    with open(os.path.join(default, ".multusd-unreleased"), "w") as handle:
        handle.write("a file where the marks' directory should be")
    write_records(cni_dir, "held")
    req = del_request(cni_dir, "held")
    assert delwindow.note_failure({"cniDir": default}, dict(req.env), CONF, "down",
                                  socket_dir=str(tmp_path / "run")) is not None
    mark = delmarks.read(cni_dir, "held", spare=spare)
    assert mark.cni_dir == default and not markadoption.is_released(mark, cni_dir)

    # (judged by the cniDir it names alone, the default one where nothing is, it was dropped)
    assert markadoption.prune(cni_dir, spare=spare) == []
    assert delmarks.read(cni_dir, "held", spare=spare) is not None
    os.unlink(os.path.join(cni_dir, "held"))
    assert markadoption.is_released(mark, cni_dir)
    assert markadoption.prune(cni_dir, spare=spare) == ["held"]


def test_the_shims_marks_in_the_default_cni_dir_are_pruned_by_the_daemons_records(tmp_path):
    default, cni_dir = str(tmp_path / "default"), str(tmp_path / "cni")
    for cid in ("released", "held-here", "held-there", "other"):
        shim_mark(default, cid)
    write_records(cni_dir, "held-here")
    write_records(default, "held-there")

    assert markadoption.prune(default, records_in=(cni_dir,), only="held-here") == []
    assert markadoption.prune(default, records_in=(cni_dir,), only="released") == ["released"]
    assert delmarks.read(default, "other") is not None  # only that one
    assert markadoption.prune(default, records_in=(cni_dir,), only="no-such") == []
    assert markadoption.prune(default, records_in=(cni_dir,)) == ["other"]
    assert sorted(delmarks.read_all(default)) == ["held-here", "held-there"]
